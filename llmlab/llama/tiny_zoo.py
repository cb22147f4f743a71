"""Shapes of tiny random models for the architectures llmlab compares with llama.cpp node by node.

Each architecture has a few shapes that exercise what makes it itself (odd head counts, MQA, one
expert per token and several, MLA with and without the low-rank q path, softmax and sigmoid
gating, a selection bias); :func:`draw` picks one with a seed and scales it for a weight type
(a K-quant needs rows of 256). ``tools/gen_tiny_models.py`` writes them all; the tests draw theirs
at test time, so every run checks models nobody looked at before.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .tiny import write_tiny

WTYPES = ("f32", "f16", "q8_0", "q4_0", "q4_k")

SHAPES: dict[str, list[dict]] = {
    "qwen3": [
        dict(n_layer=2, n_embd=64, n_head=4, n_head_kv=2, head_dim=32, n_ff=128),
        dict(n_layer=3, n_embd=96, n_head=5, n_head_kv=1, head_dim=32, n_ff=96),        # odd heads, MQA
        dict(n_layer=2, n_embd=64, n_head=3, n_head_kv=3, head_dim=64, n_ff=64),        # head size != n_embd / n_head
    ],
    "qwen3moe": [
        dict(n_layer=2, n_embd=64, n_head=4, n_head_kv=2, head_dim=32, n_ff=128,
             kv={"expert_count": 4, "expert_used_count": 2, "expert_feed_forward_length": 64}),
        dict(n_layer=2, n_embd=64, n_head=3, n_head_kv=1, head_dim=32, n_ff=128,        # one expert per token
             kv={"expert_count": 8, "expert_used_count": 1, "expert_feed_forward_length": 32}),
        dict(n_layer=3, n_embd=96, n_head=5, n_head_kv=5, head_dim=32, n_ff=96,
             kv={"expert_count": 6, "expert_used_count": 3, "expert_feed_forward_length": 64}),
    ],
    "deepseek2": [
        dict(n_layer=3, n_embd=64, n_head=5, n_head_kv=1, n_ff=128, with_optional=("ffn_exp_probs_b",),
             kv={}),                                               # V3-like: q_lora, sigmoid, bias, norm, scale
        dict(n_layer=2, n_embd=64, n_head=4, n_head_kv=1, n_ff=96,  # V2-Lite-like: no q_lora, softmax, one used
             kv={"attention.q_lora_rank": 0, "expert_gating_func": 1, "expert_weights_norm": False,
                 "expert_weights_scale": 1.0, "expert_used_count": 1, "expert_count": 6, "leading_dense_block_count": 1}),
        dict(n_layer=3, n_embd=96, n_head=3, n_head_kv=1, n_ff=64,
             kv={"leading_dense_block_count": 0, "expert_count": 5, "expert_used_count": 3, "expert_shared_count": 2,
                 "expert_gating_func": 1, "expert_weights_scale": 16.0, "expert_weights_norm": False,
                 "attention.kv_lora_rank": 64, "attention.key_length": 64 + 16, "attention.value_length": 64}),
    ],
}


def scaled(shape: dict, wtype: str) -> dict:
    """The shape with its matrix row lengths fit for ``wtype``: a K-quant (256-value blocks) gets
    n_embd, n_ff and the expert width of 256 (the rows it cannot split fall back to q8_0)."""
    s = dict(shape, kv=dict(shape.get("kv", {})))
    if wtype.lower().endswith("_k"):
        s["n_embd"], s["n_ff"] = 256, 256
        if "expert_feed_forward_length" in s["kv"] or "expert_count" in s["kv"]:
            s["kv"]["expert_feed_forward_length"] = 256
    return s


def draw(arch: str, seed: int, wtype: str = "q8_0") -> dict:
    """One shape of ``arch`` (by the seed) as write_tiny's keyword arguments, with the seed for its weights."""
    rng = np.random.default_rng(seed)
    shape = SHAPES[arch][int(rng.integers(len(SHAPES[arch])))]
    return dict(scaled(shape, wtype), seed=int(rng.integers(1 << 31)), wtype=wtype)


def write(path: str | Path, arch: str, seed: int, wtype: str = "q8_0", vocab_from=None,
          vocab_size: int | None = None) -> Path:
    """Write the tiny model :func:`draw` picks (``vocab_from``/``vocab_size``: see ``write_tiny``)."""
    return write_tiny(path, arch, vocab_from=vocab_from, vocab_size=vocab_size, **draw(arch, seed, wtype))
