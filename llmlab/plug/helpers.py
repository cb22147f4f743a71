"""Exact building blocks a learner's function may use: the pieces of ggml-cpu's arithmetic whose
order or rounding is a property of the machine's build, not of the algorithm (the vector exp, the
lane order of sums, fused multiply-adds, the f16 GELU table, tinyBLAS's f16 products). With them a
learner's RMSNorm, softmax or attention is bit-identical to llama.cpp; without them the text mostly
agrees and the verdict is ``close``, which is itself a lesson.

Each takes the CPU profile the run reproduces (set by the runner while a plugged run goes on; by
default this machine's).
"""
from __future__ import annotations

import contextlib

import numpy as np

from ..ggml.cpu import profiles
from ..ggml.cpu.simd import fma as _fma

_CPU = [None]


@contextlib.contextmanager
def profile(cpu):
    """The profile the helpers reproduce while a plugged run goes on."""
    old = _CPU[0]
    _CPU[0] = profiles.resolve(cpu)
    try:
        yield
    finally:
        _CPU[0] = old


def cpu():
    return _CPU[0] if _CPU[0] is not None else profiles.resolve(None)


def fma(a, b, c) -> np.ndarray:
    """a * b + c with one rounding to float32 (a fused multiply-add, as the compiled C loops have it)."""
    return _fma(np.asarray(a, np.float32), np.asarray(b, np.float32), np.asarray(c, np.float32))


def expf(x) -> np.ndarray:
    """ggml's exp along the last axis: whole vector blocks through its vector expf (``ggml_v_expf``),
    the tail of each row through the C library's ``expf``, as ggml_vec_soft_max_f32 and SiLU run it."""
    from ..ggml.cpu.libm import expf as libm_expf
    from ..ggml.cpu.vec import v_expf
    c = cpu()
    x = np.asarray(x, np.float32)
    n = x.shape[-1]
    m = n - n % c.f32_lanes
    out = np.empty_like(x)
    if m:
        out[..., :m] = v_expf(x[..., :m], c)
    if m < n:
        out[..., m:] = libm_expf(x[..., m:])
    return out


def sum_rows(e) -> np.ndarray:
    """ggml's sum of a row of exps (ggml_vec_soft_max_f32): each vector block's lanes added as the
    CPU's horizontal sum does, the block sums and the tail added one by one in double. float64."""
    from ..ggml.cpu.simd import reduce_tree
    c = cpu()
    e = np.asarray(e, np.float32)
    n = e.shape[-1]
    L = c.f32_lanes
    m = n - n % L
    s = np.zeros(e.shape[:-1], np.float64)
    if m:
        parts = reduce_tree(e[..., :m].reshape(e.shape[:-1] + (m // L, L)), c.hsum_tree).astype(np.float64)
        for k in range(parts.shape[-1]):
            s = s + parts[..., k]
    for k in range(m, n):
        s = s + e[..., k].astype(np.float64)
    return s


def matmul_f16(a, b) -> np.ndarray:
    """ggml's product of f16 data (the KV cache): rows of ``a`` (M, K) with rows of ``b`` (N, K) ->
    (N, M) float32, both rounded to f16 first, summed in the order the CPU's f16 kernel sums
    (llamafile's tinyBLAS or ggml_vec_dot_f16)."""
    from ..ggml.cpu.sgemm import mul_mat_f16_op
    a = np.asarray(a, np.float32).astype(np.float16)
    b = np.asarray(b, np.float32).astype(np.float16)
    return np.asarray(mul_mat_f16_op(a, b, cpu()), np.float32)


def gelu_table() -> np.ndarray:
    """ggml's GELU of every f16 value (65536 entries, f16), indexed by the f16 bits of x."""
    from ..ggml.cpu.vec import gelu_table as t
    return t()


def lane_dot(dd, codes_w, codes_a) -> np.ndarray:
    """The AVX2 order of a quantized dot: per block b, 8 integer lane sums of codes_w * codes_a
    (weights (R, nb, 32), activations (T, nb, 32)), ``acc = fma(dd[b], lanes, acc)`` block after block,
    then the horizontal sum of the 8 lanes. dd: (nb, T, R) float32 block scales. -> (T, R) float32."""
    from ..ggml.cpu.quants import LaneSums, accumulate, hsum
    W = np.asarray(codes_w).astype(np.int16)
    A = np.asarray(codes_a).astype(np.int16)
    return hsum(accumulate(np.asarray(dd, np.float32), LaneSums(W, A)), cpu())


def fma_sum(m, s) -> np.ndarray:
    """``acc = fma(m[b], s[b], acc)`` block after block (the scalar sum of min terms as compiled):
    m and s broadcast to (nb, T, R) -> (T, R) float32."""
    from ..ggml.cpu.quants import _scalar_fma_sum
    return _scalar_fma_sum(np.asarray(m, np.float32), np.asarray(s, np.float32))


def dp4a(a, b, c):
    """CUDA's __dp4a: the four signed bytes of a times those of b, added to c (int32)."""
    from ..cuda_sim.dp4a import dp4a as d
    return d(a, b, c)
