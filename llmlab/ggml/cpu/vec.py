"""ggml-cpu's vector routines (vec.cpp, vec.h): the f16 dot product, exp, SiLU, softmax, GELU.

Each routine is written once and takes the CPU profile (``llmlab.ggml.cpu.profiles``) that says
how wide its registers are and how their lanes are summed:

- :func:`vec_dot_f16` (``ggml_vec_dot_f16``): ``f32_arr`` accumulator registers of ``f32_lanes``
  lanes take consecutive pieces of each ``f16_step`` elements (fma); then the registers fold
  pairwise, the last one's lanes follow ``vec_reduce_tree``; the tail (n % step) is added in double.
- :func:`v_expf` (``ggml_v_expf``): ARM's optimized-routines polynomial, in two variants: AVX-512
  scales with ``_mm512_scalef_ps``; AVX2 (and SSE2, NEON) builds 2^n from the exponent bits and
  returns ``fma(k, j, k)``, with a slow path for |n| > 126.
- :func:`soft_max_rows` (``ggml_vec_soft_max_f32``): blocks of ``f32_lanes`` through ``v_expf``,
  each block's horizontal sum (``hsum_tree``) added to a double; the tail through the C library's
  ``expf``, added one by one.
- :func:`silu` (``ggml_vec_silu_f32`` / ``swiglu``): ``x / (1 + exp(-x))`` per block, tail in libm.
"""
from __future__ import annotations

import numpy as np
from numpy import float32, float64

from . import profiles
from .libm import expf as libm_expf
from .libm import libm
from .simd import fma, fma64, fma_f16, reduce_registers, reduce_tree


# ---- ggml_vec_dot_f16 ---------------------------------------------------------------------------

def _f16_registers_f32(x, y, shape, step, arr, lanes, cpu) -> np.ndarray:
    """F16C / plain NEON: halves widened to float32 lanes, fma in float32, registers folded in float32."""
    acc = np.zeros(shape + (arr, lanes), float64)
    for i in range(0, x.shape[-1] - x.shape[-1] % step, step):
        xs = x[..., i:i + step].reshape(x.shape[:-1] + (arr, lanes)).astype(float64)
        ys = y[..., i:i + step].reshape(y.shape[:-1] + (arr, lanes))
        acc = fma64(xs, ys, acc).astype(float64)
    return reduce_tree(reduce_registers(acc.astype(float32)), cpu.vec_reduce_tree)


def _f16_registers_f16(x, y, shape, step, arr, lanes, cpu) -> np.ndarray:
    """FP16 vector arithmetic (GGML_F16x8_FMA = vfmaq_f16): the accumulators are float16x8_t, every
    fma rounds to half precision, the registers fold in half precision (vaddq_f16); only then are the
    lanes widened (low half + high half, vaddvq_f32). Attention scores inherit the 11-bit sums."""
    acc = np.zeros(shape + (arr, lanes), np.float16)
    for i in range(0, x.shape[-1] - x.shape[-1] % step, step):
        xs = x[..., i:i + step].reshape(x.shape[:-1] + (arr, lanes))
        ys = y[..., i:i + step].reshape(y.shape[:-1] + (arr, lanes))
        acc = fma_f16(xs, ys, acc)
    while acc.shape[-2] > 1:                          # exact in float64, then one rounding to half
        h = acc.shape[-2] // 2
        acc = (acc[..., :h, :].astype(float64) + acc[..., h:2 * h, :]).astype(np.float16)
    return reduce_tree(acc[..., 0, :].astype(float32), cpu.f16_reduce_tree or cpu.vec_reduce_tree)


F16_DOT = {"f32": _f16_registers_f32, "f16": _f16_registers_f16}


def vec_dot_f16(x: np.ndarray, y: np.ndarray, cpu=None) -> np.ndarray:
    """ggml_vec_dot_f16 over the last axis (broadcasting); x and y hold f16 values (as float32 or f16)."""
    cpu = profiles.resolve(cpu)
    x = np.asarray(x, float32)
    y = np.asarray(y, float32)
    n = x.shape[-1]
    step, arr = cpu.f16_step, cpu.f16_arr or cpu.f32_arr
    np_ = n - n % step
    shape = np.broadcast_shapes(x.shape[:-1], y.shape[:-1])
    total = F16_DOT[cpu.f16_acc](x, y, shape, step, arr, step // arr, cpu).astype(float64)
    if np_ < n:                                   # leftovers: sumf += (ggml_float)(x*y), one by one
        prod = (x[..., np_:] * y[..., np_:]).astype(float32).astype(float64)
        for j in range(prod.shape[-1]):
            total = total + prod[..., j]
    return total.astype(float32)


# ---- ggml_v_expf ---------------------------------------------------------------------------------

_C = {k: float32(float.fromhex(v)) for k, v in dict(
    log2e="0x1.715476p+0", r="0x1.8p23", ln2_hi="0x1.62e4p-1", ln2_lo="0x1.7f7d1cp-20",
    c0="0x1.0e4020p-7", c1="0x1.573e2ep-5", c2="0x1.555e66p-3", c3="0x1.fffdb6p-2", c4="0x1.ffffecp-1").items()}


def _expf_reduce(x: np.ndarray):
    """The shared start: n = round(x / ln 2) (through the 1.5 * 2^23 trick), b = x - n ln2 in two fmas."""
    z = fma(x, _C["log2e"], _C["r"])
    n = (z - _C["r"]).astype(float32)
    b = fma(-n, _C["ln2_lo"], fma(-n, _C["ln2_hi"], x))
    u = (b * b).astype(float32)
    return z, n, b, u


def expf_scalef(x: np.ndarray) -> np.ndarray:
    """ggml_v_expf on AVX-512: j = 1 + poly(b) (the 1 folded into the last fma), result scalef(j, n)."""
    x = np.asarray(x, float32)
    with np.errstate(invalid="ignore", over="ignore"):
        z, n, b, u = _expf_reduce(x)
        j = fma(fma(fma(_C["c0"], b, _C["c1"]), u, fma(_C["c2"], b, _C["c3"])), u, fma(_C["c4"], b, float32(1.0)))
        res = np.ldexp(j.astype(float64), np.nan_to_num(n, nan=0, posinf=0, neginf=0).astype(np.int64)).astype(float32)
        big = np.abs(n) > 192
        if big.any():
            res = np.where(big, np.where(n > 0, float32(np.inf), float32(0)), res)
    return res


def expf_bits(x: np.ndarray) -> np.ndarray:
    """ggml_v_expf on AVX2 (and SSE2/NEON): k = 2^n from z's bits, j = poly(b) without the 1,
    result fma(k, j, k); for |n| > 126 the scale is split in two (s1, s2), beyond 192 it saturates."""
    x = np.asarray(x, float32)
    with np.errstate(invalid="ignore", over="ignore"):
        z, n, b, u = _expf_reduce(x)
        e = (z.view(np.uint32) << np.uint32(23)).astype(np.uint32)
        k = (e + np.float32(1.0).view(np.uint32)).astype(np.uint32).view(float32)
        j = fma(fma(fma(_C["c0"], b, _C["c1"]), u, fma(_C["c2"], b, _C["c3"])), u, (_C["c4"] * b).astype(float32))
        res = fma(k, j, k)
        an = np.abs(n)
        c = an > 126
        if c.any():
            g = np.where(n <= 0, np.uint32(0x82000000), np.uint32(0)).astype(np.uint32)
            s1 = (g + np.uint32(0x7F000000)).astype(np.uint32).view(float32)
            s2 = (e - g).astype(np.uint32).view(float32)
            slow = (fma(s2, j, s2) * s1).astype(float32)
            sat = (s1 * s1).astype(float32)
            res = np.where(an > 192, sat, np.where(c, slow, res))
    return res


EXPF = {"scalef": expf_scalef, "bits": expf_bits}


def v_expf(x: np.ndarray, cpu=None) -> np.ndarray:
    """ggml_v_expf as the profile's build has it (every element through the vector routine)."""
    return EXPF[profiles.resolve(cpu).expf](x)


def _blocks(n: int, cpu) -> int:
    """How many leading elements a ``for (; i + L-1 < n; i += L)`` loop covers."""
    return n - n % cpu.f32_lanes


def v_silu(x: np.ndarray, cpu=None) -> np.ndarray:
    """x / (1 + exp(-x)) with the vector expf (ggml_v_silu)."""
    x = np.asarray(x, float32)
    return (x / (float32(1.0) + v_expf((float32(0) - x).astype(float32), cpu)).astype(float32)).astype(float32)


def silu_f32(x: np.ndarray) -> np.ndarray:
    """ggml_silu_f32: the scalar tail, x / (1 + expf(-x)) with the C library's expf."""
    x = np.asarray(x, float32)
    return (x / (float32(1.0) + libm_expf(-x)).astype(float32)).astype(float32)


def silu(x: np.ndarray, cpu=None) -> np.ndarray:
    """ggml_vec_silu_f32 over the last axis: vector blocks of f32_lanes, the tail in scalar code."""
    cpu = profiles.resolve(cpu)
    x = np.asarray(x, float32)
    m = _blocks(x.shape[-1], cpu)
    if m == x.shape[-1]:
        return v_silu(x, cpu)
    return np.concatenate([v_silu(x[..., :m], cpu), silu_f32(x[..., m:])], axis=-1)


def soft_max_rows(w: np.ndarray, cpu=None) -> np.ndarray:
    """ggml_vec_soft_max_f32 + the scaling of ggml_compute_forward_soft_max, per row (last axis):
    exp(w - max), the sum in double (block sums of f32_lanes, then the tail one by one),
    then every value times (float)(1/sum)."""
    cpu = profiles.resolve(cpu)
    w = np.asarray(w, float32)
    mx = w.max(-1, keepdims=True)
    d = (w - mx).astype(float32)
    n = d.shape[-1]
    m = _blocks(n, cpu)
    L = cpu.f32_lanes
    e = np.empty_like(d)
    s = np.zeros(d.shape[:-1], float64)
    if m:
        e[..., :m] = v_expf(d[..., :m], cpu)
        parts = reduce_tree(e[..., :m].reshape(e.shape[:-1] + (m // L, L)), cpu.hsum_tree).astype(float64)
        for k in range(parts.shape[-1]):
            s = s + parts[..., k]
    if m < n:
        e[..., m:] = libm_expf(d[..., m:])
        for k in range(m, n):
            s = s + e[..., k].astype(float64)
    return (e * (1.0 / s).astype(float32)[..., None]).astype(float32)


# ---- GELU: ggml_table_gelu_f16 and ggml_vec_gelu_f32 ----------------------------------------------

_GELU_TABLE: np.ndarray | None = None
GELU_COEF_A = float32(0.044715)
SQRT_2_OVER_PI = float32(0.79788456080286535587989211986876)


def gelu_f32(x: np.ndarray) -> np.ndarray:
    """0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2))) in float (ggml_gelu_f32)."""
    x = x.astype(float32)
    return (float32(0.5) * x * (float32(1.0) + np.tanh(SQRT_2_OVER_PI * x * (float32(1.0) + GELU_COEF_A * x * x)))).astype(float32)


def gelu_table() -> np.ndarray:
    """ggml_table_gelu_f16: GELU of every f16 value, stored as f16, computed as ggml-cpu's init does
    (``1 + a*x*x`` fused into one fma, the C library's tanhf)."""
    global _GELU_TABLE
    if _GELU_TABLE is None:
        with np.errstate(all="ignore"):
            x = np.arange(65536, dtype=np.uint16).view(np.float16).astype(float32)
            inner = fma((GELU_COEF_A * x).astype(float32), x, float32(1.0))
            arg = (SQRT_2_OVER_PI * x * inner).astype(float32)
            lib = libm()
            t = np.tanh(arg)
            if lib:
                fin = np.isfinite(arg)
                t[fin] = [lib.tanhf(float(z)) for z in arg[fin]]
            _GELU_TABLE = (float32(0.5) * x * (float32(1.0) + t.astype(float32))).astype(float32).astype(np.float16)
    return _GELU_TABLE


def gelu(x: np.ndarray) -> np.ndarray:
    """ggml-cpu's GELU (GGML_GELU_FP16): through the f16 table, 0 below -10, identity above 10."""
    with np.errstate(over="ignore"):                    # past f16's range: inf, as the C conversion gives
        t = gelu_table()[x.astype(np.float16).view(np.uint16)].astype(float32)
    return np.where(x <= -10.0, float32(0), np.where(x >= 10.0, x, t)).astype(float32)


# ---- ggml_vec_dot_f32 ----------------------------------------------------------------------------

def vec_dot_f32(x: np.ndarray, y: np.ndarray, cpu=None) -> np.ndarray:
    """ggml_vec_dot_f32 over the last axis (broadcasting): ``f32_arr`` registers of ``f32_lanes`` lanes take
    consecutive pieces of each GGML_F32_STEP elements (fma), fold pairwise, the last one's lanes follow
    ``vec_reduce_tree``; the tail (n % step) is added in float one by one (``sumf += x[i]*y[i]``): GCC computes
    its products in vectors (``f32_tail_vectors``: each product rounded, then added in order) and fuses
    what is left over into fmas."""
    cpu = profiles.resolve(cpu)
    x = np.asarray(x, float32)
    y = np.asarray(y, float32)
    n, lanes, arr = x.shape[-1], cpu.f32_lanes, cpu.f32_arr
    step = lanes * arr
    np_ = n - n % step
    shape = np.broadcast_shapes(x.shape[:-1], y.shape[:-1])
    acc = np.zeros(shape + (arr, lanes), float64)
    for i in range(0, np_, step):
        xs = x[..., i:i + step].reshape(x.shape[:-1] + (arr, lanes)).astype(float64)
        ys = y[..., i:i + step].reshape(y.shape[:-1] + (arr, lanes))
        acc = fma64(xs, ys, acc).astype(float64)
    total = reduce_tree(reduce_registers(acc.astype(float32)), cpu.vec_reduce_tree)
    j = np_
    for w in cpu.f32_tail_vectors:                   # the first width loops, each later one runs at most once
        while n - j >= w:
            p = x[..., j:j + w] * y[..., j:j + w]
            for k in range(w):
                total = np.asarray(total + p[..., k], float32)
            j += w
    for i in range(j, n):
        total = fma(x[..., i], y[..., i], total)
    return np.asarray(total, float32)
