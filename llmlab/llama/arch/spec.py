"""What an architecture is, as one object: llama.cpp's ``llm_arch`` entry, its rows of the tensor-name
table (``LLM_TENSOR_NAMES``, the ``create_tensor`` calls of ``load_tensors``), its branch of
``load_hparams`` and ``llama_model_rope_type``, its ``llm_build_*`` graph, plus the recipe of a tiny
random test model.

Each architecture module (``llama.py``, ``gemma3.py``, ``qwen2.py``, ``qwen3.py``, ``qwen3moe.py``,
``deepseek2.py``) ends with one :class:`ArchSpec`;
``arch/__init__.py`` registers it in one line. ``model.py`` (load_hparams, the tensors) and ``tiny.py`` only read
specs, so adding an architecture is one new file and one registry line.

The tensors are :class:`TensorSpec` rows built from the shared table below (``ATTN_Q``, ``FFN_UP``,
...: llama.cpp's ``LLM_TENSOR_*``), each with its GGUF name, its expected shape as a function of the
hyperparameters, and whether it may be absent (``TENSOR_NOT_REQUIRED``, e.g. the q/k/v biases of a
LLaMA file). :meth:`ArchSpec.expected_tensors` lists them for a given model, so a loader can check
that no tensor is missing and none is left unused.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable

from ..hparams import LLAMA_ROPE_TYPE_NEOX, LLAMA_ROPE_TYPE_NORM, HParams  # noqa: F401  (the specs' RoPE types)

Shape = Callable[["HParams"], tuple[int, ...]]


@dataclass(frozen=True)
class TensorSpec:
    """One ``create_tensor`` call: where the tensor lands (``attr``), its GGUF name (``{il}`` for the
    layer), its expected ne, whether it may be absent, and how a tiny model fills it (``init``:
    ``"weight"`` random / sqrt(fan-in), ``"embd"`` unit random, ``"norm"`` around 1, ``"bias"`` small)."""

    attr: str
    name: str
    ne: Shape
    optional: bool = False
    init: str = "weight"
    # which layers have it (llama.cpp's ``if`` around a create_tensor: MoE layers only, the q_lora path
    # only, ...); None: every layer
    where: Callable[["HParams", int], bool] | None = None

    @property
    def per_layer(self) -> bool:
        return "{il}" in self.name

    def gguf_name(self, il: int | None = None) -> str:
        return self.name.format(il=il) if self.per_layer else self.name

    def shape(self, hp: "HParams") -> tuple[int, ...]:
        return tuple(int(x) for x in self.ne(hp))

    def required(self) -> "TensorSpec":
        return replace(self, optional=False)

    def not_required(self) -> "TensorSpec":
        return replace(self, optional=True)

    def only(self, where: Callable[["HParams", int], bool]) -> "TensorSpec":
        """The same row, created only in the layers where ``where(hp, il)`` holds."""
        return replace(self, where=where)

    def present(self, hp: "HParams", il: int | None = None) -> bool:
        return self.where is None or il is None or bool(self.where(hp, il))


def _blk(attr: str, tensor: str, ne: Shape, suffix: str = "weight", init: str = "weight") -> TensorSpec:
    return TensorSpec(attr, f"blk.{{il}}.{tensor}.{suffix}", ne, init=init)


def _q(hp) -> int:
    return hp.n_embd_head_k * hp.n_head


# ---- the tensor-name table (LLM_TENSOR_*), shapes as load_tensors creates them (ne order)
TOKEN_EMBD = TensorSpec("tok_embd", "token_embd.weight", lambda hp: (hp.n_embd, hp.n_vocab), init="embd")
OUTPUT_NORM = TensorSpec("output_norm", "output_norm.weight", lambda hp: (hp.n_embd,), init="norm")
# absent: the LM head is tied to token_embd (TENSOR_DUPLICATED)
OUTPUT = TensorSpec("output", "output.weight", lambda hp: (hp.n_embd, hp.n_vocab), optional=True)
OUTPUT_B = TensorSpec("output_b", "output.bias", lambda hp: (hp.n_vocab,), optional=True, init="bias")

ATTN_NORM = _blk("attn_norm", "attn_norm", lambda hp: (hp.n_embd,), init="norm")
ATTN_Q = _blk("wq", "attn_q", lambda hp: (hp.n_embd, _q(hp)))
ATTN_K = _blk("wk", "attn_k", lambda hp: (hp.n_embd, hp.n_embd_k_gqa))
ATTN_V = _blk("wv", "attn_v", lambda hp: (hp.n_embd, hp.n_embd_v_gqa))
ATTN_OUT = _blk("wo", "attn_output", lambda hp: (hp.n_embd_head_v * hp.n_head, hp.n_embd))
ATTN_Q_B = _blk("bq", "attn_q", lambda hp: (_q(hp),), "bias", "bias")
ATTN_K_B = _blk("bk", "attn_k", lambda hp: (hp.n_embd_k_gqa,), "bias", "bias")
ATTN_V_B = _blk("bv", "attn_v", lambda hp: (hp.n_embd_v_gqa,), "bias", "bias")
ATTN_OUT_B = _blk("bo", "attn_output", lambda hp: (hp.n_embd,), "bias", "bias")
ATTN_Q_NORM = _blk("attn_q_norm", "attn_q_norm", lambda hp: (hp.n_embd_head_k,), init="norm")
ATTN_K_NORM = _blk("attn_k_norm", "attn_k_norm", lambda hp: (hp.n_embd_head_k,), init="norm")
ATTN_POST_NORM = _blk("attn_post_norm", "post_attention_norm", lambda hp: (hp.n_embd,), init="norm")
FFN_NORM = _blk("ffn_norm", "ffn_norm", lambda hp: (hp.n_embd,), init="norm")
FFN_GATE = _blk("ffn_gate", "ffn_gate", lambda hp: (hp.n_embd, hp.n_ff))
FFN_UP = _blk("ffn_up", "ffn_up", lambda hp: (hp.n_embd, hp.n_ff))
FFN_DOWN = _blk("ffn_down", "ffn_down", lambda hp: (hp.n_ff, hp.n_embd))
FFN_POST_NORM = _blk("ffn_post_norm", "post_ffw_norm", lambda hp: (hp.n_embd,), init="norm")


def n_ff_exp(hp) -> int:
    """An expert's FFN width: expert_feed_forward_length, else n_ff / n_expert_used (qwen3moe's fallback)."""
    return hp.n_ff_exp or hp.n_ff // max(hp.n_expert_used, 1)


# mixture of experts: the router, the experts stacked in one 3-D tensor each, shared experts
FFN_GATE_INP = _blk("ffn_gate_inp", "ffn_gate_inp", lambda hp: (hp.n_embd, hp.n_expert))
FFN_EXP_PROBS_B = _blk("ffn_exp_probs_b", "exp_probs_b", lambda hp: (hp.n_expert,), "bias", "bias")
FFN_GATE_EXPS = _blk("ffn_gate_exps", "ffn_gate_exps", lambda hp: (hp.n_embd, n_ff_exp(hp), hp.n_expert))
FFN_UP_EXPS = _blk("ffn_up_exps", "ffn_up_exps", lambda hp: (hp.n_embd, n_ff_exp(hp), hp.n_expert))
FFN_DOWN_EXPS = _blk("ffn_down_exps", "ffn_down_exps", lambda hp: (n_ff_exp(hp), hp.n_embd, hp.n_expert))
FFN_GATE_SHEXP = _blk("ffn_gate_shexp", "ffn_gate_shexp", lambda hp: (hp.n_embd, n_ff_exp(hp) * hp.n_expert_shared))
FFN_UP_SHEXP = _blk("ffn_up_shexp", "ffn_up_shexp", lambda hp: (hp.n_embd, n_ff_exp(hp) * hp.n_expert_shared))
FFN_DOWN_SHEXP = _blk("ffn_down_shexp", "ffn_down_shexp", lambda hp: (n_ff_exp(hp) * hp.n_expert_shared, hp.n_embd))

# what every architecture here has: embeddings, final norm, LM head (tied when absent)
MODEL_TENSORS = (TOKEN_EMBD, OUTPUT_NORM, OUTPUT)
# a pre-norm attention block and a gated FFN (LLaMA's layer)
LAYER_TENSORS = (ATTN_NORM, ATTN_Q, ATTN_K, ATTN_V, ATTN_OUT, FFN_NORM, FFN_GATE, FFN_UP, FFN_DOWN)


@dataclass(frozen=True)
class ArchSpec:
    """One architecture: name, hparams, tensors, graph builder, tiny recipe.

    - ``hparams``: the facts llama.cpp hard-codes for it (``rope_type``, ``swa_pattern``, ...), set on
      :class:`~llmlab.llama.hparams.HParams` after the generic keys are read;
    - ``load_hparams(hp, kv)``: its own branch of ``llama_model::load_hparams`` (optional);
    - ``layer_tensors`` / ``model_tensors``: its rows of the tensor table, in load order;
    - ``builder``: its ``llm_build_*`` (an :class:`~llmlab.llama.graph.LLMGraph` subclass);
    - what the teaching views read off its graph (``llmlab.block``, ``llmlab.viz.block``): ``ffn_act``, the gate
      activation its builder passes to ``build_ffn`` (LLM_FFN_SILU / LLM_FFN_GELU); ``residual_mid``, its
      name for the stream after attention's residual add; ``block_steps``, one layer as a diagram:
      ``(node, label, kind)`` in graph order, kind one of norm, attn, ffn, add (a residual addition);
      ``chat_template``, the llama.cpp built-in template for its files without ``tokenizer.chat_template``;
    - ``make_memory``: the architecture's own memory (deepseek2's K-only MLA cache), else the KV cache;
    - ``tiny_kv(head_dim, n_vocab, sliding_window)``: the extra ``{arch}.*`` metadata of a tiny test model
      (key suffix -> int or float); the tiny model's tensors are the required rows; ``tiny_shapes``, the
      shapes of tiny models the comparisons with llama.cpp draw from.
    """

    name: str
    builder: type
    layer_tensors: tuple[TensorSpec, ...]
    model_tensors: tuple[TensorSpec, ...] = MODEL_TENSORS
    ffn_act: str = "silu"
    residual_mid: str = "ffn_inp"
    block_steps: tuple[tuple[str, str, str], ...] = ()
    chat_template: str = "chatml"
    # the architecture's own memory, ``make_memory(hp, n_ctx, type_k, type_v, n_seq_max, n_ubatch)``
    # (llama_model::create_memory's branch; deepseek2: the MLA cache); None: the KV cache of kv_cache.py
    make_memory: Callable[..., Any] | None = None
    # shapes of tiny random models (write_tiny's keyword arguments) that tiny_zoo draws for the comparisons
    # with llama.cpp: what makes the architecture itself (odd heads, MQA, experts used, the low-rank paths)
    tiny_shapes: tuple[dict, ...] = ()
    hparams: dict[str, Any] = field(default_factory=dict)
    load_hparams: Callable[["HParams", dict], None] | None = None
    tiny_kv: Callable[[int, int, int], dict[str, int | float]] = lambda hd, n_vocab, sliding_window: {}

    @property
    def layer_attrs(self) -> tuple[str, ...]:
        """The attributes of a layer's :class:`~llmlab.llama.model.LayerWeights` (absent optional ones: None)."""
        return tuple(t.attr for t in self.layer_tensors)

    def expected_tensors(self, hp: "HParams") -> list[tuple[str, tuple[int, ...], bool]]:
        """Every tensor a file of this architecture may hold: (GGUF name, ne, optional), in load order.

        A file is complete when each required name is present with its ne, and fully used when it holds
        no name outside this list."""
        rows = [(t.gguf_name(), t.shape(hp), t.optional) for t in self.model_tensors]
        for il in range(hp.n_layer):
            rows += [(t.gguf_name(il), t.shape(hp), t.optional) for t in self.layer_tensors if t.present(hp, il)]
        return rows
