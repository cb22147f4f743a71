"""llm_graph_context: what every architecture's graph builder shares (inputs, norm, FFN, attention).

A builder is constructed for one micro-batch and leaves behind ``gf`` (the graph),
``inputs`` (the leaf tensors the context must fill before running: tokens,
positions, masks, output ids) and ``t_logits``. Intermediate tensors are named
as llama.cpp's ``cb(cur, "name", il)`` names them, e.g. ``Qcur-3``.
"""
from __future__ import annotations

from ..ggml import ops as ggml
from ..ggml.cgraph import CGraph, build_forward_expand
from ..ggml.context import GGMLContext
from ..ggml.tensor import F32, I32, Tensor

LLAMA_TENSOR_NAME_FATTN = "__fattn__"


class KVView:
    """What a graph needs from the KV cache: per-layer K/V tensors (one row per cell), how many cells
    each layer reads (``n_kv``), and which layers use the sliding-window cache."""

    def __init__(self, k_l: list[Tensor], v_l: list[Tensor], n_kv: list[int], swa: list[bool]):
        self.k_l, self.v_l, self.n_kv, self.swa = k_l, v_l, n_kv, swa
        self.v_trans = False


class LLMGraph:
    def __init__(self, model, n_tokens: int, n_outputs: int, kv: KVView, flash_attn: bool = False,
                 mem_size: int | None = None):
        self.model = model
        self.hparams = hp = model.hparams
        self.n_tokens, self.n_outputs = n_tokens, n_outputs
        self.kv = kv
        self.flash_attn = flash_attn
        self.ctx0 = GGMLContext(mem_size, no_alloc=True, name="compute")
        self.gf = CGraph(name=f"{hp.arch} graph, {n_tokens} tokens")
        self.inputs: dict[str, Tensor] = {}
        self.n_layer, self.n_embd, self.n_head, self.n_head_kv = hp.n_layer, hp.n_embd, hp.n_head, hp.n_head_kv
        self.n_rot = hp.n_rot
        self.t_logits: Tensor | None = None
        self.t_embd: Tensor | None = None
        self.layer_of: dict[int, int] = {}     # id(tensor) -> layer index, for drawing and placement
        self._n_marked = 0                     # ctx0.tensors already given a layer by mark_layer
        self.build()

    # ---- naming, as llama.cpp's graph callback
    def cb(self, t: Tensor, name: str, il: int) -> Tensor:
        t.name = f"{name}-{il}" if il >= 0 else name
        return t

    # ---- inputs
    def _input(self, name: str, type, *ne: int) -> Tensor:
        t = ggml.set_input(ggml.new_tensor(self.ctx0, type, *ne, name=name))
        self.inputs[name] = t
        return t

    def build_inp_embd(self, tok_embd: Tensor) -> Tensor:
        tokens = self._input("inp_tokens", I32, self.n_tokens)
        cur = ggml.get_rows(self.ctx0, tok_embd, tokens)
        return self.cb(cur, "embd", -1)            # the name the reference llama.cpp build gives it

    def build_inp_pos(self) -> Tensor:
        return self._input("inp_pos", I32, self.n_tokens)

    def build_inp_out_ids(self) -> Tensor:
        return self._input("inp_out_ids", I32, self.n_outputs)

    def build_attn_inp(self) -> None:
        """The cells to write (k_idxs) and the KQ mask, for the global cache and (Gemma 3) the window cache."""
        kv = self.kv
        base = next((il for il in range(self.n_layer) if not kv.swa[il]), 0)
        self._input("k_idxs", I32, self.n_tokens)
        self._input("kq_mask", F32, kv.n_kv[base], self.n_tokens)
        if any(kv.swa):
            il = kv.swa.index(True)
            self._input("k_idxs_swa", I32, self.n_tokens)
            self._input("kq_mask_swa", F32, kv.n_kv[il], self.n_tokens)

    # ---- blocks
    def build_norm(self, cur: Tensor, mw: Tensor | None, il: int) -> Tensor:
        cur = ggml.rms_norm(self.ctx0, cur, self.hparams.f_norm_rms_eps)
        if mw is not None:
            self.cb(cur, "norm", il)
            cur = ggml.mul(self.ctx0, cur, mw)
        return cur

    def build_ffn(self, cur: Tensor, up: Tensor, gate: Tensor, down: Tensor, act: str, il: int) -> Tensor:
        """Parallel gated FFN (LLM_FFN_PAR): down(act(gate x) * up x)."""
        ctx0 = self.ctx0
        tmp = self.cb(ggml.mul_mat(ctx0, up, cur), "ffn_up", il)
        cur = self.cb(ggml.mul_mat(ctx0, gate, cur), "ffn_gate", il)
        if act == "silu":
            cur = self.cb(ggml.swiglu_split(ctx0, cur, tmp), "ffn_swiglu", il)
        elif act == "gelu":
            cur = self.cb(ggml.geglu_split(ctx0, cur, tmp), "ffn_geglu", il)
        else:
            raise ValueError(f"unknown FFN activation {act!r}")
        return ggml.mul_mat(ctx0, down, cur)

    def build_moe_ffn(self, cur: Tensor, gate_inp: Tensor, up_exps: Tensor, gate_exps: Tensor, down_exps: Tensor,
                      exp_probs_b: Tensor | None, n_expert: int, n_expert_used: int, norm_w: bool, w_scale: float,
                      gating: str, il: int) -> Tensor:
        """A mixture-of-experts FFN (build_moe_ffn): the router scores every expert, each token keeps its
        ``n_expert_used`` best (top-k of the scores, plus ``exp_probs_b`` for the choice only), their
        weights (optionally normalized to sum 1, then scaled) mix the chosen experts' SiLU-gated FFNs,
        each computed by MUL_MAT_ID over the tokens routed to it. ``gating``: "softmax" or "sigmoid"."""
        ctx0, gf = self.ctx0, self.gf
        n_embd, n_tokens = cur.ne[0], cur.ne[1]
        logits = self.cb(ggml.mul_mat(ctx0, gate_inp, cur), "ffn_moe_logits", il)      # [n_expert, n_tokens]
        if gating == "softmax":
            probs = ggml.soft_max(ctx0, logits)
        elif gating == "sigmoid":
            probs = ggml.sigmoid(ctx0, logits)
        else:
            raise ValueError(f"unknown expert gating function {gating!r}")
        self.cb(probs, "ffn_moe_probs", il)
        selection = probs
        if exp_probs_b is not None:           # DeepSeek-V3's bias: changes which experts win, not their weights
            selection = self.cb(ggml.add(ctx0, probs, exp_probs_b), "ffn_moe_probs_biased", il)
        selected = ggml.argsort_top_k(ctx0, selection, n_expert_used)                   # [n_used, n_tokens]
        self.cb(selected.view_src, "ffn_moe_argsort", il)
        self.cb(selected, "ffn_moe_topk", il)
        probs = ggml.reshape_3d(ctx0, probs, 1, n_expert, n_tokens)
        weights = self.cb(ggml.get_rows(ctx0, probs, selected), "ffn_moe_weights", il)   # [1, n_used, n_tokens]
        if norm_w:
            weights = ggml.reshape_2d(ctx0, weights, n_expert_used, n_tokens)
            wsum = self.cb(ggml.sum_rows(ctx0, weights), "ffn_moe_weights_sum", il)
            wsum = self.cb(ggml.clamp(ctx0, wsum, 6.103515625e-5, float("inf")), "ffn_moe_weights_sum_clamped", il)
            weights = self.cb(ggml.div(ctx0, weights, wsum), "ffn_moe_weights_norm", il)
            weights = ggml.reshape_3d(ctx0, weights, 1, n_expert_used, n_tokens)
        if w_scale != 0.0 and w_scale != 1.0:
            weights = self.cb(ggml.scale(ctx0, weights, w_scale), "ffn_moe_weights_scaled", il)
        build_forward_expand(gf, weights)
        cur = ggml.reshape_3d(ctx0, cur, n_embd, 1, n_tokens)
        up = self.cb(ggml.mul_mat_id(ctx0, up_exps, cur, selected), "ffn_moe_up", il)       # [n_ff, n_used, n_tokens]
        gate = self.cb(ggml.mul_mat_id(ctx0, gate_exps, cur, selected), "ffn_moe_gate", il)
        cur = self.cb(ggml.swiglu_split(ctx0, gate, up), "ffn_moe_swiglu", il)
        experts = self.cb(ggml.mul_mat_id(ctx0, down_exps, cur, selected), "ffn_moe_down", il)
        experts = self.cb(ggml.mul(ctx0, experts, weights), "ffn_moe_weighted", il)
        build_forward_expand(gf, experts)
        views = []
        for i in range(n_expert_used):                   # the views first, then the adds
            views.append(ggml.view_2d(ctx0, experts, n_embd, n_tokens, experts.nb[2], i * experts.nb[1]))
            build_forward_expand(gf, views[-1])
        moe_out = views[0]
        for v in views[1:]:
            moe_out = ggml.add(ctx0, moe_out, v)
            build_forward_expand(gf, moe_out)
        if n_expert_used == 1:                           # avoid returning a non-contiguous tensor
            moe_out = ggml.cont(ctx0, moe_out)
        return self.cb(moe_out, "ffn_moe_out", il)

    def build_qkv(self, L, cur: Tensor, il: int) -> tuple[Tensor, Tensor, Tensor]:
        """Q, K, V of one layer, [head size, heads, n_tokens] each (build_qkv, its separate q/k/v path):
        project, add the bias where the layer has one (``L.bq``, ``L.bk``, ``L.bv``; an architecture
        without biases has no such fields, one whose biases are optional has None), split the heads."""
        hp = self.hparams
        q = self._proj(L.wq, getattr(L, "bq", None), cur, "Qcur", il)
        k = self._proj(L.wk, getattr(L, "bk", None), cur, "Kcur", il)
        v = self._proj(L.wv, getattr(L, "bv", None), cur, "Vcur", il)
        head, n_tokens = hp.n_embd_head_k, self.n_tokens
        return (self.cb(ggml.reshape_3d(self.ctx0, q, head, hp.n_head, n_tokens), "Qcur", il),
                self.cb(ggml.reshape_3d(self.ctx0, k, head, hp.n_head_kv, n_tokens), "Kcur", il),
                self.cb(ggml.reshape_3d(self.ctx0, v, head, hp.n_head_kv, n_tokens), "Vcur", il))

    def build_rope(self, t: Tensor, inp_pos: Tensor, freq_base: float | None = None) -> Tensor:
        """RoPE of Q or K with the model's type, dimensions and scaling (``freq_base``: a layer's own base)."""
        hp = self.hparams
        return ggml.rope_ext(self.ctx0, t, inp_pos, None, hp.n_rot, hp.rope_type, hp.n_ctx_train,
                             hp.rope_freq_base if freq_base is None else freq_base, hp.rope_freq_scale)

    def _proj(self, w: Tensor, b: Tensor | None, cur: Tensor, name: str, il: int) -> Tensor:
        t = self.cb(ggml.mul_mat(self.ctx0, w, cur), name, il)
        if b is not None:
            t = self.cb(ggml.add(self.ctx0, t, b), name, il)
        return t

    def _idxs(self, il: int) -> Tensor:
        return self.inputs["k_idxs_swa" if self.kv.swa[il] else "k_idxs"]

    def cpy_k(self, k_cur: Tensor, il: int) -> Tensor:
        """Write this micro-batch's K rows into their cells (SET_ROWS, as llama_kv_cache::cpy_k)."""
        k = self.kv.k_l[il]
        k_cur = ggml.reshape_2d(self.ctx0, k_cur, k.ne[0], self.n_tokens)
        return ggml.set_rows(self.ctx0, k, k_cur, self._idxs(il))

    def cpy_v(self, v_cur: Tensor, il: int) -> Tensor:
        v = self.kv.v_l[il]
        v_cur = ggml.reshape_2d(self.ctx0, v_cur, v.ne[0], self.n_tokens)
        return ggml.set_rows(self.ctx0, v, v_cur, self._idxs(il))

    def get_k(self, il: int) -> Tensor:
        k, hp = self.kv.k_l[il], self.hparams
        return ggml.view_3d(self.ctx0, k, hp.n_embd_head_k, hp.n_head_kv, self.kv.n_kv[il],
                            k.type.row_size(hp.n_embd_head_k), k.type.row_size(hp.n_embd_k_gqa), 0)

    def get_v(self, il: int) -> Tensor:
        v, hp = self.kv.v_l[il], self.hparams
        return ggml.view_3d(self.ctx0, v, hp.n_embd_head_v, hp.n_head_kv, self.kv.n_kv[il],
                            v.type.row_size(hp.n_embd_head_v), v.type.row_size(hp.n_embd_v_gqa), 0)

    def build_attn_mha(self, q: Tensor, k: Tensor, v: Tensor, kq_mask: Tensor, kq_scale: float, il: int,
                       v_mla: Tensor | None = None) -> Tensor:
        """softmax(scale q k^T + mask) v per head; ``v_mla`` (MLA's absorbed form): the per-head matrix that
        "decompresses" the attention's latent output back to each head's value size."""
        ctx0 = self.ctx0
        v_trans = v.nb[1] > v.nb[2]
        q = ggml.permute(ctx0, q, 0, 2, 1, 3)
        k = ggml.permute(ctx0, k, 0, 2, 1, 3)
        v = ggml.permute(ctx0, v, 0, 2, 1, 3)
        if self.flash_attn:
            if v_trans:
                v = ggml.transpose(ctx0, v)
            cur = ggml.flash_attn_ext(ctx0, q, k, v, kq_mask, kq_scale)
            self.cb(cur, LLAMA_TENSOR_NAME_FATTN, il)
            if v_mla is not None:            # [kv_lora, n_head, n_tokens] -> per head, times v_mla
                cur = ggml.permute(ctx0, cur, 0, 2, 1, 3)
                cur = self.cb(ggml.mul_mat(ctx0, v_mla, cur), "fattn_mla", il)
                cur = ggml.permute(ctx0, cur, 0, 2, 1, 3)
                cur = ggml.cont(ctx0, cur)
            cur = ggml.reshape_2d(ctx0, cur, cur.ne[0] * cur.ne[1], cur.ne[2] * cur.ne[3])
        else:
            kq = self.cb(ggml.mul_mat(ctx0, k, q), "kq", il)
            kq = self.cb(ggml.soft_max_ext(ctx0, kq, kq_mask, kq_scale, 0.0), "kq_soft_max", il)
            if not v_trans:
                v = self.cb(ggml.cont(ctx0, ggml.transpose(ctx0, v)), "v_cont", il)
            kqv = self.cb(ggml.mul_mat(ctx0, v, kq), "kqv", il)
            if v_mla is not None:
                kqv = self.cb(ggml.mul_mat(ctx0, v_mla, kqv), "kqv_mla", il)
            cur = ggml.permute(ctx0, kqv, 0, 2, 1, 3)
            cur = ggml.cont_2d(ctx0, cur, cur.ne[0] * cur.ne[1], cur.ne[2] * cur.ne[3])
        build_forward_expand(self.gf, cur)
        return cur

    def build_attn_k(self, wo: Tensor, q_cur: Tensor, k_cur: Tensor, v_cur: Tensor, kq_scale: float, il: int,
                     v_mla: Tensor | None = None) -> Tensor:
        """Attention over a K-only cache (build_attn with llm_graph_input_attn_k: MLA): store K, read the
        cache's K rows as K and their first ``v_cur.ne[0]`` values as V."""
        gf = self.gf
        build_forward_expand(gf, q_cur)
        build_forward_expand(gf, v_cur)
        build_forward_expand(gf, k_cur)
        build_forward_expand(gf, self.cpy_k(k_cur, il))
        k = self.get_k(il)
        v = ggml.view_4d(self.ctx0, k, v_cur.ne[0], k.ne[1], k.ne[2], k.ne[3], k.nb[1], k.nb[2], k.nb[3], 0)
        cur = self.build_attn_mha(q_cur, k, v, self.inputs["kq_mask"], kq_scale, il, v_mla)
        self.cb(cur, "kqv_out", il)
        return ggml.mul_mat(self.ctx0, wo, cur)

    def build_attn(self, wo: Tensor, q_cur: Tensor, k_cur: Tensor, v_cur: Tensor, kq_scale: float, il: int,
                   wo_b: Tensor | None = None) -> Tensor:
        gf = self.gf
        # added together so that they are not reordered (fewer splits)
        build_forward_expand(gf, q_cur)
        build_forward_expand(gf, k_cur)
        build_forward_expand(gf, v_cur)
        # store to the KV cache
        build_forward_expand(gf, self.cpy_k(k_cur, il))
        build_forward_expand(gf, self.cpy_v(v_cur, il))
        mask = self.inputs["kq_mask_swa" if self.kv.swa[il] else "kq_mask"]
        cur = self.build_attn_mha(q_cur, self.get_k(il), self.get_v(il), mask, kq_scale, il)
        self.cb(cur, "kqv_out", il)
        cur = ggml.mul_mat(self.ctx0, wo, cur)
        if wo_b is not None:
            self.cb(cur, "kqv_wo", il)
            cur = ggml.add(self.ctx0, cur, wo_b)
        return cur

    def build(self) -> None:
        raise NotImplementedError

    def build_output(self, inpL: Tensor) -> Tensor:
        """The tail every builder shares: final norm, LM head (tied or not), expand from the logits."""
        cur = self.build_norm(inpL, self.model.output_norm, -1)
        self.cb(cur, "result_norm", -1)
        self.t_embd = cur
        cur = ggml.mul_mat(self.ctx0, self.model.output, cur)
        output_b = getattr(self.model, "output_b", None)        # an optional LM-head bias (Qwen2)
        if output_b is not None:
            cur = ggml.add(self.ctx0, cur, output_b)
        cur = self.cb(cur, "result_output", -1)
        self.t_logits = cur
        build_forward_expand(self.gf, cur)
        self.mark_layer(self.model.hparams.n_layer)
        return cur

    def mark_layer(self, il: int) -> None:
        """Record which layer the tensors made since the last call belong to (for drawing and placement)."""
        made = self.ctx0.tensors
        for t in made[self._n_marked:]:
            self.layer_of.setdefault(id(t), il)
        self._n_marked = len(made)
