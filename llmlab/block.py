"""The transformer block around attention (notebook 03): RMSNorm, RoPE, the gated FFN, the residual stream.

Two sides, as in :mod:`llmlab.attention`:

- references in NumPy that compute what ggml-cpu computes, bit for bit, by calling the engine's own kernels
  (:func:`rms_norm`, :func:`rope`, :func:`glu`), next to plain float64 versions that read like the formula
  (:func:`rope_f64`) and the small facts a learner looks at (:func:`rope_pairs`, :func:`rope_freqs`);
- :func:`trace`: one decode through ``Context.decode`` with an executor callback that keeps, per layer, the
  operands and results of the nodes llama.cpp names ``attn_norm``, ``Qcur`` (its ROPE), ``ffn_swiglu`` /
  ``ffn_geglu`` and ``l_out``, and the residual stream between them.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from .ggml.cpu import ops as cpu_ops
from .ggml.cpu.ops import f32
from .ggml.cpu.vec import gelu as gelu_ggml, silu as silu_ggml

# ---- RoPE -------------------------------------------------------------------------------------------------


def _pairs_norm(n_dims: int) -> np.ndarray:
    """NORM (llama): adjacent dimensions (2i, 2i+1) turn together."""
    i = np.arange(n_dims // 2)
    return np.stack([2 * i, 2 * i + 1], 1)


def _pairs_neox(n_dims: int) -> np.ndarray:
    """NEOX (GPT-NeoX, qwen2, gemma): dimension i turns with i + n_dims/2."""
    i = np.arange(n_dims // 2)
    return np.stack([i, i + n_dims // 2], 1)


# ggml's rope mode (the GGML_ROPE_TYPE_NEOX bit, 2) -> how the dimensions pair up
ROPE_PAIRING = {"norm": (0, _pairs_norm), "neox": (2, _pairs_neox)}


def rope_mode_name(rope_type: int) -> str:
    """'neox' when ggml's NEOX bit is set, else 'norm' (the two pairings ggml_rope_ext knows for text)."""
    return "neox" if rope_type & ROPE_PAIRING["neox"][0] else "norm"


def rope_pairs(n_dims: int, mode: str) -> np.ndarray:
    """``(n_dims/2, 2)``: pair i rotates dimensions ``pairs[i, 0]`` and ``pairs[i, 1]`` by ``pos * theta_i``."""
    try:
        return ROPE_PAIRING[mode][1](n_dims)
    except KeyError:
        raise ValueError(f"unknown RoPE mode {mode!r}: one of {sorted(ROPE_PAIRING)}") from None


def rope_freqs(n_dims: int, base: float) -> np.ndarray:
    """theta_i = base^(-2i / n_dims), radians per position, for each pair i (float64)."""
    return float(base) ** (-2.0 * np.arange(n_dims // 2) / n_dims)


def rope(x: np.ndarray, pos, mode: str, base: float, n_dims: int | None = None) -> np.ndarray:
    """ggml-cpu's ROPE on ``x`` ``(..., n_tokens, n_head, head_dim)`` at positions ``pos`` (one per token):
    the engine's cos/sin cache and fused rotation, so the result equals the graph's node bit for bit."""
    x = np.asarray(x, np.float32)
    n_dims = x.shape[-1] if n_dims is None else n_dims
    cos, sin = cpu_ops.rope_cache(np.asarray(pos).reshape(-1), n_dims, base)
    cos, sin = cos[:, None, :], sin[:, None, :]
    p = rope_pairs(n_dims, mode)
    out = x.copy()
    out[..., p[:, 0]], out[..., p[:, 1]] = cpu_ops.rotate(x[..., p[:, 0]], x[..., p[:, 1]], cos, sin)
    return out


def rope_f64(x: np.ndarray, pos, mode: str, base: float) -> np.ndarray:
    """The formula in float64: each pair (a, b) becomes (a cos t - b sin t, a sin t + b cos t), t = pos * theta_i.
    ``x`` is ``(n_tokens, ..., head_dim)`` or one vector with a scalar ``pos``."""
    x = np.asarray(x, np.float64)
    p = rope_pairs(x.shape[-1], mode)
    t = np.multiply.outer(np.asarray(pos, np.float64), rope_freqs(x.shape[-1], base))
    t = t.reshape(t.shape[:1] + (1,) * (x.ndim - 2) + t.shape[1:]) if x.ndim > 1 else t
    a, b = x[..., p[:, 0]], x[..., p[:, 1]]
    out = x.copy()
    out[..., p[:, 0]], out[..., p[:, 1]] = a * np.cos(t) - b * np.sin(t), a * np.sin(t) + b * np.cos(t)
    return out


def rope_scores(q: np.ndarray, k: np.ndarray, q_pos, k_pos, mode: str, base: float) -> np.ndarray:
    """q·k after rotating q to each of ``q_pos`` and k to each of ``k_pos`` (float64): ``(len(q_pos), len(k_pos))``.
    RoPE makes it a function of q_pos - k_pos alone (rotations compose: R(m)ᵀR(n) = R(n - m))."""
    qs = np.stack([rope_f64(q, m, mode, base) for m in np.atleast_1d(q_pos)])
    ks = np.stack([rope_f64(k, n, mode, base) for n in np.atleast_1d(k_pos)])
    return qs @ ks.T


# ---- RMSNorm and the gated FFN ------------------------------------------------------------------------------

def rms_norm(x: np.ndarray, eps: float, weight: np.ndarray | None = None) -> np.ndarray:
    """llama.cpp's build_norm(LLM_NORM_RMS): ggml_rms_norm (x / sqrt(mean(x²) + eps)), then ``* weight``
    when given, in float32 as the engine computes it."""
    y = cpu_ops.rms_norm_rows(x, eps)
    return y if weight is None else (y * np.asarray(weight, np.float32)).astype(np.float32)


# the FFN's gate activation by the name llama.cpp's builders pass (LLM_FFN_SILU / LLM_FFN_GELU), with its GLU op
GLU = {"silu": ("SWIGLU", silu_ggml), "gelu": ("GEGLU", lambda g, cpu=None: gelu_ggml(g))}


def glu(gate: np.ndarray, up: np.ndarray, act: str, cpu=None) -> np.ndarray:
    """The gated FFN's middle: act(gate) * up (SWIGLU for silu, GEGLU for gelu), as ggml-cpu computes it."""
    try:
        fn = GLU[act][1]
    except KeyError:
        raise ValueError(f"unknown FFN activation {act!r}: one of {sorted(GLU)}") from None
    return (fn(np.asarray(gate, np.float32), cpu=cpu) * np.asarray(up, np.float32)).astype(np.float32)


def silu_f64(x):
    """x * sigmoid(x), the formula (float64)."""
    x = np.asarray(x, np.float64)
    return x / (1.0 + np.exp(-x))


def gelu_f64(x):
    """GELU in its tanh form, the one ggml uses (float64)."""
    x = np.asarray(x, np.float64)
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * x * (1.0 + 0.044715 * x * x)))


# ---- the probe -----------------------------------------------------------------------------------------------

# the nodes the probe keeps; the one adding attention's output to the stream is named by the spec (``residual_mid``)
_NAMES = ("attn_norm", "Qcur", "Kcur", "ffn_swiglu", "ffn_geglu", "l_out")


@dataclass
class LayerBlock:
    """One layer's view of the stream (rows = tokens). ``x``: the layer's input; ``normed``: rms_norm(x),
    ``attn_norm``: normed * ``norm_w``; ``q_pre``/``q``: Q before and after RoPE ``(n_tokens, n_head, d)``, ``k_pre``/``k`` the same of K,
    ``pos`` their positions;
    ``gate``/``up``/``glu``: the FFN's two projections and act(gate) * up; ``attn``/``ffn``: what the
    attention and FFN add to the stream; ``mid`` = x + attn; ``out`` = mid + ffn (``l_out``)."""
    layer: int
    x: np.ndarray | None = None
    normed: np.ndarray | None = None
    norm_w: np.ndarray | None = None
    attn_norm: np.ndarray | None = None
    q_pre: np.ndarray | None = None
    q: np.ndarray | None = None
    k_pre: np.ndarray | None = None
    k: np.ndarray | None = None
    pos: np.ndarray | None = None
    gate: np.ndarray | None = None
    up: np.ndarray | None = None
    glu: np.ndarray | None = None
    attn: np.ndarray | None = None
    mid: np.ndarray | None = None
    ffn: np.ndarray | None = None
    out: np.ndarray | None = None


@dataclass
class BlockTrace:
    arch: str
    tokens: list[int]
    act: str
    rope_mode: str
    eps: float
    embd: np.ndarray | None = None          # the stream entering layer 0 (Gemma 3: after its sqrt(n_embd) scale)
    layers: dict[int, LayerBlock] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)    # every named node of the graph -> its op, in order
    # every named node in the order the graph computes it, repeats kept: llama.cpp gives one name to two nodes
    # (Qcur and Kcur: the projection, then its ROPE; norm: the RMS_NORM before each branch)
    nodes: list[tuple[str, str]] = field(default_factory=list)

    def __getitem__(self, il: int) -> LayerBlock:
        return self.layers[il]

    def stream_rms(self) -> np.ndarray:
        """``(n_layer + 1, n_tokens)``: the RMS of every token's residual row, entering layer 0 and after each layer."""
        rows = [self.embd] + [self.layers[il].out for il in sorted(self.layers)]
        return np.stack([np.sqrt((r.astype(np.float64) ** 2).mean(-1)) for r in rows])

    def contributions(self) -> np.ndarray:
        """``(n_layer, 2, n_tokens)``: the RMS of what attention and the FFN of each layer add to each row."""
        rms = lambda a: np.sqrt((a.astype(np.float64) ** 2).mean(-1))
        return np.stack([[rms(self.layers[il].attn), rms(self.layers[il].ffn)] for il in sorted(self.layers)])


def _rows(t) -> np.ndarray:
    a = f32(t)
    return a.reshape(-1, a.shape[-1]).copy()


def trace(model, tokens) -> BlockTrace:
    """Decode ``tokens`` (one sequence, logits of every position, so the last layer keeps every row) and
    record the block's nodes of every layer from the graph's own tensors."""
    from .llama import Batch, Context
    hp = model.hparams
    toks = [int(t) for t in tokens]
    if not toks:
        raise ValueError("trace needs at least one token")
    spec = model.spec                        # the architecture's names for the nodes it builds
    out = BlockTrace(model.arch, toks, spec.ffn_act, rope_mode_name(hp.rope_type), float(hp.f_norm_rms_eps))
    mid_name = spec.residual_mid
    kept = re.compile(rf"^({'|'.join(map(re.escape, _NAMES + (mid_name,)))})-(\d+)$")

    def on_node(t) -> None:
        if t.name:
            out.names.setdefault(t.name, t.op)
            out.nodes.append((t.name, t.op))
        m = kept.match(t.name or "")
        if m is None:
            return
        kind, il = m.group(1), int(m.group(2))
        L = out.layers.setdefault(il, LayerBlock(il))
        if kind == "attn_norm":              # MUL(rms_norm(x), w); x is the stream entering the layer
            L.normed, L.norm_w, L.attn_norm = _rows(t.src[0]), f32(t.src[1]).reshape(-1).copy(), _rows(t)
            L.x = _rows(t.src[0].src[0])
            if il == 0:
                out.embd = L.x
        elif kind == "Qcur" and t.op == "ROPE":
            L.q_pre, L.q = f32(t.src[0])[0].copy(), f32(t)[0].copy()
            L.pos = t.src[1].array().reshape(-1).copy()
        elif kind == "Kcur" and t.op == "ROPE":
            L.k_pre, L.k = f32(t.src[0])[0].copy(), f32(t)[0].copy()
        elif kind in ("ffn_swiglu", "ffn_geglu"):
            L.gate, L.up, L.glu = _rows(t.src[0]), _rows(t.src[1]), _rows(t)
        elif kind == mid_name:
            L.attn, L.mid = _rows(t.src[0]), _rows(t)
        elif kind == "l_out":
            L.ffn, L.out = _rows(t.src[0]), _rows(t)

    ctx = Context(model, n_ctx=len(toks), n_batch=len(toks), n_ubatch=len(toks))
    ctx.decode(Batch.from_tokens(toks, logits="all"), callback=on_node)
    return out
