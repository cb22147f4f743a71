"""The hyperparameters (llama_hparams, llama-hparams.h): the numbers the graph builders and the KV cache
read, and the rules derived from them (which layers are sliding-window).

They know no architecture: ``llama_model::load_hparams`` (:func:`llmlab.llama.model.load_hparams`) fills
them from the GGUF ``{arch}.*`` keys and the architecture's spec (``llmlab.llama.arch``), which sits above
this module and reads it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..ggml.ops import GGML_ROPE_TYPE_NEOX

# llama.h's llama_rope_type: which RoPE an architecture uses (the values are ggml's rope mode bits)
LLAMA_ROPE_TYPE_NORM = 0
LLAMA_ROPE_TYPE_NEOX = GGML_ROPE_TYPE_NEOX


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

    # the sliding-window rule (llama_hparams::is_masked_swa), per llama_swa_type: is the key at position p0
    # hidden from a query at p1? Plain functions of NumPy arrays (or scalars), broadcasting.
    SWA_TYPES = {
        "none": lambda n_swa, p0, p1: (p1 - p0) != (p1 - p0),
        "standard": lambda n_swa, p0, p1: p1 - p0 >= n_swa,                 # Gemma 3: the last n_swa positions
        "chunked": lambda n_swa, p0, p1: p0 < (p1 // n_swa) * n_swa,        # only the query's own chunk
        "symmetric": lambda n_swa, p0, p1: (p1 - p0 < -(n_swa // 2)) | (p1 - p0 > n_swa // 2),
    }

    @staticmethod
    def is_masked_swa(n_swa: int, swa_type: str, p0, p1):
        """True where a query at position ``p1`` may not see a key at ``p0`` because of the window
        (scalars or arrays, broadcast). ``standard`` (Gemma 3): masked when ``p1 - p0 >= n_swa``."""
        import numpy as np
        return HParams.SWA_TYPES[swa_type](n_swa, np.asarray(p0), np.asarray(p1))

    def rope_base(self, il: int) -> float:
        return self.rope_freq_base_swa if self.is_swa(il) else self.rope_freq_base
