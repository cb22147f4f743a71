"""Checkers of notebook 01_gguf_bytes: a metadata pair decoded by hand, a tensor's bytes and where they sit."""
from __future__ import annotations

import numpy as np

from .verdict import Verdict, needs_answer


@needs_answer("key")
def check_kv_pair(path, offset: int, key: str, value_type: int, value, end: int) -> Verdict:
    """A metadata pair decoded by hand: its key, type id, value and the offset where it ends."""
    from ...ggml.gguf import GGUFFile
    with GGUFFile(path) as f:
        fld = next((x for x in f.fields.values() if x.span.start == offset), None)
        if fld is None:
            return Verdict.not_yet(f"offset {offset}", "no metadata pair starts there: start at 24 and add up the pairs before it")
        if key != fld.key:
            return Verdict.not_yet(f"key {key!r}", "the key is u64 length + that many UTF-8 bytes, right after the pair's start")
        if int(value_type) != int(fld.type):
            return Verdict.not_yet(f"type {value_type}", "the u32 right after the key bytes is the type id")
        want = fld.value
        same = (np.array_equal(np.asarray(value), np.asarray(want)) if isinstance(want, np.ndarray)
                else value == want or (isinstance(want, float) and abs(value - want) <= 1e-6 * abs(want)))
        if not same:
            return Verdict.not_yet(f"value {value!r}", "decode the bytes after the type id with that type's format (e.g. '<I' for u32)")
        if end != fld.span.end:
            return Verdict.not_yet(f"end {end}", "the pair ends right after its value's last byte")
    return Verdict.correct(f"{key} = {value!r} (type {value_type}), bytes {offset}..{end}")


@needs_answer("answer")
def check_tensor_nbytes(path, name: str, answer: int) -> Verdict:
    """Bytes of a tensor's data: rows x blocks per row x bytes per block."""
    from ...ggml.gguf import GGUFFile
    with GGUFFile(path) as f:
        t = f.tensor(name)
        want = t.nbytes
    if answer == want:
        return Verdict.correct(f"{name}: {want:,} bytes")
    n = int(np.prod(t.shape))
    hint = ("that is one byte per weight: divide the elements by the block size and multiply by the block's bytes"
            if answer == n else f"elements / blck_size x type_size, with {t.type.name}: blck_size {t.type.block_size}, "
            f"type_size {t.type.type_size}")
    return Verdict.not_yet(f"{answer:,} bytes", hint)


@needs_answer("answer")
def check_tensor_file_offset(path, name: str, answer: int) -> Verdict:
    """Where a tensor's first byte sits in the file: data section start + the tensor's offset."""
    from ...ggml.gguf import GGUFFile
    with GGUFFile(path) as f:
        t = f.tensor(name)
        want, rel = f.data_offset + t.offset, t.offset
    ok = answer == want
    return Verdict.of(ok, f"byte {answer:,}", "" if ok else
                      ("that is the offset inside the data section; add where the data section starts"
                       if answer == rel else "data_offset (after the directory and its padding) + the entry's offset"))
