"""DeepSeek-V2/V3 (``LLM_ARCH_DEEPSEEK2``, also Kimi K2): multi-head latent attention and a mixture of experts.

Attention (MLA, in the absorbed form llama.cpp runs, src/models/deepseek2.cpp):

- q: ``attn_q_a`` -> RMSNorm ``attn_q_a_norm`` -> ``attn_q_b`` (q_lora_rank > 0), or one ``attn_q``
  (q_lora_rank = 0, DeepSeek-V2-Lite); per head ``key_length_mla`` values: ``q_nope`` (no position)
  then ``q_pe`` (RoPE'd, ``rope.dimension_count`` of them: the decoupled RoPE dimensions);
- kv: ``attn_kv_a_mqa`` gives per token one compressed row ``kv_cmpr`` (kv_lora_rank values, then
  RMSNorm ``attn_kv_a_norm``) and one ``k_pe`` shared by all heads (RoPE'd);
- absorption: instead of decompressing K for every head, each head's ``q_nope`` is multiplied by its
  ``attn_k_b`` (into the latent space), so the scores are ``[q_nope k_b | q_pe] . [kv_cmpr | k_pe]``:
  one K head of kv_lora_rank + n_rot for all query heads (MQA). The cache keeps just that row; the
  attention output (in the latent space, V = kv_cmpr) is decompressed per head by ``attn_v_b``
  (``v_mla`` of build_attn), then ``attn_output``.

FFN: the first ``leading_dense_block_count`` layers are dense; the others are a mixture of experts
(softmax or sigmoid gating, ``exp_probs_b`` selection bias, top-k, optional renormalization and
``expert_weights_scale``) plus ``expert_shared_count`` shared experts every token goes through.
"""
from __future__ import annotations

import numpy as np

from ... import LLMLabError
from ...ggml import ops as ggml
from ..graph import LLMGraph
from . import spec as S

LLAMA_EXPERT_GATING_FUNC_TYPE_NONE, LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX, LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID = 0, 1, 2
GATING = {LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX: "softmax", LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID: "sigmoid"}


def _nope(hp) -> int:
    return hp.n_embd_head_k_mla - hp.n_rot


def _q_lora(hp, il) -> bool:
    return hp.n_lora_q > 0


def _dense(hp, il) -> bool:
    return il < hp.n_layer_dense_lead


def _moe(hp, il) -> bool:
    return il >= hp.n_layer_dense_lead


_blk = S._blk
ATTN_Q_A_NORM = _blk("attn_q_a_norm", "attn_q_a_norm", lambda hp: (hp.n_lora_q,), init="norm").only(_q_lora)
ATTN_KV_A_NORM = _blk("attn_kv_a_norm", "attn_kv_a_norm", lambda hp: (hp.n_lora_kv,), init="norm")
ATTN_Q_A = _blk("wq_a", "attn_q_a", lambda hp: (hp.n_embd, hp.n_lora_q)).only(_q_lora)
ATTN_Q_B = _blk("wq_b", "attn_q_b", lambda hp: (hp.n_lora_q, hp.n_head * hp.n_embd_head_k_mla)).only(_q_lora)
ATTN_Q = _blk("wq", "attn_q", lambda hp: (hp.n_embd, hp.n_head * hp.n_embd_head_k_mla)).only(lambda hp, il: hp.n_lora_q == 0)
ATTN_KV_A_MQA = _blk("wkv_a_mqa", "attn_kv_a_mqa", lambda hp: (hp.n_embd, hp.n_lora_kv + hp.n_rot))
ATTN_K_B = _blk("wk_b", "attn_k_b", lambda hp: (_nope(hp), hp.n_lora_kv, hp.n_head))
ATTN_V_B = _blk("wv_b", "attn_v_b", lambda hp: (hp.n_lora_kv, hp.n_embd_head_v_mla, hp.n_head))
ATTN_OUT = _blk("wo", "attn_output", lambda hp: (hp.n_head * hp.n_embd_head_v_mla, hp.n_embd))


class BuildDeepseek2(LLMGraph):
    """llm_build_deepseek2 (its MLA branch)."""

    def build_attn_inp(self) -> None:
        """build_attn_inp_k: the cells to write and the KQ mask (no V cells: the cache has K rows only)."""
        self._input("k_idxs", ggml.I32, self.n_tokens)
        self._input("kq_mask", ggml.F32, self.kv.n_kv[0], self.n_tokens)

    def build(self) -> None:
        m, hp, ctx0 = self.model, self.hparams, self.ctx0
        n_tokens, n_head, n_rot, kv_lora = self.n_tokens, hp.n_head, hp.n_rot, hp.n_lora_kv
        n_embd_head_k = hp.n_embd_head_k_mla
        nope = n_embd_head_k - n_rot
        # mscale = 1 without YaRN: 1.0f * mscale * mscale / sqrtf(float(n_embd_head_k)), in float
        kq_scale = float(np.float32(1.0) / np.sqrt(np.float32(n_embd_head_k)))
        inpL = self.build_inp_embd(m.tok_embd)
        inp_pos = self.build_inp_pos()
        self.build_attn_inp()
        inp_out_ids = self.build_inp_out_ids()
        self.mark_layer(-1)

        for il in range(hp.n_layer):
            L = m.layers[il]
            inpSA = inpL
            cur = self.cb(self.build_norm(inpL, L.attn_norm, il), "attn_norm", il)

            if L.wq is None:                                         # the low-rank q path
                q = self.cb(ggml.mul_mat(ctx0, L.wq_a, cur), "q", il)
                q = self.cb(self.build_norm(q, L.attn_q_a_norm, il), "q", il)
                q = self.cb(ggml.mul_mat(ctx0, L.wq_b, q), "q", il)
            else:
                q = self.cb(ggml.mul_mat(ctx0, L.wq, cur), "q", il)
            q = self.cb(ggml.reshape_3d(ctx0, q, n_embd_head_k, n_head, n_tokens), "q", il)

            kv_cmpr_pe = self.cb(ggml.mul_mat(ctx0, L.wkv_a_mqa, cur), "kv_cmpr_pe", il)
            row = kv_cmpr_pe.type.row_size(kv_lora + n_rot)
            kv_cmpr = self.cb(ggml.view_2d(ctx0, kv_cmpr_pe, kv_lora, n_tokens, row, 0), "kv_cmpr", il)
            k_pe = ggml.view_3d(ctx0, kv_cmpr_pe, n_rot, 1, n_tokens, row, row, kv_cmpr_pe.type.row_size(kv_lora))
            self.cb(k_pe, "k_pe", il)
            k_pe = self.cb(self.build_rope(k_pe, inp_pos), "k_pe", il)
            kv_cmpr = self.cb(self.build_norm(kv_cmpr, L.attn_kv_a_norm, il), "kv_cmpr", il)

            q_nope = self.cb(ggml.view_3d(ctx0, q, nope, n_head, n_tokens, q.nb[1], q.nb[2], 0), "q_nope", il)
            q_pe = ggml.view_3d(ctx0, q, n_rot, n_head, n_tokens, q.nb[1], q.nb[2], q.type.row_size(nope))
            self.cb(q_pe, "q_pe", il)
            q_pe = self.cb(self.build_rope(q_pe, inp_pos), "q_pe", il)
            q_nope = self.cb(ggml.permute(ctx0, q_nope, 0, 2, 1, 3), "q_nope_perm", il)        # [nope, n_tokens, n_head]
            q_nope_absorbed = self.cb(ggml.mul_mat(ctx0, L.wk_b, q_nope), "q_nope_absorbed", il)   # [kv_lora, n_tokens, n_head]
            q_nope_absorbed = self.cb(ggml.permute(ctx0, q_nope_absorbed, 0, 2, 1, 3), "q_nope_absorbed_perm", il)
            Qcur = self.cb(ggml.concat(ctx0, q_nope_absorbed, q_pe, 0), "Qcur", il)   # [kv_lora + n_rot, n_head, n_tokens]
            kv_cmpr = self.cb(ggml.reshape_3d(ctx0, kv_cmpr, kv_lora, 1, n_tokens), "kv_cmpr_reshape", il)
            Kcur = self.cb(ggml.concat(ctx0, kv_cmpr, k_pe, 0), "Kcur", il)           # [kv_lora + n_rot, 1, n_tokens]
            Vcur = self.cb(kv_cmpr, "Vcur", il)                                        # the latent is V
            cur = self.build_attn_k(L.wo, Qcur, Kcur, Vcur, kq_scale, il, v_mla=L.wv_b)

            if il == hp.n_layer - 1:
                cur = ggml.get_rows(ctx0, cur, inp_out_ids)
                inpSA = ggml.get_rows(ctx0, inpSA, inp_out_ids)
            ffn_inp = self.cb(ggml.add(ctx0, cur, inpSA), "ffn_inp", il)
            cur = self.cb(self.build_norm(ffn_inp, L.ffn_norm, il), "ffn_norm", il)

            if il < hp.n_layer_dense_lead:
                cur = self.cb(self.build_ffn(cur, L.ffn_up, L.ffn_gate, L.ffn_down, "silu", il), "ffn_out", il)
            else:
                moe_out = self.build_moe_ffn(cur, L.ffn_gate_inp, L.ffn_up_exps, L.ffn_gate_exps, L.ffn_down_exps,
                                             L.ffn_exp_probs_b, hp.n_expert, hp.n_expert_used, hp.expert_weights_norm,
                                             hp.expert_weights_scale, GATING[hp.expert_gating_func], il)
                shexp = self.cb(self.build_ffn(cur, L.ffn_up_shexp, L.ffn_gate_shexp, L.ffn_down_shexp, "silu", il),
                                "ffn_shexp", il)
                cur = self.cb(ggml.add(ctx0, moe_out, shexp), "ffn_out", il)
            cur = self.cb(ggml.add(ctx0, cur, ffn_inp), "l_out", il)
            inpL = cur
            self.mark_layer(il)

        self.build_output(inpL)


def _load_hparams(hp, kv: dict) -> None:
    """llama_model_deepseek2::load_arch_hparams."""
    a = "deepseek2."
    n_vocab = int(kv.get(a + "vocab_size", 0)) or len(kv.get("tokenizer.ggml.tokens", []))
    is_lite = hp.n_layer in (26, 27) or (hp.n_layer == 48 and n_vocab == 128256)

    def need(key: str):
        if a + key not in kv:
            raise LLMLabError(f"GGUF metadata is missing {a + key!r}")
        return kv[a + key]

    hp.n_layer_dense_lead = int(kv.get(a + "leading_dense_block_count", 0))
    hp.n_lora_q = 0 if is_lite else int(need("attention.q_lora_rank"))
    hp.n_lora_kv = int(need("attention.kv_lora_rank"))
    hp.n_embd_head_k_mla = int(kv.get(a + "attention.key_length_mla", 0))
    hp.n_embd_head_v_mla = int(kv.get(a + "attention.value_length_mla", 0))
    need("expert_feed_forward_length")
    hp.n_expert_shared = int(need("expert_shared_count"))
    hp.expert_weights_scale = float(kv.get(a + "expert_weights_scale", 0.0))
    hp.expert_weights_norm = bool(kv.get(a + "expert_weights_norm", False))
    hp.expert_gating_func = int(kv.get(a + "expert_gating_func", LLAMA_EXPERT_GATING_FUNC_TYPE_NONE))
    if hp.expert_gating_func == LLAMA_EXPERT_GATING_FUNC_TYPE_NONE:     # DeepSeek V2 / V2.5 files do not say
        glm_lite = hp.n_layer in (47, 48) and n_vocab == 154880
        hp.expert_gating_func = LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID if glm_lite else LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX
    if hp.expert_gating_func not in GATING:
        raise LLMLabError(f"deepseek2: expert_gating_func {hp.expert_gating_func} is not implemented "
                          f"(known: {', '.join(f'{k} {v}' for k, v in GATING.items())})")
    if not hp.is_mla:
        raise LLMLabError("deepseek2: this file has no attention.key_length_mla/value_length_mla (a legacy "
                          "attn_kv_b file); llmlab runs the absorbed MLA form (attn_k_b, attn_v_b) only")
    if hp.n_head_kv != 1 or hp.n_embd_head_k != hp.n_lora_kv + hp.n_rot or hp.n_embd_head_v != hp.n_lora_kv:
        raise LLMLabError(f"deepseek2: MLA needs head_count_kv 1, key_length = kv_lora_rank + n_rot "
                          f"({hp.n_lora_kv + hp.n_rot}) and value_length = kv_lora_rank ({hp.n_lora_kv}); the file "
                          f"has {hp.n_head_kv}, {hp.n_embd_head_k}, {hp.n_embd_head_v}")
    if not 0 < hp.n_rot < hp.n_embd_head_k_mla:
        raise LLMLabError(f"deepseek2: rope.dimension_count {hp.n_rot} must be below key_length_mla {hp.n_embd_head_k_mla}")
    if hp.n_layer_dense_lead < hp.n_layer and (hp.n_expert == 0 or hp.n_expert_used == 0):
        raise LLMLabError("deepseek2: expert_count and expert_used_count must be > 0")
    if str(kv.get(a + "rope.scaling.type", "none")) == "yarn" or kv.get(a + "attention.temperature_scale"):
        raise LLMLabError("deepseek2: YaRN RoPE scaling and attention temperature scaling are not implemented "
                          "in llmlab (DeepSeek-V2-Lite and V3 files use YaRN)")


def _make_memory(hp, n_ctx: int, type_k: str, type_v: str, n_seq_max: int, n_ubatch: int):
    from ..kv_cache_mla import KVCacheMLA
    return KVCacheMLA(n_ctx, hp.n_layer, hp.n_embd_k_gqa, hp.n_lora_kv, type_k=type_k, n_seq_max=n_seq_max)


def _tiny_kv(hd: int, n_vocab: int, sliding_window: int) -> dict:
    kv_lora, n_rot, nope, v_mla = 32, 16, 32, 32
    return {"rope.freq_base": 10000.0, "rope.dimension_count": n_rot, "vocab_size": n_vocab,
            "attention.q_lora_rank": 32, "attention.kv_lora_rank": kv_lora,
            "attention.key_length": kv_lora + n_rot, "attention.value_length": kv_lora,
            "attention.key_length_mla": nope + n_rot, "attention.value_length_mla": v_mla,
            "leading_dense_block_count": 1, "expert_count": 4, "expert_used_count": 2,
            "expert_feed_forward_length": 64, "expert_shared_count": 1, "expert_weights_scale": 2.5,
            "expert_weights_norm": True, "expert_gating_func": LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID}


# tiny random models of it that the llama.cpp comparisons draw from (llmlab.llama.tiny_zoo)
TINY_SHAPES = (
    dict(n_layer=3, n_embd=64, n_head=5, n_head_kv=1, n_ff=128, with_optional=("ffn_exp_probs_b",),
         kv={}),                                               # V3-like: q_lora, sigmoid, bias, norm, scale
    dict(n_layer=2, n_embd=64, n_head=4, n_head_kv=1, n_ff=96,  # V2-Lite-like: no q_lora, softmax, one used
         kv={"attention.q_lora_rank": 0, "expert_gating_func": 1, "expert_weights_norm": False,
             "expert_weights_scale": 1.0, "expert_used_count": 1, "expert_count": 6, "leading_dense_block_count": 1}),
    dict(n_layer=3, n_embd=96, n_head=3, n_head_kv=1, n_ff=64,
         kv={"leading_dense_block_count": 0, "expert_count": 5, "expert_used_count": 3, "expert_shared_count": 2,
             "expert_gating_func": 1, "expert_weights_scale": 16.0, "expert_weights_norm": False,
             "attention.kv_lora_rank": 64, "attention.key_length": 64 + 16, "attention.value_length": 64}),
)

SPEC = S.ArchSpec(
    name="deepseek2",
    builder=BuildDeepseek2,
    layer_tensors=(S.ATTN_NORM, ATTN_Q_A_NORM, ATTN_KV_A_NORM, ATTN_Q_A, ATTN_Q_B, ATTN_Q, ATTN_KV_A_MQA,
                   ATTN_K_B, ATTN_V_B, ATTN_OUT, S.FFN_NORM)
    + tuple(t.only(_dense) for t in (S.FFN_GATE, S.FFN_DOWN, S.FFN_UP))
    + tuple(t.only(_moe) for t in (S.FFN_GATE_INP, S.FFN_EXP_PROBS_B.not_required(), S.FFN_DOWN_EXPS,
                                   S.FFN_GATE_EXPS, S.FFN_UP_EXPS, S.FFN_GATE_SHEXP, S.FFN_DOWN_SHEXP, S.FFN_UP_SHEXP)),
    hparams=dict(rope_type=S.LLAMA_ROPE_TYPE_NORM),
    load_hparams=_load_hparams,
    tiny_kv=_tiny_kv,
    make_memory=_make_memory,
    tiny_shapes=TINY_SHAPES,
)
