"""The ggml tensor types: one table, as ggml's ``type_traits[]``.

Every layer of llmlab that needs to know how big a block of some type is
(the GGUF reader, the quantizers, the graph allocator) asks this table.
The quant modules attach their block layout and kernels to the same entries
(``GGMLType.layout``, ``to_float``, ``from_float``) when ``llmlab.ggml.quant`` is
imported, the way ggml-cpu fills ``type_traits_cpu`` beside ``type_traits``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

QK_K = 256  # super-block size of the K-quants


@dataclass(eq=False)
class GGMLType:
    id: int
    name: str               # ggml_type_name(): "f32", "q4_k", ...
    block_size: int         # elements per block (ggml's blck_size)
    type_size: int          # bytes per block
    is_quantized: bool
    removed: bool = False   # ids ggml once used and dropped (Q4_2, Q4_3, the Q4_0_x_y repacks)
    # filled by llmlab.ggml.quant: block layout as a numpy structured dtype, and the row converters
    layout: np.dtype | None = field(default=None, repr=False)
    to_float: Callable | None = field(default=None, repr=False)
    from_float: Callable | None = field(default=None, repr=False)

    @property
    def bits_per_weight(self) -> float:
        return 8.0 * self.type_size / self.block_size

    def row_size(self, n: int) -> int:
        """Bytes of a row of ``n`` elements (ggml_row_size)."""
        if n % self.block_size:
            raise ValueError(f"{self.name}: row of {n} elements is not a multiple of the block size {self.block_size}")
        return n // self.block_size * self.type_size

    @property
    def block_dtype(self) -> np.dtype:
        """Structured dtype of one block, or an opaque one if no quant module described it."""
        if self.layout is not None:
            return self.layout
        return np.dtype((np.void, self.type_size))

    def __repr__(self) -> str:
        return f"GGMLType({self.name}, id={self.id})"


def _t(id, name, blck, size, quant=True, removed=False):
    return GGMLType(id, name, blck, size, quant, removed)


# id, name, block size, bytes per block (ggml.c type_traits; removed ids kept so they can be named)
TYPES: dict[int, GGMLType] = {t.id: t for t in [
    _t(0, "f32", 1, 4, False),
    _t(1, "f16", 1, 2, False),
    _t(2, "q4_0", 32, 18),
    _t(3, "q4_1", 32, 20),
    _t(4, "q4_2", 32, 0, removed=True),
    _t(5, "q4_3", 32, 0, removed=True),
    _t(6, "q5_0", 32, 22),
    _t(7, "q5_1", 32, 24),
    _t(8, "q8_0", 32, 34),
    _t(9, "q8_1", 32, 36),
    _t(10, "q2_k", QK_K, 84),
    _t(11, "q3_k", QK_K, 110),
    _t(12, "q4_k", QK_K, 144),
    _t(13, "q5_k", QK_K, 176),
    _t(14, "q6_k", QK_K, 210),
    _t(15, "q8_k", QK_K, 292),
    _t(16, "iq2_xxs", QK_K, 66),
    _t(17, "iq2_xs", QK_K, 74),
    _t(18, "iq3_xxs", QK_K, 98),
    _t(19, "iq1_s", QK_K, 50),
    _t(20, "iq4_nl", 32, 18),
    _t(21, "iq3_s", QK_K, 110),
    _t(22, "iq2_s", QK_K, 82),
    _t(23, "iq4_xs", QK_K, 136),
    _t(24, "i8", 1, 1, False),
    _t(25, "i16", 1, 2, False),
    _t(26, "i32", 1, 4, False),
    _t(27, "i64", 1, 8, False),
    _t(28, "f64", 1, 8, False),
    _t(29, "iq1_m", QK_K, 56),
    _t(30, "bf16", 1, 2, False),
    _t(31, "q4_0_4_4", 32, 0, removed=True),
    _t(32, "q4_0_4_8", 32, 0, removed=True),
    _t(33, "q4_0_8_8", 32, 0, removed=True),
    _t(34, "tq1_0", QK_K, 54),
    _t(35, "tq2_0", QK_K, 66),
    _t(36, "iq4_nl_4_4", 32, 0, removed=True),
    _t(37, "iq4_nl_4_8", 32, 0, removed=True),
    _t(38, "iq4_nl_8_8", 32, 0, removed=True),
    _t(39, "mxfp4", 32, 17),
    _t(40, "nvfp4", 64, 36),
    _t(41, "q1_0", 128, 18),
]}

_BY_NAME = {t.name: t for t in TYPES.values()}

# numpy scalar types of the plain (non-block) types, for zero-copy element views
SCALAR_DTYPES: dict[str, np.dtype] = {
    "f32": np.dtype("<f4"), "f16": np.dtype("<f2"), "f64": np.dtype("<f8"),
    "i8": np.dtype("i1"), "i16": np.dtype("<i2"), "i32": np.dtype("<i4"), "i64": np.dtype("<i8"),
    "bf16": np.dtype("<u2"),  # numpy has no bfloat16: the raw 16-bit patterns
}


class UnknownTypeError(ValueError):
    pass


def ggml_type(t: int | str | GGMLType) -> GGMLType:
    """Look a type up by id, by name (case-insensitive) or pass one through; removed ids are refused."""
    if isinstance(t, GGMLType):
        return t
    if isinstance(t, (int, np.integer)):
        found = TYPES.get(int(t))
        if found is None:
            raise UnknownTypeError(f"unknown ggml type id {int(t)}")
    elif isinstance(t, str):
        found = _BY_NAME.get(t.lower())
        if found is None:
            raise UnknownTypeError(f"unknown ggml type {t!r} (known: {', '.join(sorted(n for n, x in _BY_NAME.items() if not x.removed))})")
    else:
        raise TypeError(f"not a ggml type: {t!r}")
    if found.removed:
        raise UnknownTypeError(f"ggml type {found.name} (id {found.id}) was removed from ggml and cannot be used")
    return found


def register_type(t: GGMLType) -> GGMLType:
    """Add a type at run time (the "add a new format" path); its id and name must be new."""
    if t.id in TYPES or t.name in _BY_NAME:
        raise ValueError(f"ggml type id {t.id} or name {t.name!r} is taken")
    TYPES[t.id] = t
    _BY_NAME[t.name] = t
    return t


def unregister_type(t: GGMLType) -> None:
    TYPES.pop(t.id, None)
    _BY_NAME.pop(t.name, None)
