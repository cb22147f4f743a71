"""Write GGUF files: metadata with explicit types, tensors aligned in the data section.

The layout is the one gguf-py and llama.cpp write (each tensor padded to the
alignment), so reading a file and writing it back gives the same bytes.
"""
from __future__ import annotations

import os
import struct
from typing import Any, BinaryIO

import numpy as np

from ..types import GGMLType, ggml_type
from .constants import DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_DIMS, SCALAR_DTYPE, ValueType
from .reader import GGUFFile, StringArray


def _infer_type(value) -> tuple[ValueType, ValueType | None]:
    """The GGUF type gguf-py would pick for a Python value."""
    if isinstance(value, (bool, np.bool_)):
        return ValueType.BOOL, None
    if isinstance(value, (int, np.integer)):
        return ValueType.INT32, None
    if isinstance(value, (float, np.floating)):
        return ValueType.FLOAT32, None
    if isinstance(value, str):
        return ValueType.STRING, None
    if isinstance(value, np.ndarray):
        for vt, dt in SCALAR_DTYPE.items():
            if dt == value.dtype.newbyteorder("<") and vt != ValueType.BOOL:
                return ValueType.ARRAY, vt
        if value.dtype == bool:
            return ValueType.ARRAY, ValueType.BOOL
        raise TypeError(f"no GGUF array type for numpy dtype {value.dtype}")
    if isinstance(value, (list, tuple, StringArray)):
        if len(value) == 0:
            raise TypeError("cannot infer the item type of an empty list: pass item_type")
        return ValueType.ARRAY, _infer_type(value[0])[0]
    raise TypeError(f"no GGUF type for {type(value).__name__}")


def _encode_string(s: str) -> bytes:
    raw = s.encode("utf-8")
    return struct.pack("<Q", len(raw)) + raw


def encode_value(value, vtype: ValueType, item_type: ValueType | None = None) -> bytes:
    """The bytes of a value (without key or type code)."""
    if vtype in SCALAR_DTYPE:
        return np.array(value, dtype=SCALAR_DTYPE[vtype]).tobytes()
    if vtype == ValueType.STRING:
        return _encode_string(value)
    if vtype != ValueType.ARRAY:
        raise TypeError(f"bad value type {vtype}")
    if item_type is None:
        item_type = _infer_type(value)[1]
    head = struct.pack("<IQ", item_type, len(value))
    if item_type in SCALAR_DTYPE:
        return head + np.asarray(value).astype(SCALAR_DTYPE[item_type], copy=False).tobytes()
    if item_type == ValueType.STRING:
        return head + b"".join(_encode_string(s) for s in value)
    if item_type == ValueType.ARRAY:
        return head + b"".join(encode_value(v, ValueType.ARRAY) for v in value)
    raise TypeError(f"bad array item type {item_type}")


class GGUFWriter:
    """Collects metadata and tensors, then writes them out in one pass.

    >>> w = GGUFWriter()
    >>> w.add("general.architecture", "llama")
    >>> w.add_tensor("x", np.zeros((2, 32), np.float32))
    >>> w.write("tiny.gguf")
    """

    def __init__(self, version: int = 3, alignment: int | None = None):
        self.version = version
        self.kv: dict[str, tuple[Any, ValueType, ValueType | None]] = {}
        self.tensors: dict[str, tuple[GGMLType, tuple[int, ...], np.ndarray]] = {}
        if alignment is not None:
            self.add("general.alignment", alignment, ValueType.UINT32)

    @property
    def alignment(self) -> int:
        if "general.alignment" not in self.kv:
            return DEFAULT_ALIGNMENT
        a = self.kv["general.alignment"][0]
        if isinstance(a, (bool, np.bool_)) or not isinstance(a, (int, np.integer)) or a <= 0 or a & (a - 1):
            raise ValueError(f"general.alignment {a!r} is not a power of two")
        return int(a)

    def add(self, key: str, value, vtype: ValueType | None = None, item_type: ValueType | None = None) -> None:
        if vtype is None:
            vtype, inferred = _infer_type(value)
            item_type = item_type or inferred
        self.kv[key] = (value, ValueType(vtype), None if item_type is None else ValueType(item_type))

    def add_tensor(self, name: str, data: np.ndarray, type: int | str | GGMLType | None = None,
                   shape: tuple[int, ...] | None = None) -> None:
        """Add a tensor. ``data`` is either a typed array (f32/f16/i32..., numpy order)
        or raw block bytes (uint8) with ``type`` and ``shape`` (ne order) given."""
        if name in self.tensors:
            raise ValueError(f"duplicate tensor name {name!r}")
        if type is None:
            type = {np.dtype(np.float32): "f32", np.dtype(np.float16): "f16", np.dtype(np.int32): "i32",
                    np.dtype(np.int8): "i8", np.dtype(np.int16): "i16", np.dtype(np.int64): "i64",
                    np.dtype(np.float64): "f64"}[data.dtype]
        t = ggml_type(type)
        if shape is None:
            shape = tuple(reversed(data.shape))
        shape = tuple(int(d) for d in shape)
        if not 1 <= len(shape) <= MAX_DIMS or min(shape) <= 0:
            raise ValueError(f"tensor {name!r}: bad shape {shape}")
        raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        n = int(np.prod(shape))
        if raw.size != t.row_size(shape[0]) * (n // shape[0]):
            raise ValueError(f"tensor {name!r}: {raw.size} bytes do not hold a {t.name} tensor of shape {shape}")
        self.tensors[name] = (t, shape, raw)

    @classmethod
    def from_file(cls, f: GGUFFile) -> "GGUFWriter":
        """A writer holding everything a parsed file holds, in the same order and types."""
        w = cls(version=f.version)
        for k, fld in f.fields.items():
            w.kv[k] = (fld.value, fld.type, fld.item_type)
        for t in f.tensors:
            w.tensors[t.name] = (t.type, t.shape, t.data)
        return w

    def _layout(self) -> tuple[bytes, list[int]]:
        parts = [GGUF_MAGIC, struct.pack("<IQQ", self.version, len(self.tensors), len(self.kv))]
        for key, (value, vtype, item_type) in self.kv.items():
            parts += [_encode_string(key), struct.pack("<I", vtype), encode_value(value, vtype, item_type)]
        align, offsets, off = self.alignment, [], 0
        for name, (t, shape, raw) in self.tensors.items():
            offsets.append(off)
            parts += [_encode_string(name), struct.pack("<I", len(shape)),
                      struct.pack(f"<{len(shape)}Q", *shape), struct.pack("<IQ", t.id, off)]
            off += -(-raw.size // align) * align
        head = b"".join(parts)
        return head + bytes(-len(head) % align), offsets

    def write(self, path: str | os.PathLike | BinaryIO, progress=None) -> None:
        """Write the file; ``progress(done_bytes, total_bytes)`` is called per tensor."""
        if isinstance(path, (str, os.PathLike)):
            from ...safeio import atomic_write
            with atomic_write(path) as fh:      # a temporary file beside it, renamed at the end
                self.write(fh, progress)
            return
        head, _ = self._layout()
        path.write(head)
        align = self.alignment
        total = sum(-(-raw.size // align) * align for _, _, raw in self.tensors.values())
        done = 0
        for _, _, raw in self.tensors.values():
            path.write(memoryview(raw))
            pad = -raw.size % align
            path.write(bytes(pad))
            done += raw.size + pad
            if progress:
                progress(done, total)

    def to_bytes(self) -> bytes:
        import io
        buf = io.BytesIO()
        self.write(buf)
        return buf.getvalue()
