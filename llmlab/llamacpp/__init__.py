"""llama.cpp in the loop: capture llama.cpp's own compute graph, node by node, and diff llmlab's against it.

``capture(model_path, tokens, flash_attn=...)`` runs one decode in llama.cpp
(through llama-cpp-python's low-level API) with an evaluation callback and
returns every node it computed: name, op, shape, type and values.
``diff(llmlab_nodes, capture)`` aligns the two graphs by node name.

llama.cpp's model, context and batch are handled in one place
(:class:`~llmlab.llamacpp.session.Session`), and always in a worker process
(:mod:`~llmlab.llamacpp.worker`): a crash of llama.cpp raises
:class:`LlamaCppCrashed` instead of ending the caller's process.

llama-cpp-python is optional: this package imports without it, and
``capture`` raises a clear error when it is missing.
"""
from __future__ import annotations

from .. import LLAMA_CPP_PYTHON
from .diff import DiffReport, NodeDiff, diff, float32_tolerance

__all__ = ["capture", "run_logits", "cached_vs_fresh", "tokenize", "context_report", "Capture", "Node", "diff",
           "DiffReport", "NodeDiff", "float32_tolerance", "llmlab_nodes", "available", "LlamaCppCrashed",
           "LLAMA_CPP_PYTHON"]


def available() -> bool:
    """Whether llama-cpp-python is installed (without importing it)."""
    import importlib.util
    return importlib.util.find_spec("llama_cpp") is not None


def __getattr__(name):
    if name in ("capture", "run_logits", "cached_vs_fresh", "tokenize", "context_report", "Capture", "Node"):
        from . import eval_callback as _c
        return getattr(_c, name)
    if name == "LlamaCppCrashed":
        from .worker import LlamaCppCrashed
        return LlamaCppCrashed
    if name == "llmlab_nodes":
        from .bridge import llmlab_nodes
        return llmlab_nodes
    raise AttributeError(name)
