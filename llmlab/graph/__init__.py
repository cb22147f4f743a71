"""ggml's compute graph in Python: tensors, op constructors, the graph, its executor and drawings.

    from llmlab.graph import Context, ops as ggml, build_forward_expand, CGraph
    ctx = Context(no_alloc=True)
    a = ggml.new_tensor(ctx, "f32", 4, 3, name="a")
    ...

Architecture graph builders are looked up by ``general.architecture`` in ``BUILDERS``
(filled by ``build_llama`` and ``build_gemma3`` on first use of ``get_builder``).
"""
from __future__ import annotations

from . import ops
from .cgraph import CGraph, MemoryPlan, build_forward, build_forward_expand, plan_memory
from .context import Context
from .executor import compute as graph_compute
from .tensor import Tensor

BUILDERS: dict = {}


def register_builder(arch: str):
    def deco(cls):
        BUILDERS[arch] = cls
        return cls
    return deco


def get_builder(arch: str):
    if not BUILDERS:
        from . import build_gemma3, build_llama  # noqa: F401  (they register themselves)
    try:
        return BUILDERS[arch]
    except KeyError:
        raise ValueError(f"no graph builder for architecture {arch!r} (known: {', '.join(sorted(BUILDERS))})") from None


__all__ = ["CGraph", "Context", "MemoryPlan", "Tensor", "BUILDERS", "build_forward", "build_forward_expand",
           "graph_compute", "get_builder", "ops", "plan_memory", "register_builder"]
