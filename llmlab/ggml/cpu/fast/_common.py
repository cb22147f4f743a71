"""Scalar helpers shared by the fast kernels: float16 conversions (numba has no float16), the fused
multiply-add as the NumPy references emulate it, the 8-lane horizontal sum, and the thread count."""
from __future__ import annotations

import threading

import numba
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from .... import config
from ..shipped_kernels import install as install_cache_guard
from ..threadpool import install_inline_regions, wake_cost_us

F32, F64 = np.float32, np.float64
G = 32          # rows side by side in the packed weight layouts (one int16 zmm register across rows)
NOPYTHON = dict(cache=True, nogil=True, boundscheck=False)
install_cache_guard()   # before any cached kernel loads: the target (shipped kernels), a damaged cache compiled anew
install_inline_regions()    # ... and before any parallel kernel links: a one-thread region runs on the caller


@intrinsic
def fma(typingctx, a, b, c):
    """float32 fused multiply-add a*b + c rounded once: LLVM's llvm.fma, the FMA instruction (vfmadd,
    vectorized with the loop) where the CPU has one. The operands are converted to float32 first,
    as ggml converts its int32 lane sums (_mm256_cvtepi32_ps) before the fma."""
    sig = types.float32(a, b, c)

    def codegen(context, builder, signature, args):
        f32 = ir.FloatType()
        ops = [context.cast(builder, v, t, types.float32) for v, t in zip(args, signature.args)]
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(f32, [f32] * 3), "llvm.fma.f32")
        return builder.call(fn, ops)
    return sig, codegen


@njit(inline="always", **NOPYTHON)
def hsum8(a0, a1, a2, a3, a4, a5, a6, a7):
    """ggml's hsum_float_8: (lanes 0-3 + lanes 4-7), then (0+2) + (1+3), all in float32."""
    r0 = a0 + a4
    r1 = a1 + a5
    r2 = a2 + a6
    r3 = a3 + a7
    return (r0 + r2) + (r1 + r3)


@intrinsic
def f32_to_f16_bits(typingctx, x):
    """GGML_CPU_FP32_TO_FP16: float32 -> float16 bits, round to nearest even (vcvtps2ph with F16C;
    numpy's astype(float16) rounds the same)."""
    def codegen(context, builder, signature, args):
        v = context.cast(builder, args[0], signature.args[0], types.float32)
        return builder.bitcast(builder.fptrunc(v, ir.HalfType()), ir.IntType(16))
    return types.uint16(x), codegen


@intrinsic
def f16_bits_to_f32(typingctx, h):
    """GGML_CPU_FP16_TO_FP32: float16 bits -> float32, exact (vcvtph2ps; vectorized with the loop)."""
    def codegen(context, builder, signature, args):
        v = context.cast(builder, args[0], signature.args[0], types.uint16)
        return builder.fpext(builder.bitcast(v, ir.HalfType()), ir.FloatType())
    return types.float32(h), codegen


def as_f32(x):
    """A float32 as is; float16 bits (uint16) widened. Kernels that take either (f16 scales of packed
    weights, the f16 KV cache, f16-rounded activations) compile once per dtype from one body."""


@overload(as_f32, inline="always")
def _as_f32_impl(x):
    if isinstance(x, types.Integer):
        return lambda x: f16_bits_to_f32(x)
    return lambda x: x


@njit(inline="always", **NOPYTHON)
def f16_round(x):
    """float32 -> nearest float16 value, returned as float32."""
    return f16_bits_to_f32(f32_to_f16_bits(x))


def _threading_layer_fn(builder, name: str, fnty):
    """numba's threading-layer entry ``name``, registered with LLVM by name when numba launches its
    threads, declared by name as parfor's launcher declares ``get_num_threads``: numba's own jitted
    set_num_threads holds a ctypes pointer, which would make every kernel using it uncacheable."""
    from numba.np.ufunc.parallel import _launch_threads
    _launch_threads()
    return cgutils.get_or_insert_function(builder.module, fnty, name)


@intrinsic
def _get_num_threads(typingctx):
    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)                  # declared as parfor's launcher declares it (the C int, widened)
        n = builder.call(_threading_layer_fn(builder, "get_num_threads", ir.FunctionType(i64, [])), [])
        return builder.sext(builder.trunc(n, ir.IntType(32)), i64)
    return types.int64(), codegen


@intrinsic
def _set_num_threads(typingctx, n):
    def codegen(context, builder, signature, args):
        v = context.cast(builder, args[0], signature.args[0], types.int32)
        builder.call(_threading_layer_fn(builder, "set_num_threads", ir.FunctionType(ir.VoidType(), [ir.IntType(32)])), [v])
        return context.get_dummy_value()
    return types.none(n), codegen


@njit(inline="always", **NOPYTHON)
def restore_threads(n):
    _set_num_threads(n)


@njit(inline="always", **NOPYTHON)
def limit_threads(n):
    """Inside a kernel: run its parallel regions on at most ``n`` threads (0: the count the step set) and
    return the count to restore. One thread is the serial case: the outlined prange body on the calling
    thread, with nobody woken, on every layer (threadpool.install_inline_regions). (LLVM compiles that
    body about twice as fast as a plain serial loop, whose array views pay reference counts per block:
    SmolLM2's q4_1 and Gemma's q8_0 head, 2.3x.)"""
    prev = _get_num_threads()
    if 0 < n < prev:
        _set_num_threads(n)
    return prev


def thread_count() -> int:
    """The thread count of config's one policy (LLMLAB_THREADS, else llama.cpp's default), capped by numba's pool."""
    return min(config.threads()[0], numba.config.NUMBA_NUM_THREADS)


# What threading a product saves: one thread computes about WORK_PER_US quantized multiply-adds a
# microsecond (the AVX2 byte-dot kernels on the Zen 3: SmolLM2's 1536x576 q4_1 matvec, 884,736 of them, in
# 57 us), so n threads save work / WORK_PER_US * (n - 1) / n microseconds, and pay when that exceeds what
# waking them costs (threadpool.wake_cost_us). MIN_WORK is the floor: the threshold tuned on omp, whose
# threads answer in a few microseconds.
WORK_PER_US = 15000
MIN_WORK = 1 << 18


def min_work_for(wake_us: float, n: int) -> int:
    """The multiply-adds from which n threads pay for a wake of ``wake_us`` microseconds (at least MIN_WORK)."""
    if n <= 1:
        return MIN_WORK
    return max(MIN_WORK, int(wake_us * WORK_PER_US * n / (n - 1)))


def parallel_min_work() -> int:
    """Multiply-adds of a quantized product from which it runs threaded: LLMLAB_PARALLEL_MIN_WORK where set,
    else :func:`min_work_for` the measured wake cost of the layer's threads (measured once per process:
    about 2^18 on omp and tbb, several million under workqueue, where a decode step's products then run on
    the calling thread). Read when a kernel is bound, not per call."""
    n = threads()
    return config.parallel_min_work(default=lambda: min_work_for(wake_cost_us(n), n))


_THREADS = [0]          # 0: not set yet (threads() sets it from config on first use)
_IN_USE: dict[int, int] = {}     # per Python thread (numba's count is per thread): the count last set here


def set_threads(n: int | None = None) -> int:
    """Set numba's thread count (config's policy when n is None); returns it."""
    n = min(config.threads(n)[0], numba.config.NUMBA_NUM_THREADS)
    numba.set_num_threads(n)
    _THREADS[0] = n
    _IN_USE[threading.get_ident()] = n
    return n


def use_threads(n: int) -> None:
    """Run the next kernels on ``n`` threads (at most the count set_threads set), leaving the kernels' choice
    of a threaded or serial twin as it is: a step's count, as ggml_backend_cpu_set_n_threads sets it per
    graph (llmlab.ggml.cpu.threadpool chooses it). numba is called only when the count changes: a decode
    step sets it twice (the governor's count, then all threads back), and numba.set_num_threads, cheap
    alone, cost 50-60 us a call between two steps' weight streams (its code and data out of the caches)."""
    n = max(1, min(int(n), threads()))
    me = threading.get_ident()
    if _IN_USE.get(me) != n:
        numba.set_num_threads(n)
        _IN_USE[me] = n


def threads() -> int:
    """The count set_threads last set, without numba.get_num_threads' lock (2-3 us, paid per kernel
    call it was). Only the choice between a threaded and a serial call reads it; results do not
    depend on the count."""
    return _THREADS[0] or set_threads()


@njit(**NOPYTHON)
def round_to_f16(x):
    """float32 array -> its float16 roundings as float32 (for tests of the conversion)."""
    out = np.empty_like(x)
    for i in range(x.size):
        out.flat[i] = f16_round(x.flat[i])
    return out
