"""Attention, looked at from three sides (notebook 03).

- ``reference``: softmax(QK^T * scale + mask) V in plain NumPy, step by step (scores, mask, softmax,
  weighted sum, head split and concat, GQA sharing), and flash attention's tiled online-softmax version;
- ``probe``: what the engine's attention really computed, per layer and per head: the Q, K, V it
  multiplied, the raw scores, the mask, the probabilities ``(n_head, n_q, n_kv)`` and ``kqv_out``,
  recorded from the graph's own nodes while ``Context.decode`` runs;
- ``variants``: MHA, GQA, MQA and MLA as KV-cache sizes, from real hyperparameters.
"""
from .reference import (attention, causal_mask, flash_attention, merge_heads, repeat_kv, scores, softmax,
                        split_heads, weighted_sum)
from .variants import AttnShape, SEED_MODELS, kv_table, shape_of

__all__ = ["attention", "causal_mask", "flash_attention", "merge_heads", "repeat_kv", "scores", "softmax",
           "split_heads", "weighted_sum", "AttnShape", "SEED_MODELS", "kv_table", "shape_of",
           "trace", "attention_probs", "AttentionTrace", "LayerAttention"]


def __getattr__(name):
    if name in ("trace", "attention_probs", "AttentionTrace", "LayerAttention"):
        from . import probe
        return getattr(probe, name)
    raise AttributeError(name)
