"""llm_build_llama (src/models/llama.cpp): the graph of LLaMA-family models such as SmolLM2."""
from __future__ import annotations

import math

from ...ggml import ops as ggml
from . import register_builder
from ..graph import LLMGraph


@register_builder("llama")
class BuildLlama(LLMGraph):
    def build(self) -> None:
        m, hp, ctx0 = self.model, self.hparams, self.ctx0
        n_embd_head, n_tokens = hp.n_embd_head_v, self.n_tokens
        inpL = self.build_inp_embd(m.tok_embd)
        inp_pos = self.build_inp_pos()
        self.build_attn_inp()
        kq_scale = hp.f_attention_scale or 1.0 / math.sqrt(n_embd_head)
        inp_out_ids = self.build_inp_out_ids()
        self.mark_layer(-1)

        for il in range(hp.n_layer):
            L = m.layers[il]
            inpSA = inpL
            cur = self.build_norm(inpL, L.attn_norm, il)
            self.cb(cur, "attn_norm", il)

            Qcur = self.cb(ggml.mul_mat(ctx0, L.wq, cur), "Qcur", il)
            Kcur = self.cb(ggml.mul_mat(ctx0, L.wk, cur), "Kcur", il)
            Vcur = self.cb(ggml.mul_mat(ctx0, L.wv, cur), "Vcur", il)
            # build_qkv names the reshaped views too
            Qcur = self.cb(ggml.reshape_3d(ctx0, Qcur, n_embd_head, hp.n_head, n_tokens), "Qcur", il)
            Kcur = self.cb(ggml.reshape_3d(ctx0, Kcur, n_embd_head, hp.n_head_kv, n_tokens), "Kcur", il)
            Vcur = self.cb(ggml.reshape_3d(ctx0, Vcur, n_embd_head, hp.n_head_kv, n_tokens), "Vcur", il)

            Qcur = ggml.rope_ext(ctx0, Qcur, inp_pos, None, hp.n_rot, hp.rope_type, hp.n_ctx_train,
                                 hp.rope_freq_base, hp.rope_freq_scale)
            Kcur = ggml.rope_ext(ctx0, Kcur, inp_pos, None, hp.n_rot, hp.rope_type, hp.n_ctx_train,
                                 hp.rope_freq_base, hp.rope_freq_scale)
            self.cb(Qcur, "Qcur", il)
            self.cb(Kcur, "Kcur", il)
            self.cb(Vcur, "Vcur", il)

            cur = self.build_attn(L.wo, Qcur, Kcur, Vcur, kq_scale, il)
            self.cb(cur, "attn_out", il)
            if il == hp.n_layer - 1:
                cur = ggml.get_rows(ctx0, cur, inp_out_ids)
                inpSA = ggml.get_rows(ctx0, inpSA, inp_out_ids)
            ffn_inp = self.cb(ggml.add(ctx0, cur, inpSA), "ffn_inp", il)

            cur = self.build_norm(ffn_inp, L.ffn_norm, il)
            self.cb(cur, "ffn_norm", il)
            cur = self.build_ffn(cur, L.ffn_up, L.ffn_gate, L.ffn_down, "silu", il)
            self.cb(cur, "ffn_out", il)
            cur = self.cb(ggml.add(ctx0, cur, ffn_inp), "ffn_out", il)
            self.cb(cur, "l_out", il)
            inpL = cur
            self.mark_layer(il)

        self.build_output(inpL)
