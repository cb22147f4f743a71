"""Tiny models with random weights, written as real GGUF files by llmlab's own writer.

They have the tensor names, shapes and metadata llama.cpp expects for their
architecture, so the same code path (Model -> graph builder -> decode) runs them
in milliseconds. ``vocab_from`` copies a real tokenizer (and its vocabulary size)
so llama.cpp can load the file too.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..ggml.gguf import GGUFFile, GGUFWriter
from ..ggml.gguf.constants import ValueType

U32, F32 = ValueType.UINT32, ValueType.FLOAT32


def write_tiny(path: str | Path, arch: str = "llama", n_layer: int = 2, n_embd: int = 64, n_head: int = 4,
               n_head_kv: int = 2, n_ff: int = 128, n_vocab: int = 256, head_dim: int | None = None,
               n_ctx_train: int = 2048, seed: int = 0, vocab_from: str | Path | None = None,
               sliding_window: int = 8) -> Path:
    rng = np.random.default_rng(seed)
    w = GGUFWriter()
    if vocab_from is not None:
        src = GGUFFile(vocab_from)
        for k, fld in src.fields.items():
            if k.startswith("tokenizer."):
                w.kv[k] = (fld.value, fld.type, fld.item_type)
        n_vocab = len(src.kv["tokenizer.ggml.tokens"])
    hd = head_dim or n_embd // n_head
    a = arch + "."
    w.add("general.architecture", arch)
    w.add("general.name", f"tiny-{arch}")
    w.add(a + "block_count", n_layer, U32)
    w.add(a + "context_length", n_ctx_train, U32)
    w.add(a + "embedding_length", n_embd, U32)
    w.add(a + "feed_forward_length", n_ff, U32)
    w.add(a + "attention.head_count", n_head, U32)
    w.add(a + "attention.head_count_kv", n_head_kv, U32)
    w.add(a + "attention.layer_norm_rms_epsilon", 1e-6, F32)
    if arch == "llama":
        w.add(a + "rope.freq_base", 10000.0, F32)
        w.add(a + "rope.dimension_count", hd, U32)
        w.add(a + "vocab_size", n_vocab, U32)
    elif arch == "gemma3":
        w.add(a + "rope.freq_base", 1000000.0, F32)
        w.add(a + "attention.key_length", hd, U32)
        w.add(a + "attention.value_length", hd, U32)
        w.add(a + "attention.sliding_window", sliding_window, U32)
    else:
        raise ValueError(f"no tiny model recipe for {arch!r}")

    def mat(*shape, scale=None):
        s = scale if scale is not None else 1.0 / np.sqrt(shape[-1])
        return (rng.standard_normal(shape) * s).astype(np.float32)

    def normw(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w.add_tensor("token_embd.weight", mat(n_vocab, n_embd, scale=1.0))
    w.add_tensor("output_norm.weight", normw(n_embd))
    for il in range(n_layer):
        p = f"blk.{il}."
        w.add_tensor(p + "attn_norm.weight", normw(n_embd))
        w.add_tensor(p + "attn_q.weight", mat(n_head * hd, n_embd))
        w.add_tensor(p + "attn_k.weight", mat(n_head_kv * hd, n_embd))
        w.add_tensor(p + "attn_v.weight", mat(n_head_kv * hd, n_embd))
        w.add_tensor(p + "attn_output.weight", mat(n_embd, n_head * hd))
        w.add_tensor(p + "ffn_norm.weight", normw(n_embd))
        w.add_tensor(p + "ffn_gate.weight", mat(n_ff, n_embd))
        w.add_tensor(p + "ffn_up.weight", mat(n_ff, n_embd))
        w.add_tensor(p + "ffn_down.weight", mat(n_embd, n_ff))
        if arch == "gemma3":
            w.add_tensor(p + "attn_q_norm.weight", normw(hd))
            w.add_tensor(p + "attn_k_norm.weight", normw(hd))
            w.add_tensor(p + "post_attention_norm.weight", normw(n_embd))
            w.add_tensor(p + "post_ffw_norm.weight", normw(n_embd))
    path = Path(path)
    w.write(path)
    return path
