"""Scaled dot-product attention in plain NumPy (float64), one step per function, and its tiled twin.

Shapes follow the engine's per-head layout: ``q`` is ``(n_head, n_q, d)``, ``k`` and ``v`` are
``(n_head_kv, n_kv, d)``; query head ``h`` reads KV head ``h // (n_head // n_head_kv)`` (grouped-query
sharing, the way ggml's MUL_MAT broadcasts). A mask is ``(n_q, n_kv)`` of 0 (visible) and -inf (hidden).

    s = scores(q, k, scale)          # (n_head, n_q, n_kv)
    p = softmax(s + mask)            # each row sums to 1
    o = weighted_sum(p, v)           # (n_head, n_q, d_v)
    out = merge_heads(o)             # (n_q, n_head * d_v): the heads side by side, as kqv_out

:func:`flash_attention` computes the same ``o`` without ever holding a full ``n_q x n_kv`` score
matrix: it walks the keys in tiles and keeps, per query row, a running maximum ``m``, a running sum
``l`` and an unnormalised output ``acc`` (the online softmax of Milakov & Gimelshein, 2018).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..llama.hparams import HParams


def split_heads(x: np.ndarray, n_head: int) -> np.ndarray:
    """(n_tokens, n_head * d) -> (n_head, n_tokens, d): each head gets its own slice of every row."""
    n, width = x.shape
    if width % n_head:
        raise ValueError(f"split_heads: width {width} is not a multiple of n_head={n_head}")
    return np.ascontiguousarray(x.reshape(n, n_head, width // n_head).transpose(1, 0, 2))


def merge_heads(o: np.ndarray) -> np.ndarray:
    """(n_head, n_tokens, d) -> (n_tokens, n_head * d): concatenate the heads' outputs, row by row."""
    h, n, d = o.shape
    return np.ascontiguousarray(o.transpose(1, 0, 2).reshape(n, h * d))


def repeat_kv(x: np.ndarray, n_head: int) -> np.ndarray:
    """(n_head_kv, n, d) -> (n_head, n, d): each KV head serves n_head // n_head_kv consecutive query heads."""
    if n_head % x.shape[0]:
        raise ValueError(f"repeat_kv: {n_head} query heads cannot share {x.shape[0]} KV heads evenly")
    return np.repeat(x, n_head // x.shape[0], axis=0)


def scores(q: np.ndarray, k: np.ndarray, scale: float = 1.0) -> np.ndarray:
    """(n_head, n_q, d) x (n_head_kv, n_kv, d) -> (n_head, n_q, n_kv): scale * Q K^T, per head."""
    q = np.asarray(q, np.float64)
    return scale * q @ repeat_kv(np.asarray(k, np.float64), q.shape[0]).transpose(0, 2, 1)


def causal_mask(n_q: int, n_kv: int | None = None, q_pos=None, kv_pos=None, window: int = 0) -> np.ndarray:
    """0 where query i may see key j (kv_pos[j] <= q_pos[i], and within ``window`` if given), else -inf."""
    n_kv = n_q if n_kv is None else n_kv
    qp = np.arange(n_q) if q_pos is None else np.asarray(q_pos)
    kp = np.arange(n_kv) if kv_pos is None else np.asarray(kv_pos)
    ok = kp[None, :] <= qp[:, None]
    if window:                                  # the sliding window of Gemma 3's local layers
        ok &= ~HParams.is_masked_swa(window, "standard", kp[None, :], qp[:, None])
    return np.where(ok, 0.0, -np.inf)


def softmax(s: np.ndarray, axis: int = -1) -> np.ndarray:
    """exp(s - max) / sum, row by row; rows that are all -inf give 0 (nothing visible)."""
    s = np.asarray(s, np.float64)
    m = np.max(s, axis=axis, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(m), m, 0.0))
    tot = e.sum(axis=axis, keepdims=True)
    return np.divide(e, tot, out=np.zeros_like(e), where=tot > 0)


def weighted_sum(p: np.ndarray, v: np.ndarray) -> np.ndarray:
    """(n_head, n_q, n_kv) x (n_head_kv, n_kv, d_v) -> (n_head, n_q, d_v): each output mixes the V rows."""
    p = np.asarray(p, np.float64)
    return p @ repeat_kv(np.asarray(v, np.float64), p.shape[0])


def attention(q, k, v, mask=None, scale: float = 1.0, return_probs: bool = False):
    """softmax(scale * Q K^T + mask) V, the naive way: the whole (n_head, n_q, n_kv) matrix exists at once."""
    s = scores(q, k, scale)
    if mask is not None:
        s = s + np.asarray(mask, np.float64)
    p = softmax(s)
    o = weighted_sum(p, v)
    return (o, p) if return_probs else o


@dataclass
class FlashStats:
    """What the tiled loop did: tiles computed and skipped (fully masked), and the largest score block held."""
    block_q: int
    block_k: int
    tiles_computed: int = 0
    tiles_skipped: int = 0
    peak_scores: int = 0                 # elements of the largest score tile (per head)
    rescales: int = 0                    # times a running max grew and the partial output was rescaled
    history: list = field(default_factory=list)   # (q tile, k tile, running max of the first query row)


def flash_attention(q, k, v, mask=None, scale: float = 1.0, block_q: int = 16, block_k: int = 16,
                    return_stats: bool = False):
    """The same result as :func:`attention`, computed tile by tile with an online softmax.

    For each tile of ``block_q`` queries, walk the keys ``block_k`` at a time. With the tile's scores
    ``s`` (block_q x block_k, masked) and the running ``m`` (max), ``l`` (sum of exps), ``acc``:

        m_new = max(m, max_j s_j)
        acc   = acc * exp(m - m_new) + exp(s - m_new) @ V_tile
        l     = l   * exp(m - m_new) + sum_j exp(s_j - m_new)

    and at the end ``o = acc / l``. A tile whose mask is -inf everywhere is skipped (causal attention
    never looks at the upper-right tiles), so no score matrix larger than block_q x block_k is ever made.
    """
    q = np.asarray(q, np.float64)
    n_head, n_q, _ = q.shape
    K, V = repeat_kv(np.asarray(k, np.float64), n_head), repeat_kv(np.asarray(v, np.float64), n_head)
    n_kv = K.shape[1]
    M = np.zeros((n_q, n_kv)) if mask is None else np.asarray(mask, np.float64)
    out = np.zeros((n_head, n_q, V.shape[-1]))
    st = FlashStats(block_q, block_k)
    for q0 in range(0, n_q, block_q):
        qt = q[:, q0:q0 + block_q]
        bq = qt.shape[1]
        m = np.full((n_head, bq, 1), -np.inf)
        l = np.zeros((n_head, bq, 1))
        acc = np.zeros((n_head, bq, V.shape[-1]))
        for k0 in range(0, n_kv, block_k):
            mt = M[q0:q0 + bq, k0:k0 + block_k]
            if not np.isfinite(mt).any():
                st.tiles_skipped += 1
                continue
            st.tiles_computed += 1
            s = scale * qt @ K[:, k0:k0 + block_k].transpose(0, 2, 1) + mt      # (h, bq, bk): one tile
            st.peak_scores = max(st.peak_scores, s.shape[1] * s.shape[2])
            m_new = np.maximum(m, s.max(-1, keepdims=True))
            safe = np.where(np.isfinite(m_new), m_new, 0.0)
            alpha = np.exp(np.where(np.isfinite(m), m - safe, -np.inf))        # rescale what was summed so far
            st.rescales += int((np.isfinite(m) & (m_new > m)).sum())
            e = np.exp(s - safe)
            acc = acc * alpha + e @ V[:, k0:k0 + block_k]
            l = l * alpha + e.sum(-1, keepdims=True)
            m = m_new
            st.history.append((q0 // block_q, k0 // block_k, float(m[0, 0, 0])))
        out[:, q0:q0 + bq] = np.divide(acc, l, out=np.zeros_like(acc), where=l > 0)
    return (out, st) if return_stats else out
