"""ggml-cpu's graph_compute on the reference ops: walk the nodes in order, give each result its bytes,
compute it (``ggml_graph_compute``'s loop over ``ggml_compute_forward``, one thread). The compiled
plans (``cplan``) run the same hooks.

Hooks, in the spirit of llama.cpp's ``cb_eval`` callback:
- ``capture``: names (or a predicate on the tensor); a copy of every matching node's
  result is kept, by name (a name that appears twice keeps the last).
- ``replace``: ``{name: array or fn(tensor, array) -> array}``; the node's result is
  overwritten right after it is computed, before any reader sees it.
- ``callback(tensor)``: called after every node.
- ``dispatch``: ``fn(node) -> bool``: asked first for every node; returns True when it
  computed the node itself (this is how a backend plugs accelerated kernels in).

``cpu``: the CPU profile whose arithmetic the ops reproduce (``llmlab.ggml.cpu.profiles``: a
profile, its name, or None/"auto" for this machine's), passed to every op.
"""
from __future__ import annotations

from typing import Callable, Iterable

import numpy as np

from . import profiles
from .journal import rows_written
from .ops import COMPUTE
from ..cgraph import CGraph
from ..tensor import Tensor


class Hooks:
    """llama.cpp's ``cb_eval`` in Python: what happens right after a node is computed (``replace``,
    then ``capture``, then ``callback``), shared by this executor and the compiled plans."""

    def __init__(self, capture=None, replace=None, callback=None):
        self.want = None
        if capture is not None:
            self.want = capture if callable(capture) else (lambda t, names=frozenset(capture): t.name in names)
        self.replace, self.callback = replace, callback
        self.got: dict[str, np.ndarray] = {}

    def __bool__(self) -> bool:
        return self.want is not None or bool(self.replace) or self.callback is not None

    def after(self, node: Tensor) -> None:
        if self.replace and node.name in self.replace:
            r = self.replace[node.name]
            a = node.array()
            a[...] = np.asarray(r(node, a.copy()) if callable(r) else r, dtype=a.dtype).reshape(a.shape)
            rows_written(a)                         # a replaced cache view: its readers redo the rows
        if self.want is not None and self.want(node):
            self.got[node.name] = node.numpy()
        if self.callback is not None:
            self.callback(node)


def run_nodes(nodes: Iterable[Tensor], capture=None, replace=None, callback=None,
              dispatch: Callable[[Tensor], bool] | None = None, cpu=None) -> dict[str, np.ndarray]:
    cpu = profiles.resolve(cpu)
    hooks = Hooks(capture, replace, callback)
    for node in nodes:
        if node.view_src is None and node.data is None:
            node.data = np.empty(node.nbytes(), np.uint8)
        if dispatch is None or not dispatch(node):
            fn = COMPUTE.get(node.op)
            if fn is None:
                raise NotImplementedError(f"no CPU implementation for op {node.op} (node {node.name})")
            fn(node, cpu)
        hooks.after(node)
    return hooks.got


def compute(graph: CGraph, capture=None, replace=None, callback=None, dispatch=None, cpu=None) -> dict[str, np.ndarray]:
    """Compute every node of the graph on the plain NumPy path (one backend, no scheduler)."""
    for leaf in graph.leafs:
        if leaf.root().data is None:
            raise RuntimeError(f"leaf {leaf.name} has no data: bind weights and set inputs before computing")
    return run_nodes(graph.nodes, capture, replace, callback, dispatch, cpu)
