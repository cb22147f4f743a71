"""Fast twins of ``llmlab.ggml.cpu.tiled.mul_mat_k_tiled`` (ggml-cpu's tiled K-quant kernels, from
``tiled_min_batch`` activation rows on): one float step per super-block, on ``quants``' packed layouts."""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from ._common import NOPYTHON, fma
from .quants import chunk_dots, q4_k_superblocks, widen_q6_k


@njit(inline="always", **NOPYTHON)
def _tiled_steps(sc, mn, dw, dmw, D, bsums, t, b, ya, gemm, acc, accm):
    """res = d_w * (float) s1; res = fma(-dmin_w, (float) s2, res); acc = fma(res, d_x, acc)."""
    k = 16 * b
    for r in range(acc.shape[0]):
        s1 = np.int32(0)
        s2 = np.int32(0)
        for c in range(8):
            s1 = np.int32(s1 + np.int32(sc[c, r] * D[c, r]))
            s2 = np.int32(s2 + np.int32(mn[c, r] * np.int32(bsums[t, k + 2 * c] + bsums[t, k + 2 * c + 1])))
        res = dw[r] * np.float32(s1)
        res = fma(-dmw[r], s2, res)
        acc[r] = fma(res, ya, acc[r])


@njit(parallel=True, **NOPYTHON)
def mul_mat_q4_k_tiled(qs, sc, mn, d, dmin, aq, ad, bsums):
    return q4_k_superblocks(qs, sc, mn, d, dmin, aq, ad, bsums, _tiled_steps)


@njit(parallel=True, **NOPYTHON)
def mul_mat_q6_k_tiled(W6, sc, d, aq, ad, bsums):
    """res = d_w * (float) s1 (s1 with the signed codes); acc = fma(res, d_x, acc)."""
    ng, nb, nr = W6.shape[0], W6.shape[1], W6.shape[3]
    T = aq.shape[0]
    out = np.empty((T, ng * nr), np.float32)
    for g in prange(ng):
        D = np.empty((16, nr), np.int32)
        acc = np.zeros((T, nr), np.float32)
        W = np.empty((256, nr), np.int16)
        for b in range(nb):
            widen_q6_k(W6, g, b, W, nr)
            for t in range(T):
                chunk_dots(W, aq, t, 256 * b, D, nr, 4)
                ya = ad[t, b]
                k = 16 * b
                for r in range(nr):
                    s1 = np.int32(0)
                    for s in range(16):
                        s1 = np.int32(s1 + np.int32(sc[g, b, s, r] * np.int32(D[s, r] - 32 * bsums[t, k + s])))
                    res = d[g, b, r] * np.float32(s1)
                    acc[t, r] = fma(res, ya, acc[t, r])
        for t in range(T):
            for r in range(nr):
                out[t, g * nr + r] = acc[t, r]
    return out
