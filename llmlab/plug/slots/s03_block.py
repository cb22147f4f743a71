"""Notebook 03, the transformer block: RMS_NORM, ROPE, SOFT_MAX, SWIGLU, GEGLU and one attention head.

Each op slot wraps the op's reference kernel; the learner's function sees the node's inputs as plain
float32 arrays, one row per vector the op normalises or rotates. The references use
``llmlab.plug.helpers`` where ggml's arithmetic depends on the build (the vector exp, its sums, fmas,
the f16 GELU table, tinyBLAS's f16 products): that is what makes them bit-identical.
"""
from __future__ import annotations

import numpy as np

from .. import helpers
from ..hooks import layer_of, op_slot, rows
from ..probe import Where
from ..registry import Mistake, Slot, register_slot

F32 = np.float32


# ---- rms_norm ----------------------------------------------------------------------------------

def rms_norm(x, eps):
    """RMS_NORM (no weight: that is the next MUL node): x / sqrt(mean(x²) + eps), row by row.
    ggml squares in float and adds the squares one after another in double (ggml_float)."""
    sq = (x * x).astype(np.float64)
    total = np.cumsum(sq, axis=-1)[:, -1]
    mean = (total / x.shape[-1]).astype(F32)
    scale = F32(1.0) / np.sqrt(mean + F32(eps))
    return x * scale[:, None]


def rms_norm_skeleton(x, eps):
    # x: float32 (rows, n), eps: float -> float32 (rows, n): each row divided by its root mean square
    raise NotImplementedError("rms_norm: your code here")


def _rms_sub_mean(x, eps):
    y = x - x.mean(axis=-1, keepdims=True, dtype=np.float64).astype(F32)
    return rms_norm(y.astype(F32), eps)


def _rms_f32_mean(x, eps):
    mean = np.mean(x * x, axis=-1)
    return x * (F32(1.0) / np.sqrt(mean + F32(eps)))[:, None]


def _rms_f64(x, eps):
    xd = x.astype(np.float64)
    return (xd / np.sqrt((xd * xd).mean(axis=-1, keepdims=True) + eps)).astype(F32)


def _rms_eps_outside(x, eps):
    sq = (x * x).astype(np.float64)
    mean = (np.cumsum(sq, axis=-1)[:, -1] / x.shape[-1]).astype(F32)
    return x * (F32(1.0) / (np.sqrt(mean) + F32(eps)))[:, None]


def _rms_sum_not_mean(x, eps):
    sq = (x * x).astype(np.float64)
    total = np.cumsum(sq, axis=-1)[:, -1].astype(F32)
    return x * (F32(1.0) / np.sqrt(total + F32(eps)))[:, None]


def _mean_size(x, eps, out=None):
    return {"mean": float(np.abs(x.mean(axis=-1)).max())}


def _rms_args(dst, cpu):
    return rows(_f32(dst.src[0])), float(dst.op_params["eps"])


def _f32(t):
    from ...ggml.cpu.ops import f32
    return f32(t)


def _write_rows(dst, out):
    a = dst.array()
    a[...] = out.reshape(a.shape)


def _install_rms(probe):
    return op_slot("RMS_NORM", probe, _rms_args, lambda dst: rows(dst.array()), _write_rows)


register_slot(Slot(
    name="rms_norm", notebook="03",
    signature="rms_norm(x: float32[rows, n], eps: float) -> float32[rows, n]",
    used_for="every RMS_NORM node (attn_norm, ffn_norm, Gemma's q/k norms and post-norms, result_norm); "
             "the weight is the next MUL node",
    reference=rms_norm, skeleton=rms_norm_skeleton, install=_install_rms, models=("smollm2", "gemma3"),
    mistakes=[
        Mistake("subtracts the mean", _rms_sub_mean,
                "the first difference is at {node}, about the size of the row's mean ({mean:.2g}): "
                "RMSNorm subtracts no mean (that is LayerNorm)", detail=_mean_size),
        Mistake("float32 mean", _rms_f32_mean,
                "np.mean adds the float32 squares pairwise: ggml adds them one after another in double "
                "(ggml_float), so the last bits differ at {node}", close=True),
        Mistake("all in float64", _rms_f64,
                "float64 throughout: ggml squares in float32 and only sums in double, then divides in float32; "
                "the bits differ from llama.cpp's at {node} by {max_diff}", close=True),
        Mistake("eps outside the root", _rms_eps_outside,
                "eps belongs inside the square root: 1/sqrt(mean + eps)"),
        Mistake("sum, not mean", _rms_sum_not_mean,
                "divided by the root of the sum of squares: RMSNorm takes their mean (divide by n)"),
    ],
    hint_close="the first difference at {node} is in the last bits ({max_diff}): sum the float32 squares one "
               "after another in float64, divide in float32",
    hint_different="the first difference is at {node} ({max_diff}): each row is x / sqrt(mean(x*x) + eps)"))


# ---- rope --------------------------------------------------------------------------------------

def rope(x, cos, sin, n_dims, neox):
    """ROPE: rotate pairs of each head's first n_dims values by the position's angles.
    NORM (llama) pairs (2i, 2i+1); NEOX (Gemma) pairs (i, i + n_dims/2). ggml's compiled loop fuses
    the first product: x0*cos - x1*sin is fma(x0, cos, -(x1*sin))."""
    y = x.copy()
    if neox:
        i0, i1 = slice(0, n_dims // 2), slice(n_dims // 2, n_dims)
    else:
        i0, i1 = slice(0, n_dims, 2), slice(1, n_dims, 2)
    x0, x1 = x[..., i0], x[..., i1]
    c, s = cos[:, None, :], sin[:, None, :]
    y[..., i0] = helpers.fma(x0, c, -(x1 * s))
    y[..., i1] = helpers.fma(x0, s, x1 * c)
    return y


def rope_skeleton(x, cos, sin, n_dims, neox):
    # x: float32 (n_tokens, n_head, head_dim); cos, sin: float32 (n_tokens, n_dims // 2)
    # rotate each pair (x0, x1) of the first n_dims values: (x0 cos - x1 sin, x0 sin + x1 cos)
    raise NotImplementedError("rope: your code here")


def _rope_flipped(x, cos, sin, n_dims, neox):
    return rope(x, cos, sin, n_dims, not neox)


def _rope_no_fma(x, cos, sin, n_dims, neox):
    y = x.copy()
    i0, i1 = (slice(0, n_dims // 2), slice(n_dims // 2, n_dims)) if neox else (slice(0, n_dims, 2), slice(1, n_dims, 2))
    x0, x1, c, s = x[..., i0], x[..., i1], cos[:, None, :], sin[:, None, :]
    y[..., i0] = x0 * c - x1 * s
    y[..., i1] = x0 * s + x1 * c
    return y


def _rope_backwards(x, cos, sin, n_dims, neox):
    return rope(x, cos, -sin, n_dims, neox)


def _rope_cos_sin_swapped(x, cos, sin, n_dims, neox):
    return rope(x, sin, cos, n_dims, neox)


def _pairs(x, cos, sin, n_dims, neox, out=None):
    return {"pairs": "(i, i + n/2) are NEOX's; this model rotates adjacent pairs (2i, 2i+1)" if not neox else
            "(2i, 2i+1) are llama's (NORM); this model (NEOX) rotates (i, i + n/2)"}


def _rope_args(dst, cpu):
    from ...ggml.cpu.ops import rope_cache
    p = dst.op_params
    x = _f32(dst.src[0])[0].astype(F32).copy()
    cos, sin = rope_cache(dst.src[1].array().reshape(-1), p["n_dims"], p["freq_base"], p["freq_scale"], p["attn_factor"])
    return x, cos.copy(), sin.copy(), int(p["n_dims"]), bool(p["mode"] & 2)


def _install_rope(probe):
    return op_slot("ROPE", probe, _rope_args, lambda dst: dst.array()[0].copy(),
                   lambda dst, out: dst.array().__setitem__(0, out))


register_slot(Slot(
    name="rope", notebook="03",
    signature="rope(x: float32[n_tokens, n_head, head_dim], cos: float32[n_tokens, n_dims/2], "
              "sin: float32[n_tokens, n_dims/2], n_dims: int, neox: bool) -> float32[n_tokens, n_head, head_dim]",
    used_for="every ROPE node (Qcur, Kcur of each layer): NORM pairs for SmolLM2, NEOX pairs for Gemma 3",
    reference=rope, skeleton=rope_skeleton, install=_install_rope, models=("smollm2", "gemma3"),
    mistakes=[
        Mistake("wrong pairs", _rope_flipped, "pairs {pairs}", detail=_pairs),
        Mistake("no fma", _rope_no_fma,
                "x0*cos - x1*sin rounded twice: ggml's compiled loop fuses the first product into one fma "
                "(helpers.fma); the last bits differ at {node}", close=True),
        Mistake("rotated backwards", _rope_backwards,
                "rotated the wrong way: y0 = x0 cos - x1 sin, y1 = x0 sin + x1 cos"),
        Mistake("cos and sin swapped", _rope_cos_sin_swapped, "cos and sin swapped: x0 goes with cos in y0"),
    ],
    hint_close="the first difference at {node} is in the last bits ({max_diff}): ggml fuses x0*cos into an fma",
    hint_different="the first difference is at {node} ({max_diff}): check which values pair up and the signs"))


# ---- softmax -----------------------------------------------------------------------------------

def softmax(x, mask, scale):
    """SOFT_MAX with scale and mask, row by row: w = x*scale + mask; exp(w - max(w)) / sum.
    ggml: its vector expf (helpers.expf), the sum in double (helpers.sum_rows), then each value
    times (float)(1/sum)."""
    w = x * F32(scale)
    if mask is not None:
        w = w + mask
    w = w - w.max(axis=-1, keepdims=True)
    e = helpers.expf(w)
    s = helpers.sum_rows(e)
    return e * (1.0 / s).astype(F32)[:, None]


def softmax_skeleton(x, mask, scale):
    # x: float32 (rows, n) scores; mask: float32 (rows, n) of 0 and -inf, or None; scale: float
    # -> float32 (rows, n), each row summing to 1
    raise NotImplementedError("softmax: your code here")


def _sm_no_max(x, mask, scale):
    w = x * F32(scale)
    if mask is not None:
        w = w + mask
    with np.errstate(over="ignore", invalid="ignore"):
        e = helpers.expf(w)
        s = helpers.sum_rows(e)
        return e * (1.0 / s).astype(F32)[:, None]


def _sm_no_mask(x, mask, scale):
    return softmax(x, None, scale)


def _sm_no_scale(x, mask, scale):
    return softmax(x, mask, 1.0)


def _sm_np_exp(x, mask, scale):
    w = x * F32(scale)
    if mask is not None:
        w = w + mask
    e = np.exp(w - w.max(axis=-1, keepdims=True)).astype(F32)
    return (e / e.sum(axis=-1, keepdims=True)).astype(F32)


def _sm_divide(x, mask, scale):
    w = x * F32(scale)
    if mask is not None:
        w = w + mask
    e = helpers.expf(w - w.max(axis=-1, keepdims=True))
    return (e / helpers.sum_rows(e)[:, None]).astype(F32)


def _overflow(x, mask, scale, out=None):
    w = x * F32(scale) + (mask if mask is not None else 0)
    big = np.flatnonzero((np.where(np.isfinite(w), w, -np.inf) > 88.7).any(axis=0))
    return {"where": f"overflow from position {int(big[0])}" if len(big) else
            f"exp of the raw scores, up to e^{float(np.nanmax(np.where(np.isfinite(w), w, np.nan))):.3g}"}


def _softmax_args(dst, cpu):
    from ...ggml.cpu.ops import _bcast
    x = _f32(dst.src[0])
    m = None
    if len(dst.src) > 1:
        m = _f32(dst.src[1])[:, :, : x.shape[2], :]
        m = _bcast(m, (m.shape[0] if m.shape[0] == x.shape[0] else 1, m.shape[1] if m.shape[1] == x.shape[1] else 1)
                   + x.shape[2:])
        m = rows(np.broadcast_to(m, x.shape))
    return rows(x), m, float(dst.op_params["scale"])


def _install_softmax(probe):
    return op_slot("SOFT_MAX", probe, _softmax_args, lambda dst: rows(dst.array()), _write_rows)


register_slot(Slot(
    name="softmax", notebook="03",
    signature="softmax(x: float32[rows, n], mask: float32[rows, n] | None, scale: float) -> float32[rows, n]",
    used_for="every SOFT_MAX node (kq_soft_max of each layer): attention weights over the cached keys",
    reference=softmax, skeleton=softmax_skeleton, install=_install_softmax, models=("smollm2", "gemma3"),
    mistakes=[
        Mistake("no max subtracted", _sm_no_max,
                "no maximum subtracted before exp ({where}): subtract each row's max first", detail=_overflow),
        Mistake("mask ignored", _sm_no_mask,
                "the mask was not added: each query also attends to the keys after it and to empty cells"),
        Mistake("scale ignored", _sm_no_scale, "the scores were not multiplied by scale before the mask and exp"),
        Mistake("numpy's exp", _sm_np_exp,
                "np.exp and a float32 sum: ggml has its own vector expf (helpers.expf) and sums in double "
                "(helpers.sum_rows); the text agrees, the bits differ at {node} by {max_diff}", close=True),
        Mistake("divides by the sum", _sm_divide,
                "divided by the sum: ggml multiplies by (float)(1/sum), one rounding more", close=True),
    ],
    hint_close="the first difference at {node} is in the last bits ({max_diff}): ggml's expf and its double sum",
    hint_different="the first difference is at {node} ({max_diff}): w = x*scale + mask, then exp(w - max) / sum"))


# ---- swiglu / geglu ------------------------------------------------------------------------------

def swiglu(g, u):
    """SWIGLU: silu(g) * u, with SiLU as ggml computes it: g / (1 + exp(-g)) through its expf."""
    return g / (F32(1.0) + helpers.expf(-g)) * u


def swiglu_skeleton(g, u):
    # g (the gate projection), u (the up projection): float32 (rows, n) -> float32 (rows, n)
    raise NotImplementedError("swiglu: your code here")


def _sw_swapped(g, u):
    return swiglu(u, g)


def _sw_sigmoid(g, u):
    return F32(1.0) / (F32(1.0) + helpers.expf(-g)) * u


def _sw_np_exp(g, u):
    return (g / (F32(1.0) + np.exp(-g)) * u).astype(F32)


def _sw_gelu(g, u):
    return geglu(g, u)


def _glu_args(dst, cpu):
    from ...ggml.cpu.ops import _glu_parts
    g, u = _glu_parts(dst)
    return rows(g), rows(u)


def _install_glu(op):
    return lambda probe: op_slot(op, probe, _glu_args, lambda dst: rows(dst.array()), _write_rows)


register_slot(Slot(
    name="swiglu", notebook="03",
    signature="swiglu(g: float32[rows, n_ff], u: float32[rows, n_ff]) -> float32[rows, n_ff]",
    used_for="the gated FFN's GLU of every layer (ffn_swiglu): SmolLM2",
    reference=swiglu, skeleton=swiglu_skeleton, install=_install_glu("SWIGLU"), models=("smollm2",),
    mistakes=[
        Mistake("gate and up swapped", _sw_swapped, "the SiLU goes on the gate g, not on the up projection u"),
        Mistake("sigmoid, not SiLU", _sw_sigmoid, "sigmoid(g) * u: SiLU is g * sigmoid(g)"),
        Mistake("numpy's exp", _sw_np_exp,
                "np.exp is not ggml's expf (helpers.expf): the text agrees, the bits differ at {node}", close=True),
        Mistake("GELU, not SiLU", _sw_gelu, "that is GEGLU (Gemma's): SmolLM2 gates with SiLU"),
    ],
    hint_different="the first difference is at {node} ({max_diff}): silu(g) * u, silu(g) = g / (1 + exp(-g))"))


def geglu(g, u):
    """GEGLU: gelu(g) * u, with GELU as ggml computes it: looked up in its f16 table (GGML_GELU_FP16),
    0 below -10 and the identity above 10."""
    t = helpers.gelu_table()[g.astype(np.float16).view(np.uint16)].astype(F32)
    y = np.where(g <= -10.0, F32(0), np.where(g >= 10.0, g, t)).astype(F32)
    return y * u


def geglu_skeleton(g, u):
    # g (the gate projection), u (the up projection): float32 (rows, n) -> float32 (rows, n)
    raise NotImplementedError("geglu: your code here")


def _ge_tanh(g, u):
    x = g.astype(F32)
    c = F32(0.79788456080286535587989211986876)
    return (F32(0.5) * x * (F32(1.0) + np.tanh(c * x * (F32(1.0) + F32(0.044715) * x * x))) * u).astype(F32)


def _ge_erf(g, u):
    from math import erf, sqrt
    v = np.vectorize(lambda z: 0.5 * z * (1.0 + erf(z / sqrt(2.0))))
    return (v(g.astype(np.float64)).astype(F32) * u).astype(F32)


def _ge_swapped(g, u):
    return geglu(u, g)


def _ge_silu(g, u):
    return swiglu(g, u)


register_slot(Slot(
    name="geglu", notebook="03",
    signature="geglu(g: float32[rows, n_ff], u: float32[rows, n_ff]) -> float32[rows, n_ff]",
    used_for="the gated FFN's GLU of every layer (ffn_geglu): Gemma 3",
    reference=geglu, skeleton=geglu_skeleton, install=_install_glu("GEGLU"), models=("gemma3",),
    mistakes=[
        Mistake("tanh formula, no table", _ge_tanh,
                "the tanh formula in float32: ggml looks GELU up in a table of all f16 values "
                "(helpers.gelu_table, indexed by g's f16 bits)", close=True),
        Mistake("erf GELU", _ge_erf,
                "the exact (erf) GELU: ggml uses the tanh approximation, through its f16 table"),
        Mistake("gate and up swapped", _ge_swapped, "the GELU goes on the gate g, not on the up projection u"),
        Mistake("SiLU, not GELU", _ge_silu, "that is SwiGLU (SmolLM2's): Gemma gates with GELU"),
    ],
    hint_different="the first difference is at {node} ({max_diff}): gelu(g) * u"))


# ---- one attention head ----------------------------------------------------------------------

def attention(q, k, v, mask, scale):
    """One attention head, scores to output: softmax(q kᵀ * scale + mask) v. The KV cache is f16, so
    ggml multiplies in f16 (helpers.matmul_f16: q and the weights rounded to f16, tinyBLAS's sums)."""
    scores = helpers.matmul_f16(k, q)              # (n_q, n_kv): every query with every key
    weights = softmax(scores, mask, scale)
    return helpers.matmul_f16(v.T, weights)        # (n_q, head_dim)


def attention_skeleton(q, k, v, mask, scale):
    # q: float32 (n_q, d); k, v: float32 (n_kv, d) (f16 values from the cache); mask: (n_q, n_kv)
    # -> float32 (n_q, d)
    raise NotImplementedError("attention: your code here")


def _at_no_scale(q, k, v, mask, scale):
    return attention(q, k, v, mask, 1.0)


def _at_no_mask(q, k, v, mask, scale):
    return attention(q, k, v, None, scale)


def _at_wrong_axis(q, k, v, mask, scale):
    s = helpers.matmul_f16(k, q)
    w = softmax(np.ascontiguousarray(s.T), np.ascontiguousarray(mask.T), scale).T
    with np.errstate(invalid="ignore"):
        return helpers.matmul_f16(v.T, np.nan_to_num(np.ascontiguousarray(w)))


def _at_float32(q, k, v, mask, scale):
    s = (q.astype(F32) @ k.T.astype(F32)).astype(F32)
    return (softmax(s, mask, scale) @ v.astype(F32)).astype(F32)


def _at_f32_weights(q, k, v, mask, scale):
    w = softmax(helpers.matmul_f16(k, q), mask, scale)
    return (w @ v.astype(F32)).astype(F32)


def _scale_of(q, k, v, mask, scale, out=None):
    return {"scale": scale}


def _attention_calls(probe):
    stash = {}

    def calls(dst, cpu):
        if dst.name.startswith("kq-"):         # Q and K as the kq node reads them: their bytes may be reused
            stash[dst.name[3:]] = (_f32(dst.src[1])[0].astype(F32), _f32(dst.src[0])[0].astype(F32))
            return
        soft = dst.src[1]
        il = layer_of(dst.name)
        Q, K = stash.pop(dst.name[4:])             # (n_head, n_q, d), (n_head_kv, n_kv, d)
        Vt = _f32(dst.src[0])[0]                   # (n_head_kv, d, n_kv)
        n_q, n_kv = Q.shape[1], K.shape[1]
        mask = _f32(soft.src[1])[0, 0, :n_q, :n_kv].astype(F32) if len(soft.src) > 1 else None
        scale = float(soft.op_params["scale"])
        r = Q.shape[0] // K.shape[0]
        out = dst.array()[0]                       # (n_head, n_q, d)
        for h in range(Q.shape[0]):
            kv = h // r
            args = (Q[h].copy(), K[kv].copy(), np.ascontiguousarray(Vt[kv].T, dtype=F32),
                    None if mask is None else mask.copy(), scale)
            out[h] = probe(Where(dst.name, dst.op, il, f"head {h}"), args, out[h].copy())
    return calls


def _is_attention(dst) -> bool:
    return (dst.name.startswith("kqv-") and len(dst.src) > 1 and dst.src[1].op == "SOFT_MAX") or \
        (dst.name.startswith("kq-") and dst.src[0].type.name == "f16")


def _install_attention(probe):
    return op_slot("MUL_MAT", probe, None, None, None, applies=_is_attention, calls=_attention_calls(probe))


register_slot(Slot(
    name="attention", notebook="03",
    signature="attention(q: float32[n_q, d], k: float32[n_kv, d], v: float32[n_kv, d], "
              "mask: float32[n_q, n_kv], scale: float) -> float32[n_q, d]",
    used_for="each head of every layer's attention (the kqv node, without flash attention): scores, "
             "softmax, weighted sum of V; GQA heads share their K/V head",
    reference=attention, skeleton=attention_skeleton, install=_install_attention, models=("smollm2", "gemma3"),
    mistakes=[
        Mistake("no scale", _at_no_scale, "the scores were not scaled (scale = {scale:.4g}, 1/sqrt(head_dim))",
                detail=_scale_of),
        Mistake("mask ignored", _at_no_mask,
                "the mask was not added: each query also attends to later tokens and to empty cells"),
        Mistake("softmax over the queries", _at_wrong_axis,
                "softmax over the wrong axis: each query's weights must sum to 1 over the keys"),
        Mistake("float32 products", _at_float32,
                "float32 products: the KV cache is f16 and ggml multiplies in f16 (helpers.matmul_f16, the "
                "weights rounded to f16 too); the bits differ at {node} ({detail})", close=True),
        Mistake("weights kept in float32", _at_f32_weights,
                "the weights times V in float32: ggml rounds the weights to f16 for the f16 product "
                "(helpers.matmul_f16)", close=True),
    ],
    hint_different="the first difference is at {node} ({detail}, {max_diff}): softmax(q kᵀ scale + mask) v"))
