"""MINI1, a toy 1-bit format, to walk through "adding a new format" the way ggml does it.

8 values per block, one f16 scale d = max |x| and 8 sign bits (x > 0 -> 1), so each
value decodes to +d or -d: 3 bytes per 8 values = 3 bits per weight. The checklist:

1. a type id and name (ggml.h's enum): :data:`MINI1_ID`, "mini1"
2. the block struct with its size locked (ggml-common.h + static_assert): :data:`BLOCK_MINI1`
3. reference quantizer and dequantizer (ggml-quants.c): :func:`quantize_mini1`, :func:`dequantize_mini1`
4. the type_traits entry (ggml.c): :func:`registered` adds it to llmlab.ggml.types at run time
5. the tests (test-quantize-fns): :func:`llmlab.ggml.quant.checklist.run_checklist`
6. cross-check against an independent implementation: :func:`reference_dequantize_mini1` (plain Python, struct)
"""
from __future__ import annotations

import struct
from contextlib import contextmanager

import numpy as np

from ..types import GGMLType, register_type, unregister_type
from .core import float32, fp16, register

QK_MINI1 = 8
MINI1_ID = 43                       # the next free id after GGML_TYPE_COUNT in the seed's ggml.h
BLOCK_MINI1 = np.dtype([("d", "<f2"), ("qs", "u1")])
assert BLOCK_MINI1.itemsize == 3    # static_assert(sizeof(block_mini1) == 3)


def dequantize_mini1(b):
    signs = np.unpackbits(b["qs"][:, None], axis=-1, bitorder="little").astype(float32) * float32(2) - float32(1)
    return b["d"].astype(float32)[:, None] * signs


def quantize_mini1(x):
    out = np.zeros(len(x), BLOCK_MINI1)
    out["d"] = fp16(np.abs(x).max(-1))
    out["qs"] = np.packbits(x > 0, axis=-1, bitorder="little")[:, 0]
    return out


def reference_dequantize_mini1(data: bytes, k: int) -> list[float]:
    """The seed's plain-Python decoder, one value at a time: an independent implementation."""
    assert k % QK_MINI1 == 0
    y = [0.0] * k
    for i in range(k // QK_MINI1):
        d = struct.unpack_from("<e", data, 3 * i)[0]
        qs = data[3 * i + 2]
        for b in range(QK_MINI1):
            y[i * QK_MINI1 + b] = d * (2 * ((qs >> b) & 1) - 1)
    return y


@contextmanager
def registered():
    """Register mini1 in the type table for the duration of a ``with`` block."""
    t = register_type(GGMLType(MINI1_ID, "mini1", QK_MINI1, BLOCK_MINI1.itemsize, True))
    try:
        register("mini1", BLOCK_MINI1, dequantize_mini1, quantize_mini1)
        yield t
    finally:
        unregister_type(t)
