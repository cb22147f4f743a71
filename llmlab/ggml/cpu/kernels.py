"""ggml-cpu's float accumulation order on x86 (AVX2 / AVX-512), reproduced so results are bit-exact.

Integer block sums are exact anywhere; what decides the last bits is the order in
which ggml adds the float terms:

- quantized dot products with 32-element blocks (``ggml_vec_dot_q4_0_q8_0``, ``q4_1_q8_1``,
  ``q5_0_q8_0``, ``q8_0_q8_0``, and llamafile's ``tinyBLAS_Q0_AVX`` which gives the same
  sums): a 256-bit register holds 8 lanes; lane j sums the products of elements
  4j..4j+3 of a block as an integer, then ``acc_j = fma(d_w * d_x, lane_j, acc_j)``
  block after block; at the end the 8 lanes are added pairwise (``hsum_float_8``:
  (0+4)+(2+6), (1+5)+(3+7), then those two). q4_1 adds ``sum_b m_w * s_x`` separately.
- f16 x f16 (the KV cache, through llamafile's ``tinyBLAS`` on AVX-512): 16 lanes,
  lane i accumulates elements i, i+16, ... with fma, then ``_mm512_reduce_add_ps``; a single
  activation row (a decode step) is declined by tinyBLAS and runs ``ggml_vec_dot_f16`` instead.
- K-quants x q8_K: below 8 activation rows the AVX2 ``vec_dot`` lanes (or, for weights in the
  REPACK buffer, its gemv/gemm); from 8 rows on, plain K-quant weights go through ggml-cpu's
  tiled kernels, which take one float step per 256-value super-block.

Which kernel runs depends on the shape, so every one of them must be reproduced: a forward pass
meets all of them (Gemma 3's q6_K ``ffn_down`` takes vec_dot for a decode step and the tiled
kernel for a prompt of 8 tokens or more).

Fused multiply-adds are emulated in float64 and rounded once to float32 (the product
of two float32 values is exact in float64), which matches the hardware except for
vanishingly rare double-rounding ties.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

F32, F64 = np.float32, np.float64
ROW_CHUNK = 4096


def hsum_float_8(acc: np.ndarray) -> np.ndarray:
    r = (acc[..., 4:8] + acc[..., 0:4]).astype(F32)                  # _mm256_extractf128 + add
    lo = (r[..., 0] + r[..., 2]).astype(F32)                           # movehl + add
    hi = (r[..., 1] + r[..., 3]).astype(F32)
    return (lo + hi).astype(F32)                                       # movehdup + add_ss


def reduce_add_512(acc: np.ndarray) -> np.ndarray:
    t3 = (acc[..., 8:16] + acc[..., 0:8]).astype(F32)
    t6 = (t3[..., 4:8] + t3[..., 0:4]).astype(F32)
    t8a = (t6[..., 0] + t6[..., 2]).astype(F32)
    t8b = (t6[..., 1] + t6[..., 3]).astype(F32)
    return (t8a + t8b).astype(F32)


def _codes(w, tname: str) -> np.ndarray:
    """Signed integer codes (R, nb, 32) of 32-element weight blocks, as the kernels unpack them."""
    from ..quant.core import nibbles
    if tname == "q8_0":
        return w["qs"].astype(F32)
    nib = nibbles(w["qs"]).astype(np.int16)                          # low nibbles: 0..15, high: 16..31
    if tname == "q4_0":
        return (nib - 8).astype(F32)
    if tname == "q4_1":
        return nib.astype(F32)
    if tname == "q5_0":
        qh = w["qh"].view(np.uint32) if w["qh"].dtype != np.uint32 else w["qh"]
        qh = np.ascontiguousarray(w["qh"]).view("<u4").reshape(w.shape)
        bits = (qh[..., None] >> np.arange(32, dtype=np.uint32)) & 1
        return ((nib | (bits.astype(np.int16) << 4)) - 16).astype(F32)
    raise KeyError(tname)


PARTNER = {"q4_0": "q8_0", "q4_1": "q8_1", "q5_0": "q8_0", "q8_0": "q8_0"}


def mul_mat_q32(raw: np.ndarray, qtype, x: np.ndarray) -> np.ndarray:
    """x (T, K) times quantized rows raw (R, row_bytes) -> (T, R), summed in ggml-cpu's order."""
    from .quants import quantize_activations
    from ..quant.core import blocks_of
    t = qtype
    x = np.asarray(x, F32).reshape(-1, x.shape[-1])
    nb = x.shape[1] // 32
    w = blocks_of(raw, t).reshape(-1, nb)
    a = quantize_activations(x, PARTNER[t.name])                      # (T, nb)
    T, R = a.shape[0], w.shape[0]
    qa = a["qs"].astype(F32).reshape(T, nb, 8, 4).transpose(1, 2, 0, 3)   # (nb, 8, T, 4)
    da = a["d"].astype(F32)
    out = np.empty((T, R), F32)
    for r0 in range(0, R, ROW_CHUNK):
        ws = w[r0:r0 + ROW_CHUNK]
        n = len(ws)
        qw = _codes(ws, t.name).reshape(n, nb, 8, 4).transpose(1, 2, 3, 0)  # (nb, 8, 4, n)
        dw = ws["d"].astype(F32)
        acc = np.zeros((8, T, n), F64)
        for b in range(nb):
            xy = np.matmul(qa[b], qw[b])                               # (8, T, n): exact integer lane sums
            d = (da[:, b, None] * dw[None, :, b]).astype(F32)          # d_x * d_w in float
            acc = (d.astype(F64)[None] * xy + acc).astype(F32).astype(F64)   # fma, rounded to float
        res = hsum_float_8(acc.astype(F32).transpose(1, 2, 0))
        if t.name == "q4_1":                                           # summs += m_w * s_x (scalar, fma)
            summs = np.zeros((T, n), F64)
            mw, sa = ws["m"].astype(F64), a["s"].astype(F64)
            for b in range(nb):
                summs = (mw[None, :, b] * sa[:, b, None] + summs).astype(F32).astype(F64)
            res = (res + summs.astype(F32)).astype(F32)
        out[:, r0:r0 + n] = res
    return out


def mul_mat_f16(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """tinyBLAS on AVX-512: A (R, K) f16 weights, B (T, K) activations already rounded to f16 -> (T, R)."""
    R, K = A.shape
    T = B.shape[0]
    if K % 16:
        return (B.astype(F64) @ A.astype(F64).T).astype(F32)
    A = A.astype(F64)
    B = B.astype(F64)
    acc = np.zeros((T, R, 16), F64)
    for s in range(0, K, 16):
        acc = (B[:, None, s:s + 16] * A[None, :, s:s + 16] + acc).astype(F32).astype(F64)
    return reduce_add_512(acc.astype(F32))


def mul_mat_f16_op(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """ggml-cpu's MUL_MAT for an f16 weight A (R, K), activations B (T, K) already rounded to f16.
    llamafile_sgemm (tinyBLAS) takes it from 2 activation rows on ("only enable sgemm for prompt
    processing": n < 2 returns false), when K is a multiple of its 16 lanes and R of 4 (its tiles);
    otherwise (a decode step's KQ and KQV: one row) each output is a ggml_vec_dot_f16."""
    if len(B) >= 2 and A.shape[1] % 16 == 0 and A.shape[0] % 4 == 0:
        return mul_mat_f16(A, B)
    return vec_dot_f16(B[:, None, :], A[None, :, :])


EXACT_MUL_MAT: dict[str, Callable] = {name: mul_mat_q32 for name in PARTNER}


# ---- exp, as ggml_v_expf (AVX-512: ARM's optimized-routines polynomial) ---------------------

def _fma(a, b, c):
    return (np.asarray(a, F64) * np.asarray(b, F64) + np.asarray(c, F64)).astype(F32)


_C = {k: F32(float.fromhex(v)) for k, v in dict(
    log2e="0x1.715476p+0", r="0x1.8p23", ln2_hi="0x1.62e4p-1", ln2_lo="0x1.7f7d1cp-20",
    c0="0x1.0e4020p-7", c1="0x1.573e2ep-5", c2="0x1.555e66p-3", c3="0x1.fffdb6p-2", c4="0x1.ffffecp-1").items()}


def v_expf(x: np.ndarray) -> np.ndarray:
    """ggml_v_expf: exp in float32 with ggml's polynomial and its rounding at every step."""
    x = np.asarray(x, F32)
    with np.errstate(invalid="ignore", over="ignore"):
        z = _fma(x, _C["log2e"], _C["r"])
        n = (z - _C["r"]).astype(F32)
        b = _fma(-n, _C["ln2_lo"], _fma(-n, _C["ln2_hi"], x))
        u = (b * b).astype(F32)
        j = _fma(_fma(_fma(_C["c0"], b, _C["c1"]), u, _fma(_C["c2"], b, _C["c3"])), u, _fma(_C["c4"], b, F32(1.0)))
        res = np.ldexp(j.astype(F64), np.nan_to_num(n, nan=0, posinf=0, neginf=0).astype(np.int64)).astype(F32)
        big = np.abs(n) > 192
        if big.any():
            res = np.where(big, np.where(n > 0, F32(np.inf), F32(0)), res)
    return res


def v_silu(x: np.ndarray) -> np.ndarray:
    """ggml_v_silu: x / (1 + exp(-x)) with ggml_v_expf."""
    x = np.asarray(x, F32)
    return (x / (F32(1.0) + v_expf((F32(0) - x).astype(F32))).astype(F32)).astype(F32)


def soft_max_rows(w: np.ndarray) -> np.ndarray:
    """ggml_vec_soft_max_f32 + scaling: exp(w - max) per row, the sum of each 16-lane block
    (_mm512_reduce_add_ps) accumulated in double, then times (float)(1/sum)."""
    mx = w.max(-1, keepdims=True)
    e = v_expf((w - mx).astype(F32))
    n = e.shape[-1]
    if n % 16 == 0:
        parts = reduce_add_512(e.reshape(e.shape[:-1] + (n // 16, 16))).astype(F64)
        s = np.zeros(e.shape[:-1], F64)
        for k in range(parts.shape[-1]):
            s = s + parts[..., k]
    else:
        s = e.astype(F64).sum(-1)
    return (e * (1.0 / s).astype(F32)[..., None]).astype(F32)


# ---- RoPE: the cos/sin cache from the C library's powf/cosf/sinf, the rotation with one fma ------

_LIBM = None
_ROPE_ROWS: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}


def _libm():
    global _LIBM
    if _LIBM is None:
        import ctypes
        import ctypes.util
        try:
            lib = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
            for f in ("cosf", "sinf", "tanhf"):
                getattr(lib, f).restype, getattr(lib, f).argtypes = ctypes.c_float, [ctypes.c_float]
            lib.powf.restype, lib.powf.argtypes = ctypes.c_float, [ctypes.c_float, ctypes.c_float]
            _LIBM = lib
        except OSError:
            _LIBM = False
    return _LIBM


def rope_cache(pos: np.ndarray, n_dims: int, freq_base: float, freq_scale: float = 1.0,
               attn_factor: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin per (position, pair) as ggml_rope_cache_init: theta starts at the position and is
    multiplied by theta_scale = powf(base, -2/n_dims) in float; cosf/sinf from the C library
    (they are not always correctly rounded, so numpy's cos would differ in the last bit)."""
    lib = _libm()
    base, fs, af = F32(freq_base), F32(freq_scale), F32(attn_factor)
    ex = F32(-2.0) / F32(n_dims)
    ts = F32(lib.powf(float(base), float(ex))) if lib else F32(np.power(base, ex, dtype=F32))
    cos = np.empty((len(pos), n_dims // 2), F32)
    sin = np.empty((len(pos), n_dims // 2), F32)
    for i, p in enumerate(np.asarray(pos).tolist()):
        key = (float(base), n_dims, float(fs), float(af), p)
        row = _ROPE_ROWS.get(key)
        if row is None:
            th = F32(p)
            c = np.empty(n_dims // 2, F32)
            s = np.empty(n_dims // 2, F32)
            for k in range(n_dims // 2):
                t = F32(fs * th)
                if lib:
                    c[k], s[k] = lib.cosf(float(t)), lib.sinf(float(t))
                else:
                    c[k], s[k] = np.cos(F64(t)), np.sin(F64(t))
                th = F32(th * ts)
            row = ((c * af).astype(F32), (s * af).astype(F32))
            _ROPE_ROWS[key] = row
        cos[i], sin[i] = row
    return cos, sin


def rotate(x0: np.ndarray, x1: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """rotate_pairs as compiled (the first product fused): x0*cos - x1*sin, x0*sin + x1*cos."""
    y0 = (x0.astype(F64) * cos - (x1 * sin).astype(F32)).astype(F32)
    y1 = (x0.astype(F64) * sin + (x1 * cos).astype(F32)).astype(F32)
    return y0, y1


# ---- K-quants x q8_K (ggml_vec_dot_q4_K_q8_K / q6_K_q8_K, AVX2) -----------------------------
#
# Per super-block of 256: integer lane sums ``sumi[u]`` (u = 0..7 collects the elements whose
# position inside their 32-element chunk is 4u..4u+3, each times its sub-block scale), then
# ``acc[u] = fma(d, sumi[u], acc[u])``; q4_K also keeps 4 lanes of ``dmin * mins . bsums``.

def _k_lane_sums(W: np.ndarray, qa: np.ndarray) -> np.ndarray:
    """W (R, nb, 256) scaled integer codes, qa (T, nb, 256) -> (nb, 8, T, R) exact lane sums."""
    R, nb = W.shape[:2]
    T = qa.shape[0]
    Wl = W.reshape(R, nb, 8, 8, 4).transpose(1, 3, 2, 4, 0).reshape(nb, 8, 32, R)      # (nb, lane, chunk*4, R)
    Al = qa.reshape(T, nb, 8, 8, 4).transpose(1, 3, 0, 2, 4).reshape(nb, 8, T, 32)
    return np.matmul(Al.astype(F64), Wl.astype(F64))


def _k_operands(raw: np.ndarray, qtype, x: np.ndarray):
    """The weight super-blocks (R, nb) and the activations quantized to q8_K (T, nb), as both K-quant
    kernels (vec_dot and tiled) start."""
    from .quants import quantize_activations
    from ..quant.core import blocks_of
    x = np.asarray(x, F32).reshape(-1, x.shape[-1])
    nb = x.shape[1] // 256
    return blocks_of(raw, qtype).reshape(-1, nb), quantize_activations(x, "q8_K"), nb


def mul_mat_k(raw: np.ndarray, qtype, x: np.ndarray) -> np.ndarray:
    from ..quant import k_quants as K
    w, a, nb = _k_operands(raw, qtype, x)
    T, R = a.shape[0], w.shape[0]
    qa = a["qs"].astype(np.int32)
    ya = a["d"].astype(F32)                                           # (T, nb)
    out = np.empty((T, R), F32)
    for r0 in range(0, R, ROW_CHUNK):
        ws = w[r0:r0 + ROW_CHUNK]
        n = len(ws)
        flat = ws.reshape(-1)
        if qtype.name == "q4_k":
            sc, mn = K.scale_min_k4(flat["scales"])                  # (n*nb, 8) each
            codes = K.q4k_codes(flat["qs"]).astype(np.int32).reshape(n * nb, 8, 32)
            W = (codes * sc[:, :, None].astype(np.int32)).reshape(n, nb, 256)
        elif qtype.name == "q6_k":
            # unsigned codes (0..63) times their scale; the -32 comes back through the q8_K block sums,
            # lane k taking sub-blocks 2k and 2k+1 (as this build's kernel adds it, found by probing)
            codes = (K.q6k_codes(flat).astype(np.int32) + 32).reshape(n * nb, 16, 16)
            W = (codes * flat["scales"].astype(np.int32)[:, :, None]).reshape(n, nb, 256)
        else:
            raise KeyError(qtype.name)
        lanes = _k_lane_sums(W, qa)                                   # (nb, 8, T, n)
        if qtype.name == "q6_k":
            scl = flat["scales"].astype(np.int64).reshape(n, nb, 8, 2)
            bsm = a["bsums"].astype(np.int64).reshape(T, nb, 8, 2)
            lanes = lanes - 32 * np.einsum("rbkj,tbkj->bktr", scl, bsm).astype(F64)
        dw = ws["d"].astype(F32)                                      # (n, nb)
        acc = np.zeros((8, T, n), F64)
        for b in range(nb):
            d = (ya[:, b, None] * dw[None, :, b]).astype(F32)
            acc = (d.astype(F64)[None] * lanes[b] + acc).astype(F32).astype(F64)
        res = hsum_float_8(acc.astype(F32).transpose(1, 2, 0))
        if qtype.name == "q4_k":
            bs = a["bsums"].astype(np.int64).reshape(T, nb, 8, 2).sum(-1)        # q8s: sums over 32 values
            mins = mn.astype(np.int64).reshape(n, nb, 8)
            prod = np.einsum("rbmk,tbmk->btrm", mins.reshape(n, nb, 4, 2), bs.reshape(T, nb, 4, 2)).astype(F64)
            dmin = ws["dmin"].astype(F32)
            accm = np.zeros((T, n, 4), F64)
            for b in range(nb):
                dm = (-ya[:, b, None] * dmin[None, :, b]).astype(F32)
                accm = (dm.astype(F64)[..., None] * prod[b] + accm).astype(F32).astype(F64)
            accm = accm.astype(F32)
            lo = (accm[..., 0] + accm[..., 2]).astype(F32)
            hi = (accm[..., 1] + accm[..., 3]).astype(F32)
            res = (res + (lo + hi).astype(F32)).astype(F32)
        out[:, r0:r0 + n] = res
    return out


EXACT_MUL_MAT.update({"q4_k": mul_mat_k, "q6_k": mul_mat_k})


# ---- q4_K in ggml-cpu's REPACK buffer (block_q4_Kx8, ggml_gemv/gemm_q4_K_8x8_q8_K on AVX2) --------
#
# llama.cpp's default CPU build moves q4_K weights whose row count is a multiple of 8 into the
# CPU_REPACK buffer type; their products then run in the interleaved kernels, which keep one whole
# super-block's integer dot per output in a single lane: acc = fma(isum, d_w*d_x, acc) and
# acc_min = fma(imins, dmin_w*d_x, acc_min) block after block, result acc - acc_min.

def mul_mat_q4_k_repacked(raw: np.ndarray, qtype, x: np.ndarray) -> np.ndarray:
    """Activation rows in groups of 4 go through the gemm kernel, which adds the integer sums of each
    pair of sub-blocks (64 values) into the float accumulators separately; the rows left over go
    through the gemv kernel, which adds a whole super-block at once."""
    from .quants import quantize_activations
    from ..quant import k_quants as K
    from ..quant.core import blocks_of
    x = np.asarray(x, F32).reshape(-1, x.shape[-1])
    nb = x.shape[1] // 256
    w = blocks_of(raw, qtype).reshape(-1, nb)
    a = quantize_activations(x, "q8_K")
    T, R = a.shape[0], w.shape[0]
    n_gemm = T - T % 4
    qa = a["qs"].astype(F64).reshape(T, nb, 4, 64)
    ya = a["d"].astype(F32)
    bs = a["bsums"].astype(F64).reshape(T, nb, 4, 4)                  # four 16-sums per 64 values
    out = np.empty((T, R), F32)
    for r0 in range(0, R, ROW_CHUNK):
        ws = w[r0:r0 + ROW_CHUNK]
        n = len(ws)
        flat = ws.reshape(-1)
        sc, mn = K.scale_min_k4(flat["scales"])
        W = (K.q4k_codes(flat["qs"]).astype(np.int32).reshape(n * nb, 8, 32) * sc[:, :, None].astype(np.int32))
        W = W.reshape(n, nb, 4, 64).astype(F64)
        mins = np.repeat(mn.astype(F64).reshape(n, nb, 4, 2), 2, axis=-1)  # min of each 32 over its two 16-sums
        dw, dmin = ws["d"].astype(F32), ws["dmin"].astype(F32)
        acc = np.zeros((T, n), F64)
        accm = np.zeros((T, n), F64)
        for b in range(nb):
            isub = np.einsum("tsk,rsk->trs", qa[:, b], W[:, b])              # (T, n, 4) exact
            imsub = np.einsum("tsk,rsk->trs", bs[:, b], mins[:, b])
            d = (dw[None, :, b] * ya[:, b, None]).astype(F32).astype(F64)
            dm = (dmin[None, :, b] * ya[:, b, None]).astype(F32).astype(F64)
            g = slice(0, n_gemm)
            for sb in range(4):                                              # gemm: one fma per 64 values
                acc[g] = (isub[g, :, sb] * d[g] + acc[g]).astype(F32)
                accm[g] = (imsub[g, :, sb] * dm[g] + accm[g]).astype(F32)
            v = slice(n_gemm, T)                                             # gemv: one fma per super-block
            acc[v] = (isub[v].sum(-1) * d[v] + acc[v]).astype(F32)
            accm[v] = (imsub[v].sum(-1) * dm[v] + accm[v]).astype(F32)
        out[:, r0:r0 + n] = (acc.astype(F32) - accm.astype(F32)).astype(F32)
    return out


# weight types the default CPU build repacks on x86 (when the row count is a multiple of 8: q2_K only
# with AVX-512), and how they then compute where llmlab reproduces the kernel
REPACK_TYPES = frozenset({"q4_0", "q4_k", "q2_k", "iq4_nl", "mxfp4"})
REPACKED_MUL_MAT: dict[str, Callable] = {"q4_k": mul_mat_q4_k_repacked}


# ---- K-quants through ggml-cpu's tiled matmul (tiled/tiled.cpp) ----------------------------------
#
# ggml_compute_forward_mul_mat first offers the product to the tiled kernels: a K-quant weight that
# is not in the REPACK buffer, times at least 8 activation rows (ne11 >= 8), runs there, in 256x256
# windows of 16x16 micro-tiles. Per super-block the whole integer dot is exact in int32
# (s1 = sum_s scale_s * dot_s, with q6_K's -32 and q3_K's -4 taken out through the bsums, and
# s2 = sum_s min_s * bsum_s), and each output takes ONE float step per super-block:
#     res = d_w * (float) s1            [res = fma(-dmin_w, (float) s2, res) for q2_K/q4_K/q5_K]
#     acc = fma(res, d_x, acc)          (AVX-512 VNNI and AVX2 builds alike)
# super-block after super-block, K in order (windows and thread chunks never split K).

TILED_MIN_ROWS = 8                      # ggml_tiled_min_batch: profitable from 8 activation rows


def _tiled_terms(ws: np.ndarray, tname: str):
    """Per-row super-block terms of the tiled kernel: W (n, nb, 256) signed codes times their
    sub-block scale, mins (n, nb, n_sub) or None, sub-block size, d_w and dmin_w (n, nb)."""
    from ..quant import k_quants as K
    n, nb = ws.shape
    flat = ws.reshape(-1)
    mins, dmin = None, None
    if tname in ("q4_k", "q5_k"):
        sc, mins = K.scale_min_k4(flat["scales"])                       # (n*nb, 8) each
        codes = K.q4k_codes(flat["qs"]) if tname == "q4_k" else K.q5k_codes(flat)
        W = codes.astype(np.int32).reshape(-1, 8, 32) * sc.astype(np.int32)[:, :, None]
        sub = 32
    elif tname == "q6_k":
        W = K.q6k_codes(flat).astype(np.int32).reshape(-1, 16, 16) * flat["scales"].astype(np.int32)[:, :, None]
        sub = 16
    elif tname == "q3_k":
        W = K.q3_codes(flat).astype(np.int32).reshape(-1, 16, 16) * K.q3_scales(flat["scales"]).astype(np.int32)[:, :, None]
        sub = 16
    elif tname == "q2_k":
        sc = flat["scales"].astype(np.int32)
        W = K.crumbs(flat["qs"]).astype(np.int32).reshape(-1, 16, 16) * (sc & 0x0F)[:, :, None]
        mins, sub = sc >> 4, 16
    else:
        raise KeyError(tname)
    if mins is not None:
        mins = mins.astype(np.int64).reshape(n, nb, -1)
        dmin = ws["dmin"].astype(F32)
    return W.reshape(n, nb, 256), mins, sub, ws["d"].astype(F32), dmin


def mul_mat_k_tiled(raw: np.ndarray, qtype, x: np.ndarray) -> np.ndarray:
    """x (T, K) times K-quant rows raw (R, row_bytes) -> (T, R), as the tiled kernels sum it."""
    w, a, nb = _k_operands(raw, qtype, x)
    T, R = a.shape[0], w.shape[0]
    qa = a["qs"].astype(F64).transpose(1, 0, 2)                        # (nb, T, 256)
    ya = a["d"].astype(F32)                                            # (T, nb)
    bsums = a["bsums"].astype(np.int64)                                # (T, nb, 16): sums of 16 codes
    out = np.empty((T, R), F32)
    for r0 in range(0, R, ROW_CHUNK):
        W, mins, sub, dw, dmin = _tiled_terms(w[r0:r0 + ROW_CHUNK], qtype.name)
        n = len(dw)
        s1 = np.matmul(qa, W.astype(F64).transpose(1, 2, 0))          # (nb, T, n): exact integers
        if mins is not None:
            bs = bsums.reshape(T, nb, -1, sub // 16).sum(-1)            # sums over each sub-block
            s2 = np.einsum("tbs,rbs->btr", bs, mins)
        acc = np.zeros((T, n), F32)
        for b in range(nb):
            res = (dw[None, :, b] * s1[b].astype(F32)).astype(F32)
            if mins is not None:
                res = (-dmin[None, :, b].astype(F64) * s2[b].astype(F32) + res).astype(F32)
            acc = (res.astype(F64) * ya[:, b, None] + acc).astype(F32)
        out[:, r0:r0 + n] = acc
    return out


TILED_MUL_MAT: dict[str, Callable] = {t: mul_mat_k_tiled for t in ("q2_k", "q3_k", "q4_k", "q5_k", "q6_k")}


def vec_dot_f16(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """ggml_vec_dot_f16 on AVX-512 over the last axis (broadcasting): four 16-lane accumulators take
    consecutive 16-element pieces of each 64-element step (fma), then (0+2),(1+3), (0+1), a 16-lane
    reduction, added to a double; the tail (n % 64) is summed in double."""
    x = np.asarray(x, F32)
    y = np.asarray(y, F32)
    n = x.shape[-1]
    np_ = n - n % 64
    shape = np.broadcast_shapes(x.shape[:-1], y.shape[:-1])
    acc = np.zeros(shape + (4, 16), F64)
    for i in range(0, np_, 64):
        xs = x[..., i:i + 64].reshape(x.shape[:-1] + (4, 16)).astype(F64)
        ys = y[..., i:i + 64].reshape(y.shape[:-1] + (4, 16)).astype(F64)
        acc = (xs * ys + acc).astype(F32).astype(F64)
    a = acc.astype(F32)
    a0 = (a[..., 0, :] + a[..., 2, :]).astype(F32)
    a1 = (a[..., 1, :] + a[..., 3, :]).astype(F32)
    total = reduce_add_512((a0 + a1).astype(F32)).astype(F64)
    if np_ < n:
        total = total + (x[..., np_:].astype(F64) * y[..., np_:].astype(F64)).sum(-1)
    return total.astype(F32)
