"""Checkers for the notebooks' exercises. Each takes the learner's answer, prints "correct" or
what is off (without giving the whole answer away), and returns True or False."""
from __future__ import annotations

import numpy as np


def _unanswered(answer) -> bool:
    if answer is None or answer is Ellipsis:
        return True
    if isinstance(answer, (int, float)) and answer == 0:
        return True
    if isinstance(answer, (list, tuple)) and all(isinstance(a, str) and not a for a in answer):
        return True      # [] or ("", "")
    return isinstance(answer, (bytes, str)) and len(answer) == 0


def _needs(arg: str):
    """Say "fill in your answer" instead of judging the placeholder a notebook starts with."""
    import functools
    import inspect

    def wrap(fn):
        sig = inspect.signature(fn)

        @functools.wraps(fn)
        def check(*a, **kw):
            if _unanswered(sig.bind(*a, **kw).arguments.get(arg)):
                print(f"no answer yet: put yours in the cell (the `{arg}` argument), then run it again")
                return False
            return fn(*a, **kw)
        return check
    return wrap


def _report(ok: bool, what: str, hint: str = "") -> bool:
    print(f"correct: {what}" if ok else f"not yet: {what}: {hint}")
    return ok


# ---------------------------------------------------------------- 00 overview

@_needs("answer")
def check_kv_cache_bytes(model_path, n_ctx: int, answer: int, type_bytes: int = 2) -> bool:
    """KV cache size = n_ctx x n_layer x 2 (K and V) x n_embd_k_gqa x bytes per element (f16: 2)."""
    from ..ggml.gguf import GGUFFile
    from ..viz.gguf import hparams_of
    with GGUFFile(model_path) as f:
        hp = hparams_of(f)
    want = n_ctx * hp["n_layer"] * 2 * hp["n_head_kv"] * hp["head_dim"] * type_bytes
    if answer == want:
        return _report(True, f"{want:,} bytes ({want / 2**20:.1f} MiB)")
    hint = "check n_embd_gqa: it is n_head_kv x head_dim, not n_embd" if answer == n_ctx * hp["n_layer"] * 2 * hp["n_embd"] * type_bytes \
        else "did you count both K and V, and every layer?" if answer in (want // 2, want // hp["n_layer"]) \
        else f"you are off by a factor {answer / want:.3g}"
    return _report(False, f"{answer:,} bytes", hint)


@_needs("answer")
def check_decode_tokens_per_s(weight_bytes: int, bandwidth_gb_s: float, answer: float) -> bool:
    """Upper bound of decode speed when every step reads every weight once from memory."""
    want = bandwidth_gb_s * 1e9 / weight_bytes
    ok = abs(answer - want) <= 0.05 * want
    return _report(ok, f"{answer:.1f} tokens/s", "" if ok else
                   "one decode step reads all weight bytes once: tokens/s = bytes per second / bytes per step")


@_needs("answer")
def check_arithmetic_intensity(bits_per_weight: float, answer: float, batch: int = 1) -> bool:
    """FLOPs per byte of weights in a matrix-vector product over ``batch`` tokens: each weight
    gives one multiply and one add per token."""
    want = 2 * batch / (bits_per_weight / 8)
    ok = abs(answer - want) <= 0.02 * want
    return _report(ok, f"{answer:.3g} FLOP/byte", "" if ok else
                   "count 2 FLOPs (multiply + add) per weight per token, and bits_per_weight / 8 bytes per weight")


# ---------------------------------------------------------------- 01 GGUF

@_needs("key")
def check_kv_pair(path, offset: int, key: str, value_type: int, value, end: int) -> bool:
    """A metadata pair decoded by hand: its key, type id, value and the offset where it ends."""
    from ..ggml.gguf import GGUFFile
    with GGUFFile(path) as f:
        fld = next((x for x in f.fields.values() if x.span.start == offset), None)
        if fld is None:
            return _report(False, f"offset {offset}", "no metadata pair starts there: start at 24 and add up the pairs before it")
        if key != fld.key:
            return _report(False, f"key {key!r}", "the key is u64 length + that many UTF-8 bytes, right after the pair's start")
        if int(value_type) != int(fld.type):
            return _report(False, f"type {value_type}", "the u32 right after the key bytes is the type id")
        want = fld.value
        same = (np.array_equal(np.asarray(value), np.asarray(want)) if isinstance(want, np.ndarray)
                else value == want or (isinstance(want, float) and abs(value - want) <= 1e-6 * abs(want)))
        if not same:
            return _report(False, f"value {value!r}", "decode the bytes after the type id with that type's format (e.g. '<I' for u32)")
        if end != fld.span.end:
            return _report(False, f"end {end}", "the pair ends right after its value's last byte")
    return _report(True, f"{key} = {value!r} (type {value_type}), bytes {offset}..{end}")


@_needs("answer")
def check_tensor_nbytes(path, name: str, answer: int) -> bool:
    """Bytes of a tensor's data: rows x blocks per row x bytes per block."""
    from ..ggml.gguf import GGUFFile
    with GGUFFile(path) as f:
        t = f.tensor(name)
        want = t.nbytes
    if answer == want:
        return _report(True, f"{name}: {want:,} bytes")
    n = int(np.prod(t.shape))
    hint = ("that is one byte per weight: divide the elements by the block size and multiply by the block's bytes"
            if answer == n else f"elements / blck_size x type_size, with {t.type.name}: blck_size {t.type.block_size}, "
            f"type_size {t.type.type_size}")
    return _report(False, f"{answer:,} bytes", hint)


@_needs("answer")
def check_tensor_file_offset(path, name: str, answer: int) -> bool:
    """Where a tensor's first byte sits in the file: data section start + the tensor's offset."""
    from ..ggml.gguf import GGUFFile
    with GGUFFile(path) as f:
        t = f.tensor(name)
        want, rel = f.data_offset + t.offset, t.offset
    ok = answer == want
    return _report(ok, f"byte {answer:,}", "" if ok else
                   ("that is the offset inside the data section; add where the data section starts"
                    if answer == rel else "data_offset (after the directory and its padding) + the entry's offset"))


# ---------------------------------------------------------------- 02 tokenizers

@_needs("answer")
def check_next_bpe_merge(tok, word: str, step: int, answer: tuple[str, str]) -> bool:
    """The pair BPE merges at ``step`` (0-based) of ``word``: the adjacent pair of lowest rank."""
    steps = tok.algorithm.trace(word)
    if step >= len(steps):
        return _report(False, f"step {step}", f"{word!r} has only {len(steps)} merges")
    m = steps[step]
    if tuple(answer) == (m.left, m.right):
        return _report(True, f"{m.left!r} + {m.right!r} (rank {m.rank})")
    before = steps[step - 1].symbols if step else list(tok.algorithm.byte_symbols(word))
    pairs = list(zip(before, before[1:]))
    if tuple(answer) not in pairs:
        return _report(False, f"{answer}", f"that pair is not adjacent in {before}")
    rank = tok.vocab.merges.get(f"{answer[0]} {answer[1]}")
    extra = f" (its rank is {rank})" if rank is not None else " (that pair is not in the merge list)"
    return _report(False, f"{answer}{extra}", f"another adjacent pair has a lower rank (the merge at this step has rank {m.rank})")


@_needs("answer")
def check_segmentation(expected: list[str], answer: list[str], what: str) -> bool:
    ok = list(answer) == list(expected)
    if ok:
        return _report(True, f"{what}: {answer}")
    if "".join(answer) != "".join(expected):
        return _report(False, f"{answer}", "the pieces must join back into the (normalised) text, ▁ markers included")
    first = next(i for i, (a, b) in enumerate(zip(answer + [None] * 9, expected + [None] * 9)) if a != b)
    return _report(False, f"{answer}", f"pieces agree up to piece {first}; look again from there")


@_needs("answer")
def check_wordpiece(text: str, answer: list[str]) -> bool:
    from ..viz.tokenizers_demo import wordpiece
    return check_segmentation(wordpiece(text), answer, f"WordPiece of {text!r}")


@_needs("answer")
def check_unigram(text: str, answer: list[str]) -> bool:
    from ..viz.tokenizers_demo import UGM_VOCAB, score, unigram
    want = unigram(text)
    if list(answer) != want and all(p in UGM_VOCAB for p in answer) and "".join(answer) == "".join(want):
        return _report(False, f"{answer} (total {score(answer):.1f})",
                       f"a segmentation with a higher total exists ({score(want):.1f})")
    return check_segmentation(want, answer, f"Unigram of {text!r}")


# ---------------------------------------------------------------- 05 quantization

@_needs("answer")
def check_q4_1_block(x, answer) -> bool:
    """20 bytes of a q4_1 block made by hand: f16 d, f16 m, then 16 bytes of nibbles (low
    nibbles = weights 0..15, high nibbles = 16..31)."""
    from ..ggml import quant as Q
    want = Q.quantize(np.asarray(x, np.float32), "q4_1")
    got = np.frombuffer(bytes(answer), np.uint8) if not isinstance(answer, np.ndarray) else answer.view(np.uint8).ravel()
    if got.size != 20:
        return _report(False, f"{got.size} bytes", "a q4_1 block is 20 bytes: 2 (d) + 2 (m) + 16 (32 nibbles)")
    if np.array_equal(got, want):
        return _report(True, "all 20 bytes equal ggml's quantize_row_q4_1_ref")
    if not np.array_equal(got[:2], want[:2]):
        return _report(False, "d", "d = (max - min) / 15, stored as f16 (little-endian) in bytes 0-1")
    if not np.array_equal(got[2:4], want[2:4]):
        return _report(False, "m", "m = min of the block, stored as f16 in bytes 2-3")
    wq, gq = want[4:], got[4:]
    if np.array_equal(gq, (wq >> 4) | (wq << 4)):
        return _report(False, "nibble order", "weight i goes to the low nibble of byte i, weight i+16 to its high nibble")
    bad = int(np.nonzero(gq != wq)[0][0])
    return _report(False, f"code byte {bad}", "q = min(15, (int)((x - m) / d + 0.5)), with 1/d computed once in f32")


@_needs("answer")
def check_bits_per_weight(qtype, answer: float) -> bool:
    from ..ggml.types import ggml_type
    t = ggml_type(qtype)
    ok = abs(answer - t.bits_per_weight) < 1e-6
    return _report(ok, f"{t.name}: {answer:g} bits per weight", "" if ok else "type_size x 8 / blck_size")


@_needs("answer")
def check_q8_0_decode(raw, answer) -> bool:
    from ..ggml import quant as Q
    want = Q.dequantize(np.asarray(raw, np.uint8), "q8_0")
    got = np.asarray(answer, np.float32)
    if got.shape != want.shape:
        return _report(False, f"{got.size} values", f"a q8_0 block holds {want.size} weights")
    ok = np.array_equal(got.view(np.uint32), want.view(np.uint32))
    return _report(ok, "32 weights bit for bit" if ok else "values",
                   "" if ok else "x = f32(d) x q, with d the f16 in bytes 0-1 and q the signed bytes 2-33")
