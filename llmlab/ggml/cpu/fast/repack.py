"""Fast twin of ``llmlab.ggml.cpu.repack.mul_mat_q4_k_repacked``: q4_K in the REPACK buffer,
ggml_gemv_q4_K_8x8_q8_K and ggml_gemm_q4_K_8x8_q8_K (arch/x86/repack.cpp), on the layout of
``quants.pack_q4_k``. ``repack_step`` and ``pair_sums`` are shared with dot4's byte-dot twin."""
from __future__ import annotations

import numpy as np
from numba import njit

from ._common import NOPYTHON, fma
from .quants import _mad2, pair_sums, q4_k_superblocks


@njit(inline="always", **NOPYTHON)
def repack_step(a, am, s, m, D, p, r, dd, dm, gemm):
    """One q4_K super-block of output row r in the REPACK kernels: the sub-block dots D[:, r] times the
    scales s[:, r] and the pair sums p (pair_sums) times the mins m[:, r], in pairs (64 values, int32);
    the gemm kernel (groups of 4 activation rows) adds them with one fma each, acc = fma(isum, d_w d_x,
    acc) and acc_m = fma(imins, dmin_w d_x, acc_m); the gemv kernel adds the whole super-block at once.
    Returns the new (acc, acc_m)."""
    i0, i1 = _mad2(s[0, r], D[0, r], s[1, r], D[1, r]), _mad2(s[2, r], D[2, r], s[3, r], D[3, r])
    i2, i3 = _mad2(s[4, r], D[4, r], s[5, r], D[5, r]), _mad2(s[6, r], D[6, r], s[7, r], D[7, r])
    m0, m1 = _mad2(m[0, r], p[0], m[1, r], p[1]), _mad2(m[2, r], p[2], m[3, r], p[3])
    m2, m3 = _mad2(m[4, r], p[4], m[5, r], p[5]), _mad2(m[6, r], p[6], m[7, r], p[7])
    if gemm:
        a = fma(i3, dd, fma(i2, dd, fma(i1, dd, fma(i0, dd, a))))
        am = fma(m3, dm, fma(m2, dm, fma(m1, dm, fma(m0, dm, am))))
    else:
        a = fma(np.int32(np.int32(i0 + i1) + np.int32(i2 + i3)), dd, a)
        am = fma(np.int32(np.int32(m0 + m1) + np.int32(m2 + m3)), dm, am)
    return a, am


@njit(inline="always", **NOPYTHON)
def _repack_steps(s_, m_, dw, dmw, D, bsums, t, b, ya, gemm, acc, accm):
    p = pair_sums(bsums, t, 16 * b)
    for r in range(acc.shape[0]):
        acc[r], accm[r] = repack_step(acc[r], accm[r], s_, m_, D, p, r, dw[r] * ya, dmw[r] * ya, gemm)


@njit(parallel=True, **NOPYTHON)
def mul_mat_q4_k_repacked(qs, sc, mn, d, dmin, aq, ad, bsums):
    """Rows in groups of 4 (gemm): per 64 values acc = fma(isum, d_w d_x, acc), acc_m = fma(imins,
    dmin_w d_x, acc_m); the rows left over (gemv): one fma per super-block. Result acc - acc_m."""
    return q4_k_superblocks(qs, sc, mn, d, dmin, aq, ad, bsums, _repack_steps)
