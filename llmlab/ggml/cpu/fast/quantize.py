"""Activation quantizers (ggml-cpu's ``quantize_row_q8_*`` as the x86 and the ARM builds run them), numba
twins of ``llmlab.ggml.cpu.quants.quantize_activations``: ``quantize_q8_*`` for x86 (q8_0/q8_1 scale by
127/amax), ``quantize_q8_*_neon`` for arch/arm/quants.c (by 1/d) and AArch64's fused q8_K rounding.

Returned as plain arrays, not structured blocks: codes (T, K) int8, scales (T, K / block) float32
(q8_0/q8_1 scales already rounded to float16 and back, as the kernels read them), q8_1's ``s`` likewise,
q8_K's block sums (T, K / 16) int16.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ._common import NOPYTHON, f16_round


@njit(inline="always", **NOPYTHON)
def _amax_iscale(x, t, o):
    """The 32-value block at x[t, o:o+32]: its largest magnitude and 127/amax (0 for an all-zero block),
    as the x86 quantize_row_q8_0/q8_1 compute them; a NaN makes amax NaN, as in the NumPy reference."""
    amax = np.float32(0.0)
    for i in range(32):
        v = abs(x[t, o + i])
        if v > amax or v != v:
            amax = v
            if v != v:
                break
    return amax, (np.float32(127.0) / amax if amax != 0 else np.float32(0.0))


@njit(inline="always", **NOPYTHON)
def _code(v):
    """rint(v) as an int32, NaN (from a NaN or an infinite x) as NumPy's cast gives it on x86: INT32_MIN
    (whose int8 truncation is 0)."""
    r = np.rint(v)
    return np.int32(-2147483648) if r != r else np.int32(r)


@njit(inline="always", **NOPYTHON)
def _q8_1(x, neon):
    """quantize_row_q8_1 of either build: x86 q = rint(x * 127/amax), NEON (``neon``) d = amax/127,
    q = rint(x * (1/d)) (vcvtnq_s32_f32: ties to even); then d and s = d * sum(q) rounded to f16."""
    T, K = x.shape
    nb = K // 32
    qs = np.empty((T, K), np.int8)
    d = np.empty((T, nb), np.float32)
    s = np.empty((T, nb), np.float32)
    for t in range(T):
        for b in range(nb):
            o = b * 32
            amax, iscale = _amax_iscale(x, t, o)
            dd = amax / np.float32(127.0)
            if neon:
                iscale = np.float32(1.0) / dd if dd != 0 else np.float32(0.0)
            total = 0
            for i in range(32):
                q = _code(x[t, o + i] * iscale)
                qs[t, o + i] = np.int8(q)
                total += q
            d[t, b] = f16_round(dd)
            s[t, b] = f16_round(dd * np.float32(total))
    return qs, d, s


@njit(**NOPYTHON)
def quantize_q8_1(x):
    """x (T, K) float32 -> (qs (T, K) int8, d (T, K/32) float32, s (T, K/32) float32): quantize_row_q8_1,
    d = f16(amax/127), q = rint(x * 127/amax), s = f16(d * sum(q)) with the unrounded float32 d."""
    return _q8_1(x, False)


@njit(**NOPYTHON)
def quantize_q8_1_neon(x):
    """arch/arm/quants.c quantize_row_q8_1: as quantize_q8_1, but q = rint(x * (1/d))."""
    return _q8_1(x, True)


@njit(**NOPYTHON)
def quantize_q8_0_neon(x):
    """arch/arm/quants.c quantize_row_q8_0: the codes and scales of quantize_q8_1_neon."""
    qs, d, _ = _q8_1(x, True)
    return qs, d


@njit(**NOPYTHON)
def quantize_q8_0(x):
    """x (T, K) float32 -> (qs (T, K) int8, d (T, K/32) float32): quantize_row_q8_0, which is q8_1
    without its sums s (the same codes and scales)."""
    qs, d, _ = quantize_q8_1(x)
    return qs, d


@njit(inline="always", **NOPYTHON)
def _q8_k(x, fused):
    """quantize_row_q8_K_ref; ``fused``: AArch64's GCC contracts ``iscale*x + 0x1.8p23`` into one fma,
    so the exact product is rounded once (x86 rounds the float product)."""
    T, K = x.shape
    nb = K // 256
    qs = np.empty((T, K), np.int8)
    d = np.empty((T, nb), np.float32)
    bsums = np.empty((T, K // 16), np.int16)
    for t in range(T):
        for b in range(nb):
            o = b * 256
            amax = np.float32(0.0)
            mx = np.float32(0.0)
            for i in range(256):
                v = x[t, o + i]
                if abs(v) > amax:
                    amax = abs(v)
                    mx = v
            if amax == 0:
                d[t, b] = 0.0
                for i in range(256):
                    qs[t, o + i] = 0
                for j in range(16):
                    bsums[t, b * 16 + j] = 0
                continue
            iscale = np.float32(-127.0) / mx
            for i in range(256):
                if fused:
                    c = _code(np.float64(iscale) * np.float64(x[t, o + i]))
                else:
                    c = _code(iscale * x[t, o + i])
                qs[t, o + i] = np.int8(min(c, np.int32(127)))
            d[t, b] = np.float32(1.0) / iscale if iscale != 0 else np.float32(np.copysign(np.inf, iscale))  # |max| = inf
            for j in range(16):
                sm = 0
                for i in range(16):
                    sm += qs[t, o + 16 * j + i]
                bsums[t, b * 16 + j] = sm
    return qs, d, bsums


@njit(**NOPYTHON)
def quantize_q8_k(x):
    """ggml's quantize_row_q8_K_ref: iscale = -127/max (the signed value of the first largest |x|),
    q = min(127, rint(iscale * x)), d = 1/iscale (float32), bsums = sums of 16 codes."""
    return _q8_k(x, False)


@njit(**NOPYTHON)
def quantize_q8_k_neon(x):
    """quantize_row_q8_K_ref as GCC compiles it for AArch64: q = min(127, rint(iscale * x)) of the
    exact product."""
    return _q8_k(x, True)


@njit(inline="always", **NOPYTHON)
def quantize_quads(x, q41, neon):
    """x (T, K) float32 -> the activations as the byte-dot kernels (``dot4_legacy``, ``dot4_neon``) read
    them: (aq4 (T, K/4) int32: the int8 codes four to a word, qsum: each word's four codes added, d, s),
    q8_1 blocks for q4_1, q8_0 blocks (s empty) otherwise, by the x86 or (``neon``) the ARM quantizers."""
    if q41:
        if neon:
            aq, ad, as_ = quantize_q8_1_neon(x)
        else:
            aq, ad, as_ = quantize_q8_1(x)
    else:
        if neon:
            aq, ad = quantize_q8_0_neon(x)
        else:
            aq, ad = quantize_q8_0(x)
        as_ = np.empty((0, 0), np.float32)        # (empty: np.zeros is a parallel region in a parallel kernel)
    T, K = aq.shape
    qsum = np.empty((T, K // 4), np.int32)
    for t in range(T):
        for i in range(K // 4):
            qsum[t, i] = (np.int32(aq[t, 4 * i]) + np.int32(aq[t, 4 * i + 1])
                          + np.int32(aq[t, 4 * i + 2]) + np.int32(aq[t, 4 * i + 3]))
    return aq.view(np.int32), qsum, ad, as_
