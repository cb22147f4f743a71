"""Qwen3-MoE (``LLM_ARCH_QWEN3MOE``): Qwen3's attention (QK-norm) with a mixture of experts as the FFN.

Each layer has a router (``ffn_gate_inp``: one score per expert), ``expert_count`` SiLU-gated experts
stacked in three 3-D tensors (``ffn_{gate,up,down}_exps``) and no shared expert. A token's scores go
through a softmax, its ``expert_used_count`` best experts are kept, their weights renormalized to sum
1 (``build_moe_ffn`` with ``norm_w = true``), and the experts' outputs mixed by those weights
(src/models/qwen3moe.cpp). An expert's width is ``expert_feed_forward_length`` (Qwen3-30B-A3B: 128
experts of 768, 8 used per token).
"""
from __future__ import annotations

from . import spec as S
from .qwen3 import BuildQwen3


class BuildQwen3MoE(BuildQwen3):
    """llm_build_qwen3moe: qwen3's layer with build_moe_ffn in place of the dense FFN."""

    def build_ffn_block(self, L, cur, il: int):
        hp = self.hparams
        return self.build_moe_ffn(cur, L.ffn_gate_inp, L.ffn_up_exps, L.ffn_gate_exps, L.ffn_down_exps, None,
                                  hp.n_expert, hp.n_expert_used, True, hp.expert_weights_scale, "softmax", il)


def _load_hparams(hp, kv: dict) -> None:
    from ... import LLMLabError
    if hp.n_expert == 0 or hp.n_expert_used == 0:
        raise LLMLabError("qwen3moe: expert_count and expert_used_count must be > 0")


def _tiny_kv(hd: int, n_vocab: int, sliding_window: int) -> dict:
    return {"rope.freq_base": 1000000.0, "attention.key_length": hd, "attention.value_length": hd,
            "expert_count": 4, "expert_used_count": 2, "expert_feed_forward_length": 64}


# tiny random models of it that the llama.cpp comparisons draw from (llmlab.llama.tiny_zoo)
TINY_SHAPES = (
    dict(n_layer=2, n_embd=64, n_head=4, n_head_kv=2, head_dim=32, n_ff=128,
         kv={"expert_count": 4, "expert_used_count": 2, "expert_feed_forward_length": 64}),
    dict(n_layer=2, n_embd=64, n_head=3, n_head_kv=1, head_dim=32, n_ff=128,        # one expert per token
         kv={"expert_count": 8, "expert_used_count": 1, "expert_feed_forward_length": 32}),
    dict(n_layer=3, n_embd=96, n_head=5, n_head_kv=5, head_dim=32, n_ff=96,
         kv={"expert_count": 6, "expert_used_count": 3, "expert_feed_forward_length": 64}),
)

SPEC = S.ArchSpec(
    name="qwen3moe",
    builder=BuildQwen3MoE,
    layer_tensors=(S.ATTN_NORM, S.ATTN_Q, S.ATTN_K, S.ATTN_V, S.ATTN_OUT)
    + tuple(t.not_required() for t in (S.ATTN_Q_B, S.ATTN_K_B, S.ATTN_V_B))
    + (S.ATTN_K_NORM, S.ATTN_Q_NORM, S.FFN_NORM, S.FFN_GATE_INP, S.FFN_GATE_EXPS, S.FFN_DOWN_EXPS, S.FFN_UP_EXPS),
    hparams=dict(rope_type=S.LLAMA_ROPE_TYPE_NEOX),
    load_hparams=_load_hparams,
    tiny_kv=_tiny_kv,
    tiny_shapes=TINY_SHAPES,
)
