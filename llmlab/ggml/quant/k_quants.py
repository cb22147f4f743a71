"""The K-quants: super-blocks of 256 values (QK_K) split into sub-blocks of 16 or 32.

Each sub-block has its own small integer scale (and for q2_k/q4_k/q5_k a minimum),
and those integer scales are themselves quantized against one f16 super-block scale
``d`` (and ``dmin``). So a value is ``d * sc_j * q - dmin * m_j``: two levels of scales
for the price of 4-6 bits per sub-block instead of 16.

The reference quantizers are ggml-quants.c's ``quantize_row_q*_K_ref``, including the
scale searches ``make_qkx2_quants`` (scale + min, weighted least squares over a grid of
trial scales), ``make_qx_quants`` (symmetric, 19 trial scales) and ``make_q3_quants``
(symmetric, coordinate descent). They are vectorized over sub-blocks; every float sum
runs in C's order (``seq_sum``) so the bytes match llama.cpp's.
"""
from __future__ import annotations

import numpy as np

from ..types import QK_K
from .core import float32, first_absmax, first_min_max, fp16, nearest_int, register, seq_sum

K_SCALE_SIZE = 12
GROUP_MAX_EPS = float32(1e-15)

BLOCK_Q2_K = np.dtype([("scales", "u1", (QK_K // 16,)), ("qs", "u1", (QK_K // 4,)), ("d", "<f2"), ("dmin", "<f2")])
BLOCK_Q3_K = np.dtype([("hmask", "u1", (QK_K // 8,)), ("qs", "u1", (QK_K // 4,)), ("scales", "u1", (12,)), ("d", "<f2")])
BLOCK_Q4_K = np.dtype([("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", (K_SCALE_SIZE,)), ("qs", "u1", (QK_K // 2,))])
BLOCK_Q5_K = np.dtype([("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", (K_SCALE_SIZE,)),
                       ("qh", "u1", (QK_K // 8,)), ("qs", "u1", (QK_K // 2,))])
BLOCK_Q6_K = np.dtype([("ql", "u1", (QK_K // 2,)), ("qh", "u1", (QK_K // 4,)), ("scales", "i1", (QK_K // 16,)), ("d", "<f2")])
BLOCK_Q8_K = np.dtype([("d", "<f4"), ("qs", "i1", (QK_K,)), ("bsums", "<i2", (QK_K // 16,))])


# ---------------------------------------------------------------- bit layouts

def crumbs(qs: np.ndarray) -> np.ndarray:
    """2-bit codes of q2_k/q3_k (n, 64 bytes) -> (n, 256): for each half of 128 values,
    value 32*j + l is bits 2j..2j+1 of byte l of that half's 32 bytes."""
    n = qs.shape[0]
    q = qs.reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
    return (q & 3).reshape(n, QK_K)


def pack_crumbs(L: np.ndarray) -> np.ndarray:
    n = L.shape[0]
    L = L.reshape(n, 2, 4, 32).astype(np.uint8)
    return (L[:, :, 0] | (L[:, :, 1] << 2) | (L[:, :, 2] << 4) | (L[:, :, 3] << 6)).reshape(n, 64)


def scale_min_k4(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml's get_scale_min_k4 for all 8 sub-blocks: 12 bytes -> eight 6-bit scales and mins.

    bytes 0-3: scale j (low 6 bits) | top 2 bits of scale j+4
    bytes 4-7: min j   (low 6 bits) | top 2 bits of min j+4
    bytes 8-11: low 4 bits of scale j+4 | low 4 bits of min j+4 << 4
    """
    s = scales.reshape(-1, 3, 4)
    a, b, c = s[:, 0], s[:, 1], s[:, 2]
    sc = np.concatenate([a & 63, (c & 0x0F) | ((a >> 6) << 4)], axis=-1)
    mn = np.concatenate([b & 63, (c >> 4) | ((b >> 6) << 4)], axis=-1)
    return sc, mn


def pack_scale_min_k4(ls: np.ndarray, lm: np.ndarray) -> np.ndarray:
    ls, lm = ls.astype(np.uint8), lm.astype(np.uint8)
    return np.concatenate([ls[:, :4] | ((ls[:, 4:] >> 4) << 6),
                           lm[:, :4] | ((lm[:, 4:] >> 4) << 6),
                           (ls[:, 4:] & 0x0F) | ((lm[:, 4:] & 0x0F) << 4)], axis=-1)


def q3_scales(scales: np.ndarray) -> np.ndarray:
    """The sixteen 6-bit q3_k scales (minus 32): low nibbles in bytes 0-7, top 2 bits in bytes 8-11."""
    n = scales.shape[0]
    lo = (scales[:, :8].reshape(n, 1, 8) >> np.array([0, 4], np.uint8).reshape(1, 2, 1)).reshape(n, 16) & 0x0F
    hi = (scales[:, 8:].reshape(n, 1, 4) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 4, 1)).reshape(n, 16) & 3
    return (lo | (hi << 4)).astype(np.int8) - np.int8(32)


def pack_q3_scales(l: np.ndarray) -> np.ndarray:
    """Inverse of q3_scales for 6-bit codes l (n, 16) in 0..63."""
    l = l.astype(np.uint8)
    lo = (l[:, :8] & 0x0F) | ((l[:, 8:] & 0x0F) << 4)
    h = (l >> 4).reshape(-1, 4, 4)      # h[:, j // 4, j % 4]
    hi = h[:, 0] | (h[:, 1] << 2) | (h[:, 2] << 4) | (h[:, 3] << 6)
    return np.concatenate([lo, hi], axis=-1)


def q3_codes(b) -> np.ndarray:
    """q3_k values in -4..3: 2 low bits from qs, minus 4 where the hmask bit is clear."""
    n = b.shape[0]
    hbit = np.unpackbits(b["hmask"], axis=-1, bitorder="little").reshape(n, 32, 8).transpose(0, 2, 1).reshape(n, QK_K)
    return crumbs(b["qs"]).astype(np.int8) - ((hbit ^ 1) << 2).astype(np.int8)


def q4k_codes(qs: np.ndarray) -> np.ndarray:
    """4-bit codes of q4_k/q5_k (n, 128 bytes) -> (n, 256): 32 bytes per 64 values, low nibbles first."""
    n = qs.shape[0]
    q = qs.reshape(n, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    return (q & 0x0F).reshape(n, QK_K)


def q5k_codes(b) -> np.ndarray:
    n = b.shape[0]
    hbit = np.unpackbits(b["qh"], axis=-1, bitorder="little").reshape(n, 32, 8).transpose(0, 2, 1).reshape(n, QK_K)
    return q4k_codes(b["qs"]) | (hbit << 4)


def q6k_codes(b) -> np.ndarray:
    """q6_k values in -32..31: per half of 128, ql holds 64 bytes (low nibbles: values 0-63, high: 64-127)
    and qh 32 bytes (2 bits for each of the four 32-value quarters)."""
    n = b.shape[0]
    ql = (b["ql"].reshape(n, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)) & 0x0F
    qh = (b["qh"].reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & 3
    return (ql.reshape(n, QK_K) | (qh.reshape(n, QK_K) << 4)).astype(np.int8) - np.int8(32)


# ---------------------------------------------------------------- dequantize_row_*

def _f(b, name):
    return b[name].astype(float32)


def dequantize_q2_k(b):
    n = b.shape[0]
    d, dmin = _f(b, "d")[:, None], _f(b, "dmin")[:, None]
    dl = (d * (b["scales"] & 0x0F).astype(float32))[..., None]
    ml = (dmin * (b["scales"] >> 4).astype(float32))[..., None]
    return (dl * crumbs(b["qs"]).reshape(n, 16, 16).astype(float32) - ml).reshape(n, QK_K)


def dequantize_q3_k(b):
    n = b.shape[0]
    dl = (_f(b, "d")[:, None] * q3_scales(b["scales"]).astype(float32))[..., None]
    return (dl * q3_codes(b).reshape(n, 16, 16).astype(float32)).reshape(n, QK_K)


def _dequantize_k4(b, q):
    n = b.shape[0]
    sc, mn = scale_min_k4(b["scales"])
    d = (_f(b, "d")[:, None] * sc.astype(float32))[..., None]
    dm = (_f(b, "dmin")[:, None] * mn.astype(float32))[..., None]
    return (d * q.reshape(n, 8, 32).astype(float32) - dm).reshape(n, QK_K)


def dequantize_q4_k(b):
    return _dequantize_k4(b, q4k_codes(b["qs"]))


def dequantize_q5_k(b):
    return _dequantize_k4(b, q5k_codes(b))


def dequantize_q6_k(b):
    n = b.shape[0]
    d = (_f(b, "d")[:, None] * b["scales"].astype(float32))[..., None]
    return (d * q6k_codes(b).reshape(n, 16, 16).astype(float32)).reshape(n, QK_K)


def dequantize_q8_k(b):
    return _f(b, "d")[:, None] * b["qs"].astype(float32)


# ---------------------------------------------------------------- scale searches (ggml-quants.c)

def make_qkx2_quants(x, w, nmax, rmin, rdelta, nstep, use_mad):
    """Scale and minimum for asymmetric codes 0..nmax of each row of ``x`` (m, n), weights ``w``.

    Start from (max - min) / nmax, then try nstep+1 scales around it; for each, fit
    scale and min by weighted least squares and keep the one with the lowest weighted
    error. Returns (scale (m,), -min (m,), L (m, n) uint8).
    """
    x, w = np.asarray(x, float32), np.asarray(w, float32)
    mn, mx = first_min_max(x)
    sum_w, sum_x = seq_sum(w), seq_sum(w * x)
    mn = np.minimum(mn, float32(0))
    flat = mx == mn
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = (float32(nmax) / (mx - mn)).astype(float32)
        scale = (float32(1) / iscale).astype(float32)
        L = np.clip(nearest_int(iscale[:, None] * (x - mn[:, None])), 0, nmax)

        def err(s, m, Lf):
            diff = s[:, None] * Lf + m[:, None] - x
            diff = np.abs(diff) if use_mad else diff * diff
            return seq_sum(w * diff)

        best = err(scale, mn, L.astype(float32))
        for step in range(nstep + 1):
            iscale = ((float32(rmin) + float32(rdelta) * float32(step) + float32(nmax)) / (mx - mn)).astype(float32)
            Laux = np.clip(nearest_int(iscale[:, None] * (x - mn[:, None])), 0, nmax)
            lf = Laux.astype(float32)
            wl = w * lf
            sum_l, sum_l2, sum_xl = seq_sum(wl), seq_sum(wl * lf), seq_sum(wl * x)
            D = sum_w * sum_l2 - sum_l * sum_l
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
            pos = this_min > 0
            this_min = np.where(pos, float32(0), this_min)
            this_scale = np.where(pos, sum_xl / sum_l2, this_scale)
            cur = err(this_scale, this_min, lf)
            better = (D > 0) & (cur < best)
            L = np.where(better[:, None], Laux, L)
            best = np.where(better, cur, best)
            scale = np.where(better, this_scale, scale)
            mn = np.where(better, this_min, mn)
    L = np.where(flat[:, None], 0, L)
    scale = np.where(flat, float32(0), scale)
    return scale.astype(float32), (-mn).astype(float32), L.astype(np.uint8)


def make_qx_quants(x, nmax):
    """Symmetric scale for codes -nmax..nmax-1 (rmse_type 1, no importance weights): weights x^2,
    least-squares scale, then 18 more trial scales -(nmax + 0.1 k)/max. Returns (scale, L = l + nmax)."""
    x = np.asarray(x, float32)
    amax, mx = first_absmax(x)
    zero = amax < GROUP_MAX_EPS
    w = x * x
    wx = w * x
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):

        def trial(iscale):
            l = np.clip(nearest_int(iscale[:, None] * x), -nmax, nmax - 1)
            lf = l.astype(float32)
            return l, seq_sum(wx * lf), seq_sum(w * lf * lf)

        iscale = (float32(-nmax) / mx).astype(float32)
        L, sumlx, suml2 = trial(iscale)
        scale = np.where(suml2 != 0, sumlx / suml2, float32(0)).astype(float32)
        best = scale * sumlx
        for k in range(-9, 10):
            if k == 0:
                continue
            iscale = (-(float32(nmax) + float32(0.1) * float32(k)) / mx).astype(float32)
            l, sumlx, suml2 = trial(iscale)
            better = (suml2 > 0) & (sumlx * sumlx > best * suml2)
            L = np.where(better[:, None], l, L)
            scale = np.where(better, sumlx / suml2, scale).astype(float32)
            best = np.where(better, scale * sumlx, best).astype(float32)
    L = np.where(zero[:, None], 0, L + nmax)
    return np.where(zero, float32(0), scale).astype(float32), L.astype(np.int8)


def make_q3_quants(x, nmax):
    """Symmetric codes -nmax..nmax-1 with weights x^2, improved by up to 5 passes of coordinate
    descent (move one code at a time when it raises sumlx^2 / suml2). Returns (scale, L + nmax)."""
    x = np.asarray(x, float32)
    m, n = x.shape
    amax, mx = first_absmax(x)
    zero = amax < GROUP_MAX_EPS
    w = x * x
    wx = w * x
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = (float32(-nmax) / mx).astype(float32)
        L = np.clip(nearest_int(iscale[:, None] * x), -nmax, nmax - 1)
        Lf = L.astype(float32)
        sumlx, suml2 = seq_sum(wx * Lf), seq_sum(w * Lf * Lf)
        for _ in range(5):          # a pass that changes nothing leaves the state as it is
            for i in range(n):
                xi, wi, wxi, li = x[:, i], w[:, i], wx[:, i], L[:, i].astype(float32)
                slx = sumlx - wxi * li
                sl2 = suml2 - wi * li * li
                new_l = np.clip(nearest_int(xi * sl2 / slx), -nmax, nmax - 1)
                nl = new_l.astype(float32)
                slx2 = slx + wxi * nl
                sl22 = sl2 + wi * nl * nl
                take = (slx > 0) & (new_l != L[:, i]) & (sl22 > 0) & (slx2 * slx2 * suml2 > sumlx * sumlx * sl22)
                L[:, i] = np.where(take, new_l, L[:, i])
                sumlx = np.where(take, slx2, sumlx)
                suml2 = np.where(take, sl22, suml2)
        scale = np.where(suml2 > 0, sumlx / suml2, float32(0)).astype(float32)
    L = np.where(zero[:, None], 0, L + nmax)
    return np.where(zero, float32(0), scale).astype(float32), L.astype(np.int8)


# ---------------------------------------------------------------- quantize_row_q*_K_ref

def _requantize(x, d, offset, lo, hi, L):
    """Final codes with the stored (f16-rounded) scales: l = nearest_int((x + offset) / d),
    kept from the search where d == 0 (ggml's ``if (!d) continue``)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        l = np.clip(nearest_int((x + offset[..., None]) / d[..., None]), lo, hi)
    return np.where((d != 0)[..., None], l, L)


def quantize_q2_k(x):
    n = x.shape[0]
    xs = x.reshape(n * 16, 16)
    scales, mins, L = make_qkx2_quants(xs, np.abs(xs), 3, -0.5, 0.1, 15, True)
    scales, mins, L = scales.reshape(n, 16), mins.reshape(n, 16), L.reshape(n, 16, 16).astype(np.int32)
    max_scale = np.maximum(scales.max(-1), float32(0))
    max_min = np.maximum(mins.max(-1), float32(0))
    with np.errstate(divide="ignore", invalid="ignore"):
        ls = np.where((max_scale > 0)[:, None], nearest_int((float32(15) / max_scale)[:, None] * scales), 0) & 0xFF
        lm = np.where((max_min > 0)[:, None], nearest_int((float32(15) / max_min)[:, None] * mins), 0)
    sc = (ls | (lm << 4)) & 0xFF
    out = np.zeros(n, BLOCK_Q2_K)
    out["scales"] = sc
    out["d"] = fp16(np.where(max_scale > 0, max_scale / float32(15), float32(0)))
    out["dmin"] = fp16(np.where(max_min > 0, max_min / float32(15), float32(0)))
    d = out["d"].astype(float32)[:, None] * (sc & 0x0F).astype(float32)
    dm = out["dmin"].astype(float32)[:, None] * (sc >> 4).astype(float32)
    L = _requantize(x.reshape(n, 16, 16), d, dm, 0, 3, L)
    out["qs"] = pack_crumbs(L.reshape(n, QK_K))
    return out


def _sixteen_sub_blocks(x, make_quants, nmax: int):
    """q3_K's and q6_K's first step: each super-block's 16 sub-blocks of 16 values get a scale and codes
    (``make_quants(rows, nmax)``); then the signed scale of largest magnitude (first_absmax), from which
    the scales are quantized. Returns (n, scales (n, 16), codes (n, 16, 16) int32, max_abs, max_scale)."""
    n = x.shape[0]
    scales, L = make_quants(x.reshape(n * 16, 16), nmax)
    scales, L = scales.reshape(n, 16), L.reshape(n, 16, 16).astype(np.int32)
    return (n, scales, L, *first_absmax(scales))


def quantize_q3_k(x):
    n, scales, L, _, max_scale = _sixteen_sub_blocks(x, make_q3_quants, 4)
    nz = max_scale != 0
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = (float32(-32) / max_scale).astype(float32)
        l = (np.clip(nearest_int(iscale[:, None] * scales).astype(np.int8), -32, 31) + 32).astype(np.uint8)
        d16 = fp16(np.where(nz, float32(1) / iscale, float32(0)))
    out = np.zeros(n, BLOCK_Q3_K)
    out["scales"] = np.where(nz[:, None], pack_q3_scales(l), 0)
    out["d"] = d16
    d = d16.astype(float32)[:, None] * q3_scales(out["scales"]).astype(float32)
    L = _requantize(x.reshape(n, 16, 16), d, np.zeros_like(d), -4, 3, L - 4) + 4
    L = L.reshape(n, QK_K)
    high = L > 3
    # bit j // 32 of hmask byte j % 32 holds value j's high bit
    out["hmask"] = np.packbits(high.reshape(n, 8, 32).transpose(0, 2, 1), axis=-1, bitorder="little").reshape(n, 32)
    out["qs"] = pack_crumbs(np.where(high, L - 4, L))
    return out


def _k4_scales(x, nmax, rmin, rdelta, nstep):
    """Shared by q4_k and q5_k: sub-block (scale, min) search, 6-bit packing, final codes."""
    n = x.shape[0]
    xs = x.reshape(n * 8, 32)
    av_x = np.sqrt(seq_sum(xs * xs) / float32(32)).astype(float32)
    w = av_x[:, None] + np.abs(xs)
    scales, mins, L = make_qkx2_quants(xs, w, nmax, rmin, rdelta, nstep, False)
    scales, mins, L = scales.reshape(n, 8), mins.reshape(n, 8), L.reshape(n, 8, 32).astype(np.int32)
    max_scale = np.maximum(scales.max(-1), float32(0))
    max_min = np.maximum(mins.max(-1), float32(0))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):   # C divides by subnormals too
        inv_scale = np.where(max_scale > 0, float32(63) / max_scale, float32(0)).astype(float32)
        inv_min = np.where(max_min > 0, float32(63) / max_min, float32(0)).astype(float32)
        ls = np.minimum(nearest_int(inv_scale[:, None] * scales) & 0xFF, 63)
        lm = np.minimum(nearest_int(inv_min[:, None] * mins) & 0xFF, 63)
    packed = pack_scale_min_k4(ls, lm)
    d16, dmin16 = fp16(max_scale / float32(63)), fp16(max_min / float32(63))
    sc, m = scale_min_k4(packed)
    d = d16.astype(float32)[:, None] * sc.astype(float32)
    dm = dmin16.astype(float32)[:, None] * m.astype(float32)
    L = _requantize(x.reshape(n, 8, 32), d, dm, 0, nmax, L)
    return d16, dmin16, packed, L.reshape(n, 4, 2, 32)


def quantize_q4_k(x):
    d, dmin, scales, L = _k4_scales(x, 15, -1.0, 0.1, 20)
    out = np.zeros(x.shape[0], BLOCK_Q4_K)
    out["d"], out["dmin"], out["scales"] = d, dmin, scales
    out["qs"] = (L[:, :, 0] | (L[:, :, 1] << 4)).reshape(-1, 128)
    return out


def quantize_q5_k(x):
    n = x.shape[0]
    d, dmin, scales, L = _k4_scales(x, 31, -0.5, 0.1, 15)
    out = np.zeros(n, BLOCK_Q5_K)
    out["d"], out["dmin"], out["scales"] = d, dmin, scales
    out["qs"] = ((L[:, :, 0] & 15) | ((L[:, :, 1] & 15) << 4)).reshape(n, 128)
    high = (L.reshape(n, 8, 32) >> 4).astype(np.uint8)          # bit k of qh[j]: sub-block k, value j
    out["qh"] = np.packbits(high.transpose(0, 2, 1), axis=-1, bitorder="little").reshape(n, 32)
    return out


def quantize_q6_k(x):
    n, scales, L, max_abs, max_scale = _sixteen_sub_blocks(x, make_qx_quants, 32)
    zero = max_abs < GROUP_MAX_EPS
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = (float32(-128) / max_scale).astype(float32)
        sc = np.minimum(nearest_int(iscale[:, None] * scales), 127).astype(np.int8)
        d16 = fp16(float32(1) / iscale)
    d = d16.astype(float32)[:, None] * sc.astype(float32)
    L = _requantize(x.reshape(n, 16, 16), d, np.zeros_like(d), -32, 31, L - 32) + 32
    L = L.reshape(n, 2, 4, 32).astype(np.uint8)
    out = np.zeros(n, BLOCK_Q6_K)
    # per half: ql bytes 0-31 hold quarters 0 | 2 << 4, bytes 32-63 quarters 1 | 3 << 4
    out["ql"] = np.stack([(L[:, :, 0] & 15) | ((L[:, :, 2] & 15) << 4),
                          (L[:, :, 1] & 15) | ((L[:, :, 3] & 15) << 4)], axis=2).reshape(n, 128)
    out["qh"] = ((L[:, :, 0] >> 4) | ((L[:, :, 1] >> 4) << 2) | ((L[:, :, 2] >> 4) << 4) | ((L[:, :, 3] >> 4) << 6)).reshape(n, 64)
    out["scales"] = sc
    out["d"] = d16
    out[zero] = np.zeros(1, BLOCK_Q6_K)
    return out


def quantize_q8_k(x, fused: bool = False):
    """The K-quants' activation type: iscale = -127 / max (signed max), q = min(127, nearest_int(iscale x)),
    d = 1 / iscale kept in f32, and the sums of each 16 codes (bsums) for the minimum terms.
    ``fused``: the build contracted ``iscale*x + 0x1.8p23`` (nearest_int's trick) into one fma, as
    GCC does on AArch64, so the exact product is rounded to the nearest integer (ties to even)."""
    n = x.shape[0]
    amax, mx = first_absmax(x)
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = (float32(-127) / mx).astype(float32)
        if fused:
            q = np.minimum(np.rint(iscale[:, None].astype(np.float64) * x), 127)
        else:
            q = np.minimum(nearest_int(iscale[:, None] * x), 127)
        d = float32(1) / iscale
    zero = amax == 0
    q = np.where(zero[:, None], 0, q).astype(np.int8)
    out = np.zeros(n, BLOCK_Q8_K)
    out["d"] = np.where(zero, float32(0), d)
    out["qs"] = q
    out["bsums"] = q.reshape(n, 16, 16).astype(np.int32).sum(-1)
    return out


register("q2_k", BLOCK_Q2_K, dequantize_q2_k, quantize_q2_k)
register("q3_k", BLOCK_Q3_K, dequantize_q3_k, quantize_q3_k)
register("q4_k", BLOCK_Q4_K, dequantize_q4_k, quantize_q4_k)
register("q5_k", BLOCK_Q5_K, dequantize_q5_k, quantize_q5_k)
register("q6_k", BLOCK_Q6_K, dequantize_q6_k, quantize_q6_k)
register("q8_k", BLOCK_Q8_K, dequantize_q8_k, quantize_q8_k)
