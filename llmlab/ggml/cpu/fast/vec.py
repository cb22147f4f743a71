"""numba twins of ggml-cpu's float vector code (vec.h / vec.cpp / llamafile's tinyBLAS), bit for bit.

Each function does the arithmetic of its NumPy reference in ``llmlab.ggml.cpu`` in the same
order: a fused multiply-add is a float64 product and sum rounded once to float32 (exact for
float32 inputs, as the reference does it), SIMD lanes are explicit loops, and every
horizontal reduction adds lanes in the tree the intrinsic uses. Which tree and how many lanes
come from the CPU profile as plain integers, so one compiled kernel serves every profile:

- ``lanes``: 16 (AVX-512) or 8 (AVX2) float lanes per register;
- the lane reduction: ``_mm512_reduce_add_ps`` for 16 lanes, ``hsum_float_8`` /
  llamafile's ``hsum`` for 8 (both add the high half to the low half, then pairs).

f16 values arrive as their uint16 bits with a 65,536-entry table to float32 (numba has no
float16), so nothing is converted twice.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

F16_TO_F32 = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)


@njit(inline="always")
def fma32(a, b, c):
    """float32 fma as the references emulate it: exact product, one rounding of the sum."""
    return np.float32(np.float64(a) * np.float64(b) + np.float64(c))


@njit(inline="always")
def reduce_lanes(v, lanes):
    """Horizontal sum of a float32 register: 16 lanes as _mm512_reduce_add_ps, 8 as hsum_float_8."""
    if lanes == 16:
        t = np.empty(8, np.float32)
        for i in range(8):
            t[i] = v[i + 8] + v[i]
    else:
        t = v
    r = np.empty(4, np.float32)
    for i in range(4):
        r[i] = t[i + 4] + t[i]
    return (r[0] + r[2]) + (r[1] + r[3])


# ---- f16 dot products: ggml_vec_dot_f16 (one activation row) and tinyBLAS (two or more) -------------

@njit(inline="always")
def _vec_dot_f16(a, b, lut, lanes):
    """ggml_vec_dot_f16: four registers take consecutive pieces of each 4*lanes step (fma), then
    (0+2),(1+3), (0+1), a lane reduction added to a double; the tail in double."""
    n = a.shape[0]
    step = 4 * lanes
    np_ = n - n % step
    acc = np.zeros((4, lanes), np.float32)
    for i in range(0, np_, step):
        for r in range(4):
            for l in range(lanes):
                k = i + r * lanes + l
                acc[r, l] = fma32(lut[a[k]], b[k], acc[r, l])
    s = np.empty(lanes, np.float32)
    for l in range(lanes):
        s[l] = (acc[0, l] + acc[2, l]) + (acc[1, l] + acc[3, l])
    total = np.float64(reduce_lanes(s, lanes))
    for k in range(np_, n):
        total += np.float64(lut[a[k]] * b[k])
    return np.float32(total)


@njit(inline="always")
def _tinyblas_f16(a, b, lut, lanes):
    """tinyBLAS: one register per output, fma across K in steps of ``lanes``, then its hsum."""
    acc = np.zeros(lanes, np.float32)
    for i in range(0, a.shape[0], lanes):
        for l in range(lanes):
            acc[l] = fma32(lut[a[i + l]], b[i + l], acc[l])
    return reduce_lanes(acc, lanes)


@njit(inline="always")
def _mul_mat_f16_rows(A, B, out, lut, lanes, tiny, j0, j1):
    H, T, R = out.shape
    g = H // A.shape[0]
    for hr in range(j0, j1):
        h, r = hr // R, hr % R
        a = A[h // g, r]
        for t in range(T):
            out[h, t, r] = _tinyblas_f16(a, B[h, t], lut, lanes) if tiny else _vec_dot_f16(a, B[h, t], lut, lanes)


@njit(cache=True)
def mul_mat_f16(A, B, out, lut, lanes, tiny):
    """out[h, t, r] = A[h // (H / Hk), r] . B[h, t] for f16 A (uint16 bits, (Hk, R, K), any strides)
    and B (H, T, K) float32 values already rounded to f16; ``tiny`` picks tinyBLAS over vec_dot."""
    _mul_mat_f16_rows(A, B, out, lut, lanes, tiny, 0, out.shape[0] * out.shape[2])


@njit(cache=True, parallel=True)
def mul_mat_f16_mt(A, B, out, lut, lanes, tiny, n_chunks):
    """:func:`mul_mat_f16` with the (head, row) pairs cut into ``n_chunks`` for the threads."""
    n = out.shape[0] * out.shape[2]
    for c in prange(n_chunks):
        _mul_mat_f16_rows(A, B, out, lut, lanes, tiny, c * n // n_chunks, (c + 1) * n // n_chunks)


# ---- exp, SiLU, softmax: ggml_v_expf per instruction set -------------------------------------------

LOG2E = np.float32(float.fromhex("0x1.715476p+0"))
SHIFT = np.float32(float.fromhex("0x1.8p23"))
LN2_HI = np.float32(float.fromhex("0x1.62e4p-1"))
LN2_LO = np.float32(float.fromhex("0x1.7f7d1cp-20"))
C0 = np.float32(float.fromhex("0x1.0e4020p-7"))
C1 = np.float32(float.fromhex("0x1.573e2ep-5"))
C2 = np.float32(float.fromhex("0x1.555e66p-3"))
C3 = np.float32(float.fromhex("0x1.fffdb6p-2"))
C4 = np.float32(float.fromhex("0x1.ffffecp-1"))
ONE = np.float32(1.0)


@njit(inline="always")
def v_expf_512(x):
    """ggml_v_expf, AVX-512: the polynomial includes the 1, then scalef(j, n)."""
    z = fma32(x, LOG2E, SHIFT)
    n = z - SHIFT
    b = fma32(-n, LN2_LO, fma32(-n, LN2_HI, x))
    u = b * b
    j = fma32(fma32(fma32(C0, b, C1), u, fma32(C2, b, C3)), u, fma32(C4, b, ONE))
    if not np.isfinite(n):
        return np.float32(np.nan) if np.isnan(n) else (np.float32(np.inf) if n > 0 else np.float32(0.0))
    if abs(n) > 192:
        return np.float32(np.inf) if n > 0 else np.float32(0.0)
    return np.float32(math.ldexp(np.float64(j), int(n)))


@njit(cache=True)
def exp_rows_512(x, out):
    for i in range(x.size):
        out.flat[i] = v_expf_512(x.flat[i])


@njit(inline="always")
def silu(x):
    """ggml_v_silu: x / (1 + exp(-x))."""
    return x / (ONE + v_expf_512(-x))


@njit(cache=True)
def swiglu(g, u, out):
    """ggml_vec_swiglu_f32 over rows: silu(g) * u."""
    for r in range(out.shape[0]):
        for i in range(out.shape[1]):
            out[r, i] = silu(g[r, i]) * u[r, i]


@njit(inline="always")
def _soft_max_rows(x, mask, scale, out, lanes, j0, j1):
    n_head, n_q, n = x.shape
    w = np.empty(n, np.float32)
    blk = np.empty(lanes, np.float32)
    for hq in range(j0, j1):
        h, q = hq // n_q, hq % n_q
        mx = np.float32(-np.inf)
        for i in range(n):
            v = x[h, q, i] * scale
            if mask.shape[0]:
                v = v + mask[q, i]
            w[i] = v
            if v > mx:
                mx = v
        s = np.float64(0.0)
        nv = n - n % lanes
        for i0 in range(0, nv, lanes):
            for l in range(lanes):
                e = v_expf_512(np.float32(w[i0 + l] - mx))
                w[i0 + l] = e
                blk[l] = e
            s += np.float64(reduce_lanes(blk, lanes))
        for i in range(nv, n):
            e = v_expf_512(np.float32(w[i] - mx))
            w[i] = e
            s += np.float64(e)
        inv = np.float32(1.0 / s)
        for i in range(n):
            out[h, q, i] = w[i] * inv


@njit(cache=True)
def soft_max(x, mask, scale, out, lanes):
    """ggml_compute_forward_soft_max_f32 per row: w = x*scale + mask, exp(w - max) in blocks of
    ``lanes`` whose reductions add up in double, then times (float)(1/sum). ``mask`` has one row per
    query row (broadcast over heads), or zero rows for none."""
    _soft_max_rows(x, mask, scale, out, lanes, 0, x.shape[0] * x.shape[1])


@njit(cache=True, parallel=True)
def soft_max_mt(x, mask, scale, out, lanes, n_chunks):
    n = x.shape[0] * x.shape[1]
    for c in prange(n_chunks):
        _soft_max_rows(x, mask, scale, out, lanes, c * n // n_chunks, (c + 1) * n // n_chunks)
