"""Quantized dot products (ggml-cpu's quants.c + arch/x86/quants.c, and ``type_traits_cpu[]``).

For a matrix product ggml-cpu never dequantizes the weights. It quantizes each activation row
to the weight type's partner (``vec_dot_type``: q8_0, q8_1 or q8_K), multiplies 8-bit integers
block by block, and applies the float scales once per block:

    dot(w, x) = sum over blocks b of  d_w[b] * d_x[b] * sum_i q_w[b,i] * q_x[b,i]   (+ min terms)

This module is that path, written once per type:

* :func:`quantize_activations`: the partner quantizers as x86 builds run them (q8_0/q8_1:
  ``id = 127/amax`` and round half to even; q8_K: ggml's reference);
* ``vec_dot_<w>_<a>`` per weight type, as the AVX2 ``ggml_vec_dot_*`` kernels that both x86 profiles
  run (AVX-512 builds keep them; VNNI only changes how the exact integers are formed): 8 float
  lanes, lane j holding the integer sum of products 4j..4j+3 of every 32 values (times the
  sub-block scale for K-quants), ``acc_j = fma(d_w * d_x, (float) lane_j, acc_j)`` block after block,
  then ``hsum_float_8`` (the profile's ``quant_hsum_tree``); the min terms of q4_1/q5_1/q2_K/q4_K/q5_K
  and q6_K's -32 enter as each kernel adds them;
* :func:`mul_mat`: ``W @ x`` for all rows through the type's vec_dot (ggml-cpu's plain path; the
  tiled and REPACK paths are in ``tiled`` and ``repack_gemm``, the choice in ``ops.mul_mat_quantized``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
from numpy import float32, float64

from . import profiles
from .simd import fma, fma64, reduce_tree
from ..types import QK_K, ggml_type
from ..quant import k_quants as K
from ..quant import legacy as L
from ..quant.core import QuantError, blocks_of, fp16, nibbles

ROW_CHUNK = 4096          # weight rows per step (bounds the lane temporaries)

# ---------------------------------------------------------------- activation quantizers (quantize_row_q8_*)


def quantize_row_q8_0(x: np.ndarray) -> np.ndarray:
    """ggml-cpu x86 quantize_row_q8_0: d = amax/127 (stored f16), q = round_half_even(x * 127/amax)."""
    x = np.asarray(x, float32).reshape(-1, 32)
    amax = np.abs(x).max(-1)
    with np.errstate(divide="ignore"):
        iscale = np.where(amax != 0, float32(127) / amax, float32(0)).astype(float32)
    out = np.zeros(len(x), L.BLOCK_Q8_0)
    out["d"], out["qs"] = fp16(amax / float32(127)), np.rint(x * iscale[:, None])
    return out


def quantize_row_q8_1(x: np.ndarray) -> np.ndarray:
    """As q8_0, plus s = f16(d * sum(q)) with the unrounded f32 d."""
    x = np.asarray(x, float32).reshape(-1, 32)
    amax = np.abs(x).max(-1)
    d = (amax / float32(127)).astype(float32)
    with np.errstate(divide="ignore"):
        iscale = np.where(amax != 0, float32(127) / amax, float32(0)).astype(float32)
    q = np.rint(x * iscale[:, None]).astype(np.int32)
    out = np.zeros(len(x), L.BLOCK_Q8_1)
    out["d"], out["qs"], out["s"] = fp16(d), q, fp16(d * q.sum(-1).astype(float32))
    return out


def quantize_row_q8_k(x: np.ndarray) -> np.ndarray:
    """x86 ggml-cpu uses ggml's reference for q8_K."""
    return K.quantize_q8_k(np.asarray(x, float32).reshape(-1, QK_K))


def _neon_q8(x: np.ndarray):
    """arch/arm/quants.c: d = amax/127, id = 1/d, q = vcvtnq_s32_f32(x * id) (round half to even).
    x86 multiplies by 127/amax instead: the same formula on paper, another float product."""
    x = np.asarray(x, float32).reshape(-1, 32)
    d = (np.abs(x).max(-1) / float32(127)).astype(float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, float32(1) / d, float32(0)).astype(float32)
    return d, np.rint((x * inv[:, None]).astype(float32)).astype(np.int32)


def quantize_row_q8_0_neon(x: np.ndarray) -> np.ndarray:
    d, q = _neon_q8(x)
    out = np.zeros(len(q), L.BLOCK_Q8_0)
    out["d"], out["qs"] = fp16(d), q
    return out


def quantize_row_q8_1_neon(x: np.ndarray) -> np.ndarray:
    """As q8_0 on NEON, plus s = f16(d * sum(q))."""
    d, q = _neon_q8(x)
    out = np.zeros(len(q), L.BLOCK_Q8_1)
    out["d"], out["qs"], out["s"] = fp16(d), q, fp16(d * q.sum(-1).astype(float32))
    return out


def quantize_row_q8_k_neon(x: np.ndarray) -> np.ndarray:
    """quantize_row_q8_K_ref as GCC compiles it for AArch64: ``iscale*x[j] + 12582912.f`` fused (fmla),
    so the exact product is rounded; x86 builds of ggml-base round the product to float first."""
    return K.quantize_q8_k(np.asarray(x, float32).reshape(-1, QK_K), fused=True)


# per kernel family (the profile's ``quant_kernels``): arch/x86/quants.c or arch/arm/quants.c
ACTIVATION_QUANTIZERS: dict[str, dict[str, Callable]] = {
    "x86": {"q8_0": quantize_row_q8_0, "q8_1": quantize_row_q8_1, "q8_K": quantize_row_q8_k},
    "neon": {"q8_0": quantize_row_q8_0_neon, "q8_1": quantize_row_q8_1_neon, "q8_K": quantize_row_q8_k_neon},
}
ACTIVATION_QUANTIZERS["neon_i8mm"] = ACTIVATION_QUANTIZERS["neon"]


def quantize_activations(x: np.ndarray, partner: str, cpu=None) -> np.ndarray:
    """Quantize activation rows (T, n) to the partner type, as the profile's build does (``cpu``:
    None means x86, whose quantizers every x86 profile shares); structured blocks (T, n / block)."""
    key = "q8_K" if partner.lower() == "q8_k" else partner.lower()
    table = ACTIVATION_QUANTIZERS["x86" if cpu is None else profiles.resolve(cpu).quant_kernels]
    if key not in table:
        raise QuantError(f"no activation quantizer for {partner!r} (known: {', '.join(table)})")
    x = np.asarray(x, float32)
    x2 = x.reshape(-1, x.shape[-1])
    bs = 32 if key != "q8_K" else QK_K
    if x2.shape[-1] % bs:
        raise QuantError(f"{partner}: row length {x2.shape[-1]} is not a multiple of {bs}")
    return table[key](x2).reshape(x2.shape[0], -1)


# ---------------------------------------------------------------- integer lane sums

class LaneSums:
    """The 8 int32 lanes of an AVX2 block dot (maddubs + madd), block by block: lane j sums the
    products of values 4j..4j+3 of every 32 (over all 32-value chunks of the block).
    W (n, nb, G) integer codes (already times their sub-block scales), A (T, nb, G) activation codes,
    G = 32 * chunks; ``lanes[b]`` is (8, T, n), exact (float64 when sums may pass 2**24).
    ``correct(b) -> (8, T, n)`` is added to each block's lanes (q6_K's -32 through the bsums)."""

    def __init__(self, W: np.ndarray, A: np.ndarray, exact64: bool = False, correct=None, lanes: int = 8):
        n, nb, G = W.shape
        T = A.shape[0]
        c = G // (4 * lanes)            # NEON (lanes=4): vdotq_s32 lane j takes values 4j..4j+3 of every 16
        dt = float64 if exact64 else float32
        self.Wl = W.reshape(n, nb, c, lanes, 4).transpose(1, 3, 2, 4, 0).reshape(nb, lanes, c * 4, n).astype(dt)
        self.Al = A.reshape(T, nb, c, lanes, 4).transpose(1, 3, 0, 2, 4).reshape(nb, lanes, T, c * 4).astype(dt)
        self.correct = correct

    def __len__(self) -> int:
        return len(self.Wl)

    def __getitem__(self, b: int) -> np.ndarray:
        s = np.matmul(self.Al[b], self.Wl[b])
        return s if self.correct is None else s + self.correct(b)


def accumulate(d: np.ndarray, lanes: LaneSums, acc: np.ndarray | None = None) -> np.ndarray:
    """The AVX2 accumulator: ``acc = fma(d_b, (float) lanes_b, acc)`` block after block.
    d (nb, T, n) float32 -> acc (8, T, n) float32."""
    for b in range(len(lanes)):
        lb = lanes[b].astype(float32)              # _mm256_cvtepi32_ps (rounds beyond 2**24)
        acc = fma64(d[b].astype(float64)[None], lb, 0 if acc is None else acc)
    return acc


def hsum(acc: np.ndarray, cpu) -> np.ndarray:
    """hsum_float_8 of (8, T, n) lanes -> (T, n)."""
    return reduce_tree(np.moveaxis(acc, 0, -1), cpu.quant_hsum_tree)


def _dd(w, a) -> np.ndarray:
    """Per-block d_w * d_a as float32, (nb, T, n)."""
    return (a["d"].astype(float32).T[:, :, None] * w["d"].astype(float32).T[:, None, :]).astype(float32)


def _scalar_fma_sum(m: np.ndarray, s: np.ndarray) -> np.ndarray:
    """``summs += m_b * s_b`` block after block, contracted into an fma; m, s broadcast to (nb, T, n)."""
    out = np.zeros(np.broadcast_shapes(m.shape, s.shape)[1:], float32)
    for b in range(max(m.shape[0], s.shape[0])):
        out = fma(m[b % m.shape[0]], s[b % s.shape[0]], out)
    return out


# ---------------------------------------------------------------- vec_dot per type (32-value blocks)

def _legacy(w, a, codes, cpu):
    cpu = profiles.resolve(cpu)
    return hsum(accumulate(_dd(w, a), LaneSums(codes, a["qs"])), cpu)


def codes_q4_0(w) -> np.ndarray:
    return nibbles(w["qs"]).astype(np.int16) - 8


def codes_q5(w) -> np.ndarray:
    """q5_0/q5_1 codes 0..31 (low nibble | fifth bit << 4), (R, nb, 32)."""
    return L.q5_codes(w.reshape(-1)).reshape(w.shape + (32,)).astype(np.int16)


def vec_dot_q4_0_q8_0(w, a, cpu=None):
    return _legacy(w, a, codes_q4_0(w), cpu)


def vec_dot_q5_0_q8_0(w, a, cpu=None):
    return _legacy(w, a, codes_q5(w) - 16, cpu)


def vec_dot_q8_0_q8_0(w, a, cpu=None):
    return _legacy(w, a, w["qs"], cpu)


def _affine(w, a, codes, cpu):
    """q4_1/q5_1 x q8_1: the lanes take d_w d_a sum(q_w q_a); the min terms m_w * s_a go to a scalar
    float sum (``summs += m*s``, an fma as compiled), added after the horizontal sum."""
    main = _legacy(w, a, codes, cpu)
    summs = _scalar_fma_sum(w["m"].astype(float32).T[:, None, :], a["s"].astype(float32).T[:, :, None])
    return (main + summs).astype(float32)


def vec_dot_q4_1_q8_1(w, a, cpu=None):
    return _affine(w, a, nibbles(w["qs"]), cpu)


def vec_dot_q5_1_q8_1(w, a, cpu=None):
    return _affine(w, a, codes_q5(w), cpu)


# ---------------------------------------------------------------- vec_dot per type (K-quants x q8_K)

def _pairs_of_16(sc16: np.ndarray) -> np.ndarray:
    """Scales of 16-value sub-blocks (n, nb, 16) spread over the 256 values (n, nb, 256)."""
    return np.repeat(sc16, 16, axis=-1)


def _bsum_pairs(a, n_T: int, nb: int) -> np.ndarray:
    """q8_K bsums (sums of 16 activation codes) as (T, nb, 8, 2): lane k's two sub-blocks 2k, 2k+1."""
    return a["bsums"].astype(np.int64).reshape(n_T, nb, 8, 2)


def _d_k(w, a, name="d") -> np.ndarray:
    """y.d * x.d per super-block (nb, T, n) float32 (q8_K's d is f32, the weight's f16)."""
    return (a["d"].astype(float32).T[:, :, None] * w[name].astype(float32).T[:, None, :]).astype(float32)


def vec_dot_q2_k_q8_k(w, a, cpu=None):
    """Per super-block: acc = fma(dmin, min lanes, acc), lane k = m[2k] bsum[2k] + m[2k+1] bsum[2k+1],
    then acc = fma(d, scale lanes, acc); dmin = -y.d * x.dmin."""
    cpu = profiles.resolve(cpu)
    n, nb = w.shape
    T = a.shape[0]
    flat = w.reshape(-1)
    sc = flat["scales"].reshape(n, nb, 16)
    W = K.crumbs(flat["qs"]).astype(np.int32).reshape(n, nb, 256) * _pairs_of_16(sc & 0x0F)
    lanes = LaneSums(W, a["qs"], exact64=True)
    mins, bs = (sc >> 4).astype(np.int64).reshape(n, nb, 8, 2), _bsum_pairs(a, T, nb)
    d, dmin = _d_k(w, a), (-_d_k(w, a, "dmin")).astype(float32)
    acc = np.zeros((8, T, n), float32)
    for b in range(nb):
        mlanes = np.einsum("rkj,tkj->ktr", mins[:, b], bs[:, b]).astype(float32)
        acc = fma64(dmin[b].astype(float64)[None], mlanes, acc)
        acc = fma64(d[b].astype(float64)[None], lanes[b].astype(float32), acc)
    return hsum(acc, cpu)


def vec_dot_q3_k_q8_k(w, a, cpu=None):
    cpu = profiles.resolve(cpu)
    n, nb = w.shape
    flat = w.reshape(-1)
    W = K.q3_codes(flat).astype(np.int32).reshape(n, nb, 256) * _pairs_of_16(K.q3_scales(flat["scales"]).reshape(n, nb, 16))
    return hsum(accumulate(_d_k(w, a), LaneSums(W, a["qs"], exact64=True)), cpu)


def _k4(w, a, codes):
    """q4_K/q5_K: scale lanes (each 32-value sub-block times its 6-bit scale), and the four
    min products m[2l] s[2l] + m[2l+1] s[2l+1] (s[j]: the q8 sum over sub-block j), (nb, T, n, 4)."""
    n, nb = w.shape
    T = a.shape[0]
    sc, mn = K.scale_min_k4(w.reshape(-1)["scales"])                    # (n*nb, 8) each
    W = codes.astype(np.int32).reshape(n, nb, 8, 32) * sc.reshape(n, nb, 8, 1).astype(np.int32)
    lanes = LaneSums(W.reshape(n, nb, 256), a["qs"], exact64=True)
    q8s = _bsum_pairs(a, T, nb).sum(-1)                                   # (T, nb, 8): sums over 32 values
    prod = np.einsum("rbmk,tbmk->btrm", mn.astype(np.int64).reshape(n, nb, 4, 2), q8s.reshape(T, nb, 4, 2))
    return lanes, prod, (-_d_k(w, a, "dmin")).astype(float32)


def vec_dot_q4_k_q8_k(w, a, cpu=None):
    """acc (8 lanes) += d * lanes; acc_m (4 lanes) += dmin * min products; hsum(acc) + hsum4(acc_m)."""
    cpu = profiles.resolve(cpu)
    lanes, prod, dmin = _k4(w, a, K.q4k_codes(w.reshape(-1)["qs"]))
    accm = np.zeros(prod.shape[1:], float32)
    prod = prod.astype(float32)
    for b in range(prod.shape[0]):
        accm = fma64(dmin[b].astype(float64)[..., None], prod[b], accm)
    m = reduce_tree(accm, ((0, 2), (1, 3)))
    return (hsum(accumulate(_d_k(w, a), lanes), cpu) + m).astype(float32)


def vec_dot_q5_k_q8_k(w, a, cpu=None):
    """As q4_K, but the min term is a scalar: summs += dmin * (sum of the 4 min products)."""
    cpu = profiles.resolve(cpu)
    lanes, prod, dmin = _k4(w, a, K.q5k_codes(w.reshape(-1)))
    summs = _scalar_fma_sum(dmin, prod.sum(-1).astype(float32))
    return (hsum(accumulate(_d_k(w, a), lanes), cpu) + summs).astype(float32)


def vec_dot_q6_k_q8_k(w, a, cpu=None):
    """The codes enter the lanes unsigned (0..63); the -32 comes back through the bsums:
    lane k loses 32 * (sc[2k] bsum[2k] + sc[2k+1] bsum[2k+1]) (found by probing this build)."""
    cpu = profiles.resolve(cpu)
    n, nb = w.shape
    T = a.shape[0]
    flat = w.reshape(-1)
    sc = flat["scales"].reshape(n, nb, 16).astype(np.int64)
    W = (K.q6k_codes(flat).astype(np.int32).reshape(n, nb, 256) + 32) * _pairs_of_16(sc)
    sc2, bs = sc.reshape(n, nb, 8, 2), _bsum_pairs(a, T, nb)
    lanes = LaneSums(W, a["qs"], exact64=True,
                     correct=lambda b: -32.0 * np.einsum("rkj,tkj->ktr", sc2[:, b], bs[:, b]))
    return hsum(accumulate(_d_k(w, a), lanes), cpu)


# ---------------------------------------------------------------- type_traits_cpu

@dataclass(frozen=True)
class CPUTraits:
    vec_dot_type: str          # the activation partner type
    vec_dot: Callable          # (weight blocks (R, nb), partner blocks (T, nb), cpu) -> (T, R) float32


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


# ---------------------------------------------------------------- arch/arm/quants.c (NEON with dotprod)

def neon_accumulators(w, a, codes):
    """The NEON loop's state after the last whole pair of blocks: the 4-lane integer sums per block,
    d_w * d_a per block, and the even-block and odd-block float32x4 accumulators (4, T, n) each."""
    lanes = LaneSums(codes, a["qs"], lanes=4)
    dd = _dd(w, a)
    nb = len(lanes)
    acc = [np.zeros((4,) + dd.shape[1:], float32) for _ in range(2)]
    for b in range(nb - nb % 2):
        acc[b % 2] = (acc[b % 2] + (lanes[b].astype(float32) * dd[b][None]).astype(float32)).astype(float32)
    return lanes, dd, acc


def _neon_legacy(w, a, codes, cpu, tail, summs=None):
    """The NEON loop of ggml_vec_dot_q4_0/q4_1/q5_0/q8_0: two blocks a step, each block's integer dot in
    4 int32 lanes (two vdotq_s32), converted and scaled as ``acc += (float) lanes * d`` (vmlaq_n_f32
    compiles to fmul + fadd, not fused) into an even-block and an odd-block accumulator; then
    ``vaddvq_f32(even) + vaddvq_f32(odd)`` (faddp pairs), plus ``summs``; an odd last block goes through
    the scalar ``tail(sumf, dd, sumi, b)``."""
    lanes, dd, acc = neon_accumulators(w, a, codes)
    nb = len(lanes)
    sumf = (reduce_tree(np.moveaxis(acc[0], 0, -1), cpu.quant_hsum_tree)
            + reduce_tree(np.moveaxis(acc[1], 0, -1), cpu.quant_hsum_tree)).astype(float32)
    if summs is not None:
        sumf = (sumf + summs).astype(float32)
    if nb % 2:
        b = nb - 1
        sumf = tail(sumf, dd[b], lanes[b].sum(0).astype(float32), b)
    return sumf


def _neon_summs(w, a, nb: int) -> np.ndarray:
    """q4_1/q5_1's ``summs += m0*s0 + m1*s1`` per pair of blocks, compiled as fma(m0, s0, m1*s1)."""
    m, s = w["m"].astype(float32).T[:, None, :], a["s"].astype(float32).T[:, :, None]
    out = np.zeros(np.broadcast_shapes(m.shape, s.shape)[1:], float32)
    for b in range(0, nb - nb % 2, 2):
        out = (out + fma(m[b], s[b], (m[b + 1] * s[b + 1]).astype(float32))).astype(float32)
    return out


def vec_dot_q4_0_q8_0_neon(w, a, cpu=None):
    cpu = profiles.resolve(cpu)
    dx, dy = w["d"].astype(float32).T[:, None, :], a["d"].astype(float32).T[:, :, None]
    # tail: sumf += sumi*d_x*d_y, the last product fused into the sum
    return _neon_legacy(w, a, codes_q4_0(w), cpu,
                        lambda sumf, dd, sumi, b: fma((sumi * dx[b]).astype(float32), dy[b], sumf))


def vec_dot_q8_0_q8_0_neon(w, a, cpu=None):
    cpu = profiles.resolve(cpu)
    return _neon_legacy(w, a, w["qs"], cpu, lambda sumf, dd, sumi, b: fma(sumi, dd, sumf))


def vec_dot_q4_1_q8_1_neon(w, a, cpu=None):
    cpu = profiles.resolve(cpu)
    m, s = w["m"].astype(float32).T[:, None, :], a["s"].astype(float32).T[:, :, None]
    # tail: sumf += dd*sumi + m*s, as fadd(sumf, fma(dd, sumi, m*s))
    return _neon_legacy(w, a, nibbles(w["qs"]), cpu,
                        lambda sumf, dd, sumi, b: (sumf + fma(dd, sumi, (m[b] * s[b]).astype(float32))).astype(float32),
                        summs=_neon_summs(w, a, w.shape[1]))


def vec_dot_q5_0_q8_0_neon(w, a, cpu=None):
    cpu = profiles.resolve(cpu)
    return _neon_legacy(w, a, codes_q5(w) - 16, cpu, lambda sumf, dd, sumi, b: fma(dd, sumi, sumf))


NEON_TRAITS: dict[str, CPUTraits] = {
    "q4_0": CPUTraits("q8_0", vec_dot_q4_0_q8_0_neon),
    "q5_0": CPUTraits("q8_0", vec_dot_q5_0_q8_0_neon),
    "q4_1": CPUTraits("q8_1", vec_dot_q4_1_q8_1_neon),
    "q8_0": CPUTraits("q8_0", vec_dot_q8_0_q8_0_neon),
}

def vec_dot_q4_1_q8_1_mmla(w, a, cpu=None):
    """ggml_vec_dot_q4_1_q8_1 with MATMUL_INT8 and nrc == 2: vmmlaq_s32 forms 2 rows x 2 columns of
    whole-block integer dots; ONE accumulator per output, ``acc += (float) isum * d`` block after block
    (multiply, then add), the min terms in their own lanes as ``summs = fma(m, s, summs)`` (the compiler
    contracts the products and vaddq_f32 into fmla), and ``acc + summs`` at the end."""
    dd = _dd(w, a)
    isum = np.einsum("tbk,rbk->btr", a["qs"].astype(float64), nibbles(w["qs"]).astype(float64)).astype(float32)
    m, s = w["m"].astype(float32).T[:, None, :], a["s"].astype(float32).T[:, :, None]
    acc = np.zeros(dd.shape[1:], float32)
    summs = np.zeros(dd.shape[1:], float32)
    for b in range(len(dd)):
        acc = (acc + (isum[b] * dd[b]).astype(float32)).astype(float32)
        summs = fma(m[b], s[b], summs)
    return (acc + summs).astype(float32)


# nrc == 2 kernels (MATMUL_INT8), for the profile's ``vec_dot_nrows`` types
MMLA_VEC_DOT: dict[str, Callable] = {"q4_1": vec_dot_q4_1_q8_1_mmla}

# the profile's ``quant_kernels`` picks one table: which arch/<isa>/quants.c the build compiled. The
# i8mm table holds the types whose every path llmlab reproduces (q4_0 and q8_0 also take 2x2 mmla steps
# there, not reproduced yet: they are left out, so they run the float stand-in and say so in the path)
QUANT_KERNELS: dict[str, dict[str, CPUTraits]] = {
    "x86": TYPE_TRAITS_CPU, "neon": NEON_TRAITS,
    "neon_i8mm": {k: v for k, v in NEON_TRAITS.items() if k in ("q4_1", "q5_0")},
}


MMLA_THREADS = 1      # llama.cpp's thread count, where it matters (see vec_dot_rows): the references' one


def vec_dot_rows(cpu, tname: str, n_rows: int, n_act: int, n_threads: int = MMLA_THREADS) -> np.ndarray | int:
    """ggml_compute_forward_mul_mat's num_rows_per_vec_dot per output, as (n_act, n_rows) 1s and 2s
    (or 1 where the type never takes 2x2 steps). The work is cut in chunks of 16 x 16 outputs (64 when
    a count is 1; by thread when there are fewer than 4 per thread), and a chunk takes 2x2 mmla steps
    only if both counts and both of its ranges are even: 16 tokens do, 18 (two chunks of 9) do not."""
    cpu = profiles.resolve(cpu)
    if tname not in cpu.vec_dot_nrows or n_rows % 2 or n_act % 2:
        return 1
    size = 64 if n_rows == 1 or n_act == 1 else 16
    nc0, nc1 = -(-n_rows // size), -(-n_act // size)
    if nc0 * nc1 < n_threads * 4:
        nc0, nc1 = (n_threads, 1) if n_rows > n_act else (1, n_threads)
    d0, d1 = -(-n_rows // nc0), -(-n_act // nc1)
    out = np.ones((n_act, n_rows), np.int8)
    for i0 in range(0, n_rows, d0):
        for i1 in range(0, n_act, d1):
            e0, e1 = min(i0 + d0, n_rows), min(i1 + d1, n_act)
            if (e0 - i0) % 2 == 0 and (e1 - i1) % 2 == 0:
                out[i1:e1, i0:e0] = 2
    return out


def traits_for(cpu) -> dict[str, CPUTraits]:
    """The vec_dot table of the profile's build (only the types llmlab reproduces exactly)."""
    return QUANT_KERNELS[profiles.resolve(cpu).quant_kernels]


def vec_dot_type(qtype) -> str:
    t = ggml_type(qtype)
    if t.name not in TYPE_TRAITS_CPU:
        raise QuantError(f"ggml type {t.name} has no CPU dot product in llmlab")
    return TYPE_TRAITS_CPU[t.name].vec_dot_type


def weight_blocks(weight_raw, t, n: int) -> np.ndarray:
    """The weight's structured blocks as (R, n / block_size), with clear errors."""
    if n % t.block_size:
        raise QuantError(f"{t.name}: row length {n} is not a multiple of the block size {t.block_size}")
    w = blocks_of(weight_raw, t)
    if w.size % (n // t.block_size):
        raise QuantError(f"{t.name}: weight of {w.size} blocks does not hold rows of {n} values")
    return w.reshape(-1, n // t.block_size)


def mul_mat(weight_raw, qtype, x: np.ndarray, cpu=None) -> np.ndarray:
    """ggml-cpu's plain ``mul_mat`` for a quantized weight (one vec_dot per output): ``W @ x^T`` as (T, R).

    weight_raw: the raw bytes of a 2-D tensor, rows of ``n`` values (uint8 (R, row_bytes)
    or a flat buffer, or structured blocks (R, nb)); x: float32 activations (T, n) or (n,).
    """
    t = ggml_type(qtype)
    cpu = profiles.resolve(cpu)
    table = traits_for(cpu)
    if t.name not in table:
        raise QuantError(f"ggml type {t.name} has no CPU dot product in llmlab for {cpu.name}")
    traits = table[t.name]
    x = np.asarray(x, float32)
    squeeze = x.ndim == 1
    x2 = x.reshape(-1, x.shape[-1])
    w = weight_blocks(weight_raw, t, x2.shape[-1])
    a = quantize_activations(x2, traits.vec_dot_type, cpu)
    out = np.empty((len(x2), len(w)), float32)
    rows = vec_dot_rows(cpu, t.name, len(w), len(x2))
    for r0 in range(0, len(w), ROW_CHUNK):
        out[:, r0:r0 + ROW_CHUNK] = traits.vec_dot(w[r0:r0 + ROW_CHUNK], a, cpu)
        if np.any(rows == 2):
            mm = np.broadcast_to(rows, out.shape)[:, r0:r0 + ROW_CHUNK] == 2
            out[:, r0:r0 + ROW_CHUNK][mm] = MMLA_VEC_DOT[t.name](w[r0:r0 + ROW_CHUNK], a, cpu)[mm]
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
    dw, mw, da, s = (float(float32(v)) for v in (w["d"][0], w["m"][0], a["d"][0], a["s"][0]))
    deq = L.dequantize_q5_1(w) if t == "q5_1" else L.dequantize_q4_1(w)
    return {"sum_qp": int(q @ p), "sum_p": int(p.sum()), "d_w": dw, "m_w": mw, "d_a": da, "s_a": s,
            "scale_term": float(float32(dw * da) * float32(q @ p)), "min_term": float(float32(mw * s)),
            "min_term_from_codes": mw * da * int(p.sum()),
            "dequantized_dot": float(deq[0].astype(float64) @ L.dequantize_q8_0(a)[0].astype(float64))}
