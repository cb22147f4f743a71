"""Qwen3 (``LLM_ARCH_QWEN3``): Qwen2's layer without the q/k/v biases, plus QK-norm.

QK-norm: each head's query and key vectors go through an RMSNorm with their own weights
(``attn_q_norm``, ``attn_k_norm``, one value per head dimension, shared by all heads) before RoPE.
That is the whole difference from qwen2 in llama.cpp (src/models/qwen3.cpp): the biases become
optional (``create_tensor_qkv``), the attention is scaled by 1/sqrt(head size), RoPE is NEOX, and
the head size is its own key (``attention.key_length``: Qwen3-0.6B has 16 heads of 128 in an
embedding of 1024).
"""
from __future__ import annotations

from . import spec as S
from .llama import BLOCK_STEPS
from .qwen2 import BuildQwen2


class BuildQwen3(BuildQwen2):
    """llm_build_qwen3: qwen2's steps, with Q and K normalized per head before RoPE."""

    def build_qk_rope(self, L, Qcur, Kcur, inp_pos, il: int):
        Qcur = self.cb(self.build_norm(Qcur, L.attn_q_norm, il), "Qcur_normed", il)
        Qcur = self.build_rope(Qcur, inp_pos)
        Kcur = self.cb(self.build_norm(Kcur, L.attn_k_norm, il), "Kcur_normed", il)
        return Qcur, self.build_rope(Kcur, inp_pos)


def _tiny_kv(hd: int, n_vocab: int, sliding_window: int) -> dict:
    return {"rope.freq_base": 1000000.0, "attention.key_length": hd, "attention.value_length": hd}


# tiny random models of it that the llama.cpp comparisons draw from (llmlab.llama.tiny_zoo)
TINY_SHAPES = (
    dict(n_layer=2, n_embd=64, n_head=4, n_head_kv=2, head_dim=32, n_ff=128),
    dict(n_layer=3, n_embd=96, n_head=5, n_head_kv=1, head_dim=32, n_ff=96),        # odd heads, MQA
    dict(n_layer=2, n_embd=64, n_head=3, n_head_kv=3, head_dim=64, n_ff=64),        # head size != n_embd / n_head
)

SPEC = S.ArchSpec(
    name="qwen3",
    builder=BuildQwen3,
    layer_tensors=(S.LAYER_TENSORS + tuple(t.not_required() for t in (S.ATTN_Q_B, S.ATTN_K_B, S.ATTN_V_B))
                   + (S.ATTN_K_NORM, S.ATTN_Q_NORM)),
    hparams=dict(rope_type=S.LLAMA_ROPE_TYPE_NEOX),
    tiny_kv=_tiny_kv,
    # qwen2's layer without the biases, Q and K normalized per head before RoPE
    block_steps=(BLOCK_STEPS[0],
                 ("Qcur", "Q, K, V projections\nRMSNorm per head on Q and K\nRoPE on Q and K", "attn"),
                 ("kqv_out", "attention, output projection\nkq → kq_soft_max → kqv_out", "attn")) + BLOCK_STEPS[4:],
    tiny_shapes=TINY_SHAPES,
)
