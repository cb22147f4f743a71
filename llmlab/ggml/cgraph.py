"""ggml_cgraph: the nodes in the order they will run, and the leafs they read.

``build_forward_expand(graph, t)`` is ggml's depth-first walk (ggml_visit_parents):
a tensor already visited is skipped; otherwise its sources are visited first,
src[0] before src[1] and so on, and then the tensor itself is appended, to
``leafs`` if it has no op (weights, inputs, constants) or to ``nodes`` if it has
one. Calling it again with another output extends the same graph, which is how
llama.cpp pins the order of side effects (KV-cache writes before attention).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from .tensor import FLAG_PARAM, Tensor


@dataclass
class CGraph:
    nodes: list[Tensor] = field(default_factory=list)
    leafs: list[Tensor] = field(default_factory=list)
    visited: set = field(default_factory=set)       # ggml's visited_hash_set (by identity)
    name: str = "graph"

    @property
    def n_nodes(self) -> int:
        return len(self.nodes)

    @property
    def n_leafs(self) -> int:
        return len(self.leafs)

    def get_tensor(self, name: str) -> Tensor:
        """The last node or leaf with this name (ggml_graph_get_tensor looks nodes, then leafs)."""
        for t in reversed(self.nodes):
            if t.name == name:
                return t
        for t in self.leafs:
            if t.name == name:
                return t
        raise KeyError(f"no tensor named {name!r} in {self.name}")

    def find(self, name: str) -> list[Tensor]:
        return [t for t in self.nodes + self.leafs if t.name == name]

    def op_counts(self) -> Counter:
        return Counter(t.op for t in self.nodes)

    def __repr__(self) -> str:
        return f"CGraph({self.name}: {self.n_nodes} nodes, {self.n_leafs} leafs)"


def visit_parents(graph: CGraph, node: Tensor) -> None:
    stack = [(node, 0)]          # iterative DFS (Python's recursion limit would be hit on deep models)
    visited = graph.visited
    if id(node) in visited:
        return
    visited.add(id(node))
    while stack:
        t, i = stack[-1]
        if i < len(t.src):
            stack[-1] = (t, i + 1)
            s = t.src[i]
            if s is not None and id(s) not in visited:
                visited.add(id(s))
                stack.append((s, 0))
            continue
        stack.pop()
        if t.op == "NONE" and not (t.flags & FLAG_PARAM):
            if not t.name:
                t.name = f"leaf_{len(graph.leafs)}"
            graph.leafs.append(t)
        else:
            if not t.name:
                t.name = f"node_{len(graph.nodes)}"
            graph.nodes.append(t)


def build_forward_expand(graph: CGraph, tensor: Tensor) -> CGraph:
    n0 = graph.n_nodes
    visit_parents(graph, tensor)
    if graph.n_nodes > n0 and graph.nodes[-1] is not tensor:
        raise AssertionError("the last added node should be the starting point")
    return graph


def build_forward(tensor: Tensor, name: str = "graph") -> CGraph:
    return build_forward_expand(CGraph(name=name), tensor)

