"""Checkers of notebook 03_attention_and_heads: RMSNorm of a row, RoPE of a vector, one attention row, GQA's KV
head, KV bytes per token, the bytes of one micro-batch's scores, SwiGLU, and the residual stream as a sum."""
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


@needs_answer("answer")
def check_kq_bytes(n_head: int, n_ubatch: int, n_kv: int, answer: int) -> Verdict:
    """Bytes of llama.cpp's ``kq`` for one micro-batch without flash attention: n_head x n_ubatch queries x
    n_kv cache cells, in F32 (a MUL_MAT's result is F32; the graph also asks for F32 accumulation)."""
    want = n_head * n_ubatch * n_kv * 4
    if answer == want:
        return Verdict.correct(f"{want:,} bytes ({want / 2**20:.0f} MiB) for one layer and one micro-batch; "
                               "the graph's allocator reuses the buffer for the next")
    hint = ("llama.cpp scores one micro-batch of n_ubatch queries at a time, not every cached position"
            if answer == n_head * n_kv * n_kv * 4 else
            "kq is F32: 4 bytes per score" if answer in (want // 2, want // 4) else
            "every query head has its own scores (KV heads are shared, scores are not)" if answer * n_head == want else
            "n_head x n_ubatch x n_kv scores, 4 bytes each")
    return Verdict.not_yet(f"{answer:,} bytes", hint)


@needs_answer("answer")
def check_rms_norm(x, w, eps: float, answer) -> Verdict:
    """RMSNorm of one row: x / sqrt(mean(x²) + eps), times the learned weight w (no mean subtracted)."""
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    rms = np.sqrt((x * x).mean() + eps)
    want = x / rms * w
    got = np.asarray(answer, np.float64)
    if got.shape != want.shape:
        return Verdict.not_yet(f"shape {got.shape}", f"RMSNorm keeps the row's shape: {want.shape}")
    if np.allclose(got, want, rtol=1e-6, atol=1e-9):
        return Verdict.correct(f"{np.round(want, 4).tolist()} (rms(x) = {rms:.4f})")
    c = x - x.mean()
    if np.allclose(got, c / np.sqrt((c * c).mean() + eps) * w, rtol=1e-6):
        return Verdict.not_yet("the mean was subtracted", "that is LayerNorm; RMSNorm divides x as it is")
    if np.allclose(got, x / rms, rtol=1e-6):
        return Verdict.not_yet("the weight is missing", "multiply by w after dividing")
    if np.allclose(got, x / np.sqrt((x * x).sum() + eps) * w, rtol=1e-6):
        return Verdict.not_yet("divided by the norm", "RMS takes the *mean* of the squares, not their sum")
    return Verdict.not_yet("values", "rms = sqrt(mean(x**2) + eps); answer = x / rms * w")


@needs_answer("answer")
def check_rope(x, pos: int, base: float, mode: str, answer) -> Verdict:
    """RoPE of one vector at position ``pos``: pair i (NORM: 2i, 2i+1; NEOX: i, i+n/2) turned by pos * base^(-2i/n)."""
    from ...block import rope_f64, ROPE_PAIRING
    x = np.asarray(x, np.float64)
    want = rope_f64(x, pos, mode, base)
    got = np.asarray(answer, np.float64)
    if got.shape != want.shape:
        return Verdict.not_yet(f"shape {got.shape}", f"RoPE keeps the vector's shape: {want.shape}")
    if np.allclose(got, want, rtol=1e-6, atol=1e-9):
        return Verdict.correct(f"{np.round(want, 4).tolist()} (its length is unchanged: {np.linalg.norm(want):.4f})")
    for other in ROPE_PAIRING:
        if other != mode and np.allclose(got, rope_f64(x, pos, other, base), rtol=1e-6, atol=1e-9):
            return Verdict.not_yet(f"that is the {other.upper()} pairing",
                                   f"{mode.upper()} pairs dimensions " + ("(2i, 2i+1)" if mode == "norm" else "(i, i + n/2)"))
    if np.allclose(got, rope_f64(x, -pos, mode, base), rtol=1e-6, atol=1e-9):
        return Verdict.not_yet("rotated the other way", "(a, b) -> (a cos t - b sin t, a sin t + b cos t)")
    if not np.isclose(np.linalg.norm(got), np.linalg.norm(x), rtol=1e-6):
        return Verdict.not_yet("the length changed", "a rotation keeps each pair's length: use cos and sin of the same angle")
    return Verdict.not_yet("values", "angle of pair i = pos * base**(-2*i/n); rotate each pair by its own angle")


@needs_answer("answer")
def check_swiglu(gate, up, answer) -> Verdict:
    """SwiGLU's middle: silu(gate) * up, with silu(x) = x / (1 + exp(-x))."""
    g, u = np.asarray(gate, np.float64), np.asarray(up, np.float64)
    silu = lambda a: a / (1.0 + np.exp(-a))
    want = silu(g) * u
    got = np.asarray(answer, np.float64)
    if got.shape != want.shape:
        return Verdict.not_yet(f"shape {got.shape}", f"one value per channel: {want.shape}")
    if np.allclose(got, want, rtol=1e-6, atol=1e-9):
        return Verdict.correct(f"{np.round(want, 4).tolist()}")
    if np.allclose(got, silu(u) * g, rtol=1e-6, atol=1e-9):
        return Verdict.not_yet("silu went to the wrong projection", "the gate is the one that goes through silu")
    if np.allclose(got, u / (1.0 + np.exp(-g)), rtol=1e-6, atol=1e-9):
        return Verdict.not_yet("that is sigmoid(gate) * up", "silu(x) is x times sigmoid(x)")
    if np.allclose(got, g * u, rtol=1e-6, atol=1e-9):
        return Verdict.not_yet("no activation", "apply silu to the gate before multiplying")
    return Verdict.not_yet("values", "silu(gate) * up, element by element")


@needs_answer("answer")
def check_stream(trace, layer: int, token: int, answer) -> Verdict:
    """The residual stream after ``layer`` for one token: the embedding plus every attention and FFN
    addition of layers 0..layer (a :class:`llmlab.block.BlockTrace` holds them)."""
    want = trace[layer].out[token].astype(np.float64)
    got = np.asarray(answer, np.float64)
    if got.shape != want.shape:
        return Verdict.not_yet(f"shape {got.shape}", f"one stream row: {want.shape}")
    scale = np.abs(want).max()
    if np.allclose(got, want, rtol=0, atol=1e-5 * scale):
        return Verdict.correct(f"the row after layer {layer} (RMS {np.sqrt((want ** 2).mean()):.3g}), "
                               f"max |diff| to l_out-{layer}: {np.abs(got - want).max():.2g}")
    e = trace.embd[token].astype(np.float64)
    a = sum(trace[il].attn[token].astype(np.float64) for il in range(layer + 1))
    f = sum(trace[il].ffn[token].astype(np.float64) for il in range(layer + 1))
    for miss, v in (("the embedding is", a + f), ("the attention additions are", e + f), ("the FFN additions are", e + a)):
        if np.allclose(got, v, rtol=0, atol=1e-5 * scale):
            return Verdict.not_yet(f"{miss} missing", "the stream is the embedding plus both branches of every layer")
    if np.allclose(got, e + a + f - trace[layer].attn[token] - trace[layer].ffn[token], rtol=0, atol=1e-5 * scale):
        return Verdict.not_yet(f"that is the stream before layer {layer}", f"count layers 0..{layer}, both ends included")
    return Verdict.not_yet("values", "embd + sum over layers 0..layer of (attn + ffn)")


@needs_answer("answer")
def check_mla_cache_row(n_head: int, d_nope: int, d_rope: int, d_v: int, d_c: int, answer) -> Verdict:
    """MLA against MHA for one token and layer (f16): ``answer`` = (MHA numbers, MLA numbers) where MHA keeps
    every head's K (d_nope + d_rope) and V (d_v), and llama.cpp's MLA cache one latent of d_c plus the
    shared RoPE key (d_rope), no V."""
    want = (n_head * (d_nope + d_rope + d_v), d_c + d_rope)
    try:
        got = tuple(int(x) for x in answer)
    except (TypeError, ValueError):
        return Verdict.not_yet(repr(answer), "two numbers: (MHA numbers per token and layer, MLA numbers)")
    if got == want:
        return Verdict.correct(f"MHA {want[0]:,} numbers ({2 * want[0]:,} bytes in f16), MLA {want[1]} "
                               f"({2 * want[1]:,} bytes): {want[0] / want[1]:.1f}x smaller")
    if got[1] == d_c:
        return Verdict.not_yet(f"MLA {got[1]}", "the cache row also keeps the RoPE key, shared by all heads")
    if got[0] == n_head * (d_nope + d_v) or got[0] == n_head * (d_nope + d_rope):
        return Verdict.not_yet(f"MHA {got[0]:,}", "a full K head is d_nope + d_rope wide, and V is cached too")
    return Verdict.not_yet(f"{got}", "MHA: n_head x (d_nope + d_rope + d_v); MLA: d_c + d_rope")
