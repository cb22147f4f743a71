"""GGUF's on-disk vocabulary: magic, versions, metadata value types."""
from __future__ import annotations

from enum import IntEnum

import numpy as np

from ... import LLMLabError
from ..defs import GGML_MAX_DIMS

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = GGML_MAX_DIMS        # gguf.cpp checks n_dims against ggml.h's limit


class ValueType(IntEnum):
    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


# fixed-size value types and their little-endian numpy dtypes
SCALAR_DTYPE: dict[ValueType, np.dtype] = {
    ValueType.UINT8: np.dtype("u1"),
    ValueType.INT8: np.dtype("i1"),
    ValueType.UINT16: np.dtype("<u2"),
    ValueType.INT16: np.dtype("<i2"),
    ValueType.UINT32: np.dtype("<u4"),
    ValueType.INT32: np.dtype("<i4"),
    ValueType.FLOAT32: np.dtype("<f4"),
    ValueType.BOOL: np.dtype("u1"),
    ValueType.UINT64: np.dtype("<u8"),
    ValueType.INT64: np.dtype("<i8"),
    ValueType.FLOAT64: np.dtype("<f8"),
}


class GGUFError(LLMLabError, ValueError):
    """A malformed or unsupported GGUF file; the message names the byte offset."""

    def __init__(self, offset: int | None, problem: str):
        self.offset = offset
        self.problem = problem
        where = f"at offset {offset}: " if offset is not None else ""
        super().__init__(f"GGUF {where}{problem}")
