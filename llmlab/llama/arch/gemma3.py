"""Gemma 3 (``LLM_ARCH_GEMMA3``): local (sliding-window) and global layers.

Hparams: NEOX RoPE, five local layers of every six with their own RoPE base (10000), embeddings scaled
by sqrt(n_embd), 1/sqrt(head size) as attention scale. Tensors: the shared layer plus Q/K norms and
post-attention / post-FFN norms. Graph: ``llm_build_gemma3`` (src/models/gemma3.cpp, the iswa variant).
"""
from __future__ import annotations

import math

import numpy as np

from ...ggml import ops as ggml
from ..graph import LLMGraph
from . import spec as S


class BuildGemma3(LLMGraph):
    def build(self) -> None:
        m, hp, ctx0 = self.model, self.hparams, self.ctx0
        n_embd_head, n_tokens = hp.n_embd_head_k, self.n_tokens
        inpL = self.build_inp_embd(m.tok_embd)
        inpL = self.cb(ggml.scale(ctx0, inpL, float(np.sqrt(np.float32(hp.n_embd), dtype=np.float32))), "inp_scaled", -1)
        inp_pos = self.build_inp_pos()
        self.build_attn_inp()
        inp_out_ids = self.build_inp_out_ids()
        self.mark_layer(-1)

        for il in range(hp.n_layer):
            L = m.layers[il]
            freq_base_l = hp.rope_base(il)
            cur = self.build_norm(inpL, L.attn_norm, il)
            self.cb(cur, "attn_norm", il)

            Qcur = self.cb(ggml.mul_mat(ctx0, L.wq, cur), "Qcur", il)
            Kcur = self.cb(ggml.mul_mat(ctx0, L.wk, cur), "Kcur", il)
            Vcur = self.cb(ggml.mul_mat(ctx0, L.wv, cur), "Vcur", il)
            Qcur = ggml.reshape_3d(ctx0, Qcur, n_embd_head, hp.n_head, n_tokens)
            Kcur = ggml.reshape_3d(ctx0, Kcur, n_embd_head, hp.n_head_kv, n_tokens)
            Vcur = ggml.reshape_3d(ctx0, Vcur, n_embd_head, hp.n_head_kv, n_tokens)

            Qcur = self.build_norm(Qcur, L.attn_q_norm, il)
            self.cb(Qcur, "Qcur_normed", il)
            Qcur = self.build_rope(Qcur, inp_pos, freq_base_l)
            Kcur = self.build_norm(Kcur, L.attn_k_norm, il)
            self.cb(Kcur, "Kcur_normed", il)
            Kcur = self.build_rope(Kcur, inp_pos, freq_base_l)
            self.cb(Qcur, "Qcur", il)
            self.cb(Kcur, "Kcur", il)
            self.cb(Vcur, "Vcur", il)

            Qcur = ggml.scale(ctx0, Qcur, hp.f_attention_scale or 1.0 / math.sqrt(n_embd_head))
            cur = self.build_attn(L.wo, Qcur, Kcur, Vcur, 1.0, il)
            if il == hp.n_layer - 1:
                cur = ggml.get_rows(ctx0, cur, inp_out_ids)
                inpL = ggml.get_rows(ctx0, inpL, inp_out_ids)
            cur = self.build_norm(cur, L.attn_post_norm, il)
            self.cb(cur, "attn_post_norm", il)
            sa_out = self.cb(ggml.add(ctx0, cur, inpL), "sa_out", il)

            cur = self.build_norm(sa_out, L.ffn_norm, il)
            self.cb(cur, "ffn_norm", il)
            cur = self.build_ffn(cur, L.ffn_up, L.ffn_gate, L.ffn_down, "gelu", il)
            self.cb(cur, "ffn_out", il)
            cur = self.build_norm(cur, L.ffn_post_norm, -1)
            self.cb(cur, "ffn_post_norm", il)
            cur = ggml.add(ctx0, cur, sa_out)
            self.cb(cur, "l_out", il)
            inpL = cur
            self.mark_layer(il)

        self.build_output(inpL)


def _load_hparams(hp, kv: dict) -> None:
    # llama_model::load_hparams: 1/sqrt(head size) (the 27B uses n_embd/n_head instead)
    hp.f_attention_scale = (1.0 / math.sqrt(hp.n_embd / hp.n_head) if hp.n_layer == 62
                            else 1.0 / math.sqrt(hp.n_embd_head_k))


def _tiny_kv(hd: int, n_vocab: int, sliding_window: int) -> dict:
    return {"rope.freq_base": 1000000.0, "attention.key_length": hd, "attention.value_length": hd,
            "attention.sliding_window": sliding_window}


SPEC = S.ArchSpec(
    name="gemma3",
    builder=BuildGemma3,
    layer_tensors=S.LAYER_TENSORS + (S.ATTN_Q_NORM, S.ATTN_K_NORM, S.ATTN_POST_NORM, S.FFN_POST_NORM),
    hparams=dict(rope_type=S.LLAMA_ROPE_TYPE_NEOX, swa_pattern=6, rope_freq_base_swa=10000.0, embd_scale=True),
    load_hparams=_load_hparams,
    tiny_kv=_tiny_kv,
    ffn_act="gelu",
    residual_mid="sa_out",
    block_steps=(
        ("attn_norm", "RMSNorm × w\nattn_norm", "norm"),
        ("Qcur", "Q, K, V projections\nRMSNorm of Q and K per head\nRoPE on Q and K", "attn"),
        ("kqv_out", "attention\nkq → kq_soft_max → kqv_out", "attn"), ("attn_post_norm", "RMSNorm × w\nattn_post_norm", "norm"),
        ("sa_out", "+ (residual)\nsa_out", "add"), ("ffn_norm", "RMSNorm × w\nffn_norm", "norm"),
        ("ffn_geglu", "gelu(gate) * up\nffn_gate, ffn_up, ffn_geglu", "ffn"), ("ffn_out", "down projection\nffn_out", "ffn"),
        ("ffn_post_norm", "RMSNorm × w\nffn_post_norm", "norm"), ("l_out", "+ (residual)\nl_out", "add")),
    chat_template="gemma",
)
