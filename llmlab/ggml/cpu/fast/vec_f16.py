"""numba twins of the f16 products that accumulate in half precision (FP16 vector arithmetic, ``FP16_VA``:
the ARM profiles), bit for bit ``llmlab.ggml.cpu.vec.vec_dot_f16`` with ``f16_acc == "f16"`` and
``llmlab.ggml.cpu.sgemm.mul_mat_f16`` with ``sgemm_acc == "f16"``.

Each output keeps ``n_reg`` registers of ``lanes`` halves (vec_dot_f16: 4 x 8; tinyBLAS: 1 x 8), each
step ``acc = vfmaq_f16(acc, x, y)``: the exact product plus the accumulator, rounded once to half. Then
the registers fold in half precision (vaddq_f16), the last one's lanes are widened and added in float32
by the profile's tree, and vec_dot_f16's tail (K % step) is added one by one in double.

Half rounding of an exact sum, without float16 arithmetic: two halves' product is exact in float32
(11 x 11 bits, exponents far inside float32's range), and so is the error of a float32 sum (TwoSum);
a sum rounded to odd in float32 (the error nudges an inexact sum to its odd neighbour) then rounds to
half correctly in one conversion (24 >= 11 + 2 bits). Each step is branch-free, so LLVM vectorizes the
lanes.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from ._common import NOPYTHON, _get_num_threads, f16_bits_to_f32, f16_round, limit_threads, restore_threads
from .vec import tree_program


@intrinsic
def _bits(typingctx, x):
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))
    return types.int32(types.float32), codegen


@intrinsic
def _from_bits(typingctx, u):
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())
    return types.float32(types.int32), codegen


@njit(inline="always", **NOPYTHON)
def add_h(p, c):
    """p + c (float32 values whose exact sum is meant) rounded once to half, as float32."""
    s = p + c
    bb = s - p
    err = (p - (s - bb)) + (c - bb)
    u = _bits(s)
    nudge = (err != 0) & ((u & 1) == 0) & (abs(s) < np.float32(np.inf))
    step = np.int32(1) if (err > 0) == (s > 0) else np.int32(-1)
    return f16_round(_from_bits(u + (step if nudge else np.int32(0))))


@njit(inline="always", **NOPYTHON)
def fma_h(a, b, c):
    """vfmaq_f16 on halves held as float32: a*b + c rounded once to half."""
    return add_h(a * b, c)


RB = 128     # rows per block: the block's accumulators (step x RB floats) stay in L1


@njit(inline="always", **NOPYTHON)
def _rows_h(AT, blk, b, out_row, n_reg, lanes, prog, acc, scratch, rb):
    """out_row[r] for the rb rows of block ``blk`` of AT (K, NB, rb) float32 (f16 values, transposed):
    each row's registers fma'd in half along K, folded in half, the last register's lanes added by
    ``prog`` in float32, the leftovers in double; the loops run across the rows (vectorized)."""
    K = AT.shape[0]
    step = n_reg * lanes
    np_ = K - K % step
    acc[:, :] = 0
    for i in range(0, np_, step):
        for j in range(step):
            bj = b[i + j]
            a = AT[i + j, blk]
            row = acc[j]
            for r in range(rb):
                row[r] = fma_h(bj, a[r], row[r])
    h = n_reg
    while h > 1:                                   # GGML_F16_VEC_REDUCE: registers fold in half
        h //= 2
        for j in range(h * lanes):
            x, y = acc[j], acc[j + h * lanes]
            for r in range(rb):
                x[r] = add_h(x[r], y[r])
    for j in range(lanes):
        sj, aj = scratch[j], acc[j]
        for r in range(rb):
            sj[r] = aj[r]
    for k in range(prog.shape[0]):
        x, y, z = scratch[prog[k, 0]], scratch[prog[k, 1]], scratch[lanes + k]
        for r in range(rb):
            z[r] = x[r] + y[r]
    last = scratch[lanes + prog.shape[0] - 1]
    r0 = blk * rb
    for r in range(min(rb, out_row.shape[0] - r0)):
        total = np.float64(last[r])
        for k in range(np_, K):                    # vec_dot_f16's leftovers, in double
            total += np.float64(b[k] * AT[k, blk, r])
        out_row[r0 + r] = np.float32(total)


@njit(inline="always", **NOPYTHON)
def _mul_mat_f16h(A, B, out, n_reg, lanes, prog, rb):
    """out[h, t, r] = A[h // (H / Hk), r] . f16(B[h, t]) with half-precision accumulators: A (Hk, R, K)
    f16 bits (any strides: the KV cache view), B (H, T, K) float32. Each kv head's rows are widened and
    transposed once (K, R), then every grouped head and activation row passes over them; (kv head,
    block of rb rows) pairs in parallel."""
    Hk, R, K = A.shape
    H, T = out.shape[0], out.shape[1]
    g = H // Hk
    NB = -(-R // rb)
    for w in prange(Hk * NB):
        hk, blk = w // NB, w % NB
        AT = np.zeros((K, 1, rb), np.float32)
        for r in range(blk * rb, min(R, blk * rb + rb)):
            for k in range(K):
                AT[k, 0, r - blk * rb] = f16_bits_to_f32(A[hk, r, k])
        acc = np.empty((n_reg * lanes, rb), np.float32)
        scratch = np.empty((lanes + prog.shape[0], rb), np.float32)
        b = np.empty(K, np.float32)
        for h in range(hk * g, hk * g + g):
            for t in range(T):
                for k in range(K):
                    b[k] = f16_round(B[h, t, k])
                _rows_h(AT, 0, b, out[h, t][blk * rb:], n_reg, lanes, prog, acc, scratch, rb)


def _entry(name: str, rb: int):
    """An entry point of _mul_mat_f16h with its block width (a constant: the row loops' trip count), on at
    most ``n_threads`` threads (1: the calling thread, 0: the step's count)."""
    def entry(A, B, out, n_reg, lanes, prog, n_threads):
        prev = limit_threads(n_threads)
        _mul_mat_f16h(A, B, out, n_reg, lanes, prog, rb)
        restore_threads(prev)
    entry.__name__ = entry.__qualname__ = name
    return njit(parallel=True, **NOPYTHON)(entry)


mul_mat_f16h = _entry("mul_mat_f16h", RB)
mul_mat_f16h_narrow = _entry("mul_mat_f16h_narrow", RB // 2)   # at most RB/2 rows (a decode step's V^T)


def kernel(R: int):
    """The f16h kernel for R rows: a block as wide as the rows when they fit half a block (no idle lanes)."""
    return mul_mat_f16h_narrow if R <= RB // 2 else mul_mat_f16h


_ORDERS: dict = {}


def half_order(cpu, R: int, T: int, K: int):
    """(n_reg, lanes, lane program) of an f16 product that accumulates in half precision on this profile
    (tinyBLAS where llamafile_sgemm takes the shape and its accumulators are halves; else vec_dot_f16's
    registers where they are), or None (float32 accumulators: ``vec``'s kernels)."""
    from .. import sgemm
    if sgemm.takes(cpu, R, T, K):
        if cpu.sgemm_acc != "f16":
            return None
        key = ("sgemm", cpu.name)
        if key not in _ORDERS:
            _ORDERS[key] = (1, cpu.sgemm_lanes, tree_program(cpu.sgemm_hsum_tree, cpu.sgemm_lanes))
        return _ORDERS[key]
    if cpu.f16_acc != "f16":
        return None
    key = ("vec", cpu.name)
    if key not in _ORDERS:
        lanes = cpu.f16_lanes or cpu.f32_lanes
        _ORDERS[key] = (cpu.f16_arr or cpu.f32_arr, lanes, tree_program(cpu.f16_reduce_tree or cpu.vec_reduce_tree, lanes))
    return _ORDERS[key]


# ---- a decode step's attention: the cache rows read in place, and the products that are exact no-ops skipped.
# Inner loops index with a bare loop counter (numba adds a negative-index fix-up to ``x[i + j]``, which
# turns a vector load into a gather): the arrays are reshaped once so that the innermost index is one.

ZERO, FINITE, SPECIAL = 2, 1, 0     # _row_class: every value +-0 / no inf or NaN / an inf or a NaN


@njit(inline="always", **NOPYTHON)
def _row_class(A4, i, hk, c, n):
    """The class of the f16 bits A4[i, hk, c, :n]: ZERO (all +-0), FINITE, or SPECIAL (an inf or NaN)."""
    nz = np.int32(0)
    e = np.int32(0)
    for d in range(n):
        u = np.int32(A4[i, hk, c, d])
        nz |= u
        e = max(e, u & 0x7C00)
    if e == 0x7C00:
        return SPECIAL
    return ZERO if nz & 0x7FFF == 0 else FINITE


@njit(inline="always", **NOPYTHON)
def _classes(A4, cls, written, always):
    """cls[i, hk, c] = _row_class of every cache row i (A4 (R, Hk, NC, n)) that ``written`` flags (the
    journal's: set by the cache's writers, cleared here), or of every row when ``always``: a decode step
    classifies the one row it wrote."""
    R, Hk, NC, n = A4.shape
    for i in range(R):
        if always or written[i]:
            if not always:
                written[i] = 0
            for hk in range(Hk):
                for c in range(NC):
                    cls[i, hk, c] = _row_class(A4, i, hk, c, n)


@njit(inline="always", **NOPYTHON)
def _no_op(bj, cls):
    """Whether acc = fma_h(bj, a, acc) leaves acc as it is, for every a of a row of class ``cls``: the
    product is +-0 (bj zero and a finite, or a +-0 and bj finite), and acc + (+-0) = acc, since an
    accumulator that starts at +0 is never -0 (x + y is -0 only when both are -0)."""
    return (bj == 0 and cls != SPECIAL) or (cls == ZERO and abs(bj) < np.float32(np.inf))


@njit(inline="always", **NOPYTHON)
def _rounded(X, step):
    """X (H, T, K) rounded to f16 (as float32), as (H, T, K // step + 1, step) (the tail row zero-padded),
    and whether each (h, t)'s values are all finite."""
    H, T, K = X.shape
    nb = K // step
    bq = np.zeros((H, T, (nb + 1) * step), np.float32)
    fin = np.ones((H, T), np.bool_)
    for h in range(H):
        for t in range(T):
            f = True
            for k in range(K):
                v = f16_round(X[h, t, k])
                bq[h, t, k] = v
                f = f and abs(v) < np.float32(np.inf)
            fin[h, t] = f
    return bq.reshape((H, T, nb + 1, step)), fin


@njit(inline="always", **NOPYTHON)
def _fold_tree(acc, sc, n_reg, lanes, prog, n):
    """The registers acc (n_reg * lanes, >= n) of n outputs folded in half (vaddq_f16), then the last
    register's lanes added in float32 by ``prog`` into sc; returns the row of sc holding the sums."""
    hh = n_reg
    while hh > 1:
        hh //= 2
        for j in range(hh * lanes):
            jj = j + hh * lanes
            for d in range(n):
                acc[j, d] = add_h(acc[j, d], acc[jj, d])
    for j in range(lanes):
        for d in range(n):
            sc[j, d] = acc[j, d]
    for k in range(prog.shape[0]):
        x, y, z = prog[k, 0], prog[k, 1], lanes + k
        for d in range(n):
            sc[z, d] = sc[x, d] + sc[y, d]
    return lanes + prog.shape[0] - 1


RV = 64      # V^T rows (head dims) per work item of the fused kqv (the head size where it is not a multiple)


def vt_chunk(D: int) -> int:
    return RV if D % RV == 0 else D


@njit(inline="always", **NOPYTHON)
def _mul_mat_f16h_vt(V, X, out, n_reg, lanes, prog, written, cls, always):
    """out[h, t, d] = V^T[h // g, d] . f16(X[h, t]) as vec_dot_f16 with half accumulators sums it (lane j
    of the registers: positions i = j mod n_reg * lanes), V (KV, Hk, D) the cache rows as f16 bits read in
    place (the CONT that transposes them is skipped); vectorized across d. A position whose products are
    exact no-ops (a zero probability: the masked and the unused cells; a zero row) is skipped; cls
    (KV, Hk, D / vt_chunk(D)) int32 keeps the rows' classes (see _classes). One task per thread over
    (kv head, chunk of head dims), its scratch allocated once."""
    KV, Hk, D = V.shape
    H, T = out.shape[0], out.shape[1]
    g = H // Hk
    step = n_reg * lanes
    nb = KV // step
    np_ = nb * step
    rv = RV if D % RV == 0 else D
    NC = D // rv
    V4 = V.reshape((KV, Hk, NC, rv))
    _classes(V4, cls, written, always)
    bq, _ = _rounded(X, step)
    W = Hk * NC
    nch = min(W, _get_num_threads())
    for c in prange(nch):
        acc = np.empty((step, rv), np.float32)
        sc = np.empty((lanes + prog.shape[0], rv), np.float32)
        tot = np.empty(rv, np.float64)
        for w in range(c * W // nch, (c + 1) * W // nch):
            hk, ci = w // NC, w % NC
            for h in range(hk * g, hk * g + g):
                for t in range(T):
                    for j in range(step):
                        for d in range(rv):
                            acc[j, d] = 0
                    for ii in range(nb):
                        for j in range(step):
                            bj = bq[h, t, ii, j]
                            i = ii * step + j
                            if _no_op(bj, cls[i, hk, ci]):
                                continue
                            for d in range(rv):
                                acc[j, d] = fma_h(bj, f16_bits_to_f32(V4[i, hk, ci, d]), acc[j, d])
                    z = _fold_tree(acc, sc, n_reg, lanes, prog, rv)
                    for d in range(rv):
                        tot[d] = np.float64(sc[z, d])
                    for i in range(np_, KV):                 # vec_dot_f16's leftovers, in double
                        bi = bq[h, t, nb, i - np_]
                        for d in range(rv):
                            tot[d] += np.float64(bi * f16_bits_to_f32(V4[i, hk, ci, d]))
                    for d in range(rv):
                        out[h, t, ci * rv + d] = np.float32(tot[d])


@njit(parallel=True, **NOPYTHON)
def mul_mat_f16h_vt(V, X, out, n_reg, lanes, prog, written, cls, always, n_threads):
    """_mul_mat_f16h_vt on at most ``n_threads`` threads (1: the calling thread, 0: the step's count)."""
    prev = limit_threads(n_threads)
    _mul_mat_f16h_vt(V, X, out, n_reg, lanes, prog, written, cls, always)
    restore_threads(prev)


RQ = 64      # cache rows per work item of the row-wise kernel


@njit(inline="always", **NOPYTHON)
def _mul_mat_f16h_rows(A, X, out, n_reg, lanes, prog, written, cls, always):
    """out[h, t, r] = A[r, h // g] . f16(X[h, t]) as vec_dot_f16 with half accumulators sums it, A (R, Hk, K)
    the cache rows as f16 bits (kq of a decode step). A row of zeros (an unused cell) gives +0 without its
    products when f16(X[h, t]) is finite (see _no_op); cls (R, Hk, 1) int32 keeps the rows' classes (see
    _classes). The other rows of a work item (kv head, RQ rows) are transposed into its scratch, and
    each output's registers are computed across them (vectorized). One task per thread, its scratch
    allocated once."""
    R, Hk, K = A.shape
    H, T = out.shape[0], out.shape[1]
    g = H // Hk
    step = n_reg * lanes
    nb = K // step
    np_ = nb * step
    A4 = A.reshape((R, Hk, 1, K))
    _classes(A4, cls, written, always)
    bq, fin = _rounded(X, step)
    NC = -(-R // RQ)
    W = Hk * NC
    nch = min(W, _get_num_threads())
    for c in prange(nch):
        acc = np.empty((step, RQ), np.float32)
        sc = np.empty((lanes + prog.shape[0], RQ), np.float32)
        tot = np.empty(RQ, np.float64)
        AT = np.empty(((nb + 1) * step, RQ), np.float32)
        AT3 = AT.reshape((nb + 1, step, RQ))
        idx = np.empty(RQ, np.int64)
        for w in range(c * W // nch, (c + 1) * W // nch):
            hk, r0 = w // NC, (w % NC) * RQ
            n = min(RQ, R - r0)
            allfin = True
            for h in range(hk * g, hk * g + g):
                for t in range(T):
                    allfin = allfin and fin[h, t]
            nl = 0
            for r in range(n):
                if cls[r0 + r, hk, 0] != ZERO or not allfin:
                    idx[nl] = r0 + r
                    nl += 1
            for q in range(nl):                              # the live rows, transposed (K, nl)
                rr = idx[q]
                for k in range(K):
                    AT[k, q] = f16_bits_to_f32(A4[rr, hk, 0, k])
            for h in range(hk * g, hk * g + g):
                for t in range(T):
                    for r in range(n):
                        out[h, t, r0 + r] = 0
                    if nl == 0:
                        continue
                    for j in range(step):
                        for q in range(nl):
                            acc[j, q] = 0
                    for ii in range(nb):
                        for j in range(step):
                            bj = bq[h, t, ii, j]
                            for q in range(nl):
                                acc[j, q] = fma_h(bj, AT3[ii, j, q], acc[j, q])
                    z = _fold_tree(acc, sc, n_reg, lanes, prog, nl)
                    for q in range(nl):
                        tot[q] = np.float64(sc[z, q])
                    for k in range(np_, K):                  # vec_dot_f16's leftovers, in double
                        bk = bq[h, t, nb, k - np_]
                        for q in range(nl):
                            tot[q] += np.float64(bk * AT[k, q])
                    for q in range(nl):
                        out[h, t, idx[q]] = np.float32(tot[q])


@njit(parallel=True, **NOPYTHON)
def mul_mat_f16h_rows(A, X, out, n_reg, lanes, prog, written, cls, always, n_threads):
    """_mul_mat_f16h_rows on at most ``n_threads`` threads (1: the calling thread, 0: the step's count)."""
    prev = limit_threads(n_threads)
    _mul_mat_f16h_rows(A, X, out, n_reg, lanes, prog, written, cls, always)
    restore_threads(prev)
