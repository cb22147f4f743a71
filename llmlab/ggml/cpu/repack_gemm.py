"""ggml-cpu's REPACK kernels (repack.cpp, arch/x86/repack.cpp, arch/arm/repack.cpp): the gemv/gemm that
multiply weights llama.cpp moved into the ``CPU_REPACK`` buffer at load time.

llama.cpp's default CPU build moves some weights into the ``CPU_REPACK`` buffer type when it loads
a model (``ggml_repack_get_optimal_repack_type``): on x86, q4_0, q4_K, iq4_nl and mxfp4 with AVX2,
q2_K only with AVX-512, each when the row count is a multiple of 8 (the profile's
``repack_types``). Their products then never see the plain kernels.

:func:`mul_mat_q4_k_repacked` (``ggml_gemv/gemm_q4_K_8x8_q8_K``) keeps one super-block's integer dot
per output in one lane: ``acc = fma(isum, d_w*d_x, acc)`` and ``acc_min = fma(imins, dmin_w*d_x,
acc_min)``, result ``acc - acc_min``; the 512-bit and 256-bit variants take the same steps. The
kernel choice (``ops.quantized_kernel``) reads :data:`REPACKED_MUL_MAT`; the teaching plug-in is
``repack.RepackPlugin``.

The ARM builds repack other types to other layouts (the profile's ``repack_layouts``), each with its
own float steps: q8_0 as 4x4 (dotprod) or 4x8 (i8mm), q4_K and q6_K as 8x4 (dotprod) or 8x8 (i8mm,
``repack.make_block_q4_Kx8``). The integer sums are exact whatever the layout; only where the float
rounding happens (per 32 values, per 64, per super-block; fused or not) tells the kernels apart.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
from numpy import float32, float64

from .quants import quantize_activations, weight_blocks
from .simd import fma64

ROW_CHUNK = 4096


def _q4_k_rows(ws: np.ndarray):
    """A chunk of q4_K weight rows (n, nb) unpacked once for every q4_K kernel: the codes times their
    6-bit sub-block scales (n, nb, 8, 32) and the sub-block mins (n, nb, 8), both exact in float64,
    and the super-block ``d`` and ``dmin`` as float32."""
    from ..quant import k_quants as K
    n, nb = ws.shape
    flat = ws.reshape(-1)
    sc, mn = K.scale_min_k4(flat["scales"])
    W = K.q4k_codes(flat["qs"]).astype(np.int32).reshape(n * nb, 8, 32) * sc[:, :, None].astype(np.int32)
    return (W.reshape(n, nb, 8, 32).astype(float64), mn.astype(float64).reshape(n, nb, 8),
            ws["d"].astype(float32), ws["dmin"].astype(float32))


def _q8_k_inputs(raw: np.ndarray, qtype, x: np.ndarray, cpu, sub: int):
    """What the q4_K REPACK kernels read: the weight blocks, and the q8_K activations as codes in groups of
    ``sub`` (T, nb, 256 / sub, sub), their scales, and their block sums of 32 (T, nb, 8), exact in float64."""
    x = np.asarray(x, float32).reshape(-1, x.shape[-1])
    w = weight_blocks(raw, qtype, x.shape[1])
    a = quantize_activations(x, "q8_K", cpu)
    T, nb = a.shape[0], w.shape[1]
    bs32 = a["bsums"].astype(np.int64).reshape(T, nb, 8, 2).sum(-1).astype(float64)
    return w, a["qs"].astype(float64).reshape(T, nb, 256 // sub, sub), a["d"].astype(float32), bs32


def mul_mat_q4_k_repacked(raw: np.ndarray, qtype, x: np.ndarray, cpu=None) -> np.ndarray:
    """Activation rows in groups of 4 go through the gemm kernel, which adds the integer sums of each
    pair of sub-blocks (64 values) into the float accumulators separately; the rows left over go
    through the gemv kernel, which adds a whole super-block at once."""
    w, qa, ya, bs32 = _q8_k_inputs(raw, qtype, x, None, 64)               # x86's q8_K quantizer
    (T, nb), R = qa.shape[:2], w.shape[0]
    n_gemm = T - T % 4
    bs = bs32.reshape(T, nb, 4, 2)                                       # two 32-sums per 64 values
    out = np.empty((T, R), float32)
    for r0 in range(0, R, ROW_CHUNK):
        ws = w[r0:r0 + ROW_CHUNK]
        n = len(ws)
        W, mn, dw, dmin = _q4_k_rows(ws)
        W = W.reshape(n, nb, 4, 64)
        mins = mn.reshape(n, nb, 4, 2)
        acc = np.zeros((T, n), float64)
        accm = np.zeros((T, n), float64)
        for b in range(nb):
            isub = np.einsum("tsk,rsk->trs", qa[:, b], W[:, b])              # (T, n, 4) exact
            imsub = np.einsum("tsk,rsk->trs", bs[:, b], mins[:, b])
            d = (dw[None, :, b] * ya[:, b, None]).astype(float32).astype(float64)
            dm = (dmin[None, :, b] * ya[:, b, None]).astype(float32).astype(float64)
            g = slice(0, n_gemm)
            for sb in range(4):                                              # gemm: one fma per 64 values
                acc[g] = fma64(isub[g, :, sb], d[g], acc[g])
                accm[g] = fma64(imsub[g, :, sb], dm[g], accm[g])
            v = slice(n_gemm, T)                                             # gemv: one fma per super-block
            acc[v] = fma64(isub[v].sum(-1), d[v], acc[v])
            accm[v] = fma64(imsub[v].sum(-1), dm[v], accm[v])
        out[:, r0:r0 + n] = (acc.astype(float32) - accm.astype(float32)).astype(float32)
    return out


def mul_mat_q8_0_4x4(raw: np.ndarray, qtype, x: np.ndarray, cpu=None) -> np.ndarray:
    """arch/arm/repack.cpp ``ggml_gemv/gemm_q8_0_4x4_q8_0`` (NEON dotprod): per output and block, the
    32-product integer dot (vdotq_laneq_s32, exact) times d_x*d_w; gemv fuses it into the accumulator
    (vfmaq_f32), gemm, for activation rows in groups of 4, multiplies then adds (vmlaq_f32: fmul + fadd)."""
    return _mul_mat_q8_0_arm(raw, qtype, x, cpu, fused_gemm=False)


def mul_mat_q8_0_4x8(raw: np.ndarray, qtype, x: np.ndarray, cpu=None) -> np.ndarray:
    """arch/arm/repack.cpp ``ggml_gemv/gemm_q8_0_4x8_q8_0`` (MATMUL_INT8): per output and block the
    integer dot (vdotq_s32 in gemv, vmmlaq_s32 in gemm, exact) and ``acc = fma((float) isum, d_x*d_w,
    acc)`` in both (vfmaq_f32): the 4x4 gemm's separate multiply and add are gone."""
    return _mul_mat_q8_0_arm(raw, qtype, x, cpu, fused_gemm=True)


def _mul_mat_q8_0_arm(raw, qtype, x, cpu, fused_gemm: bool) -> np.ndarray:
    """The ARM q8_0 REPACK kernels: one float step per output and block, fused (gemv, and gemm where
    ``fused_gemm``) or a multiply then an add (the 4x4 gemm's activation rows in groups of 4)."""
    x = np.asarray(x, float32).reshape(-1, x.shape[-1])
    w = weight_blocks(raw, qtype, x.shape[1])
    a = quantize_activations(x, "q8_0", cpu)
    T, nb = a.shape
    n_gemm = 0 if fused_gemm else T - T % 4                               # rows that multiply, then add
    qa = a["qs"].astype(float64)                                          # (T, nb, 32)
    da = a["d"].astype(float32)
    out = np.empty((T, len(w)), float32)
    for r0 in range(0, len(w), ROW_CHUNK):
        ws = w[r0:r0 + ROW_CHUNK]
        qw, dw = ws["qs"].astype(float64), ws["d"].astype(float32)
        acc = np.zeros((T, len(ws)), float32)
        for b in range(nb):
            isum = (qa[:, b] @ qw[:, b].T).astype(float32)                  # (T, n) exact
            d = (da[:, b, None] * dw[None, :, b]).astype(float32)
            acc[:n_gemm] = (acc[:n_gemm] + (d[:n_gemm] * isum[:n_gemm]).astype(float32)).astype(float32)
            acc[n_gemm:] = fma64(isum[n_gemm:].astype(float64), d[n_gemm:], acc[n_gemm:])
        out[:, r0:r0 + len(ws)] = acc
    return out


def mul_mat_q4_k_8x4(raw: np.ndarray, qtype, x: np.ndarray, cpu=None) -> np.ndarray:
    """arch/arm/repack.cpp ``ggml_gemv/gemm_q4_K_8x4_q8_K`` (NEON dotprod; gemv and gemm take the same
    float steps): per 64 values (two sub-blocks) the integer sum sc_lo*dot_lo + sc_hi*dot_hi goes into
    ONE accumulator, ``acc = fma(d_w*d_x, (float) isum, acc)``; after the super-block the min terms,
    summed as integers, come off the same accumulator: ``acc -= (float) bias * (dmin_w*d_x)``
    (vmlsq_f32: fmul + fsub). x86's 8x8 kernel keeps a second accumulator for the mins instead."""
    w, qa, ya, bs32 = _q8_k_inputs(raw, qtype, x, cpu, 64)
    (T, nb), R = qa.shape[:2], w.shape[0]
    out = np.empty((T, R), float32)
    for r0 in range(0, R, ROW_CHUNK):
        ws = w[r0:r0 + ROW_CHUNK]
        n = len(ws)
        W, mins, dw, dmin = _q4_k_rows(ws)
        W = W.reshape(n, nb, 4, 64)
        acc = np.zeros((T, n), float32)
        for b in range(nb):
            isub = np.einsum("tsk,rsk->trs", qa[:, b], W[:, b]).astype(float32)      # (T, n, 4) exact
            bias = np.einsum("tj,rj->tr", bs32[:, b], mins[:, b]).astype(float32)
            d = (dw[None, :, b] * ya[:, b, None]).astype(float32)
            dm = (dmin[None, :, b] * ya[:, b, None]).astype(float32)
            for sb in range(4):
                acc = fma64(isub[:, :, sb].astype(float64), d, acc)
            acc = (acc - (bias * dm).astype(float32)).astype(float32)
        out[:, r0:r0 + n] = acc
    return out


def _mul_mat_q6_k(raw: np.ndarray, qtype, x: np.ndarray, cpu, fused_gemv: bool) -> np.ndarray:
    """The q6_K REPACK kernels of arch/arm/repack.cpp: the whole super-block's integer dot (codes minus
    32, each 16 values times its scale) in one int32, then ONE float step per super-block,
    ``acc += (float) isum * (d_w*d_x)``; gemm (rows in groups of 4) multiplies then adds, gemv fuses
    the two where ``fused_gemv``."""
    from ..quant import k_quants as K
    x = np.asarray(x, float32).reshape(-1, x.shape[-1])
    w = weight_blocks(raw, qtype, x.shape[1])
    a = quantize_activations(x, "q8_K", cpu)
    nb = w.shape[1]
    T, R = a.shape[0], w.shape[0]
    n_fma = T - T % 4 if fused_gemv else T
    qa = a["qs"].astype(float64)                                          # (T, nb, 256)
    ya = a["d"].astype(float32)
    out = np.empty((T, R), float32)
    for r0 in range(0, R, ROW_CHUNK):
        ws = w[r0:r0 + ROW_CHUNK]
        n = len(ws)
        flat = ws.reshape(-1)
        W = K.q6k_codes(flat).astype(np.int64).reshape(n, nb, 16, 16) * flat["scales"].astype(np.int64).reshape(n, nb, 16, 1)
        W = W.reshape(n, nb, 256).astype(float64)
        dw = ws["d"].astype(float32)
        acc = np.zeros((T, n), float32)
        for b in range(nb):
            isum = (qa[:, b] @ W[:, b].T).astype(float32)                   # exact int, one cvt rounding
            d = (dw[None, :, b] * ya[:, b, None]).astype(float32)
            acc[:n_fma] = (acc[:n_fma] + (isum[:n_fma] * d[:n_fma]).astype(float32)).astype(float32)
            acc[n_fma:] = fma64(isum[n_fma:].astype(float64), d[n_fma:], acc[n_fma:])
        out[:, r0:r0 + n] = acc
    return out


def mul_mat_q6_k_8x4(raw: np.ndarray, qtype, x: np.ndarray, cpu=None) -> np.ndarray:
    """arch/arm/repack.cpp ``ggml_gemv/gemm_q6_K_8x4_q8_K`` (NEON dotprod): one float step per
    super-block, fused in gemv (the compiler contracts vmulq_f32 + vaddq_f32 into fmla), not in gemm
    (vmlaq_f32: fmul + fadd)."""
    return _mul_mat_q6_k(raw, qtype, x, cpu, fused_gemv=True)


def mul_mat_q6_k_8x8_i8mm(raw: np.ndarray, qtype, x: np.ndarray, cpu=None) -> np.ndarray:
    """arch/arm/repack.cpp ``ggml_gemv_q6_K_8x8_q8_K`` (dotprod) and ``ggml_gemm_q6_K_8x8_q8_K``
    (MATMUL_INT8: vmmlaq_s32 on 2 activation rows x 2 weight rows): the same integer super-block sums as
    8x4, and neither float step fused: gemv multiplies two lanes (vmul_f32), joins them (vcombine) and
    adds (vaddq_f32); gemm's vmlaq_f32 is fmul + fadd (GCC 12, checked in the oracle's machine code)."""
    return _mul_mat_q6_k(raw, qtype, x, cpu, fused_gemv=False)


def mul_mat_q4_k_8x8_i8mm(raw: np.ndarray, qtype, x: np.ndarray, cpu=None) -> np.ndarray:
    """arch/arm/repack.cpp ``ggml_gemv_q4_K_8x8_q8_K`` (dotprod) and ``ggml_gemm_q4_K_8x8_q8_K``
    (MATMUL_INT8). ONE accumulator per output, the mins' integer sum (bsums of 32 times mins) taken off
    it once per super-block as ``acc -= (float) bias * (dmin_w*d_x)`` (fmul + fsub), but the scaled
    integer dots go in at different grains:

    - gemv (the rows left over): each sub-block of 32 on its own, ``acc = fma(d_w*d_x, (float)
      (sc*dot), acc)`` (vfmaq_f32), eight per super-block, then the mins;
    - gemm (rows in groups of 4, vmmlaq_s32 tiles): the whole super-block's ``sum sc*dot`` in int32,
      then ``acc = (acc - (float) bias * dmin) + (float) isum * d``: mins first, nothing fused
      (vmlsq_f32 and vmlaq_f32 are fmul + fsub/fadd with GCC 12, checked in the oracle's machine code).
    """
    w, qa, ya, bs32 = _q8_k_inputs(raw, qtype, x, cpu, 32)
    (T, nb), R = qa.shape[:2], w.shape[0]
    g, v = slice(0, T - T % 4), slice(T - T % 4, T)
    out = np.empty((T, R), float32)
    for r0 in range(0, R, ROW_CHUNK):
        ws = w[r0:r0 + ROW_CHUNK]
        n = len(ws)
        W, mins, dw, dmin = _q4_k_rows(ws)
        acc = np.zeros((T, n), float32)
        for b in range(nb):
            isub = np.einsum("tsk,rsk->trs", qa[:, b], W[:, b])                       # (T, n, 8) exact
            bias = np.einsum("tj,rj->tr", bs32[:, b], mins[:, b]).astype(float32)
            d = (dw[None, :, b] * ya[:, b, None]).astype(float32)
            dm = (dmin[None, :, b] * ya[:, b, None]).astype(float32)
            mins_term = (bias * dm).astype(float32)
            for j in range(8):                                                         # gemv: per 32 values
                acc[v] = fma64(isub[v, :, j], d[v], acc[v])
            acc[v] = (acc[v] - mins_term[v]).astype(float32)
            isum = isub[g].sum(-1).astype(float32)                                     # gemm: per super-block
            acc[g] = ((acc[g] - mins_term[g]).astype(float32) + (isum * d[g]).astype(float32)).astype(float32)
        out[:, r0:r0 + n] = acc
    return out


def mul_mat_q4_0_8x8(raw: np.ndarray, qtype, x: np.ndarray, cpu=None) -> np.ndarray:
    """arch/x86/repack.cpp ``ggml_gemv/gemm_q4_0_8x8_q8_0`` (``gemv/gemm_q4_b32_8x8_q8_0_lut_avx``, AVX2 and
    AVX-512 alike): each output keeps one lane; block after block its 32-product integer dot (nibbles
    sign-extended through a table, exact) goes in as ``acc = fma((float) isum, d_w*d_x, acc)``, and the
    lane is the result: no horizontal sum, unlike ``ggml_vec_dot_q4_0_q8_0``'s 8 lanes and hsum."""
    from .quants import codes_q4_0
    x = np.asarray(x, float32).reshape(-1, x.shape[-1])
    w = weight_blocks(raw, qtype, x.shape[1])                      # (R, nb)
    a = quantize_activations(x, "q8_0", cpu)                       # (T, nb)
    xq = a["qs"].astype(np.int32)                                  # (T, nb, 32)
    xd = a["d"].astype(float32)
    out = np.empty((x.shape[0], w.shape[0]), float32)
    for r0 in range(0, w.shape[0], ROW_CHUNK):
        wc = w[r0:r0 + ROW_CHUNK]
        isum = np.einsum("rbk,tbk->btr", codes_q4_0(wc).astype(np.int32), xq).astype(float32)   # exact ints
        dd = (wc["d"].astype(float32).T[:, None, :] * xd.T[:, :, None]).astype(float32)       # (nb, T, r)
        acc = np.zeros((x.shape[0], wc.shape[0]), float32)
        for b in range(wc.shape[1]):
            acc = fma64(isum[b].astype(float64), dd[b], acc)
        out[:, r0:r0 + wc.shape[0]] = acc
    return out


# REPACK layouts (the profile's ``repack_layouts``) whose kernels llmlab reproduces; the others fall back
# to the vec_dot order
REPACKED_MUL_MAT: dict[str, Callable] = {"q4_K_8x8": mul_mat_q4_k_repacked, "q8_0_4x4": mul_mat_q8_0_4x4,
                                         "q4_0_8x8": mul_mat_q4_0_8x8,
                                         "q4_K_8x4": mul_mat_q4_k_8x4, "q6_K_8x4": mul_mat_q6_k_8x4,
                                         "q8_0_4x8": mul_mat_q8_0_4x8, "q4_K_8x8_i8mm": mul_mat_q4_k_8x8_i8mm,
                                         "q6_K_8x8_i8mm": mul_mat_q6_k_8x8_i8mm}
