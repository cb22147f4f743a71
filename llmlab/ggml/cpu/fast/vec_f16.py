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

from ._common import NOPYTHON, f16_bits_to_f32, f16_round, limit_threads, restore_threads
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
