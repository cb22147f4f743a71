"""Hyperparameters read from the GGUF ``{arch}.*`` keys, as llama_model::load_hparams does.

The keys every architecture shares are read here; what an architecture adds (its RoPE type, its
sliding-window pattern, its own keys) comes from its spec (``llmlab.llama.arch``).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .. import LLMLabError
from ..ggml.gguf.meta import Metadata
from .arch import get_arch
from .arch.spec import LLAMA_ROPE_TYPE_NORM


@dataclass
class HParams:
    arch: str
    n_vocab: int
    n_ctx_train: int
    n_embd: int
    n_layer: int
    n_ff: int
    n_head: int
    n_head_kv: int
    n_embd_head_k: int
    n_embd_head_v: int
    n_rot: int
    f_norm_rms_eps: float
    rope_freq_base: float
    rope_freq_scale: float = 1.0
    rope_type: int = LLAMA_ROPE_TYPE_NORM
    n_swa: int = 0                 # sliding window (0: none)
    swa_pattern: int = 0           # layer il is local when il % pattern < pattern - 1
    rope_freq_base_swa: float = 0.0
    f_attention_scale: float = 0.0  # 0: 1/sqrt(head size) in the attention
    embd_scale: bool = False        # Gemma: embeddings times sqrt(n_embd)
    # mixture of experts (llama_hparams: n_expert, n_expert_used, n_ff_exp; deepseek2 and the like add the rest)
    n_expert: int = 0               # {arch}.expert_count
    n_expert_used: int = 0          # {arch}.expert_used_count: experts each token goes through
    n_ff_exp: int = 0               # {arch}.expert_feed_forward_length (0: n_ff / n_expert_used)
    n_expert_shared: int = 0        # {arch}.expert_shared_count: experts every token goes through
    n_layer_dense_lead: int = 0     # {arch}.leading_dense_block_count: first layers with a dense FFN
    expert_weights_scale: float = 0.0   # the chosen experts' weights times this (0 or 1: unscaled)
    expert_weights_norm: bool = False   # the chosen experts' weights divided by their sum
    expert_gating_func: int = 0     # LLAMA_EXPERT_GATING_FUNC_TYPE_*: 1 softmax, 2 sigmoid (0: not set)
    # multi-head latent attention (deepseek2)
    n_lora_q: int = 0               # {arch}.attention.q_lora_rank (0: one full q projection, as V2-Lite)
    n_lora_kv: int = 0              # {arch}.attention.kv_lora_rank: the latent's width
    n_embd_head_k_mla: int = 0      # {arch}.attention.key_length_mla: a head's q.k size before absorption
    n_embd_head_v_mla: int = 0      # {arch}.attention.value_length_mla: a head's value size after decompression
    extra: dict = field(default_factory=dict)

    @property
    def n_gqa(self) -> int:
        return self.n_head // self.n_head_kv

    @property
    def n_embd_k_gqa(self) -> int:
        return self.n_embd_head_k * self.n_head_kv

    @property
    def n_embd_v_gqa(self) -> int:
        return self.n_embd_head_v * self.n_head_kv

    @property
    def is_mla(self) -> bool:
        """Multi-head latent attention in its absorbed form (llama_hparams::is_mla): K/V head sizes
        before absorption are given, the cache holds latent rows."""
        return self.n_embd_head_k_mla != 0 and self.n_embd_head_v_mla != 0

    def is_swa(self, il: int) -> bool:
        return self.n_swa > 0 and self.swa_pattern > 0 and il % self.swa_pattern < self.swa_pattern - 1

    def rope_base(self, il: int) -> float:
        return self.rope_freq_base_swa if self.is_swa(il) else self.rope_freq_base


def _get(kv: dict, key: str, default=None, required=True):
    if key in kv:
        return kv[key]
    if required and default is None:
        raise LLMLabError(f"GGUF metadata is missing {key!r}")
    return default


def _scalar(v, key: str) -> int:
    if isinstance(v, (list, tuple)) or hasattr(v, "__len__") and not isinstance(v, str):
        vals = set(int(x) for x in v)
        if len(vals) != 1:
            raise LLMLabError(f"{key}: per-layer values {sorted(vals)} are not supported")
        return vals.pop()
    return int(v)


def load_hparams(kv: dict, n_vocab: int | None = None) -> HParams:
    kv = Metadata.of(kv)   # every key read below is type- and range-checked (llmlab.ggml.gguf.meta)
    arch = kv.get("general.architecture")
    if arch is None:
        raise LLMLabError("GGUF metadata has no general.architecture")
    spec = get_arch(arch)
    a = arch + "."
    n_embd = int(_get(kv, a + "embedding_length"))
    n_head = _scalar(_get(kv, a + "attention.head_count"), a + "attention.head_count")
    n_head_kv = _scalar(kv.get(a + "attention.head_count_kv", n_head), a + "attention.head_count_kv")
    if n_head <= 0 or n_head_kv <= 0 or n_head % n_head_kv:
        raise LLMLabError(f"{arch}: head_count {n_head} is not a multiple of head_count_kv {n_head_kv}")
    head_k = int(kv.get(a + "attention.key_length", n_embd // n_head))
    head_v = int(kv.get(a + "attention.value_length", n_embd // n_head))
    if n_vocab is None:
        n_vocab = int(kv.get(a + "vocab_size", 0)) or len(kv.get("tokenizer.ggml.tokens", []))
    hp = HParams(
        arch=arch, n_vocab=n_vocab,
        n_ctx_train=int(_get(kv, a + "context_length")),
        n_embd=n_embd, n_layer=int(_get(kv, a + "block_count")),
        n_ff=_scalar(_get(kv, a + "feed_forward_length"), a + "feed_forward_length"),
        n_head=n_head, n_head_kv=n_head_kv, n_embd_head_k=head_k, n_embd_head_v=head_v,
        n_rot=int(kv.get(a + "rope.dimension_count", head_k)),
        f_norm_rms_eps=float(_get(kv, a + "attention.layer_norm_rms_epsilon")),
        rope_freq_base=float(kv.get(a + "rope.freq_base", 10000.0)),
        rope_freq_scale=1.0 / float(kv.get(a + "rope.scaling.factor", 1.0) or 1.0),
        n_swa=int(kv.get(a + "attention.sliding_window", 0)),
    )
    hp.rope_freq_base_swa = hp.rope_freq_base
    hp.n_expert = int(kv.get(a + "expert_count", 0))
    hp.n_expert_used = _scalar(kv.get(a + "expert_used_count", 0), a + "expert_used_count")
    hp.n_ff_exp = _scalar(kv.get(a + "expert_feed_forward_length", 0), a + "expert_feed_forward_length")
    if hp.n_expert_used > hp.n_expert or (hp.n_expert > 0) != (hp.n_expert_used > 0):
        raise LLMLabError(f"{arch}: expert_used_count {hp.n_expert_used} does not fit expert_count {hp.n_expert}")
    for name, value in spec.hparams.items():       # the facts llama.cpp hard-codes for the architecture
        setattr(hp, name, value)
    if spec.load_hparams is not None:              # the architecture's own branch of load_hparams
        spec.load_hparams(hp, kv)
    return hp
