"""Quantized matmuls by byte dot products (q4_0, q4_1, q5_0, q8_0, q6_K, and q4_K in the REPACK buffer): the
integer sums four byte products at a time, then ggml's float steps.

ggml's 8 float lanes of a 32-value block are sums of 4 consecutive products (lane j: values 4j..4j+3),
exact integers. AVX512-VNNI's ``vpdpbusd`` computes exactly such sums: in each 32-bit lane, 4 unsigned
bytes times 4 signed bytes, added; on AVX2, ``pmaddubsw`` (pairs into int16) then ``pmaddwd`` by ones
(pairs of pairs into int32) give the same sums. So with the weights laid out 16 rows side by side, 4
codes per row and lane (``pack_legacy``), one instruction (or two) gives one float lane of a block for 16 rows,
where the generic kernels (``quants``) spend a multiply and an add per code. The codes must be unsigned:
q4_1's are (0..15); q4_0's c - 8, q5_0's c - 16 and q8_0's w are used as c and w + 128, and the kernel
subtracts 8 (16, 128) times the lane's activation sum, which is exact in int32 (on AVX2, where w + 128
would saturate pmaddubsw's int16 pairs, q8_0 takes ggml's |w| x sign(a, w) instead). The float steps
that follow (``acc_j = fma(d_x * d_w, lane_j, acc_j)``, hsum_float_8, q4_1's m * s) are those of
``quants.vec_dot_legacy``: the same bits. q4_K's sub-block dots (32 values) are 8 accumulating byte dots; its float steps
are those of ``repack.mul_mat_q4_k_repacked``.

The inner steps are LLVM IR (``@intrinsic``: vector loads, ``llvm.x86.avx512.vpdpbusd.512`` or
``llvm.x86.avx2.pmadd.ub.sw`` / ``pmadd.wd``, ``llvm.fma``), because numba has no vector types; the
loops around them are numba, one body compiled once per instruction set (``KERNELS``).

Packed layout: ``qs[g, b, c]`` bytes of row group g (rows 16g .. 16g+15, the last group zero-padded),
block b, chunk c of 64 bytes: q4 types 4 chunks, chunk j holding for each row r the 4 bytes 4j..4j+3 of
its block (low nibbles: values 4j+k, lane j; high nibbles: values 16+4j+k, lane j+4), i.e. the file's
bytes regrouped; q5_0 the same plus ``qh[g, b, r]`` (its 32 fifth bits); q8_0 8 chunks, chunk j the 4
codes of lane j plus 128. ``d[g, b, r]`` (q4_1's ``m``): the float16 scales as their bits. q4_K: see
``pack_q4_k``.

:data:`ISA` is the best set the host runs ("vnni", "avx2"), when numba compiles for the host;
``LLMLAB_DOT4=avx2`` picks a lesser one, ``LLMLAB_DOT4=0`` turns these kernels off (the generic ones
run). Every choice gives the same bits.
"""
from __future__ import annotations

import functools

import numpy as np
from llvmlite import ir
import numba
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from .... import config
from ._common import NOPYTHON, as_f32, fma, hsum8, limit_threads, restore_threads
from .quants import groups as _groups, pair_sums
from .repack import repack_step
from .quantize import quantize_q8_0 as _q8_0, quantize_q8_1 as _q8_1, quantize_q8_k as _q8_k

R16 = 16                      # rows per group: one 512-bit register of int32 lanes
TYPES = ("q4_0", "q4_1", "q5_0", "q8_0")
OFFSET = {"q4_0": 8, "q4_1": 0, "q5_0": 16, "q8_0": 128}   # the codes are used as c + OFFSET (unsigned)


def host_isas() -> tuple[str, ...]:
    """The byte-dot instruction sets this host runs: "vnni" (AVX512-VNNI with AVX512BW), "avx2"."""
    from ..profiles import cpu_flags, machine        # the one CPU detector (x86 flags only on an x86 machine)
    feats = cpu_flags() if machine() == "x86_64" else set()
    out = []
    if {"avx512_vnni", "avx512bw"} <= feats:
        out.append("vnni")
    if {"avx2", "fma", "f16c"} <= feats:
        out.append("avx2")
    return tuple(out)


def _compiles_for_host() -> bool:
    return (numba.config.CPU_NAME or "host") == "host" and not numba.config.CPU_FEATURES


@functools.cache
def _choose() -> str | None:
    """LLMLAB_DOT4 (config.dot4): unset (the best the host runs), 0 (none: the generic kernels), or one of
    host_isas(); read on first use."""
    want = config.dot4()
    if want == "0" or not _compiles_for_host():
        return None
    isas = host_isas()
    if want and want in isas:
        return want
    return isas[0] if isas else None


def __getattr__(name: str):
    """ISA (the kernels dispatch takes: the best the host has, None: the generic ones) and AVAILABLE."""
    if name in ("ISA", "AVAILABLE"):
        return _choose() if name == "ISA" else _choose() is not None
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_I8, _I16, _I32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)
_I8x64 = ir.VectorType(_I8, 64)
_I32x16 = ir.VectorType(_I32, 16)
_F32x16 = ir.VectorType(ir.FloatType(), 16)


def _data(context, builder, arrty, arr, elem):
    """The data pointer of a contiguous array, as a pointer to ``elem``."""
    return builder.bitcast(context.make_array(arrty)(context, builder, arr).data, elem.as_pointer())


def _vload(builder, ptr, index, vec):
    p = builder.gep(ptr, [index])
    return builder.load(builder.bitcast(p, vec.as_pointer()), align=1)


def _vstore(builder, ptr, index, value):
    p = builder.gep(ptr, [index])
    builder.store(value, builder.bitcast(p, value.type.as_pointer()), align=1)


def _splat(builder, x, vec):
    v = builder.insert_element(ir.Constant(vec, None), x, ir.Constant(_I32, 0))
    return builder.shuffle_vector(v, ir.Constant(vec, None), ir.Constant(_I32x16, [0] * vec.count))


def _intrinsic_fn(builder, name, ret, args):
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, args), name)


def _f16x16(builder, ptr):
    """16 float16 bits at ptr -> <16 x float> (vcvtph2ps)."""
    h = _vload(builder, ptr, ir.Constant(_I32, 0), ir.VectorType(_I16, 16))
    return builder.fpext(builder.bitcast(h, ir.VectorType(ir.HalfType(), 16)), _F32x16)


def _dot4(builder, isa: str, acc, u8, word, signed: bool = False):
    """acc + the 16 lanes' sums of 4 byte products: u8 (<64 x i8>, unsigned codes; with ``signed`` the
    bytes are signed codes) times the 4 signed bytes of the int32 ``word`` (broadcast). VNNI: one
    vpdpbusd. AVX2: pmaddubsw (pairs, int16) then pmaddwd by ones (quads, int32), per 8 rows; exact
    while a pair cannot saturate int16: unsigned codes up to 63 (2 * 63 * 128 < 2^15), or, for signed
    codes (q8_0), ggml's |w| x sign(a, w) with activations in -127..127, as ggml's quantizers make them."""
    w = _splat(builder, word, _I32x16)
    if isa == "vnni":
        if signed:
            raise ValueError("vpdpbusd takes unsigned codes")
        fn = _intrinsic_fn(builder, "llvm.x86.avx512.vpdpbusd.512", _I32x16, [_I32x16] * 3)
        return builder.call(fn, [acc, builder.bitcast(u8, _I32x16), w])
    sb = builder.bitcast(w, _I8x64)
    if signed:
        zero = ir.Constant(_I8x64, [0] * 64)
        neg = builder.icmp_signed("<", u8, zero)
        ax = builder.select(neg, builder.sub(zero, u8), u8)                     # |w| (-128 -> 128 unsigned)
        sb = builder.select(neg, builder.sub(zero, sb), builder.select(builder.icmp_signed("==", u8, zero), zero, sb))
        u8 = ax
    I8x32, I16x16, I32x8 = ir.VectorType(_I8, 32), ir.VectorType(_I16, 16), ir.VectorType(_I32, 8)
    maddubs = _intrinsic_fn(builder, "llvm.x86.avx2.pmadd.ub.sw", I16x16, [I8x32, I8x32])
    maddwd = _intrinsic_fn(builder, "llvm.x86.avx2.pmadd.wd", I32x8, [I16x16, I16x16])
    ones = ir.Constant(I16x16, [1] * 16)
    halves = []
    for h in range(2):
        idx = ir.Constant(ir.VectorType(_I32, 32), list(range(32 * h, 32 * h + 32)))
        uh = builder.shuffle_vector(u8, ir.Constant(_I8x64, None), idx)
        sh = builder.shuffle_vector(sb, ir.Constant(_I8x64, None), idx)
        halves.append(builder.call(maddwd, [builder.call(maddubs, [uh, sh]), ones]))
    both = builder.shuffle_vector(halves[0], halves[1], ir.Constant(_I32x16, list(range(16))))
    return builder.add(acc, both)


def _c32(v: int):
    return ir.Constant(_I32x16, [v] * 16)


def _high_bits(builder, qh, shift: int):
    """q5_0's fifth bits: from each row's 32-bit qh, bits shift .. shift+3 spread to bit 4 of the lane's
    4 bytes (t * 0x00204081 puts bit k of a 4-bit t at bit 8k, with no carries)."""
    t = builder.and_(builder.lshr(qh, _c32(shift)), _c32(15))
    spread = builder.and_(builder.mul(t, _c32(0x00204081)), _c32(0x01010101))
    return builder.bitcast(builder.shl(spread, _c32(4)), _I8x64)


def _step_codegen(nibbles: bool, offset: int, with_m: bool, isa: str):
    signed = isa == "avx2" and offset == 128           # q8_0 on AVX2: the signed codes, no offset
    if signed:
        offset = 0

    def codegen(context, builder, signature, args):
        blk, a, qsum, w0, dw, dab, acc = args[:7]
        t = signature.args
        bp = _data(context, builder, t[0], blk, _I8)
        ap = _data(context, builder, t[1], a, _I32)
        sp = _data(context, builder, t[2], qsum, _I32)
        w0 = context.cast(builder, w0, t[3], types.intp)
        fma = _intrinsic_fn(builder, "llvm.fma.v16f32", _F32x16, [_F32x16] * 3)
        zero = ir.Constant(_I32x16, [0] * 16)
        word = lambda p, j: builder.load(builder.gep(p, [builder.add(w0, ir.Constant(w0.type, j))]))
        if nibbles:
            raw = [_vload(builder, bp, ir.Constant(_I32, 64 * j), _I8x64) for j in range(4)]
            codes = ([builder.and_(v, ir.Constant(_I8x64, [15] * 64)) for v in raw]
                     + [builder.lshr(v, ir.Constant(_I8x64, [4] * 64)) for v in raw])
        else:
            codes = [_vload(builder, bp, ir.Constant(_I32, 64 * j), _I8x64) for j in range(8)]
            if signed:                                       # stored as w + 128: back to w
                codes = [builder.xor(c, ir.Constant(_I8x64, [0x80] * 64)) for c in codes]
        dd = builder.fmul(_splat(builder, context.cast(builder, dab, t[5], types.float32), _F32x16),
                          _f16x16(builder, _data(context, builder, t[4], dw, _I16)))
        accp = _data(context, builder, t[6], acc, ir.FloatType())
        for j in range(8):
            lane = _dot4(builder, isa, zero, codes[j], word(ap, j), signed)
            if offset:
                c = builder.mul(word(sp, j), ir.Constant(_I32, offset))
                lane = builder.sub(lane, _splat(builder, c, _I32x16))
            idx = ir.Constant(_I32, 16 * j)
            _vstore(builder, accp, idx, builder.call(fma, [dd, builder.sitofp(lane, _F32x16), _vload(builder, accp, idx, _F32x16)]))
        if with_m:                                           # q4_1: summ = fma(m_w, s_x, summ)
            mw, s, summ = args[7:]
            m = _f16x16(builder, _data(context, builder, t[7], mw, _I16))
            sv = _splat(builder, context.cast(builder, s, t[8], types.float32), _F32x16)
            p = _data(context, builder, t[9], summ, ir.FloatType())
            _vstore(builder, p, ir.Constant(_I32, 0), builder.call(fma, [m, sv, _vload(builder, p, ir.Constant(_I32, 0), _F32x16)]))
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
        bp = _data(context, builder, t[0], args[0], _I8)
        h = _vload(builder, _data(context, builder, t[1], args[1], _I32), ir.Constant(_I32, 0), _I32x16)
        op = _data(context, builder, t[2], args[2], _I8)
        for j in range(4):
            v = _vload(builder, bp, ir.Constant(_I32, 64 * j), _I8x64)
            lo = builder.or_(builder.and_(v, ir.Constant(_I8x64, [15] * 64)), _high_bits(builder, h, 4 * j))
            hi = builder.or_(builder.lshr(v, ir.Constant(_I8x64, [4] * 64)), _high_bits(builder, h, 16 + 4 * j))
            _vstore(builder, op, ir.Constant(_I32, 64 * j), lo)
            _vstore(builder, op, ir.Constant(_I32, 64 * (j + 4)), hi)
        return context.get_dummy_value()
    return types.none(blk, qh, out), codegen


@njit(inline="always", **NOPYTHON)
def _quantize(x, q41):
    """x (T, K) float32 -> (aq4 (T, K/4) int32: the int8 codes four to a word, qsum: each word's four
    codes added, d, s): q8_1 blocks for q4_1, q8_0 blocks (s empty) otherwise."""
    if q41:
        aq, ad, as_ = _q8_1(x)
    else:
        aq, ad = _q8_0(x)
        as_ = np.zeros((0, 0), np.float32)
    T, K = aq.shape
    qsum = np.empty((T, K // 4), np.int32)
    for t in range(T):
        for i in range(K // 4):
            qsum[t, i] = (np.int32(aq[t, 4 * i]) + np.int32(aq[t, 4 * i + 1])
                          + np.int32(aq[t, 4 * i + 2]) + np.int32(aq[t, 4 * i + 3]))
    return aq.view(np.int32), qsum, ad, as_


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


# ---- q4_K in the REPACK buffer: ggml_gemv / ggml_gemm_q4_K_8x8_q8_K --------------------------------

def _q4_k_dots(isa: str):
    """D[c] = the 16 rows' integer dots of sub-block c (32 values) of one q4_K super-block with the
    activations: blk (2048 bytes: chunk 8j + q holds, per row, the 4 bytes 32j+4q .. 32j+4q+3, whose
    low nibbles are values 64j+4q.. of sub-block 2j and high nibbles those of sub-block 2j+1);
    a[w0:w0+64] the 256 int8 activations as words. 8 accumulating byte dots per sub-block."""
    def typer(typingctx, blk, a, w0, D):
        def codegen(context, builder, signature, args):
            t = signature.args
            bp = _data(context, builder, t[0], args[0], _I8)
            ap = _data(context, builder, t[1], args[1], _I32)
            w0 = context.cast(builder, args[2], t[2], types.intp)
            dp = _data(context, builder, t[3], args[3], _I32)
            word = lambda j: builder.load(builder.gep(ap, [builder.add(w0, ir.Constant(w0.type, j))]))
            for j in range(4):
                lo_acc = hi_acc = ir.Constant(_I32x16, [0] * 16)
                for q in range(8):
                    v = _vload(builder, bp, ir.Constant(_I32, 64 * (8 * j + q)), _I8x64)
                    lo = builder.and_(v, ir.Constant(_I8x64, [15] * 64))
                    hi = builder.lshr(v, ir.Constant(_I8x64, [4] * 64))
                    lo_acc = _dot4(builder, isa, lo_acc, lo, word(16 * j + q))
                    hi_acc = _dot4(builder, isa, hi_acc, hi, word(16 * j + 8 + q))
                _vstore(builder, dp, ir.Constant(_I32, 16 * (2 * j)), lo_acc)
                _vstore(builder, dp, ir.Constant(_I32, 16 * (2 * j + 1)), hi_acc)
            return context.get_dummy_value()
        return types.none(blk, a, w0, D), codegen
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
    aq, ad, bsums = _q8_k(x)
    aq4 = aq.view(np.int32)
    T = aq.shape[0]
    n_gemm = T - T % 4
    for g in prange(ng):
        D = np.empty((8, nr), np.int32)
        acc = np.zeros((T, nr), np.float32)
        accm = np.zeros((T, nr), np.float32)
        for b in range(nb):
            blk = qs[g, b]
            s_, m_, dw, dmw = sc[g, b], mn[g, b], d[g, b], dmin[g, b]
            for t in range(T):
                dots(blk, aq4[t], 64 * b, D)
                ya = ad[t, b]
                p = pair_sums(bsums, t, 16 * b)
                gemm = t < n_gemm
                at, amt = acc[t], accm[t]
                for r in range(nr):
                    at[r], amt[r] = repack_step(at[r], amt[r], s_, m_, D, p, r, as_f32(dw[r]) * ya,
                                                as_f32(dmw[r]) * ya, gemm)
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
    int32."""
    def typer(typingctx, blk, a, w0, out):
        def codegen(context, builder, signature, args):
            t = signature.args
            bp = _data(context, builder, t[0], args[0], _I8)
            ap = _data(context, builder, t[1], args[1], _I32)
            w0 = context.cast(builder, args[2], t[2], types.intp)
            op = _data(context, builder, t[3], args[3], _I32)
            for o in range(64 // per):
                acc = ir.Constant(_I32x16, [0] * 16)
                for j in range(per * o, per * o + per):
                    v = _vload(builder, bp, ir.Constant(_I32, 64 * j), _I8x64)
                    wd = builder.load(builder.gep(ap, [builder.add(w0, ir.Constant(w0.type, j))]))
                    acc = _dot4(builder, isa, acc, v, wd)
                _vstore(builder, op, ir.Constant(_I32, 16 * o), acc)
            return context.get_dummy_value()
        return types.none(blk, a, w0, out), codegen
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
    aq, ad, bsums = _q8_k(x)
    aq4 = aq.view(np.int32)
    T = aq.shape[0]
    for g in prange(ng):
        Q = np.empty((64, nr), np.int32)
        L = np.empty((8, nr), np.int32)
        acc = np.zeros((T, 8, nr), np.float32)
        for b in range(nb):
            s_, dw = sc[g, b], d[g, b]
            for t in range(T):
                ya = ad[t, b]
                k = 16 * b
                if tiled:
                    subs(qs[g, b], aq4[t], 64 * b, Q)   # Q[:16]: the 16 sub-block dots
                    s1 = L[0]                           # per row: sum over the 16 sub-blocks of
                    s1[:] = 0                           # scale x (dot - 32 x block sum), in int32
                    for sb in range(16):
                        qsb, ssb = Q[sb], s_[sb]
                        bs = np.int32(32 * np.int32(bsums[t, k + sb]))
                        for r in range(nr):
                            s1[r] = np.int32(s1[r] + np.int32(np.int32(ssb[r]) * np.int32(qsb[r] - bs)))
                    at = acc[t, 0]
                    for r in range(nr):
                        at[r] = fma(as_f32(dw[r]) * np.float32(s1[r]), ya, at[r])
                else:
                    quads(qs[g, b], aq4[t], 64 * b, Q)
                    for u in range(8):                  # chunk c: lanes 0-3 take scale 2c, lanes 4-7 scale 2c+1
                        h = u >> 2
                        Lu, q0, s0 = L[u], Q[u], s_[h]
                        for r in range(nr):
                            Lu[r] = np.int32(np.int32(s0[r]) * q0[r])
                        for c in range(1, 8):
                            qc, sc_ = Q[8 * c + u], s_[2 * c + h]
                            for r in range(nr):
                                Lu[r] = np.int32(Lu[r] + np.int32(np.int32(sc_[r]) * qc[r]))
                        b0, b1 = np.int32(bsums[t, k + 2 * u]), np.int32(bsums[t, k + 2 * u + 1])
                        sa, sb_ = s_[2 * u], s_[2 * u + 1]
                        for r in range(nr):
                            Lu[r] = np.int32(Lu[r] - np.int32(32 * np.int32(np.int32(np.int32(sa[r]) * b0)
                                                                             + np.int32(np.int32(sb_[r]) * b1))))
                    for u in range(8):
                        au, Lu = acc[t, u], L[u]
                        for r in range(nr):
                            au[r] = fma(ya * as_f32(dw[r]), Lu[r], au[r])
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


# the entry points per instruction set for the legacy quants, q4_K and q6_K: each takes n_threads last
# (1 for work too small to wake other threads, 0 for the step's count), so one compiled kernel serves both
KERNELS = {"vnni": {"legacy": mul_mat_vnni, "q4_k": mul_mat_q4_k_vnni, "q6_k": mul_mat_q6_k_vnni},
           "avx2": {"legacy": mul_mat_avx2, "q4_k": mul_mat_q4_k_avx2, "q6_k": mul_mat_q6_k_avx2}}


# ---- packing (once per weight, at load) ---------------------------------------------------------

def _groups16(a: np.ndarray, R: int) -> np.ndarray:
    """(R, nb, ...) -> (ng, nb, ..., 16): per-row values (scales) of 16-row groups, the rows last."""
    return _groups(a, R, R16)


def _chunks(q: np.ndarray, R: int) -> np.ndarray:
    """Codes (R, nb, ..., 4) -> (ng, nb, n * 64) bytes: for each block the chunks of 64 bytes, each the
    4 codes of 16 rows side by side (the rows moved before the last axis)."""
    g = _groups(q, R, R16, axis=-2)
    return g.reshape(g.shape[0], g.shape[1], -1)


def pack_legacy(raw: np.ndarray, tname: str, K: int) -> tuple:
    """Raw rows (R, row_bytes) uint8 of q4_0 / q4_1 / q5_0 / q8_0 -> (qs, qh, d, m) in this module's layout."""
    from ...quant import legacy as L
    layout = {"q4_0": L.BLOCK_Q4_0, "q4_1": L.BLOCK_Q4_1, "q5_0": L.BLOCK_Q5_0, "q8_0": L.BLOCK_Q8_0}[tname]
    nb = K // 32
    w = np.ascontiguousarray(raw).reshape(-1).view(layout).reshape(-1, nb)
    R = w.shape[0]
    codes = np.ascontiguousarray(w["qs"]).view(np.uint8)                # (R, nb, 16 or 32)
    if tname == "q8_0":
        codes = codes ^ np.uint8(0x80)                                  # w + 128 as an unsigned byte
    qs = _chunks(codes.reshape(R, nb, -1, 4), R)                        # (row, block, lane, k)
    d = _groups16(np.ascontiguousarray(w["d"]).view(np.uint16), R)
    m = (_groups16(np.ascontiguousarray(w["m"]).view(np.uint16), R) if tname == "q4_1"
         else np.zeros((0, nb, R16), np.uint16))
    qh = (_groups16(np.ascontiguousarray(w["qh"]).view("<u4").reshape(R, nb), R) if tname == "q5_0"
          else np.zeros((0, nb, R16), np.uint32))
    return qs, qh, d, m


def pack_q4_k(raw: np.ndarray, tname: str, K: int) -> tuple:
    """Raw rows (R, row_bytes) of q4_K -> (qs, sc, mn, d, dmin) in the layout of _mul_mat_q4_k."""
    from ...quant import k_quants as KQ
    nb = K // 256
    w = np.ascontiguousarray(raw).reshape(-1).view(KQ.BLOCK_Q4_K).reshape(-1, nb)
    R = w.shape[0]
    qs = _chunks(np.ascontiguousarray(w["qs"]).reshape(R, nb, 4, 8, 4), R)  # (row, block, j, q, k)
    sc, mn = KQ.scale_min_k4(w.reshape(-1)["scales"])
    return (qs, _groups16(sc.astype(np.uint8).reshape(R, nb, 8), R), _groups16(mn.astype(np.uint8).reshape(R, nb, 8), R),
            _groups16(np.ascontiguousarray(w["d"]).view(np.uint16), R),
            _groups16(np.ascontiguousarray(w["dmin"]).view(np.uint16), R))


def pack_q6_k(raw: np.ndarray, tname: str, K: int) -> tuple:
    """Raw rows (R, row_bytes) of q6_K -> (qs, sc, d) in the layout of _mul_mat_q6_k: the unsigned 6-bit
    codes as bytes, chunk 8c + u holding quad u of 32-value chunk c for 16 rows; scales int8; d f16 bits."""
    from ...quant import k_quants as KQ
    nb = K // 256
    w = np.ascontiguousarray(raw).reshape(-1).view(KQ.BLOCK_Q6_K).reshape(-1, nb)
    R = w.shape[0]
    codes = (KQ.q6k_codes(w.reshape(-1)).astype(np.int16) + 32).astype(np.uint8)
    qs = _chunks(codes.reshape(R, nb, 8, 8, 4), R)                          # (row, block, c, u, k)
    return (qs, _groups16(np.ascontiguousarray(w["scales"]).view(np.int8).reshape(R, nb, 16), R),
            _groups16(np.ascontiguousarray(w["d"]).view(np.uint16), R))
