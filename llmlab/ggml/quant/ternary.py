"""Ternary formats for BitNet b1.58 / TriLM models: every weight is -1, 0 or +1 times one scale.

tq2_0 spends 2 bits per trit (2.06 bpw). tq1_0 packs 5 trits into one byte as a base-3
number scaled to 0..255 (3^5 = 243 <= 256), read back with a multiply instead of a
division: trit n of byte q is ``((q * 3^n) mod 256) * 3 >> 8`` (1.69 bpw).
"""
from __future__ import annotations

import numpy as np

from ..types import QK_K
from .core import float32, fp16, inv_or_zero, register, roundf

BLOCK_TQ1_0 = np.dtype([("qs", "u1", ((QK_K - 4 * QK_K // 64) // 5,)), ("qh", "u1", (QK_K // 64,)), ("d", "<f2")])
BLOCK_TQ2_0 = np.dtype([("qs", "u1", (QK_K // 4,)), ("d", "<f2")])

POW3 = np.array([1, 3, 9, 27, 81], np.uint8)


def _trits(q: np.ndarray, k: int) -> np.ndarray:
    """The k base-3 digits (most significant first) of fixed-point bytes q (..., m) -> (..., k, m)."""
    t = (q[..., None, :] * POW3[:k, None]).astype(np.uint8)        # wraps mod 256, like uint8_t in C
    return ((t.astype(np.uint16) * 3) >> 8).astype(np.int8)


def tq1_codes(b) -> np.ndarray:
    """tq1_0 values (n, 256) in -1..1: 160 from qs[0:32], 80 from qs[32:48], 16 from qh."""
    n = b.shape[0]
    qs, qh = b["qs"], b["qh"]
    parts = [_trits(qs[:, :32], 5).reshape(n, 160), _trits(qs[:, 32:], 5).reshape(n, 80), _trits(qh, 4).reshape(n, 16)]
    return np.concatenate(parts, axis=-1) - np.int8(1)


def tq2_codes(b) -> np.ndarray:
    n = b.shape[0]
    q = (b["qs"].reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & 3
    return q.reshape(n, QK_K).astype(np.int8) - np.int8(1)


def dequantize_tq1_0(b):
    return b["d"].astype(float32)[:, None] * tq1_codes(b).astype(float32)


def dequantize_tq2_0(b):
    return b["d"].astype(float32)[:, None] * tq2_codes(b).astype(float32)


def _ternary(x):
    d = np.abs(x).max(-1)
    with np.errstate(over="ignore", invalid="ignore"):
        v = x * inv_or_zero(d)[:, None]                 # 1/d overflows for subnormal d
    v = np.where(np.isfinite(v), roundf(v), 0)         # x86 lroundf(inf or NaN) ends up as int 0
    return d, (v + 1).astype(np.uint8)                 # -1, 0, 1 -> 0, 1, 2


def _pack5(t: np.ndarray, k: int) -> np.ndarray:
    """k trits (..., k, m) -> bytes: base-3 number (first trit most significant) padded to 5 digits,
    then ceil(q * 256 / 243) so that the multiply-and-shift decoding reads it back."""
    q = np.zeros(t.shape[:-2] + t.shape[-1:], np.uint16)
    for i in range(k):
        q = q * 3 + t[..., i, :]
    q = q * 3 ** (5 - k)
    return ((q * 256 + (243 - 1)) // 243).astype(np.uint8)


def quantize_tq1_0(x):
    n = x.shape[0]
    d, t = _ternary(x)
    out = np.zeros(n, BLOCK_TQ1_0)
    out["qs"] = np.concatenate([_pack5(t[:, :160].reshape(n, 5, 32), 5), _pack5(t[:, 160:240].reshape(n, 5, 16), 5)], axis=-1)
    out["qh"] = _pack5(t[:, 240:].reshape(n, 4, 4), 4)
    out["d"] = fp16(d)
    return out


def quantize_tq2_0(x):
    n = x.shape[0]
    d, t = _ternary(x)
    t = t.reshape(n, 2, 4, 32)
    out = np.zeros(n, BLOCK_TQ2_0)
    out["qs"] = (t[:, :, 0] | (t[:, :, 1] << 2) | (t[:, :, 2] << 4) | (t[:, :, 3] << 6)).reshape(n, 64)
    out["d"] = fp16(d)
    return out


register("tq1_0", BLOCK_TQ1_0, dequantize_tq1_0, quantize_tq1_0)
register("tq2_0", BLOCK_TQ2_0, dequantize_tq2_0, quantize_tq2_0)
