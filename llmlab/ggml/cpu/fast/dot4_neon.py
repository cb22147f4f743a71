"""The ARM profiles' legacy-quant products (``neon``'s kernels: NEON vec_dot, i8mm's 2x2 steps, REPACK
q8_0 4x4 / 4x8) with their integer sums by byte dot products, on x86 hosts that have them: the 8 int32
lanes of a block for 16 rows come from ``dot4_ir.dot4`` (exact, as in ``dot4_legacy``), NEON's 4 lanes
are their pairs (lane j + lane j+4: values 4j..4j+3 of every 16), and the float steps are ``neon``'s,
written again here over 16-row groups, in vector registers where a block's step is one (vec_dot, REPACK
q8_0, q4_1's min terms). Layout: ``quants.pack_legacy``'s ``quads``. Also ARM's REPACK q4_K (8x4, 8x8):
``dot4_kquants``' sub-block dots with ``neon``'s float steps (layout ``dot4_pack.pack_q4_k``), and q6_K's
(8x4, 8x8; layout ``dot4_pack.pack_q6_k``)."""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from ._common import NOPYTHON, _get_num_threads, as_f32, fma, limit_threads, restore_threads
from .dot4_ir import I8, I16, I32, I32x16, F32x16, at, block_codes, block_words, data, dot4, f16x16, intrinsic_fn, splat, vload, vstore
from .dot4_legacy import OFFSET, expand_q5_0
from .dot4_kquants import q4_k_dots_avx2, q4_k_dots_vnni, q6_k_subs_avx2, q6_k_subs_vnni
from .neon import MMLA, REPACK_4X4, REPACK_4X8, VEC_DOT, _mmla_span, _steps_8x4, _steps_8x8, finish
from .quantize import quantize_q8_k_neon, quantize_quads

R16 = 16


LANES, NEON, FUSED, UNFUSED = 0, 1, 2, 3     # what _lanes' intrinsic does with a block's lanes


def _lanes(nibbles: bool, offset: int, isa: str, step: int = LANES):
    """An intrinsic (blk, a, qsum, w0, dw, dab, out): out = L (8 x 16 int32), the 8 lane sums of one block
    of 16 rows against one activation row, minus offset x the activations' quad sums (the codes are
    stored as c + offset), exact (dw, dab unused). The float steps take arrays and indices instead of
    views made per block (no reference counts: see dot4_ir.at), (qs, qg, qb, aq4, qsum, t, d, g, b, dab,
    acc, i0, i1): the block qs[qg, qb], the words aq4[t, 8b:], their sums qsum[t, 8b:], the scales d[g, b],
    out = acc[i0, i1] (NEON) or acc[i0] (the others). In vector registers (dd = dab * d_w): NEON, out (4 x 16
    float32), out[j] = out[j] + (float) (lane j + lane j+4) * dd for the 4 NEON lanes, multiplied then
    added (vec_dot); FUSED, out (16 float32) = fma((float) sum of the lanes, dd, out) (REPACK's gemv
    rows); UNFUSED, out = out + dd * (float) sum of the lanes (the q8_0 4x4 gemm's groups of 4 rows)."""
    signed = isa == "avx2" and offset == 128           # q8_0 on AVX2: the signed codes, no offset
    off = 0 if signed else offset

    def codegen(context, builder, signature, args):
        t = signature.args
        if step == LANES:                        # (blk, a, qsum, w0, dw, dab, out): views
            bp, ap, word = block_words(context, builder, signature, args, 3)
            sp = data(context, builder, t[2], args[2], I32)
            op = data(context, builder, t[-1], args[-1], I32)
            dwp, dab, dab_ty = None, args[5], t[5]
        else:                                    # (qs, qg, qb, aq4, qsum, tt, d, g, b, dab, acc, i0, i1): indices
            qs, qg, qb, aq4, qsum, tt, d, g, b, dab, acc, i0, i1 = args
            bp = at(context, builder, t[0], qs, [(qg, t[1]), (qb, t[2])], I8)
            ap = at(context, builder, t[3], aq4, [(tt, t[5])], I32)
            sp = at(context, builder, t[4], qsum, [(tt, t[5])], I32)
            dwp = at(context, builder, t[6], d, [(g, t[7]), (b, t[8])], I16)
            acc_ix = [(i0, t[11])] + ([(i1, t[12])] if step == NEON else [])
            op = at(context, builder, t[10], acc, acc_ix, ir.FloatType())
            dab_ty = t[9]
            w0 = builder.mul(context.cast(builder, b, t[8], types.intp), ir.Constant(context.get_value_type(types.intp), 8))
            word = lambda p, j: builder.load(builder.gep(p, [builder.add(w0, ir.Constant(w0.type, j))]))
        zero = ir.Constant(I32x16, [0] * 16)
        codes = block_codes(builder, bp, nibbles, signed)
        lanes = []
        for j in range(8):
            lane = dot4(builder, isa, zero, codes[j], word(ap, j), signed)
            if off:
                c = builder.mul(word(sp, j), ir.Constant(I32, off))
                lane = builder.sub(lane, splat(builder, c, I32x16))
            lanes.append(lane)
        if step == LANES:
            for j in range(8):
                vstore(builder, op, ir.Constant(I32, 16 * j), lanes[j])
            return context.get_dummy_value()
        dd = builder.fmul(splat(builder, context.cast(builder, dab, dab_ty, types.float32), F32x16), f16x16(builder, dwp))
        if step != NEON:                         # the integer sum of all 8 lanes (exact in any order)
            pairs = [builder.add(lanes[j], lanes[j + 4]) for j in range(4)]
            v = builder.sitofp(builder.add(builder.add(pairs[0], pairs[1]), builder.add(pairs[2], pairs[3])), F32x16)
            idx = ir.Constant(I32, 0)
            acc = vload(builder, op, idx, F32x16)
            if step == FUSED:
                fma_v = intrinsic_fn(builder, "llvm.fma.v16f32", F32x16, [F32x16] * 3)
                vstore(builder, op, idx, builder.call(fma_v, [v, dd, acc]))
            else:
                vstore(builder, op, idx, builder.fadd(acc, builder.fmul(dd, v)))
            return context.get_dummy_value()
        for j in range(4):
            v = builder.sitofp(builder.add(lanes[j], lanes[j + 4]), F32x16)
            idx = ir.Constant(I32, 16 * j)
            vstore(builder, op, idx, builder.fadd(vload(builder, op, idx, F32x16), builder.fmul(v, dd)))
        return context.get_dummy_value()

    if step == LANES:
        def typer(typingctx, blk, a, qsum, w0, dw, dab, out):
            return types.none(blk, a, qsum, w0, dw, dab, out), codegen
    else:
        def typer(typingctx, qs, qg, qb, aq4, qsum, tt, d, g, b, dab, acc, i0, i1):
            return types.none(qs, qg, qb, aq4, qsum, tt, d, g, b, dab, acc, i0, i1), codegen
    typer.__name__ = f"{('lanes', 'neon', 'fused', 'unfused')[step]}_{offset}_{int(nibbles)}_{isa}"
    return intrinsic(typer)


def _by_kind(isa: str, step: int):
    """kind 0 q4_0, 1 q4_1, 2 q5_0 (its codes expanded), 3 q8_0 -> the lanes of one block, or a float
    step on them (``step``: see _lanes)."""
    q40, q41 = _lanes(True, OFFSET["q4_0"], isa, step), _lanes(True, OFFSET["q4_1"], isa, step)
    q50, q80 = _lanes(False, OFFSET["q5_0"], isa, step), _lanes(False, OFFSET["q8_0"], isa, step)

    if step == LANES:
        @njit(inline="always", **NOPYTHON)
        def by_kind(kind, blk, codes, a, qsum, w0, dw, dab, out):
            if kind == 1:
                q41(blk, a, qsum, w0, dw, dab, out)
            elif kind == 2:
                q50(codes, a, qsum, w0, dw, dab, out)
            elif kind == 0:
                q40(blk, a, qsum, w0, dw, dab, out)
            else:
                q80(blk, a, qsum, w0, dw, dab, out)
        return by_kind

    @njit(inline="always", **NOPYTHON)
    def by_kind_at(kind, qs, codes, aq4, qsum, t, d, g, b, dab, acc, i0, i1):
        """codes: q5_0's block expanded, (1, 1, 512)."""
        if kind == 1:
            q41(qs, g, b, aq4, qsum, t, d, g, b, dab, acc, i0, i1)
        elif kind == 2:
            q50(codes, 0, 0, aq4, qsum, t, d, g, b, dab, acc, i0, i1)
        elif kind == 0:
            q40(qs, g, b, aq4, qsum, t, d, g, b, dab, acc, i0, i1)
        else:
            q80(qs, g, b, aq4, qsum, t, d, g, b, dab, acc, i0, i1)
    return by_kind_at


_lanes_vnni, _lanes_avx2 = _by_kind("vnni", LANES), _by_kind("avx2", LANES)
_step_vnni, _step_avx2 = _by_kind("vnni", NEON), _by_kind("avx2", NEON)
_fused_vnni, _fused_avx2 = _by_kind("vnni", FUSED), _by_kind("avx2", FUSED)
_unfused_vnni, _unfused_avx2 = _by_kind("vnni", UNFUSED), _by_kind("avx2", UNFUSED)


@intrinsic
def _mins_pair(typingctx, m, g, b, s0, s1, summ, t):
    """q4_1's min terms of a pair of blocks for 16 rows as NEON adds them, summ[t] = summ[t] + fma(m0, s0,
    m1 * s1) (m0, m1: the f16 mins m[g, b - 1] and m[g, b]; s0, s1: the activations' block sums), in vector
    registers, addressed by index."""
    def codegen(context, builder, signature, args):
        ty = signature.args
        m, g, b, s0, s1, summ, t = args
        fma_v = intrinsic_fn(builder, "llvm.fma.v16f32", F32x16, [F32x16] * 3)
        b0 = builder.sub(context.cast(builder, b, ty[2], types.intp), ir.Constant(context.get_value_type(types.intp), 1))
        mv0 = f16x16(builder, at(context, builder, ty[0], m, [(g, ty[1]), (b0, types.intp)], I16))
        mv1 = f16x16(builder, at(context, builder, ty[0], m, [(g, ty[1]), (b, ty[2])], I16))
        sv0, sv1 = (splat(builder, context.cast(builder, v, vt, types.float32), F32x16) for v, vt in ((s0, ty[3]), (s1, ty[4])))
        p = at(context, builder, ty[5], summ, [(t, ty[6])], ir.FloatType())
        zero = ir.Constant(I32, 0)
        terms = builder.call(fma_v, [mv0, sv0, builder.fmul(mv1, sv1)])
        vstore(builder, p, zero, builder.fadd(vload(builder, p, zero, F32x16), terms))
        return context.get_dummy_value()
    return types.none(m, g, b, s0, s1, summ, t), codegen


@njit(inline="always", **NOPYTHON)
def _mul_mat(qs, qh, d, m, x, out, lanes, fstep, fused, unfused, mode):
    """neon._legacy's float steps on the byte-dot lanes (lanes, fstep, fused, unfused: _by_kind's of one
    instruction set); out (T, R) float32 is written."""
    ng, nb, nbytes = qs.shape
    R = out.shape[1]
    q41, q50 = m.shape[0] != 0, qh.shape[0] != 0
    kind = 1 if q41 else (2 if q50 else (0 if nbytes == 256 else 3))
    aq4, qsum, ad, as_ = quantize_quads(x, q41, True)
    T = aq4.shape[0]
    repack = mode == REPACK_4X4 or mode == REPACK_4X8
    n_gemm = T - T % 4 if mode == REPACK_4X4 else 0
    d0, d1 = _mmla_span(R, T) if mode == MMLA else (0, 0)
    plain = mode == VEC_DOT or (mode == MMLA and d0 == 0)     # NEON's steps only (no 2x2 output)
    nch = min(ng, _get_num_threads())            # one task per thread, contiguous groups (the x86 kernels take chunks in turn):
    for c in prange(nch):                        # its scratch allocated once; blocks addressed by index
        L = np.empty((8, R16), np.int32)
        codes3 = np.empty((1, 1, 512), np.uint8)
        codes2 = codes3[0]                  # (1, 512): expand_q5_0 writes its row 0
        codes = codes2[0]
        isum = np.empty(R16, np.float32)
        ddv = np.empty(R16, np.float32)
        acc = np.empty((T, 2, 4, R16), np.float32)
        summ = np.empty((T, R16), np.float32)
        acc1 = np.empty((T, R16), np.float32)
        summ1 = np.empty((T, R16), np.float32)
        last = np.empty((T, 3, R16), np.float32)
        for g in range(c * ng // nch, (c + 1) * ng // nch):
            acc[...] = 0
            summ[...] = 0
            acc1[...] = 0
            summ1[...] = 0
            for b in range(nb):
                if q50:
                    expand_q5_0(qs[g, b], qh[g, b], codes2, 0)
                par = b % 2
                tail = b == nb - 1 and par == 0
                for t in range(T):
                    da = ad[t, b]
                    if repack:                           # one accumulator, in vector registers
                        if t < n_gemm:
                            unfused(kind, qs, codes3, aq4, qsum, t, d, g, b, da, acc1, t, 0)
                        else:
                            fused(kind, qs, codes3, aq4, qsum, t, d, g, b, da, acc1, t, 0)
                        continue
                    if plain and not tail:               # the whole step in vector registers
                        fstep(kind, qs, codes3, aq4, qsum, t, d, g, b, da, acc, t, par)
                        if q41 and par == 1:
                            _mins_pair(m, g, b, as_[t, b - 1], as_[t, b], summ, t)
                        continue
                    dw = d[g, b]
                    lanes(kind, qs[g, b], codes, aq4[t], qsum[t], 8 * b, dw, da, L)
                    for r in range(R16):
                        ddv[r] = da * as_f32(dw[r])
                    if mode == MMLA or tail:
                        for r in range(R16):
                            isum[r] = np.float32((L[0, r] + L[4, r]) + (L[1, r] + L[5, r])
                                                 + (L[2, r] + L[6, r]) + (L[3, r] + L[7, r]))
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
                        _mins_pair(m, g, b, as_[t, b - 1], as_[t, b], summ, t)
            n = min(R16, R - g * R16)
            for t in range(T):
                for r in range(n):
                    out[t, g * R16 + r] = finish(acc, summ, acc1, summ1, last, ad, t, r, g * R16 + r, R, nb, kind, repack,
                                                 d0, d1)


MODES = {"vec_dot": VEC_DOT, "mmla": MMLA, "q8_0_4x4": REPACK_4X4, "q8_0_4x8": REPACK_4X8}   # the family kernels


def _entry(isa: str, kernel: str):
    """The entry point of one family kernel on one instruction set, (qs, qh, d, m, x, out, n_threads) with
    n_threads last (1: serial, 0: the step's). The closure holds plain values only, the flag and the mode
    (numba's cache key pickles them); the other instruction set's branch is pruned before typing."""
    vnni, mode = isa == "vnni", MODES[kernel]

    def entry(qs, qh, d, m, x, out, n_threads):
        prev = limit_threads(n_threads)
        if vnni:
            _mul_mat(qs, qh, d, m, x, out, _lanes_vnni, _step_vnni, _fused_vnni, _unfused_vnni, mode)
        else:
            _mul_mat(qs, qh, d, m, x, out, _lanes_avx2, _step_avx2, _fused_avx2, _unfused_avx2, mode)
        restore_threads(prev)
    entry.__name__ = entry.__qualname__ = f"{kernel}_{isa}"
    return njit(parallel=True, **NOPYTHON)(entry)


KERNELS = {isa: {kernel: _entry(isa, kernel) for kernel in MODES} for isa in ("vnni", "avx2")}


# ---- q4_K in ARM's REPACK buffer (8x4 dotprod, 8x8 i8mm) on the byte-dot layout of dot4_pack.pack_q4_k ----

@njit(inline="always", **NOPYTHON)
def _mul_mat_q4_k(qs, sc, mn, d, dmin, x, out, dots, steps):
    """neon.q4_k_8x4 / q4_k_8x8's float steps (``steps``: neon._steps_8x4 or _steps_8x8) on the sub-block
    dots of dot4_kquants' ``dots`` (16 rows at a time), with the NEON q8_K activations; out (T, R) float32."""
    ng, nb = qs.shape[0], qs.shape[1]
    nr = d.shape[2]
    R = out.shape[1]
    aq, ad, bsums = quantize_q8_k_neon(x)
    aq4 = aq.view(np.int32)
    T = aq.shape[0]
    n_gemm = T - T % 4
    for g in prange(ng):
        D = np.empty((8, nr), np.int32)
        dw = np.empty(nr, np.float32)
        dmw = np.empty(nr, np.float32)
        acc = np.zeros((T, nr), np.float32)
        accm = np.zeros((T, nr), np.float32)
        for b in range(nb):
            for r in range(nr):
                dw[r] = as_f32(d[g, b, r])
                dmw[r] = as_f32(dmin[g, b, r])
            for t in range(T):
                dots(qs, g, b, aq4, t, 64 * b, D)
                steps(sc[g, b], mn[g, b], dw, dmw, D, bsums, t, b, ad[t, b], t < n_gemm, acc[t], accm[t])
        n = min(nr, R - g * nr)
        for t in range(T):
            for r in range(n):
                out[t, g * nr + r] = acc[t, r] - accm[t, r]


def _q4_k_entry(isa: str, layout: str):
    """(qs, sc, mn, d, dmin, x, out, n_threads) of one REPACK layout ("8x4", "8x8") on one instruction set
    (plain values in the closure, as _entry's)."""
    vnni, wide = isa == "vnni", layout == "8x8"

    def entry(qs, sc, mn, d, dmin, x, out, n_threads):
        prev = limit_threads(n_threads)
        if vnni:
            if wide:
                _mul_mat_q4_k(qs, sc, mn, d, dmin, x, out, q4_k_dots_vnni, _steps_8x8)
            else:
                _mul_mat_q4_k(qs, sc, mn, d, dmin, x, out, q4_k_dots_vnni, _steps_8x4)
        elif wide:
            _mul_mat_q4_k(qs, sc, mn, d, dmin, x, out, q4_k_dots_avx2, _steps_8x8)
        else:
            _mul_mat_q4_k(qs, sc, mn, d, dmin, x, out, q4_k_dots_avx2, _steps_8x4)
        restore_threads(prev)
    entry.__name__ = entry.__qualname__ = f"q4_k_{layout}_{isa}"
    return njit(parallel=True, **NOPYTHON)(entry)


for _isa in KERNELS:
    KERNELS[_isa].update({f"q4_k_{lay}": _q4_k_entry(_isa, lay) for lay in ("8x4", "8x8")})


# ---- q6_K in ARM's REPACK buffer (8x4 dotprod, 8x8 i8mm) on the byte-dot layout of dot4_pack.pack_q6_k ----

@njit(inline="always", **NOPYTHON)
def _mul_mat_q6_k(qs, sc, d, x, out, subs, fused_gemv):
    """neon.q6_k_8x4 / q6_k_8x8: a super-block's integer dot (the 16 sub-block dots of dot4_kquants'
    ``subs`` minus 32 x the block sums, times the scales) in one int32 per row, exact in any order, then
    one float step, acc + (float) isum * (d_w d_x): fused in the 8x4 gemv rows (``fused_gemv``: the
    activation rows past the last group of 4), unfused elsewhere; NEON's q8_K activations. One task per
    thread over contiguous row groups, its scratch allocated once, blocks addressed by index."""
    ng, nb = qs.shape[0], qs.shape[1]
    nr = d.shape[2]
    R = out.shape[1]
    aq, ad, bsums = quantize_q8_k_neon(x)
    aq4 = aq.view(np.int32)
    T = aq.shape[0]
    n_unfused = T - T % 4 if fused_gemv else T
    nch = min(ng, _get_num_threads())
    for ch in prange(nch):
        Q = np.empty((16, nr), np.int32)
        S = np.empty(nr, np.int32)
        acc = np.empty((T, nr), np.float32)
        for g in range(ch * ng // nch, (ch + 1) * ng // nch):
            for t in range(T):
                for r in range(nr):
                    acc[t, r] = 0
            for b in range(nb):
                for t in range(T):
                    subs(qs, g, b, aq4, t, 64 * b, Q)
                    for r in range(nr):
                        S[r] = 0
                    for sb in range(16):
                        bs = np.int32(32 * np.int32(bsums[t, 16 * b + sb]))
                        for r in range(nr):
                            S[r] = np.int32(S[r] + np.int32(np.int32(sc[g, b, sb, r]) * np.int32(Q[sb, r] - bs)))
                    ya = ad[t, b]
                    if t < n_unfused:
                        for r in range(nr):
                            acc[t, r] = acc[t, r] + np.float32(S[r]) * (as_f32(d[g, b, r]) * ya)
                    else:
                        for r in range(nr):
                            acc[t, r] = fma(S[r], as_f32(d[g, b, r]) * ya, acc[t, r])
            n = min(nr, R - g * nr)
            for t in range(T):
                for r in range(n):
                    out[t, g * nr + r] = acc[t, r]


def _q6_k_entry(isa: str, layout: str):
    """(qs, sc, d, x, out, n_threads) of one REPACK layout ("8x4", "8x8") on one instruction set (plain
    values in the closure, as _entry's)."""
    vnni, fused = isa == "vnni", layout == "8x4"

    def entry(qs, sc, d, x, out, n_threads):
        prev = limit_threads(n_threads)
        if vnni:
            _mul_mat_q6_k(qs, sc, d, x, out, q6_k_subs_vnni, fused)
        else:
            _mul_mat_q6_k(qs, sc, d, x, out, q6_k_subs_avx2, fused)
        restore_threads(prev)
    entry.__name__ = entry.__qualname__ = f"q6_k_{layout}_{isa}"
    return njit(parallel=True, **NOPYTHON)(entry)


for _isa in KERNELS:
    KERNELS[_isa].update({f"q6_k_{lay}": _q6_k_entry(_isa, lay) for lay in ("8x4", "8x8")})

# each entry point also a module attribute under its name (vec_dot_avx2, q4_k_8x4_vnni, ...): llmlab.warm's
# census of the kernels (compiled or loaded) reads modules' attributes
globals().update({f.__name__: f for table in KERNELS.values() for f in table.values()})
