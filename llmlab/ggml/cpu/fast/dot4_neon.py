"""The ARM profiles' legacy-quant products (``neon``'s kernels: NEON vec_dot, i8mm's 2x2 steps, REPACK
q8_0 4x4 / 4x8) with their integer sums by byte dot products, on x86 hosts that have them: the 8 int32
lanes of a block for 16 rows come from ``dot4_ir.dot4`` (exact, as in ``dot4_legacy``), NEON's 4 lanes
are their pairs (lane j + lane j+4: values 4j..4j+3 of every 16), and the float steps are ``neon``'s,
written again here over 16-row groups. Layout: ``quants.pack_legacy``'s ``quads``."""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from ._common import NOPYTHON, as_f32, fma, limit_threads, restore_threads
from .dot4_ir import I8, I16, I32, I8x64, I32x16, F32x16, data, dot4, f16x16, splat, vload, vstore
from .dot4_legacy import OFFSET, expand_q5_0
from .neon import MMLA, REPACK_4X4, REPACK_4X8, VEC_DOT, _even_chunk, _mmla_span, _pair_tree
from .quantize import quantize_q8_0_neon, quantize_q8_1_neon

R16 = 16
GROUPS = 8          # row groups per parallel task (one allocation of its scratch for all of them)


def _lanes(nibbles: bool, offset: int, isa: str, step: bool = False):
    """An intrinsic (blk, a, qsum, w0, L): L (8 x 16 int32) = the 8 lane sums of one block of 16 rows
    against one activation row, minus offset x the activations' quad sums (the codes are stored as
    c + offset), exact. With ``step``: (blk, a, qsum, w0, dw, dab, acc) does NEON's float step
    instead, acc[j] = acc[j] + (float) (lane j + lane j+4) * (dab * d_w), multiplied then added, for
    the 4 NEON lanes (acc: 4 x 16 float32, dw: the 16 rows' f16 scales)."""
    signed = isa == "avx2" and offset == 128           # q8_0 on AVX2: the signed codes, no offset
    off = 0 if signed else offset

    def codegen(context, builder, signature, args):
        blk, a, qsum, w0 = args[:4]
        out = args[-1]
        t = signature.args
        bp = data(context, builder, t[0], blk, I8)
        ap = data(context, builder, t[1], a, I32)
        sp = data(context, builder, t[2], qsum, I32)
        w0 = context.cast(builder, w0, t[3], types.intp)
        op = data(context, builder, t[-1], out, ir.FloatType() if step else I32)
        zero = ir.Constant(I32x16, [0] * 16)
        word = lambda p, j: builder.load(builder.gep(p, [builder.add(w0, ir.Constant(w0.type, j))]))
        if nibbles:
            raw = [vload(builder, bp, ir.Constant(I32, 64 * j), I8x64) for j in range(4)]
            codes = ([builder.and_(v, ir.Constant(I8x64, [15] * 64)) for v in raw]
                     + [builder.lshr(v, ir.Constant(I8x64, [4] * 64)) for v in raw])
        else:
            codes = [vload(builder, bp, ir.Constant(I32, 64 * j), I8x64) for j in range(8)]
            if signed:
                codes = [builder.xor(c, ir.Constant(I8x64, [0x80] * 64)) for c in codes]
        lanes = []
        for j in range(8):
            lane = dot4(builder, isa, zero, codes[j], word(ap, j), signed)
            if off:
                c = builder.mul(word(sp, j), ir.Constant(I32, off))
                lane = builder.sub(lane, splat(builder, c, I32x16))
            lanes.append(lane)
        if not step:
            for j in range(8):
                vstore(builder, op, ir.Constant(I32, 16 * j), lanes[j])
            return context.get_dummy_value()
        dd = builder.fmul(splat(builder, context.cast(builder, args[5], t[5], types.float32), F32x16),
                          f16x16(builder, data(context, builder, t[4], args[4], I16)))
        for j in range(4):
            v = builder.sitofp(builder.add(lanes[j], lanes[j + 4]), F32x16)
            idx = ir.Constant(I32, 16 * j)
            vstore(builder, op, idx, builder.fadd(vload(builder, op, idx, F32x16), builder.fmul(v, dd)))
        return context.get_dummy_value()

    if step:
        def typer(typingctx, blk, a, qsum, w0, dw, dab, acc):
            return types.none(blk, a, qsum, w0, dw, dab, acc), codegen
    else:
        def typer(typingctx, blk, a, qsum, w0, out):
            return types.none(blk, a, qsum, w0, out), codegen
    typer.__name__ = f"{'step' if step else 'lanes'}_{offset}_{int(nibbles)}_{isa}"
    return intrinsic(typer)


def _kind_lanes(isa: str):
    """kind 0 q4_0, 1 q4_1, 2 q5_0 (its codes expanded), 3 q8_0 -> the lanes of one block."""
    q40, q41 = _lanes(True, OFFSET["q4_0"], isa), _lanes(True, OFFSET["q4_1"], isa)
    q50, q80 = _lanes(False, OFFSET["q5_0"], isa), _lanes(False, OFFSET["q8_0"], isa)

    @njit(inline="always", **NOPYTHON)
    def lanes(kind, blk, codes, a, qsum, w0, L):
        if kind == 1:
            q41(blk, a, qsum, w0, L)
        elif kind == 2:
            q50(codes, a, qsum, w0, L)
        elif kind == 0:
            q40(blk, a, qsum, w0, L)
        else:
            q80(blk, a, qsum, w0, L)
    return lanes


def _kind_step(isa: str):
    """The same kinds -> NEON's float step on the block's lanes (dw, dab, acc: see _lanes)."""
    q40, q41 = _lanes(True, OFFSET["q4_0"], isa, True), _lanes(True, OFFSET["q4_1"], isa, True)
    q50, q80 = _lanes(False, OFFSET["q5_0"], isa, True), _lanes(False, OFFSET["q8_0"], isa, True)

    @njit(inline="always", **NOPYTHON)
    def step(kind, blk, codes, a, qsum, w0, dw, dab, acc):
        if kind == 1:
            q41(blk, a, qsum, w0, dw, dab, acc)
        elif kind == 2:
            q50(codes, a, qsum, w0, dw, dab, acc)
        elif kind == 0:
            q40(blk, a, qsum, w0, dw, dab, acc)
        else:
            q80(blk, a, qsum, w0, dw, dab, acc)
    return step


_lanes_vnni, _lanes_avx2 = _kind_lanes("vnni"), _kind_lanes("avx2")
_step_vnni, _step_avx2 = _kind_step("vnni"), _kind_step("avx2")


@njit(inline="always", **NOPYTHON)
def _acts(x, q41):
    """NEON's q8_1 (q4_1) or q8_0 activations, the codes four to a word, and each word's code sum."""
    if q41:
        aq, ad, as_ = quantize_q8_1_neon(x)
    else:
        aq, ad = quantize_q8_0_neon(x)
        as_ = np.zeros((0, 0), np.float32)
    T, K = aq.shape
    qsum = np.empty((T, K // 4), np.int32)
    for t in range(T):
        for i in range(K // 4):
            qsum[t, i] = (np.int32(aq[t, 4 * i]) + np.int32(aq[t, 4 * i + 1])
                          + np.int32(aq[t, 4 * i + 2]) + np.int32(aq[t, 4 * i + 3]))
    return aq.view(np.int32), qsum, ad, as_


@njit(inline="always", **NOPYTHON)
def _mul_mat(qs, qh, d, m, x, out, lanes, fstep, mode):
    """neon._legacy's float steps on the byte-dot lanes; out (T, R) float32 is written."""
    ng, nb, nbytes = qs.shape
    R = out.shape[1]
    q41, q50 = m.shape[0] != 0, qh.shape[0] != 0
    kind = 1 if q41 else (2 if q50 else (0 if nbytes == 256 else 3))
    aq4, qsum, ad, as_ = _acts(x, q41)
    T = aq4.shape[0]
    repack = mode == REPACK_4X4 or mode == REPACK_4X8
    n_gemm = T - T % 4 if mode == REPACK_4X4 else 0
    d0, d1 = _mmla_span(R, T) if mode == MMLA else (0, 0)
    plain = mode == VEC_DOT or (mode == MMLA and d0 == 0)     # NEON's steps only (no 2x2 output)
    nch = -(-ng // GROUPS)
    for c in prange(nch):                        # GROUPS row groups per task: its scratch allocated once
        L = np.empty((8, R16), np.int32)
        codes = np.empty(512, np.uint8)
        isum = np.empty(R16, np.float32)
        ddv = np.empty(R16, np.float32)
        acc = np.empty((T, 2, 4, R16), np.float32)
        summ = np.empty((T, R16), np.float32)
        acc1 = np.empty((T, R16), np.float32)
        summ1 = np.empty((T, R16), np.float32)
        last = np.empty((T, 3, R16), np.float32)
        m_even = np.empty(R16, np.float32)
        for g in range(c * GROUPS, min(ng, c * GROUPS + GROUPS)):
            acc[...] = 0
            summ[...] = 0
            acc1[...] = 0
            summ1[...] = 0
            for b in range(nb):
                blk = qs[g, b]
                dw = d[g, b]
                if q50:
                    expand_q5_0(blk, qh[g, b], codes)
                par = b % 2
                tail = b == nb - 1 and par == 0
                if q41 and par == 0:
                    for r in range(R16):
                        m_even[r] = as_f32(m[g, b, r])
                for t in range(T):
                    da = ad[t, b]
                    if plain and not tail:               # the whole step in vector registers
                        fstep(kind, blk, codes, aq4[t], qsum[t], 8 * b, dw, da, acc[t, par])
                        if q41 and par == 1:
                            s0, s1 = as_[t, b - 1], as_[t, b]
                            st = summ[t]
                            for r in range(R16):
                                st[r] = st[r] + fma(m_even[r], s0, as_f32(m[g, b, r]) * s1)
                        continue
                    lanes(kind, blk, codes, aq4[t], qsum[t], 8 * b, L)
                    for r in range(R16):
                        ddv[r] = da * as_f32(dw[r])
                    if repack or mode == MMLA or tail:
                        for r in range(R16):
                            isum[r] = np.float32((L[0, r] + L[4, r]) + (L[1, r] + L[5, r])
                                                 + (L[2, r] + L[6, r]) + (L[3, r] + L[7, r]))
                    if repack:
                        at1 = acc1[t]
                        if t < n_gemm:
                            for r in range(R16):
                                at1[r] = at1[r] + ddv[r] * isum[r]
                        else:
                            for r in range(R16):
                                at1[r] = fma(isum[r], ddv[r], at1[r])
                        continue
                    if mode == MMLA and not plain:
                        at1, st1 = acc1[t], summ1[t]
                        for r in range(R16):
                            at1[r] = at1[r] + isum[r] * ddv[r]
                        if q41:
                            s = as_[t, b]
                            for r in range(R16):
                                st1[r] = fma(as_f32(m[g, b, r]), s, st1[r])
                    if tail:
                        lt = last[t]
                        for r in range(R16):
                            lt[0, r] = isum[r]
                            lt[1, r] = as_f32(dw[r]) if kind == 0 else ddv[r]
                        if q41:
                            for r in range(R16):
                                lt[2, r] = as_f32(m[g, b, r]) * as_[t, b]
                        continue
                    at = acc[t, par]
                    for j in range(4):                   # across the rows: vectorized
                        aj, l0, l1 = at[j], L[j], L[j + 4]
                        for r in range(R16):
                            aj[r] = aj[r] + np.float32(l0[r] + l1[r]) * ddv[r]
                    if q41 and par == 1:
                        s0, s1 = as_[t, b - 1], as_[t, b]
                        st = summ[t]
                        for r in range(R16):
                            st[r] = st[r] + fma(m_even[r], s0, as_f32(m[g, b, r]) * s1)
            n = min(R16, R - g * R16)
            for t in range(T):
                for r in range(n):
                    if repack:
                        out[t, g * R16 + r] = acc1[t, r]
                    elif d0 > 0 and _even_chunk(g * R16 + r, d0, R) and _even_chunk(t, d1, T):
                        out[t, g * R16 + r] = acc1[t, r] + summ1[t, r]
                    else:
                        e, od = acc[t, 0], acc[t, 1]
                        s = (_pair_tree(e[0, r], e[1, r], e[2, r], e[3, r])
                             + _pair_tree(od[0, r], od[1, r], od[2, r], od[3, r]))
                        if q41:
                            s = s + summ[t, r]
                        if nb % 2 == 1:
                            lt = last[t]
                            if kind == 0:
                                s = fma(lt[0, r] * lt[1, r], ad[t, nb - 1], s)
                            elif q41:
                                s = s + fma(lt[1, r], lt[0, r], lt[2, r])
                            else:
                                s = fma(lt[1, r], lt[0, r], s)
                        out[t, g * R16 + r] = s


# entry points: (family kernel) x instruction set, each taking n_threads last (1: serial, 0: the step's)

@njit(parallel=True, **NOPYTHON)
def vec_dot_avx2(qs, qh, d, m, x, out, n_threads):
    prev = limit_threads(n_threads)
    _mul_mat(qs, qh, d, m, x, out, _lanes_avx2, _step_avx2, VEC_DOT)
    restore_threads(prev)


@njit(parallel=True, **NOPYTHON)
def vec_dot_vnni(qs, qh, d, m, x, out, n_threads):
    prev = limit_threads(n_threads)
    _mul_mat(qs, qh, d, m, x, out, _lanes_vnni, _step_vnni, VEC_DOT)
    restore_threads(prev)


@njit(parallel=True, **NOPYTHON)
def mmla_avx2(qs, qh, d, m, x, out, n_threads):
    prev = limit_threads(n_threads)
    _mul_mat(qs, qh, d, m, x, out, _lanes_avx2, _step_avx2, MMLA)
    restore_threads(prev)


@njit(parallel=True, **NOPYTHON)
def mmla_vnni(qs, qh, d, m, x, out, n_threads):
    prev = limit_threads(n_threads)
    _mul_mat(qs, qh, d, m, x, out, _lanes_vnni, _step_vnni, MMLA)
    restore_threads(prev)


@njit(parallel=True, **NOPYTHON)
def q8_0_4x4_avx2(qs, qh, d, m, x, out, n_threads):
    prev = limit_threads(n_threads)
    _mul_mat(qs, qh, d, m, x, out, _lanes_avx2, _step_avx2, REPACK_4X4)
    restore_threads(prev)


@njit(parallel=True, **NOPYTHON)
def q8_0_4x4_vnni(qs, qh, d, m, x, out, n_threads):
    prev = limit_threads(n_threads)
    _mul_mat(qs, qh, d, m, x, out, _lanes_vnni, _step_vnni, REPACK_4X4)
    restore_threads(prev)


@njit(parallel=True, **NOPYTHON)
def q8_0_4x8_avx2(qs, qh, d, m, x, out, n_threads):
    prev = limit_threads(n_threads)
    _mul_mat(qs, qh, d, m, x, out, _lanes_avx2, _step_avx2, REPACK_4X8)
    restore_threads(prev)


@njit(parallel=True, **NOPYTHON)
def q8_0_4x8_vnni(qs, qh, d, m, x, out, n_threads):
    prev = limit_threads(n_threads)
    _mul_mat(qs, qh, d, m, x, out, _lanes_vnni, _step_vnni, REPACK_4X8)
    restore_threads(prev)


KERNELS = {"vnni": {"vec_dot": vec_dot_vnni, "mmla": mmla_vnni, "q8_0_4x4": q8_0_4x4_vnni, "q8_0_4x8": q8_0_4x8_vnni},
           "avx2": {"vec_dot": vec_dot_avx2, "mmla": mmla_avx2, "q8_0_4x4": q8_0_4x4_avx2, "q8_0_4x8": q8_0_4x8_avx2}}
