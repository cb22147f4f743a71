"""The one typed accessor for GGUF metadata: every key has a type and a range, checked on read.

A GGUF file can parse perfectly and still lie: ``general.architecture`` a number,
``{arch}.attention.key_length`` zero, ``tokenizer.ggml.tokens`` a single string. llama.cpp's
``llama_model_loader::get_key`` refuses a key of the wrong GGUF type ("key %s has wrong type %s but
expected type %s"); this module does the same for every reader of metadata (hparams, vocab, dump),
and also checks the range the math needs (positive sizes, finite epsilons).

``Metadata`` wraps a ``GGUFFile`` (its fields keep the GGUF types) or a plain dict (types are
inferred from the Python values). It is a ``Mapping``: ``md[key]`` and ``md.get(key, default)``
check the key against ``SCHEMA`` when it has an entry; the typed getters (``md.int(key, min=1)``,
``md.str(key)``, ``md.array(key, "str")``) check any key. A lie raises ``MetadataError``, naming
the key, what the file holds and what was expected::

    metadata 'llama.attention.key_length' is uint32 0; expected an integer in [1, 16384]
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

from ... import LLMLabError
from .constants import ValueType

MISSING: Any = object()

INT_TYPES = frozenset({ValueType.UINT8, ValueType.INT8, ValueType.UINT16, ValueType.INT16, ValueType.UINT32,
                       ValueType.INT32, ValueType.UINT64, ValueType.INT64})
FLOAT_TYPES = frozenset({ValueType.FLOAT32, ValueType.FLOAT64})


class MetadataError(LLMLabError, ValueError):
    """A metadata key of the wrong type, out of range, or missing."""

    def __init__(self, key: str, problem: str):
        self.key = key
        super().__init__(problem)


# --------------------------------------------------------------------------- kinds and the schema
@dataclass(frozen=True)
class Spec:
    """What one key must hold.

    ``kind``: ``int`` ``float`` ``bool`` ``str``, an array ``int[]`` ``float[]`` ``str[]``, or
    ``int|int[]`` (a scalar, or one value per layer as llama.cpp's ``get_key_or_arr`` reads it).
    ``lo``/``hi`` bound numbers (the items of numeric arrays) or the length of arrays and strings;
    ``lo_open`` makes the lower bound exclusive (``> 0`` for epsilons). Floats must be finite.
    """
    kind: str
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False

    def expected(self) -> str:
        what = {"int": "an integer", "float": "a finite number", "bool": "a bool", "str": "a string",
                "int[]": "an array of integers", "float[]": "an array of finite numbers",
                "str[]": "an array of strings", "int|int[]": "an integer or an array of integers"}[self.kind]
        if self.lo is None and self.hi is None:
            return what
        if self.kind == "str":
            return f"a string of {_num(self.lo or 0)} to {_num(self.hi)} characters"
        if self.kind == "str[]":
            return f"an array of {_num(self.lo or 0)} to {_num(self.hi)} strings"
        lo = "(" if self.lo_open else "["
        inner = "" if self.kind in ("int", "float") else " with items"
        if self.hi is None:
            return f"{what}{inner} {'>' if self.lo_open else '>='} {_num(self.lo)}"
        return f"{what}{inner} in {lo}{_num(self.lo)}, {_num(self.hi)}]"


def _num(x) -> str:
    if x is None:
        return "inf"
    return str(int(x)) if float(x).is_integer() else repr(float(x))


I32 = (1 << 31) - 1
U32 = (1 << 32) - 1
_POS = Spec("int", 1, I32)

# keys under "{arch}." (the prefix is general.architecture)
ARCH_SCHEMA: dict[str, Spec] = {
    "context_length": _POS,
    "embedding_length": Spec("int", 1, 1 << 20),
    "block_count": Spec("int", 1, 512),                         # LLAMA_MAX_LAYERS
    "feed_forward_length": Spec("int|int[]", 1, 1 << 22),
    "attention.head_count": Spec("int|int[]", 1, 1 << 14),
    "attention.head_count_kv": Spec("int|int[]", 1, 1 << 14),
    "attention.key_length": Spec("int", 1, 1 << 14),
    "attention.value_length": Spec("int", 1, 1 << 14),
    "attention.layer_norm_rms_epsilon": Spec("float", 0, 1, lo_open=True),
    "attention.layer_norm_epsilon": Spec("float", 0, 1, lo_open=True),
    "attention.sliding_window": Spec("int", 0, I32),
    "attention.scale": Spec("float", 0, 1e6, lo_open=True),
    "rope.dimension_count": Spec("int", 1, 1 << 14),
    "rope.freq_base": Spec("float", 0, 1e12, lo_open=True),
    "rope.scaling.factor": Spec("float", 0, 1e6),
    "rope.scaling.original_context_length": _POS,
    "vocab_size": Spec("int", 1, 1 << 24),
    "final_logit_softcapping": Spec("float", 0, 1e6, lo_open=True),
    "attn_logit_softcapping": Spec("float", 0, 1e6, lo_open=True),
}

_TOKEN_ID = Spec("int", -1, U32)   # llama.cpp warns about (and ignores) an id outside the vocabulary
SCHEMA: dict[str, Spec] = {
    "general.architecture": Spec("str", 1, 64),
    "general.name": Spec("str"),
    "general.alignment": Spec("int", 1, 1 << 30),
    "general.file_type": Spec("int", 0, U32),
    "general.quantization_version": Spec("int", 0, U32),
    "tokenizer.ggml.model": Spec("str"),
    "tokenizer.ggml.pre": Spec("str"),
    "tokenizer.ggml.tokens": Spec("str[]", 1, 1 << 24),
    "tokenizer.ggml.scores": Spec("float[]"),
    "tokenizer.ggml.token_type": Spec("int[]", -I32 - 1, I32),
    "tokenizer.ggml.merges": Spec("str[]", 0, 1 << 24),
    "tokenizer.ggml.add_bos_token": Spec("bool"),
    "tokenizer.ggml.add_eos_token": Spec("bool"),
    "tokenizer.ggml.add_space_prefix": Spec("bool"),
    "tokenizer.chat_template": Spec("str"),
    **{f"tokenizer.ggml.{k}_token_id": _TOKEN_ID
       for k in ("bos", "eos", "eot", "eom", "unknown", "seperator", "padding", "mask")},
}


# --------------------------------------------------------------------------- values and their types
def _infer(value) -> tuple[ValueType | None, ValueType | None]:
    """(type, item type) of a plain Python/numpy value, as the writer would store it."""
    from .reader import StringArray
    if isinstance(value, (bool, np.bool_)):
        return ValueType.BOOL, None
    if isinstance(value, (int, np.integer)):
        return ValueType.INT64, None
    if isinstance(value, (float, np.floating)):
        return ValueType.FLOAT64, None
    if isinstance(value, str):
        return ValueType.STRING, None
    if isinstance(value, StringArray):
        return ValueType.ARRAY, ValueType.STRING
    if isinstance(value, np.ndarray):
        k = value.dtype.kind
        item = {"b": ValueType.BOOL, "i": ValueType.INT64, "u": ValueType.UINT64, "f": ValueType.FLOAT64,
                "U": ValueType.STRING}.get(k)
        return ValueType.ARRAY, item
    if isinstance(value, (list, tuple)):
        items = {_infer(v)[0] for v in value}
        if len(items) == 1:
            return ValueType.ARRAY, items.pop()
        if not items:
            return ValueType.ARRAY, None     # empty: fits any item type
        if items <= INT_TYPES | FLOAT_TYPES:
            return ValueType.ARRAY, ValueType.FLOAT64
        return ValueType.ARRAY, ValueType.ARRAY   # mixed: matches no typed array
    return None, None


def describe(value, vtype: ValueType | None, item: ValueType | None = None) -> str:
    """What a value is, for an error message: ``uint32 0``, ``a string 'x'``, ``an array of 3 float32``."""
    if vtype == ValueType.ARRAY:
        n = len(value) if hasattr(value, "__len__") else "?"
        what = {None: "items", ValueType.STRING: "strings", ValueType.ARRAY: "arrays"}.get(item) or f"{item.name.lower()} values"
        return f"an array of {n} {what}"
    if vtype == ValueType.STRING:
        s = value if len(value) <= 40 else value[:37] + "..."
        return f"a string {s!r}"
    if vtype is None:
        return f"a {type(value).__name__}"
    return f"{vtype.name.lower()} {value!r}"


def _finite_array(a) -> bool:
    return bool(np.isfinite(np.asarray(a, dtype=np.float64)).all()) if len(a) else True


def check(key: str, value, vtype: ValueType | None, item: ValueType | None, spec: Spec, where: str = ""):
    """The value if it is what ``spec`` asks for, else MetadataError. Numbers come back as
    Python int/float, arrays as they are (numpy arrays, StringArray)."""
    kind = spec.kind
    if kind == "int|int[]":
        kind = "int[]" if vtype == ValueType.ARRAY else "int"

    def fail(why: str = ""):
        found = describe(value, vtype, item)
        raise MetadataError(key, f"{where}metadata {key!r} is {found}{why}; expected {spec.expected()}")

    def in_range(x) -> bool:
        if spec.lo is not None and (x <= spec.lo if spec.lo_open else x < spec.lo):
            return False
        return spec.hi is None or x <= spec.hi

    if kind == "int":
        if vtype not in INT_TYPES:
            fail()
        v = int(value)
        if not in_range(v):
            fail()
        return v
    if kind == "float":
        if vtype not in FLOAT_TYPES and vtype not in INT_TYPES:
            fail()
        v = float(value)
        if not math.isfinite(v) or not in_range(v):
            fail()
        return v
    if kind == "bool":
        if vtype != ValueType.BOOL:
            fail()
        return bool(value)
    if kind == "str":
        if vtype != ValueType.STRING:
            fail()
        if not in_range(len(value)):
            fail(f" of length {len(value)}")
        return value
    # arrays
    want = {"int[]": INT_TYPES, "float[]": FLOAT_TYPES | INT_TYPES, "str[]": {ValueType.STRING}}[kind]
    if vtype != ValueType.ARRAY or (item not in want and not (item is None and len(value) == 0)):
        fail()
    if kind == "str[]":
        if not in_range(len(value)):
            fail()
        return value
    if kind == "int[]" and len(value):
        arr = np.asarray(value)
        if arr.dtype.kind not in "iu":
            fail()
        if not in_range(int(arr.min())) or not in_range(int(arr.max())):
            bad = next(int(x) for x in arr if not in_range(int(x)))
            fail(f" (holding {bad})")
    if kind == "float[]" and len(value):
        if not _finite_array(value):
            fail(" (holding a non-finite value)")
        arr = np.asarray(value, dtype=np.float64)
        if not in_range(float(arr.min())) or not in_range(float(arr.max())):
            fail()
    return value


# --------------------------------------------------------------------------- the accessor
class Metadata(Mapping):
    """Typed, range-checked access to a GGUF file's metadata (see the module docstring)."""

    def __init__(self, values: Mapping[str, Any], types: Mapping[str, tuple] | None = None, where: str = ""):
        self._values = values
        self._types = types             # key -> (type, item type); None: infer from the value
        self.where = where              # prefix of error messages ("model.gguf: ")
        arch = values.get("general.architecture")
        self.arch = arch if isinstance(arch, str) else None

    @classmethod
    def of(cls, obj) -> "Metadata":
        """A GGUFFile, a Metadata (returned as is) or a plain dict of values."""
        if isinstance(obj, Metadata):
            return obj
        fields = getattr(obj, "fields", None)
        if fields is not None:
            name = getattr(getattr(obj, "path", None), "name", "")
            return cls(obj.kv, {k: (f.type, f.item_type) for k, f in fields.items()}, f"{name}: " if name else "")
        return cls(obj)

    # -- Mapping: schema-checked
    def __getitem__(self, key: str):
        value = self._values[key]
        spec = self.spec(key)
        if spec is None:
            return value
        return self._check(key, spec)

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __contains__(self, key) -> bool:
        return key in self._values

    def get(self, key: str, default=None):
        return self[key] if key in self._values else default

    def raw(self, key: str, default=None):
        """The value as stored, unchecked (for display)."""
        return self._values.get(key, default)

    def type_of(self, key: str) -> tuple[ValueType | None, ValueType | None]:
        if self._types is not None and key in self._types:
            return self._types[key]
        return _infer(self._values[key])

    def spec(self, key: str) -> Spec | None:
        s = SCHEMA.get(key)
        if s is None and self.arch and key.startswith(self.arch + "."):
            s = ARCH_SCHEMA.get(key[len(self.arch) + 1:])
        return s

    def _check(self, key: str, spec: Spec):
        vtype, item = self.type_of(key)
        return check(key, self._values[key], vtype, item, spec, self.where)

    def _typed(self, key: str, spec: Spec, default):
        if key not in self._values:
            if default is MISSING:
                raise MetadataError(key, f"{self.where}metadata key {key!r} is missing; expected {spec.expected()}")
            return default
        return self._check(key, spec)

    # -- typed getters (any key; the range given here, else the schema's)
    def _spec(self, key: str, kind: str, lo, hi, lo_open=False) -> Spec:
        if lo is None and hi is None:
            s = self.spec(key)
            if s is not None and s.kind == kind:
                return s
        return Spec(kind, lo, hi, lo_open)

    def int(self, key: str, default=MISSING, min: int | None = None, max: int | None = None) -> int:
        return self._typed(key, self._spec(key, "int", min, max), default)

    def float(self, key: str, default=MISSING, min: float | None = None, max: float | None = None,
              positive: bool = False) -> float:
        return self._typed(key, self._spec(key, "float", 0 if positive else min, max, positive), default)

    def bool(self, key: str, default=MISSING) -> bool:
        return self._typed(key, Spec("bool"), default)

    def str(self, key: str, default=MISSING) -> str:
        return self._typed(key, self._spec(key, "str", None, None), default)

    def array(self, key: str, item: str, default=MISSING, min_len: int | None = None, max_len: int | None = None):
        """An array of ``item`` (``int``, ``float``, ``str``); lengths bound ``str`` arrays."""
        return self._typed(key, self._spec(key, item + "[]", min_len, max_len), default)

    def per_layer(self, key: str, n_layer: int, default=MISSING, min: int = 1, max: int | None = None) -> list[int]:
        """``get_key_or_arr``: one value for all layers, or an array of ``n_layer`` values."""
        v = self._typed(key, self._spec(key, "int|int[]", min, max), default)
        if isinstance(v, int):
            return [v] * n_layer
        if len(v) != n_layer:
            raise MetadataError(key, f"{self.where}metadata {key!r} has {len(v)} values; expected one per layer ({n_layer})")
        return [int(x) for x in v]

    def peek(self, key: str, kind: str, default=None):
        """The value when it is of ``kind`` and in the schema's range, else ``default`` (for display)."""
        if key not in self._values:
            return default
        try:
            return self._check(key, self._spec(key, kind, None, None))
        except MetadataError:
            return default

    def problems(self) -> list[str]:
        """Every schema violation in the file, one message per key (what gguf-dump warns about)."""
        out = []
        for key in self._values:
            spec = self.spec(key)
            if spec is None:
                continue
            try:
                self._check(key, spec)
            except MetadataError as e:
                out.append(str(e)[len(self.where):])
        return out


def json_safe(v):
    """A metadata value as strict JSON can hold it: NaN and infinities become the strings
    ``"nan"``, ``"inf"``, ``"-inf"``; numpy arrays and StringArrays become lists."""
    from .reader import StringArray
    if isinstance(v, (np.ndarray, StringArray)):
        v = v.tolist()
    if isinstance(v, (list, tuple)):
        return [json_safe(x) for x in v]
    if isinstance(v, (float, np.floating)):
        v = float(v)
        return v if math.isfinite(v) else ("nan" if v != v else ("inf" if v > 0 else "-inf"))
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.bool_):
        return bool(v)
    return v
