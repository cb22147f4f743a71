"""Qwen2 (``LLM_ARCH_QWEN2``): LLaMA's layer with q/k/v biases and NEOX RoPE.

Hparams: the shared keys, NEOX RoPE (``llama_model_rope_type``). Tensors (``load_tensors``): the shared
layer plus *required* q/k/v biases; the LM head may be tied and may have a bias (``output.bias``).
Graph: ``llm_build_qwen2`` (src/models/qwen2.cpp).
"""
from __future__ import annotations

import math

from ...ggml import ops as ggml
from ..graph import LLMGraph
from . import spec as S


class BuildQwen2(LLMGraph):
    def build(self) -> None:
        m, hp, ctx0 = self.model, self.hparams, self.ctx0
        n_embd_head = hp.n_embd_head_v
        inpL = self.build_inp_embd(m.tok_embd)
        inp_pos = self.build_inp_pos()
        self.build_attn_inp()
        inp_out_ids = self.build_inp_out_ids()
        self.mark_layer(-1)

        for il in range(hp.n_layer):
            L = m.layers[il]
            inpSA = inpL
            cur = self.build_norm(inpL, L.attn_norm, il)
            self.cb(cur, "attn_norm", il)

            Qcur, Kcur, Vcur = self.build_qkv(L, cur, il)      # with the biases
            Qcur = self.cb(self.build_rope(Qcur, inp_pos), "Qcur", il)
            Kcur = self.cb(self.build_rope(Kcur, inp_pos), "Kcur", il)
            self.cb(Vcur, "Vcur", il)
            cur = self.build_attn(L.wo, Qcur, Kcur, Vcur, 1.0 / math.sqrt(n_embd_head), il)
            if il == hp.n_layer - 1:
                cur = ggml.get_rows(ctx0, cur, inp_out_ids)
                inpSA = ggml.get_rows(ctx0, inpSA, inp_out_ids)
            ffn_inp = self.cb(ggml.add(ctx0, cur, inpSA), "ffn_inp", il)

            cur = self.build_norm(ffn_inp, L.ffn_norm, il)
            self.cb(cur, "ffn_norm", il)
            cur = self.build_ffn(cur, L.ffn_up, L.ffn_gate, L.ffn_down, "silu", il)
            self.cb(cur, "ffn_out", il)
            cur = self.cb(ggml.add(ctx0, cur, ffn_inp), "l_out", il)
            inpL = cur
            self.mark_layer(il)

        self.build_output(inpL)


def _tiny_kv(hd: int, n_vocab: int, sliding_window: int) -> dict:
    return {"rope.freq_base": 1000000.0}


SPEC = S.ArchSpec(
    name="qwen2",
    builder=BuildQwen2,
    layer_tensors=S.LAYER_TENSORS + (S.ATTN_Q_B, S.ATTN_K_B, S.ATTN_V_B),
    model_tensors=S.MODEL_TENSORS + (S.OUTPUT_B,),
    hparams=dict(rope_type=S.LLAMA_ROPE_TYPE_NEOX),
    tiny_kv=_tiny_kv,
)
