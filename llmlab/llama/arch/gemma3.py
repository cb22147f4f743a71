"""llm_build_gemma3 (src/models/gemma3.cpp, the iswa variant): Gemma 3 with local and global layers."""
from __future__ import annotations

import math

import numpy as np

from ...ggml import ops as ggml
from . import register_builder
from ..graph import LLMGraph


@register_builder("gemma3")
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
            Qcur = ggml.rope_ext(ctx0, Qcur, inp_pos, None, hp.n_rot, hp.rope_type, hp.n_ctx_train,
                                 freq_base_l, hp.rope_freq_scale)
            Kcur = self.build_norm(Kcur, L.attn_k_norm, il)
            self.cb(Kcur, "Kcur_normed", il)
            Kcur = ggml.rope_ext(ctx0, Kcur, inp_pos, None, hp.n_rot, hp.rope_type, hp.n_ctx_train,
                                 freq_base_l, hp.rope_freq_scale)
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
