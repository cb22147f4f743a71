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

What is exact: the activation codes and scales, every integer block sum and every
per-block float scale. What is not: the order in which ggml's SIMD lanes add the
per-block float terms (it differs between AVX2, AVX512 and the repacked kernels);
here they are summed in float64 and rounded once, which lands within an ulp or two.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..types import QK_K, ggml_type
from . import k_quants as K
from . import legacy as L
from .core import F32, QuantError, blocks_of, fp16, nibbles

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


def _sum_blocks(terms: np.ndarray) -> np.ndarray:
    return terms.astype(np.float64).sum(-1).astype(F32)


def _h(b, name):
    return b[name].astype(F32)


def vec_dot_q4_0_q8_0(w, a):
    sumi = block_dots(nibbles(w["qs"]).astype(np.int8) - 8, a["qs"])
    return _sum_blocks((_h(w, "d")[None] * _h(a, "d")[:, None]) * sumi)


def vec_dot_q5_0_q8_0(w, a):
    sumi = block_dots(L.q5_codes(w.reshape(-1)).reshape(w.shape + (32,)).astype(np.int8) - 16, a["qs"])
    return _sum_blocks((_h(w, "d")[None] * _h(a, "d")[:, None]) * sumi)


def vec_dot_q8_0_q8_0(w, a):
    sumi = block_dots(w["qs"], a["qs"])
    return _sum_blocks((_h(w, "d")[None] * _h(a, "d")[:, None]) * sumi)


def _affine_dot(w, a, codes):
    """q4_1/q5_1 x q8_1: d_w d_a sum(q_w q_a) + m_w s_a, with s_a = d_a sum(q_a) precomputed."""
    sumi = block_dots(codes, a["qs"])
    main = (_h(w, "d")[None] * _h(a, "d")[:, None]) * sumi
    mins = _h(w, "m")[None] * _h(a, "s")[:, None]
    return (main.astype(np.float64).sum(-1) + mins.astype(np.float64).sum(-1)).astype(F32)


def vec_dot_q4_1_q8_1(w, a):
    return _affine_dot(w, a, nibbles(w["qs"]))


def vec_dot_q5_1_q8_1(w, a):
    return _affine_dot(w, a, L.q5_codes(w.reshape(-1)).reshape(w.shape + (32,)))


def _k_dot(w, a, codes, sub, sub_scales, d_name="d"):
    """K-quant x q8_K: isum = sum_j sc_j * (q_w . q_a over sub-block j), exact integers;
    result d_w * d_a * isum, d_w * d_a formed in float32 like ggml (``y.d * fp16(x.d)``)."""
    R, nb = w.shape
    T = a.shape[0]
    qw = codes.reshape(R, nb * (QK_K // sub), sub)
    qa = a["qs"].reshape(T, nb * (QK_K // sub), sub)
    dots = block_dots(qw, qa).reshape(T, R, nb, QK_K // sub)
    isum = (dots * sub_scales.reshape(R, nb, -1).astype(np.float64)[None]).sum(-1)
    d = a["d"][:, None, :] * _h(w, d_name)[None]                     # f32 product
    return d, isum


def _k_min_term(w, a, mins, per_bsum):
    """dmin_w * d_a * sum_j m_j * (sum of q_a over sub-block j), from q8_K's bsums."""
    T = a.shape[0]
    R, nb = w.shape
    bs = a["bsums"].astype(np.float64).reshape(T, nb, -1, per_bsum).sum(-1)    # (T, nb, nsub)
    msum = np.einsum("rbj,tbj->trb", mins.reshape(R, nb, -1).astype(np.float64), bs)
    dmin = a["d"][:, None, :] * _h(w, "dmin")[None]
    return dmin, msum


def vec_dot_q2_k_q8_k(w, a):
    b = w.reshape(-1)
    d, isum = _k_dot(w, a, K.crumbs(b["qs"]), 16, b["scales"] & 0x0F)
    dmin, msum = _k_min_term(w, a, b["scales"] >> 4, 1)
    return (d.astype(np.float64) * isum - dmin.astype(np.float64) * msum).sum(-1).astype(F32)


def vec_dot_q3_k_q8_k(w, a):
    b = w.reshape(-1)
    d, isum = _k_dot(w, a, K.q3_codes(b), 16, K.q3_scales(b["scales"]))
    return (d.astype(np.float64) * isum).sum(-1).astype(F32)


def vec_dot_q4_k_q8_k(w, a):
    b = w.reshape(-1)
    sc, mn = K.scale_min_k4(b["scales"])
    d, isum = _k_dot(w, a, K.q4k_codes(b["qs"]), 32, sc)
    dmin, msum = _k_min_term(w, a, mn, 2)
    return (d.astype(np.float64) * isum - dmin.astype(np.float64) * msum).sum(-1).astype(F32)


def vec_dot_q5_k_q8_k(w, a):
    b = w.reshape(-1)
    sc, mn = K.scale_min_k4(b["scales"])
    d, isum = _k_dot(w, a, K.q5k_codes(b), 32, sc)
    dmin, msum = _k_min_term(w, a, mn, 2)
    return (d.astype(np.float64) * isum - dmin.astype(np.float64) * msum).sum(-1).astype(F32)


def vec_dot_q6_k_q8_k(w, a):
    b = w.reshape(-1)
    d, isum = _k_dot(w, a, K.q6k_codes(b), 16, b["scales"])
    return (d.astype(np.float64) * isum).sum(-1).astype(F32)


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
    out = traits.vec_dot(w, a)
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
