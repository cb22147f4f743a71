"""The plain NumPy reference of every op, registered by op name (ggml_compute_forward's switch).

Each function takes the node and writes its result into the node's bytes.
Where ggml-cpu's numerics matter for exactness they are reproduced here:
RMS norm sums squares in double, softmax sums in double, RoPE multiplies the
angle by ``theta_scale`` step by step in float, GELU goes through an f16 table,
f16 weights (the KV cache) see their activations rounded to f16, and quantized
weights see their activations quantized to the weight's ``vec_dot_type``
(``llmlab.ggml.quant`` and ``quants.py``).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..quant import dequantize
from ..tensor import F16, F32, Tensor
from .quants import mul_mat as quant_mul_mat

COMPUTE: dict[str, Callable[[Tensor], None]] = {}


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


# ---- quantized weights: llmlab.ggml.quant's formats, ggml-cpu's kernels (kernels.py, quants.py) ------------

def dequantize_rows(raw: np.ndarray, qtype) -> np.ndarray:
    return np.asarray(dequantize(raw, qtype), dtype=np.float32).reshape(raw.shape[0], -1)


def mul_mat_quantized(raw: np.ndarray, qtype, x: np.ndarray, repacked: bool = False) -> np.ndarray:
    """x [N, K] times the quantized weight rows raw [M, row_bytes] -> [N, M], as ggml-cpu computes it.

    Types whose x86 accumulation order is reproduced (``ggml_cpu``) are bit-exact; the others
    use llmlab.ggml.quant's reference (exact integer sums, float terms summed in another order)."""
    from .kernels import EXACT_MUL_MAT, REPACK_TYPES, REPACKED_MUL_MAT, TILED_MIN_ROWS, TILED_MUL_MAT
    repacked = repacked and qtype.name in REPACK_TYPES
    if repacked:                                   # the REPACK buffer's kernels
        exact = REPACKED_MUL_MAT.get(qtype.name)
    elif len(x) >= TILED_MIN_ROWS:                 # ggml_compute_forward_mul_mat_tiled takes K-quants
        exact = TILED_MUL_MAT.get(qtype.name)
    else:
        exact = None
    exact = exact or EXACT_MUL_MAT.get(qtype.name)
    if exact is not None:
        return exact(raw, qtype, x)
    return np.asarray(quant_mul_mat(raw, qtype, x), dtype=np.float32)


# ---- ops ------------------------------------------------------------------------------

def _out(dst: Tensor) -> np.ndarray:
    return dst.array()


@register("GET_ROWS")
def get_rows(dst: Tensor) -> None:
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
def add(dst: Tensor) -> None:
    a, b = dst.src
    A, B = f32(a), f32(b)
    np.add(A, _bcast(B, A.shape), out=_out(dst))


@register("MUL")
def mul(dst: Tensor) -> None:
    a, b = dst.src
    A, B = f32(a), f32(b)
    np.multiply(A, _bcast(B, A.shape), out=_out(dst))


@register("SCALE")
def scale(dst: Tensor) -> None:
    np.multiply(f32(dst.src[0]), np.float32(dst.op_params["scale"]), out=_out(dst))


@register("MUL_MAT")
def mul_mat(dst: Tensor) -> None:
    a, b = dst.src
    B = f32(b)                                          # (ne13, ne12, N, K)
    out = _out(dst)                                     # (ne13, ne12, N, M)
    r2, r3 = b.ne[2] // a.ne[2], b.ne[3] // a.ne[3]
    if a.type.block_size != 1:
        A = a.array()
        repacked = a.view_src is None and a.ne[1] % 8 == 0      # where llama.cpp's CPU_REPACK buffer takes it
        for i3 in range(b.ne[3]):
            for i2 in range(b.ne[2]):
                out[i3, i2] = mul_mat_quantized(A[i3 // r3, i2 // r2], a.type, B[i3, i2], repacked)
        return
    A = a.array()
    if a.type is F16:                                   # ggml-cpu: vec_dot_type f16, activations rounded to f16
        from .kernels import mul_mat_f16_op
        Bh = B.astype(np.float16)
        for i3 in range(b.ne[3]):
            for i2 in range(b.ne[2]):
                out[i3, i2] = mul_mat_f16_op(A[i3 // r3, i2 // r2], Bh[i3, i2])
        return
    if A.dtype != np.float32:
        A = A.astype(np.float32)
    if r2 > 1:
        A = np.repeat(A, r2, axis=1)
    if r3 > 1:
        A = np.repeat(A, r3, axis=0)
    np.matmul(B, A.swapaxes(-1, -2), out=out)


@register("RMS_NORM")
def rms_norm(dst: Tensor) -> None:
    x = f32(dst.src[0])
    eps = np.float32(dst.op_params["eps"])
    sq = (x * x).astype(np.float64)                     # sum += (ggml_float)(x[i]*x[i]): float products,
    total = np.add.accumulate(sq, axis=-1)[..., -1]     # added one after another in double
    mean = (total / x.shape[-1]).astype(np.float32)
    scale = (np.float32(1.0) / np.sqrt(mean + eps)).astype(np.float32)
    np.multiply(x, scale[..., None], out=_out(dst))


@register("NORM")
def norm(dst: Tensor) -> None:
    x = f32(dst.src[0])
    eps = np.float32(dst.op_params["eps"])
    mean = (x.astype(np.float64).sum(-1) / x.shape[-1]).astype(np.float32)
    y = x - mean[..., None]
    var = (np.einsum("...i,...i->...", y.astype(np.float64), y.astype(np.float64)) / x.shape[-1]).astype(np.float32)
    np.multiply(y, (np.float32(1.0) / np.sqrt(var + eps))[..., None], out=_out(dst))


def rope_cache(pos, n_dims, freq_base, freq_scale=1.0, attn_factor=1.0):
    from .kernels import rope_cache as rc
    return rc(pos, n_dims, freq_base, freq_scale, attn_factor)


@register("ROPE")
def rope(dst: Tensor) -> None:
    a, pos = dst.src[0], dst.src[1]
    p = dst.op_params
    if len(dst.src) > 2:
        raise NotImplementedError("rope: frequency factors are not implemented")
    if p["ext_factor"] != 0.0:
        raise NotImplementedError("rope: YaRN (ext_factor != 0) is not implemented")
    x = f32(a)                                          # (ne3, n_tokens, n_head, head_dim)
    n_dims = p["n_dims"]
    cos, sin = rope_cache(pos.array().reshape(-1), n_dims, p["freq_base"], p["freq_scale"], p["attn_factor"])
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    from .kernels import rotate
    out = _out(dst)
    out[...] = x
    if p["mode"] & 2:                                   # NEOX: pairs (i, i + n_dims/2)
        i0, i1 = slice(0, n_dims // 2), slice(n_dims // 2, n_dims)
    else:                                               # NORM: adjacent pairs (2i, 2i+1)
        i0, i1 = slice(0, n_dims, 2), slice(1, n_dims, 2)
    out[..., i0], out[..., i1] = rotate(x[..., i0], x[..., i1], cos, sin)


@register("SOFT_MAX")
def soft_max(dst: Tensor) -> None:
    x = f32(dst.src[0])                                 # (ne3, ne2, ne1, ne0)
    w = x * np.float32(dst.op_params["scale"])
    if len(dst.src) > 1:
        m = f32(dst.src[1])                             # (m3, m2, >= ne1, ne0)
        m = m[:, :, : x.shape[2], :]
        w = w + _bcast(m, (m.shape[0] if m.shape[0] == x.shape[0] else 1, m.shape[1] if m.shape[1] == x.shape[1] else 1) + x.shape[2:])
    from .kernels import soft_max_rows
    _out(dst)[...] = soft_max_rows(w.astype(np.float32))


def _silu(x: np.ndarray) -> np.ndarray:
    from .kernels import v_silu
    return v_silu(x)


_GELU_TABLE: np.ndarray | None = None


def gelu_f32(x: np.ndarray) -> np.ndarray:
    """0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2))) in float (ggml_gelu_f32)."""
    x = x.astype(np.float32)
    c = np.float32(0.79788456080286535587989211986876)
    return (np.float32(0.5) * x * (np.float32(1.0) + np.tanh(c * x * (np.float32(1.0) + np.float32(0.044715) * x * x)))).astype(np.float32)


def gelu_table() -> np.ndarray:
    """ggml_table_gelu_f16: GELU of every f16 value, stored as f16, computed as ggml-cpu's init does
    (``1 + a*x*x`` fused into one fma, the C library's tanhf)."""
    global _GELU_TABLE
    if _GELU_TABLE is None:
        from .kernels import _libm
        with np.errstate(all="ignore"):
            x = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)
            f32, f64 = np.float32, np.float64
            inner = ((f32(0.044715) * x).astype(f64) * x.astype(f64) + 1.0).astype(f32)
            arg = (f32(0.79788456080286535587989211986876) * x * inner).astype(f32)
            lib = _libm()
            if lib:
                fin = np.isfinite(arg)
                t = np.tanh(arg)
                t[fin] = [lib.tanhf(float(z)) for z in arg[fin]]
            else:
                t = np.tanh(arg)
            _GELU_TABLE = (f32(0.5) * x * (f32(1.0) + t.astype(f32))).astype(f32).astype(np.float16)
    return _GELU_TABLE


def gelu_ggml(x: np.ndarray) -> np.ndarray:
    """ggml-cpu's GELU: through the f16 table, 0 below -10, identity above 10."""
    t = gelu_table()[x.astype(np.float16).view(np.uint16)].astype(np.float32)
    return np.where(x <= -10.0, np.float32(0), np.where(x >= 10.0, x, t)).astype(np.float32)


@register("SILU")
def silu(dst: Tensor) -> None:
    _out(dst)[...] = _silu(f32(dst.src[0]))


@register("GELU")
def gelu(dst: Tensor) -> None:
    _out(dst)[...] = gelu_ggml(f32(dst.src[0]))


def _glu_parts(dst: Tensor):
    if len(dst.src) == 2:
        return f32(dst.src[0]), f32(dst.src[1])
    x = f32(dst.src[0])
    n = x.shape[-1] // 2
    return x[..., :n], x[..., n:]


@register("SWIGLU")
def swiglu(dst: Tensor) -> None:
    g, u = _glu_parts(dst)
    np.multiply(_silu(g), u, out=_out(dst))


@register("GEGLU")
def geglu(dst: Tensor) -> None:
    g, u = _glu_parts(dst)
    np.multiply(gelu_ggml(g), u, out=_out(dst))


def _convert(values: np.ndarray, dst_type) -> np.ndarray:
    if dst_type is F16:
        return values.astype(np.float16)
    if dst_type is F32:
        return values.astype(np.float32)
    raise NotImplementedError(f"copy into {dst_type.name} is not implemented")


@register("CONT")
def cont(dst: Tensor) -> None:
    src = dst.src[0]
    out = _out(dst)
    out[...] = src.array().reshape(-1).reshape(out.shape) if src.is_contiguous() else \
        np.ascontiguousarray(src.array()).reshape(out.shape)


@register("CPY")
def cpy(dst: Tensor) -> None:
    src = dst.src[0]
    out = _out(dst)
    vals = f32(src) if src.type.block_size != 1 else src.array()
    vals = np.ascontiguousarray(vals).reshape(-1)
    if out.flags.c_contiguous or dst.is_contiguous():
        out.reshape(-1)[...] = _convert(vals, dst.type)
    else:   # element order is ggml's row-major order over ne
        out[...] = _convert(vals, dst.type).reshape(out.shape)


@register("SET_ROWS")
def set_rows(dst: Tensor) -> None:
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


def _noop(dst: Tensor) -> None:
    pass


for _op in ("NONE", "VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE"):
    COMPUTE[_op] = _noop


@register("FLASH_ATTN_EXT")
def flash_attn_ext(dst: Tensor) -> None:
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
    S = np.zeros((n_head, n_q), np.float32)
    Mx = np.full((n_head, n_q), -np.inf, np.float32)
    acc = np.zeros((n_head, n_q, V.shape[-1]), np.float16 if f16_acc else np.float32)
    from .kernels import vec_dot_f16
    scores = (vec_dot_f16(Q[:, :, None, :], K[:, None, :, :]) * scale).astype(np.float32)   # (h, q, k)
    for ic in range(n_kv):
        mv = M[:, ic]
        live = np.isfinite(mv)[None, :] & np.ones((n_head, 1), bool)
        if not live.any():
            continue
        s = (scores[:, :, ic] + mv[None, :]).astype(np.float32)
        grow = live & (s > Mx)
        with np.errstate(invalid="ignore", over="ignore"):
            ms = np.where(grow, np.exp((Mx - s).astype(np.float64)), 1.0).astype(np.float32)   # expf
            vs = np.where(grow, 1.0, np.exp((s - Mx).astype(np.float64))).astype(np.float32)
        ms = np.where(live, ms, np.float32(1))
        vs = np.where(live, vs, np.float32(0))
        Mx = np.where(grow, s, Mx)
        if f16_acc:
            a32 = acc.astype(np.float32) * ms[..., None]
            a32 = (V[:, ic][:, None, :].astype(np.float64) * vs[..., None] + a32.astype(np.float16).astype(np.float64))
            acc = np.where(live[..., None], a32.astype(np.float32).astype(np.float16), acc)
        else:
            a32 = (acc * ms[..., None]).astype(np.float32)
            acc = np.where(live[..., None], (V[:, ic][:, None, :].astype(np.float64) * vs[..., None] + a32).astype(np.float32), acc)
        S = np.where(live, (S.astype(np.float64) * ms + vs).astype(np.float32), S)    # S = S*ms + vs, fused
    res = acc.astype(np.float32) * (np.float32(1) / S)[..., None]
    _out(dst)[0] = res.transpose(1, 0, 2)               # -> [Dv, n_head, n_q] in ggml order
