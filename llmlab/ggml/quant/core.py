"""The spine of the quant layer: ggml's ``type_traits[]`` hooks and the arithmetic every family shares.

A family module (``legacy``, ``k_quants``, ...) describes each of its types with
``register(name, layout, to_float, from_float)``: the numpy structured dtype of one
block (ggml-common.h's ``block_xxx``), the dequantizer (``dequantize_row_xxx``) and
the reference quantizer (``quantize_row_xxx_ref``). They are attached to the entries
of :data:`llmlab.ggml.types.TYPES`, the way ggml.c fills ``type_traits[]``.

Both converters work on whole blocks, vectorized over them:

* ``to_float(blocks)``: structured array ``(n,)`` of the layout -> float32 ``(n, block_size)``
* ``from_float(x)``: float32 ``(n, block_size)`` -> structured array ``(n,)``

The helpers below reproduce C's float32 arithmetic exactly: every operation is done
in float32 (numpy's rules with float32 operands), sums run left to right like the C
loops (``seq_sum``), and the three rounding functions of ggml-quants.c are spelled out.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ... import LLMLabError
from ..types import GGMLType, ggml_type

float32 = np.float32        # numpy's float32 (F32 is the ggml type, llmlab.ggml.tensor)
CHUNK_VALUES = 1 << 20     # quantize() works through at most this many values at a time


class QuantError(LLMLabError, ValueError):
    """Bad input to a quantizer or dequantizer (wrong length, a type without a converter)."""


def register(name: str, layout: np.dtype, to_float: Callable | None, from_float: Callable | None) -> GGMLType:
    """Attach a block layout and its converters to the ggml type ``name`` (ggml.c's type_traits entry)."""
    t = ggml_type(name)
    layout = np.dtype(layout)
    if layout.itemsize != t.type_size:
        raise AssertionError(f"{name}: layout is {layout.itemsize} bytes, ggml says {t.type_size}")
    t.layout, t.to_float, t.from_float = layout, to_float, from_float
    return t


# ---------------------------------------------------------------- rounding, as ggml-quants.c does it

def nearest_int(x: np.ndarray) -> np.ndarray:
    """ggml's ``nearest_int``: adds 1.5 * 2**23 in float32, so ties go to even (for |x| < 2**22)."""
    with np.errstate(invalid="ignore"):
        return np.rint(np.asarray(x, float32)).astype(np.int32)


def roundf(x: np.ndarray) -> np.ndarray:
    """C's ``roundf``/``lroundf``: halves go away from zero (exact for every float32)."""
    x = np.asarray(x, float32)
    a = np.abs(x)
    fl = np.floor(a)
    with np.errstate(invalid="ignore"):   # +-inf gives nan here (C: inf); lroundf of inf is undefined anyway
        return np.copysign(fl + np.floor(float32(2) * (a - fl)), x)


def trunc_int(x: np.ndarray) -> np.ndarray:
    """A C cast ``(int)x`` of a float: toward zero."""
    with np.errstate(invalid="ignore"):
        return np.trunc(np.asarray(x, float32)).astype(np.int32)


def seq_sum(a: np.ndarray, axis: int = -1) -> np.ndarray:
    """``s = a[0]; s += a[1]; ...`` in float32, in order (np.sum would add pairwise)."""
    return np.add.accumulate(np.asarray(a, float32), axis=axis).take(-1, axis=axis)


def inv_or_zero(d: np.ndarray) -> np.ndarray:
    """``d ? 1.0f/d : 0.0f``"""
    d = np.asarray(d, float32)
    with np.errstate(divide="ignore", over="ignore"):
        return np.where(d != 0, float32(1) / d, float32(0)).astype(float32)


def fp16(x) -> np.ndarray:
    """GGML_FP32_TO_FP16: round to nearest even."""
    with np.errstate(over="ignore"):
        return np.asarray(x, float32).astype(np.float16)


def first_absmax(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(amax, max) per row: the largest |v| and the signed value where it first occurs
    (the ``if (amax < fabsf(v)) { amax = fabsf(v); max = v; }`` loop, which passes over NaN)."""
    a = np.abs(x)
    a = np.where(a == a, a, a.dtype.type(0))
    i = np.argmax(a, axis=-1)[..., None]
    amax = np.take_along_axis(a, i, -1)[..., 0]
    mx = np.take_along_axis(x, i, -1)[..., 0]
    return amax, np.where(amax > 0, mx, x.dtype.type(0))     # never replaced: max stays +0.0


def first_min_max(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(min, max) per row as C's ``if (v < min) min = v`` loops find them: the first of equal
    values wins, which decides the sign of a zero (-0.0 before 0.0 stays -0.0)."""
    lo = np.take_along_axis(x, np.argmin(x, axis=-1)[..., None], -1)[..., 0]
    hi = np.take_along_axis(x, np.argmax(x, axis=-1)[..., None], -1)[..., 0]
    return lo, hi


def nibbles(qs: np.ndarray) -> np.ndarray:
    """Split bytes ``(..., k)`` into ``(..., 2k)``: the k low nibbles, then the k high ones."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def pack_nibbles(q: np.ndarray) -> np.ndarray:
    """Inverse of :func:`nibbles`: ``(..., 2k)`` values < 16 -> ``(..., k)`` bytes."""
    k = q.shape[-1] // 2
    return (q[..., :k] | (q[..., k:] << 4)).astype(np.uint8)


def bits(x: np.ndarray, n: int) -> np.ndarray:
    """The n lowest bits of each integer in ``x`` as a trailing axis of 0/1 uint8 (bit 0 first)."""
    return ((x[..., None] >> np.arange(n, dtype=x.dtype)) & 1).astype(np.uint8)


# ---------------------------------------------------------------- public API

def _type(qtype) -> GGMLType:
    try:
        return ggml_type(qtype)
    except (ValueError, TypeError) as e:
        raise QuantError(str(e)) from None


def blocks_of(raw, t: GGMLType) -> np.ndarray:
    """View raw bytes as an array of ``t``'s blocks, checking that they are whole blocks."""
    if t.layout is None:
        raise QuantError(f"ggml type {t.name} has no block layout (no dequantizer) in llmlab")
    data = np.frombuffer(raw, np.uint8) if isinstance(raw, (bytes, bytearray, memoryview)) else np.asarray(raw)
    if data.dtype == t.layout:
        return data.reshape(-1)
    if data.dtype != np.uint8:
        raise QuantError(f"{t.name}: raw data must be bytes or a uint8 array, not {data.dtype}")
    data = np.ascontiguousarray(data).reshape(-1)
    if data.size % t.type_size:
        raise QuantError(f"{t.name}: {data.size} bytes is not a whole number of {t.type_size}-byte blocks")
    return data.view(t.layout)


def random_blocks(qtype, n: int, seed: int = 0, scale: float = 2.0) -> np.ndarray:
    """``n`` blocks of random bytes whose f16 fields (the scales) hold finite values in [-scale, scale]:
    every bit pattern of the codes, meaningful numbers out (for tests and benchmarks)."""
    t = _type(qtype)
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, n * t.type_size, dtype=np.uint8)
    b = raw.view(t.layout)
    for f in t.layout.names or ():
        if t.layout[f] == np.dtype("<f2"):
            b[f] = rng.uniform(-scale, scale, b[f].shape).astype(np.float16)
    return raw


def dequantize(raw, qtype) -> np.ndarray:
    """Raw blocks of ``qtype`` (bytes or uint8 array) -> flat float32 values (ggml's ``to_float``)."""
    t = _type(qtype)
    b = blocks_of(raw, t)
    if t.to_float is None:
        raise QuantError(f"ggml type {t.name} has no dequantizer in llmlab")
    with np.errstate(all="ignore"):          # inf/NaN scales in the data propagate, as in C
        return t.to_float(b).reshape(-1).astype(float32, copy=False)


def quantize(values, qtype) -> np.ndarray:
    """float32 values (length a multiple of the block size) -> raw blocks as uint8 (``from_float_ref``)."""
    t = _type(qtype)
    if t.from_float is None:
        raise QuantError(f"ggml type {t.name} has no reference quantizer in llmlab")
    x = np.asarray(values, dtype=float32).reshape(-1)
    if x.size % t.block_size:
        raise QuantError(f"{t.name}: {x.size} values is not a multiple of the block size {t.block_size}")
    blocks = x.reshape(-1, t.block_size)
    step = max(1, CHUNK_VALUES // t.block_size)          # bounded temporaries for big tensors
    out = np.empty(len(blocks), t.layout)
    for i in range(0, len(blocks), step):
        out[i:i + step] = t.from_float(blocks[i:i + step])
    return out.view(np.uint8).reshape(-1)
