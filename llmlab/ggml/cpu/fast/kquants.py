"""Fast twins of the K-quant products (q4_K, q6_K weights x q8_K activations): ggml's AVX2 ``vec_dot``
(``mul_mat_k``, below 8 activation rows), the tiled kernels (``mul_mat_k_tiled``, from 8 rows on) and, for
q4_K in the REPACK buffer, its gemv/gemm (``mul_mat_q4_k_repacked``).

Packed layout (``pack_q4_k`` / ``pack_q6_k``), G rows side by side per super-block b of row group g:

* q4_K: ``qs[g, b, l, r]`` byte l of row r (low nibble: value 64(l//32) + l%32, high nibble: +32),
  ``sc``/``mn[g, b, c, r]`` the 6-bit scale and min of 32-value sub-block c (int16), ``d``/``dmin`` float32;
* q6_K: ``W6[g, b, i, r]`` the unsigned 6-bit code (0..63) of value i as uint8 (its bits gathered at load),
  ``sc[g, b, 16, r]`` (int16), ``d`` float32.

Each q4_K super-block is unpacked once into codes W (256, G) int16 (q6_K's codes are stored unpacked; their -32
comes back through the q8_K block sums), then for every activation row the integer sums (exact) and the reference's
float steps in its order.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from ._common import NOPYTHON, fma, hsum8


@njit(inline="always", **NOPYTHON)
def _quads(W, i, r, a, t, o):
    """The 8 lane sums of one 32-value chunk (rows i..i+31 of W, row r of the group) against activation
    row t at offset o: lane u = the 4 products 4u..4u+3 (int16: |sum| <= 4 * 63 * 127)."""
    q0 = np.int16(np.int16(W[i + 0, r]) * np.int16(a[t, o + 0]) + np.int16(W[i + 1, r]) * np.int16(a[t, o + 1]) + np.int16(W[i + 2, r]) * np.int16(a[t, o + 2]) + np.int16(W[i + 3, r]) * np.int16(a[t, o + 3]))
    q1 = np.int16(np.int16(W[i + 4, r]) * np.int16(a[t, o + 4]) + np.int16(W[i + 5, r]) * np.int16(a[t, o + 5]) + np.int16(W[i + 6, r]) * np.int16(a[t, o + 6]) + np.int16(W[i + 7, r]) * np.int16(a[t, o + 7]))
    q2 = np.int16(np.int16(W[i + 8, r]) * np.int16(a[t, o + 8]) + np.int16(W[i + 9, r]) * np.int16(a[t, o + 9]) + np.int16(W[i + 10, r]) * np.int16(a[t, o + 10]) + np.int16(W[i + 11, r]) * np.int16(a[t, o + 11]))
    q3 = np.int16(np.int16(W[i + 12, r]) * np.int16(a[t, o + 12]) + np.int16(W[i + 13, r]) * np.int16(a[t, o + 13]) + np.int16(W[i + 14, r]) * np.int16(a[t, o + 14]) + np.int16(W[i + 15, r]) * np.int16(a[t, o + 15]))
    q4 = np.int16(np.int16(W[i + 16, r]) * np.int16(a[t, o + 16]) + np.int16(W[i + 17, r]) * np.int16(a[t, o + 17]) + np.int16(W[i + 18, r]) * np.int16(a[t, o + 18]) + np.int16(W[i + 19, r]) * np.int16(a[t, o + 19]))
    q5 = np.int16(np.int16(W[i + 20, r]) * np.int16(a[t, o + 20]) + np.int16(W[i + 21, r]) * np.int16(a[t, o + 21]) + np.int16(W[i + 22, r]) * np.int16(a[t, o + 22]) + np.int16(W[i + 23, r]) * np.int16(a[t, o + 23]))
    q6 = np.int16(np.int16(W[i + 24, r]) * np.int16(a[t, o + 24]) + np.int16(W[i + 25, r]) * np.int16(a[t, o + 25]) + np.int16(W[i + 26, r]) * np.int16(a[t, o + 26]) + np.int16(W[i + 27, r]) * np.int16(a[t, o + 27]))
    q7 = np.int16(np.int16(W[i + 28, r]) * np.int16(a[t, o + 28]) + np.int16(W[i + 29, r]) * np.int16(a[t, o + 29]) + np.int16(W[i + 30, r]) * np.int16(a[t, o + 30]) + np.int16(W[i + 31, r]) * np.int16(a[t, o + 31]))
    return q0, q1, q2, q3, q4, q5, q6, q7


@njit(inline="always", **NOPYTHON)
def pair_sums(bsums, t, k):
    """q8_K's block sums bsums[t, k:k+16] (16 values each) added in pairs: the sums over the 8 sub-blocks
    of 32 values that the q4_K mins multiply."""
    return (np.int32(bsums[t, k + 0]) + np.int32(bsums[t, k + 1]), np.int32(bsums[t, k + 2]) + np.int32(bsums[t, k + 3]),
            np.int32(bsums[t, k + 4]) + np.int32(bsums[t, k + 5]), np.int32(bsums[t, k + 6]) + np.int32(bsums[t, k + 7]),
            np.int32(bsums[t, k + 8]) + np.int32(bsums[t, k + 9]), np.int32(bsums[t, k + 10]) + np.int32(bsums[t, k + 11]),
            np.int32(bsums[t, k + 12]) + np.int32(bsums[t, k + 13]), np.int32(bsums[t, k + 14]) + np.int32(bsums[t, k + 15]))


@njit(inline="always", **NOPYTHON)
def _mad2(a, x, b, y):
    """a*x + b*y in int32 (numba widens int32 products to int64 unless told)."""
    return np.int32(np.int32(np.int32(a) * np.int32(x)) + np.int32(np.int32(b) * np.int32(y)))


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
def _unpack_q4_k(qs, g, b, W, nr):
    for l in range(128):
        base = 64 * (l >> 5) + (l & 31)
        for r in range(nr):
            v = qs[g, b, l, r]
            W[base, r] = np.int16(v & np.uint8(15))
            W[base + 32, r] = np.int16(v >> np.uint8(4))


@njit(inline="always", **NOPYTHON)
def _quad(W, i, r, a, t, o):
    """One lane sum: W[i..i+3, r] . a[t, o..o+3] (int16)."""
    return np.int16(np.int16(W[i, r]) * np.int16(a[t, o]) + np.int16(W[i + 1, r]) * np.int16(a[t, o + 1])
                    + np.int16(W[i + 2, r]) * np.int16(a[t, o + 2]) + np.int16(W[i + 3, r]) * np.int16(a[t, o + 3]))


@njit(inline="always", **NOPYTHON)
def _chunk_dots(W, a, t, o, D, nr):
    """D[c, r] = the integer dot of 32-value chunk c (codes as unpacked) with activation row t."""
    for c in range(8):
        for r in range(nr):
            q0, q1, q2, q3, q4, q5, q6, q7 = _quads(W, 32 * c, r, a, t, o + 32 * c)
            D[c, r] = np.int32(np.int32(q0 + q1 + q2 + q3) + np.int32(q4 + q5 + q6 + q7))


@njit(inline="always", **NOPYTHON)
def _half_chunk_dots(W, a, t, o, D, nr):
    """D[s, r] = the integer dot of 16-value sub-block s with activation row t (one stream per loop)."""
    for s in range(16):
        i = 16 * s
        for r in range(nr):
            D[s, r] = np.int32(np.int32(_quad(W, i, r, a, t, o + i)) + np.int32(_quad(W, i + 4, r, a, t, o + i + 4))
                               + np.int32(_quad(W, i + 8, r, a, t, o + i + 8)) + np.int32(_quad(W, i + 12, r, a, t, o + i + 12)))


# ---- vec_dot (ggml_vec_dot_q4_K_q8_K / q6_K_q8_K, AVX2 lanes) ---------------------------------------

@njit(parallel=True, **NOPYTHON)
def mul_mat_q4_k(qs, sc, mn, d, dmin, aq, ad, bsums):
    """vec_dot: acc (8 lanes) = fma(d_x d_w, lane, acc), lane u = sum over chunks of scale * quad u;
    acc_m (4 lanes) = fma(-d_x dmin_w, mins . block sums, acc_m); hsum(acc) + ((m0 + m2) + (m1 + m3))."""
    ng, nb, nr = qs.shape[0], qs.shape[1], qs.shape[3]
    T = aq.shape[0]
    out = np.empty((T, ng * nr), np.float32)
    for g in prange(ng):
        W = np.empty((256, nr), np.int16)
        L = np.empty((8, nr), np.int32)
        acc = np.zeros((T, 8, nr), np.float32)
        accm = np.zeros((T, 4, nr), np.float32)
        for b in range(nb):
            _unpack_q4_k(qs, g, b, W, nr)
            for t in range(T):
                o = 256 * b
                for u in range(8):              # one output stream per loop: few runtime alias checks
                    for r in range(nr):
                        L[u, r] = np.int32(sc[g, b, 0, r] * _quad(W, 4 * u, r, aq, t, o + 4 * u))
                    for c in range(1, 8):
                        i = 32 * c + 4 * u
                        for r in range(nr):
                            L[u, r] += np.int32(sc[g, b, c, r] * _quad(W, i, r, aq, t, o + i))
                ya = ad[t, b]
                k = 16 * b
                p0, p1, p2, p3, p4, p5, p6, p7 = pair_sums(bsums, t, k)
                for r in range(nr):
                    dd = ya * d[g, b, r]
                    for u in range(8):
                        acc[t, u, r] = fma(dd, L[u, r], acc[t, u, r])
                    dm = -ya * dmin[g, b, r]
                    m0 = np.int32(np.int32(mn[g, b, 0, r] * p0) + np.int32(mn[g, b, 1, r] * p1))
                    m1 = np.int32(np.int32(mn[g, b, 2, r] * p2) + np.int32(mn[g, b, 3, r] * p3))
                    m2 = np.int32(np.int32(mn[g, b, 4, r] * p4) + np.int32(mn[g, b, 5, r] * p5))
                    m3 = np.int32(np.int32(mn[g, b, 6, r] * p6) + np.int32(mn[g, b, 7, r] * p7))
                    accm[t, 0, r] = fma(dm, m0, accm[t, 0, r])
                    accm[t, 1, r] = fma(dm, m1, accm[t, 1, r])
                    accm[t, 2, r] = fma(dm, m2, accm[t, 2, r])
                    accm[t, 3, r] = fma(dm, m3, accm[t, 3, r])
        for t in range(T):
            for r in range(nr):
                m = (accm[t, 0, r] + accm[t, 2, r]) + (accm[t, 1, r] + accm[t, 3, r])
                out[t, g * nr + r] = hsum8(acc[t, 0, r], acc[t, 1, r], acc[t, 2, r], acc[t, 3, r],
                                           acc[t, 4, r], acc[t, 5, r], acc[t, 6, r], acc[t, 7, r]) + m
    return out


@njit(parallel=True, **NOPYTHON)
def mul_mat_q6_k(W6, sc, d, aq, ad, bsums):
    """vec_dot: lanes from the unsigned codes (chunk c: lanes 0-3 scale 2c, lanes 4-7 scale 2c+1), lane k
    minus 32 (sc[2k] bsum[2k] + sc[2k+1] bsum[2k+1]); acc = fma(d_x d_w, lane, acc); hsum."""
    ng, nb, nr = W6.shape[0], W6.shape[1], W6.shape[3]
    T = aq.shape[0]
    out = np.empty((T, ng * nr), np.float32)
    for g in prange(ng):
        L = np.empty((8, nr), np.int32)
        acc = np.zeros((T, 8, nr), np.float32)
        W = np.empty((256, nr), np.int16)
        for b in range(nb):
            for i in range(256):        # widened to int16 first (uint8 operands: LLVM multiplied in int64)
                for r in range(nr):
                    W[i, r] = W6[g, b, i, r]
            for t in range(T):
                o = 256 * b
                for u in range(8):              # chunk c: lanes 0-3 take scale 2c, lanes 4-7 scale 2c+1
                    h = u >> 2
                    for r in range(nr):
                        L[u, r] = np.int32(sc[g, b, h, r] * _quad(W, 4 * u, r, aq, t, o + 4 * u))
                    for c in range(1, 8):
                        i = 32 * c + 4 * u
                        s = 2 * c + h
                        for r in range(nr):
                            L[u, r] += np.int32(sc[g, b, s, r] * _quad(W, i, r, aq, t, o + i))
                ya = ad[t, b]
                k = 16 * b
                for u in range(8):
                    b0 = np.int32(bsums[t, k + 2 * u])
                    b1 = np.int32(bsums[t, k + 2 * u + 1])
                    for r in range(nr):
                        L[u, r] -= np.int32(32 * np.int32(np.int32(sc[g, b, 2 * u, r]) * b0 + np.int32(sc[g, b, 2 * u + 1, r]) * b1))
                for r in range(nr):
                    dd = ya * d[g, b, r]
                    for u in range(8):
                        acc[t, u, r] = fma(dd, L[u, r], acc[t, u, r])
        for t in range(T):
            for r in range(nr):
                out[t, g * nr + r] = hsum8(acc[t, 0, r], acc[t, 1, r], acc[t, 2, r], acc[t, 3, r],
                                           acc[t, 4, r], acc[t, 5, r], acc[t, 6, r], acc[t, 7, r])
    return out


# ---- tiled (ggml-cpu's tiled kernels, from 8 activation rows on): one float step per super-block --------

@njit(parallel=True, **NOPYTHON)
def mul_mat_q4_k_tiled(qs, sc, mn, d, dmin, aq, ad, bsums):
    """res = d_w * (float) s1; res = fma(-dmin_w, (float) s2, res); acc = fma(res, d_x, acc)."""
    ng, nb, nr = qs.shape[0], qs.shape[1], qs.shape[3]
    T = aq.shape[0]
    out = np.empty((T, ng * nr), np.float32)
    for g in prange(ng):
        W = np.empty((256, nr), np.int16)
        D = np.empty((8, nr), np.int32)
        acc = np.zeros((T, nr), np.float32)
        for b in range(nb):
            _unpack_q4_k(qs, g, b, W, nr)
            for t in range(T):
                _chunk_dots(W, aq, t, 256 * b, D, nr)
                ya = ad[t, b]
                k = 16 * b
                for r in range(nr):
                    s1 = np.int32(0)
                    s2 = np.int32(0)
                    for c in range(8):
                        s1 = np.int32(s1 + np.int32(sc[g, b, c, r] * D[c, r]))
                        s2 = np.int32(s2 + np.int32(mn[g, b, c, r] * np.int32(bsums[t, k + 2 * c] + bsums[t, k + 2 * c + 1])))
                    res = d[g, b, r] * np.float32(s1)
                    res = fma(-dmin[g, b, r], s2, res)
                    acc[t, r] = fma(res, ya, acc[t, r])
        for t in range(T):
            for r in range(nr):
                out[t, g * nr + r] = acc[t, r]
    return out


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
            for i in range(256):        # widened to int16 first (uint8 operands: LLVM multiplied in int64)
                for r in range(nr):
                    W[i, r] = W6[g, b, i, r]
            for t in range(T):
                _half_chunk_dots(W, aq, t, 256 * b, D, nr)
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


# ---- q4_K in the REPACK buffer: ggml_gemv / ggml_gemm_q4_K_8x8_q8_K -----------------------------------

@njit(parallel=True, **NOPYTHON)
def mul_mat_q4_k_repacked(qs, sc, mn, d, dmin, aq, ad, bsums):
    """Rows in groups of 4 (gemm): per 64 values acc = fma(isum, d_w d_x, acc), acc_m = fma(imins,
    dmin_w d_x, acc_m); the rows left over (gemv): one fma per super-block. Result acc - acc_m."""
    ng, nb, nr = qs.shape[0], qs.shape[1], qs.shape[3]
    T = aq.shape[0]
    n_gemm = T - T % 4
    out = np.empty((T, ng * nr), np.float32)
    for g in prange(ng):
        W = np.empty((256, nr), np.int16)
        D = np.empty((8, nr), np.int32)
        acc = np.zeros((T, nr), np.float32)
        accm = np.zeros((T, nr), np.float32)
        for b in range(nb):
            _unpack_q4_k(qs, g, b, W, nr)
            for t in range(T):
                _chunk_dots(W, aq, t, 256 * b, D, nr)
                ya = ad[t, b]
                k = 16 * b
                p = pair_sums(bsums, t, k)
                gemm = t < n_gemm
                s_, m_ = sc[g, b], mn[g, b]
                for r in range(nr):
                    acc[t, r], accm[t, r] = repack_step(acc[t, r], accm[t, r], s_, m_, D, p, r,
                                                        d[g, b, r] * ya, dmin[g, b, r] * ya, gemm)
        for t in range(T):
            for r in range(nr):
                out[t, g * nr + r] = acc[t, r] - accm[t, r]
    return out


# ---- packing (once per weight, at load) ---------------------------------------------------------

def pack_q4_k(raw: np.ndarray, K: int) -> tuple:
    from ...quant import k_quants as KQ
    from .q32 import _groups
    nb = K // 256
    w = np.ascontiguousarray(raw).reshape(-1).view(KQ.BLOCK_Q4_K).reshape(-1, nb)
    R = w.shape[0]
    sc, mn = KQ.scale_min_k4(w.reshape(-1)["scales"])
    return (_groups(np.ascontiguousarray(w["qs"]), R), _groups(sc.astype(np.int16).reshape(R, nb, 8), R),
            _groups(mn.astype(np.int16).reshape(R, nb, 8), R), _groups(w["d"].astype(np.float32), R),
            _groups(w["dmin"].astype(np.float32), R))


def pack_q6_k(raw: np.ndarray, K: int) -> tuple:
    from ...quant import k_quants as KQ
    from .q32 import _groups
    nb = K // 256
    w = np.ascontiguousarray(raw).reshape(-1).view(KQ.BLOCK_Q6_K).reshape(-1, nb)
    R = w.shape[0]
    codes = (KQ.q6k_codes(w.reshape(-1)).astype(np.int16) + 32).astype(np.uint8).reshape(R, nb, 256)
    return (_groups(codes, R), _groups(w["scales"].astype(np.int16), R), _groups(w["d"].astype(np.float32), R))
