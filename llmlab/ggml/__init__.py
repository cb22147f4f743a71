"""ggml, the tensor library half of llama.cpp: types, GGUF, quant formats, tensors, ops, the graph and
its allocator (``alloc``), backends and scheduler, and the CPU backend (``ggml.cpu``: its numerics and
graph_compute).

    from llmlab.ggml import GGMLContext, ops as ggml, build_forward_expand, CGraph
    ctx = GGMLContext(no_alloc=True)
    a = ggml.new_tensor(ctx, "f32", 4, 3, name="a")
    ...
"""
from __future__ import annotations

from . import ops
from .alloc import MemoryPlan, plan_memory
from .cgraph import CGraph, build_forward, build_forward_expand
from .context import GGMLContext
from .cpu.executor import compute as graph_compute
from .tensor import Tensor

__all__ = ["CGraph", "GGMLContext", "MemoryPlan", "Tensor", "build_forward", "build_forward_expand",
           "graph_compute", "ops", "plan_memory"]
