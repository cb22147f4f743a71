"""Checkers of notebook 00_overview: the generation loop's passes, the decode bound, arithmetic intensity; and the
KV cache's bytes (notebook 04)."""
from __future__ import annotations

from .verdict import Verdict, needs_answer


@needs_answer("answer")
def check_kv_cache_bytes(model_path, n_ctx: int, answer: int, type_bytes: int = 2) -> Verdict:
    """KV cache size = n_ctx x n_layer x 2 (K and V) x n_embd_k_gqa x bytes per element (f16: 2)."""
    from ...ggml.gguf import GGUFFile
    from ...viz.gguf import hparams_of
    with GGUFFile(model_path) as f:
        hp = hparams_of(f)
    want = n_ctx * hp["n_layer"] * 2 * hp["n_head_kv"] * hp["head_dim"] * type_bytes
    if answer == want:
        return Verdict.correct(f"{want:,} bytes ({want / 2**20:.1f} MiB)")
    hint = "check n_embd_gqa: it is n_head_kv x head_dim, not n_embd" if answer == n_ctx * hp["n_layer"] * 2 * hp["n_embd"] * type_bytes \
        else "did you count both K and V, and every layer?" if answer in (want // 2, want // hp["n_layer"]) \
        else f"you are off by a factor {answer / want:.3g}"
    return Verdict.not_yet(f"{answer:,} bytes", hint)


@needs_answer("answer")
def check_decode_tokens_per_s(weight_bytes: int, bandwidth_gb_s: float, answer: float) -> Verdict:
    """Upper bound of decode speed when every step reads every weight once from memory."""
    want = bandwidth_gb_s * 1e9 / weight_bytes
    ok = abs(answer - want) <= 0.05 * want
    return Verdict.of(ok, f"{answer:.1f} tokens/s", "" if ok else
                      "one decode step reads all weight bytes once: tokens/s = bytes per second / bytes per step")


@needs_answer("answer")
def check_arithmetic_intensity(bits_per_weight: float, answer: float, batch: int = 1) -> Verdict:
    """FLOPs per byte of weights in a matrix-vector product over ``batch`` tokens: each weight
    gives one multiply and one add per token."""
    want = 2 * batch / (bits_per_weight / 8)
    ok = abs(answer - want) <= 0.02 * want
    return Verdict.of(ok, f"{answer:.3g} FLOP/byte", "" if ok else
                      "count 2 FLOPs (multiply + add) per weight per token, and bits_per_weight / 8 bytes per weight")


@needs_answer("answer")
def check_forward_passes(n_prompt: int, n_new: int, answer: dict) -> Verdict:
    """The generation loop of llama.cpp's simple example: one pass over the whole prompt (its logits give the
    first new token), then one pass per sampled token that is fed back; the last token sampled is never fed.
    ``answer``: {"passes": forward passes, "tokens": tokens pushed through the layers in all}."""
    want = {"passes": 1 + (n_new - 1), "tokens": n_prompt + (n_new - 1)}
    if isinstance(answer, dict) and all(v in (None, 0) for v in answer.values()):
        return Verdict.unanswered(answer)
    if not isinstance(answer, dict) or set(answer) != set(want):
        return Verdict.not_yet(repr(answer), 'give a dict {"passes": ..., "tokens": ...}')
    if answer == want:
        return Verdict.correct(f"{want['passes']} passes (1 prefill + {n_new - 1} decode steps), "
                               f"{want['tokens']} tokens through the layers")
    p, t = answer["passes"], answer["tokens"]
    hint = ("the prompt goes through in one batch: one pass, not one per prompt token"
            if p in (n_prompt + n_new - 1, n_prompt + n_new) else
            "the last token sampled is printed but never fed back, and the prompt's pass already gives the "
            "first new token" if p in (n_new + 1, n_new) or t in (n_prompt + n_new,) else
            "passes: one prefill plus one decode step per new token but the first; "
            "tokens: the prompt plus every token fed back")
    return Verdict.not_yet(f"{p} passes, {t} tokens", hint)
