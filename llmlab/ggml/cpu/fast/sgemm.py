"""numba twin of llamafile's tinyBLAS for f16 x f16 (``llmlab.ggml.cpu.sgemm.mul_mat_f16``): a prompt's
KQ and KQV, bit for bit, at tinyBLAS's speed.

tinyBLAS keeps one register of KN lanes per output and fma's a whole register of weights against a
whole register of activations: lane l of output (r, t) sums A[r, k] * B[t, k] for k = l, l + KN, ...
A tile of RM weight rows x RN activation rows loads RM + RN registers per step for RM * RN fma's, which
is what makes it fast. Then ``hsum`` adds each register's lanes: upper half onto lower half until one
lane is left (``_mm512_reduce_add_ps``; on AVX2 extract, movehl, movehdup). This kernel keeps that
register layout and that tree, and adds the lanes of KN outputs at once: a level of the tree takes two
registers, puts the lower halves of their lane blocks in one register and the upper halves in
another (two shuffles) and adds those, so KN registers fold into one register of KN sums in KN - 1
additions, each the addition tinyBLAS makes.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from ._common import limit_threads, restore_threads
from .vec import _round_f16

RN = 4          # activation rows per tile; weight rows per tile: lanes // RN (a tile's outputs fill one register)


def halving(lanes: int):
    """The reduction tree of tinyBLAS's ``hsum`` on x86: each level adds lane i + half to lane i."""
    vals: list = list(range(lanes))
    while len(vals) > 1:
        half = len(vals) // 2
        vals = [(vals[i], vals[i + half]) for i in range(half)]
    return vals[0]


def fits(cpu) -> bool:
    """Whether this kernel has the profile's tinyBLAS: float32 registers of 8 or 16 lanes, the halving tree."""
    return (cpu.sgemm_acc == "f32" and cpu.sgemm_lanes in (8, 16)
            and cpu.sgemm_hsum_tree == halving(cpu.sgemm_lanes))


def _fold_lanes(builder, regs: list, lanes: int):
    """The halving tree on ``lanes`` registers at once: returns one register, lane o = output o's sum."""
    w = lanes                                      # width of each output's block of lanes
    while len(regs) > 1:
        half = w // 2
        lo = [x * lanes + b * w + m for x in (0, 1) for b in range(lanes // w) for m in range(half)]
        pick = [ir.Constant(ir.VectorType(ir.IntType(32), lanes), [i + d for i in lo]) for d in (0, half)]
        regs = [builder.fadd(builder.shuffle_vector(x, y, pick[0]), builder.shuffle_vector(x, y, pick[1]))
                for x, y in zip(regs[0::2], regs[1::2])]
        w = half
    return regs[0]


def _tile(lanes: int):
    """One tile: res[j * RM + i] = tinyBLAS's output for weight row min(r0 + i, R - 1) of kv head hk and
    activation row j of Bq. A (Hk, R, K) f16 bits, unit stride along K (widened as loaded, vcvtph2ps);
    Bq (RN, K) float32 C-contiguous, already rounded to f16 values; K a multiple of ``lanes``. Every
    register starts at +0 (tinyBLAS's zeroed Cv) and takes one fma per step."""
    RM = lanes // RN
    VF = ir.VectorType(ir.FloatType(), lanes)
    VH = ir.VectorType(ir.HalfType(), lanes)
    VI = ir.VectorType(ir.IntType(16), lanes)

    def typer(typingctx, A, hk, r0, Bq, res):
        def codegen(context, builder, signature, args):
            t = signature.args
            i64 = ir.IntType(64)
            a = context.make_array(t[0])(context, builder, args[0])
            _, R, K = cgutils.unpack_tuple(builder, a.shape, 3)
            s_h, s_r, _ = cgutils.unpack_tuple(builder, a.strides, 3)
            base = builder.gep(builder.bitcast(a.data, ir.IntType(8).as_pointer()),
                               [builder.mul(context.cast(builder, args[1], t[1], types.int64), s_h)])
            r0 = context.cast(builder, args[2], t[2], types.int64)
            last = builder.sub(R, ir.Constant(i64, 1))
            rows = []
            for i in range(RM):                    # rows past the end repeat the last (never stored)
                r = builder.add(r0, ir.Constant(i64, i))
                r = builder.select(builder.icmp_signed("<", r, R), r, last)
                rows.append(builder.bitcast(builder.gep(base, [builder.mul(r, s_r)]), ir.IntType(16).as_pointer()))
            bp = builder.bitcast(context.make_array(t[3])(context, builder, args[3]).data, ir.FloatType().as_pointer())
            rp = builder.bitcast(context.make_array(t[4])(context, builder, args[4]).data, VF.as_pointer())
            fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(VF, [VF] * 3), f"llvm.fma.v{lanes}f32")
            acc = [cgutils.alloca_once_value(builder, ir.Constant(VF, [0.0] * lanes)) for _ in range(RM * RN)]
            with cgutils.for_range(builder, builder.udiv(K, ir.Constant(i64, lanes))) as loop:
                k = builder.mul(loop.index, ir.Constant(i64, lanes))
                av = [builder.fpext(builder.bitcast(builder.load(builder.bitcast(builder.gep(p, [k]), VI.as_pointer()),
                                                                 align=2), VH), VF) for p in rows]
                for j in range(RN):
                    bv = builder.load(builder.bitcast(builder.gep(bp, [builder.add(builder.mul(ir.Constant(i64, j), K), k)]),
                                                      VF.as_pointer()), align=4)
                    for i in range(RM):
                        c = acc[j * RM + i]
                        builder.store(builder.call(fma, [av[i], bv, builder.load(c)]), c)
            regs = [builder.load(c) for c in acc]
            for g in range(0, RM * RN, lanes):
                builder.store(_fold_lanes(builder, regs[g:g + lanes], lanes),
                              builder.gep(rp, [ir.Constant(i64, g // lanes)]), align=4)
            return context.get_dummy_value()
        return types.none(A, hk, r0, Bq, res), codegen
    typer.__name__ = f"_tile_{RM}x{RN}_{lanes}"
    return intrinsic(typer)


_tile_16 = _tile(16)     # AVX-512: tinyBLAS<16, __m512, ...>, tiles of 4 x 4 outputs
_tile_8 = _tile(8)       # AVX2: tinyBLAS<8, __m256, ...>, tiles of 2 x 4


@njit(cache=True, parallel=True)
def mul_mat_f16(A, B, out, lanes, n_threads):
    """out[h, t, r] = tinyBLAS(A[h // (H / Hk), r], f16(B[h, t])): A (Hk, R, K) f16 bits with unit stride
    along K (the KV cache view as it lies), B (H, T, K) float32, rounded to f16 values here (ggml converts
    the activations to vec_dot_type first); ``lanes`` 16 or 8, K a multiple of it. Work items are (head,
    RN activation rows), on at most ``n_threads`` threads (0: the step's count)."""
    prev = limit_threads(n_threads)
    Hk, R, K = A.shape
    H, T = B.shape[0], B.shape[1]
    g = H // Hk
    RM = lanes // RN
    nq = -(-T // RN)
    for item in prange(H * nq):
        h = item // nq
        t0 = item % nq * RN
        nt = min(RN, T - t0)
        Bq = np.zeros((RN, K), np.float32)
        res = np.empty(RM * RN, np.float32)
        for j in range(nt):
            _round_f16(B[h, t0 + j], Bq[j])
        for r0 in range(0, R, RM):
            if lanes == 16:
                _tile_16(A, h // g, r0, Bq, res)
            else:
                _tile_8(A, h // g, r0, Bq, res)
            for j in range(nt):
                for i in range(min(RM, R - r0)):
                    out[h, t0 + j, r0 + i] = res[j * RM + i]
    restore_threads(prev)
