"""The attention hook: record, per layer and per head, what the engine's attention computed.

:func:`trace` runs ``Context.decode`` (naive attention path, so the score and probability
matrices exist as graph nodes) with an executor callback that reads, for each layer ``il``,
the operands and results of the nodes llama.cpp names ``kq-il``, ``kq_soft_max-il``, ``kqv-il``
and ``kqv_out-il``, straight from the graph:

- ``q``: the query the KQ matmul multiplies, ``(n_head, n_q, d_k)`` (after RoPE; Gemma 3 after its
  1/sqrt(d) scale);
- ``k``, ``v``: the K and V rows read from the KV cache, ``(n_head_kv, n_kv, d)`` (stored f16);
- ``kq``: raw scores ``Q K^T``, ``(n_head, n_q, n_kv)``;
- ``mask`` ``(n_q, n_kv)`` and ``scale``: the soft_max's inputs (Gemma 3's local layers get the
  sliding-window mask);
- ``probs``: ``softmax(kq * scale + mask)``, ``(n_head, n_q, n_kv)``;
- ``kqv_out``: the heads' outputs side by side, ``(n_q, n_head * d_v)``, what ``attn_output`` multiplies.

``n_kv`` is the cache's padded window (256 cells for a short prompt); :meth:`AttentionTrace.probs`
trims it to the cells the tokens occupy.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from ..ggml.cpu.ops import f32

_NAME = re.compile(r"^(kq|kq_soft_max|kqv|kqv_out)-(\d+)$")


@dataclass
class LayerAttention:
    layer: int
    q: np.ndarray | None = None
    k: np.ndarray | None = None
    v: np.ndarray | None = None
    kq: np.ndarray | None = None
    mask: np.ndarray | None = None
    scale: float = 1.0
    probs: np.ndarray | None = None
    kqv_out: np.ndarray | None = None


@dataclass
class AttentionTrace:
    tokens: list[int]
    n_head: int
    n_head_kv: int
    layers: dict[int, LayerAttention] = field(default_factory=dict)
    logits: np.ndarray | None = None

    def __getitem__(self, il: int) -> LayerAttention:
        try:
            return self.layers[il]
        except KeyError:
            raise KeyError(f"layer {il} was not traced (traced: {sorted(self.layers)})") from None

    def n_cells(self, il: int) -> int:
        """How many leading cells of the window any query can see (the tokens in the cache)."""
        seen = np.isfinite(self[il].mask).any(0)
        return int(np.flatnonzero(seen)[-1]) + 1 if seen.any() else 0

    def probs(self, il: int, trim: bool = True) -> np.ndarray:
        """The attention probabilities of layer ``il`` as ``(n_head, n_q, n_kv)``."""
        p = self[il].probs
        return p[..., :self.n_cells(il)] if trim else p

    def rank_heads(self, query: int, keys, skip: tuple[int, ...] = (0,)) -> list[tuple[float, int, int]]:
        """``(weight, layer, head)`` for every traced head, most first: the probability mass ``query``
        puts on the key positions ``keys`` (``skip``: positions left out, e.g. the first token, which
        many heads use as a resting place)."""
        keys = [int(k) for k in keys if int(k) not in skip]
        out = [(float(self[il].probs[h, query, keys].sum()), il, h)
               for il in sorted(self.layers) for h in range(self.n_head)]
        return sorted(out, key=lambda x: -x[0])


def trace(model, tokens, layers=None, n_ctx: int | None = None, context=None) -> AttentionTrace:
    """Decode ``tokens`` (one sequence, one micro-batch, logits of the last) and record the attention of
    ``layers`` (default: all). ``context``: an existing non-flash ``llmlab.llama.Context`` to decode in
    (the tokens then continue what its cache holds); by default a fresh one is made."""
    from ..llama import Batch, Context
    hp = model.hparams
    toks = [int(t) for t in tokens]
    if not toks:
        raise ValueError("trace needs at least one token")
    want = set(range(hp.n_layer)) if layers is None else {int(il) for il in layers}
    bad = sorted(il for il in want if not 0 <= il < hp.n_layer)
    if bad:
        raise ValueError(f"layers {bad} out of range: the model has {hp.n_layer} layers")
    if context is None:
        context = Context(model, n_ctx=max(n_ctx or 0, len(toks)), n_batch=len(toks), n_ubatch=len(toks))
    elif context.flash_attn:
        raise ValueError("trace needs the naive attention path (flash attention keeps no probability matrix)")
    out = AttentionTrace(toks, hp.n_head, hp.n_head_kv)

    def on_node(t) -> None:
        m = _NAME.match(t.name)
        if m is None or int(m.group(2)) not in want:
            return
        kind, il = m.group(1), int(m.group(2))
        rec = out.layers.setdefault(il, LayerAttention(il))
        if kind == "kq":
            rec.k, rec.q = f32(t.src[0])[0].copy(), f32(t.src[1])[0].copy()
            rec.kq = f32(t)[0].copy()
        elif kind == "kq_soft_max":
            rec.probs = f32(t)[0].copy()
            rec.scale = float(t.op_params["scale"])
            rec.mask = f32(t.src[1])[0, 0, :t.ne[1], :t.ne[0]].copy()
        elif kind == "kqv":
            rec.v = f32(t.src[0])[0].transpose(0, 2, 1).copy()       # v_cont is V^T per head
        else:
            rec.kqv_out = f32(t).reshape(-1, t.ne[0]).copy()

    pos0 = context.kv.seq_pos_max(0) + 1                  # -1 + 1 for an empty cache
    out.logits = context.decode(Batch.from_tokens(toks, pos0=pos0, logits="last"), callback=on_node)
    return out


def attention_probs(model, tokens, layers=None, trim: bool = True) -> dict[int, np.ndarray]:
    """``{layer: (n_head, n_q, n_kv)}`` attention probabilities of ``tokens`` (see :func:`trace`)."""
    tr = trace(model, tokens, layers)
    return {il: tr.probs(il, trim) for il in sorted(tr.layers)}
