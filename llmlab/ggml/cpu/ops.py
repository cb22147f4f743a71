"""The NumPy reference of every op, registered by op name (ggml-cpu's ops.cpp and the
``ggml_compute_forward`` switch).

Each function takes the node and the CPU profile (``cpu``: a ``profiles.CPUProfile``, its name, or
None for the detected one) and writes its result into the node's bytes. Where ggml-cpu's numerics
matter for exactness they are reproduced: RMS norm sums squares in double, RoPE multiplies the
angle by ``theta_scale`` step by step in float with libm's cosf/sinf, softmax and SiLU go through
``vec`` (the profile's expf and lane sums), GELU through an f16 table, f16 weights (the KV cache)
through tinyBLAS or ``ggml_vec_dot_f16`` (``sgemm``, ``vec``), quantized weights through the kernel
ggml-cpu picks for the shape (:func:`mul_mat_quantized`: REPACK, tiled or vec_dot).
"""
from __future__ import annotations

from typing import Callable

import numpy as np
from numpy import float32, float64

from . import profiles
from .libm import expf as libm_expf
from .simd import fma, fma64, fma_f16
from .journal import rows_written
from .libm import libm
from .vec import gelu as gelu_ggml
from .vec import gelu_f32, gelu_table  # noqa: F401  (re-exported: ggml's GELU lives in vec)
from ..tensor import F16, F32, Tensor
from .quants import mul_mat as quant_mul_mat

COMPUTE: dict[str, Callable[..., None]] = {}


def register(op: str):
    def deco(fn):
        COMPUTE[op] = fn
        return fn
    return deco


def f32(t: Tensor) -> np.ndarray:
    """The tensor's values as float32 (dequantized if needed), shape ne[::-1]."""
    a = t.array()
    if t.type.block_size != 1:
        return dequantize_rows(a.reshape(-1, a.shape[-1]), t.type).reshape(a.shape[:3] + (t.ne[0],))
    return a if a.dtype == np.float32 else a.astype(np.float32)


def dequantize_rows(raw: np.ndarray, qtype) -> np.ndarray:
    from ..quant import dequantize
    return np.asarray(dequantize(raw, qtype), dtype=np.float32).reshape(raw.shape[0], -1)


# ---- MUL_MAT: which kernel ggml-cpu takes (ggml_compute_forward_mul_mat) ---------------------------

def quantized_path(qtype, n_rows: int, repacked: bool, cpu) -> str | None:
    """Which kernel ggml-cpu multiplies a quantized weight with on this profile, for ``n_rows``
    activation rows: 'repack' (the REPACK gemv/gemm, for weights in the REPACK buffer), 'tiled' (the
    tiled K-quant matmul from ``tiled_min_batch`` rows on) or 'vec_dot'; None when llmlab has no exact
    kernel for the type. The one choice of path: the fast kernels (``fast.twins``) follow it too."""
    from .quants import traits_for
    from .repack_gemm import REPACKED_MUL_MAT
    name = qtype.name
    if repacked and name in cpu.repack_types:
        path = "repack" if cpu.repack_layout(name) in REPACKED_MUL_MAT else "vec_dot"
    elif n_rows >= cpu.tiled_min_batch and name in cpu.tiled_types:
        path = "tiled"
    else:
        path = "vec_dot"
    return path if path == "repack" or name in traits_for(cpu) else None


def quantized_kernel(qtype, n_rows: int, repacked: bool, cpu) -> Callable | None:
    """The reference kernel of :func:`quantized_path`: the REPACK gemv/gemm, ``tiled.mul_mat_k_tiled``
    or the type's vec_dot (``quants.mul_mat``); None without an exact kernel."""
    from .repack_gemm import REPACKED_MUL_MAT
    from .tiled import mul_mat_k_tiled
    path = quantized_path(qtype, n_rows, repacked, cpu)
    return {"repack": REPACKED_MUL_MAT.get(cpu.repack_layout(qtype.name)), "tiled": mul_mat_k_tiled, "vec_dot": quant_mul_mat,
            None: None}[path]


def mul_mat_quantized(raw: np.ndarray, qtype, x: np.ndarray, repacked: bool = False, cpu=None) -> np.ndarray:
    """x [N, K] times the quantized weight rows raw [M, row_bytes] -> [N, M], as ggml-cpu computes it.

    ``repacked``: the weight sits where llama.cpp's CPU_REPACK buffer would take it (the profile's
    ``repack_types`` decide). Types without an exact kernel in llmlab use a float stand-in."""
    cpu = profiles.resolve(cpu)
    fn = quantized_kernel(qtype, len(x), repacked, cpu)
    if fn is not None:
        return fn(raw, qtype, x, cpu=cpu)
    w = dequantize_rows(raw, qtype)          # float stand-in (not activation-quantized)
    return (x @ w.T).astype(np.float32)


# ---- ops ------------------------------------------------------------------------------

def _out(dst: Tensor) -> np.ndarray:
    return dst.array()


@register("GET_ROWS")
def get_rows(dst: Tensor, cpu=None) -> None:
    a, ids = dst.src
    idx = ids.array()                                   # (1, ne12, ne11, n)
    A = a.array()                                       # (ne03, ne02, ne01, row)
    out = _out(dst)
    for i12 in range(ids.ne[2]):
        for i11 in range(ids.ne[1]):
            rows = idx[0, i12, i11].astype(np.int64)
            if rows.size and (rows.min() < 0 or rows.max() >= a.ne[1]):
                raise IndexError(f"get_rows: row id out of range 0..{a.ne[1] - 1} in {ids.name}")
            src = A[i12 % a.ne[3], i11 % a.ne[2]][rows]
            if a.type.block_size != 1:
                src = dequantize_rows(src, a.type)
            out[i12, i11] = src


def _bcast(b: np.ndarray, shape) -> np.ndarray:
    if all(x == y or x == 1 for x, y in zip(b.shape, shape)):
        return b
    return np.tile(b, [s // x for s, x in zip(shape, b.shape)])


@register("ADD")
def add(dst: Tensor, cpu=None) -> None:
    a, b = dst.src
    A, B = f32(a), f32(b)
    np.add(A, _bcast(B, A.shape), out=_out(dst))


@register("MUL")
def mul(dst: Tensor, cpu=None) -> None:
    a, b = dst.src
    A, B = f32(a), f32(b)
    np.multiply(A, _bcast(B, A.shape), out=_out(dst))


@register("SCALE")
def scale(dst: Tensor, cpu=None) -> None:
    np.multiply(f32(dst.src[0]), np.float32(dst.op_params["scale"]), out=_out(dst))


@register("MUL_MAT")
def mul_mat(dst: Tensor, cpu=None) -> None:
    a, b = dst.src
    B = f32(b)                                          # (ne13, ne12, N, K)
    out = _out(dst)                                     # (ne13, ne12, N, M)
    r2, r3 = b.ne[2] // a.ne[2], b.ne[3] // a.ne[3]
    cpu = profiles.resolve(cpu)
    if a.type.block_size != 1:
        A = a.array()
        # llama.cpp's CPU_REPACK buffer takes 2-D weights for MUL_MAT (a 3-D one, MLA's attn_k_b, stays put)
        repacked = a.view_src is None and a.ne[2] == 1 and a.ne[3] == 1 and cpu.repacks(a.type.name, a.ne[1])
        for i3 in range(b.ne[3]):
            for i2 in range(b.ne[2]):
                out[i3, i2] = mul_mat_quantized(A[i3 // r3, i2 // r2], a.type, B[i3, i2], repacked, cpu)
        return
    A = a.array()
    if a.type is F16:                                   # ggml-cpu: vec_dot_type f16, activations rounded to f16
        from .sgemm import mul_mat_f16_op
        Bh = B.astype(np.float16)
        for i3 in range(b.ne[3]):
            for i2 in range(b.ne[2]):
                out[i3, i2] = mul_mat_f16_op(A[i3 // r3, i2 // r2], Bh[i3, i2], cpu)
        return
    if a.type is F32 and cpu.arch == "x86_64":       # tinyBLAS f32 or ggml_vec_dot_f32, as ggml-cpu on x86
        from .sgemm import mul_mat_f32_op
        cont = b.is_contiguous()
        for i3 in range(b.ne[3]):
            for i2 in range(b.ne[2]):
                out[i3, i2] = mul_mat_f32_op(A[i3 // r3, i2 // r2], B[i3, i2], cpu, cont)
        return
    if A.dtype != np.float32:                           # (ARM: NumPy's order, not bit-exact)
        A = A.astype(np.float32)
    if r2 > 1:
        A = np.repeat(A, r2, axis=1)
    if r3 > 1:
        A = np.repeat(A, r3, axis=0)
    np.matmul(B, A.swapaxes(-1, -2), out=out)


@register("RMS_NORM")
def rms_norm(dst: Tensor, cpu=None) -> None:
    rms_norm_rows(f32(dst.src[0]), dst.op_params["eps"], out=_out(dst))


def rms_norm_rows(x: np.ndarray, eps: float, out: np.ndarray | None = None) -> np.ndarray:
    """ggml_compute_forward_rms_norm_f32 on the last axis: x / sqrt(mean(x²) + eps), no mean subtracted."""
    x = np.asarray(x, np.float32)
    sq = (x * x).astype(np.float64)                     # sum += (ggml_float)(x[i]*x[i]): float products,
    total = np.add.accumulate(sq, axis=-1)[..., -1]     # added one after another in double
    mean = (total / x.shape[-1]).astype(np.float32)
    scale = (np.float32(1.0) / np.sqrt(mean + np.float32(eps))).astype(np.float32)
    return np.multiply(x, scale[..., None], out=out)


@register("NORM")
def norm(dst: Tensor, cpu=None) -> None:
    x = f32(dst.src[0])
    eps = np.float32(dst.op_params["eps"])
    mean = (x.astype(np.float64).sum(-1) / x.shape[-1]).astype(np.float32)
    y = x - mean[..., None]
    var = (np.einsum("...i,...i->...", y.astype(np.float64), y.astype(np.float64)) / x.shape[-1]).astype(np.float32)
    np.multiply(y, (np.float32(1.0) / np.sqrt(var + eps))[..., None], out=_out(dst))


# ---- RoPE: the cos/sin cache from the C library's powf/cosf/sinf, the rotation with one fma ------

_ROPE_ROWS: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}


def rope_cache(pos: np.ndarray, n_dims: int, freq_base: float, freq_scale: float = 1.0,
               attn_factor: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin per (position, pair) as ggml_rope_cache_init: theta starts at the position and is
    multiplied by theta_scale = powf(base, -2/n_dims) in float; cosf/sinf from the C library
    (they are not always correctly rounded, so numpy's cos would differ in the last bit)."""
    lib = libm()
    base, fs, af = float32(freq_base), float32(freq_scale), float32(attn_factor)
    ex = float32(-2.0) / float32(n_dims)
    ts = float32(lib.powf(float(base), float(ex))) if lib else float32(np.power(base, ex, dtype=float32))
    cos = np.empty((len(pos), n_dims // 2), float32)
    sin = np.empty((len(pos), n_dims // 2), float32)
    for i, p in enumerate(np.asarray(pos).tolist()):
        key = (float(base), n_dims, float(fs), float(af), p)
        row = _ROPE_ROWS.get(key)
        if row is None:
            th = float32(p)
            c = np.empty(n_dims // 2, float32)
            s = np.empty(n_dims // 2, float32)
            for k in range(n_dims // 2):
                t = float32(fs * th)
                if lib:
                    c[k], s[k] = lib.cosf(float(t)), lib.sinf(float(t))
                else:
                    c[k], s[k] = np.cos(float64(t)), np.sin(float64(t))
                th = float32(th * ts)
            row = ((c * af).astype(float32), (s * af).astype(float32))
            _ROPE_ROWS[key] = row
        cos[i], sin[i] = row
    return cos, sin


def rotate(x0: np.ndarray, x1: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """rotate_pairs as compiled (the first product fused): x0*cos - x1*sin, x0*sin + x1*cos."""
    y0 = fma(x0, cos, -(x1 * sin).astype(float32))
    y1 = fma(x0, sin, (x1 * cos).astype(float32))
    return y0, y1


def rope_vec_pairs(cpu, n_dims: int, neox: bool) -> int:
    """How many leading NORM pairs the profile's build rotates in its auto-vectorized loop (GCC turns
    rotate_pairs into ld2/st2 steps of ``rope_vec_pairs`` pairs on AArch64, from ``rope_vec_min_pairs``
    pairs on; the leftover pairs run the scalar loop). 0 where the loop is scalar."""
    cpu = profiles.resolve(cpu)
    pairs = n_dims // 2
    if neox or not cpu.rope_vec_pairs or pairs < cpu.rope_vec_min_pairs:
        return 0
    return pairs - pairs % cpu.rope_vec_pairs


@register("ROPE")
def rope(dst: Tensor, cpu=None) -> None:
    a, pos = dst.src[0], dst.src[1]
    p = dst.op_params
    if len(dst.src) > 2:
        raise NotImplementedError("rope: frequency factors are not implemented")
    if p["ext_factor"] != 0.0:
        raise NotImplementedError("rope: YaRN (ext_factor != 0) is not implemented")
    x = f32(a)                                          # (ne3, n_tokens, n_head, head_dim)
    n_dims, neox = p["n_dims"], bool(p["mode"] & 2)
    cos, sin = rope_cache(pos.array().reshape(-1), n_dims, p["freq_base"], p["freq_scale"], p["attn_factor"])
    rope_rows(x, cos[None, :, None, :], sin[None, :, None, :], n_dims, neox, rope_vec_pairs(cpu, n_dims, neox),
              _out(dst))


def rope_rows(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, n_dims: int, neox: bool, nv: int,
              out: np.ndarray) -> np.ndarray:
    """rotate_pairs over the last axis of x (heads' rows) into ``out``: cos and sin (n_dims/2 per
    position) broadcast against x's first n_dims/2 values; the dimensions past n_dims copied; the first
    ``nv`` NORM pairs as the profile's vectorized loop rounds them (``rope_vec_pairs``)."""
    out[...] = x
    if neox:                                            # NEOX: pairs (i, i + n_dims/2)
        i0, i1 = slice(0, n_dims // 2), slice(n_dims // 2, n_dims)
    else:                                               # NORM: adjacent pairs (2i, 2i+1)
        i0, i1 = slice(0, n_dims, 2), slice(1, n_dims, 2)
    out[..., i0], out[..., i1] = rotate(x[..., i0], x[..., i1], cos, sin)
    if nv:      # the vectorized loop fused the other product of x0*cos - x1*sin (fmls)
        x0, x1 = x[..., 0:2 * nv:2], x[..., 1:2 * nv:2]
        out[..., 0:2 * nv:2] = fma(-x1, sin[..., :nv], (x0 * cos[..., :nv]).astype(float32))
    return out


@register("SOFT_MAX")
def soft_max(dst: Tensor, cpu=None) -> None:
    x = f32(dst.src[0])                                 # (ne3, ne2, ne1, ne0)
    w = x * np.float32(dst.op_params["scale"])
    if len(dst.src) > 1:
        m = f32(dst.src[1])                             # (m3, m2, >= ne1, ne0)
        m = m[:, :, : x.shape[2], :]
        w = w + _bcast(m, (m.shape[0] if m.shape[0] == x.shape[0] else 1, m.shape[1] if m.shape[1] == x.shape[1] else 1) + x.shape[2:])
    from .vec import soft_max_rows
    _out(dst)[...] = soft_max_rows(w.astype(np.float32), cpu)


@register("SILU")
def silu(dst: Tensor, cpu=None) -> None:
    from .vec import silu as silu_
    _out(dst)[...] = silu_(f32(dst.src[0]), cpu)


@register("GELU")
def gelu(dst: Tensor, cpu=None) -> None:
    _out(dst)[...] = gelu_ggml(f32(dst.src[0]))


def _glu_parts(dst: Tensor):
    if len(dst.src) == 2:
        return f32(dst.src[0]), f32(dst.src[1])
    x = f32(dst.src[0])
    n = x.shape[-1] // 2
    return x[..., :n], x[..., n:]


@register("SWIGLU")
def swiglu(dst: Tensor, cpu=None) -> None:
    g, u = _glu_parts(dst)
    from .vec import silu as silu_
    np.multiply(silu_(g, cpu), u, out=_out(dst))


@register("GEGLU")
def geglu(dst: Tensor, cpu=None) -> None:
    g, u = _glu_parts(dst)
    np.multiply(gelu_ggml(g), u, out=_out(dst))


def _convert(values: np.ndarray, dst_type) -> np.ndarray:
    if dst_type is F16:
        with np.errstate(over="ignore"):                # past f16's range: inf, as the C conversion gives
            return values.astype(np.float16)
    if dst_type is F32:
        return values.astype(np.float32)
    raise NotImplementedError(f"copy into {dst_type.name} is not implemented")


@register("CONT")
def cont(dst: Tensor, cpu=None) -> None:
    src = dst.src[0]
    out = _out(dst)
    out[...] = src.array().reshape(-1).reshape(out.shape) if src.is_contiguous() else \
        np.ascontiguousarray(src.array()).reshape(out.shape)


@register("CPY")
def cpy(dst: Tensor, cpu=None) -> None:
    src = dst.src[0]
    out = _out(dst)
    vals = f32(src) if src.type.block_size != 1 else src.array()
    vals = np.ascontiguousarray(vals).reshape(-1)
    if out.flags.c_contiguous or dst.is_contiguous():
        out.reshape(-1)[...] = _convert(vals, dst.type)
    else:   # element order is ggml's row-major order over ne
        out[...] = _convert(vals, dst.type).reshape(out.shape)


@register("SET_ROWS")
def set_rows(dst: Tensor, cpu=None) -> None:
    src, idx = dst.src
    rows = idx.array().reshape(-1).astype(np.int64)
    if rows.size and (rows.min() < 0 or rows.max() >= dst.ne[1]):
        raise IndexError(f"set_rows: row index out of range 0..{dst.ne[1] - 1}")
    vals = f32(src).reshape(-1, src.ne[0])
    out = dst.array()[0, 0]                              # (rows, ne0) of the destination
    if dst.type.block_size != 1:
        from ..quant import quantize
        out[rows] = quantize(vals.reshape(-1), dst.type).reshape(len(rows), -1)
    else:
        out[rows] = _convert(vals, dst.type)
    rows_written(out, rows)


def _noop(dst: Tensor, cpu=None) -> None:
    pass


for _op in ("NONE", "VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE"):
    COMPUTE[_op] = _noop


@register("FLASH_ATTN_EXT")
def flash_attn_ext(dst: Tensor, cpu=None) -> None:
    """ggml-cpu's flash attention (ggml_compute_forward_flash_attn_ext_f16, one query row at a time):
    online softmax over the key cells in order, masked cells skipped; with an f16 V the running
    output is kept in f16 (scaled by exp(M_old - M) when the max grows, then += v * exp(s - M))."""
    q, k, v = dst.src[0], dst.src[1], dst.src[2]
    mask = dst.src[3] if len(dst.src) > 3 else None
    scale = np.float32(dst.op_params["scale"])
    Q = f32(q)[0]                                       # (n_head, n_q, D)
    K = f32(k)[0]                                       # (n_head_kv, n_kv, D)
    V = f32(v)[0]                                       # (n_head_kv, n_kv, Dv)
    if k.type is F16:                                   # Q converted to K's vec_dot type
        Q = Q.astype(np.float16).astype(np.float32)
    r = Q.shape[0] // K.shape[0]
    K, V = np.repeat(K, r, 0), np.repeat(V, r, 0)
    n_head, n_q, _ = Q.shape
    n_kv = K.shape[1]
    M = f32(mask)[0, 0, :n_q, :n_kv] if mask is not None else np.zeros((n_q, n_kv), np.float32)
    f16_acc = v.type is F16
    cpu = profiles.resolve(cpu)
    half_vec = cpu.f16_acc == "f16"                     # the f16 vector routines compute in half precision
    nv = V.shape[-1] - V.shape[-1] % cpu.f16_step       # over whole GGML_F16_STEPs; the rest in scalar code
    S = np.zeros((n_head, n_q), np.float32)
    Mx = np.full((n_head, n_q), -np.inf, np.float32)
    acc = np.zeros((n_head, n_q, V.shape[-1]), np.float16 if f16_acc else np.float32)
    from .vec import vec_dot_f16
    scores = (vec_dot_f16(Q[:, :, None, :], K[:, None, :, :], cpu) * scale).astype(np.float32)   # (h, q, k)
    for ic in range(n_kv):
        mv = M[:, ic]
        live = np.isfinite(mv)[None, :] & np.ones((n_head, 1), bool)
        if not live.any():
            continue
        s = (scores[:, :, ic] + mv[None, :]).astype(np.float32)
        grow = live & (s > Mx)
        with np.errstate(invalid="ignore", over="ignore"):
            ms = np.where(grow, libm_expf(np.where(grow, Mx - s, 0)), 1.0).astype(np.float32)   # the C library's expf
            vs = np.where(grow, 1.0, libm_expf(np.where(grow, 0, s - Mx))).astype(np.float32)
        ms = np.where(live, ms, np.float32(1))
        vs = np.where(live, vs, np.float32(0))
        Mx = np.where(grow, s, Mx)
        if f16_acc and half_vec:            # FP16_VA: vec_scale_f16 / vec_mad_f16 in float16x8_t registers
            sc = (acc[..., :nv].astype(np.float32) * ms.astype(np.float16).astype(np.float32)[..., None])
            a16 = fma_f16(V[:, ic][:, None, :nv], vs.astype(np.float16)[..., None], sc.astype(np.float16))
            a32 = (acc[..., nv:].astype(np.float32) * ms[..., None]).astype(np.float16).astype(np.float32)
            a32 = fma64(V[:, ic][:, None, nv:].astype(np.float64), vs[..., None], a32).astype(np.float16)
            acc = np.where(live[..., None], np.concatenate([a16, a32], -1), acc)
        elif f16_acc:
            a32 = acc.astype(np.float32) * ms[..., None]
            a32 = fma64(V[:, ic][:, None, :].astype(np.float64), vs[..., None], a32.astype(np.float16).astype(np.float32))
            acc = np.where(live[..., None], a32.astype(np.float16), acc)
        else:
            a32 = (acc * ms[..., None]).astype(np.float32)
            acc = np.where(live[..., None], fma64(V[:, ic][:, None, :].astype(np.float64), vs[..., None], a32), acc)
        S = np.where(live, fma(S, ms, vs), S)    # S = S*ms + vs, fused
    res = acc.astype(np.float32) * (np.float32(1) / S)[..., None]
    _out(dst)[0] = res.transpose(1, 0, 2)               # -> [Dv, n_head, n_q] in ggml order


def attention_one_token(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None, scale: float,
                        cpu=None) -> np.ndarray:
    """A decode step's attention as this module runs its three nodes: kq = MUL_MAT(K, q) over the f16
    cache rows, SOFT_MAX(kq * scale + mask), kqv = MUL_MAT(V^T, probabilities), each product's
    activations rounded to f16 first. q (H, Dk) float32; k (Hk, R, Dk) and v (Hk, R, Dv) f16 values
    (grouped heads: head h reads kv head h // (H / Hk)); mask (R,) float32 or None -> (H, Dv). The
    twin of the fused kernel (``fast.vec.attention_f16_tiles``)."""
    from .sgemm import mul_mat_f16_op
    from .vec import soft_max_rows
    cpu = profiles.resolve(cpu)
    g = q.shape[0] // k.shape[0]
    qh = np.asarray(q, float32).astype(np.float16)
    kq = np.stack([mul_mat_f16_op(k[h // g], qh[h:h + 1], cpu)[0] for h in range(q.shape[0])])
    w = kq * float32(scale)
    if mask is not None:
        w = w + np.asarray(mask, float32)[None, :]
    ph = soft_max_rows(w.astype(float32), cpu).astype(np.float16)
    return np.stack([mul_mat_f16_op(np.ascontiguousarray(v[h // g].T), ph[h:h + 1], cpu)[0]
                     for h in range(q.shape[0])])


# ---- mixture of experts: MUL_MAT_ID and the router's ops ----------------------------------------

def expert_rows(ids: np.ndarray, n_as: int) -> list[list[tuple[int, int]]]:
    """ggml-cpu's grouping of MUL_MAT_ID's rows by expert (``matrix_rows``): for each expert, the
    (slot j, token t) pairs routed to it, tokens in order, slots in order within a token."""
    groups: list[list[tuple[int, int]]] = [[] for _ in range(n_as)]
    for t in range(ids.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            if not 0 <= e < n_as:
                raise IndexError(f"mul_mat_id: expert id {e} out of range 0..{n_as - 1}")
            groups[e].append((j, t))
    return groups


def mul_mat_expert(A: np.ndarray, qtype, X: np.ndarray, repacked: bool, cpu) -> np.ndarray:
    """One expert's matrix A (rows of the weight, raw bytes for a quantized type) times the rows X routed
    to it -> (len(X), M), as ggml_compute_forward_mul_mat_id computes it: no llamafile sgemm; quantized
    types through the kernel of ``quantized_path`` for the expert's row count (vec_dot, or the tiled
    K-quant matmul from 8 rows on), or, for weights in the REPACK buffer, one gemv per routed row
    (repack.cpp's forward_mul_mat_id); f16 and f32 weights through ggml_vec_dot_f16 / _f32 per output."""
    from .vec import vec_dot_f16, vec_dot_f32
    if qtype.block_size != 1:
        if repacked:
            return np.concatenate([mul_mat_quantized(A, qtype, X[i:i + 1], True, cpu) for i in range(len(X))])
        return mul_mat_quantized(A, qtype, X, False, cpu)
    if qtype is F16:
        return vec_dot_f16(X.astype(np.float16)[:, None, :], A[None, :, :], cpu)
    return vec_dot_f32(X[:, None, :], np.asarray(A, np.float32)[None, :, :], cpu)


@register("MUL_MAT_ID")
def mul_mat_id(dst: Tensor, cpu=None) -> None:
    """ggml_compute_forward_mul_mat_id: the rows grouped by expert, each expert's matrix applied to its
    rows (experts no token chose are never read: what makes MoE decode cheap)."""
    a, b, ids = dst.src
    cpu = profiles.resolve(cpu)
    A = a.array()[0]                                    # (n_as, M, row)
    B = f32(b)[0]                                       # (n_tokens, n_b1, K)
    out = _out(dst)[0]                                  # (n_tokens, n_used, M)
    repacked = a.view_src is None and a.type.block_size != 1 and cpu.repacks(a.type.name, a.ne[1])
    for e, rows in enumerate(expert_rows(ids.array()[0, 0], a.ne[2])):
        if not rows:
            continue
        X = np.stack([B[t, j % b.ne[1]] for j, t in rows])
        Y = mul_mat_expert(A[e], a.type, X, repacked, cpu)
        for (j, t), y in zip(rows, Y):
            out[t, j] = y


@register("ARGSORT")
def argsort(dst: Tensor, cpu=None) -> None:
    """The indices sorting each row (std::sort; llmlab sorts stably, the same wherever no two values tie)."""
    x = f32(dst.src[0])
    key = -x if dst.op_params["order"] == 1 else x
    _out(dst)[...] = np.argsort(key, axis=-1, kind="stable").astype(np.int32)


@register("SIGMOID")
def sigmoid(dst: Tensor, cpu=None) -> None:
    """op_sigmoid: 1.f / (1.f + expf(-x)), the C library's expf, in float."""
    x = f32(dst.src[0])
    with np.errstate(over="ignore"):
        e = libm_expf(-x).astype(np.float32)
    _out(dst)[...] = (np.float32(1) / (np.float32(1) + e)).astype(np.float32)


@register("SUM_ROWS")
def sum_rows(dst: Tensor, cpu=None) -> None:
    """ggml_vec_sum_f32: each row summed in double, left to right, rounded once."""
    x = f32(dst.src[0]).astype(np.float64)
    _out(dst)[...] = np.add.accumulate(x, axis=-1)[..., -1:].astype(np.float32)


@register("CLAMP")
def clamp(dst: Tensor, cpu=None) -> None:
    p = dst.op_params
    np.minimum(np.maximum(f32(dst.src[0]), np.float32(p["min"])), np.float32(p["max"]), out=_out(dst))


@register("DIV")
def div(dst: Tensor, cpu=None) -> None:
    a, b = dst.src
    A, B = f32(a), f32(b)
    np.divide(A, _bcast(B, A.shape), out=_out(dst))


@register("CONCAT")
def concat(dst: Tensor, cpu=None) -> None:
    a, b = dst.src
    ax = 3 - dst.op_params["dim"]                       # ne[dim] is numpy axis 3 - dim
    _out(dst)[...] = np.concatenate([a.array(), b.array()], axis=ax)
