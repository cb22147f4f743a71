"""q4_0, q4_1 and q8_0 matmuls on AVX512-VNNI: the lane sums by ``vpdpbusd``, then ggml's float steps.

ggml's 8 float lanes of a 32-value block are sums of 4 consecutive products (lane j: values 4j..4j+3),
exact integers. ``vpdpbusd`` computes exactly such sums: in each 32-bit lane, 4 unsigned bytes times 4
signed bytes, added. So with the weights laid out 16 rows side by side, 4 codes per row and lane
(``pack``), one instruction gives one float lane of a block for 16 rows, where the generic kernels
(``q32``) spend a multiply and an add per code. Unsigned codes: q4_1's are (0..15); q4_0's codes c - 8
and q8_0's w are stored as c and w + 128, and the kernel subtracts 8 (128) times the lane's activation
sum, which is exact in int32. The float steps that follow (``acc_j = fma(d_x * d_w, lane_j, acc_j)``,
hsum_float_8, q4_1's m * s) are those of ``q32``: the same bits.

Packed layout: ``qs[g, b, c]`` bytes of row group g (rows 16g .. 16g+15, the last group zero-padded),
block b, chunk c of 64 bytes: q4 types 4 chunks, chunk j holding for each row r the 4 bytes 4j..4j+3 of
its block (low nibbles: values 4j+k, lane j; high nibbles: values 16+4j+k, lane j+4), i.e. the file's
bytes regrouped; q8_0 8 chunks, chunk j the 4 codes of lane j plus 128. ``d[g, b, r]`` (q4_1's ``m``): the
float16 scales as their bits.

Only where the host has AVX512-VNNI (:data:`AVAILABLE`; ``LLMLAB_VNNI=0`` turns it off); elsewhere the
generic kernels run, with the same results.
"""
from __future__ import annotations

import os

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from ._common import NOPYTHON, hsum8
from .quantize import quantize_q8_0 as _q8_0, quantize_q8_1 as _q8_1

R16 = 16                      # rows per group: one 512-bit register of int32 lanes
TYPES = ("q4_0", "q4_1", "q5_0", "q8_0")
OFFSET = {"q4_0": 8, "q4_1": 0, "q5_0": 16, "q8_0": 128}


def _host_has_vnni() -> bool:
    try:
        import llvmlite.binding as ll
        feats = ll.get_host_cpu_features()
    except Exception:           # noqa: BLE001 - no feature list: take the generic kernels
        return False
    return bool(feats.get("avx512vnni")) and bool(feats.get("avx512bw"))


AVAILABLE = os.environ.get("LLMLAB_VNNI", "1") != "0" and _host_has_vnni()

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


def _c32(v: int):
    return ir.Constant(_I32x16, [v] * 16)


def _high_bits(builder, qh, shift: int):
    """q5_0's fifth bits: from each row's 32-bit qh, bits shift .. shift+3 spread to bit 4 of the lane's
    4 bytes (t * 0x00204081 puts bit k of a 4-bit t at bit 8k, with no carries)."""
    t = builder.and_(builder.lshr(qh, _c32(shift)), _c32(15))
    spread = builder.and_(builder.mul(t, _c32(0x00204081)), _c32(0x01010101))
    return builder.bitcast(builder.shl(spread, _c32(4)), _I8x64)


def _step_codegen(nibbles: bool, offset: int, with_m: bool):
    def codegen(context, builder, signature, args):
        blk, a, qsum, w0, dw, dab, acc = args[:7]
        t = signature.args
        bp = _data(context, builder, t[0], blk, _I8)
        ap = _data(context, builder, t[1], a, _I32)
        sp = _data(context, builder, t[2], qsum, _I32)
        w0 = context.cast(builder, w0, t[3], types.intp)
        dpbusd = _intrinsic_fn(builder, "llvm.x86.avx512.vpdpbusd.512", _I32x16, [_I32x16] * 3)
        fma = _intrinsic_fn(builder, "llvm.fma.v16f32", _F32x16, [_F32x16] * 3)
        zero = ir.Constant(_I32x16, [0] * 16)
        word = lambda p, j: builder.load(builder.gep(p, [builder.add(w0, ir.Constant(w0.type, j))]))
        if nibbles:
            raw = [_vload(builder, bp, ir.Constant(_I32, 64 * j), _I8x64) for j in range(4)]
            codes = ([builder.and_(v, ir.Constant(_I8x64, [15] * 64)) for v in raw]
                     + [builder.lshr(v, ir.Constant(_I8x64, [4] * 64)) for v in raw])
        else:
            codes = [_vload(builder, bp, ir.Constant(_I32, 64 * j), _I8x64) for j in range(8)]
        dd = builder.fmul(_splat(builder, context.cast(builder, dab, t[5], types.float32), _F32x16),
                          _f16x16(builder, _data(context, builder, t[4], dw, _I16)))
        accp = _data(context, builder, t[6], acc, ir.FloatType())
        for j in range(8):
            lane = builder.call(dpbusd, [zero, builder.bitcast(codes[j], _I32x16), _splat(builder, word(ap, j), _I32x16)])
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


def _step(name: str, nibbles: bool, offset: int, with_m: bool = False):
    if with_m:
        def typer(typingctx, blk, a, qsum, w0, dw, dab, acc, mw, s, summ):
            return types.none(blk, a, qsum, w0, dw, dab, acc, mw, s, summ), _step_codegen(nibbles, offset, with_m)
    else:
        def typer(typingctx, blk, a, qsum, w0, dw, dab, acc):
            return types.none(blk, a, qsum, w0, dw, dab, acc), _step_codegen(nibbles, offset, with_m)
    typer.__name__ = name
    return intrinsic(typer)


# One block of 16 rows against one activation row: the 8 lane sums by vpdpbusd (blk: the block's 256
# bytes of nibbles or 512 bytes of codes; a[w0:w0+8]: the activation quads as int32 words; minus
# offset x their sums qsum[w0:w0+8]), then acc[j] = fma(dab * d_w, lane_j, acc[j]) across the rows
# (dw: their f16 scales, acc: (8, 16)); q4_1 also summ = fma(m_w, s, summ).
step_q4_0 = _step("step_q4_0", True, 8)                   # (blk, a, qsum, w0, dw, dab, acc)
step_q4_1 = _step("step_q4_1", True, 0, True)             # (blk, a, qsum, w0, dw, dab, acc, mw, s, summ)
step_q5_0 = _step("step_q5_0", False, 16)                 # blk: the codes of expand_q5_0
step_q8_0 = _step("step_q8_0", False, 128)


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
def _mul_mat(qs, qh, d, m, x, out):
    """qs (ng, nb, 256 or 512) uint8; qh (ng, nb, 16) uint32 (q5_0's fifth bits, else empty); d / m
    (ng, nb, 16) f16 bits (m: q4_1's, else empty); x (T, K) float32, quantized here; out (T, R) f32,
    R <= ng*16 (the rows past R are zero padding)."""
    ng, nb, nbytes = qs.shape
    R = out.shape[1]
    q41, q50 = m.shape[0] != 0, qh.shape[0] != 0
    aq4, qsum, ad, as_ = _quantize(x, q41)
    T = aq4.shape[0]
    for g in prange(ng):
        acc = np.zeros((T, 8, R16), np.float32)
        summ = np.zeros((T, R16), np.float32)
        codes = np.empty(512, np.uint8)
        for b in range(nb):
            blk = qs[g, b]
            dw = d[g, b]
            if q50:
                expand_q5_0(blk, qh[g, b], codes)
            for t in range(T):
                if q41:
                    step_q4_1(blk, aq4[t], qsum[t], 8 * b, dw, ad[t, b], acc[t], m[g, b], as_[t, b], summ[t])
                elif q50:
                    step_q5_0(codes, aq4[t], qsum[t], 8 * b, dw, ad[t, b], acc[t])
                elif nbytes == 256:
                    step_q4_0(blk, aq4[t], qsum[t], 8 * b, dw, ad[t, b], acc[t])
                else:
                    step_q8_0(blk, aq4[t], qsum[t], 8 * b, dw, ad[t, b], acc[t])
        n = min(R16, R - g * R16)
        for t in range(T):
            for r in range(n):
                v = hsum8(acc[t, 0, r], acc[t, 1, r], acc[t, 2, r], acc[t, 3, r],
                          acc[t, 4, r], acc[t, 5, r], acc[t, 6, r], acc[t, 7, r])
                out[t, g * R16 + r] = v + summ[t, r] if q41 else v


@njit(parallel=True, **NOPYTHON)
def mul_mat(qs, qh, d, m, x, out):
    """out (T, R) = x (T, K) float32 times the packed weight: activations quantized to the weight's
    partner type (q8_1 for q4_1, q8_0 otherwise), then the lane sums and float steps, rows in parallel."""
    _mul_mat(qs, qh, d, m, x, out)


@njit(**NOPYTHON)
def mul_mat_serial(qs, qh, d, m, x, out):
    _mul_mat(qs, qh, d, m, x, out)


# ---- packing (once per weight, at load) ---------------------------------------------------------

def _groups16(a: np.ndarray, R: int) -> np.ndarray:
    """(R, nb, ...) -> (ng, nb, ..., 16): rows zero-padded to a multiple of 16, then moved last."""
    ng = -(-R // R16)
    if ng * R16 != R:
        a = np.concatenate([a, np.zeros((ng * R16 - R,) + a.shape[1:], a.dtype)])
    a = a.reshape((ng, R16) + a.shape[1:])
    return np.ascontiguousarray(np.moveaxis(a, 1, -1))


def pack(raw: np.ndarray, tname: str, K: int) -> tuple:
    """Raw rows (R, row_bytes) uint8 of q4_0 / q4_1 / q5_0 / q8_0 -> (qs, qh, d, m) in this module's layout."""
    from ...quant import legacy as L
    layout = {"q4_0": L.BLOCK_Q4_0, "q4_1": L.BLOCK_Q4_1, "q5_0": L.BLOCK_Q5_0, "q8_0": L.BLOCK_Q8_0}[tname]
    nb = K // 32
    w = np.ascontiguousarray(raw).reshape(-1).view(layout).reshape(-1, nb)
    R = w.shape[0]
    codes = np.ascontiguousarray(w["qs"]).view(np.uint8)                # (R, nb, 16 or 32)
    if tname == "q8_0":
        codes = codes ^ np.uint8(0x80)                                  # w + 128 as an unsigned byte
    nq = codes.shape[-1] // 4
    q = codes.reshape(R, nb, nq, 4)                                     # (row, block, lane, k)
    ng = -(-R // R16)
    if ng * R16 != R:
        q = np.concatenate([q, np.zeros((ng * R16 - R, nb, nq, 4), np.uint8)])
    qs = np.ascontiguousarray(q.reshape(ng, R16, nb, nq, 4).transpose(0, 2, 3, 1, 4)).reshape(ng, nb, nq * R16 * 4)
    d = _groups16(np.ascontiguousarray(w["d"]).view(np.uint16), R)
    m = (_groups16(np.ascontiguousarray(w["m"]).view(np.uint16), R) if tname == "q4_1"
         else np.zeros((0, nb, R16), np.uint16))
    qh = (_groups16(np.ascontiguousarray(w["qh"]).view("<u4").reshape(R, nb), R) if tname == "q5_0"
          else np.zeros((0, nb, R16), np.uint32))
    return qs, qh, d, m
