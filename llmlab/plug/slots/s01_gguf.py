"""Notebook 01, GGUF bytes: one metadata value decoded from the file's bytes.

The reader calls the learner's ``read_value`` for every scalar and string value of the metadata
(arrays stay the reader's: their items are read in bulk), for every file the run opens (the model
and its tokenizer). What it returns is what the reader keeps, and where it says the value ends is
where the reader goes on.
"""
from __future__ import annotations

import struct

import numpy as np

from ..hooks import swap_attr
from ..probe import Where
from ..registry import BadOutput, Mistake, Slot, register_slot

# GGUF value types (gguf.h): code -> struct format of the little-endian scalar
FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING = 8


def read_value(buf, pos, vtype):
    """One value of GGUF type ``vtype`` at ``buf[pos:]``: scalars little-endian; a string is a uint64
    length then that many UTF-8 bytes. -> (value, the position after it)."""
    if vtype == STRING:
        (n,) = struct.unpack_from("<Q", buf, pos)
        pos += 8
        return bytes(buf[pos:pos + n]).decode("utf-8"), pos + n
    fmt = FORMATS[vtype]
    (v,) = struct.unpack_from(fmt, buf, pos)
    return v, pos + struct.calcsize(fmt)


def read_value_skeleton(buf, pos, vtype):
    # buf: the file's bytes; pos: where the value starts; vtype: its GGUF type code (0..12, not 9)
    # -> (value, position after it)
    raise NotImplementedError("read_value: your code here")


def _big_endian(buf, pos, vtype):
    if vtype == STRING:
        (n,) = struct.unpack_from(">Q", buf, pos)
        return bytes(buf[pos + 8:pos + 8 + n]).decode("utf-8"), pos + 8 + n
    fmt = ">" + FORMATS[vtype][1]
    return struct.unpack_from(fmt, buf, pos)[0], pos + struct.calcsize(fmt)


def _len_u32(buf, pos, vtype):
    if vtype == STRING:
        (n,) = struct.unpack_from("<I", buf, pos)
        return bytes(buf[pos + 4:pos + 4 + n]).decode("utf-8", "replace"), pos + 4 + n
    return read_value(buf, pos, vtype)


def _not_advanced(buf, pos, vtype):
    return read_value(buf, pos, vtype)[0], pos


def _float64(buf, pos, vtype):
    if vtype == 6:
        return struct.unpack_from("<d", buf, pos)[0], pos + 8
    return read_value(buf, pos, vtype)


def _bool_int(buf, pos, vtype):
    if vtype == 7:
        return int(buf[pos]), pos + 1
    return read_value(buf, pos, vtype)


def _check(out, engine):
    if not isinstance(out, tuple) or len(out) != 2:
        raise BadOutput(f"returned {type(out).__name__}; the reader needs a pair (value, position after it)")
    v, p = out
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(p, np.integer):
        p = int(p)
    if not isinstance(p, int) or isinstance(p, bool):
        raise BadOutput(f"returned position {p!r}; it must be an int, the offset after the value")
    if not isinstance(v, (int, float, bool, str)):
        raise BadOutput(f"returned a {type(v).__name__} value; a GGUF scalar is an int, float, bool or str")
    return v, p


def _same(a, b) -> bool:
    (va, pa), (vb, pb) = a, b
    if pa != pb or type(va) is not type(vb):
        return False
    if isinstance(va, float):
        return struct.pack("<d", va) == struct.pack("<d", vb)
    return va == vb


def _diff(a, b) -> float:
    (va, _pa), (vb, _pb) = a, b
    if isinstance(va, (int, float)) and isinstance(vb, (int, float)) and not isinstance(va, bool):
        try:
            return float(abs(va - vb))
        except OverflowError:
            return float("inf")
    return 0.0 if va == vb else 1.0


def _install(probe):
    from ...ggml.gguf import reader
    from ...ggml.gguf.constants import ValueType
    orig = reader._read_value

    def read(cur, vtype, what, depth=0):
        if vtype == ValueType.ARRAY:
            return orig(cur, vtype, what, depth)
        start = cur.pos
        value, item = orig(cur, vtype, what, depth)
        engine = (value, cur.pos)
        v, p = probe(Where(what.strip("'\""), "GGUF_KV", None, ValueType(vtype).name), (cur.buf, start, int(vtype)), engine)
        if not 0 <= p <= cur.size:
            from ...ggml.gguf.reader import GGUFError
            raise GGUFError(start, f"{what}: the value's end {p} lies outside the file")
        cur.pos = p
        return v, item
    return swap_attr(reader, "_read_value", read)


def _vt(buf, pos, vtype, out=None):
    return {"type": {4: "UINT32", 5: "INT32", 6: "FLOAT32", 7: "BOOL", 8: "STRING", 10: "UINT64"}.get(vtype, vtype)}


register_slot(Slot(
    name="read_value", notebook="01",
    signature="read_value(buf: bytes-like, pos: int, vtype: int) -> (value, position after it)",
    used_for="every scalar and string metadata value of every GGUF file the run opens (hyperparameters, "
             "names, the tokenizer's settings)",
    reference=read_value, skeleton=read_value_skeleton, install=_install, models=("smollm2", "gemma3"),
    check=_check, equal=_same, diff=_diff,
    mistakes=[
        Mistake("big-endian", _big_endian, "GGUF is little-endian: {node} ({type}) read big-endian", detail=_vt),
        Mistake("string length as uint32", _len_u32,
                "a string's length is a uint64 (8 bytes), not a uint32: {node} starts 4 bytes too early"),
        Mistake("position not advanced", _not_advanced,
                "return the position after the value: {node} came back with its own start, so the reader read "
                "the same bytes again"),
        Mistake("FLOAT32 read as float64", _float64, "type 6 is FLOAT32: 4 bytes, struct format '<f' ({node})"),
        Mistake("bool as int", _bool_int, "type 7 is BOOL: return True or False, not 0 or 1 ({node})"),
    ],
    hint_different="the first value that differs is {node}: check the type's size, sign and byte order"))
