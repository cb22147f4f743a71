"""Read a GGUF file from a read-only mmap, recording where every part lives.

Layout (all little-endian)::

    header     magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
    metadata   n_kv x (string key | u32 value type | value)
    directory  n_tensors x (string name | u32 n_dims | u64 ne[n_dims] | u32 ggml type | u64 offset)
    padding    up to general.alignment (default 32)
    data       tensors at their offsets, each aligned

A string is u64 length + UTF-8 bytes; an array is u32 item type + u64 count + items.
Nothing is trusted: every length and count is checked against the bytes left
before anything is allocated from it, and tensor data are never read here
(they are numpy views of the mmap, touched only when used).
"""
from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from ... import LLMLabError
from ..types import GGMLType, SCALAR_DTYPES, UnknownTypeError, ggml_type
from .constants import (DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_DIMS, SCALAR_DTYPE,
                        SUPPORTED_VERSIONS, GGUFError, ValueType)

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_MAX_NESTING = 16
# items inside arrays of arrays, over the whole file: each becomes a Python object (~100 bytes for
# 12 bytes of file), so an 8-million-item nested array would cost gigabytes and minutes
MAX_NESTED_ITEMS = 1 << 16


@dataclass(frozen=True)
class Span:
    """A byte range ``[start, end)`` of the file and what it holds."""
    start: int
    end: int
    kind: str    # header | kv | tensor_info | padding | tensor_data
    label: str = ""

    @property
    def size(self) -> int:
        return self.end - self.start


class StringArray(Sequence[str]):
    """A GGUF string array kept as offsets into the file; strings are decoded on access.

    A 262,144-token vocabulary is located with one pass over its length prefixes,
    then decoded in one go by ``tolist()`` when a tokenizer asks for it.
    """

    def __init__(self, buf: memoryview, starts: np.ndarray, lengths: np.ndarray):
        self._buf, self.starts, self.lengths = buf, starts, lengths
        self._cache: list[str] | None = None

    def __len__(self) -> int:
        return len(self.starts)

    def raw(self, i: int) -> bytes:
        s = int(self.starts[i])
        return bytes(self._buf[s:s + int(self.lengths[i])])

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if self._cache is not None:
            return self._cache[i]
        i = range(len(self))[i]
        return _decode(self.raw(i), int(self.starts[i]) - 8)

    def tolist(self) -> list[str]:
        if self._cache is None:
            buf, starts, lengths = self._buf, self.starts.tolist(), self.lengths.tolist()
            try:
                self._cache = [str(buf[s:s + n], "utf-8") for s, n in zip(starts, lengths)]
            except UnicodeDecodeError:
                for i in range(len(self)):   # find which one, for the message
                    self[i]
                raise
        return self._cache

    def __iter__(self) -> Iterator[str]:
        return iter(self.tolist())

    def __eq__(self, other) -> bool:
        return list(self) == list(other)

    def __repr__(self) -> str:
        head = ", ".join(repr(s) for s in self[:4])
        return f"StringArray([{head}{', ...' if len(self) > 4 else ''}], n={len(self)})"


@dataclass
class KVField:
    """One metadata pair: its value, its GGUF types, and its bytes in the file."""
    key: str
    type: ValueType
    value: Any
    item_type: ValueType | None   # for arrays: the type of the items
    span: Span


@dataclass
class TensorInfo:
    """One entry of the tensor directory, plus a zero-copy view of its data."""
    name: str
    type: GGMLType
    shape: tuple[int, ...]        # ne, ggml order: shape[0] is the contiguous row length
    offset: int                   # relative to the data section
    nbytes: int
    info_span: Span
    data_span: Span
    _file: "GGUFFile" = field(repr=False, compare=False, default=None)

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def data(self) -> np.ndarray:
        """The raw bytes (uint8), a view of the mmap."""
        return np.frombuffer(self._file._mm, dtype=np.uint8, count=self.nbytes, offset=self.data_span.start)

    @property
    def blocks(self) -> np.ndarray:
        """The data as rows of blocks: numpy shape (ne[n-1], ..., ne[1], ne[0] / block_size)."""
        t = self.type
        shape = tuple(reversed(self.shape[1:])) + (self.shape[0] // t.block_size,)
        return self.data.view(t.block_dtype).reshape(shape)

    @property
    def array(self) -> np.ndarray:
        """Plain types (f32, f16, i32, ...) as a numpy array in numpy order (reversed ne)."""
        dt = SCALAR_DTYPES.get(self.type.name)
        if dt is None:
            raise TypeError(f"tensor {self.name} is {self.type.name}, a block type: use .blocks or llmlab.ggml.quant.dequantize")
        return self.data.view(dt).reshape(tuple(reversed(self.shape)))


class _Cursor:
    """Bounds-checked little-endian reads over the mmap."""

    def __init__(self, buf: memoryview):
        self.buf = buf
        self.size = len(buf)
        self.pos = 0
        self.nested = 0     # items read inside arrays of arrays so far

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise GGUFError(self.pos, f"truncated file: {what} needs {n} bytes, {self.size - self.pos} left")

    def u32(self, what: str) -> int:
        self.need(4, what)
        v = _U32.unpack_from(self.buf, self.pos)[0]
        self.pos += 4
        return v

    def u64(self, what: str) -> int:
        self.need(8, what)
        v = _U64.unpack_from(self.buf, self.pos)[0]
        self.pos += 8
        return v

    def string(self, what: str) -> str:
        start = self.pos
        n = self.u64(f"length of {what}")
        self.need(n, f"{what} ({n} bytes)")
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return _decode(raw, start)


def _decode(raw: bytes, offset: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise GGUFError(offset, f"string is not valid UTF-8 ({e.reason} at byte {e.start})") from None


def _value_type(code: int, offset: int) -> ValueType:
    try:
        return ValueType(code)
    except ValueError:
        raise GGUFError(offset, f"unknown metadata value type {code}") from None


def _read_value(cur: _Cursor, vtype: ValueType, what: str, depth: int = 0):
    """Returns (value, item_type)."""
    if vtype in SCALAR_DTYPE:
        dt = SCALAR_DTYPE[vtype]
        cur.need(dt.itemsize, what)
        v = np.frombuffer(cur.buf, dtype=dt, count=1, offset=cur.pos)[0]
        cur.pos += dt.itemsize
        if vtype == ValueType.BOOL:
            if v > 1:
                raise GGUFError(cur.pos - 1, f"{what}: bool value {int(v)} is neither 0 nor 1")
            return bool(v), None
        return (float(v) if dt.kind == "f" else int(v)), None
    if vtype == ValueType.STRING:
        return cur.string(what), None
    # array
    if depth >= _MAX_NESTING:
        raise GGUFError(cur.pos, f"{what}: arrays nested deeper than {_MAX_NESTING}")
    at = cur.pos
    item_type = _value_type(cur.u32(f"{what} item type"), at)
    count = cur.u64(f"{what} count")
    left = cur.size - cur.pos
    if item_type in SCALAR_DTYPE:
        dt = SCALAR_DTYPE[item_type]
        if count > left // dt.itemsize:
            raise GGUFError(at, f"{what}: array of {count} {item_type.name} needs {count * dt.itemsize} bytes, {left} left")
        arr = np.frombuffer(cur.buf, dtype=dt, count=count, offset=cur.pos).copy()
        cur.pos += count * dt.itemsize
        if item_type == ValueType.BOOL:
            if count and arr.max() > 1:
                raise GGUFError(at, f"{what}: bool array holds a value other than 0 or 1")
            arr = arr.astype(bool)
        return arr, item_type
    min_item = 8 if item_type == ValueType.STRING else 12
    if count > left // min_item:
        raise GGUFError(at, f"{what}: array of {count} {item_type.name} cannot fit in the {left} bytes left")
    if item_type == ValueType.STRING:
        return _read_string_array(cur, count, what), item_type
    cur.nested += count
    if cur.nested > MAX_NESTED_ITEMS:
        raise GGUFError(at, f"{what}: nested arrays hold more than {MAX_NESTED_ITEMS} items in all "
                            "(a limit against files that would take gigabytes to load)")
    items = [_read_value(cur, item_type, f"{what}[{i}]", depth + 1)[0] for i in range(count)]
    return items, item_type


def _read_string_array(cur: _Cursor, count: int, what: str) -> StringArray:
    buf, size, pos = cur.buf, cur.size, cur.pos
    starts = np.empty(count, dtype=np.int64)
    lengths = np.empty(count, dtype=np.int64)
    unpack = _U64.unpack_from
    try:
        for i in range(count):   # each length says where the next one starts: inherently a scan
            n = unpack(buf, pos)[0]
            pos += 8
            if n > size - pos:
                raise GGUFError(pos - 8, f"{what}[{i}]: string of {n} bytes runs past the end of the file")
            starts[i] = pos
            lengths[i] = n
            pos += n
    except struct.error:
        raise GGUFError(pos, f"truncated file: {what}[{i}] length needs 8 bytes, {size - pos} left") from None
    cur.pos = pos
    return StringArray(buf, starts, lengths)


class GGUFFile:
    """A parsed GGUF file.

    ``kv`` maps keys to values (Python scalars, numpy arrays, ``StringArray``),
    ``fields`` keeps their GGUF types and byte ranges, ``tensors`` is the
    directory in file order, ``spans`` tiles the whole file.
    """

    def __init__(self, path: str | os.PathLike):
        from ...safeio import open_regular
        self.path = Path(path)
        self._fh = open_regular(self.path)      # read-only; a FIFO or a directory is refused, never waited on
        try:
            st = os.fstat(self._fh.fileno())
            size, self._opened = st.st_size, (st.st_size, st.st_mtime_ns)
            if size == 0:
                raise GGUFError(0, "empty file")
            self._mm = mmap.mmap(self._fh.fileno(), 0, access=mmap.ACCESS_READ)
            self._parse(memoryview(self._mm))
        except BaseException:
            self.close()
            raise

    # -- parsing -----------------------------------------------------------
    def _parse(self, buf: memoryview) -> None:
        cur = _Cursor(buf)
        self.file_size = cur.size
        cur.need(4, "magic")
        magic = bytes(buf[0:4])
        if magic != GGUF_MAGIC:
            raise GGUFError(0, f"bad magic {magic!r}, expected {GGUF_MAGIC!r}: not a GGUF file")
        cur.pos = 4
        self.version = cur.u32("version")
        if self.version not in SUPPORTED_VERSIONS:
            hint = " (a big-endian file?)" if self.version & 0xFFFF == 0 and self.version else ""
            raise GGUFError(4, f"unsupported GGUF version {self.version}{hint}; supported: {SUPPORTED_VERSIONS}")
        n_tensors = cur.u64("tensor count")
        n_kv = cur.u64("metadata count")
        spans = [Span(0, cur.pos, "header", "magic, version, counts")]
        left = cur.size - cur.pos
        if n_kv > left // 13:      # smallest pair: empty key (8) + type (4) + u8 (1)
            raise GGUFError(16, f"metadata count {n_kv} cannot fit in the {left} bytes left")
        if n_tensors > left // 24:  # smallest entry: empty name (8) + n_dims (4) + type (4) + offset (8)
            raise GGUFError(8, f"tensor count {n_tensors} cannot fit in the {left} bytes left")

        self.fields: dict[str, KVField] = {}
        for i in range(n_kv):
            start = cur.pos
            key = cur.string(f"key of metadata pair {i}")
            if key in self.fields:
                raise GGUFError(start, f"duplicate metadata key {key!r}")
            t_at = cur.pos
            vtype = _value_type(cur.u32(f"type of {key!r}"), t_at)
            value, item_type = _read_value(cur, vtype, repr(key))
            span = Span(start, cur.pos, "kv", key)
            self.fields[key] = KVField(key, vtype, value, item_type, span)
            spans.append(span)
        self.kv: dict[str, Any] = {k: f.value for k, f in self.fields.items()}

        align = self.kv.get("general.alignment", DEFAULT_ALIGNMENT)
        if (not isinstance(align, int) or isinstance(align, bool) or align <= 0 or align & (align - 1)):
            raise GGUFError(self.fields["general.alignment"].span.start, f"general.alignment {align!r} is not a power of two")
        self.alignment = align

        raw_infos = []
        names = set()
        for i in range(n_tensors):
            start = cur.pos
            name = cur.string(f"name of tensor {i}")
            if name in names:
                raise GGUFError(start, f"duplicate tensor name {name!r}")
            names.add(name)
            nd_at = cur.pos
            n_dims = cur.u32(f"n_dims of {name!r}")
            if n_dims > MAX_DIMS:
                raise GGUFError(nd_at, f"tensor {name!r} has {n_dims} dimensions, at most {MAX_DIMS} allowed")
            shape = []
            for d in range(n_dims):
                d_at = cur.pos
                ne = cur.u64(f"ne[{d}] of {name!r}")
                if ne >= 1 << 63:        # an int64 below 0; 0 itself is an empty tensor, as gguf.cpp reads it
                    raise GGUFError(d_at, f"tensor {name!r} has dimension ne[{d}] = {ne - (1 << 64)}, "
                                          f"must be >= 0")
                shape.append(ne)
            t_at = cur.pos
            code = cur.u32(f"type of {name!r}")
            try:
                gtype = ggml_type(code)
            except UnknownTypeError as e:
                raise GGUFError(t_at, f"tensor {name!r}: {e}") from None
            o_at = cur.pos
            offset = cur.u64(f"offset of {name!r}")
            if shape and shape[0] % gtype.block_size:
                raise GGUFError(nd_at, f"tensor {name!r}: ne[0] = {shape[0]} is not a multiple of the {gtype.name} "
                                       f"block size {gtype.block_size}")
            n = 1
            for ne in shape:
                n *= ne
            nbytes = n // gtype.block_size * gtype.type_size
            raw_infos.append((name, gtype, tuple(shape) or (1,), offset, nbytes, Span(start, cur.pos, "tensor_info", name), o_at))
            spans.append(raw_infos[-1][5])

        dir_end = cur.pos
        self.data_offset = -(-dir_end // align) * align
        if n_tensors and self.data_offset > cur.size:
            raise GGUFError(dir_end, f"truncated file: data section would start at {self.data_offset}, file has {cur.size} bytes")
        if self.data_offset > dir_end:
            spans.append(Span(dir_end, min(self.data_offset, cur.size), "padding", "alignment"))

        self.tensors: list[TensorInfo] = []
        data_size = cur.size - self.data_offset
        for name, gtype, shape, offset, nbytes, ispan, o_at in raw_infos:
            if offset % align:
                raise GGUFError(o_at, f"tensor {name!r}: offset {offset} is not a multiple of the alignment {align}")
            if offset + nbytes > data_size:
                raise GGUFError(o_at, f"tensor {name!r}: data [{offset}, {offset + nbytes}) lies outside the {data_size}-byte data section")
            dspan = Span(self.data_offset + offset, self.data_offset + offset + nbytes, "tensor_data", name)
            self.tensors.append(TensorInfo(name, gtype, shape, offset, nbytes, ispan, dspan, self))
        by_offset = sorted(self.tensors, key=lambda t: (t.offset, t.nbytes))   # an empty tensor before one it shares
        #                                                                       its offset with (gguf.cpp pads 0 to 0)
        pos = self.data_offset
        for prev, t in zip([None] + by_offset[:-1], by_offset):
            if prev is not None and t.data_span.start < prev.data_span.end:
                raise GGUFError(t.info_span.start, f"tensor {t.name!r} overlaps tensor {prev.name!r} in the data section")
            if t.data_span.start > pos:
                spans.append(Span(pos, t.data_span.start, "padding", "alignment"))
            if t.nbytes:              # an empty tensor (a zero dimension) has no bytes to show
                spans.append(t.data_span)
            pos = max(pos, t.data_span.end)
        if pos < cur.size and n_tensors:
            spans.append(Span(pos, cur.size, "padding", "tail"))
        self.spans: list[Span] = sorted(spans, key=lambda s: (s.start, s.end))
        self._by_name = {t.name: t for t in self.tensors}

    # -- access ------------------------------------------------------------
    def tensor(self, name: str) -> TensorInfo:
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"no tensor named {name!r} in {self.path.name}") from None

    def __contains__(self, name: str) -> bool:
        return name in self._by_name

    @property
    def buffer(self) -> np.ndarray:
        """The whole mapped file as a read-only uint8 array (no copy): ``buffer[a:b]`` are bytes a..b."""
        return np.frombuffer(self._mm, dtype=np.uint8)

    @property
    def architecture(self) -> str | None:
        return self.kv.get("general.architecture")

    def check_unchanged(self) -> None:
        """Raise when the file under the mapping was cut short or written since it was opened: a page
        past a truncated end kills the process with SIGBUS when read, and rewritten bytes would be
        silently wrong weights. (A file replaced by a rename is harmless: the mapping keeps the old one.)"""
        fh = getattr(self, "_fh", None)
        if fh is None or fh.closed:
            return
        st = os.fstat(fh.fileno())
        if st.st_size < self._opened[0]:
            raise LLMLabError(f"{self.path}: the file was truncated to {st.st_size:,} bytes while in use "
                              f"(it had {self._opened[0]:,})")
        if (st.st_size, st.st_mtime_ns) != self._opened:
            raise LLMLabError(f"{self.path}: the file was modified while in use")

    def close(self) -> None:
        mm, self._mm = getattr(self, "_mm", None), None
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                pass   # numpy views still alive: the mapping goes when they do
        fh = getattr(self, "_fh", None)
        if fh is not None:
            fh.close()

    def __enter__(self) -> "GGUFFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"GGUFFile({self.path.name!r}, v{self.version}, {len(self.fields)} kv, "
                f"{len(self.tensors)} tensors, arch={self.architecture!r})")
