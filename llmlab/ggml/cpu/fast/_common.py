"""Scalar helpers shared by the fast kernels: float16 conversions (numba has no float16), the fused
multiply-add as the NumPy references emulate it, the 8-lane horizontal sum, and the thread count."""
from __future__ import annotations

import os

import numba
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

F32, F64 = np.float32, np.float64
G = 32          # rows side by side in the packed weight layouts (one int16 zmm register across rows)
NOPYTHON = dict(cache=True, nogil=True, boundscheck=False)


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


@njit(inline="always", **NOPYTHON)
def f32_to_f16_bits(x):
    """GGML_FP32_TO_FP16 (round to nearest even, overflow to inf, subnormals), as numpy's astype(float16)."""
    u = _f32_bits(x)
    sign = u & np.uint32(0x80000000)
    u ^= sign
    if u >= np.uint32(0x47800000):                    # >= 65536 (or inf/nan)
        o = np.uint32(0x7E00) if u > np.uint32(0x7F800000) else np.uint32(0x7C00)
    elif u < np.uint32(0x38800000):                   # result subnormal or zero: let the FPU round
        f = _bits_f32(u) + np.float32(0.5)
        o = _f32_bits(f) - np.uint32(0x3F000000)
    else:
        mant_odd = (u >> np.uint32(13)) & np.uint32(1)
        u += np.uint32(0xC8000FFF)                     # ((15 - 127) << 23) + 0xfff, modulo 2**32
        u += mant_odd
        o = u >> np.uint32(13)
    return np.uint16(o | (sign >> np.uint32(16)))


@njit(inline="always", **NOPYTHON)
def f16_bits_to_f32(h):
    h = np.uint32(h)
    sign = (h & np.uint32(0x8000)) << np.uint32(16)
    em = h & np.uint32(0x7FFF)
    if em >= np.uint32(0x7C00):
        return _bits_f32(sign | np.uint32(0x7F800000) | ((em & np.uint32(0x3FF)) << np.uint32(13)))
    if em >= np.uint32(0x400):
        return _bits_f32(sign | ((em << np.uint32(13)) + np.uint32(0x38000000)))
    v = np.float32(em) * np.float32(5.9604644775390625e-08)      # 2**-24, exact
    return -v if sign else v


@njit(inline="always", **NOPYTHON)
def f16_round(x):
    """float32 -> nearest float16 value, returned as float32."""
    return f16_bits_to_f32(f32_to_f16_bits(x))


@intrinsic
def _f32_bits(typingctx, x):
    """The bits of a float32 as uint32 (a bitcast)."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))
    return types.uint32(types.float32), codegen


@intrinsic
def _bits_f32(typingctx, u):
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())
    return types.float32(types.uint32), codegen


def thread_count() -> int:
    """LLMLAB_THREADS, default all cores (numba's pool size)."""
    v = os.environ.get("LLMLAB_THREADS", "").strip()
    n = int(v) if v else numba.config.NUMBA_NUM_THREADS
    return max(1, min(n, numba.config.NUMBA_NUM_THREADS))


def set_threads(n: int | None = None) -> int:
    """Set numba's thread count (from LLMLAB_THREADS when n is None); returns it."""
    n = thread_count() if n is None else max(1, min(int(n), numba.config.NUMBA_NUM_THREADS))
    numba.set_num_threads(n)
    return n


@njit(**NOPYTHON)
def round_to_f16(x):
    """float32 array -> its float16 roundings as float32 (for tests of the conversion)."""
    out = np.empty_like(x)
    for i in range(x.size):
        out.flat[i] = f16_round(x.flat[i])
    return out
