"""What ggml-cpu adds on top of the type table: ``type_traits_cpu[]``.

For a matrix product ggml-cpu never dequantizes the weights. It quantizes each
activation row to the weight type's partner (``vec_dot_type``: q8_0, q8_1 or q8_K),
multiplies 8-bit integers block by block, and applies the float scales once per block:

    dot(w, x) = sum over blocks b of  d_w[b] * d_x[b] * sum_i q_w[b,i] * q_x[b,i]   (+ min terms)

This module is the NumPy reference of that path:

* :func:`quantize_activations` - the partner quantizers as the x86 AVX2 build runs them
  (q8_0/q8_1: ``id = 127/amax`` and round half to even; q8_K: ggml's reference);
* ``vec_dot_<w>_<a>`` per weight type - integer block sums (exact), then the block
  scales in float32 exactly as ggml forms them (``d_w * d_x``);
* :func:`mul_mat` - ``W @ x`` for all rows at once.

The activation codes and scales, every integer block sum and every per-block float scale
are exact. For every type in the table the float accumulation follows the
x86 AVX2 ``ggml_vec_dot_*`` kernels lane by lane (8 float lanes, each holding sums of 4
consecutive products, fused multiply-adds block after block, then ``hsum_float_8``), so
the result is the one those kernels return (and q2_k, q3_k, q6_k as the llama.cpp build
in llama-cpp-python 0.3.36 has them: the -32 of q6_k and the mins of q2_k enter the lanes
through the bsums). Note that llama.cpp may route a
matrix product through other kernels (llamafile's tinyBLAS, the repacked q4_0/q4_k/q8_0
layouts), which add the same exact block terms in yet another order.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..types import QK_K, ggml_type
from ..quant import k_quants as K
from ..quant import legacy as L
from ..quant.core import F32, QuantError, blocks_of, fp16, nibbles

# ---------------------------------------------------------------- activation quantizers (quantize_row_q8_*)


def quantize_row_q8_0_avx2(x: np.ndarray) -> np.ndarray:
    """ggml-cpu x86 quantize_row_q8_0: d = amax/127 (stored f16), q = round_half_even(x * 127/amax)."""
    x = np.asarray(x, F32).reshape(-1, 32)
    amax = np.abs(x).max(-1)
    with np.errstate(divide="ignore"):
        iscale = np.where(amax != 0, F32(127) / amax, F32(0)).astype(F32)
    out = np.zeros(len(x), L.BLOCK_Q8_0)
    out["d"], out["qs"] = fp16(amax / F32(127)), np.rint(x * iscale[:, None])
    return out


def quantize_row_q8_1_avx2(x: np.ndarray) -> np.ndarray:
    """As q8_0, plus s = f16(d * sum(q)) with the unrounded f32 d."""
    x = np.asarray(x, F32).reshape(-1, 32)
    amax = np.abs(x).max(-1)
    d = (amax / F32(127)).astype(F32)
    with np.errstate(divide="ignore"):
        iscale = np.where(amax != 0, F32(127) / amax, F32(0)).astype(F32)
    q = np.rint(x * iscale[:, None]).astype(np.int32)
    out = np.zeros(len(x), L.BLOCK_Q8_1)
    out["d"], out["qs"], out["s"] = fp16(d), q, fp16(d * q.sum(-1).astype(F32))
    return out


def quantize_row_q8_k(x: np.ndarray) -> np.ndarray:
    """x86 ggml-cpu uses ggml's reference for q8_K."""
    return K.quantize_q8_k(np.asarray(x, F32).reshape(-1, QK_K))


ACTIVATION_QUANTIZERS: dict[str, Callable] = {
    "q8_0": quantize_row_q8_0_avx2,
    "q8_1": quantize_row_q8_1_avx2,
    "q8_K": quantize_row_q8_k,
}


def quantize_activations(x: np.ndarray, partner: str) -> np.ndarray:
    """Quantize activation rows (T, n) to the partner type; returns structured blocks (T, n / block)."""
    key = "q8_K" if partner.lower() == "q8_k" else partner.lower()
    if key not in ACTIVATION_QUANTIZERS:
        raise QuantError(f"no activation quantizer for {partner!r} (known: {', '.join(ACTIVATION_QUANTIZERS)})")
    x = np.asarray(x, F32)
    x2 = x.reshape(-1, x.shape[-1])
    bs = 32 if key != "q8_K" else QK_K
    if x2.shape[-1] % bs:
        raise QuantError(f"{partner}: row length {x2.shape[-1]} is not a multiple of {bs}")
    return ACTIVATION_QUANTIZERS[key](x2).reshape(x2.shape[0], -1)


# ---------------------------------------------------------------- integer block dots

def block_dots(qw: np.ndarray, qa: np.ndarray) -> np.ndarray:
    """Integer dot products of matching groups: qw (R, G, k) and qa (T, G, k) small integers
    -> (T, R, G) float64, exact. (float32 products and sums are exact here: every partial
    sum is an integer below 2**24, whatever order BLAS adds in.)"""
    w = np.ascontiguousarray(qw.transpose(1, 2, 0), dtype=F32)      # (G, k, R)
    a = np.ascontiguousarray(qa.transpose(1, 0, 2), dtype=F32)      # (G, T, k)
    return np.matmul(a, w).transpose(1, 2, 0).astype(np.float64)    # (T, R, G)


def _fma(a, b, c):
    """float32 fused multiply-add: the product of two float32 is exact in float64,
    the sum is rounded there and then to float32 (a double rounding that can differ from the
    hardware only when the float64 sum lands exactly half-way between two float32)."""
    return (a.astype(np.float64) * b + c).astype(F32)


def hsum_float_8(acc: np.ndarray) -> np.ndarray:
    """ggml's hsum_float_8 over the last axis (8 SIMD lanes): (lanes 0-3 + lanes 4-7), then pairs."""
    r = acc[..., :4] + acc[..., 4:]
    return (r[..., 0] + r[..., 2]) + (r[..., 1] + r[..., 3])


def _avx2_accumulate(d: np.ndarray, lanes: np.ndarray) -> np.ndarray:
    """The AVX2 kernels' accumulator: 8 float lanes, ``acc = fma(d_block, (float) lane_sums, acc)``
    block after block, then hsum_float_8. d: (T, R, nb) float32; lanes: (T, R, nb, 8) integers."""
    acc = np.zeros(lanes.shape[:2] + (8,), F32)
    lanes = lanes.astype(F32)                       # _mm256_cvtepi32_ps: rounds beyond 2**24
    for b in range(lanes.shape[2]):
        acc = _fma(d[:, :, b, None], lanes[:, :, b, :], acc)
    return hsum_float_8(acc)


def _quads(qw: np.ndarray, qa: np.ndarray) -> np.ndarray:
    """Lane sums of 32-value chunks: each of the 8 int32 lanes of maddubs + madd holds the sum of
    4 consecutive products. qw (R, nb, 32*c), qa (T, nb, 32*c) -> (T, R, nb, c, 8)."""
    R, nb, n = qw.shape
    T = qa.shape[0]
    return block_dots(qw.reshape(R, nb * n // 4, 4), qa.reshape(T, nb * n // 4, 4)).reshape(T, R, nb, n // 32, 8)


def _h(b, name):
    return b[name].astype(F32)


def _dd(w, a):
    """Per-block d_w * d_a as float32, (T, R, nb)."""
    return _h(w, "d")[None] * _h(a, "d")[:, None]


def vec_dot_q4_0_q8_0(w, a):
    lanes = _quads(nibbles(w["qs"]).astype(np.int8) - 8, a["qs"])[:, :, :, 0]
    return _avx2_accumulate(_dd(w, a), lanes)


def vec_dot_q5_0_q8_0(w, a):
    q = L.q5_codes(w.reshape(-1)).reshape(w.shape + (32,)).astype(np.int8) - 16
    return _avx2_accumulate(_dd(w, a), _quads(q, a["qs"])[:, :, :, 0])


def vec_dot_q8_0_q8_0(w, a):
    return _avx2_accumulate(_dd(w, a), _quads(w["qs"], a["qs"])[:, :, :, 0])


def _affine_dot(w, a, codes):
    """q4_1/q5_1 x q8_1: lanes accumulate d_w d_a sum(q_w q_a); the min terms m_w * s_a go to a
    scalar float sum (a fused multiply-add, as compiled), added after the horizontal sum."""
    main = _avx2_accumulate(_dd(w, a), _quads(codes, a["qs"])[:, :, :, 0])
    m, s = _h(w, "m")[None], _h(a, "s")[:, None]           # (1, R, nb), (T, 1, nb)
    summs = np.zeros(main.shape, F32)
    for b in range(m.shape[-1]):
        summs = _fma(m[..., b], s[..., b], summs)
    return main + summs


def vec_dot_q4_1_q8_1(w, a):
    return _affine_dot(w, a, nibbles(w["qs"]))


def vec_dot_q5_1_q8_1(w, a):
    return _affine_dot(w, a, L.q5_codes(w.reshape(-1)).reshape(w.shape + (32,)))


def _k_lanes(w, a, codes, scales_per_chunk):
    """AVX2 lane sums of a K-quant super-block: lane k of chunk c (32 values) is scale(c, k) times the
    sum of 4 products; the 8 chunks add up in int32. scales_per_chunk (R, nb, 8 chunks, 8 lanes)."""
    R, nb = w.shape
    quads = _quads(codes.reshape(R, nb, QK_K), a["qs"].reshape(a.shape[0], nb, QK_K))   # (T, R, nb, 8, 8)
    return (quads * scales_per_chunk.astype(np.float64)[None]).sum(3)


def _pairs_of_16(sc16: np.ndarray) -> np.ndarray:
    """Scales of 16-value sub-blocks (R, nb, 16) as lane scales (R, nb, 8 chunks, 8 lanes):
    lanes 0-3 of chunk c use sub-block 2c, lanes 4-7 sub-block 2c+1."""
    R, nb = sc16.shape[:2]
    return np.repeat(sc16.reshape(R, nb, 8, 2), 4, axis=-1)


def vec_dot_q2_k_q8_k(w, a):
    """Per super-block: acc = fma(dmin, min lanes, acc) with lane k = m[2k] bsum[2k] + m[2k+1] bsum[2k+1],
    then acc = fma(d, scale lanes, acc); dmin = -y.d * fp16(x.dmin)."""
    R, nb = w.shape
    T = a.shape[0]
    b = w.reshape(-1)
    sc = b["scales"].reshape(R, nb, 16)
    lanes = _k_lanes(w, a, K.crumbs(b["qs"]), _pairs_of_16(sc & 0x0F))
    bs = a["bsums"].astype(np.int64).reshape(T, 1, nb, 8, 2)
    mlanes = ((sc >> 4).astype(np.int64).reshape(1, R, nb, 8, 2) * bs).sum(-1)
    d = a["d"][:, None, :] * _h(w, "d")[None]
    dmin = -a["d"][:, None, :] * _h(w, "dmin")[None]
    acc = np.zeros((T, R, 8), F32)
    lanes, mlanes = lanes.astype(F32), mlanes.astype(F32)
    for i in range(nb):
        acc = _fma(dmin[:, :, i, None], mlanes[:, :, i, :], acc)
        acc = _fma(d[:, :, i, None], lanes[:, :, i, :], acc)
    return hsum_float_8(acc)


def vec_dot_q3_k_q8_k(w, a):
    R, nb = w.shape
    b = w.reshape(-1)
    lanes = _k_lanes(w, a, K.q3_codes(b), _pairs_of_16(K.q3_scales(b["scales"]).reshape(R, nb, 16)))
    return _avx2_accumulate(a["d"][:, None, :] * _h(w, "d")[None], lanes)


def _k4_parts(w, a, codes):
    """Shared by q4_k/q5_k: scale lanes, and the 4 min-lanes m = mins[2l]*s[2l] + mins[2l+1]*s[2l+1]
    where s[j] is the sum of q_a over sub-block j (two bsums)."""
    b = w.reshape(-1)
    R, nb = w.shape
    T = a.shape[0]
    sc, mn = K.scale_min_k4(b["scales"])
    lanes = _k_lanes(w, a, codes, np.repeat(sc.reshape(R, nb, 8, 1), 8, axis=-1))
    q8s = a["bsums"].astype(np.int64).reshape(T, nb, 8, 2).sum(-1)                       # (T, nb, 8)
    prod = (mn.reshape(R, nb, 4, 2).astype(np.int64)[None] * q8s.reshape(T, 1, nb, 4, 2)).sum(-1)  # (T, R, nb, 4)
    d = a["d"][:, None, :] * _h(w, "d")[None]
    dmin = -a["d"][:, None, :] * _h(w, "dmin")[None]
    return d, lanes, dmin, prod


def vec_dot_q4_k_q8_k(w, a):
    """acc (8 lanes) += d * lanes; acc_m (4 lanes) += dmin * (min lanes); result hsum(acc) + hsum(acc_m)."""
    d, lanes, dmin, prod = _k4_parts(w, a, K.q4k_codes(w.reshape(-1)["qs"]))
    acc_m = np.zeros(prod.shape[:2] + (4,), F32)
    for b in range(prod.shape[2]):
        acc_m = _fma(dmin[:, :, b, None], prod[:, :, b, :].astype(F32), acc_m)
    m = (acc_m[..., 0] + acc_m[..., 2]) + (acc_m[..., 1] + acc_m[..., 3])
    return _avx2_accumulate(d, lanes) + m


def vec_dot_q5_k_q8_k(w, a):
    """As q4_k, but the min term is a scalar sum: summs += dmin * (sum of the 4 min lanes)."""
    d, lanes, dmin, prod = _k4_parts(w, a, K.q5k_codes(w.reshape(-1)))
    total = prod.sum(-1).astype(F32)
    summs = np.zeros(total.shape[:2], F32)
    for b in range(total.shape[2]):
        summs = _fma(dmin[:, :, b], total[:, :, b], summs)
    return _avx2_accumulate(d, lanes) + summs


def vec_dot_q6_k_q8_k(w, a):
    """The codes enter the lanes unsigned (0..63); the -32 offset is taken out afterwards from the bsums:
    lane k loses 32 * (sc[2k] bsum[2k] + sc[2k+1] bsum[2k+1]). Chunk c of 32 values uses scale 2c for
    lanes 0-3 (its values 0-15) and 2c+1 for lanes 4-7."""
    R, nb = w.shape
    T = a.shape[0]
    b = w.reshape(-1)
    sc = b["scales"].reshape(R, nb, 16).astype(np.int64)
    codes = K.q6k_codes(b).astype(np.int16) + 32
    lanes = _k_lanes(w, a, codes, _pairs_of_16(sc))
    bs = a["bsums"].astype(np.int64).reshape(T, 1, nb, 8, 2)
    lanes = lanes - 32 * (sc.reshape(1, R, nb, 8, 2) * bs).sum(-1)
    return _avx2_accumulate(a["d"][:, None, :] * _h(w, "d")[None], lanes)


# ---------------------------------------------------------------- type_traits_cpu

@dataclass(frozen=True)
class CPUTraits:
    vec_dot_type: str          # the activation partner type
    vec_dot: Callable          # (weight blocks (R, nb), partner blocks (T, nb)) -> (T, R) float32


TYPE_TRAITS_CPU: dict[str, CPUTraits] = {
    "q4_0": CPUTraits("q8_0", vec_dot_q4_0_q8_0),
    "q4_1": CPUTraits("q8_1", vec_dot_q4_1_q8_1),
    "q5_0": CPUTraits("q8_0", vec_dot_q5_0_q8_0),
    "q5_1": CPUTraits("q8_1", vec_dot_q5_1_q8_1),
    "q8_0": CPUTraits("q8_0", vec_dot_q8_0_q8_0),
    "q2_k": CPUTraits("q8_K", vec_dot_q2_k_q8_k),
    "q3_k": CPUTraits("q8_K", vec_dot_q3_k_q8_k),
    "q4_k": CPUTraits("q8_K", vec_dot_q4_k_q8_k),
    "q5_k": CPUTraits("q8_K", vec_dot_q5_k_q8_k),
    "q6_k": CPUTraits("q8_K", vec_dot_q6_k_q8_k),
}


def vec_dot_type(qtype) -> str:
    t = ggml_type(qtype)
    if t.name not in TYPE_TRAITS_CPU:
        raise QuantError(f"ggml type {t.name} has no CPU dot product in llmlab")
    return TYPE_TRAITS_CPU[t.name].vec_dot_type


def mul_mat(weight_raw, qtype, x: np.ndarray) -> np.ndarray:
    """ggml-cpu's ``mul_mat`` for a quantized weight: ``W @ x^T`` as (T, R) float32.

    weight_raw: the raw bytes of a 2-D tensor, rows of ``n`` values (uint8 (R, row_bytes)
    or a flat buffer, or structured blocks (R, nb)); x: float32 activations (T, n) or (n,).
    """
    t = ggml_type(qtype)
    if t.name not in TYPE_TRAITS_CPU:
        raise QuantError(f"ggml type {t.name} has no CPU dot product in llmlab")
    traits = TYPE_TRAITS_CPU[t.name]
    x = np.asarray(x, F32)
    squeeze = x.ndim == 1
    x2 = x.reshape(-1, x.shape[-1])
    n = x2.shape[-1]
    if n % t.block_size:
        raise QuantError(f"{t.name}: row length {n} is not a multiple of the block size {t.block_size}")
    w = blocks_of(weight_raw, t)
    if w.size % (n // t.block_size):
        raise QuantError(f"{t.name}: weight of {w.size} blocks does not hold rows of {n} values")
    w = w.reshape(-1, n // t.block_size)
    a = quantize_activations(x2, traits.vec_dot_type)
    step = max(1, (1 << 23) // (len(x2) * max(n // 4, 1)))      # bound the (T, R, n/4) lane temporaries
    out = np.concatenate([traits.vec_dot(w[i:i + step], a) for i in range(0, len(w), step)], axis=1)
    return out[0] if squeeze else out


def affine_dot_terms(w_block, a_block) -> dict[str, float]:
    """One q4_1 (or q5_1) block against one q8_1 block, term by term.

    With w_i = d_w q_i + m_w and a_i ~ d_a p_i:
        sum_i w_i a_i = d_w d_a sum_i q_i p_i  +  m_w (d_a sum_i p_i)
    The second factor is the same for every weight row, so q8_1 stores it once per block
    as ``s`` and the min term costs one multiply instead of 32 adds."""
    w, a = w_block.reshape(-1)[:1], a_block.reshape(-1)[:1]
    t = "q5_1" if w.dtype == L.BLOCK_Q5_1 else "q4_1"
    q = (L.q5_codes(w) if t == "q5_1" else nibbles(w["qs"]))[0].astype(np.int64)
    p = a["qs"][0].astype(np.int64)
    dw, mw, da, s = (float(np.float32(v)) for v in (w["d"][0], w["m"][0], a["d"][0], a["s"][0]))
    return {"sum_qp": int(q @ p), "sum_p": int(p.sum()), "d_w": dw, "m_w": mw, "d_a": da, "s_a": s,
            "scale_term": float(np.float32(dw * da) * np.float32(q @ p)), "min_term": float(np.float32(mw * s)),
            "min_term_from_codes": mw * da * int(p.sum()),
            "dequantized_dot": float(L.dequantize_q4_1(w)[0].astype(np.float64) @ L.dequantize_q8_0(a)[0].astype(np.float64))
            if t == "q4_1" else float(L.dequantize_q5_1(w)[0].astype(np.float64) @ L.dequantize_q8_0(a)[0].astype(np.float64))}
