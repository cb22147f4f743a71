"""numba twins of ggml-cpu's row ops whose float order matters: RMS norm and the RoPE rotation."""
from __future__ import annotations

import numpy as np
from numba import njit

from ._common import fma


@njit(cache=True)
def rms_norm(x, eps, out):
    """ggml_compute_forward_rms_norm_f32: float squares added in double, one after another;
    scale = 1/sqrt(mean + eps) in float. x and out: (rows, n)."""
    rows, n = x.shape
    for r in range(rows):
        s = np.float64(0.0)
        for i in range(n):
            v = x[r, i]
            s += np.float64(v * v)
        mean = np.float32(s / n)
        scale = np.float32(1.0) / np.sqrt(mean + eps)
        for i in range(n):
            out[r, i] = x[r, i] * scale


@njit(cache=True)
def rope(x, cos, sin, n_dims, neox, out):
    """rotate_pairs with the cos/sin cache: x (tokens, heads, head_dim), cos/sin (tokens, n_dims/2).
    NORM pairs (2i, 2i+1), NEOX pairs (i, i + n_dims/2); the first product of each line is fused."""
    T, H, D = x.shape
    half = n_dims // 2
    for th in range(T * H):
        t, h = th // H, th % H
        for i in range(half):
            i0, i1 = (i, i + half) if neox else (2 * i, 2 * i + 1)
            x0, x1 = x[t, h, i0], x[t, h, i1]
            c, s = cos[t, i], sin[t, i]
            out[t, h, i0] = fma(x0, c, -(x1 * s))
            out[t, h, i1] = fma(x0, s, x1 * c)
        for i in range(n_dims, D):
            out[t, h, i] = x[t, h, i]

