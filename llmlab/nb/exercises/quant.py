"""Checkers of notebook 05_quant_blocks: a q4_1 block by hand, bits per weight, a q8_0 block decoded."""
from __future__ import annotations

import numpy as np

from .verdict import Verdict, needs_answer


@needs_answer("answer")
def check_q4_1_block(x, answer) -> Verdict:
    """20 bytes of a q4_1 block made by hand: f16 d, f16 m, then 16 bytes of nibbles (low
    nibbles = weights 0..15, high nibbles = 16..31)."""
    from ...ggml import quant as Q
    want = Q.quantize(np.asarray(x, np.float32), "q4_1")
    got = np.frombuffer(bytes(answer), np.uint8) if not isinstance(answer, np.ndarray) else answer.view(np.uint8).ravel()
    if got.size != 20:
        return Verdict.not_yet(f"{got.size} bytes", "a q4_1 block is 20 bytes: 2 (d) + 2 (m) + 16 (32 nibbles)")
    if np.array_equal(got, want):
        return Verdict.correct("all 20 bytes equal ggml's quantize_row_q4_1_ref")
    if not np.array_equal(got[:2], want[:2]):
        return Verdict.not_yet("d", "d = (max - min) / 15, stored as f16 (little-endian) in bytes 0-1")
    if not np.array_equal(got[2:4], want[2:4]):
        return Verdict.not_yet("m", "m = min of the block, stored as f16 in bytes 2-3")
    wq, gq = want[4:], got[4:]
    if np.array_equal(gq, (wq >> 4) | (wq << 4)):
        return Verdict.not_yet("nibble order", "weight i goes to the low nibble of byte i, weight i+16 to its high nibble")
    bad = int(np.nonzero(gq != wq)[0][0])
    return Verdict.not_yet(f"code byte {bad}", "q = min(15, (int)((x - m) / d + 0.5)), with 1/d computed once in f32")


@needs_answer("answer")
def check_bits_per_weight(qtype, answer: float) -> Verdict:
    from ...ggml.types import ggml_type
    t = ggml_type(qtype)
    ok = abs(answer - t.bits_per_weight) < 1e-6
    return Verdict.of(ok, f"{t.name}: {answer:g} bits per weight", "" if ok else "type_size x 8 / blck_size")


@needs_answer("answer")
def check_q8_0_decode(raw, answer) -> Verdict:
    from ...ggml import quant as Q
    want = Q.dequantize(np.asarray(raw, np.uint8), "q8_0")
    got = np.asarray(answer, np.float32)
    if got.shape != want.shape:
        return Verdict.not_yet(f"{got.size} values", f"a q8_0 block holds {want.size} weights")
    ok = np.array_equal(got.view(np.uint32), want.view(np.uint32))
    return Verdict.of(ok, "32 weights bit for bit" if ok else "values",
                      "" if ok else "x = f32(d) x q, with d the f16 in bytes 0-1 and q the signed bytes 2-33")
