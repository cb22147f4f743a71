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

from ._common import NOPYTHON, _get_num_threads, hsum8, limit_threads, restore_threads
from .dot4_ir import (I8, I16, I32, I8x64, I32x16, F32x16, at, block_codes, data, dot4, f16x16, fetch_add, high_bits,
                      intrinsic_fn, splat, vload, vstore)
from .quantize import quantize_quads

R16 = 16                      # rows per group: one 512-bit register of int32 lanes
OFFSET = {"q4_0": 8, "q4_1": 0, "q5_0": 16, "q8_0": 128}   # the codes are used as c + OFFSET (unsigned)


def _step_codegen(nibbles: bool, offset: int, with_m: bool, isa: str, indexed: bool, fifth: bool = False):
    signed = isa == "avx2" and offset == 128           # q8_0 on AVX2: the signed codes, no offset
    if signed:
        offset = 0

    def codegen(context, builder, signature, args):
        qs, aq4, qsum, d, acc, g, b, t, dab = args[:9]
        ty = signature.args
        gi, bi, ti = (g, ty[5]), (b, ty[6]), (t, ty[7])
        bp = at(context, builder, ty[0], qs, [gi, bi] if indexed else [bi], I8)   # the block's bytes
        ap = at(context, builder, ty[1], aq4, [ti], I32)                           # row t's words
        sp = at(context, builder, ty[2], qsum, [ti], I32)
        w0 = builder.mul(context.cast(builder, b, ty[6], types.intp), ir.Constant(context.get_value_type(types.intp), 8))
        fma = intrinsic_fn(builder, "llvm.fma.v16f32", F32x16, [F32x16] * 3)
        zero = ir.Constant(I32x16, [0] * 16)
        word = lambda p, j: builder.load(builder.gep(p, [builder.add(w0, ir.Constant(w0.type, j))]))
        codes = block_codes(builder, bp, nibbles, signed)
        if fifth:                                   # q5_0: the fifth bits qh[g, b] merged in registers
            qh = args[9]
            h = vload(builder, at(context, builder, ty[9], qh, [gi, bi], I32), ir.Constant(I32, 0), I32x16)
            codes = [builder.or_(c, high_bits(builder, h, 4 * j if j < 4 else 16 + 4 * (j - 4))) for j, c in enumerate(codes)]
        dd = builder.fmul(splat(builder, context.cast(builder, dab, ty[8], types.float32), F32x16),
                          f16x16(builder, at(context, builder, ty[3], d, [gi, bi], I16)))
        accp = at(context, builder, ty[4], acc, [ti], ir.FloatType())
        for j in range(8):
            lane = dot4(builder, isa, zero, codes[j], word(ap, j), signed)
            if offset:
                c = builder.mul(word(sp, j), ir.Constant(I32, offset))
                lane = builder.sub(lane, splat(builder, c, I32x16))
            idx = ir.Constant(I32, 16 * j)
            vstore(builder, accp, idx, builder.call(fma, [dd, builder.sitofp(lane, F32x16), vload(builder, accp, idx, F32x16)]))
        if with_m:                                           # q4_1: summ = fma(m_w, s_x, summ)
            m, s, summ = args[9:]
            mw = f16x16(builder, at(context, builder, ty[9], m, [gi, bi], I16))
            sv = splat(builder, context.cast(builder, s, ty[10], types.float32), F32x16)
            p = at(context, builder, ty[11], summ, [ti], ir.FloatType())
            vstore(builder, p, ir.Constant(I32, 0), builder.call(fma, [mw, sv, vload(builder, p, ir.Constant(I32, 0), F32x16)]))
        return context.get_dummy_value()
    return codegen


def _step(name: str, nibbles: bool, offset: int, with_m: bool, isa: str, indexed: bool = True, fifth: bool = False):
    if fifth:
        def typer(typingctx, qs, aq4, qsum, d, acc, g, b, t, dab, qh):
            return (types.none(qs, aq4, qsum, d, acc, g, b, t, dab, qh),
                    _step_codegen(nibbles, offset, with_m, isa, indexed, True))
    elif with_m:
        def typer(typingctx, qs, aq4, qsum, d, acc, g, b, t, dab, m, s, summ):
            return (types.none(qs, aq4, qsum, d, acc, g, b, t, dab, m, s, summ),
                    _step_codegen(nibbles, offset, with_m, isa, indexed))
    else:
        def typer(typingctx, qs, aq4, qsum, d, acc, g, b, t, dab):
            return types.none(qs, aq4, qsum, d, acc, g, b, t, dab), _step_codegen(nibbles, offset, with_m, isa, indexed)
    typer.__name__ = f"{name}_{isa}"
    return intrinsic(typer)


# One block of 16 rows against one activation row: the 8 lane sums (qs[g, b]: the block's 256 bytes of
# nibbles or 512 bytes of codes, or q5_0's expanded codes; aq4[t, 8b:8b+8]: the activation quads as int32
# words; minus offset x their sums qsum[t, 8b:8b+8]), then acc[t, j] = fma(dab * d_w, lane_j, acc[t, j])
# across the rows (d[g, b]: their f16 scales, acc: (T, 8, 16)); q4_1 also summ[t] = fma(m[g, b], s,
# summ[t]). Arrays and indices, not views (no reference counts per block). One set per instruction set.
def _block_step(isa: str):
    """The block step of weight kind 0 q4_0, 1 q4_1, 2 q5_0 (``codes``: the block expanded), 3 q8_0, on
    one instruction set (a compile-time choice: each entry point below inlines one of them)."""
    q40 = _step("step_q4_0", True, OFFSET["q4_0"], False, isa)
    q41 = _step("step_q4_1", True, OFFSET["q4_1"], True, isa)
    q50 = _step("step_q5_0", False, OFFSET["q5_0"], False, isa, indexed=False)   # qs: the group's codes, [b]
    q80 = _step("step_q8_0", False, OFFSET["q8_0"], False, isa)
    q5f = _step("step_q5_0_fused", True, OFFSET["q5_0"], False, isa, fifth=True)   # one activation row

    @njit(inline="always", **NOPYTHON)
    def step(kind, qs, qh, codes, aq4, qsum, d, acc, g, b, t, dab, m, s, summ):
        if kind == 1:
            q41(qs, aq4, qsum, d, acc, g, b, t, dab, m, s, summ)
        elif kind == 4:
            q5f(qs, aq4, qsum, d, acc, g, b, t, dab, qh)
        elif kind == 2:
            q50(codes, aq4, qsum, d, acc, g, b, t, dab)
        elif kind == 0:
            q40(qs, aq4, qsum, d, acc, g, b, t, dab)
        else:
            q80(qs, aq4, qsum, d, acc, g, b, t, dab)
    return step


_step_vnni = _block_step("vnni")
_step_avx2 = _block_step("avx2")


@intrinsic
def expand_q5_0(typingctx, blk, qh, out, b):
    """q5_0's 5-bit codes of a block of 16 rows as bytes, once per block (not per activation row): the
    nibbles of blk (256 bytes) or'ed with the fifth bits of qh (16 words) -> out[b] (512 bytes, lane j in
    bytes 64j .. 64j+63; out (nb, 512): a row group's blocks)."""
    def codegen(context, builder, signature, args):
        t = signature.args
        bp = data(context, builder, t[0], args[0], I8)
        h = vload(builder, data(context, builder, t[1], args[1], I32), ir.Constant(I32, 0), I32x16)
        op = at(context, builder, t[2], args[2], [(args[3], t[3])], I8)
        for j in range(4):
            v = vload(builder, bp, ir.Constant(I32, 64 * j), I8x64)
            lo = builder.or_(builder.and_(v, ir.Constant(I8x64, [15] * 64)), high_bits(builder, h, 4 * j))
            hi = builder.or_(builder.lshr(v, ir.Constant(I8x64, [4] * 64)), high_bits(builder, h, 16 + 4 * j))
            vstore(builder, op, ir.Constant(I32, 64 * j), lo)
            vstore(builder, op, ir.Constant(I32, 64 * (j + 4)), hi)
        return context.get_dummy_value()
    return types.none(blk, qh, out, b), codegen


@njit(inline="always", **NOPYTHON)
def _quantize(x, q41):
    """x (T, K) float32 -> (aq4, qsum, d, s) by the x86 quantizers (``quantize.quantize_quads``)."""
    return quantize_quads(x, q41, False)


CHUNKS_PER_THREAD = 8          # a product's row groups in this many chunks per thread, taken in turn


@njit(inline="always", **NOPYTHON)
def chunking(ng, nch):
    """(groups per chunk, chunks) for ng row groups on nch tasks: one chunk for one task, else about
    CHUNKS_PER_THREAD per task. Each task takes the next chunk from a shared counter (``fetch_add``), as
    ggml's threads do, so a thread the OS runs late (a busy machine) leaves its rows to the others
    instead of every region waiting for its fixed share; which task sums a row never changes its bits."""
    if nch <= 1:
        return ng, 1
    n = min(ng, CHUNKS_PER_THREAD * nch)
    size = -(-ng // n)
    return size, -(-ng // size)


@njit(inline="always", **NOPYTHON)
def _groups(qs, qh, d, m, out, g0, g1, aq4, qsum, ad, as_, acc, summ, codes, step):
    """Row groups g0 .. g1-1 of one packed weight against the quantized activations (acc, summ, codes:
    the task's scratch): each output row summed in ggml's order, whichever task computes it."""
    nb, nbytes = qs.shape[1], qs.shape[2]
    R = out.shape[1]
    T = aq4.shape[0]
    q41, q50 = m.shape[0] != 0, qh.shape[0] != 0
    kind = 1 if q41 else (2 if q50 else (0 if nbytes == 256 else 3))
    if q50 and T == 1:              # one row (decode): the codes made in registers, not through scratch
        kind = 4
    for g in range(g0, g1):
        if kind == 2:                # q5_0's codes of the group's blocks, once for every activation row
            for b in range(nb):
                expand_q5_0(qs[g, b], qh[g, b], codes, b)
        n = min(R16, R - g * R16)
        for t in range(T):           # one activation row through all the blocks: its sums stay in L1
            for j in range(8):
                for r in range(R16):
                    acc[t, j, r] = 0
            for r in range(R16):
                summ[t, r] = 0
            for b in range(nb):
                s = as_[t, b] if q41 else np.float32(0)
                step(kind, qs, qh, codes, aq4, qsum, d, acc, g, b, t, ad[t, b], m, s, summ)
            for r in range(n):
                v = hsum8(acc[t, 0, r], acc[t, 1, r], acc[t, 2, r], acc[t, 3, r],
                          acc[t, 4, r], acc[t, 5, r], acc[t, 6, r], acc[t, 7, r])
                out[t, g * R16 + r] = v + summ[t, r] if q41 else v


@njit(inline="always", **NOPYTHON)
def _mul_mat(qs, qh, d, m, x, out, step):
    """qs (ng, nb, 256 or 512) uint8; qh (ng, nb, 16) uint32 (q5_0's fifth bits, else empty); d / m
    (ng, nb, 16) f16 bits (m: q4_1's, else empty); x (T, K) float32, quantized here; out (T, R) f32,
    R <= ng*16 (the rows past R are zero padding). ``step``: _step_vnni or _step_avx2 (a compile-time
    choice: each entry point below is compiled with one of them)."""
    ng = qs.shape[0]
    aq4, qsum, ad, as_ = _quantize(x, m.shape[0] != 0)
    T = aq4.shape[0]
    nch = min(ng, _get_num_threads())            # one task per thread, its scratch allocated once; the
    size, n_chunks = chunking(ng, nch)           # row groups in chunks the tasks take in turn
    turn = np.empty(1, np.int64)          # (np.zeros would be a parallel region of its own)
    turn[0] = 0
    for _c in prange(nch):
        acc = np.empty((T, 8, R16), np.float32)
        summ = np.empty((T, R16), np.float32)
        codes = np.empty((qs.shape[1] if qh.shape[0] else 0, 512), np.uint8)     # q5_0's expanded blocks
        k = fetch_add(turn, 1)
        while k < n_chunks:
            _groups(qs, qh, d, m, out, k * size, min(ng, (k + 1) * size), aq4, qsum, ad, as_, acc, summ, codes, step)
            k = fetch_add(turn, 1)


@njit(inline="always", **NOPYTHON)
def _mul_mat_multi(qs_t, qh_t, d_t, m_t, x, out_t, step):
    """Several weights of one type against the same activations (attention's Q, K and V; the FFN's gate
    and up), as :func:`_mul_mat` computes each: the activations quantized once, all their row groups in
    one parallel region (tuples of the packed arrays and of the outputs, one entry per weight)."""
    n = len(qs_t)
    total = 0
    for i in range(n):
        total += qs_t[i].shape[0]
    aq4, qsum, ad, as_ = _quantize(x, m_t[0].shape[0] != 0)
    T = aq4.shape[0]
    nch = min(total, _get_num_threads())
    size, n_chunks = chunking(total, nch)        # chunks of the weights' groups one after another
    turn = np.empty(1, np.int64)          # (np.zeros would be a parallel region of its own)
    turn[0] = 0
    for _c in prange(nch):
        acc = np.empty((T, 8, R16), np.float32)
        summ = np.empty((T, R16), np.float32)
        codes = np.empty((qs_t[0].shape[1] if qh_t[0].shape[0] else 0, 512), np.uint8)
        k = fetch_add(turn, 1)
        while k < n_chunks:
            lo, hi = k * size, min(total, (k + 1) * size)
            base = 0
            for i in range(n):
                ng = qs_t[i].shape[0]
                g0, g1 = max(lo - base, 0), min(hi - base, ng)
                if g0 < g1:
                    _groups(qs_t[i], qh_t[i], d_t[i], m_t[i], out_t[i], g0, g1, aq4, qsum, ad, as_, acc, summ, codes, step)
                base += ng
            k = fetch_add(turn, 1)


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


# The same for several weights sharing their activations (tuples of packed arrays and outputs, one type).

@njit(parallel=True, **NOPYTHON)
def mul_mat_multi_vnni(qs_t, qh_t, d_t, m_t, x, out_t, n_threads):
    prev = limit_threads(n_threads)
    _mul_mat_multi(qs_t, qh_t, d_t, m_t, x, out_t, _step_vnni)
    restore_threads(prev)


@njit(parallel=True, **NOPYTHON)
def mul_mat_multi_avx2(qs_t, qh_t, d_t, m_t, x, out_t, n_threads):
    prev = limit_threads(n_threads)
    _mul_mat_multi(qs_t, qh_t, d_t, m_t, x, out_t, _step_avx2)
    restore_threads(prev)
