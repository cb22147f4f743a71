"""Checkers of notebook 03_attention_and_heads: one attention row, GQA's KV head, KV bytes per token."""
from __future__ import annotations

import numpy as np

from .verdict import Verdict, needs_answer


@needs_answer("answer")
def check_attention_row(q, k, v, answer) -> Verdict:
    """One query's attention output: softmax(q·kᵢ / sqrt(d)) weights over the rows of v."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    s = k @ q / np.sqrt(q.shape[-1])
    p = np.exp(s - s.max())
    p /= p.sum()
    want = p @ v
    got = np.asarray(answer, np.float64)
    if got.shape != want.shape:
        return Verdict.not_yet(f"shape {got.shape}", f"the output is one row of V's width: {want.shape}")
    if np.allclose(got, want, rtol=1e-6, atol=1e-9):
        return Verdict.correct(f"output {np.round(want, 4).tolist()} (weights {np.round(p, 3).tolist()})")
    s0 = k @ q
    p0 = np.exp(s0 - s0.max())
    p0 /= p0.sum()
    if np.allclose(got, p0 @ v, rtol=1e-6):
        return Verdict.not_yet("output", "divide the scores by sqrt(d_k) before the softmax")
    if np.allclose(got, s @ v, rtol=1e-6) or np.allclose(got, np.exp(s) @ v, rtol=1e-6):
        return Verdict.not_yet("output", "turn the scores into probabilities first: exp(s - max), divided by their sum")
    return Verdict.not_yet("output", "scores s = K q / sqrt(d), p = softmax(s), output = p V")


@needs_answer("answer")
def check_kv_head(n_head: int, n_head_kv: int, head: int, answer: int) -> Verdict:
    """Grouped-query attention: query head h reads KV head h // (n_head / n_head_kv)."""
    want = head // (n_head // n_head_kv)
    if answer == want:
        return Verdict.correct(f"query head {head} reads KV head {want}")
    hint = ("that is h mod n_head_kv: ggml shares KV heads between *consecutive* query heads"
            if answer == head % n_head_kv else f"groups of n_head / n_head_kv = {n_head // n_head_kv} consecutive query heads")
    return Verdict.not_yet(f"KV head {answer}", hint)


@needs_answer("answer")
def check_kv_bytes_per_token(n_layer: int, n_head_kv: int, head_dim: int, answer: int, type_bytes: int = 2) -> Verdict:
    """KV-cache bytes one token adds: n_layer x 2 (K and V) x n_head_kv x head_dim x bytes per value."""
    want = n_layer * 2 * n_head_kv * head_dim * type_bytes
    if answer == want:
        return Verdict.correct(f"{want:,} bytes per token ({want / 1024:.0f} KiB)")
    hint = ("count both K and V" if answer * 2 == want else
            "only the KV heads are cached, not every query head" if answer > want else
            "every layer keeps its own K and V rows" if answer * n_layer == want else
            "n_layer x 2 x n_head_kv x head_dim x bytes per value")
    return Verdict.not_yet(f"{answer:,} bytes", hint)
