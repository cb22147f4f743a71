"""Qwen2 (``LLM_ARCH_QWEN2``): LLaMA's layer with q/k/v biases and NEOX RoPE.

Hparams: the shared keys, NEOX RoPE (``llama_model_rope_type``). Tensors (``load_tensors``): the shared
layer plus *required* q/k/v biases; the LM head may be tied and may have a bias (``output.bias``).
Graph: ``llm_build_qwen2`` (src/models/qwen2.cpp).
"""
from __future__ import annotations

from . import spec as S
from .llama import BLOCK_STEPS, BuildLlama


class BuildQwen2(BuildLlama):
    """llm_build_qwen2 (src/models/qwen2.cpp) takes exactly the steps of llm_build_llama, minus options
    Qwen2 does not have (an attention-scale override, RoPE factors, an attention output bias): norm, q/k/v
    projections *with their biases* (``build_qkv`` adds them, and names each sum ``Qcur``/``Kcur``/``Vcur``
    as llama.cpp does), RoPE (NEOX, from the hparams), attention scaled by 1/sqrt(head size), residual,
    norm, SiLU-gated FFN, residual, and the LM head with its optional bias. So it is llama's builder (what
    makes Qwen2 Qwen2 is its spec below), except that qwen2.cpp leaves the attention output unnamed."""

    name_attn_out = False


def _tiny_kv(hd: int, n_vocab: int, sliding_window: int) -> dict:
    return {"rope.freq_base": 1000000.0}


SPEC = S.ArchSpec(
    name="qwen2",
    builder=BuildQwen2,
    layer_tensors=S.LAYER_TENSORS + (S.ATTN_Q_B, S.ATTN_K_B, S.ATTN_V_B),
    model_tensors=S.MODEL_TENSORS + (S.OUTPUT_B,),
    hparams=dict(rope_type=S.LLAMA_ROPE_TYPE_NEOX),
    tiny_kv=_tiny_kv,
    # llama's layer with biased projections; qwen2.cpp leaves the projected attention output unnamed
    block_steps=(BLOCK_STEPS[0], ("Qcur", "Q, K, V projections + biases\nRoPE on Q and K\nQcur, Kcur, Vcur", "attn"),
                 ("kqv_out", "attention, output projection\nkq → kq_soft_max → kqv_out", "attn")) + BLOCK_STEPS[4:],
)
