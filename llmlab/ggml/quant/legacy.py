"""The first ggml formats: one scale per block of 32 (q4_0 .. q8_1), plus the 1-bit q1_0.

``_0`` types are symmetric (``x = d * q``), ``_1`` types carry a minimum (``x = d * q + m``).
The 4- and 5-bit codes of one block are stored as nibbles: byte j holds element j in its
low half and element j + 16 in its high half; the 5th bits of q5 sit in a 32-bit ``qh``.
"""
from __future__ import annotations

import numpy as np

from .core import float32, fp16, first_absmax, first_min_max, inv_or_zero, nibbles, pack_nibbles, register, roundf, seq_sum, trunc_int

QK = 32

BLOCK_Q4_0 = np.dtype([("d", "<f2"), ("qs", "u1", (QK // 2,))])
BLOCK_Q4_1 = np.dtype([("d", "<f2"), ("m", "<f2"), ("qs", "u1", (QK // 2,))])
BLOCK_Q5_0 = np.dtype([("d", "<f2"), ("qh", "u1", (4,)), ("qs", "u1", (QK // 2,))])
BLOCK_Q5_1 = np.dtype([("d", "<f2"), ("m", "<f2"), ("qh", "u1", (4,)), ("qs", "u1", (QK // 2,))])
BLOCK_Q8_0 = np.dtype([("d", "<f2"), ("qs", "i1", (QK,))])
BLOCK_Q8_1 = np.dtype([("d", "<f2"), ("s", "<f2"), ("qs", "i1", (QK,))])
BLOCK_Q1_0 = np.dtype([("d", "<f2"), ("qs", "u1", (16,))])   # 128 signs + one scale


def _scale(b, name="d"):
    return b[name].astype(float32)[:, None]


def q5_codes(b) -> np.ndarray:
    """The 32 five-bit codes of q5 blocks: nibble | (bit j of qh) << 4."""
    hi = np.unpackbits(b["qh"], axis=-1, bitorder="little")
    return nibbles(b["qs"]) | (hi << 4)


def pack_q5(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(qh, qs) of five-bit codes ``q`` (n, 32)."""
    qh = np.packbits((q >> 4).astype(np.uint8), axis=-1, bitorder="little")
    return qh, pack_nibbles(q & 0x0F)


# ---------------------------------------------------------------- dequantize_row_*

def dequantize_q4_0(b):
    return _scale(b) * (nibbles(b["qs"]).astype(np.int8) - np.int8(8)).astype(float32)


def dequantize_q4_1(b):
    return _scale(b) * nibbles(b["qs"]).astype(float32) + _scale(b, "m")


def dequantize_q5_0(b):
    return _scale(b) * (q5_codes(b).astype(np.int8) - np.int8(16)).astype(float32)


def dequantize_q5_1(b):
    return _scale(b) * q5_codes(b).astype(float32) + _scale(b, "m")


def dequantize_q8_0(b):
    return b["qs"].astype(float32) * _scale(b)


dequantize_q8_1 = dequantize_q8_0


def dequantize_q1_0(b):
    d = _scale(b)
    return np.where(np.unpackbits(b["qs"], axis=-1, bitorder="little") != 0, d, -d)


# ---------------------------------------------------------------- quantize_row_*_ref

def _symmetric(x, nmax, offset, top):
    """q4_0 / q5_0: d = max / -nmax (the signed value of largest magnitude), q = min(top, (int)(x/d + offset))."""
    _, mx = first_absmax(x)
    d = (mx / float32(-nmax)).astype(float32)
    q = np.minimum(trunc_int(x * inv_or_zero(d)[:, None] + float32(offset)), top).astype(np.uint8)
    return d, q


def _affine(x, nmax):
    """q4_1 / q5_1: d = (max - min) / nmax, q = (int)((x - min)/d + 0.5)."""
    mn, mx = first_min_max(x)
    d = ((mx - mn) / float32(nmax)).astype(float32)
    q = np.minimum(trunc_int((x - mn[:, None]) * inv_or_zero(d)[:, None] + float32(0.5)), nmax).astype(np.uint8)
    return d, mn, q


def quantize_q4_0(x):
    d, q = _symmetric(x, 8, 8.5, 15)
    out = np.zeros(len(x), BLOCK_Q4_0)
    out["d"], out["qs"] = fp16(d), pack_nibbles(q)
    return out


def quantize_q4_1(x):
    d, mn, q = _affine(x, 15)
    out = np.zeros(len(x), BLOCK_Q4_1)
    out["d"], out["m"], out["qs"] = fp16(d), fp16(mn), pack_nibbles(q)
    return out


def quantize_q5_0(x):
    d, q = _symmetric(x, 16, 16.5, 31)
    out = np.zeros(len(x), BLOCK_Q5_0)
    out["d"] = fp16(d)
    out["qh"], out["qs"] = pack_q5(q)
    return out


def quantize_q5_1(x):
    d, mn, q = _affine(x, 31)
    out = np.zeros(len(x), BLOCK_Q5_1)
    out["d"], out["m"] = fp16(d), fp16(mn)
    out["qh"], out["qs"] = pack_q5(q)
    return out


def quantize_q8_0(x):
    """d = amax / 127, q = roundf(x / d): halves away from zero (the model-file reference)."""
    d = (np.abs(x).max(-1) / float32(127)).astype(float32)
    out = np.zeros(len(x), BLOCK_Q8_0)
    out["d"], out["qs"] = fp16(d), roundf(x * inv_or_zero(d)[:, None])
    return out


def quantize_q8_1(x):
    """As q8_0, plus s = d * sum(q) (as f16), which the q4_1/q5_1 dot products use for the minimum term."""
    d = (np.abs(x).max(-1) / float32(127)).astype(float32)
    q = roundf(x * inv_or_zero(d)[:, None]).astype(np.int32)
    out = np.zeros(len(x), BLOCK_Q8_1)
    out["d"], out["qs"] = fp16(d), q
    out["s"] = fp16(q.sum(-1).astype(float32) * d)
    return out


def quantize_q1_0(x):
    """d = mean |x| (summed left to right), one sign bit per value (x >= 0 -> 1)."""
    d = (seq_sum(np.abs(x)) / float32(x.shape[-1])).astype(float32)
    out = np.zeros(len(x), BLOCK_Q1_0)
    out["d"], out["qs"] = fp16(d), np.packbits(x >= 0, axis=-1, bitorder="little")
    return out


register("q4_0", BLOCK_Q4_0, dequantize_q4_0, quantize_q4_0)
register("q4_1", BLOCK_Q4_1, dequantize_q4_1, quantize_q4_1)
register("q5_0", BLOCK_Q5_0, dequantize_q5_0, quantize_q5_0)
register("q5_1", BLOCK_Q5_1, dequantize_q5_1, quantize_q5_1)
register("q8_0", BLOCK_Q8_0, dequantize_q8_0, quantize_q8_0)
register("q8_1", BLOCK_Q8_1, dequantize_q8_1, quantize_q8_1)
register("q1_0", BLOCK_Q1_0, dequantize_q1_0, quantize_q1_0)
