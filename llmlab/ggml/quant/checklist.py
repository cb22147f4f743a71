"""The checks every block format must pass (ggml's test-quantize-fns, plus a byte-exact cross-check).

Used by the test-suite for the built-in types and by notebook 05 for a format added at run time.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..types import GGMLType, TYPES, ggml_type
from .core import dequantize, quantize


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """float32 arrays equal bit for bit (NaN payloads and signed zeros included)."""
    a, b = np.asarray(a, np.float32).reshape(-1), np.asarray(b, np.float32).reshape(-1)
    return a.shape == b.shape and bool(np.array_equal(a.view(np.uint32), b.view(np.uint32)))


def rms_error(x: np.ndarray, qtype) -> float:
    """RMS of x - dequantize(quantize(x)), relative to the RMS of x."""
    x = np.asarray(x, np.float32).reshape(-1)
    y = dequantize(quantize(x, qtype), qtype)
    return float(np.sqrt(np.mean((x.astype(np.float64) - y) ** 2)) / max(np.sqrt(np.mean(x.astype(np.float64) ** 2)), 1e-30))


def run_checklist(qtype, reference_dequantize: Callable | None = None, max_rms: float = 1.0,
                  seed: int = 0) -> dict[str, bool]:
    """The checklist for one type; returns {check: passed}.

    registered     the id and name resolve to the same entry of the type table
    layout         the block dtype is exactly type_size bytes (the static_assert)
    bpw            bits per weight = 8 * type_size / block_size
    roundtrip      random rows survive quantize -> dequantize with a relative RMS error below ``max_rms``
    cross_check    dequantize equals an independent reference decoder, bit for bit (if given)
    """
    t: GGMLType = ggml_type(qtype)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(64 * t.block_size).astype(np.float32)
    raw = quantize(x, t)
    y = dequantize(raw, t)
    res = {
        "registered": TYPES.get(t.id) is t and ggml_type(t.name) is t,
        "layout": t.layout is not None and t.layout.itemsize == t.type_size,
        "bpw": t.bits_per_weight == 8 * t.type_size / t.block_size,
        "roundtrip": raw.size == x.size // t.block_size * t.type_size and rms_error(x, t) < max_rms,
    }
    if reference_dequantize is not None:
        res["cross_check"] = same_bits(np.asarray(reference_dequantize(raw.tobytes(), x.size), np.float32), y)
    return res
