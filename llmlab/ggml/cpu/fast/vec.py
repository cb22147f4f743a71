"""numba twins of ggml-cpu's float vector code (vec.h / vec.cpp), bit for bit (llamafile's tinyBLAS: ``sgemm``).

Each kernel does the arithmetic of its NumPy reference in ``llmlab.ggml.cpu.vec`` in the same
order: a fused multiply-add is the FMA instruction (``_common.fma``), SIMD lanes are explicit loops, and every horizontal sum
adds lanes in the tree of its intrinsic. The CPU profile reaches the kernels as plain numbers
(:class:`VecParams`): lane counts, the expf variant, and each reduction tree compiled to a small
program of pairwise additions, so one compiled kernel serves every profile.

numba has no float16: f16 weights (the KV cache) arrive as their uint16 bits and are widened in
the inner loop; f16-rounded activations arrive as float32.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from ._common import as_f32, f16_bits_to_f32, f16_round, f32_to_f16_bits, fma, limit_threads, restore_threads

EXPF_CODES = {"scalef": 0, "bits": 1}
ZERO = np.float32(0.0)          # a register's start (GGML_F32_VEC_ZERO): fma onto it turns a -0 product into +0


def tree_program(tree, n_lanes: int) -> np.ndarray:
    """A reduction tree (``llmlab.ggml.cpu.simd``: a lane index or a pair of trees) as rows (a, b) of
    additions over a scratch buffer that starts with the lanes; row k writes slot n_lanes + k."""
    prog: list[tuple[int, int]] = []

    def emit(t) -> int:
        if isinstance(t, int):
            return t
        a, b = emit(t[0]), emit(t[1])
        prog.append((a, b))
        return n_lanes + len(prog) - 1
    emit(tree)
    return np.array(prog, np.int64).reshape(-1, 2)


class VecParams(NamedTuple):
    """What the vector kernels need of a CPU profile, as numba-friendly values."""
    lanes: int                  # GGML_F32_EPR
    arr: int                    # GGML_F32_ARR
    vec_prog: np.ndarray        # GGML_F32_VEC_REDUCE's last register
    hsum_prog: np.ndarray       # one register's horizontal sum (softmax blocks)
    expf: int                   # EXPF_CODES


_PARAMS: dict[str, VecParams] = {}


def params(cpu) -> VecParams:
    p = _PARAMS.get(cpu.name)
    if p is None:
        p = _PARAMS[cpu.name] = VecParams(
            cpu.f32_lanes, cpu.f32_arr, tree_program(cpu.vec_reduce_tree, cpu.f32_lanes),
            tree_program(cpu.hsum_tree, cpu.f32_lanes), EXPF_CODES[cpu.expf])
    return p


# ---- f16 dot products: ggml_vec_dot_f16 (one activation row; tinyBLAS takes two or more: sgemm) ----
#
# ``n_reg`` registers (GGML_F32_ARR) of ``lanes`` floats per output, fma'd step after step along K
# (arr*lanes elements a step), then folded pairwise (upper half onto lower) and the last register's
# lanes added by ``prog``. The kernels run that for a whole column of cache rows at once: every
# register lane becomes a row of a (lanes, R) block, so the inner loops run across rows, contiguous
# and vectorized.

RB = 128     # cache rows per block in _dot_rows: the block's registers (step x RB floats) stay in L1


@njit(inline="always")
def _widen_transposed(A, hk, AT):
    """AT[k, r // RB, r % RB] = float32(A[hk, r, k]): one pass over the cache rows (read along K), so
    every later loop runs along rows on contiguous floats, RB rows at a time (zero-padded)."""
    R, K = A.shape[1], A.shape[2]
    for r in range(R):
        for k in range(K):
            AT[k, r // RB, r % RB] = f16_bits_to_f32(A[hk, r, k])


@njit(inline="always")
def _add_rows(x, y, out):
    for r in range(out.shape[0]):
        out[r] = x[r] + y[r]


@njit(inline="always")
def _copy_row(x, out):
    for r in range(out.shape[0]):
        out[r] = x[r]


@njit(inline="always")
def _fold(regs, lanes):
    """GGML_F32_VEC_REDUCE's first part on ``regs`` (registers' lanes x columns, or registers x lanes):
    the upper half of the registers added onto the lower half until one register is left."""
    h = regs.shape[0]
    while h > lanes:
        h //= 2
        for j in range(h):
            _add_rows(regs[j], regs[j + h], regs[j])


@njit(inline="always")
def _tree(scratch, lanes, prog):
    """The lanes in ``scratch[:lanes]`` (one column per output) added by the tree, vectorized across
    the columns; returns the row holding the sums."""
    for k in range(prog.shape[0]):
        _add_rows(scratch[prog[k, 0]], scratch[prog[k, 1]], scratch[lanes + k])
    return scratch[lanes + prog.shape[0] - 1]


@njit(inline="always")
def _dot_rows(AT, blk0, blk1, b, out_row, n_reg, lanes, prog, acc, scratch):
    """out_row[(blk - blk0) W + w] = AT[:, blk, w] . b for the blocks blk0..blk1 of AT (K, NB, W), float32
    or f16 bits, in the order of n_reg registers of ``lanes``: vectorized across the W rows of a block
    (short K, many rows: the attention scores; or V's rows read in place against the probabilities).
    The loops index with plain range variables and whole rows: an index like ``r0 + r`` in the inner
    loop made LLVM keep every lane scalar."""
    K, W = AT.shape[0], AT.shape[2]
    R = out_row.shape[0]
    step = n_reg * lanes
    np_ = K - K % step
    for blk in range(blk0, blk1):
        if K == step and n_reg == 4:                            # one step of four registers (head_dim == step):
            for l in range(lanes):                              # products and register fold in one pass per lane
                a0, a1, a2, a3 = AT[l, blk], AT[lanes + l, blk], AT[2 * lanes + l, blk], AT[3 * lanes + l, blk]
                b0, b1, b2, b3 = b[l], b[lanes + l], b[2 * lanes + l], b[3 * lanes + l]
                sl = scratch[l]
                for r in range(W):
                    sl[r] = ((fma(as_f32(a0[r]), b0, ZERO) + fma(as_f32(a2[r]), b2, ZERO))
                             + (fma(as_f32(a1[r]), b1, ZERO) + fma(as_f32(a3[r]), b3, ZERO)))
        else:
            if np_ == 0:
                acc[:, :] = 0
            for j in range(min(step, np_)):                     # the first step: fma onto the zeroed register
                bj = b[j]                                       # (a*b, but a -0 product gives +0, as ggml's)
                a = AT[j, blk]
                row = acc[j]
                for r in range(W):
                    row[r] = fma(as_f32(a[r]), bj, ZERO)
            for i in range(step, np_, step):
                for j in range(step):                           # register j // lanes, lane j % lanes
                    bj = b[i + j]
                    a = AT[i + j, blk]
                    row = acc[j]
                    for r in range(W):
                        row[r] = fma(as_f32(a[r]), bj, row[r])
            _fold(acc, lanes)
            for l in range(lanes):
                _copy_row(acc[l], scratch[l])
        last = _tree(scratch, lanes, prog)
        r0 = (blk - blk0) * W
        o = out_row[r0:]
        for r in range(min(W, R - r0)):
            total = np.float64(last[r])
            for k in range(np_, K):                             # vec_dot_f16's tail, one by one in double
                total += np.float64(as_f32(AT[k, blk, r]) * b[k])
            o[r] = np.float32(total)


@njit(inline="always")
def _row_lanes(a, b2, acc, regs):
    """One f16 row ``a`` (S, step) against ``b2`` (S, step) along K, as vec_dot_f16 runs it: the step's
    registers fma'd step after step, then folded; the last register's lanes are left in ``regs[0]``.
    Indexed by plain range variables (an index like ``i + j`` made LLVM keep every lane scalar)."""
    S, step = a.shape
    for j in range(step):
        acc[j] = fma(f16_bits_to_f32(a[0, j]), b2[0, j], ZERO)     # onto the zeroed register (+0, never -0)
    for i in range(1, S):
        for j in range(step):
            acc[j] = fma(f16_bits_to_f32(a[i, j]), b2[i, j], acc[j])
    _fold(regs, 1)


@njit(cache=True)
def mul_mat_f16_long(A4, X, out, lanes, prog):
    """out[h, t, r] = A[h // (H / Hk), r] . f16(X[h, t]) for A4 (Hk, R, K/step, step) f16 bits, contiguous
    rows of a long K in whole steps of vec_dot_f16 (attention's V^T against the probabilities), along K."""
    Hk, R, S, step = A4.shape
    H, T = out.shape[0], out.shape[1]
    g = H // Hk
    acc = np.empty(step, np.float32)
    regs = acc.reshape((step // lanes, lanes))
    scratch = np.empty((lanes + prog.shape[0], R), np.float32)
    b2 = np.empty((S, step), np.float32)
    for h in range(H):
        for t in range(T):
            _round_f16(X[h, t], b2.reshape(-1))
            for r in range(R):
                _row_lanes(A4[h // g, r], b2, acc, regs)
                for l in range(lanes):
                    scratch[l, r] = regs[0, l]
            last = _tree(scratch, lanes, prog)
            for r in range(R):
                out[h, t, r] = last[r]


@njit(inline="always")
def _round_f16(x, out):
    """ggml converts the activations to f16 (vec_dot_type) before an f16 product."""
    for k in range(x.shape[0]):
        out[k] = f16_round(x[k])


@njit(cache=True, parallel=True)
def mul_mat_f16_vt(V, X, out, n_reg, lanes, prog, n_threads):
    """Attention's kqv for one token fused with the CONT of V^T before it: out[h, t, d] = V[:, h // g, d]
    . f16(X[h, t]), V (KV, Hk, D) the cache rows as f16 bits, read in place (no transposed copy). The
    arithmetic of vec_dot_f16 on the row d of V^T, vectorized across d; the heads in parallel on at most
    ``n_threads`` threads (1: on the calling thread, 0: the step's count)."""
    prev = limit_threads(n_threads)
    KV, Hk, D = V.shape
    H, T = out.shape[0], out.shape[1]
    g = H // Hk
    if _vdot_tiles_ok(n_reg, lanes, prog, KV) and D % TW == 0 and V.flags.c_contiguous:
        for h in prange(H):                             # 16 rows of V^T (columns d of the cache rows) per tile
            b = np.empty((1, KV), np.float32)
            res = np.empty(TW, np.float32)
            for t in range(T):
                _round_f16(X[h, t], b[0])
                for s in range(D // TW):
                    _vdot_rows16(V, (h // g) * D + s * TW, Hk * D, b, 0, KV, n_reg, lanes, prog, res, out, h, t,
                                 s * TW, TW)
        restore_threads(prev)                           # the limit ends with the kernel, on either path
        return
    for h in prange(H):
        acc = np.empty((n_reg * lanes, D), np.float32)
        scratch = np.empty((lanes + prog.shape[0], D), np.float32)
        b = np.empty(KV, np.float32)
        for t in range(T):
            _round_f16(X[h, t], b)
            _dot_rows(V, h // g, h // g + 1, b, out[h, t], n_reg, lanes, prog, acc, scratch)
    restore_threads(prev)


_F32x16 = ir.VectorType(ir.FloatType(), 16)
_I16x16 = ir.VectorType(ir.IntType(16), 16)
_H16 = ir.VectorType(ir.HalfType(), 16)
TW = 16                  # rows per register tile of _vdot_tile (one <16 x float> across rows)


def _vdot_tile(n_reg: int, lanes: int):
    """ggml_vec_dot_f16 (``n_reg`` registers of ``lanes`` floats, K in whole steps) for 16 rows at once,
    the accumulators in registers across the rows: A f16 bits (C-contiguous), row w's element k at
    ``base + k * rstride + w``; b float32 (C-contiguous), element k at ``boff + k``; ``nsteps`` =
    K / (n_reg * lanes) >= 1 (indices, not views: a view per tile costs atomic reference counts). For each lane:
    register j's first step fma onto +0 (ggml's zeroed registers: a -0 product gives +0, so no register is ever
    -0 and products of zero added later change nothing), fma for the later steps, then the registers folded (the
    upper half onto the lower, GGML_F32_VEC_REDUCE); the lanes then added by the tree ``prog`` (lanes - 1
    rows (i, j): value lanes + k = value i + value j); the last value stored into res (16,) float32."""
    step = n_reg * lanes

    def typer(typingctx, A, base, rstride, b, boff, nsteps, prog, res):
        def codegen(context, builder, signature, args):
            t = signature.args
            i64 = ir.IntType(64)
            f32p = ir.FloatType().as_pointer()
            ap = builder.bitcast(context.make_array(t[0])(context, builder, args[0]).data, ir.IntType(16).as_pointer())
            base_, rs = context.cast(builder, args[1], t[1], types.int64), context.cast(builder, args[2], t[2], types.int64)
            bp = builder.bitcast(context.make_array(t[3])(context, builder, args[3]).data, f32p)
            bp = builder.gep(bp, [context.cast(builder, args[4], t[4], types.int64)])
            ns = context.cast(builder, args[5], t[5], types.int64)
            pr = context.make_array(t[6])(context, builder, args[6])
            n_prog = cgutils.unpack_tuple(builder, pr.shape, 2)[0]
            pp = builder.bitcast(pr.data, i64.as_pointer())
            rp = builder.bitcast(context.make_array(t[7])(context, builder, args[7]).data, _F32x16.as_pointer())
            fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_F32x16, [_F32x16] * 3), "llvm.fma.v16f32")
            splat = ir.Constant(ir.VectorType(ir.IntType(32), 16), [0] * 16)

            def load(k):                                  # (rows' element k as floats, b[k] splat)
                pa = builder.gep(ap, [builder.add(base_, builder.mul(k, rs))])
                a = builder.load(builder.bitcast(pa, _I16x16.as_pointer()), align=2)
                a = builder.fpext(builder.bitcast(a, _H16), _F32x16)
                bv = builder.insert_element(ir.Constant(_F32x16, None), builder.load(builder.gep(bp, [k])),
                                            ir.Constant(ir.IntType(32), 0))
                return a, builder.shuffle_vector(bv, ir.Constant(_F32x16, None), splat)

            vals = cgutils.alloca_once(builder, _F32x16, size=ir.Constant(i64, 2 * lanes))
            accs = [cgutils.alloca_once(builder, _F32x16) for _ in range(n_reg)]
            zero = ir.Constant(_F32x16, [0.0] * 16)
            for lane in range(lanes):
                for j in range(n_reg):
                    a, bv = load(ir.Constant(i64, j * lanes + lane))
                    builder.store(builder.call(fma, [a, bv, zero]), accs[j])
                with cgutils.for_range(builder, builder.sub(ns, ir.Constant(i64, 1))) as loop:
                    k0 = builder.mul(builder.add(loop.index, ir.Constant(i64, 1)), ir.Constant(i64, step))
                    for j in range(n_reg):
                        a, bv = load(builder.add(k0, ir.Constant(i64, j * lanes + lane)))
                        builder.store(builder.call(fma, [a, bv, builder.load(accs[j])]), accs[j])
                h = n_reg
                while h > 1:
                    h //= 2
                    for j in range(h):
                        builder.store(builder.fadd(builder.load(accs[j]), builder.load(accs[j + h])), accs[j])
                builder.store(builder.load(accs[0]), builder.gep(vals, [ir.Constant(i64, lane)]))
            with cgutils.for_range(builder, n_prog) as loop:
                i2 = builder.mul(loop.index, ir.Constant(i64, 2))
                x = builder.load(builder.gep(vals, [builder.load(builder.gep(pp, [i2]))]))
                y = builder.load(builder.gep(vals, [builder.load(builder.gep(pp, [builder.add(i2, ir.Constant(i64, 1))]))]))
                builder.store(builder.fadd(x, y), builder.gep(vals, [builder.add(loop.index, ir.Constant(i64, lanes))]))
            last = builder.add(n_prog, ir.Constant(i64, lanes - 1))
            builder.store(builder.load(builder.gep(vals, [last])), rp, align=4)
            return context.get_dummy_value()
        return types.none(A, base, rstride, b, boff, nsteps, prog, res), codegen
    typer.__name__ = f"_vdot_tile_{n_reg}x{lanes}"
    return intrinsic(typer)


_vdot_tile_4x8 = _vdot_tile(4, 8)        # ggml_vec_dot_f16 on AVX2 (GGML_F32_ARR 4, EPR 8)
_vdot_tile_4x16 = _vdot_tile(4, 16)      # on AVX-512 (ARR 4, EPR 16)


@njit(inline="always")
def _vdot_tiles_ok(n_reg, lanes, prog, K):
    """Whether _vdot_tile has this register layout (a tree of lanes - 1 additions) and K whole steps."""
    return (n_reg == 4 and (lanes == 8 or lanes == 16) and prog.shape[0] == lanes - 1
            and K >= n_reg * lanes)


@njit(inline="always")
def _vdot_rows16(A, base, rstride, b, j, K, n_reg, lanes, prog, res, out, h, t, r0, n):
    """out[h, t, r0 + w] (w < n <= 16) = vec_dot_f16 of the tile's rows with b[j]: the whole steps by
    _vdot_tile, the leftover elements (K % step) one by one in double, as vec_dot_f16 adds them."""
    step = n_reg * lanes
    ns = K // step
    if lanes == 8:
        _vdot_tile_4x8(A, base, rstride, b, j * b.shape[1], ns, prog, res)
    else:
        _vdot_tile_4x16(A, base, rstride, b, j * b.shape[1], ns, prog, res)
    if ns * step == K:
        for w in range(n):
            out[h, t, r0 + w] = res[w]
        return
    Af = A.reshape(-1)
    for w in range(n):
        total = np.float64(res[w])
        for k in range(ns * step, K):
            total += np.float64(f16_bits_to_f32(Af[base + k * rstride + w]) * b[j, k])
        out[h, t, r0 + w] = np.float32(total)


@njit(inline="always")
def _mul_mat_f16_kv(A, B, out, n_reg, lanes, prog, k0, k1):
    """Output heads of the kv heads k0..k1 (grouped-query heads share one widened copy)."""
    H, T, R = out.shape
    g = H // A.shape[0]
    AT = np.zeros((A.shape[2], -(-R // RB), RB), np.float32)
    acc = np.empty((n_reg * lanes, RB), np.float32)
    scratch = np.empty((lanes + prog.shape[0], RB), np.float32)
    bq = np.empty(A.shape[2], np.float32)
    for hk in range(k0, k1):
        _widen_transposed(A, hk, AT)
        for h in range(hk * g, (hk + 1) * g):
            for t in range(T):
                _round_f16(B[h, t], bq)
                _dot_rows(AT, 0, AT.shape[1], bq, out[h, t], n_reg, lanes, prog, acc, scratch)


@njit(cache=True)
def mul_mat_f16(A, B, out, n_reg, lanes, prog):
    """out[h, t, r] = A[h // (H / Hk), r] . B[h, t] in ggml_vec_dot_f16's order (``n_reg`` = GGML_F32_ARR
    registers of ``lanes`` floats, ``prog`` the lane reduction): A (Hk, R, K) f16 bits (uint16, any strides,
    as the KV cache view lies), B (H, T, K) float32, rounded to f16 values here (ggml converts the
    activations to vec_dot_type f16; values already f16 stay as they are). tinyBLAS's order (two or more
    activation rows) is ``fast.sgemm``'s."""
    _mul_mat_f16_kv(A, B, out, n_reg, lanes, prog, 0, A.shape[0])


@njit(cache=True, parallel=True)
def mul_mat_f16_cached(A, X, out, n_reg, lanes, prog, written, AT, n_threads):
    """:func:`mul_mat_f16` for a decode step, which reads the same cache rows step after step: ``AT``
    (Hk, K, R/RB, RB) keeps the rows transposed (f16 bits, zero-padded); a row is transposed again only
    where ``written`` (one flag per cache row, set by every writer: ``llmlab.ggml.cpu.journal``) says it
    changed. ``X``: the activations before their rounding to f16. On at most ``n_threads`` threads (1:
    the calling thread, 0: the step's count)."""
    prev = limit_threads(n_threads)
    Hk, R, K = A.shape
    H, T = out.shape[0], out.shape[1]
    g = H // Hk
    NB = AT.shape[2]
    for r in range(R):
        if written[r]:
            written[r] = 0
            for hk in range(Hk):
                for k in range(K):
                    AT[hk, k, r // RB, r % RB] = A[hk, r, k]
    for w in prange(H * NB):                            # (head, block of RB rows): in parallel
        h, blk = w // NB, w % NB
        acc = np.empty((n_reg * lanes, RB), np.float32)
        scratch = np.empty((lanes + prog.shape[0], RB), np.float32)
        b = np.empty(K, np.float32)
        for t in range(T):
            _round_f16(X[h, t], b)
            _dot_rows(AT[h // g], blk, blk + 1, b, out[h, t][blk * RB:], n_reg, lanes, prog, acc, scratch)
    restore_threads(prev)


@njit(inline="always")
def _tile_rows(A, written, AT):
    """AT[hk, r // TW, k, r % TW] = A[hk, r, k] (f16 bits) for the cache rows r that ``written`` flags (the
    flags cleared): kq's 16-row tiles, redone where a writer changed the rows."""
    Hk, R, K = A.shape
    for r in range(R):
        if written[r]:
            written[r] = 0
            for hk in range(Hk):
                for k in range(K):
                    AT[hk, r // TW, k, r % TW] = A[hk, r, k]


@njit(inline="always")
def _tile_cells(V, written, VT):
    """VT[hk, d // TW, c, d % TW] = V[c, hk, d] (f16 bits) for the cells c that ``written`` flags (the flags
    cleared): kqv's tiles of 16 columns of the cache rows."""
    KV, Hk, D = V.shape
    for c in range(KV):
        if written[c]:
            written[c] = 0
            for hk in range(Hk):
                for d in range(D):
                    VT[hk, d // TW, c, d % TW] = V[c, hk, d]


@njit(cache=True, parallel=True)
def mul_mat_f16_tiles(A, X, out, n_reg, lanes, prog, written, AT, n_threads):
    """:func:`mul_mat_f16_cached` in 16-row register tiles (``_vdot_tiles_ok``): ``AT`` (Hk, R/16, K, 16)
    keeps each tile's rows contiguous (f16 bits, zero-padded; a tile's pass reads one block, with no
    cache-set conflicts), redone only for the rows ``written`` flags. The grouped heads of a kv head
    pass over each tile while it is in L1. On at most ``n_threads`` threads (1: the calling thread, 0:
    the step's count)."""
    prev = limit_threads(n_threads)
    Hk, R, K = A.shape
    H, T = out.shape[0], out.shape[1]
    g = H // Hk
    NT = AT.shape[1]
    _tile_rows(A, written, AT)
    NB = -(-NT // 8)                                    # work items: (kv head, 8 tiles)
    for w in prange(Hk * NB):
        hk, blk = w // NB, w % NB
        b = np.empty((g, K), np.float32)
        res = np.empty(TW, np.float32)
        for t in range(T):
            for j in range(g):
                _round_f16(X[hk * g + j, t], b[j])
            for s in range(blk * 8, min(NT, blk * 8 + 8)):
                r0 = s * TW
                for j in range(g):
                    _vdot_rows16(AT, (hk * NT + s) * K * TW, TW, b, j, K, n_reg, lanes, prog, res,
                                 out, hk * g + j, t, r0, min(TW, R - r0))
    restore_threads(prev)


@njit(cache=True, parallel=True)
def mul_mat_f16_vt_tiles(V, X, out, n_reg, lanes, prog, written, VT, n_threads):
    """:func:`mul_mat_f16_vt` in 16-row register tiles (``_vdot_tiles_ok``, D a multiple of 16): ``VT``
    (Hk, D/16, KV, 16) keeps each tile's 16 columns of the cache rows contiguous (a pass along the cells
    reads one block instead of 32 bytes per cache row, rows 384-512 bytes apart: cache-set conflicts),
    redone only for the cells ``written`` flags; the grouped heads pass over each tile while it is in L1.
    On at most ``n_threads`` threads (1: the calling thread, 0: the step's count)."""
    prev = limit_threads(n_threads)
    KV, Hk, D = V.shape
    H, T = out.shape[0], out.shape[1]
    g = H // Hk
    NT = D // TW
    _tile_cells(V, written, VT)
    for w in prange(Hk * NT):                           # work items: (kv head, tile)
        hk, s = w // NT, w % NT
        b = np.empty((g, KV), np.float32)
        res = np.empty(TW, np.float32)
        for t in range(T):
            for j in range(g):
                _round_f16(X[hk * g + j, t], b[j])
            for j in range(g):
                _vdot_rows16(VT, (hk * NT + s) * KV * TW, TW, b, j, KV, n_reg, lanes, prog, res,
                             out, hk * g + j, t, s * TW, TW)
    restore_threads(prev)


def tiles_fit(n_reg: int, lanes: int, prog: np.ndarray, K: int) -> bool:
    """Whether the 16-row tile kernels (``mul_mat_f16_tiles``, ``mul_mat_f16_vt_tiles``) compute this
    register layout for dot products of length K."""
    return n_reg == 4 and lanes in (8, 16) and prog.shape[0] == lanes - 1 and K >= n_reg * lanes


@njit(cache=True, parallel=True)
def mul_mat_f16_mt(A, B, out, n_reg, lanes, prog, n_chunks):
    """:func:`mul_mat_f16` with the kv heads (or, with one kv head, the activation rows) cut into
    ``n_chunks`` for the threads."""
    Hk, T = A.shape[0], out.shape[1]
    if Hk >= n_chunks or T == 1:
        for c in prange(n_chunks):
            _mul_mat_f16_kv(A, B, out, n_reg, lanes, prog, c * Hk // n_chunks, (c + 1) * Hk // n_chunks)
    else:
        for c in prange(n_chunks):
            t0, t1 = c * T // n_chunks, (c + 1) * T // n_chunks
            _mul_mat_f16_kv(A, B[:, t0:t1], out[:, t0:t1], n_reg, lanes, prog, 0, Hk)


# ---- exp, SiLU, softmax: ggml_v_expf in its two variants ------------------------------------------

LOG2E = np.float32(float.fromhex("0x1.715476p+0"))
SHIFT = np.float32(float.fromhex("0x1.8p23"))
LN2_HI = np.float32(float.fromhex("0x1.62e4p-1"))
LN2_LO = np.float32(float.fromhex("0x1.7f7d1cp-20"))
C0 = np.float32(float.fromhex("0x1.0e4020p-7"))
C1 = np.float32(float.fromhex("0x1.573e2ep-5"))
C2 = np.float32(float.fromhex("0x1.555e66p-3"))
C3 = np.float32(float.fromhex("0x1.fffdb6p-2"))
C4 = np.float32(float.fromhex("0x1.ffffecp-1"))
ONE = np.float32(1.0)


@intrinsic
def _bits_f64(typingctx, u):
    """The float64 whose bits are the int64 ``u`` (a bitcast)."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())
    return types.float64(types.int64), codegen


@njit(inline="always")
def pow2(n):
    """2^n as a float64, exactly, for -1022 <= n <= 1023 (built in the exponent bits: no libm call,
    so loops over it vectorize)."""
    return _bits_f64(np.int64(n + 1023) << np.int64(52))


@intrinsic
def _bits_f32(typingctx, u):
    """The float32 whose bits are the int32 ``u`` (a bitcast)."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())
    return types.float32(types.int32), codegen


@njit(inline="always")
def pow2_f32(n):
    """2^n as a float32, exactly, for -126 <= n <= 127 (int32 arithmetic only: AVX2 has no vector
    float -> int64 conversion, and an int64 exponent kept the expf loops scalar)."""
    return _bits_f32(np.int32((n + np.int32(127)) << np.int32(23)))


@njit(inline="always")
def v_expf(x, variant):
    """ggml_v_expf. variant 0 (AVX-512): j = 1 + poly(b), result j * 2^n (scalef). variant 1 (AVX2):
    k = 2^n built in the exponent bits, j = poly(b) without the 1, result fma(k, j, k); past |n| = 126
    the scale is split in two factors s2 * s1 (s1 = 1 below, which is exact), past 192 it saturates.
    Written without branches (each case a select), so that loops over it vectorize."""
    z = fma(x, LOG2E, SHIFT)
    n = z - SHIFT
    b = fma(-n, LN2_LO, fma(-n, LN2_HI, x))
    u = b * b
    p = fma(fma(C0, b, C1), u, fma(C2, b, C3))
    an = abs(n)
    ok = an <= 192                                           # false for NaN
    ni = np.int32(n) if ok else np.int32(0)                  # int32: the loops vectorize on AVX2 (2.3x)
    if variant == 0:
        j = fma(p, u, fma(C4, b, ONE))
        r = np.float32(np.float64(j) * pow2(ni))             # scalef: j * 2^n, rounded once
    else:
        j = fma(p, u, C4 * b)
        e1 = np.int32(0) if an <= 126 else (np.int32(127) if n > 0 else np.int32(-125))
        s2 = pow2_f32(ni - e1)                               # both factors normal powers of two (exact)
        r = fma(s2, j, s2) * pow2_f32(e1)
    r = r if ok else (np.float32(np.inf) if n > 0 else np.float32(0.0))
    return r if n == n else np.float32(np.nan)


@njit(cache=True)
def expf(x, out, variant):
    for i in range(x.size):
        out.flat[i] = v_expf(x.flat[i], variant)


@njit(cache=True, error_model="numpy")      # IEEE division (no ZeroDivisionError branch): it vectorizes
def swiglu(g, u, out, variant):
    """ggml_vec_swiglu_f32 over rows: silu(g) * u, silu(x) = x / (1 + exp(-x)) (whole vector blocks)."""
    e = np.empty(out.shape[1], np.float32)
    for r in range(out.shape[0]):
        gr, ur, orow = g[r], u[r], out[r]
        for i in range(e.shape[0]):                 # exp in its own loop over a local row: vectorized
            e[i] = v_expf(-gr[i], variant)
        for i in range(e.shape[0]):
            e[i] = (gr[i] / (ONE + e[i])) * ur[i]
        orow[:] = e


@njit(cache=True, error_model="numpy")
def geglu(g, u, out, table):
    """ggml_vec_geglu_f32 with GGML_GELU_FP16: GELU(g) from the f16 table (``table``: its uint16 bits,
    indexed by the f16 bits of g), 0 at or below -10, g itself at or above 10; times u."""
    for r in range(out.shape[0]):
        gr, ur, orow = g[r], u[r], out[r]
        for i in range(orow.shape[0]):
            x = gr[i]
            t = f16_bits_to_f32(table[f32_to_f16_bits(x)])
            v = np.float32(0.0) if x <= -10.0 else (x if x >= 10.0 else t)
            orow[i] = v * ur[i]


@njit(inline="always")
def _gt(v, m):
    """(v > m) ? v : m: the running max of ggml_vec_max_f32 (MAX), which skips NaN (MAXPS's select)."""
    return v if v > m else m


@njit(inline="always")
def _max8(w, n):
    """The max of w[:n] (n a multiple of 8) as ggml_vec_max_f32 finds it: the NaN-skipping running max
    in 8 independent strands (a max of non-NaN values is the same in any order; only the sign of a zero
    max could differ, and exp(w - max) is the same for either), so that it runs in one vector register."""
    m0 = m1 = m2 = m3 = m4 = m5 = m6 = m7 = np.float32(-np.inf)
    for k in range(0, n, 8):
        m0, m1, m2, m3 = _gt(w[k], m0), _gt(w[k + 1], m1), _gt(w[k + 2], m2), _gt(w[k + 3], m3)
        m4, m5, m6, m7 = _gt(w[k + 4], m4), _gt(w[k + 5], m5), _gt(w[k + 6], m6), _gt(w[k + 7], m7)
    return _gt(_gt(_gt(m0, m1), _gt(m2, m3)), _gt(_gt(m4, m5), _gt(m6, m7)))


@njit(inline="always")
def _soft_max_row(x, mask, h, q, n, scale, out, lanes, prog, variant, w, blk):
    """Row (h, q) of the softmax over its first n cells (n a multiple of ``lanes``), into out[h, q, :n];
    ``w`` (>= n) and ``blk`` (lanes + len(prog), >= n / lanes) are scratch. Returns the row's max. Arrays
    are indexed, not sliced (a view per row and per tree step costs numba reference-count updates;
    measured, that was not where a decode step's softmax spent its time: the exp loop was, see v_expf)."""
    nb = n // lanes
    last = lanes + prog.shape[0] - 1
    if mask.shape[0] != 0:
        for i in range(n):
            w[i] = x[h, q, i] * scale + mask[q, i]
    else:
        for i in range(n):
            w[i] = x[h, q, i] * scale
    mx = _max8(w, n)
    for i in range(n):                                           # exp(w - max), vectorized
        w[i] = v_expf(np.float32(w[i] - mx), variant)
    for l in range(lanes):
        for k in range(nb):
            blk[l, k] = w[k * lanes + l]
    for k in range(prog.shape[0]):                               # each block's horizontal sum (_tree's order)
        a, b, c = prog[k, 0], prog[k, 1], lanes + k
        for i in range(nb):
            blk[c, i] = blk[a, i] + blk[b, i]
    s = np.float64(0.0)
    for k in range(nb):                                          # added in double, block by block
        s += np.float64(blk[last, k])
    inv = np.float32(1.0 / s)
    for i in range(n):
        out[h, q, i] = w[i] * inv
    return mx


@njit(inline="always")
def _soft_max_rows(x, mask, scale, out, lanes, prog, variant, j0, j1):
    """Rows j0..j1 of the softmax (row j: head j // n_q, query row j % n_q)."""
    n_q, n = x.shape[1], x.shape[2]
    w = np.empty(n, np.float32)
    blk = np.empty((lanes + prog.shape[0], n // lanes), np.float32)     # lane l of every block in row l
    for hq in range(j0, j1):
        _soft_max_row(x, mask, hq // n_q, hq % n_q, n, scale, out, lanes, prog, variant, w, blk)


@njit(cache=True, error_model="numpy")
def soft_max(x, mask, scale, out, lanes, prog, variant):
    """ggml_compute_forward_soft_max_f32 per row of x (heads, rows, n), n a multiple of ``lanes``:
    w = x*scale + mask, exp(w - max) in blocks whose horizontal sums (``prog``) add up in double,
    then times (float)(1/sum). ``mask`` has one row per query row (broadcast over heads), or none."""
    _soft_max_rows(x, mask, scale, out, lanes, prog, variant, 0, x.shape[0] * x.shape[1])


@njit(cache=True, parallel=True, error_model="numpy")
def soft_max_mt(x, mask, scale, out, lanes, prog, variant, n_chunks):
    n = x.shape[0] * x.shape[1]
    for c in prange(n_chunks):
        _soft_max_rows(x, mask, scale, out, lanes, prog, variant, c * n // n_chunks, (c + 1) * n // n_chunks)


# ---- a decode step's attention in one region: kq, softmax, kqv ------------------------------------

F16_EXP = 0x7C00         # an f16's exponent bits: all set for inf and NaN


@njit(inline="always")
def _note_nonfinite(rows, written, bad):
    """bad[r] = whether rows[r] (f16 bits, any shape after the first axis) holds an inf or a NaN, for the
    rows ``written`` flags (read before the tiling clears the flags)."""
    for r in range(rows.shape[0]):
        if written[r]:
            nf = 0
            for i in range(rows.shape[1]):
                for k in range(rows.shape[2]):
                    nf |= (rows[r, i, k] & F16_EXP) == F16_EXP
            bad[r] = nf


@njit(inline="always")
def _live_cells(mask, bad, R, step):
    """How many leading cells a step computes: all R, or, when the mask hides the last cells (-inf) and
    nothing can make a NaN of them (no inf or NaN in the mask or in any cell's K or V: finite scores
    w = kq*scale + -inf = -inf, exp(w - max) = +0, p*V = +-0), the cells up to the last one it lets
    through, in whole steps of the registers. Those skipped add +0 to the softmax's sum and +-0 to
    registers that started at +0 (never -0: see _vdot_tile), which changes no bit."""
    if mask.shape[0] == 0:
        return R
    live = 0
    for i in range(R):
        m = mask[0, i]
        if m != -np.inf:
            if not abs(m) < np.inf:
                return R
            live = i + 1
    for i in range(R):
        if bad[0, i] | bad[1, i]:
            return R
    return min(R, max(step, -(-live // step) * step))


@njit(inline="always")
def _finite_row(x):
    ok = True
    for i in range(x.shape[0]):
        ok &= abs(x[i]) < np.inf
    return ok


@njit(cache=True, parallel=True, error_model="numpy")
def attention_f16_tiles(K, Q, mask, scale, V, out, n_reg, lanes, prog, hsum_prog, variant, skip,
                        kflags, vflags, KT, VT, bad, S, P, n_threads):
    """A decode step's attention for one token, kq = K . f16(q), p = SOFT_MAX(kq, mask, scale), kqv =
    V^T . f16(p), in one parallel region (a head per work item) with the bits of the three steps it
    stands for (mul_mat_f16_tiles, soft_max, mul_mat_f16_vt_tiles): the same tiles ``KT`` (Hk, R/16,
    Dk, 16) and ``VT`` (Hk, Dv/16, R, 16) of the cache rows (f16 bits), redone for the cells the
    journal flags (``kflags``, ``vflags``), the same registers (_vdot_rows16) and the same softmax
    (_soft_max_row). K (Hk, R, Dk) and V (R, Hk, Dv): the cache rows as f16 bits; Q (H, 1, Dk) float32,
    rounded to f16 first (the output may lie on its bytes); mask (1, R) or (0, R); out (H, 1, Dv).
    S and P (H, 1, R): the scores and probabilities; bad (2, R): which cells' K and V hold an inf or a
    NaN. With ``skip`` (the binder's check that a finite score times ``scale`` stays finite) the cells
    after the last one the mask lets through are left out where that gives the same bits
    (_live_cells; per head also only for a finite query and a finite row max). On at most
    ``n_threads`` threads (1: the calling thread, 0: the step's count)."""
    prev = limit_threads(n_threads)
    Hk, R, Dk = K.shape
    H = out.shape[0]
    g = H // Hk
    NK, NV = KT.shape[1], V.shape[2] // TW
    _note_nonfinite(K.transpose(1, 0, 2), kflags, bad[0])
    _note_nonfinite(V, vflags, bad[1])
    _tile_rows(K, kflags, KT)
    _tile_cells(V, vflags, VT)
    bq = np.empty((H, Dk), np.float32)
    for h in range(H):
        _round_f16(Q[h, 0], bq[h])
    n_live = _live_cells(mask, bad, R, n_reg * lanes) if skip else R
    for h in prange(H):
        hk = h // g
        res = np.empty(TW, np.float32)
        w = np.empty(R, np.float32)
        blk = np.empty((lanes + hsum_prog.shape[0], R // lanes), np.float32)
        bp = np.empty((1, R), np.float32)
        n = n_live if _finite_row(bq[h]) else R
        done = 0
        while True:
            for s in range(done // TW, -(-n // TW)):            # kq: this head's scores, tile by tile
                r0 = s * TW
                _vdot_rows16(KT, (hk * NK + s) * Dk * TW, TW, bq, h, Dk, n_reg, lanes, prog, res,
                             S, h, 0, r0, min(TW, R - r0))
            done = n
            mx = _soft_max_row(S, mask, h, 0, n, scale, P, lanes, hsum_prog, variant, w, blk)
            if n == R or abs(mx) < np.inf:
                break
            n = R                                                # no finite max: every cell after all
        _round_f16(P[h, 0, :n], bp[0, :n])
        for s in range(NV):                                      # kqv: 16 outputs a tile
            _vdot_rows16(VT, (hk * NV + s) * R * TW, TW, bp, 0, n, n_reg, lanes, prog, res, out, h, 0,
                         s * TW, TW)
    restore_threads(prev)
