"""The C library's float math (cosf, sinf, tanhf, powf, expf), as ggml-cpu's scalar code calls it.

These are not always correctly rounded, so NumPy's own functions may differ in the last bit; where
bits matter (the RoPE cache, the GELU table, softmax tails) llmlab calls the same libm through ctypes.
"""
from __future__ import annotations

import numpy as np
from numpy import float32, float64

_LIBM = None


def libm():
    """The C math library with float signatures set, or False when it cannot be loaded."""
    global _LIBM
    if _LIBM is None:
        import ctypes
        import ctypes.util
        try:
            lib = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
            for f in ("cosf", "sinf", "tanhf", "expf"):
                getattr(lib, f).restype, getattr(lib, f).argtypes = ctypes.c_float, [ctypes.c_float]
            lib.powf.restype, lib.powf.argtypes = ctypes.c_float, [ctypes.c_float, ctypes.c_float]
            _LIBM = lib
        except OSError:
            _LIBM = False
    return _LIBM


def expf(x: np.ndarray) -> np.ndarray:
    """Element-wise C ``expf`` (a few elements at a time: softmax and SiLU tails)."""
    x = np.asarray(x, float32)
    lib = libm()
    if not lib:
        return np.exp(x.astype(float64)).astype(float32)
    flat = x.reshape(-1)
    return np.array([lib.expf(float(v)) for v in flat.tolist()], float32).reshape(x.shape)
