"""Fast twins of ``mul_mat_q32`` (ggml_vec_dot_q4_0_q8_0, q4_1_q8_1, q5_0_q8_0, q8_0_q8_0 on AVX2):
the weights repacked once, G rows side by side, so that every inner loop runs across rows.

Packed layout (``pack_q32``), for row group g (rows gG .. gG+G-1, the last group zero-padded) and block b:

* q4_0 / q4_1 / q5_0: ``qs[g, b, i, r]`` = byte i of row r's block (low nibble value i, high nibble i+16);
  q5_0 also ``qh[g, b, k, r]`` = byte k of its 32 high bits (bit j: value 8k+j);
* q8_0: ``qs[g, b, i, r]`` = code i of row r's block (int8);
* ``d[g, b, r]`` (and q4_1's ``m``): the float16 scales, as their uint16 bits (widened in the inner loop by
  the F16C instruction; as float32 they made a q4_1 weight 20 % larger to hold and to stream).

Per block the kernel unpacks the codes of G rows once into W (32, G) int16, then for every activation row
forms the 8 lane sums (lane j: the 4 products 4j..4j+3, exact integers) and takes the float step of the
reference: ``acc_j = fma(d_x * d_w, lane_j, acc_j)`` (the FMA instruction, as ggml), block
after block; at the end hsum_float_8 over the lanes (q4_1: + the scalar fma sum of m_w * s_x).
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from ._common import G, NOPYTHON, as_f32, fma, hsum8


@njit(inline="always", **NOPYTHON)
def _block16(W, a, t, o, dab, dwb, acc):
    """One block of G rows, W (32, G) int16 codes, against activation row t at offset o: lane sums
    in int16 (|sum| <= 4 * 16 * 127 for 4- and 5-bit codes), then the 8 float steps per row."""
    a0 = np.int16(a[t, o + 0]); a1 = np.int16(a[t, o + 1]); a2 = np.int16(a[t, o + 2]); a3 = np.int16(a[t, o + 3])
    a4 = np.int16(a[t, o + 4]); a5 = np.int16(a[t, o + 5]); a6 = np.int16(a[t, o + 6]); a7 = np.int16(a[t, o + 7])
    a8 = np.int16(a[t, o + 8]); a9 = np.int16(a[t, o + 9]); a10 = np.int16(a[t, o + 10]); a11 = np.int16(a[t, o + 11])
    a12 = np.int16(a[t, o + 12]); a13 = np.int16(a[t, o + 13]); a14 = np.int16(a[t, o + 14]); a15 = np.int16(a[t, o + 15])
    a16 = np.int16(a[t, o + 16]); a17 = np.int16(a[t, o + 17]); a18 = np.int16(a[t, o + 18]); a19 = np.int16(a[t, o + 19])
    a20 = np.int16(a[t, o + 20]); a21 = np.int16(a[t, o + 21]); a22 = np.int16(a[t, o + 22]); a23 = np.int16(a[t, o + 23])
    a24 = np.int16(a[t, o + 24]); a25 = np.int16(a[t, o + 25]); a26 = np.int16(a[t, o + 26]); a27 = np.int16(a[t, o + 27])
    a28 = np.int16(a[t, o + 28]); a29 = np.int16(a[t, o + 29]); a30 = np.int16(a[t, o + 30]); a31 = np.int16(a[t, o + 31])
    for r in range(G):                       # vectorized across the G rows
        l0 = np.int16(W[0, r] * a0 + W[1, r] * a1 + W[2, r] * a2 + W[3, r] * a3)
        l1 = np.int16(W[4, r] * a4 + W[5, r] * a5 + W[6, r] * a6 + W[7, r] * a7)
        l2 = np.int16(W[8, r] * a8 + W[9, r] * a9 + W[10, r] * a10 + W[11, r] * a11)
        l3 = np.int16(W[12, r] * a12 + W[13, r] * a13 + W[14, r] * a14 + W[15, r] * a15)
        l4 = np.int16(W[16, r] * a16 + W[17, r] * a17 + W[18, r] * a18 + W[19, r] * a19)
        l5 = np.int16(W[20, r] * a20 + W[21, r] * a21 + W[22, r] * a22 + W[23, r] * a23)
        l6 = np.int16(W[24, r] * a24 + W[25, r] * a25 + W[26, r] * a26 + W[27, r] * a27)
        l7 = np.int16(W[28, r] * a28 + W[29, r] * a29 + W[30, r] * a30 + W[31, r] * a31)
        d = dab * as_f32(dwb[r])
        acc[t, 0, r] = fma(d, l0, acc[t, 0, r])
        acc[t, 1, r] = fma(d, l1, acc[t, 1, r])
        acc[t, 2, r] = fma(d, l2, acc[t, 2, r])
        acc[t, 3, r] = fma(d, l3, acc[t, 3, r])
        acc[t, 4, r] = fma(d, l4, acc[t, 4, r])
        acc[t, 5, r] = fma(d, l5, acc[t, 5, r])
        acc[t, 6, r] = fma(d, l6, acc[t, 6, r])
        acc[t, 7, r] = fma(d, l7, acc[t, 7, r])


@njit(inline="always", **NOPYTHON)
def _block32(W, a, t, o, dab, dwb, acc):
    """As _block16 (W int8 or int16) with int32 lane sums (q8_0 codes: 4 * 128 * 127 exceeds int16), each the sum of two int16
    pair sums (2 * 128 * 127 fits)."""
    a0 = np.int16(a[t, o + 0]); a1 = np.int16(a[t, o + 1]); a2 = np.int16(a[t, o + 2]); a3 = np.int16(a[t, o + 3])
    a4 = np.int16(a[t, o + 4]); a5 = np.int16(a[t, o + 5]); a6 = np.int16(a[t, o + 6]); a7 = np.int16(a[t, o + 7])
    a8 = np.int16(a[t, o + 8]); a9 = np.int16(a[t, o + 9]); a10 = np.int16(a[t, o + 10]); a11 = np.int16(a[t, o + 11])
    a12 = np.int16(a[t, o + 12]); a13 = np.int16(a[t, o + 13]); a14 = np.int16(a[t, o + 14]); a15 = np.int16(a[t, o + 15])
    a16 = np.int16(a[t, o + 16]); a17 = np.int16(a[t, o + 17]); a18 = np.int16(a[t, o + 18]); a19 = np.int16(a[t, o + 19])
    a20 = np.int16(a[t, o + 20]); a21 = np.int16(a[t, o + 21]); a22 = np.int16(a[t, o + 22]); a23 = np.int16(a[t, o + 23])
    a24 = np.int16(a[t, o + 24]); a25 = np.int16(a[t, o + 25]); a26 = np.int16(a[t, o + 26]); a27 = np.int16(a[t, o + 27])
    a28 = np.int16(a[t, o + 28]); a29 = np.int16(a[t, o + 29]); a30 = np.int16(a[t, o + 30]); a31 = np.int16(a[t, o + 31])
    for r in range(G):                       # vectorized across the G rows
        l0 = np.int32(np.int16(np.int16(W[0, r]) * a0 + np.int16(W[1, r]) * a1)
                      + np.int16(np.int16(W[2, r]) * a2 + np.int16(W[3, r]) * a3))
        l1 = np.int32(np.int16(np.int16(W[4, r]) * a4 + np.int16(W[5, r]) * a5)
                      + np.int16(np.int16(W[6, r]) * a6 + np.int16(W[7, r]) * a7))
        l2 = np.int32(np.int16(np.int16(W[8, r]) * a8 + np.int16(W[9, r]) * a9)
                      + np.int16(np.int16(W[10, r]) * a10 + np.int16(W[11, r]) * a11))
        l3 = np.int32(np.int16(np.int16(W[12, r]) * a12 + np.int16(W[13, r]) * a13)
                      + np.int16(np.int16(W[14, r]) * a14 + np.int16(W[15, r]) * a15))
        l4 = np.int32(np.int16(np.int16(W[16, r]) * a16 + np.int16(W[17, r]) * a17)
                      + np.int16(np.int16(W[18, r]) * a18 + np.int16(W[19, r]) * a19))
        l5 = np.int32(np.int16(np.int16(W[20, r]) * a20 + np.int16(W[21, r]) * a21)
                      + np.int16(np.int16(W[22, r]) * a22 + np.int16(W[23, r]) * a23))
        l6 = np.int32(np.int16(np.int16(W[24, r]) * a24 + np.int16(W[25, r]) * a25)
                      + np.int16(np.int16(W[26, r]) * a26 + np.int16(W[27, r]) * a27))
        l7 = np.int32(np.int16(np.int16(W[28, r]) * a28 + np.int16(W[29, r]) * a29)
                      + np.int16(np.int16(W[30, r]) * a30 + np.int16(W[31, r]) * a31))
        d = dab * as_f32(dwb[r])
        acc[t, 0, r] = fma(d, l0, acc[t, 0, r])
        acc[t, 1, r] = fma(d, l1, acc[t, 1, r])
        acc[t, 2, r] = fma(d, l2, acc[t, 2, r])
        acc[t, 3, r] = fma(d, l3, acc[t, 3, r])
        acc[t, 4, r] = fma(d, l4, acc[t, 4, r])
        acc[t, 5, r] = fma(d, l5, acc[t, 5, r])
        acc[t, 6, r] = fma(d, l6, acc[t, 6, r])
        acc[t, 7, r] = fma(d, l7, acc[t, 7, r])


@njit(inline="always", **NOPYTHON)
def _finish(acc, out, t, col):
    for r in range(G):
        out[t, col + r] = hsum8(acc[t, 0, r], acc[t, 1, r], acc[t, 2, r], acc[t, 3, r],
                                acc[t, 4, r], acc[t, 5, r], acc[t, 6, r], acc[t, 7, r])


@njit(inline="always", **NOPYTHON)
def _mul_mat_q4_0(qs, d, aq, ad):
    """qs (ng, nb, 16, G) uint8, d (ng, nb, G) f16 bits; aq (T, K) int8, ad (T, nb) f32 (q8_0) -> (T, ng*G) f32."""
    ng, nb = qs.shape[0], qs.shape[1]
    T = aq.shape[0]
    out = np.empty((T, ng * G), np.float32)
    for g in prange(ng):
        W = np.empty((32, G), np.int16)
        acc = np.zeros((T, 8, G), np.float32)
        for b in range(nb):
            for i in range(16):
                for r in range(G):
                    v = qs[g, b, i, r]
                    W[i, r] = np.int16(v & np.uint8(15)) - np.int16(8)
                    W[i + 16, r] = np.int16(v >> np.uint8(4)) - np.int16(8)
            for t in range(T):
                _block16(W, aq, t, b * 32, ad[t, b], d[g, b], acc)
        for t in range(T):
            _finish(acc, out, t, g * G)
    return out


@njit(inline="always", **NOPYTHON)
def _mul_mat_q4_1(qs, d, m, aq, ad, as_):
    """qs (ng, nb, 16, G) uint8, d, m (ng, nb, G) f16 bits; aq (T, K) int8, ad, as_ (T, nb) f32 (q8_1)."""
    ng, nb = qs.shape[0], qs.shape[1]
    T = aq.shape[0]
    out = np.empty((T, ng * G), np.float32)
    for g in prange(ng):
        W = np.empty((32, G), np.int16)
        acc = np.zeros((T, 8, G), np.float32)
        summ = np.zeros((T, G), np.float32)
        for b in range(nb):
            for i in range(16):
                for r in range(G):
                    v = qs[g, b, i, r]
                    W[i, r] = np.int16(v & np.uint8(15))
                    W[i + 16, r] = np.int16(v >> np.uint8(4))
            for t in range(T):
                _block16(W, aq, t, b * 32, ad[t, b], d[g, b], acc)
                s = as_[t, b]
                for r in range(G):
                    summ[t, r] = fma(as_f32(m[g, b, r]), s, summ[t, r])
        for t in range(T):
            _finish(acc, out, t, g * G)
            for r in range(G):
                out[t, g * G + r] += summ[t, r]
    return out


@njit(inline="always", **NOPYTHON)
def _mul_mat_q5_0(qs, qh, d, aq, ad):
    """qs (ng, nb, 16, G) uint8, qh (ng, nb, 4, G) uint8, d (ng, nb, G) f16 bits; q8_0 activations."""
    ng, nb = qs.shape[0], qs.shape[1]
    T = aq.shape[0]
    out = np.empty((T, ng * G), np.float32)
    for g in prange(ng):
        W = np.empty((32, G), np.int16)
        acc = np.zeros((T, 8, G), np.float32)
        for b in range(nb):
            for i in range(16):
                k_lo, k_hi = i >> 3, (i + 16) >> 3
                mask = np.uint8(1 << (i & 7))
                for r in range(G):
                    v = qs[g, b, i, r]
                    h_lo = np.int16(0) if qh[g, b, k_lo, r] & mask == 0 else np.int16(16)
                    h_hi = np.int16(0) if qh[g, b, k_hi, r] & mask == 0 else np.int16(16)
                    W[i, r] = (np.int16(v & np.uint8(15)) | h_lo) - np.int16(16)
                    W[i + 16, r] = (np.int16(v >> np.uint8(4)) | h_hi) - np.int16(16)
            for t in range(T):
                _block16(W, aq, t, b * 32, ad[t, b], d[g, b], acc)
        for t in range(T):
            _finish(acc, out, t, g * G)
    return out


@njit(inline="always", **NOPYTHON)
def _mul_mat_q8_0(qs, d, aq, ad):
    """qs (ng, nb, 32, G) int8, d (ng, nb, G) f16 bits; q8_0 activations."""
    ng, nb, nr = qs.shape[0], qs.shape[1], qs.shape[3]
    T = aq.shape[0]
    out = np.empty((T, ng * G), np.float32)
    for g in prange(ng):
        W = np.empty((32, G), np.int16)
        acc = np.zeros((T, 8, G), np.float32)
        for b in range(nb):
            for i in range(32):                 # widened to int16 first: int8 operands made LLVM multiply in int64
                for r in range(nr):             # (nr == G, a run-time trip count: vectorized, not unrolled)
                    W[i, r] = qs[g, b, i, r]
            for t in range(T):
                _block32(W, aq, t, b * 32, ad[t, b], d[g, b], acc)
        for t in range(T):
            _finish(acc, out, t, g * G)
    return out



# ---- entry points: each kernel threaded (prange over row groups) and serial (for small work, where
# waking the other threads costs more than it saves; the same body, inlined, so the same bits) ----

@njit(parallel=True, **NOPYTHON)
def mul_mat_q4_0(qs, d, aq, ad):
    return _mul_mat_q4_0(qs, d, aq, ad)

@njit(**NOPYTHON)
def mul_mat_q4_0_serial(qs, d, aq, ad):
    return _mul_mat_q4_0(qs, d, aq, ad)

@njit(parallel=True, **NOPYTHON)
def mul_mat_q4_1(qs, d, m, aq, ad, as_):
    return _mul_mat_q4_1(qs, d, m, aq, ad, as_)

@njit(**NOPYTHON)
def mul_mat_q4_1_serial(qs, d, m, aq, ad, as_):
    return _mul_mat_q4_1(qs, d, m, aq, ad, as_)

@njit(parallel=True, **NOPYTHON)
def mul_mat_q5_0(qs, qh, d, aq, ad):
    return _mul_mat_q5_0(qs, qh, d, aq, ad)

@njit(**NOPYTHON)
def mul_mat_q5_0_serial(qs, qh, d, aq, ad):
    return _mul_mat_q5_0(qs, qh, d, aq, ad)

@njit(parallel=True, **NOPYTHON)
def mul_mat_q8_0(qs, d, aq, ad):
    return _mul_mat_q8_0(qs, d, aq, ad)

@njit(**NOPYTHON)
def mul_mat_q8_0_serial(qs, d, aq, ad):
    return _mul_mat_q8_0(qs, d, aq, ad)



# ---- decode kernels (few activation rows) -------------------------------------------------------

@njit(inline="always", **NOPYTHON)
def _mv_q4_0(qs, d, aq, ad):
    """Few activation rows (decode): the codes go from the packed bytes straight into registers (no
    scratch block), per activation row; the same integer lanes and float steps as mul_mat_q4_0."""
    ng, nb = qs.shape[0], qs.shape[1]
    T = aq.shape[0]
    out = np.empty((T, ng * G), np.float32)
    for g in prange(ng):
        acc = np.empty((8, G), np.float32)
        for t in range(T):
            acc[:] = 0
            for b in range(nb):
                o = b * 32
                a0 = np.int16(aq[t, o + 0]); a1 = np.int16(aq[t, o + 1]); a2 = np.int16(aq[t, o + 2]); a3 = np.int16(aq[t, o + 3])
                a4 = np.int16(aq[t, o + 4]); a5 = np.int16(aq[t, o + 5]); a6 = np.int16(aq[t, o + 6]); a7 = np.int16(aq[t, o + 7])
                a8 = np.int16(aq[t, o + 8]); a9 = np.int16(aq[t, o + 9]); a10 = np.int16(aq[t, o + 10]); a11 = np.int16(aq[t, o + 11])
                a12 = np.int16(aq[t, o + 12]); a13 = np.int16(aq[t, o + 13]); a14 = np.int16(aq[t, o + 14]); a15 = np.int16(aq[t, o + 15])
                a16 = np.int16(aq[t, o + 16]); a17 = np.int16(aq[t, o + 17]); a18 = np.int16(aq[t, o + 18]); a19 = np.int16(aq[t, o + 19])
                a20 = np.int16(aq[t, o + 20]); a21 = np.int16(aq[t, o + 21]); a22 = np.int16(aq[t, o + 22]); a23 = np.int16(aq[t, o + 23])
                a24 = np.int16(aq[t, o + 24]); a25 = np.int16(aq[t, o + 25]); a26 = np.int16(aq[t, o + 26]); a27 = np.int16(aq[t, o + 27])
                a28 = np.int16(aq[t, o + 28]); a29 = np.int16(aq[t, o + 29]); a30 = np.int16(aq[t, o + 30]); a31 = np.int16(aq[t, o + 31])
                dab = ad[t, b]
                for r in range(G):
                    v0 = qs[g, b, 0, r]; v1 = qs[g, b, 1, r]; v2 = qs[g, b, 2, r]; v3 = qs[g, b, 3, r]
                    v4 = qs[g, b, 4, r]; v5 = qs[g, b, 5, r]; v6 = qs[g, b, 6, r]; v7 = qs[g, b, 7, r]
                    v8 = qs[g, b, 8, r]; v9 = qs[g, b, 9, r]; v10 = qs[g, b, 10, r]; v11 = qs[g, b, 11, r]
                    v12 = qs[g, b, 12, r]; v13 = qs[g, b, 13, r]; v14 = qs[g, b, 14, r]; v15 = qs[g, b, 15, r]
                    l0 = np.int16((np.int16(v0 & np.uint8(15)) - np.int16(8)) * a0 + (np.int16(v1 & np.uint8(15)) - np.int16(8)) * a1
                         + (np.int16(v2 & np.uint8(15)) - np.int16(8)) * a2 + (np.int16(v3 & np.uint8(15)) - np.int16(8)) * a3)
                    l1 = np.int16((np.int16(v4 & np.uint8(15)) - np.int16(8)) * a4 + (np.int16(v5 & np.uint8(15)) - np.int16(8)) * a5
                         + (np.int16(v6 & np.uint8(15)) - np.int16(8)) * a6 + (np.int16(v7 & np.uint8(15)) - np.int16(8)) * a7)
                    l2 = np.int16((np.int16(v8 & np.uint8(15)) - np.int16(8)) * a8 + (np.int16(v9 & np.uint8(15)) - np.int16(8)) * a9
                         + (np.int16(v10 & np.uint8(15)) - np.int16(8)) * a10 + (np.int16(v11 & np.uint8(15)) - np.int16(8)) * a11)
                    l3 = np.int16((np.int16(v12 & np.uint8(15)) - np.int16(8)) * a12 + (np.int16(v13 & np.uint8(15)) - np.int16(8)) * a13
                         + (np.int16(v14 & np.uint8(15)) - np.int16(8)) * a14 + (np.int16(v15 & np.uint8(15)) - np.int16(8)) * a15)
                    l4 = np.int16((np.int16(v0 >> np.uint8(4)) - np.int16(8)) * a16 + (np.int16(v1 >> np.uint8(4)) - np.int16(8)) * a17
                         + (np.int16(v2 >> np.uint8(4)) - np.int16(8)) * a18 + (np.int16(v3 >> np.uint8(4)) - np.int16(8)) * a19)
                    l5 = np.int16((np.int16(v4 >> np.uint8(4)) - np.int16(8)) * a20 + (np.int16(v5 >> np.uint8(4)) - np.int16(8)) * a21
                         + (np.int16(v6 >> np.uint8(4)) - np.int16(8)) * a22 + (np.int16(v7 >> np.uint8(4)) - np.int16(8)) * a23)
                    l6 = np.int16((np.int16(v8 >> np.uint8(4)) - np.int16(8)) * a24 + (np.int16(v9 >> np.uint8(4)) - np.int16(8)) * a25
                         + (np.int16(v10 >> np.uint8(4)) - np.int16(8)) * a26 + (np.int16(v11 >> np.uint8(4)) - np.int16(8)) * a27)
                    l7 = np.int16((np.int16(v12 >> np.uint8(4)) - np.int16(8)) * a28 + (np.int16(v13 >> np.uint8(4)) - np.int16(8)) * a29
                         + (np.int16(v14 >> np.uint8(4)) - np.int16(8)) * a30 + (np.int16(v15 >> np.uint8(4)) - np.int16(8)) * a31)
                    dd = dab * as_f32(d[g, b, r])
                    acc[0, r] = fma(dd, l0, acc[0, r])
                    acc[1, r] = fma(dd, l1, acc[1, r])
                    acc[2, r] = fma(dd, l2, acc[2, r])
                    acc[3, r] = fma(dd, l3, acc[3, r])
                    acc[4, r] = fma(dd, l4, acc[4, r])
                    acc[5, r] = fma(dd, l5, acc[5, r])
                    acc[6, r] = fma(dd, l6, acc[6, r])
                    acc[7, r] = fma(dd, l7, acc[7, r])
            for r in range(G):
                out[t, g * G + r] = hsum8(acc[0, r], acc[1, r], acc[2, r], acc[3, r],
                                          acc[4, r], acc[5, r], acc[6, r], acc[7, r])

    return out


@njit(parallel=True, **NOPYTHON)
def mv_q4_0(qs, d, aq, ad):
    return _mv_q4_0(qs, d, aq, ad)


@njit(**NOPYTHON)
def mv_q4_0_serial(qs, d, aq, ad):
    return _mv_q4_0(qs, d, aq, ad)

@njit(inline="always", **NOPYTHON)
def _mv_q4_1(qs, d, m, aq, ad, as_):
    """Few activation rows (decode): the codes go from the packed bytes straight into registers (no
    scratch block), per activation row; the same integer lanes and float steps as mul_mat_q4_1."""
    ng, nb = qs.shape[0], qs.shape[1]
    T = aq.shape[0]
    out = np.empty((T, ng * G), np.float32)
    for g in prange(ng):
        acc = np.empty((8, G), np.float32)
        summ = np.empty(G, np.float32)
        for t in range(T):
            acc[:] = 0
            summ[:] = 0
            for b in range(nb):
                o = b * 32
                a0 = np.int16(aq[t, o + 0]); a1 = np.int16(aq[t, o + 1]); a2 = np.int16(aq[t, o + 2]); a3 = np.int16(aq[t, o + 3])
                a4 = np.int16(aq[t, o + 4]); a5 = np.int16(aq[t, o + 5]); a6 = np.int16(aq[t, o + 6]); a7 = np.int16(aq[t, o + 7])
                a8 = np.int16(aq[t, o + 8]); a9 = np.int16(aq[t, o + 9]); a10 = np.int16(aq[t, o + 10]); a11 = np.int16(aq[t, o + 11])
                a12 = np.int16(aq[t, o + 12]); a13 = np.int16(aq[t, o + 13]); a14 = np.int16(aq[t, o + 14]); a15 = np.int16(aq[t, o + 15])
                a16 = np.int16(aq[t, o + 16]); a17 = np.int16(aq[t, o + 17]); a18 = np.int16(aq[t, o + 18]); a19 = np.int16(aq[t, o + 19])
                a20 = np.int16(aq[t, o + 20]); a21 = np.int16(aq[t, o + 21]); a22 = np.int16(aq[t, o + 22]); a23 = np.int16(aq[t, o + 23])
                a24 = np.int16(aq[t, o + 24]); a25 = np.int16(aq[t, o + 25]); a26 = np.int16(aq[t, o + 26]); a27 = np.int16(aq[t, o + 27])
                a28 = np.int16(aq[t, o + 28]); a29 = np.int16(aq[t, o + 29]); a30 = np.int16(aq[t, o + 30]); a31 = np.int16(aq[t, o + 31])
                dab = ad[t, b]
                s = as_[t, b]
                for r in range(G):
                    v0 = qs[g, b, 0, r]; v1 = qs[g, b, 1, r]; v2 = qs[g, b, 2, r]; v3 = qs[g, b, 3, r]
                    v4 = qs[g, b, 4, r]; v5 = qs[g, b, 5, r]; v6 = qs[g, b, 6, r]; v7 = qs[g, b, 7, r]
                    v8 = qs[g, b, 8, r]; v9 = qs[g, b, 9, r]; v10 = qs[g, b, 10, r]; v11 = qs[g, b, 11, r]
                    v12 = qs[g, b, 12, r]; v13 = qs[g, b, 13, r]; v14 = qs[g, b, 14, r]; v15 = qs[g, b, 15, r]
                    l0 = np.int16(np.int16(v0 & np.uint8(15)) * a0 + np.int16(v1 & np.uint8(15)) * a1
                         + np.int16(v2 & np.uint8(15)) * a2 + np.int16(v3 & np.uint8(15)) * a3)
                    l1 = np.int16(np.int16(v4 & np.uint8(15)) * a4 + np.int16(v5 & np.uint8(15)) * a5
                         + np.int16(v6 & np.uint8(15)) * a6 + np.int16(v7 & np.uint8(15)) * a7)
                    l2 = np.int16(np.int16(v8 & np.uint8(15)) * a8 + np.int16(v9 & np.uint8(15)) * a9
                         + np.int16(v10 & np.uint8(15)) * a10 + np.int16(v11 & np.uint8(15)) * a11)
                    l3 = np.int16(np.int16(v12 & np.uint8(15)) * a12 + np.int16(v13 & np.uint8(15)) * a13
                         + np.int16(v14 & np.uint8(15)) * a14 + np.int16(v15 & np.uint8(15)) * a15)
                    l4 = np.int16(np.int16(v0 >> np.uint8(4)) * a16 + np.int16(v1 >> np.uint8(4)) * a17
                         + np.int16(v2 >> np.uint8(4)) * a18 + np.int16(v3 >> np.uint8(4)) * a19)
                    l5 = np.int16(np.int16(v4 >> np.uint8(4)) * a20 + np.int16(v5 >> np.uint8(4)) * a21
                         + np.int16(v6 >> np.uint8(4)) * a22 + np.int16(v7 >> np.uint8(4)) * a23)
                    l6 = np.int16(np.int16(v8 >> np.uint8(4)) * a24 + np.int16(v9 >> np.uint8(4)) * a25
                         + np.int16(v10 >> np.uint8(4)) * a26 + np.int16(v11 >> np.uint8(4)) * a27)
                    l7 = np.int16(np.int16(v12 >> np.uint8(4)) * a28 + np.int16(v13 >> np.uint8(4)) * a29
                         + np.int16(v14 >> np.uint8(4)) * a30 + np.int16(v15 >> np.uint8(4)) * a31)
                    dd = dab * as_f32(d[g, b, r])
                    acc[0, r] = fma(dd, l0, acc[0, r])
                    acc[1, r] = fma(dd, l1, acc[1, r])
                    acc[2, r] = fma(dd, l2, acc[2, r])
                    acc[3, r] = fma(dd, l3, acc[3, r])
                    acc[4, r] = fma(dd, l4, acc[4, r])
                    acc[5, r] = fma(dd, l5, acc[5, r])
                    acc[6, r] = fma(dd, l6, acc[6, r])
                    acc[7, r] = fma(dd, l7, acc[7, r])
                    summ[r] = fma(as_f32(m[g, b, r]), s, summ[r])
            for r in range(G):
                out[t, g * G + r] = hsum8(acc[0, r], acc[1, r], acc[2, r], acc[3, r],
                                          acc[4, r], acc[5, r], acc[6, r], acc[7, r])
                out[t, g * G + r] += summ[r]
    return out


@njit(parallel=True, **NOPYTHON)
def mv_q4_1(qs, d, m, aq, ad, as_):
    return _mv_q4_1(qs, d, m, aq, ad, as_)


@njit(**NOPYTHON)
def mv_q4_1_serial(qs, d, m, aq, ad, as_):
    return _mv_q4_1(qs, d, m, aq, ad, as_)

@njit(inline="always", **NOPYTHON)
def _mv_q5_0(qs, qh, d, aq, ad):
    """Few activation rows (decode): the codes go from the packed bytes straight into registers (no
    scratch block), per activation row; the same integer lanes and float steps as mul_mat_q5_0."""
    ng, nb = qs.shape[0], qs.shape[1]
    T = aq.shape[0]
    out = np.empty((T, ng * G), np.float32)
    for g in prange(ng):
        acc = np.empty((8, G), np.float32)
        for t in range(T):
            acc[:] = 0
            for b in range(nb):
                o = b * 32
                a0 = np.int16(aq[t, o + 0]); a1 = np.int16(aq[t, o + 1]); a2 = np.int16(aq[t, o + 2]); a3 = np.int16(aq[t, o + 3])
                a4 = np.int16(aq[t, o + 4]); a5 = np.int16(aq[t, o + 5]); a6 = np.int16(aq[t, o + 6]); a7 = np.int16(aq[t, o + 7])
                a8 = np.int16(aq[t, o + 8]); a9 = np.int16(aq[t, o + 9]); a10 = np.int16(aq[t, o + 10]); a11 = np.int16(aq[t, o + 11])
                a12 = np.int16(aq[t, o + 12]); a13 = np.int16(aq[t, o + 13]); a14 = np.int16(aq[t, o + 14]); a15 = np.int16(aq[t, o + 15])
                a16 = np.int16(aq[t, o + 16]); a17 = np.int16(aq[t, o + 17]); a18 = np.int16(aq[t, o + 18]); a19 = np.int16(aq[t, o + 19])
                a20 = np.int16(aq[t, o + 20]); a21 = np.int16(aq[t, o + 21]); a22 = np.int16(aq[t, o + 22]); a23 = np.int16(aq[t, o + 23])
                a24 = np.int16(aq[t, o + 24]); a25 = np.int16(aq[t, o + 25]); a26 = np.int16(aq[t, o + 26]); a27 = np.int16(aq[t, o + 27])
                a28 = np.int16(aq[t, o + 28]); a29 = np.int16(aq[t, o + 29]); a30 = np.int16(aq[t, o + 30]); a31 = np.int16(aq[t, o + 31])
                dab = ad[t, b]
                for r in range(G):
                    v0 = qs[g, b, 0, r]; v1 = qs[g, b, 1, r]; v2 = qs[g, b, 2, r]; v3 = qs[g, b, 3, r]
                    v4 = qs[g, b, 4, r]; v5 = qs[g, b, 5, r]; v6 = qs[g, b, 6, r]; v7 = qs[g, b, 7, r]
                    v8 = qs[g, b, 8, r]; v9 = qs[g, b, 9, r]; v10 = qs[g, b, 10, r]; v11 = qs[g, b, 11, r]
                    v12 = qs[g, b, 12, r]; v13 = qs[g, b, 13, r]; v14 = qs[g, b, 14, r]; v15 = qs[g, b, 15, r]
                    h0 = qh[g, b, 0, r]; h1 = qh[g, b, 1, r]; h2 = qh[g, b, 2, r]; h3 = qh[g, b, 3, r]
                    l0 = np.int16(((np.int16(v0 & np.uint8(15)) | (np.int16((h0 >> np.uint8(0)) & np.uint8(1)) << np.int16(4))) - np.int16(16)) * a0 + ((np.int16(v1 & np.uint8(15)) | (np.int16((h0 >> np.uint8(1)) & np.uint8(1)) << np.int16(4))) - np.int16(16)) * a1
                         + ((np.int16(v2 & np.uint8(15)) | (np.int16((h0 >> np.uint8(2)) & np.uint8(1)) << np.int16(4))) - np.int16(16)) * a2 + ((np.int16(v3 & np.uint8(15)) | (np.int16((h0 >> np.uint8(3)) & np.uint8(1)) << np.int16(4))) - np.int16(16)) * a3)
                    l1 = np.int16(((np.int16(v4 & np.uint8(15)) | (np.int16((h0 >> np.uint8(4)) & np.uint8(1)) << np.int16(4))) - np.int16(16)) * a4 + ((np.int16(v5 & np.uint8(15)) | (np.int16((h0 >> np.uint8(5)) & np.uint8(1)) << np.int16(4))) - np.int16(16)) * a5
                         + ((np.int16(v6 & np.uint8(15)) | (np.int16((h0 >> np.uint8(6)) & np.uint8(1)) << np.int16(4))) - np.int16(16)) * a6 + ((np.int16(v7 & np.uint8(15)) | (np.int16((h0 >> np.uint8(7)) & np.uint8(1)) << np.int16(4))) - np.int16(16)) * a7)
                    l2 = np.int16(((np.int16(v8 & np.uint8(15)) | (np.int16((h1 >> np.uint8(0)) & np.uint8(1)) << np.int16(4))) - np.int16(16)) * a8 + ((np.int16(v9 & np.uint8(15)) | (np.int16((h1 >> np.uint8(1)) & np.uint8(1)) << np.int16(4))) - np.int16(16)) * a9
                         + ((np.int16(v10 & np.uint8(15)) | (np.int16((h1 >> np.uint8(2)) & np.uint8(1)) << np.int16(4))) - np.int16(16)) * a10 + ((np.int16(v11 & np.uint8(15)) | (np.int16((h1 >> np.uint8(3)) & np.uint8(1)) << np.int16(4))) - np.int16(16)) * a11)
                    l3 = np.int16(((np.int16(v12 & np.uint8(15)) | (np.int16((h1 >> np.uint8(4)) & np.uint8(1)) << np.int16(4))) - np.int16(16)) * a12 + ((np.int16(v13 & np.uint8(15)) | (np.int16((h1 >> np.uint8(5)) & np.uint8(1)) << np.int16(4))) - np.int16(16)) * a13
                         + ((np.int16(v14 & np.uint8(15)) | (np.int16((h1 >> np.uint8(6)) & np.uint8(1)) << np.int16(4))) - np.int16(16)) * a14 + ((np.int16(v15 & np.uint8(15)) | (np.int16((h1 >> np.uint8(7)) & np.uint8(1)) << np.int16(4))) - np.int16(16)) * a15)
                    l4 = np.int16(((np.int16(v0 >> np.uint8(4)) | (np.int16((h2 >> np.uint8(0)) & np.uint8(1)) << np.int16(4))) - np.int16(16)) * a16 + ((np.int16(v1 >> np.uint8(4)) | (np.int16((h2 >> np.uint8(1)) & np.uint8(1)) << np.int16(4))) - np.int16(16)) * a17
                         + ((np.int16(v2 >> np.uint8(4)) | (np.int16((h2 >> np.uint8(2)) & np.uint8(1)) << np.int16(4))) - np.int16(16)) * a18 + ((np.int16(v3 >> np.uint8(4)) | (np.int16((h2 >> np.uint8(3)) & np.uint8(1)) << np.int16(4))) - np.int16(16)) * a19)
                    l5 = np.int16(((np.int16(v4 >> np.uint8(4)) | (np.int16((h2 >> np.uint8(4)) & np.uint8(1)) << np.int16(4))) - np.int16(16)) * a20 + ((np.int16(v5 >> np.uint8(4)) | (np.int16((h2 >> np.uint8(5)) & np.uint8(1)) << np.int16(4))) - np.int16(16)) * a21
                         + ((np.int16(v6 >> np.uint8(4)) | (np.int16((h2 >> np.uint8(6)) & np.uint8(1)) << np.int16(4))) - np.int16(16)) * a22 + ((np.int16(v7 >> np.uint8(4)) | (np.int16((h2 >> np.uint8(7)) & np.uint8(1)) << np.int16(4))) - np.int16(16)) * a23)
                    l6 = np.int16(((np.int16(v8 >> np.uint8(4)) | (np.int16((h3 >> np.uint8(0)) & np.uint8(1)) << np.int16(4))) - np.int16(16)) * a24 + ((np.int16(v9 >> np.uint8(4)) | (np.int16((h3 >> np.uint8(1)) & np.uint8(1)) << np.int16(4))) - np.int16(16)) * a25
                         + ((np.int16(v10 >> np.uint8(4)) | (np.int16((h3 >> np.uint8(2)) & np.uint8(1)) << np.int16(4))) - np.int16(16)) * a26 + ((np.int16(v11 >> np.uint8(4)) | (np.int16((h3 >> np.uint8(3)) & np.uint8(1)) << np.int16(4))) - np.int16(16)) * a27)
                    l7 = np.int16(((np.int16(v12 >> np.uint8(4)) | (np.int16((h3 >> np.uint8(4)) & np.uint8(1)) << np.int16(4))) - np.int16(16)) * a28 + ((np.int16(v13 >> np.uint8(4)) | (np.int16((h3 >> np.uint8(5)) & np.uint8(1)) << np.int16(4))) - np.int16(16)) * a29
                         + ((np.int16(v14 >> np.uint8(4)) | (np.int16((h3 >> np.uint8(6)) & np.uint8(1)) << np.int16(4))) - np.int16(16)) * a30 + ((np.int16(v15 >> np.uint8(4)) | (np.int16((h3 >> np.uint8(7)) & np.uint8(1)) << np.int16(4))) - np.int16(16)) * a31)
                    dd = dab * as_f32(d[g, b, r])
                    acc[0, r] = fma(dd, l0, acc[0, r])
                    acc[1, r] = fma(dd, l1, acc[1, r])
                    acc[2, r] = fma(dd, l2, acc[2, r])
                    acc[3, r] = fma(dd, l3, acc[3, r])
                    acc[4, r] = fma(dd, l4, acc[4, r])
                    acc[5, r] = fma(dd, l5, acc[5, r])
                    acc[6, r] = fma(dd, l6, acc[6, r])
                    acc[7, r] = fma(dd, l7, acc[7, r])
            for r in range(G):
                out[t, g * G + r] = hsum8(acc[0, r], acc[1, r], acc[2, r], acc[3, r],
                                          acc[4, r], acc[5, r], acc[6, r], acc[7, r])

    return out


@njit(parallel=True, **NOPYTHON)
def mv_q5_0(qs, qh, d, aq, ad):
    return _mv_q5_0(qs, qh, d, aq, ad)


@njit(**NOPYTHON)
def mv_q5_0_serial(qs, qh, d, aq, ad):
    return _mv_q5_0(qs, qh, d, aq, ad)

@njit(inline="always", **NOPYTHON)
def _mv_q8_0(qs, d, aq, ad):
    """Few activation rows (decode): the codes go from the packed bytes straight into registers (no
    scratch block), per activation row; the same integer lanes and float steps as mul_mat_q8_0.
    qs is the uint8 view of the int8 codes: u - ((u >> 7) << 8) keeps LLVM in int16 (a sign extension of
    int8 made it widen every product to int64)."""
    ng, nb = qs.shape[0], qs.shape[1]
    T = aq.shape[0]
    out = np.empty((T, ng * G), np.float32)
    for g in prange(ng):
        acc = np.empty((8, G), np.float32)
        for t in range(T):
            acc[:] = 0
            for b in range(nb):
                o = b * 32
                a0 = np.int16(aq[t, o + 0]); a1 = np.int16(aq[t, o + 1]); a2 = np.int16(aq[t, o + 2]); a3 = np.int16(aq[t, o + 3])
                a4 = np.int16(aq[t, o + 4]); a5 = np.int16(aq[t, o + 5]); a6 = np.int16(aq[t, o + 6]); a7 = np.int16(aq[t, o + 7])
                a8 = np.int16(aq[t, o + 8]); a9 = np.int16(aq[t, o + 9]); a10 = np.int16(aq[t, o + 10]); a11 = np.int16(aq[t, o + 11])
                a12 = np.int16(aq[t, o + 12]); a13 = np.int16(aq[t, o + 13]); a14 = np.int16(aq[t, o + 14]); a15 = np.int16(aq[t, o + 15])
                a16 = np.int16(aq[t, o + 16]); a17 = np.int16(aq[t, o + 17]); a18 = np.int16(aq[t, o + 18]); a19 = np.int16(aq[t, o + 19])
                a20 = np.int16(aq[t, o + 20]); a21 = np.int16(aq[t, o + 21]); a22 = np.int16(aq[t, o + 22]); a23 = np.int16(aq[t, o + 23])
                a24 = np.int16(aq[t, o + 24]); a25 = np.int16(aq[t, o + 25]); a26 = np.int16(aq[t, o + 26]); a27 = np.int16(aq[t, o + 27])
                a28 = np.int16(aq[t, o + 28]); a29 = np.int16(aq[t, o + 29]); a30 = np.int16(aq[t, o + 30]); a31 = np.int16(aq[t, o + 31])
                dab = ad[t, b]
                for r in range(G):
                    l0 = np.int32(np.int16((np.int16(qs[g, b, 0, r]) - (np.int16(qs[g, b, 0, r] >> np.uint8(7)) << np.int16(8))) * a0 + (np.int16(qs[g, b, 1, r]) - (np.int16(qs[g, b, 1, r] >> np.uint8(7)) << np.int16(8))) * a1)
                         + np.int16((np.int16(qs[g, b, 2, r]) - (np.int16(qs[g, b, 2, r] >> np.uint8(7)) << np.int16(8))) * a2 + (np.int16(qs[g, b, 3, r]) - (np.int16(qs[g, b, 3, r] >> np.uint8(7)) << np.int16(8))) * a3))
                    l1 = np.int32(np.int16((np.int16(qs[g, b, 4, r]) - (np.int16(qs[g, b, 4, r] >> np.uint8(7)) << np.int16(8))) * a4 + (np.int16(qs[g, b, 5, r]) - (np.int16(qs[g, b, 5, r] >> np.uint8(7)) << np.int16(8))) * a5)
                         + np.int16((np.int16(qs[g, b, 6, r]) - (np.int16(qs[g, b, 6, r] >> np.uint8(7)) << np.int16(8))) * a6 + (np.int16(qs[g, b, 7, r]) - (np.int16(qs[g, b, 7, r] >> np.uint8(7)) << np.int16(8))) * a7))
                    l2 = np.int32(np.int16((np.int16(qs[g, b, 8, r]) - (np.int16(qs[g, b, 8, r] >> np.uint8(7)) << np.int16(8))) * a8 + (np.int16(qs[g, b, 9, r]) - (np.int16(qs[g, b, 9, r] >> np.uint8(7)) << np.int16(8))) * a9)
                         + np.int16((np.int16(qs[g, b, 10, r]) - (np.int16(qs[g, b, 10, r] >> np.uint8(7)) << np.int16(8))) * a10 + (np.int16(qs[g, b, 11, r]) - (np.int16(qs[g, b, 11, r] >> np.uint8(7)) << np.int16(8))) * a11))
                    l3 = np.int32(np.int16((np.int16(qs[g, b, 12, r]) - (np.int16(qs[g, b, 12, r] >> np.uint8(7)) << np.int16(8))) * a12 + (np.int16(qs[g, b, 13, r]) - (np.int16(qs[g, b, 13, r] >> np.uint8(7)) << np.int16(8))) * a13)
                         + np.int16((np.int16(qs[g, b, 14, r]) - (np.int16(qs[g, b, 14, r] >> np.uint8(7)) << np.int16(8))) * a14 + (np.int16(qs[g, b, 15, r]) - (np.int16(qs[g, b, 15, r] >> np.uint8(7)) << np.int16(8))) * a15))
                    l4 = np.int32(np.int16((np.int16(qs[g, b, 16, r]) - (np.int16(qs[g, b, 16, r] >> np.uint8(7)) << np.int16(8))) * a16 + (np.int16(qs[g, b, 17, r]) - (np.int16(qs[g, b, 17, r] >> np.uint8(7)) << np.int16(8))) * a17)
                         + np.int16((np.int16(qs[g, b, 18, r]) - (np.int16(qs[g, b, 18, r] >> np.uint8(7)) << np.int16(8))) * a18 + (np.int16(qs[g, b, 19, r]) - (np.int16(qs[g, b, 19, r] >> np.uint8(7)) << np.int16(8))) * a19))
                    l5 = np.int32(np.int16((np.int16(qs[g, b, 20, r]) - (np.int16(qs[g, b, 20, r] >> np.uint8(7)) << np.int16(8))) * a20 + (np.int16(qs[g, b, 21, r]) - (np.int16(qs[g, b, 21, r] >> np.uint8(7)) << np.int16(8))) * a21)
                         + np.int16((np.int16(qs[g, b, 22, r]) - (np.int16(qs[g, b, 22, r] >> np.uint8(7)) << np.int16(8))) * a22 + (np.int16(qs[g, b, 23, r]) - (np.int16(qs[g, b, 23, r] >> np.uint8(7)) << np.int16(8))) * a23))
                    l6 = np.int32(np.int16((np.int16(qs[g, b, 24, r]) - (np.int16(qs[g, b, 24, r] >> np.uint8(7)) << np.int16(8))) * a24 + (np.int16(qs[g, b, 25, r]) - (np.int16(qs[g, b, 25, r] >> np.uint8(7)) << np.int16(8))) * a25)
                         + np.int16((np.int16(qs[g, b, 26, r]) - (np.int16(qs[g, b, 26, r] >> np.uint8(7)) << np.int16(8))) * a26 + (np.int16(qs[g, b, 27, r]) - (np.int16(qs[g, b, 27, r] >> np.uint8(7)) << np.int16(8))) * a27))
                    l7 = np.int32(np.int16((np.int16(qs[g, b, 28, r]) - (np.int16(qs[g, b, 28, r] >> np.uint8(7)) << np.int16(8))) * a28 + (np.int16(qs[g, b, 29, r]) - (np.int16(qs[g, b, 29, r] >> np.uint8(7)) << np.int16(8))) * a29)
                         + np.int16((np.int16(qs[g, b, 30, r]) - (np.int16(qs[g, b, 30, r] >> np.uint8(7)) << np.int16(8))) * a30 + (np.int16(qs[g, b, 31, r]) - (np.int16(qs[g, b, 31, r] >> np.uint8(7)) << np.int16(8))) * a31))
                    dd = dab * as_f32(d[g, b, r])
                    acc[0, r] = fma(dd, l0, acc[0, r])
                    acc[1, r] = fma(dd, l1, acc[1, r])
                    acc[2, r] = fma(dd, l2, acc[2, r])
                    acc[3, r] = fma(dd, l3, acc[3, r])
                    acc[4, r] = fma(dd, l4, acc[4, r])
                    acc[5, r] = fma(dd, l5, acc[5, r])
                    acc[6, r] = fma(dd, l6, acc[6, r])
                    acc[7, r] = fma(dd, l7, acc[7, r])
            for r in range(G):
                out[t, g * G + r] = hsum8(acc[0, r], acc[1, r], acc[2, r], acc[3, r],
                                          acc[4, r], acc[5, r], acc[6, r], acc[7, r])

    return out


@njit(parallel=True, **NOPYTHON)
def mv_q8_0(qs, d, aq, ad):
    return _mv_q8_0(qs.view(np.uint8), d, aq, ad)


@njit(**NOPYTHON)
def mv_q8_0_serial(qs, d, aq, ad):
    return _mv_q8_0(qs.view(np.uint8), d, aq, ad)


# ---- packing (once per weight, at load) ---------------------------------------------------------

def _groups(a: np.ndarray, R: int, size: int = G, axis: int = -1) -> np.ndarray:
    """(R, nb, ...) -> (ng, nb, ..., size) with the rows of a group at ``axis`` (last by default): rows
    padded with zeros to a multiple of ``size``, then moved there. The packed layouts of q32, kquants
    and dot4 are all made by it."""
    ng = -(-R // size)
    if ng * size != R:
        a = np.concatenate([a, np.zeros((ng * size - R,) + a.shape[1:], a.dtype)])
    a = a.reshape((ng, size) + a.shape[1:])
    return np.ascontiguousarray(np.moveaxis(a, 1, axis))


def pack_q32(raw: np.ndarray, tname: str, K: int) -> tuple:
    """Raw rows (R, row_bytes) uint8 of q4_0/q4_1/q5_0/q8_0 -> the kernel's arrays (see the module doc)."""
    from ...quant import legacy as L
    layout = {"q4_0": L.BLOCK_Q4_0, "q4_1": L.BLOCK_Q4_1, "q5_0": L.BLOCK_Q5_0, "q8_0": L.BLOCK_Q8_0}[tname]
    nb = K // 32
    w = np.ascontiguousarray(raw).reshape(-1).view(layout).reshape(-1, nb)
    R = w.shape[0]
    d = _groups(np.ascontiguousarray(w["d"]).view(np.uint16), R)
    qs = _groups(np.ascontiguousarray(w["qs"]), R)
    if tname == "q4_1":
        return qs, d, _groups(np.ascontiguousarray(w["m"]).view(np.uint16), R)
    if tname == "q5_0":
        return qs, _groups(np.ascontiguousarray(w["qh"]), R), d
    return qs, d
