"""The legacy quants (q4_0, q4_1, q5_0, q8_0) by byte dot products: ggml's 8 float lanes of a 32-value
block are sums of 4 consecutive products, which ``vpdpbusd`` (or ``pmaddubsw`` + ``pmaddwd``) computes
for 16 rows at once (``dot4_ir.dot4``); the float steps that follow (``acc_j = fma(d_x * d_w, lane_j,
acc_j)``, hsum_float_8, q4_1's m * s) are those of ``quants.vec_dot_legacy``: the same bits. Layout:
``dot4_pack.pack_legacy_quads``. One body, compiled once per instruction set (``dot4.KERNELS``)."""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from ._common import NOPYTHON, hsum8, limit_threads, restore_threads
from .dot4_ir import I8, I16, I32, I8x64, I32x16, F32x16, block_codes, data, dot4, f16x16, high_bits, intrinsic_fn, splat, vload, vstore
from .quantize import quantize_quads

R16 = 16                      # rows per group: one 512-bit register of int32 lanes
OFFSET = {"q4_0": 8, "q4_1": 0, "q5_0": 16, "q8_0": 128}   # the codes are used as c + OFFSET (unsigned)


def _step_codegen(nibbles: bool, offset: int, with_m: bool, isa: str):
    signed = isa == "avx2" and offset == 128           # q8_0 on AVX2: the signed codes, no offset
    if signed:
        offset = 0

    def codegen(context, builder, signature, args):
        blk, a, qsum, w0, dw, dab, acc = args[:7]
        t = signature.args
        bp = data(context, builder, t[0], blk, I8)
        ap = data(context, builder, t[1], a, I32)
        sp = data(context, builder, t[2], qsum, I32)
        w0 = context.cast(builder, w0, t[3], types.intp)
        fma = intrinsic_fn(builder, "llvm.fma.v16f32", F32x16, [F32x16] * 3)
        zero = ir.Constant(I32x16, [0] * 16)
        word = lambda p, j: builder.load(builder.gep(p, [builder.add(w0, ir.Constant(w0.type, j))]))
        codes = block_codes(builder, bp, nibbles, signed)
        dd = builder.fmul(splat(builder, context.cast(builder, dab, t[5], types.float32), F32x16),
                          f16x16(builder, data(context, builder, t[4], dw, I16)))
        accp = data(context, builder, t[6], acc, ir.FloatType())
        for j in range(8):
            lane = dot4(builder, isa, zero, codes[j], word(ap, j), signed)
            if offset:
                c = builder.mul(word(sp, j), ir.Constant(I32, offset))
                lane = builder.sub(lane, splat(builder, c, I32x16))
            idx = ir.Constant(I32, 16 * j)
            vstore(builder, accp, idx, builder.call(fma, [dd, builder.sitofp(lane, F32x16), vload(builder, accp, idx, F32x16)]))
        if with_m:                                           # q4_1: summ = fma(m_w, s_x, summ)
            mw, s, summ = args[7:]
            m = f16x16(builder, data(context, builder, t[7], mw, I16))
            sv = splat(builder, context.cast(builder, s, t[8], types.float32), F32x16)
            p = data(context, builder, t[9], summ, ir.FloatType())
            vstore(builder, p, ir.Constant(I32, 0), builder.call(fma, [m, sv, vload(builder, p, ir.Constant(I32, 0), F32x16)]))
        return context.get_dummy_value()
    return codegen


def _step(name: str, nibbles: bool, offset: int, with_m: bool, isa: str):
    if with_m:
        def typer(typingctx, blk, a, qsum, w0, dw, dab, acc, mw, s, summ):
            return types.none(blk, a, qsum, w0, dw, dab, acc, mw, s, summ), _step_codegen(nibbles, offset, with_m, isa)
    else:
        def typer(typingctx, blk, a, qsum, w0, dw, dab, acc):
            return types.none(blk, a, qsum, w0, dw, dab, acc), _step_codegen(nibbles, offset, with_m, isa)
    typer.__name__ = f"{name}_{isa}"
    return intrinsic(typer)


# One block of 16 rows against one activation row: the 8 lane sums (blk: the block's 256 bytes of
# nibbles or 512 bytes of codes; a[w0:w0+8]: the activation quads as int32 words; minus offset x their
# sums qsum[w0:w0+8]), then acc[j] = fma(dab * d_w, lane_j, acc[j]) across the rows (dw: their f16
# scales, acc: (8, 16)); q4_1 also summ = fma(m_w, s, summ). One set per instruction set.
def _block_step(isa: str):
    """The block step of weight kind 0 q4_0, 1 q4_1, 2 q5_0 (``codes``: the block expanded), 3 q8_0, on
    one instruction set (a compile-time choice: each entry point below inlines one of them)."""
    q40 = _step("step_q4_0", True, OFFSET["q4_0"], False, isa)     # (blk, a, qsum, w0, dw, dab, acc)
    q41 = _step("step_q4_1", True, OFFSET["q4_1"], True, isa)      # (..., acc, mw, s, summ)
    q50 = _step("step_q5_0", False, OFFSET["q5_0"], False, isa)    # blk: the codes of expand_q5_0
    q80 = _step("step_q8_0", False, OFFSET["q8_0"], False, isa)

    @njit(inline="always", **NOPYTHON)
    def step(kind, blk, codes, a, qsum, w0, dw, dab, acc, mw, s, summ):
        if kind == 1:
            q41(blk, a, qsum, w0, dw, dab, acc, mw, s, summ)
        elif kind == 2:
            q50(codes, a, qsum, w0, dw, dab, acc)
        elif kind == 0:
            q40(blk, a, qsum, w0, dw, dab, acc)
        else:
            q80(blk, a, qsum, w0, dw, dab, acc)
    return step


_step_vnni = _block_step("vnni")
_step_avx2 = _block_step("avx2")


@intrinsic
def expand_q5_0(typingctx, blk, qh, out):
    """q5_0's 5-bit codes of a block of 16 rows as bytes, once per block (not per activation row): the
    nibbles of blk (256 bytes) or'ed with the fifth bits of qh (16 words) -> out (512 bytes, lane j in
    bytes 64j .. 64j+63)."""
    def codegen(context, builder, signature, args):
        t = signature.args
        bp = data(context, builder, t[0], args[0], I8)
        h = vload(builder, data(context, builder, t[1], args[1], I32), ir.Constant(I32, 0), I32x16)
        op = data(context, builder, t[2], args[2], I8)
        for j in range(4):
            v = vload(builder, bp, ir.Constant(I32, 64 * j), I8x64)
            lo = builder.or_(builder.and_(v, ir.Constant(I8x64, [15] * 64)), high_bits(builder, h, 4 * j))
            hi = builder.or_(builder.lshr(v, ir.Constant(I8x64, [4] * 64)), high_bits(builder, h, 16 + 4 * j))
            vstore(builder, op, ir.Constant(I32, 64 * j), lo)
            vstore(builder, op, ir.Constant(I32, 64 * (j + 4)), hi)
        return context.get_dummy_value()
    return types.none(blk, qh, out), codegen


@njit(inline="always", **NOPYTHON)
def _quantize(x, q41):
    """x (T, K) float32 -> (aq4, qsum, d, s) by the x86 quantizers (``quantize.quantize_quads``)."""
    return quantize_quads(x, q41, False)


@njit(inline="always", **NOPYTHON)
def _mul_mat(qs, qh, d, m, x, out, step):
    """qs (ng, nb, 256 or 512) uint8; qh (ng, nb, 16) uint32 (q5_0's fifth bits, else empty); d / m
    (ng, nb, 16) f16 bits (m: q4_1's, else empty); x (T, K) float32, quantized here; out (T, R) f32,
    R <= ng*16 (the rows past R are zero padding). ``step``: _step_vnni or _step_avx2 (a compile-time
    choice: each entry point below is compiled with one of them)."""
    ng, nb, nbytes = qs.shape
    R = out.shape[1]
    q41, q50 = m.shape[0] != 0, qh.shape[0] != 0
    kind = 1 if q41 else (2 if q50 else (0 if nbytes == 256 else 3))
    aq4, qsum, ad, as_ = _quantize(x, q41)
    T = aq4.shape[0]
    for g in prange(ng):
        acc = np.zeros((T, 8, R16), np.float32)
        summ = np.zeros((T, R16), np.float32)
        codes = np.empty(512, np.uint8)
        for b in range(nb):
            blk = qs[g, b]
            dw = d[g, b]
            mw = m[g, b] if q41 else dw
            if q50:
                expand_q5_0(blk, qh[g, b], codes)
            for t in range(T):
                s = as_[t, b] if q41 else np.float32(0)
                step(kind, blk, codes, aq4[t], qsum[t], 8 * b, dw, ad[t, b], acc[t], mw, s, summ[t])
        n = min(R16, R - g * R16)
        for t in range(T):
            for r in range(n):
                v = hsum8(acc[t, 0, r], acc[t, 1, r], acc[t, 2, r], acc[t, 3, r],
                          acc[t, 4, r], acc[t, 5, r], acc[t, 6, r], acc[t, 7, r])
                out[t, g * R16 + r] = v + summ[t, r] if q41 else v


# out (T, R) = x (T, K) float32 times the packed weight: activations quantized to the weight's partner
# type (q8_1 for q4_1, q8_0 otherwise), then the lane sums and float steps; row groups on at most
# n_threads threads (1: serial, 0: the step's count).

@njit(parallel=True, **NOPYTHON)
def mul_mat_vnni(qs, qh, d, m, x, out, n_threads):
    prev = limit_threads(n_threads)
    _mul_mat(qs, qh, d, m, x, out, _step_vnni)
    restore_threads(prev)


@njit(parallel=True, **NOPYTHON)
def mul_mat_avx2(qs, qh, d, m, x, out, n_threads):
    prev = limit_threads(n_threads)
    _mul_mat(qs, qh, d, m, x, out, _step_avx2)
    restore_threads(prev)
