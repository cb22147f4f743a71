"""Tiny models with random weights, written as real GGUF files by llmlab's own writer.

They have the tensor names, shapes and metadata llama.cpp expects for their
architecture (all read from its spec, ``llmlab.llama.arch``), so the same code
path (Model -> graph builder -> decode) runs them in milliseconds.
``vocab_from`` copies a real tokenizer (and its vocabulary size) so llama.cpp can
load the file too; ``wtype`` stores the matrices in a ggml type (e.g. ``"q8_0"``,
as llama-quantize would: norms and biases stay f32), so that llama.cpp and
llmlab take the same kernels and their logits can be compared bit for bit.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..ggml.gguf import GGUFFile, GGUFWriter
from ..ggml.gguf.constants import ValueType
from .arch import get_arch
from .model import load_hparams

U32, F32 = ValueType.UINT32, ValueType.FLOAT32


def write_tiny(path: str | Path, arch: str = "llama", n_layer: int = 2, n_embd: int = 64, n_head: int = 4,
               n_head_kv: int = 2, n_ff: int = 128, n_vocab: int = 256, head_dim: int | None = None,
               n_ctx_train: int = 2048, seed: int = 0, vocab_from: str | Path | None = None,
               sliding_window: int = 8, wtype: str = "f32", kv: dict | None = None,
               with_optional: tuple[str, ...] = (), keep_f32: tuple[str, ...] = (),
               vocab_size: int | None = None) -> Path:
    """``kv``: more ``{arch}.*`` metadata (key suffix -> value), over the spec's tiny defaults (an MoE
    model's expert_count, ...); ``with_optional``: optional layer tensors to write too (by attribute);
    ``keep_f32``: matrices left in f32 whatever ``wtype`` (as llama-quantize leaves the MoE router);
    ``vocab_size``: keep only the first tokens of ``vocab_from`` (and the merges among them): a small LM
    head, and a tokenizer llama.cpp still loads."""
    spec = get_arch(arch)
    rng = np.random.default_rng(seed)
    w = GGUFWriter()
    if vocab_from is not None:
        src = GGUFFile(vocab_from)
        for k, fld in src.fields.items():
            if k.startswith("tokenizer."):
                w.kv[k] = (fld.value, fld.type, fld.item_type)
        n_vocab = len(src.kv["tokenizer.ggml.tokens"])
        if vocab_size is not None and vocab_size < n_vocab:
            n_vocab = _truncate_vocab(w, src, vocab_size)
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
    for key, value in {**spec.tiny_kv(hd, n_vocab, sliding_window), **(kv or {})}.items():
        if isinstance(value, bool):
            w.add(a + key, value, ValueType.BOOL)
        else:
            w.add(a + key, value, F32 if isinstance(value, float) else U32)
    hp = load_hparams({k: v[0] for k, v in w.kv.items()}, n_vocab=n_vocab)

    def values(init: str, ne: tuple[int, ...]) -> np.ndarray:
        shape = ne[::-1]
        if init == "norm":
            return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        scale = {"embd": 1.0, "bias": 0.5, "weight": 1.0 / np.sqrt(shape[-1])}[init]
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def add(name: str, init: str, ne: tuple[int, ...], attr: str = "") -> None:
        x = values(init, ne)
        if wtype == "f32" or len(ne) < 2 or attr in keep_f32:
            w.add_tensor(name, x)
        elif wtype == "f16":
            w.add_tensor(name, x.astype(np.float16))
        else:
            from ..ggml.quant import quantize
            from ..ggml.types import ggml_type
            t = wtype if ne[0] % ggml_type(wtype).block_size == 0 else "q8_0"   # rows a K-quant cannot split:
            if ne[0] % ggml_type(t).block_size:                                  # a fallback type, as llama-quantize
                w.add_tensor(name, x.astype(np.float16))
                return
            raw = np.ascontiguousarray(quantize(x, t)).view(np.uint8)
            w.add_tensor(name, raw, type=t, shape=ne)

    for ts in spec.model_tensors:
        if not ts.optional:
            add(ts.gguf_name(), ts.init, ts.shape(hp))
    for il in range(n_layer):
        for ts in spec.layer_tensors:
            if ts.present(hp, il) and (not ts.optional or ts.attr in with_optional):
                add(ts.gguf_name(il), ts.init, ts.shape(hp), ts.attr)
    path = Path(path)
    w.write(path)
    return path


def _truncate_vocab(w: GGUFWriter, src: GGUFFile, n: int) -> int:
    """The first ``n`` tokens of a copied tokenizer, the per-token arrays cut to match, and only the BPE
    merges whose two parts and result are among them; special token ids past ``n`` are dropped."""
    tokens = list(src.kv["tokenizer.ggml.tokens"][:n])
    keep = set(tokens)
    for k in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.scores"):
        if k in w.kv:
            v, t, it = w.kv[k]
            w.kv[k] = (list(v[:n]) if k.endswith("tokens") else np.asarray(v)[:n], t, it)
    if "tokenizer.ggml.merges" in w.kv:
        v, t, it = w.kv["tokenizer.ggml.merges"]
        merges = [m for m in v if (lambda a, _, b: a in keep and b in keep and a + b in keep)(*m.partition(" "))]
        w.kv["tokenizer.ggml.merges"] = (merges, t, it)
    for k in [k for k in w.kv if k.endswith("_token_id")]:
        if int(w.kv[k][0]) >= n:
            del w.kv[k]
    return n
