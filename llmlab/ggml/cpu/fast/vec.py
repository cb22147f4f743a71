"""numba twins of ggml-cpu's float vector code (vec.h / vec.cpp / llamafile's tinyBLAS), bit for bit.

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
from numba.extending import intrinsic

from ._common import f16_bits_to_f32, fma

EXPF_CODES = {"scalef": 0, "bits": 1}


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
    sgemm_lanes: int
    sgemm_prog: np.ndarray


_PARAMS: dict[str, VecParams] = {}


def params(cpu) -> VecParams:
    p = _PARAMS.get(cpu.name)
    if p is None:
        p = _PARAMS[cpu.name] = VecParams(
            cpu.f32_lanes, cpu.f32_arr, tree_program(cpu.vec_reduce_tree, cpu.f32_lanes),
            tree_program(cpu.hsum_tree, cpu.f32_lanes), EXPF_CODES[cpu.expf], cpu.sgemm_lanes,
            tree_program(cpu.sgemm_hsum_tree, cpu.sgemm_lanes))
    return p


@njit(inline="always")
def run_tree(v, prog, scratch):
    """Add the lanes of ``v`` as the program says (float32 additions); ``scratch`` holds lanes + steps."""
    n = v.shape[0]
    for i in range(n):
        scratch[i] = v[i]
    for k in range(prog.shape[0]):
        scratch[n + k] = scratch[prog[k, 0]] + scratch[prog[k, 1]]
    return scratch[n + prog.shape[0] - 1]


# ---- f16 dot products: ggml_vec_dot_f16 (one activation row) and tinyBLAS (two or more) -------------
#
# Both keep ``n_reg`` registers of ``lanes`` floats per output, fma'd step after step along K
# (vec_dot_f16: GGML_F32_ARR registers, each step arr*lanes elements; tinyBLAS: one register), then
# fold the registers pairwise (upper half onto lower) and add the last register's lanes by ``prog``.
# The kernels run that for a whole column of cache rows at once: every register lane becomes a row
# of a (lanes, R) block, so the inner loops run across rows, contiguous and vectorized.

@njit(inline="always")
def _widen_transposed(A, hk, AT):
    """AT[k, r] = float32(A[hk, r, k]): one pass over the cache rows (read along K), so every later
    loop runs along R on contiguous floats."""
    R, K = A.shape[1], A.shape[2]
    for r in range(R):
        for k in range(K):
            AT[k, r] = f16_bits_to_f32(A[hk, r, k])


@njit(inline="always")
def _dot_rows(AT, b, out_row, n_reg, lanes, prog, acc, scratch):
    """out_row[r] = AT[:, r] . b for every cache row r, in the order of n_reg registers of ``lanes``."""
    K, R = AT.shape
    step = n_reg * lanes
    np_ = K - K % step
    if np_ == 0:
        acc[:, :] = 0
    for j in range(min(step, np_)):                             # the first step: fma(a, b, 0) is a*b, rounded once
        bj32 = b[j]
        a = AT[j]
        row = acc[j]
        for r in range(R):
            row[r] = a[r] * bj32
    for i in range(step, np_, step):
        for j in range(step):                                   # register j // lanes, lane j % lanes
            bj = b[i + j]
            a = AT[i + j]
            row = acc[j]
            for r in range(R):
                row[r] = fma(a[r], bj, row[r])
    h = step
    while h > lanes:                                            # GGML_F32_VEC_REDUCE: registers pairwise
        h //= 2
        for j in range(h):
            for r in range(R):
                acc[j, r] = acc[j, r] + acc[j + h, r]
    for l in range(lanes):                                      # the last register's lanes, by the tree
        for r in range(R):
            scratch[l, r] = acc[l, r]
    for k in range(prog.shape[0]):
        a_, b_ = prog[k, 0], prog[k, 1]
        for r in range(R):
            scratch[lanes + k, r] = scratch[a_, r] + scratch[b_, r]
    last = scratch[lanes + prog.shape[0] - 1]
    for r in range(R):
        total = np.float64(last[r])
        for k in range(np_, K):                                 # vec_dot_f16's tail, one by one in double
            total += np.float64(AT[k, r] * b[k])
        out_row[r] = np.float32(total)


@njit(inline="always")
def _mul_mat_f16_kv(A, B, out, n_reg, lanes, prog, k0, k1):
    """Output heads of the kv heads k0..k1 (grouped-query heads share one widened copy)."""
    H, T, R = out.shape
    g = H // A.shape[0]
    AT = np.empty((A.shape[2], R), np.float32)
    acc = np.empty((n_reg * lanes, R), np.float32)
    scratch = np.empty((lanes + prog.shape[0], R), np.float32)
    for hk in range(k0, k1):
        _widen_transposed(A, hk, AT)
        for h in range(hk * g, (hk + 1) * g):
            for t in range(T):
                _dot_rows(AT, B[h, t], out[h, t], n_reg, lanes, prog, acc, scratch)


@njit(cache=True)
def mul_mat_f16(A, B, out, n_reg, lanes, prog):
    """out[h, t, r] = A[h // (H / Hk), r] . B[h, t]: A (Hk, R, K) f16 bits (uint16, any strides, as the
    KV cache view lies), B (H, T, K) float32 holding f16 values. vec_dot_f16: n_reg = GGML_F32_ARR;
    tinyBLAS: n_reg = 1 with its own lanes; ``prog`` is the lane reduction."""
    _mul_mat_f16_kv(A, B, out, n_reg, lanes, prog, 0, A.shape[0])


@njit(cache=True)
def mul_mat_f16_cached(A, A64, B, out, n_reg, lanes, prog, seen, AT, fresh):
    """:func:`mul_mat_f16` for a decode step, which reads the same cache rows step after step: ``AT``
    (Hk, K, R) keeps the widened rows and ``seen`` (Hk, R, K/4) the bits they came from, compared 64 bits
    at a time through ``A64`` (A's rows as uint64); a row is widened again only where its bits differ (a
    new token's row, or any edit of the cache), so the result is the same whatever changed the cache.
    ``fresh``: nothing kept yet."""
    Hk, R, K = A.shape
    H, T = out.shape[0], out.shape[1]
    g = H // Hk
    for hk in range(Hk):
        for r in range(R):
            diff = np.uint64(1) if fresh else np.uint64(0)
            for w in range(A64.shape[2]):
                diff |= A64[hk, r, w] ^ seen[hk, r, w]
            if diff:
                for w in range(A64.shape[2]):
                    seen[hk, r, w] = A64[hk, r, w]
                for k in range(K):
                    AT[hk, k, r] = f16_bits_to_f32(A[hk, r, k])
    acc = np.empty((n_reg * lanes, R), np.float32)
    scratch = np.empty((lanes + prog.shape[0], R), np.float32)
    for hk in range(Hk):
        for h in range(hk * g, (hk + 1) * g):
            for t in range(T):
                _dot_rows(AT[hk], B[h, t], out[h, t], n_reg, lanes, prog, acc, scratch)


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


@njit(inline="always")
def v_expf(x, variant):
    """ggml_v_expf. variant 0 (AVX-512): j = 1 + poly(b), result j * 2^n (scalef). variant 1 (AVX2):
    k = 2^n built in the exponent bits, j = poly(b) without the 1, result fma(k, j, k); past |n| = 126
    the scale is split in two factors, past 192 it saturates."""
    z = fma(x, LOG2E, SHIFT)
    n = z - SHIFT
    b = fma(-n, LN2_LO, fma(-n, LN2_HI, x))
    u = b * b
    p = fma(fma(C0, b, C1), u, fma(C2, b, C3))
    if np.isnan(n):
        return np.float32(np.nan)
    if variant == 0:
        j = fma(p, u, fma(C4, b, ONE))
        if abs(n) > 192:
            return np.float32(np.inf) if n > 0 else np.float32(0.0)
        return np.float32(np.float64(j) * pow2(int(n)))          # scalef: j * 2^n, rounded once
    j = fma(p, u, C4 * b)
    if abs(n) <= 126:
        k = np.float32(pow2(int(n)))
        return fma(k, j, k)
    s1 = np.float32(2.0 ** 127) if n > 0 else np.float32(2.0 ** -125)
    if abs(n) > 192:
        return s1 * s1
    s2 = np.float32(pow2(int(n) - 127)) if n > 0 else np.float32(pow2(int(n) + 125))
    return fma(s2, j, s2) * s1


@njit(cache=True)
def expf(x, out, variant):
    for i in range(x.size):
        out.flat[i] = v_expf(x.flat[i], variant)


@njit(cache=True)
def swiglu(g, u, out, variant):
    """ggml_vec_swiglu_f32 over rows: silu(g) * u, silu(x) = x / (1 + exp(-x)) (whole vector blocks)."""
    for r in range(out.shape[0]):
        for i in range(out.shape[1]):
            x = g[r, i]
            out[r, i] = (x / (ONE + v_expf(-x, variant))) * u[r, i]


@njit(inline="always")
def _soft_max_rows(x, mask, scale, out, lanes, prog, variant, j0, j1):
    n_head, n_q, n = x.shape
    w = np.empty(n, np.float32)
    blk = np.empty(lanes, np.float32)
    scratch = np.empty(lanes + prog.shape[0], np.float32)
    for hq in range(j0, j1):
        h, q = hq // n_q, hq % n_q
        mx = np.float32(-np.inf)
        for i in range(n):
            v = x[h, q, i] * scale
            if mask.shape[0]:
                v = v + mask[q, i]
            w[i] = v
            if v > mx:
                mx = v
        s = np.float64(0.0)
        for i0 in range(0, n, lanes):
            for l in range(lanes):
                e = v_expf(np.float32(w[i0 + l] - mx), variant)
                w[i0 + l] = e
                blk[l] = e
            s += np.float64(run_tree(blk, prog, scratch))
        inv = np.float32(1.0 / s)
        for i in range(n):
            out[h, q, i] = w[i] * inv


@njit(cache=True)
def soft_max(x, mask, scale, out, lanes, prog, variant):
    """ggml_compute_forward_soft_max_f32 per row of x (heads, rows, n), n a multiple of ``lanes``:
    w = x*scale + mask, exp(w - max) in blocks whose horizontal sums (``prog``) add up in double,
    then times (float)(1/sum). ``mask`` has one row per query row (broadcast over heads), or none."""
    _soft_max_rows(x, mask, scale, out, lanes, prog, variant, 0, x.shape[0] * x.shape[1])


@njit(cache=True, parallel=True)
def soft_max_mt(x, mask, scale, out, lanes, prog, variant, n_chunks):
    n = x.shape[0] * x.shape[1]
    for c in prange(n_chunks):
        _soft_max_rows(x, mask, scale, out, lanes, prog, variant, c * n // n_chunks, (c + 1) * n // n_chunks)
