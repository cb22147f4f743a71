"""LLaMA (``LLM_ARCH_LLAMA``): SmolLM2 and the LLaMA family.

Its hparams are the shared ones with NORM RoPE; its tensors the shared layer (pre-norm attention, gated
SiLU FFN) with optional q/k/v/output biases (``TENSOR_NOT_REQUIRED``); its graph ``llm_build_llama``
(src/models/llama.cpp).
"""
from __future__ import annotations

import numpy as np

from ...ggml import ops as ggml
from ..graph import LLMGraph
from . import spec as S


class BuildLlama(LLMGraph):
    name_attn_out = True      # llm_build_llama names the projected attention output "attn_out"

    def build(self) -> None:
        m, hp, ctx0 = self.model, self.hparams, self.ctx0
        n_embd_head = hp.n_embd_head_v
        inpL = self.build_inp_embd(m.tok_embd)
        inp_pos = self.build_inp_pos()
        self.build_attn_inp()
        # 1.0f/sqrtf(float(n_embd_head)): in float, as llama.cpp (a double 1/sqrt can round differently)
        kq_scale = hp.f_attention_scale or float(np.float32(1.0) / np.sqrt(np.float32(n_embd_head)))
        inp_out_ids = self.build_inp_out_ids()
        self.mark_layer(-1)

        for il in range(hp.n_layer):
            L = m.layers[il]
            inpSA = inpL
            cur = self.build_norm(inpL, L.attn_norm, il)
            self.cb(cur, "attn_norm", il)

            Qcur, Kcur, Vcur = self.build_qkv(L, cur, il)
            Qcur, Kcur = self.build_qk_rope(L, Qcur, Kcur, inp_pos, il)
            self.cb(Qcur, "Qcur", il)
            self.cb(Kcur, "Kcur", il)
            self.cb(Vcur, "Vcur", il)

            cur = self.build_attn(L.wo, Qcur, Kcur, Vcur, kq_scale, il, wo_b=getattr(L, "bo", None))
            if self.name_attn_out:
                self.cb(cur, "attn_out", il)
            if il == hp.n_layer - 1:
                cur = ggml.get_rows(ctx0, cur, inp_out_ids)
                inpSA = ggml.get_rows(ctx0, inpSA, inp_out_ids)
            ffn_inp = self.cb(ggml.add(ctx0, cur, inpSA), "ffn_inp", il)

            cur = self.build_norm(ffn_inp, L.ffn_norm, il)
            self.cb(cur, "ffn_norm", il)
            cur = self.build_ffn_block(L, cur, il)
            cur = self.cb(ggml.add(ctx0, cur, ffn_inp), "ffn_out", il)
            self.cb(cur, "l_out", il)
            inpL = cur
            self.mark_layer(il)

        self.build_output(inpL)

    def build_ffn_block(self, L, cur, il: int):
        """The FFN of a layer: a dense SiLU-gated FFN (Qwen3-MoE: a mixture of experts)."""
        return self.cb(self.build_ffn(cur, L.ffn_up, L.ffn_gate, L.ffn_down, "silu", il), "ffn_out", il)

    def build_qk_rope(self, L, Qcur, Kcur, inp_pos, il: int):
        """What happens to Q and K between the projections and the attention: RoPE (Qwen3 normalizes
        each head first: ``arch/qwen3.py`` overrides this one step)."""
        return self.build_rope(Qcur, inp_pos), self.build_rope(Kcur, inp_pos)


def _tiny_kv(hd: int, n_vocab: int, sliding_window: int) -> dict:
    return {"rope.freq_base": 10000.0, "rope.dimension_count": hd, "vocab_size": n_vocab}


# one layer as notebook 03 draws it: the builder's named nodes, in graph order
BLOCK_STEPS = (
    ("attn_norm", "RMSNorm × w\nattn_norm", "norm"), ("Qcur", "Q, K, V projections\nRoPE on Q and K\nQcur, Kcur, Vcur", "attn"),
    ("kqv_out", "attention\nkq → kq_soft_max → kqv_out", "attn"), ("attn_out", "output projection\nattn_out", "attn"),
    ("ffn_inp", "+ (residual)\nffn_inp", "add"), ("ffn_norm", "RMSNorm × w\nffn_norm", "norm"),
    ("ffn_swiglu", "silu(gate) * up\nffn_gate, ffn_up, ffn_swiglu", "ffn"), ("ffn_out", "down projection\nffn_out", "ffn"),
    ("l_out", "+ (residual)\nl_out", "add"))

SPEC = S.ArchSpec(
    name="llama",
    builder=BuildLlama,
    layer_tensors=S.LAYER_TENSORS + tuple(t.not_required() for t in (S.ATTN_Q_B, S.ATTN_K_B, S.ATTN_V_B, S.ATTN_OUT_B)),
    hparams=dict(rope_type=S.LLAMA_ROPE_TYPE_NORM),
    tiny_kv=_tiny_kv,
    block_steps=BLOCK_STEPS,
)
