"""numba twins of ggml-cpu's row ops: RMS norm, the RoPE cache and rotation (their float order matters),
and SET_ROWS into the KV cache (f32 -> f16 by F16C, as ggml's conversion rounds); and the fused forms
the plan's fusions call (``cplan.FUSIONS``), whose NumPy twins are in ``fast.twins.FUSED``."""
from __future__ import annotations

import ctypes
import functools

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic, overload

from ..libm import libm
from ._common import f16_bits_to_f32, f32_to_f16_bits, fma


@intrinsic
def _call_f32(typingctx, fn, x):
    """Call the C function at address ``fn`` (float -> float). The address comes at run time, so LLVM
    cannot treat the call as its own cosf/sinf: no constant folding, no sincosf, no vector library;
    the bits are those of the C library the reference calls through ctypes."""
    def codegen(context, builder, signature, args):
        f32 = ir.FloatType()
        ptr = builder.inttoptr(args[0], ir.FunctionType(f32, [f32]).as_pointer())
        return builder.call(ptr, [context.cast(builder, args[1], signature.args[1], types.float32)])
    return types.float32(types.intp, x), codegen


@njit(cache=True)
def _rope_cache(pos, half, fs, ts, af, cosf, sinf, cos, sin):
    for i in range(pos.shape[0]):
        th = np.float32(pos[i])
        for k in range(half):
            t = fs * th
            cos[i, k] = _call_f32(cosf, t) * af
            sin[i, k] = _call_f32(sinf, t) * af
            th = th * ts


@functools.cache
def _cos_sin_addresses() -> tuple[int, int]:
    """The addresses of the C library's cosf and sinf, looked up once."""
    lib = libm()
    return tuple(ctypes.cast(getattr(lib, f), ctypes.c_void_p).value for f in ("cosf", "sinf"))


def rope_cache(pos, n_dims: int, freq_base: float, freq_scale: float = 1.0, attn_factor: float = 1.0):
    """ggml_rope_cache_init as ``ops.rope_cache`` computes it (theta times theta_scale in float, the C
    library's cosf/sinf), one call per step instead of one ctypes call per pair; None without a C
    math library (the reference then rounds NumPy's double cos)."""
    lib = libm()
    if not lib:
        return None
    f32 = np.float32
    ts = f32(lib.powf(float(f32(freq_base)), float(f32(-2.0) / f32(n_dims))))
    pos = np.ascontiguousarray(pos, np.int32)
    cos = np.empty((len(pos), n_dims // 2), f32)
    sin = np.empty_like(cos)
    cosf, sinf = _cos_sin_addresses()
    _rope_cache(pos, n_dims // 2, f32(freq_scale), ts, f32(attn_factor), cosf, sinf, cos, sin)
    return cos, sin


@njit(inline="always")
def _rms_scale(x, r, n, eps):
    """Row r's 1/sqrt(mean(x^2) + eps) as ggml computes it: float squares added in double, one
    after another; the mean rounded to float before the square root."""
    s = np.float64(0.0)
    for i in range(n):
        v = x[r, i]
        s += np.float64(v * v)
    mean = np.float32(s / n)
    return np.float32(1.0) / np.sqrt(mean + eps)


@njit(cache=True)
def rms_norm(x, eps, out):
    """ggml_compute_forward_rms_norm_f32: float squares added in double, one after another;
    scale = 1/sqrt(mean + eps) in float. x and out: (rows, n)."""
    rows, n = x.shape
    for r in range(rows):
        scale = _rms_scale(x, r, n, eps)
        for i in range(n):
            out[r, i] = x[r, i] * scale


@njit(cache=True)
def rms_norm_mul(x, eps, w, out, a, b):
    """RMS_NORM then MUL by a weight row (a norm and its scale, as every llama layer has them) in one
    call: out[r] = (x[r] * scale_r) * w, each product rounded to float32 as the two ops round it, the
    norm's own output never stored (its only reader is the MUL). With ``a`` non-empty the residual ADD
    before it too: x = a + b, stored (later layers read it). w broadcasts over the rows."""
    rows, n = x.shape
    add = a.shape[0] > 0
    for r in range(rows):
        if add:
            for i in range(n):
                x[r, i] = a[r, i] + b[r, i]
        scale = _rms_scale(x, r, n, eps)
        for i in range(n):
            out[r, i] = (x[r, i] * scale) * w[i]


@njit(inline="always")
def _rotate(x0, x1, c, s, fused_sin):
    """One pair rotated as ggml's rotate_pairs rounds it: the first product of each line fused, except
    where the profile's auto-vectorized loop fuses x1*sin instead (``fused_sin``)."""
    r0 = fma(-x1, s, x0 * c) if fused_sin else fma(x0, c, -(x1 * s))
    return r0, fma(x0, s, x1 * c)


@njit(cache=True)
def rope(x, cos, sin, n_dims, neox, out, vec_pairs=0):
    """rotate_pairs with the cos/sin cache: x (tokens, heads, head_dim), cos/sin (tokens, n_dims/2).
    NORM pairs (2i, 2i+1), NEOX pairs (i, i + n_dims/2); the first ``vec_pairs`` NORM pairs are the
    profile's auto-vectorized loop (``_rotate``)."""
    T, H, D = x.shape
    half = n_dims // 2
    for th in range(T * H):
        t, h = th // H, th % H
        for i in range(half):
            i0, i1 = (i, i + half) if neox else (2 * i, 2 * i + 1)
            out[t, h, i0], out[t, h, i1] = _rotate(x[t, h, i0], x[t, h, i1], cos[t, i], sin[t, i], i < vec_pairs)
        for i in range(n_dims, D):
            out[t, h, i] = x[t, h, i]


@njit(cache=True)
def rope_scale(x, cos, sin, n_dims, neox, scale, out, vec_pairs=0):
    """``rope`` then SCALE (Gemma's query times 1/sqrt(head size)) in one call: each rotated value
    rounded to float32 as ROPE stores it, then multiplied by ``scale`` as SCALE does; the ROPE's own
    output is not stored (its only reader is the SCALE). ``out`` may be ``x`` itself."""
    T, H, D = x.shape
    half = n_dims // 2
    for th in range(T * H):
        t, h = th // H, th % H
        for i in range(half):
            i0, i1 = (i, i + half) if neox else (2 * i, 2 * i + 1)
            r0, r1 = _rotate(x[t, h, i0], x[t, h, i1], cos[t, i], sin[t, i], i < vec_pairs)
            out[t, h, i0] = r0 * scale
            out[t, h, i1] = r1 * scale
        for i in range(n_dims, D):
            out[t, h, i] = x[t, h, i] * scale


@njit(cache=True)
def rms_norm_mul_rope(x, H, eps, w, cos, sin, n_dims, neox, scale, scaled, out, vec_pairs=0):
    """RMS_NORM, MUL by a weight row, ROPE, and with ``scaled`` SCALE (Gemma's q and k norms before
    their rotation; q then times 1/sqrt(head size)) in one call: x and out (tokens * heads, head_dim),
    row r of token r // H. Each value rounded to float32 as each op stores it; the intermediate rows are
    not stored (each has one reader, the next op). A row is read whole before it is written, so ``out``
    may be ``x`` itself."""
    rows, D = x.shape
    half = n_dims // 2
    for r in range(rows):
        t = r // H
        s = _rms_scale(x, r, D, eps)
        for i in range(half):
            i0, i1 = (i, i + half) if neox else (2 * i, 2 * i + 1)
            r0, r1 = _rotate((x[r, i0] * s) * w[i0], (x[r, i1] * s) * w[i1], cos[t, i], sin[t, i], i < vec_pairs)
            if scaled:
                r0, r1 = r0 * scale, r1 * scale
            out[r, i0], out[r, i1] = r0, r1
        for i in range(n_dims, D):
            v = (x[r, i] * s) * w[i]
            out[r, i] = v * scale if scaled else v


def _cell(x, like):
    """x as a cell of ``like``'s array: float16 bits for a uint16 (f16) array, else as is."""


@overload(_cell, inline="always")
def _cell_impl(x, like):
    if isinstance(like, types.Integer):
        return lambda x, like: f32_to_f16_bits(x)
    return lambda x, like: x


@njit(inline="always")
def _rows_in(I, n):
    """Every index of I in 0..n-1."""
    for i in range(I.shape[0]):
        if I[i] < 0 or I[i] >= n:
            return False
    return True


@njit(inline="always")
def _write_rows(D, V, I):
    for i in range(I.shape[0]):
        row, src = D[I[i]], V[i]
        for c in range(src.shape[0]):
            row[c] = _cell(src[c], row[0])


@njit(cache=True)
def set_rows(D, V, I):
    """D[I[i]] = V[i] (D: f16 bits or float32 rows; V float32). False, writing nothing, when an index
    is out of range."""
    if not _rows_in(I, D.shape[0]):
        return False
    _write_rows(D, V, I)
    return True


@njit(cache=True)
def set_rows_pair(Dk, K, Dv, V, I):
    """A layer's two SET_ROWS into its K and V caches at the same cells (``set_rows`` twice, one call).
    False, writing nothing, when an index is out of range of either."""
    if not _rows_in(I, min(Dk.shape[0], Dv.shape[0])):
        return False
    _write_rows(Dk, K, I)
    _write_rows(Dv, V, I)
    return True


@njit(cache=True)
def rope_set_rows_pair(X, cos, sin, n_dims, neox, Dk, Dv, V, I, vec_pairs=0):
    """A layer's K rotated (``rope``) and written into its cache cells, then V's rows into theirs (ROPE,
    SET_ROWS of K, SET_ROWS of V in one call): X (tokens, heads, head_dim), token i's rotated heads are
    row I[i] of Dk, each value rounded to float32 as ROPE stores it, then to a cell (f16) as SET_ROWS
    converts it; the rotated rows themselves are not stored (the SET_ROWS is their one reader). False,
    writing nothing, when an index is out of range of either cache."""
    if not _rows_in(I, min(Dk.shape[0], Dv.shape[0])):
        return False
    H, D = X.shape[1], X.shape[2]
    half = n_dims // 2
    for t in range(I.shape[0]):
        row = Dk[I[t]]
        for h in range(H):
            o = h * D
            for i in range(half):
                i0, i1 = (i, i + half) if neox else (2 * i, 2 * i + 1)
                r0, r1 = _rotate(X[t, h, i0], X[t, h, i1], cos[t, i], sin[t, i], i < vec_pairs)
                row[o + i0] = _cell(r0, row[0])
                row[o + i1] = _cell(r1, row[0])
            for i in range(n_dims, D):
                row[o + i] = _cell(X[t, h, i], row[0])
    _write_rows(Dv, V, I)
    return True


@njit(cache=True)
def get_rows_q8_0(A, I, O):
    """O[i] = dequantize_row_q8_0(A[I[i]]) for q8_0 rows as bytes (A: (rows, blocks * 34) uint8): each
    value float(q) * float(d), d the block's f16 scale. False, writing nothing, when an index is out of
    range. (A decode step's token embedding: the NumPy reference took 25-45 us for one row.)"""
    n = A.shape[0]
    for i in range(I.shape[0]):
        if I[i] < 0 or I[i] >= n:
            return False
    nb = A.shape[1] // 34
    for i in range(I.shape[0]):
        row, o = A[I[i]], O[i]
        for b in range(nb):
            d = f16_bits_to_f32(np.uint16(row[34 * b]) | (np.uint16(row[34 * b + 1]) << np.uint16(8)))
            for j in range(32):
                o[32 * b + j] = np.float32(np.int8(row[34 * b + 2 + j])) * d
    return True
