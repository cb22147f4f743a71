"""The plain float types: f32, f16 and bf16 (block size 1), ggml's ``fp16``/``bf16`` row converters."""
from __future__ import annotations

import numpy as np

from .core import float32, fp16, register


def f32_to_float(b: np.ndarray) -> np.ndarray:
    return b.astype(float32).reshape(-1, 1)


def f32_from_float(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, float32).reshape(-1)


def f16_to_float(b: np.ndarray) -> np.ndarray:
    return b.astype(float32).reshape(-1, 1)


def f16_from_float(x: np.ndarray) -> np.ndarray:
    return fp16(x).reshape(-1)


def bf16_to_float(b: np.ndarray) -> np.ndarray:
    """bf16 is the top half of a float32: shift the 16 bits back up."""
    return (b.astype(np.uint32) << 16).view(float32).reshape(-1, 1)


def bf16_from_float(x: np.ndarray) -> np.ndarray:
    """ggml_compute_fp32_to_bf16: round to nearest even; NaNs are kept NaN (quiet bit forced)."""
    u = np.ascontiguousarray(x, float32).reshape(-1).view(np.uint32)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    rounded = (u.astype(np.uint64) + (0x7FFF + ((u >> 16) & 1))) >> 16
    return np.where(nan, (u >> 16) | 64, rounded).astype(np.uint16)


register("f32", np.dtype("<f4"), f32_to_float, f32_from_float)
register("f16", np.dtype("<f2"), f16_to_float, f16_from_float)
register("bf16", np.dtype("<u2"), bf16_to_float, bf16_from_float)
