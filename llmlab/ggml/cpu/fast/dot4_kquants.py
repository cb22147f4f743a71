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
from .dot4_ir import (I8, I16, I32, I8x64, I32x16, F32x16, at, block_words_at, data, dot4, dot4_scaled, f16x16,
                      intrinsic_fn, splat, vload, vstore)
from .dot4_ir import fetch_add
from .dot4_legacy import chunking
from .quants import pair_sums
from .quantize import quantize_q8_k as _q8_k
from .repack import repack_step


@njit(inline="always", **NOPYTHON)
def _q8_k_words(x):
    """x (T, K) float32 -> q8_K activations: the codes four to an int32 word, the scales, the block sums."""
    aq, ad, bsums = _q8_k(x)
    return aq.view(np.int32), ad, bsums


# ---- q4_K in the REPACK buffer: ggml_gemv / ggml_gemm_q4_K_8x8_q8_K --------------------------------

def _q8_k_block(context, builder, aq4, bsums, ti, b):
    """In a super-block step's codegen: ``word(j)``, int32 word j of activation row t's q8_K codes of
    block b (64 words a block), and ``bsum(j)``, that block's j-th sum of 16 codes as int32. aq4, bsums,
    ti, b: (value, numba type) pairs."""
    ap = at(context, builder, aq4[1], aq4[0], [ti], I32)
    bsp = at(context, builder, bsums[1], bsums[0], [ti], I16)
    intp = context.get_value_type(types.intp)
    bidx = context.cast(builder, b[0], b[1], types.intp)
    w0 = builder.mul(bidx, ir.Constant(intp, 64))
    k0 = builder.mul(bidx, ir.Constant(intp, 16))
    word = lambda j: builder.load(builder.gep(ap, [builder.add(w0, ir.Constant(intp, j))]))
    bsum = lambda j: builder.sext(builder.load(builder.gep(bsp, [builder.add(k0, ir.Constant(intp, j))])), I32)
    return word, bsum


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


def _q4_k_gemv(isa: str):
    """One q4_K super-block of 16 rows against activation row t as ggml's gemv kernel adds it, in
    registers: isum = the sum over the 8 sub-blocks of scale x dot (the scales applied in the byte dots,
    ``dot4_ir.dot4_scaled``; integers, exact in any order), imins = the mins . the pair sums of the q8_K
    block sums, then acc[t] = fma(isum, d_w d_x, acc[t]) and acc_m[t] = fma(imins, dmin_w d_x, acc_m[t])
    (``repack.repack_step`` with gemm False). blk as ``_q4_k_dots``; sc, mn: (8, 16) uint8 per block;
    d, dmin: f16 bits; acc, acc_m (T, 16) float32. Called as (qs, sc, mn, d, dmin, g, b, aq4, bsums, t,
    ya, acc, accm)."""
    def typer(typingctx, qs, sc, mn, d, dmin, g, b, aq4, bsums, t, ya, acc, accm):
        def codegen(context, builder, signature, args):
            ty = signature.args
            qs_, sc_, mn_, d_, dmin_, g_, b_, aq4_, bs_, t_, ya_, acc_, accm_ = args
            gi, bi, ti = (g_, ty[5]), (b_, ty[6]), (t_, ty[9])
            bp = at(context, builder, ty[0], qs_, [gi, bi], I8)
            sp = at(context, builder, ty[1], sc_, [gi, bi], I8)
            mp = at(context, builder, ty[2], mn_, [gi, bi], I8)
            word, bsum = _q8_k_block(context, builder, (aq4_, ty[7]), (bs_, ty[8]), ti, (b_, ty[6]))
            I8x16 = ir.VectorType(I8, 16)
            s16 = [builder.zext(vload(builder, sp, ir.Constant(I32, 16 * c), I8x16), ir.VectorType(I16, 16)) for c in range(8)]
            isum = ir.Constant(I32x16, [0] * 16)
            for j in range(4):
                for q in range(8):
                    v = vload(builder, bp, ir.Constant(I32, 64 * (8 * j + q)), I8x64)
                    lo = builder.and_(v, ir.Constant(I8x64, [15] * 64))
                    hi = builder.lshr(v, ir.Constant(I8x64, [4] * 64))
                    isum = dot4_scaled(builder, isa, isum, lo, word(16 * j + q), s16[2 * j])
                    isum = dot4_scaled(builder, isa, isum, hi, word(16 * j + 8 + q), s16[2 * j + 1])
            imin = ir.Constant(I32x16, [0] * 16)
            for c in range(8):
                m = builder.zext(vload(builder, mp, ir.Constant(I32, 16 * c), I8x16), I32x16)
                p = builder.add(bsum(2 * c), bsum(2 * c + 1))
                imin = builder.add(imin, builder.mul(m, splat(builder, p, I32x16)))
            fma = intrinsic_fn(builder, "llvm.fma.v16f32", F32x16, [F32x16] * 3)
            y = splat(builder, context.cast(builder, ya_, ty[10], types.float32), F32x16)
            dd = builder.fmul(f16x16(builder, at(context, builder, ty[3], d_, [gi, bi], I16)), y)
            dm = builder.fmul(f16x16(builder, at(context, builder, ty[4], dmin_, [gi, bi], I16)), y)
            for arr, tyi, val, scale in ((acc_, ty[11], isum, dd), (accm_, ty[12], imin, dm)):
                p = at(context, builder, tyi, arr, [ti], ir.FloatType())
                z = ir.Constant(I32, 0)
                vstore(builder, p, z, builder.call(fma, [builder.sitofp(val, F32x16), scale, vload(builder, p, z, F32x16)]))
            return context.get_dummy_value()
        return types.none(qs, sc, mn, d, dmin, g, b, aq4, bsums, t, ya, acc, accm), codegen
    typer.__name__ = f"q4_k_gemv_{isa}"
    return intrinsic(typer)


q4_k_gemv_vnni, q4_k_gemv_avx2 = _q4_k_gemv("vnni"), _q4_k_gemv("avx2")


@njit(inline="always", **NOPYTHON)
def _mul_mat_q4_k(qs, sc, mn, d, dmin, x, out, dots, gemv):
    """ggml's REPACK q4_K kernels as ``repack.mul_mat_q4_k_repacked`` computes them (rows in groups of
    4: gemm, one fma per 64 values; the rest: gemv, one per super-block; result acc - acc_m), the
    sub-block dots by ``dots`` (q4_k_dots_vnni or _avx2, fixed per entry point), a gemv row's whole
    super-block by ``gemv`` (q4_k_gemv_*).
    qs (ng, nb, 2048) uint8; sc, mn (ng, nb, 8, 16) uint8; d, dmin
    (ng, nb, 16) f16 bits; x (T, K) float32, quantized here to q8_K; out (T, R) float32."""
    ng, nb = qs.shape[0], qs.shape[1]
    nr = d.shape[2]
    R = out.shape[1]
    aq4, ad, bsums = _q8_k_words(x)
    T = aq4.shape[0]
    n_gemm = T - T % 4
    nch = min(ng, _get_num_threads())            # one task per thread, chunks of groups taken in turn
    size, n_chunks = chunking(ng, nch)           # (as dot4_legacy)
    turn = np.empty(1, np.int64)          # (np.zeros would be a parallel region of its own)
    turn[0] = 0
    for _c in prange(nch):
        D = np.empty((8, nr), np.int32)
        acc = np.empty((T, nr), np.float32)
        accm = np.empty((T, nr), np.float32)
        kc = fetch_add(turn, 1)
        while kc < n_chunks:
            for g in range(kc * size, min(ng, (kc + 1) * size)):
                for t in range(T):
                    for r in range(nr):
                        acc[t, r] = 0
                        accm[t, r] = 0
                for b in range(nb):
                    for t in range(n_gemm, T):                  # the gemv rows: in registers
                        gemv(qs, sc, mn, d, dmin, g, b, aq4, bsums, t, ad[t, b], acc, accm)
                    if n_gemm > 0:                              # the gemm rows (groups of 4)
                        s_, m_ = sc[g, b], mn[g, b]
                        for t in range(n_gemm):
                            dots(qs, g, b, aq4, t, 64 * b, D)
                            ya = ad[t, b]
                            p = pair_sums(bsums, t, 16 * b)
                            for r in range(nr):
                                acc[t, r], accm[t, r] = repack_step(acc[t, r], accm[t, r], s_, m_, D, p, r,
                                                                    as_f32(d[g, b, r]) * ya, as_f32(dmin[g, b, r]) * ya, True)
                n = min(nr, R - g * nr)
                for t in range(T):
                    for r in range(n):
                        out[t, g * nr + r] = acc[t, r] - accm[t, r]
            kc = fetch_add(turn, 1)


# out (T, R) = x (T, K) times a packed q4_K weight in the REPACK buffer; row groups on at most n_threads.

@njit(parallel=True, **NOPYTHON)
def mul_mat_q4_k_vnni(qs, sc, mn, d, dmin, x, out, n_threads):
    prev = limit_threads(n_threads)
    _mul_mat_q4_k(qs, sc, mn, d, dmin, x, out, q4_k_dots_vnni, q4_k_gemv_vnni)
    restore_threads(prev)


@njit(parallel=True, **NOPYTHON)
def mul_mat_q4_k_avx2(qs, sc, mn, d, dmin, x, out, n_threads):
    prev = limit_threads(n_threads)
    _mul_mat_q4_k(qs, sc, mn, d, dmin, x, out, q4_k_dots_avx2, q4_k_gemv_avx2)
    restore_threads(prev)


# ---- q6_K: ggml_vec_dot_q6_K_q8_K (below 8 activation rows) and the tiled kernel (from 8 on) ----------

def _q6_k_dots(isa: str, per: int):
    """The 16 rows' dots of a q6_K super-block with the activations, ``per`` quads added into each
    output: per = 4 gives D[s], the 16-value sub-block s (the tiled kernel's). blk (4096 bytes, chunk
    8u + c: quad u of 32-value chunk c, the unsigned 6-bit codes, 4 per row); a[w0:w0+64] the 256 int8
    activations as words; out (64 / per, 16) int32. Called as (qs, g, b, aq4, t, w0, out): blk = qs[g, b],
    a = aq4[t], addressed here."""
    def typer(typingctx, qs, g, b, aq4, t, w0, out):
        def codegen(context, builder, signature, args):
            bp, ap, word = block_words_at(context, builder, signature, args)
            op = data(context, builder, signature.args[6], args[6], I32)
            for o in range(64 // per):
                acc = ir.Constant(I32x16, [0] * 16)
                for j in range(per * o, per * o + per):         # quad j % 8 of chunk j // 8
                    v = vload(builder, bp, ir.Constant(I32, 64 * (8 * (j % 8) + j // 8)), I8x64)
                    acc = dot4(builder, isa, acc, v, word(ap, j))
                vstore(builder, op, ir.Constant(I32, 16 * o), acc)
            return context.get_dummy_value()
        return types.none(qs, g, b, aq4, t, w0, out), codegen
    typer.__name__ = f"q6_k_dots_{per}_{isa}"
    return intrinsic(typer)


q6_k_subs_vnni, q6_k_subs_avx2 = _q6_k_dots("vnni", 4), _q6_k_dots("avx2", 4)


def _q6_k_step(isa: str):
    """One q6_K super-block of 16 rows against activation row t, vec_dot's whole step in registers:
    the 8 int32 lanes with the scales applied in the byte dots (``dot4_ir.dot4_scaled``: lane u = the
    sum over the 32-value chunks c of sc[2c + u // 4] x quad u of chunk c, integers, exact in any order),
    minus 32 (sc[2u] bsum[2u] + sc[2u+1] bsum[2u+1]), then acc[t, u] = fma(d_x d_w, lane u, acc[t, u])
    across the rows. blk as ``_q6_k_dots``; sc[g, b]: (16, 16) int8 scales (sub-block, row); d[g, b]:
    the rows' f16 scales; bsums[t, 16b:16b+16] the q8_K block sums; acc (T, 8, 16) float32.
    Called as (qs, sc, d, g, b, aq4, bsums, t, ya, acc)."""
    def typer(typingctx, qs, sc, d, g, b, aq4, bsums, t, ya, acc):
        def codegen(context, builder, signature, args):
            ty = signature.args
            qs_, sc_, d_, g_, b_, aq4_, bs_, t_, ya_, acc_ = args
            gi, bi, ti = (g_, ty[3]), (b_, ty[4]), (t_, ty[7])
            bp = at(context, builder, ty[0], qs_, [gi, bi], I8)
            sp = at(context, builder, ty[1], sc_, [gi, bi], I8)
            word, bsum = _q8_k_block(context, builder, (aq4_, ty[5]), (bs_, ty[6]), ti, (b_, ty[4]))
            I8x16 = ir.VectorType(I8, 16)
            raw = [vload(builder, sp, ir.Constant(I32, 16 * s), I8x16) for s in range(16)]
            s16 = [builder.sext(v, ir.VectorType(I16, 16)) for v in raw]
            s32 = [builder.sext(v, I32x16) for v in raw]
            fma = intrinsic_fn(builder, "llvm.fma.v16f32", F32x16, [F32x16] * 3)
            dd = builder.fmul(splat(builder, context.cast(builder, ya_, ty[8], types.float32), F32x16),
                              f16x16(builder, at(context, builder, ty[2], d_, [gi, bi], I16)))
            accp = at(context, builder, ty[9], acc_, [ti], ir.FloatType())
            for u in range(8):
                lane = ir.Constant(I32x16, [0] * 16)
                for c in range(8):
                    v = vload(builder, bp, ir.Constant(I32, 64 * (8 * u + c)), I8x64)
                    lane = dot4_scaled(builder, isa, lane, v, word(8 * c + u), s16[2 * c + (u >> 2)])
                corr = builder.add(builder.mul(s32[2 * u], splat(builder, bsum(2 * u), I32x16)),
                                   builder.mul(s32[2 * u + 1], splat(builder, bsum(2 * u + 1), I32x16)))
                lane = builder.sub(lane, builder.shl(corr, ir.Constant(I32x16, [5] * 16)))
                idx = ir.Constant(I32, 16 * u)
                vstore(builder, accp, idx, builder.call(fma, [dd, builder.sitofp(lane, F32x16), vload(builder, accp, idx, F32x16)]))
            return context.get_dummy_value()
        return types.none(qs, sc, d, g, b, aq4, bsums, t, ya, acc), codegen
    typer.__name__ = f"q6_k_step_{isa}"
    return intrinsic(typer)


q6_k_step_vnni, q6_k_step_avx2 = _q6_k_step("vnni"), _q6_k_step("avx2")


@njit(inline="always", **NOPYTHON)
def _mul_mat_q6_k(qs, sc, d, x, out, step, subs, tiled):
    """ggml's q6_K products as ``quants.vec_dot_q6_k`` (vec_dot: 8 int32 lanes, lane u the scaled quads
    u of every 32-value chunk minus 32 x scales . block sums, acc_u = fma(d_x d_w, lane, acc_u), hsum)
    and ``tiled.mul_mat_q6_k_tiled`` (one float step per super-block) compute them: a super-block by
    ``step`` (or, tiled, the sub-block dots by ``subs``). qs (ng, nb, 4096) uint8; sc (ng, nb, 16, 16) int8;
    d (ng, nb, 16) f16 bits."""
    ng, nb = qs.shape[0], qs.shape[1]
    nr = d.shape[2]
    R = out.shape[1]
    aq4, ad, bsums = _q8_k_words(x)
    T = aq4.shape[0]
    nch = min(ng, _get_num_threads())            # one task per thread, chunks of groups taken in turn
    size, n_chunks = chunking(ng, nch)           # (as dot4_legacy); scalars indexed in place: no views
    turn = np.empty(1, np.int64)          # (np.zeros would be a parallel region of its own)
    turn[0] = 0
    for _c in prange(nch):
        Q = np.empty((16, nr), np.int32)
        L = np.empty((8, nr), np.int32)
        acc = np.empty((T, 8, nr), np.float32)
        kc = fetch_add(turn, 1)
        while kc < n_chunks:
            for g in range(kc * size, min(ng, (kc + 1) * size)):
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
                            step(qs, sc, d, g, b, aq4, bsums, t, ya, acc)
                n = min(nr, R - g * nr)
                for t in range(T):
                    for r in range(n):
                        out[t, g * nr + r] = acc[t, 0, r] if tiled else hsum8(
                            acc[t, 0, r], acc[t, 1, r], acc[t, 2, r], acc[t, 3, r], acc[t, 4, r], acc[t, 5, r], acc[t, 6, r], acc[t, 7, r])
            kc = fetch_add(turn, 1)


@njit(parallel=True, **NOPYTHON)
def mul_mat_q6_k_vnni(qs, sc, d, x, out, tiled, n_threads):
    prev = limit_threads(n_threads)
    _mul_mat_q6_k(qs, sc, d, x, out, q6_k_step_vnni, q6_k_subs_vnni, tiled)
    restore_threads(prev)


@njit(parallel=True, **NOPYTHON)
def mul_mat_q6_k_avx2(qs, sc, d, x, out, tiled, n_threads):
    prev = limit_threads(n_threads)
    _mul_mat_q6_k(qs, sc, d, x, out, q6_k_step_avx2, q6_k_subs_avx2, tiled)
    restore_threads(prev)
