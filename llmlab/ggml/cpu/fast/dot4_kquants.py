"""q4_K (in the REPACK buffer) and q6_K (vec_dot and tiled) by byte dot products: each sub-block's
integer dot is a few accumulating ``dot4_ir.dot4`` calls for 16 rows; the float steps are those of
``repack.mul_mat_q4_k_repacked``, ``quants.vec_dot_q6_k`` and ``tiled.mul_mat_q6_k_tiled``. Layouts:
``dot4_pack.pack_q4_k`` / ``pack_q6_k``. Compiled once per instruction set (``dot4.KERNELS``)."""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from ._common import NOPYTHON, _get_num_threads, as_f32, fma, hsum8, limit_threads, restore_threads
from .dot4_ir import I32, I8x64, I32x16, block_words_at, data, dot4, vload, vstore
from .quants import pair_sums
from .quantize import quantize_q8_k as _q8_k
from .repack import repack_step


@njit(inline="always", **NOPYTHON)
def _q8_k_words(x):
    """x (T, K) float32 -> q8_K activations: the codes four to an int32 word, the scales, the block sums."""
    aq, ad, bsums = _q8_k(x)
    return aq.view(np.int32), ad, bsums


# ---- q4_K in the REPACK buffer: ggml_gemv / ggml_gemm_q4_K_8x8_q8_K --------------------------------

def _q4_k_dots(isa: str):
    """D[c] = the 16 rows' integer dots of sub-block c (32 values) of one q4_K super-block with the
    activations: blk (2048 bytes: chunk 8j + q holds, per row, the 4 bytes 32j+4q .. 32j+4q+3, whose
    low nibbles are values 64j+4q.. of sub-block 2j and high nibbles those of sub-block 2j+1);
    a[w0:w0+64] the 256 int8 activations as words. 8 accumulating byte dots per sub-block. Called as
    (qs, g, b, aq4, t, w0, D): blk = qs[g, b] and a = aq4[t], addressed here (no views per block)."""
    def typer(typingctx, qs, g, b, aq4, t, w0, D):
        def codegen(context, builder, signature, args):
            bp, ap, word = block_words_at(context, builder, signature, args)
            dp = data(context, builder, signature.args[6], args[6], I32)
            for j in range(4):
                lo_acc = hi_acc = ir.Constant(I32x16, [0] * 16)
                for q in range(8):
                    v = vload(builder, bp, ir.Constant(I32, 64 * (8 * j + q)), I8x64)
                    lo = builder.and_(v, ir.Constant(I8x64, [15] * 64))
                    hi = builder.lshr(v, ir.Constant(I8x64, [4] * 64))
                    lo_acc = dot4(builder, isa, lo_acc, lo, word(ap, 16 * j + q))
                    hi_acc = dot4(builder, isa, hi_acc, hi, word(ap, 16 * j + 8 + q))
                vstore(builder, dp, ir.Constant(I32, 16 * (2 * j)), lo_acc)
                vstore(builder, dp, ir.Constant(I32, 16 * (2 * j + 1)), hi_acc)
            return context.get_dummy_value()
        return types.none(qs, g, b, aq4, t, w0, D), codegen
    typer.__name__ = f"q4_k_dots_{isa}"
    return intrinsic(typer)


q4_k_dots_vnni = _q4_k_dots("vnni")
q4_k_dots_avx2 = _q4_k_dots("avx2")


@njit(inline="always", **NOPYTHON)
def _mul_mat_q4_k(qs, sc, mn, d, dmin, x, out, dots):
    """ggml's REPACK q4_K kernels as ``repack.mul_mat_q4_k_repacked`` computes them (rows in groups of
    4: gemm, one fma per 64 values; the rest: gemv, one per super-block; result acc - acc_m), the
    sub-block dots by ``dots`` (q4_k_dots_vnni or _avx2, fixed per entry point).
    qs (ng, nb, 2048) uint8; sc, mn (ng, nb, 8, 16) uint8; d, dmin
    (ng, nb, 16) f16 bits; x (T, K) float32, quantized here to q8_K; out (T, R) float32."""
    ng, nb = qs.shape[0], qs.shape[1]
    nr = d.shape[2]
    R = out.shape[1]
    aq4, ad, bsums = _q8_k_words(x)
    T = aq4.shape[0]
    n_gemm = T - T % 4
    nch = min(ng, _get_num_threads())            # one task per thread, contiguous groups (as dot4_legacy)
    for c in prange(nch):
        D = np.empty((8, nr), np.int32)
        acc = np.empty((T, nr), np.float32)
        accm = np.empty((T, nr), np.float32)
        for g in range(c * ng // nch, (c + 1) * ng // nch):
            for t in range(T):
                for r in range(nr):
                    acc[t, r] = 0
                    accm[t, r] = 0
            for b in range(nb):
                s_, m_ = sc[g, b], mn[g, b]
                for t in range(T):
                    dots(qs, g, b, aq4, t, 64 * b, D)
                    ya = ad[t, b]
                    p = pair_sums(bsums, t, 16 * b)
                    gemm = t < n_gemm
                    for r in range(nr):
                        acc[t, r], accm[t, r] = repack_step(acc[t, r], accm[t, r], s_, m_, D, p, r,
                                                            as_f32(d[g, b, r]) * ya, as_f32(dmin[g, b, r]) * ya, gemm)
            n = min(nr, R - g * nr)
            for t in range(T):
                for r in range(n):
                    out[t, g * nr + r] = acc[t, r] - accm[t, r]


# out (T, R) = x (T, K) times a packed q4_K weight in the REPACK buffer; row groups on at most n_threads.

@njit(parallel=True, **NOPYTHON)
def mul_mat_q4_k_vnni(qs, sc, mn, d, dmin, x, out, n_threads):
    prev = limit_threads(n_threads)
    _mul_mat_q4_k(qs, sc, mn, d, dmin, x, out, q4_k_dots_vnni)
    restore_threads(prev)


@njit(parallel=True, **NOPYTHON)
def mul_mat_q4_k_avx2(qs, sc, mn, d, dmin, x, out, n_threads):
    prev = limit_threads(n_threads)
    _mul_mat_q4_k(qs, sc, mn, d, dmin, x, out, q4_k_dots_avx2)
    restore_threads(prev)


# ---- q6_K: ggml_vec_dot_q6_K_q8_K (below 8 activation rows) and the tiled kernel (from 8 on) ----------

def _q6_k_dots(isa: str, per: int):
    """The 16 rows' dots of a q6_K super-block with the activations, ``per`` quads added into each
    output: per = 1 gives Q[8c + u], quad u (values 32c+4u .. 32c+4u+3) of chunk c (vec_dot's lanes);
    per = 4 gives D[s], the 16-value sub-block s (the tiled kernel's). blk (4096 bytes, chunk 8c + u: the
    unsigned 6-bit codes, 4 per row); a[w0:w0+64] the 256 int8 activations as words; out (64 / per, 16)
    int32. Called as (qs, g, b, aq4, t, w0, out): blk = qs[g, b], a = aq4[t], addressed here."""
    def typer(typingctx, qs, g, b, aq4, t, w0, out):
        def codegen(context, builder, signature, args):
            bp, ap, word = block_words_at(context, builder, signature, args)
            op = data(context, builder, signature.args[6], args[6], I32)
            for o in range(64 // per):
                acc = ir.Constant(I32x16, [0] * 16)
                for j in range(per * o, per * o + per):
                    v = vload(builder, bp, ir.Constant(I32, 64 * j), I8x64)
                    acc = dot4(builder, isa, acc, v, word(ap, j))
                vstore(builder, op, ir.Constant(I32, 16 * o), acc)
            return context.get_dummy_value()
        return types.none(qs, g, b, aq4, t, w0, out), codegen
    typer.__name__ = f"q6_k_dots_{per}_{isa}"
    return intrinsic(typer)


q6_k_quads_vnni, q6_k_subs_vnni = _q6_k_dots("vnni", 1), _q6_k_dots("vnni", 4)
q6_k_quads_avx2, q6_k_subs_avx2 = _q6_k_dots("avx2", 1), _q6_k_dots("avx2", 4)


@njit(inline="always", **NOPYTHON)
def _mul_mat_q6_k(qs, sc, d, x, out, quads, subs, tiled):
    """ggml's q6_K products as ``quants.vec_dot_q6_k`` (vec_dot: 8 int32 lanes, lane u the scaled quads
    u of every 32-value chunk minus 32 x scales . block sums, acc_u = fma(d_x d_w, lane, acc_u), hsum)
    and ``tiled.mul_mat_q6_k_tiled`` (one float step per super-block) compute them, the quads by
    ``quads`` (or, tiled, the sub-block dots by ``subs``). qs (ng, nb, 4096) uint8; sc (ng, nb, 16, 16) int8;
    d (ng, nb, 16) f16 bits."""
    ng, nb = qs.shape[0], qs.shape[1]
    nr = d.shape[2]
    R = out.shape[1]
    aq4, ad, bsums = _q8_k_words(x)
    T = aq4.shape[0]
    nch = min(ng, _get_num_threads())            # one task per thread, contiguous groups (as dot4_legacy);
    for ch in prange(nch):                       # scalars indexed in place: no views per block
        Q = np.empty((64, nr), np.int32)
        L = np.empty((8, nr), np.int32)
        acc = np.empty((T, 8, nr), np.float32)
        for g in range(ch * ng // nch, (ch + 1) * ng // nch):
            for t in range(T):
                for u in range(8):
                    for r in range(nr):
                        acc[t, u, r] = 0
            for b in range(nb):
                for t in range(T):
                    ya = ad[t, b]
                    k = 16 * b
                    if tiled:
                        subs(qs, g, b, aq4, t, 64 * b, Q)  # Q[:16]: the 16 sub-block dots
                        for r in range(nr):                # per row: sum over the 16 sub-blocks of
                            L[0, r] = 0                    # scale x (dot - 32 x block sum), in int32
                        for sb in range(16):
                            bs = np.int32(32 * np.int32(bsums[t, k + sb]))
                            for r in range(nr):
                                L[0, r] = np.int32(L[0, r] + np.int32(np.int32(sc[g, b, sb, r]) * np.int32(Q[sb, r] - bs)))
                        for r in range(nr):
                            acc[t, 0, r] = fma(as_f32(d[g, b, r]) * np.float32(L[0, r]), ya, acc[t, 0, r])
                    else:
                        quads(qs, g, b, aq4, t, 64 * b, Q)
                        for u in range(8):                 # chunk c: lanes 0-3 take scale 2c, lanes 4-7 scale 2c+1
                            h = u >> 2
                            for r in range(nr):
                                L[u, r] = np.int32(np.int32(sc[g, b, h, r]) * Q[u, r])
                            for c in range(1, 8):
                                for r in range(nr):
                                    L[u, r] = np.int32(L[u, r] + np.int32(np.int32(sc[g, b, 2 * c + h, r]) * Q[8 * c + u, r]))
                            b0, b1 = np.int32(bsums[t, k + 2 * u]), np.int32(bsums[t, k + 2 * u + 1])
                            for r in range(nr):
                                L[u, r] = np.int32(L[u, r] - np.int32(32 * np.int32(np.int32(np.int32(sc[g, b, 2 * u, r]) * b0)
                                                                                   + np.int32(np.int32(sc[g, b, 2 * u + 1, r]) * b1))))
                        for u in range(8):
                            for r in range(nr):
                                acc[t, u, r] = fma(ya * as_f32(d[g, b, r]), L[u, r], acc[t, u, r])
            n = min(nr, R - g * nr)
            for t in range(T):
                for r in range(n):
                    out[t, g * nr + r] = acc[t, 0, r] if tiled else hsum8(
                        acc[t, 0, r], acc[t, 1, r], acc[t, 2, r], acc[t, 3, r], acc[t, 4, r], acc[t, 5, r], acc[t, 6, r], acc[t, 7, r])


@njit(parallel=True, **NOPYTHON)
def mul_mat_q6_k_vnni(qs, sc, d, x, out, tiled, n_threads):
    prev = limit_threads(n_threads)
    _mul_mat_q6_k(qs, sc, d, x, out, q6_k_quads_vnni, q6_k_subs_vnni, tiled)
    restore_threads(prev)


@njit(parallel=True, **NOPYTHON)
def mul_mat_q6_k_avx2(qs, sc, d, x, out, tiled, n_threads):
    prev = limit_threads(n_threads)
    _mul_mat_q6_k(qs, sc, d, x, out, q6_k_quads_avx2, q6_k_subs_avx2, tiled)
    restore_threads(prev)
