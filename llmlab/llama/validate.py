"""Check a model before any compute, as llama.cpp's loader does: a file that parses can still lie.

``validate_model(model)`` runs once the weights are bound (``Model.__init__``):

- ``check_layout``: tensor data packed in directory order, each padded to the file's alignment
  (gguf.cpp refuses anything else: "tensor '%s' has offset %zu, expected %zu");
- ``check_hparams``: the hyperparameters the math needs positive and consistent (RoPE pairs fit
  in a head, heads split into KV groups, the graph's head sizes agree);
- ``check_tensors``: no tensor left unused (``llama_model_loader::done_getting_tensors``: "wrong
  number of tensors"), and each weight of a type its op takes on the CPU backend
  (``weight_buft_supported``): norms f32/f16, matrices f32/f16 or a quantized type llmlab can
  dequantize;
- ``check_vocab``: the tokenizer has as many tokens as the embedding has rows.

``check_context`` bounds a context before its KV cache is allocated: against the model's training
context and against the memory the machine has. Each failure is an ``LLMLabError`` that names the
tensor or key.
"""
from __future__ import annotations

import math
import os

import numpy as np

from .. import LLMLabError
from .kv_cache import kv_cache_bytes, padded_n_ctx

# weight types the CPU backend computes, per op class (llmlab's ggml/cpu ops; llama.cpp's CPU
# backend also takes bf16 norms, which llmlab's binary ops do not compute yet)
NORM_TYPES = frozenset({"f32", "f16"})
NO_MATMUL = frozenset({"q8_1", "q8_k"})     # activation-only formats: no vec_dot as a weight


class ValidationError(LLMLabError, ValueError):
    """A model file that parses but cannot be right."""


def _name(model) -> str:
    return f"{model.path.name}: " if getattr(model, "path", None) is not None else ""


# ---------------------------------------------------------------------------- the file's layout
def check_layout(gguf, where: str = "") -> None:
    """gguf.cpp's data-section check: tensor i starts where tensor i-1's padded bytes end."""
    align, expect = gguf.alignment, 0
    for t in gguf.tensors:
        if t.offset != expect:
            raise ValidationError(f"{where}tensor {t.name!r} has offset {t.offset}, expected {expect} "
                                  f"(tensor data must be packed in directory order, each padded to {align} bytes)")
        expect += -(-t.nbytes // align) * align


# ---------------------------------------------------------------------------- hyperparameters
PER_LAYER_KEYS = ("feed_forward_length", "attention.head_count", "attention.head_count_kv")


def check_hparams(hp, where: str = "", kv=None) -> None:
    """``kv`` (the file's metadata): also check per-layer arrays have one value per layer."""
    def bad(key: str, msg: str):
        raise ValidationError(f"{where}{hp.arch}.{key}: {msg}")

    for key, v in (("embedding_length", hp.n_embd), ("block_count", hp.n_layer), ("context_length", hp.n_ctx_train),
                   ("feed_forward_length", hp.n_ff), ("attention.head_count", hp.n_head),
                   ("attention.head_count_kv", hp.n_head_kv), ("attention.key_length", hp.n_embd_head_k),
                   ("attention.value_length", hp.n_embd_head_v), ("vocab_size", hp.n_vocab)):
        if not isinstance(v, (int, np.integer)) or v <= 0:
            bad(key, f"{v!r} must be a positive integer")
    if kv is not None:
        from ..ggml.gguf.meta import Metadata
        md = Metadata.of(kv)
        for key in PER_LAYER_KEYS:     # get_key_or_arr: "key %s has wrong array length; expected %u, got %u"
            if hp.arch + "." + key in md:
                md.per_layer(hp.arch + "." + key, hp.n_layer)
    if hp.n_head % hp.n_head_kv:
        bad("attention.head_count_kv", f"head_count {hp.n_head} is not a multiple of head_count_kv {hp.n_head_kv}")
    if hp.n_embd_head_k != hp.n_embd_head_v and not hp.is_mla:     # MLA: K rows are latent + rope, V the latent
        bad("attention.value_length", f"{hp.n_embd_head_v} differs from key_length {hp.n_embd_head_k}; "
            f"the {hp.arch} graph uses one head size for Q, K and V")
    if not 0 < hp.n_rot <= hp.n_embd_head_k or hp.n_rot % 2:
        bad("rope.dimension_count", f"{hp.n_rot} must be even and in [2, {hp.n_embd_head_k}] (the head size): "
            "RoPE rotates pairs of a head's dimensions")
    for key, v, positive in (("attention.layer_norm_rms_epsilon", hp.f_norm_rms_eps, True),
                             ("rope.freq_base", hp.rope_freq_base, True),
                             ("rope.scaling.factor", hp.rope_freq_scale, True),
                             ("rope.freq_base (sliding window)", hp.rope_freq_base_swa, False),
                             ("attention scale", hp.f_attention_scale, False)):
        if not math.isfinite(v) or (v <= 0 if positive else v < 0):
            bad(key, f"{v!r} must be finite and {'positive' if positive else 'non-negative'}")
    if hp.n_swa < 0:
        bad("attention.sliding_window", f"{hp.n_swa} is negative")


# ---------------------------------------------------------------------------- tensors
def matmul_type_ok(t) -> bool:
    if t.name in ("f32", "f16"):
        return True
    return t.is_quantized and not t.removed and t.name not in NO_MATMUL and t.to_float is not None


def check_tensors(model, where: str = "") -> None:
    from ..ggml import quant  # noqa: F401  (attaches the dequantizers to the type table)
    used = set(model.weights)
    unused = [t.name for t in model.gguf.tensors if t.name not in used]
    if unused:
        more = f" and {len(unused) - 3} more" if len(unused) > 3 else ""
        raise ValidationError(f"{where}wrong number of tensors: {len(model.gguf.tensors)} in the file, {len(used)} used "
                              f"by the {model.hparams.arch} graph; unused: {', '.join(repr(n) for n in unused[:3])}{more}")
    for name, t in model.weights.items():
        if t.n_dims <= 1 and not name.startswith("token_embd"):   # 1-D: norms, biases
            if t.type.name not in NORM_TYPES:
                raise ValidationError(f"{where}tensor {name!r} is {t.type.name}; a 1-D weight (norm, bias) "
                                      f"must be {' or '.join(sorted(NORM_TYPES))}")
        elif not matmul_type_ok(t.type):
            raise ValidationError(f"{where}tensor {name!r} is {t.type.name}, a type the CPU backend cannot "
                                  "multiply with (matrix weights: f32, f16 or a quantized type)")


def check_vocab(model, where: str = "") -> None:
    from ..ggml.gguf.meta import Metadata
    tokens = Metadata.of(model.gguf).get("tokenizer.ggml.tokens")    # type-checked: an array of strings
    if tokens is None:
        return
    n_tok, n_vocab = len(tokens), model.hparams.n_vocab
    if n_tok != n_vocab:
        raise ValidationError(f"{where}the tokenizer has {n_tok} tokens but token_embd.weight has {n_vocab} rows")


def validate_model(model) -> None:
    """All of the above, in llama.cpp's order (layout, hparams, tensors, vocabulary)."""
    where = _name(model)
    check_layout(model.gguf, where)
    check_hparams(model.hparams, where, model.gguf)
    check_tensors(model, where)
    check_vocab(model, where)


# ---------------------------------------------------------------------------- resources
def available_memory() -> int | None:
    """Bytes the machine can still give (MemAvailable), or None if unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_context(hp, n_ctx: int, n_predict: int | None = None, n_prompt: int | None = None,
                  type_k: str = "f16", type_v: str = "f16", what: str = "--n-ctx") -> None:
    """Refuse a context the model was not trained for, or whose KV cache would not fit in memory."""
    if isinstance(n_ctx, bool) or not isinstance(n_ctx, (int, np.integer)) or n_ctx <= 0:
        raise LLMLabError(f"{what} must be a positive integer, not {n_ctx!r}")
    train = f"the model's context length ({hp.arch}.context_length = {hp.n_ctx_train})"
    if n_prompt is not None and n_prompt > hp.n_ctx_train:
        raise LLMLabError(f"the prompt ({n_prompt} tokens) exceeds {train}")
    if n_predict is not None and n_prompt is not None and n_prompt + n_predict > hp.n_ctx_train:
        raise LLMLabError(f"the prompt ({n_prompt} tokens) + --n-predict {n_predict} exceeds {train}")
    if n_ctx > hp.n_ctx_train:
        raise LLMLabError(f"{what} {n_ctx} exceeds {train}")
    if n_prompt is not None and n_prompt > n_ctx:
        raise LLMLabError(f"the prompt ({n_prompt} tokens) does not fit in {what} {n_ctx}")
    if n_predict is not None and n_prompt is not None and n_prompt + n_predict > n_ctx:
        raise LLMLabError(f"the prompt ({n_prompt} tokens) + --n-predict {n_predict} exceeds {what} {n_ctx}")
    check_kv_memory(hp, n_ctx, type_k, type_v)


def check_text_fits(tokenizer, text: str, n_tokens: int, what: str = "the prompt") -> None:
    """Refuse, before tokenizing it, a text too long to fit in ``n_tokens`` tokens: no token stands for
    more characters than the vocabulary's longest, so the work is bounded by the context, not the input."""
    longest = tokenizer.vocab.max_token_chars
    if len(text) > (n_tokens + 2) * longest:
        raise LLMLabError(f"{what} ({len(text):,} characters) cannot fit in {n_tokens:,} tokens (no token of this "
                          f"vocabulary is longer than {longest} characters)")


def context_length(path) -> int | None:
    """The model file's ``{arch}.context_length`` (None when it cannot be read: loading the model says why)."""
    from ..ggml.gguf import GGUFFile
    from ..ggml.gguf.meta import Metadata
    try:
        with GGUFFile(path) as f:
            md = Metadata.of(f)
            arch = md.peek("general.architecture", "str")
            return md.peek(f"{arch}.context_length", "int") if arch else None
    except LLMLabError:
        return None


def check_kv_memory(hp, n_ctx: int, type_k: str = "f16", type_v: str = "f16") -> None:
    """Refuse a KV cache bigger than half the memory still available (``Context`` calls this)."""
    need = kv_cache_bytes(padded_n_ctx(n_ctx), hp.n_layer, hp.n_embd_k_gqa, 0 if hp.is_mla else hp.n_embd_v_gqa,
                          type_k, type_v)                           # MLA: no V rows
    avail = available_memory()
    if avail is not None and need > avail // 2:
        raise LLMLabError(f"a context of {n_ctx:,} tokens needs a {need / 2**20:,.0f} MiB KV cache; "
                          f"only {avail / 2**20:,.0f} MiB of memory is available")


def check_finite(logits: np.ndarray, what: str = "logits", row0: int = 0, servers: list[str] | None = None) -> None:
    """Non-finite logits are an error, not a result (a file whose weights or hparams lie, or, ``servers``, an
    rpc-server that computed part of the model and returned them); ``row0``: the row number of ``logits[0]``."""
    if logits.size == 0 or (np.isfinite(logits.max()) and np.isfinite(logits.min())):
        return      # all finite: the largest and the smallest are (both propagate a NaN); no bool per logit
    bad = np.argwhere(~np.isfinite(logits))[0]
    why = (f"rpc-server {', '.join(servers)} computed part of the model: compare with a run without --rpc to "
           f"tell the server from the file" if servers else "the weights or hyperparameters of this file are broken")
    raise LLMLabError(f"the model produced non-finite {what} (first at row {row0 + bad[0]}, column {bad[-1]}): "
                      + why)
