"""ggml's tensor: a descriptor (type, ne, nb, op, src) that may or may not have data yet.

``ne[i]`` counts elements along dimension i (ggml order: ne[0] is the fastest,
the row length), ``nb[i]`` is the byte stride of dimension i. A view, reshape,
permute or transpose creates a new descriptor over the same bytes: only ne, nb
and ``view_offs`` change. The numpy array of a tensor (``array()``) is made on
demand from the bytes and the strides, so a view really shares memory.
"""
from __future__ import annotations

import numpy as np

from .defs import GGML_MAX_DIMS, GGML_MAX_SRC  # noqa: F401  (ggml.h's limits, read here as ggml_tensor's)
from .types import GGMLType, SCALAR_DTYPES, ggml_type

# tensor flags, as ggml's enum ggml_tensor_flag
FLAG_INPUT = 1
FLAG_OUTPUT = 2
FLAG_PARAM = 4

F32, F16, I32 = ggml_type("f32"), ggml_type("f16"), ggml_type("i32")


def row_strides(t: GGMLType, ne) -> tuple[int, int, int, int]:
    """nb of a contiguous tensor: nb[0] = type size, nb[1] = row size, then products."""
    nb0 = t.type_size
    nb1 = t.row_size(ne[0])
    return (nb0, nb1, nb1 * ne[1], nb1 * ne[1] * ne[2])


class Tensor:
    """One node or leaf of a graph: ggml_tensor's fields, no computing."""

    __slots__ = ("type", "ne", "nb", "op", "op_params", "src", "name", "data",
                 "view_src", "view_offs", "flags", "id", "backend", "buffer_id")

    def __init__(self, type, ne, nb=None, op="NONE", src=(), op_params=None, name="",
                 view_src=None, view_offs=0, data=None):
        self.type: GGMLType = ggml_type(type)
        ne = tuple(int(x) for x in ne) + (1,) * (GGML_MAX_DIMS - len(ne))
        if len(ne) != GGML_MAX_DIMS or min(ne) < 0:
            raise ValueError(f"bad tensor shape {ne}")
        self.ne: tuple[int, int, int, int] = ne
        self.nb: tuple[int, int, int, int] = tuple(nb) if nb is not None else row_strides(self.type, ne)
        self.op: str = op
        self.src: tuple[Tensor, ...] = tuple(src)
        self.op_params: dict = op_params or {}
        self.name: str = name
        if view_src is not None and view_src.view_src is not None:   # views of views point at the root
            view_offs += view_src.view_offs
            view_src = view_src.view_src
        self.view_src: Tensor | None = view_src
        self.view_offs: int = view_offs
        self.data: np.ndarray | None = data    # uint8 bytes owned by this tensor (None for views)
        self.flags: int = 0
        self.id: int = -1          # creation index inside its context
        self.backend: str | None = None   # backend of the buffer holding it (weights, inputs)
        self.buffer_id: int = -1

    # ---- shape facts (ggml_nelements, ggml_nbytes, ggml_is_contiguous, ...)
    @property
    def n_dims(self) -> int:
        for i in range(GGML_MAX_DIMS - 1, 0, -1):
            if self.ne[i] != 1:
                return i + 1
        return 1

    def nelements(self) -> int:
        ne = self.ne
        return ne[0] * ne[1] * ne[2] * ne[3]

    def nrows(self) -> int:
        return self.ne[1] * self.ne[2] * self.ne[3]

    def nbytes(self) -> int:
        """Bytes spanned by the tensor (ggml_nbytes)."""
        if self.nelements() == 0:
            return 0
        t = self.type
        if t.block_size == 1:
            n = t.type_size
            for i in range(4):
                n += (self.ne[i] - 1) * self.nb[i]
            return n
        n = self.ne[0] * self.nb[0] // t.block_size
        for i in range(1, 4):
            n += (self.ne[i] - 1) * self.nb[i]
        return n

    def is_contiguous(self) -> bool:
        return self.nb == row_strides(self.type, self.ne)

    def is_view(self) -> bool:
        return self.view_src is not None

    @property
    def is_leaf(self) -> bool:
        return self.op == "NONE"

    # ---- data
    def root(self) -> "Tensor":
        return self.view_src if self.view_src is not None else self

    def has_data(self) -> bool:
        return self.root().data is not None

    def array(self) -> np.ndarray:
        """The tensor's elements as a numpy view, shape ``ne[::-1]`` (numpy order: last dim first).

        Quantized tensors come back as raw bytes, shape ``(ne3, ne2, ne1, row_bytes)``.
        """
        root = self.view_src if self.view_src is not None else self
        buf = root.data
        if buf is None:
            raise RuntimeError(f"tensor {self.name or '?'} has no data yet (graph not computed or not allocated)")
        ne, nb = self.ne, self.nb
        t = self.type
        if t.block_size != 1:
            return np.ndarray((ne[3], ne[2], ne[1], t.row_size(ne[0])), np.uint8, buf, self.view_offs,
                              (nb[3], nb[2], nb[1], 1))
        return np.ndarray((ne[3], ne[2], ne[1], ne[0]), SCALAR_DTYPES[t.name], buf, self.view_offs,
                          (nb[3], nb[2], nb[1], nb[0]))

    def numpy(self) -> np.ndarray:
        """A copy of the data with trailing unit dimensions dropped (for looking at results)."""
        a = self.array()
        return np.array(a.reshape(a.shape[4 - self.n_dims:]) if self.nelements() else a)

    def set_data(self, values) -> "Tensor":
        """Allocate (if needed) and fill this tensor's own bytes from ``values``."""
        if self.view_src is not None:
            self.array()[...] = np.asarray(values).reshape(self.array().shape)
            return self
        if self.data is None:
            self.data = np.zeros(self.nbytes(), np.uint8)
        a = self.array()
        a[...] = np.asarray(values, dtype=a.dtype).reshape(a.shape)
        return self

    def reading(self, src) -> "Tensor":
        """The same node (same bytes, name, op) computed from other sources: how a backend runs a node whose
        inputs were copied into its memory, without rewiring the graph."""
        t = Tensor.__new__(Tensor)
        for k in Tensor.__slots__:
            setattr(t, k, getattr(self, k))
        t.src = tuple(src)
        return t

    def shape_str(self) -> str:
        return "[" + ", ".join(str(x) for x in self.ne[:max(self.n_dims, 1)]) + "]"

    def __repr__(self) -> str:
        src = ", ".join(s.name or "?" for s in self.src)
        return f"Tensor({self.name or '?'}: {self.op} {self.type.name} {self.shape_str()}{' <- ' + src if src else ''})"
