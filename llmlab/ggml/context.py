"""ggml_context: where tensor descriptors (and, unless ``no_alloc``, their bytes) come from.

ggml hands out memory from one pre-sized arena with a bump pointer: every
``ggml_new_tensor`` puts an object header and a tensor struct at the current
offset and, when the context owns data, the tensor's bytes right after. Nothing
is ever freed one by one; the whole context is dropped at once.

With ``no_alloc=True`` (what llama.cpp uses for weights and for compute graphs)
only the descriptors are placed: the bytes come later from a backend buffer
(weights: the mmap; intermediate results: the graph allocator).
"""
from __future__ import annotations

import numpy as np

from .tensor import Tensor

GGML_MEM_ALIGN = 16
# sizeof(struct ggml_object) + sizeof(struct ggml_tensor) on 64-bit builds (ggml_tensor_overhead())
GGML_OBJECT_SIZE = 32
GGML_TENSOR_SIZE = 336
TENSOR_OVERHEAD = GGML_OBJECT_SIZE + GGML_TENSOR_SIZE


def _pad(n: int, a: int = GGML_MEM_ALIGN) -> int:
    return (n + a - 1) // a * a


class GGMLContext:
    """A bump allocator over one arena of ``mem_size`` bytes (``mem_size=None``: grows, for convenience)."""

    def __init__(self, mem_size: int | None = None, no_alloc: bool = False, name: str = "ctx"):
        self.mem_size = mem_size
        self.no_alloc = no_alloc
        self.name = name
        self.tensors: list[Tensor] = []
        self.offs = 0                       # the bump pointer
        self.layout: list[tuple[str, int, int, int]] = []   # (name, object offset, data offset, data bytes)
        self._arena = None if mem_size is None or no_alloc else np.zeros(mem_size, np.uint8)

    def new(self, t: Tensor) -> Tensor:
        """Place a freshly made descriptor in this context (ggml_new_object + ggml_new_tensor_impl)."""
        need_data = (not self.no_alloc) and t.view_src is None and t.data is None
        data_size = _pad(t.nbytes()) if need_data else 0
        obj_offs = self.offs
        end = obj_offs + TENSOR_OVERHEAD + data_size
        if self.mem_size is not None and end > self.mem_size:
            raise MemoryError(f"{self.name}: not enough space in the context's memory pool "
                              f"(needed {end} bytes, available {self.mem_size})")
        if need_data:
            data_offs = obj_offs + TENSOR_OVERHEAD
            if self._arena is not None:
                t.data = self._arena[data_offs:data_offs + t.nbytes()]
            else:
                t.data = np.zeros(t.nbytes(), np.uint8)
        else:
            data_offs = -1
        self.offs = end
        t.id = len(self.tensors)
        self.tensors.append(t)
        self.layout.append((t.name, obj_offs, data_offs, data_size))
        return t

    @property
    def used(self) -> int:
        """Bytes taken from the arena so far (ggml_used_mem)."""
        return self.offs

    def new_tensor(self, type, ne, name: str = "") -> Tensor:
        return self.new(Tensor(type, ne, name=name))

    def get_tensor(self, name: str) -> Tensor:
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(f"no tensor named {name!r} in context {self.name}")

    def __repr__(self) -> str:
        return (f"GGMLContext({self.name}: {len(self.tensors)} tensors, {self.used} bytes used"
                f"{', no_alloc' if self.no_alloc else ''})")
