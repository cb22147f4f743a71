"""ggml_backend_sched: assign every node to a backend, cut the graph into splits, copy across.

Backends are given in priority order, the CPU last (as llama.cpp does). Tensors
that already live in a buffer (weights, the KV cache) are pinned to the backend
of that buffer; everything else is decided by the five passes of
``ggml_backend_sched_split_graph``, one function each:

1. :func:`pass_preallocated`: a node whose data or view source lives in a buffer goes
   there; graph inputs go to the CPU; an op reading a weight runs where the weight is
   (unless a higher-priority backend asks to offload it);
2. :func:`pass_expand`: accelerator assignments spread down then up to unassigned
   neighbours (the CPU does not spread), then every assignment spreads down and up;
   an op the backend does not support is left for later;
3. :func:`pass_upgrade`: move to a higher-priority backend with the same buffer type
   that supports the op; unassigned nodes go to the backend that supports them and
   holds the most of their inputs;
4. :func:`pass_views_and_sources`: views follow their source; unassigned sources
   follow the node that reads them;
5. :func:`pass_split`: a new split starts where the backend changes; every source
   living on a buffer the split's backend cannot read gets a copy (made once per
   backend), and the node reads the copy.

The graph is left as it was given: the copies and which node reads which copy are
recorded in the :class:`Schedule` (``node_src``), and a split runs its nodes through
:meth:`Tensor.reading` with those sources. Each pass's assignment is kept in
``Schedule.passes`` so it can be replayed. A schedule stays valid for its graph as long
as the graph's shapes and placement do (llama.cpp reuses both together).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..cgraph import CGraph
from ..ops import VIEW_OPS
from ..tensor import FLAG_INPUT, Tensor
from .backend import Backend, CPUBackend


@dataclass
class Split:
    backend: int
    i_start: int
    i_end: int = -1
    inputs: list[Tensor] = field(default_factory=list)     # tensors copied into this split's backend


@dataclass
class Schedule:
    graph: CGraph
    backends: list[Backend]
    assignment: dict[int, int]                              # id(tensor) -> backend index
    passes: list[tuple[str, list[int]]]                     # (pass name, backend per node after it)
    causes: dict[int, str]                                  # id(tensor) -> why ("1.wgt0", "2.sup", ...)
    splits: list[Split]
    copies: dict[tuple[int, int], Tensor]                   # (id(src), backend) -> its copy
    bytes_copied: int = 0                                   # by the last run
    node_src: dict[int, tuple[Tensor, ...]] = field(default_factory=dict)   # id(node) -> the sources it reads
    n_runs: int = 0

    @property
    def n_splits(self) -> int:
        return len(self.splits)

    @property
    def n_copies(self) -> int:
        return len(self.copies)

    @property
    def bytes_to_copy(self) -> int:
        """Bytes every run copies across split boundaries (the sum of the splits' input sizes)."""
        return sum(t.nbytes() for s in self.splits for t in s.inputs)

    def backend_of(self, t: Tensor) -> str:
        b = self.assignment.get(id(t), -1)
        return self.backends[b].name if b >= 0 else "?"

    def split_nodes(self, s: Split) -> list[Tensor]:
        return self.graph.nodes[s.i_start:s.i_end]

    def run_nodes(self, s: Split) -> list[Tensor]:
        """The split's nodes as its backend runs them: a node with copied inputs reads the copies."""
        return [n.reading(self.node_src[id(n)]) if id(n) in self.node_src else n for n in self.split_nodes(s)]

    def summary(self) -> list[dict]:
        rows = []
        for i, s in enumerate(self.splits):
            nodes = self.split_nodes(s)
            rows.append(dict(split=i, backend=self.backends[s.backend].name, nodes=len(nodes),
                             first=nodes[0].name if nodes else "", last=nodes[-1].name if nodes else "",
                             inputs=[t.name for t in s.inputs],
                             input_bytes=sum(t.nbytes() for t in s.inputs)))
        return rows


class _Assignment:
    """The state the passes share: backend per tensor (by id), why, and the buffers of pre-allocated tensors."""

    def __init__(self, backends: list[Backend], buffers: dict[int, str], weights: set[int]):
        self.backends, self.buffers, self.weights = backends, buffers, weights
        self.cpu = len(backends) - 1
        self.backend: dict[int, int] = {}
        self.cause: dict[int, str] = {}

    def of(self, t: Tensor) -> int:
        return self.backend.get(id(t), -1)

    def set(self, t: Tensor, b: int, why: str) -> None:
        self.backend[id(t)] = b
        self.cause[id(t)] = why

    def from_buffer(self, t: Tensor) -> int:
        """The backend that can use the buffer holding ``t`` (-1: not pre-allocated)."""
        buft = self.buffers.get(id(t))
        if buft is None:
            return -1
        for b, be in enumerate(self.backends):
            if be.supports_buft(buft):
                return b
        raise ValueError(f"no backend can use buffer type {buft} of {t.name}")

    def buffer_supported(self, t: Tensor, b: int) -> bool:
        """Can backend ``b`` read ``t`` where it lives (its buffer, or its backend's buffer type)?"""
        buft = self.buffers.get(id(t)) or (self.buffers.get(id(t.view_src)) if t.view_src is not None else None)
        if buft is None:
            tb = self.of(t)
            if tb == -1 and t.view_src is not None:
                tb = self.of(t.view_src)
            if tb != -1:
                buft = self.backends[tb].buffer_type
        return buft is not None and self.backends[b].supports_buft(buft)

    def snapshot(self, graph: CGraph) -> list[int]:
        return [self.of(n) for n in graph.nodes]


def pass_preallocated(graph: CGraph, a: _Assignment, op_offload: bool) -> None:
    """Pass 1: pre-allocated tensors stay with their buffer, inputs go to the CPU, weight readers follow the weight."""
    bk = a.backends
    for t in list(graph.leafs) + list(graph.nodes):
        if a.of(t) != -1:
            continue
        b = a.from_buffer(t)
        if b != -1:
            a.set(t, b, "1.dst")
            continue
        if t.view_src is not None and (b := a.from_buffer(t.view_src)) != -1:
            a.set(t, b, "1.vsrc")
            continue
        if t.flags & FLAG_INPUT:
            a.set(t, a.cpu, "1.inp")
            continue
        for i, s in enumerate(t.src):
            if t.op != "ROPE" and id(s) in a.weights:
                sb = a.from_buffer(s)
                off = next((b for b in range(sb) if bk[b].supports_op(t) and bk[b].offload_op(t)), -1) \
                    if op_offload and sb == a.cpu else -1
                if off != -1:
                    a.set(t, off, "1.off")
                else:
                    a.set(t, sb, f"1.wgt{i}")
                break


def _expand(order, a: _Assignment, skip_cpu: bool) -> None:
    cur = -1
    for n in order:
        if n.op in VIEW_OPS:
            continue
        b = a.of(n)
        if b != -1:
            cur = -1 if (skip_cpu and b == a.cpu) else b
        elif cur != -1 and a.backends[cur].supports_op(n):
            a.set(n, cur, "2.sup")


def pass_expand(graph: CGraph, a: _Assignment) -> None:
    """Pass 2: accelerator assignments spread down then up (not the CPU's), then every assignment does."""
    nodes = graph.nodes
    for skip_cpu in (True, False):
        _expand(nodes, a, skip_cpu)
        _expand(reversed(nodes), a, skip_cpu)


def pass_upgrade(graph: CGraph, a: _Assignment) -> None:
    """Pass 3: move up to a higher-priority backend sharing the buffer type; place the rest by their inputs."""
    bk = a.backends
    for n in graph.nodes:
        if n.op in VIEW_OPS:
            continue
        b = a.of(n)
        if b == -1:
            best = -1
            for cand in range(len(bk)):
                if bk[cand].supports_op(n):
                    k = sum(1 for s in n.src if (a.of(s) != -1 or (s.view_src is not None and a.of(s.view_src) != -1))
                            and a.buffer_supported(s, cand))
                    if k > best:
                        best = k
                        a.set(n, cand, "3.best")
        else:
            for cand in range(b):
                if bk[cand].buffer_type == bk[b].buffer_type and bk[cand].supports_op(n) and \
                        all(a.buffer_supported(s, cand) for s in n.src):
                    a.set(n, cand, "3.upg")
                    break


def pass_views_and_sources(graph: CGraph, a: _Assignment) -> None:
    """Pass 4: views follow their source; a source nobody placed follows the node that reads it."""
    for n in graph.nodes:
        if n.view_src is not None and a.of(n) == -1:
            a.set(n, a.of(n.view_src), "4.vsrc")
        for s in n.src:
            if a.of(s) == -1:
                if s.view_src is not None:
                    a.set(s, a.of(s.view_src), "4.vsrc")
                else:
                    a.set(s, a.of(n), "4.cur")
    for n in graph.nodes:
        if a.of(n) == -1:
            raise RuntimeError(f"node {n.name} ({n.op}) could not be assigned to any backend")


def pass_split(graph: CGraph, a: _Assignment) -> tuple[list[Split], dict, dict]:
    """Pass 5: cut where the backend changes; copy every source the split's backend cannot read (once per
    backend). Returns the splits, the copies and, per node reading a copy, its sources."""
    nodes, bk = graph.nodes, a.backends
    splits: list[Split] = []
    copies: dict[tuple[int, int], Tensor] = {}
    node_src: dict[int, tuple[Tensor, ...]] = {}
    first = 0
    while first < len(nodes) and nodes[first].op in VIEW_OPS:
        first += 1
    cur = a.of(nodes[first]) if first < len(nodes) else a.cpu
    split = Split(cur, 0)
    splits.append(split)
    for i in range(first, len(nodes)):
        n = nodes[i]
        if n.op in VIEW_OPS:
            continue
        b = a.of(n)
        # a split that already copies inputs ends before a node needing a weight from elsewhere
        need_new = b == cur and split.inputs and any(
            id(s) in a.weights and a.of(s) != cur and not a.buffer_supported(s, cur) for s in n.src)
        if b != cur or need_new:
            split.i_end = i
            split = Split(b, i)
            splits.append(split)
            cur = b
        src = list(n.src)
        for j, s in enumerate(n.src):
            if a.of(s) != cur and not a.buffer_supported(s, cur):
                key = (id(s), cur)
                if key not in copies:
                    c = Tensor(s.type, s.ne, nb=s.nb, name=f"{bk[cur].name}#{s.name}#0")
                    copies[key] = c
                    a.set(c, cur, "5.cpy")
                    split.inputs.append(s)
                src[j] = copies[key]
        if any(x is not y for x, y in zip(src, n.src)):
            node_src[id(n)] = tuple(src)
    split.i_end = len(nodes)
    return splits, copies, node_src


PASSES = ("1: pre-allocated tensors, inputs and weights", "2: expand accelerator assignments, then all",
          "3: upgrade to higher priority, place the rest by their inputs",
          "4: views follow their source, sources follow their reader")


class Scheduler:
    def __init__(self, backends: list[Backend], n_gpu_layers: int = 0, op_offload: bool = True,
                 tensor_split: list[float] | None = None):
        if not backends or not isinstance(backends[-1], CPUBackend):
            raise ValueError("the scheduler needs the CPU backend last (lowest priority)")
        self.backends = backends
        self.op_offload = op_offload
        self.n_gpu_layers = n_gpu_layers
        self.tensor_split = tensor_split     # None: notebook 06's single accelerator; else llama.cpp's layer split
        self.cpu = len(backends) - 1
        self.last: Schedule | None = None

    def split_graph(self, graph: CGraph, buffers: dict[int, str], weights: set[int]) -> Schedule:
        """The five passes over ``graph`` (left untouched). ``buffers``: id -> buffer type of pre-allocated
        tensors; ``weights``: ids of weights."""
        a = _Assignment(self.backends, buffers, weights)
        passes = []
        pass_preallocated(graph, a, self.op_offload)
        passes.append((PASSES[0], a.snapshot(graph)))
        pass_expand(graph, a)
        passes.append((PASSES[1], a.snapshot(graph)))
        pass_upgrade(graph, a)
        passes.append((PASSES[2], a.snapshot(graph)))
        pass_views_and_sources(graph, a)
        passes.append((PASSES[3], a.snapshot(graph)))
        splits, copies, node_src = pass_split(graph, a)
        sch = Schedule(graph, self.backends, a.backend, passes, a.cause, splits, copies, node_src=node_src)
        self.last = sch
        return sch

    # ---- running
    def compute_schedule(self, sch: Schedule, capture=None, replace=None, callback=None) -> dict:
        got = {}
        total = 0
        for b, be in enumerate(self.backends):                     # ggml_backend_sched_alloc_splits
            be.alloc_graph(sch, b)
        for s in sch.splits:
            be = self.backends[s.backend]
            for src in s.inputs:                                   # ggml_backend_tensor_copy
                c = sch.copies[(id(src), s.backend)]
                have = self.backends[sch.assignment.get(id(src), self.cpu)]
                if not be.cpy_tensor(have, src, c):                # directly, or through the host
                    be.set_tensor(c, have.get_tensor(src))
                total += src.nbytes()
            nodes = sch.run_nodes(s)
            for n, orig in zip(nodes, sch.split_nodes(s)):   # results land in the graph's own tensors
                if n is not orig and orig.view_src is None and orig.data is None:
                    orig.data = n.data = np.empty(orig.nbytes(), np.uint8)
            self._check_reads(sch, s, nodes)
            got.update(be.compute(nodes, capture, replace, callback))
        sch.bytes_copied = total
        sch.n_runs += 1
        return got

    def _check_reads(self, sch: Schedule, s: Split, nodes) -> None:
        """A backend may only read tensors that live in a buffer it supports: that is why copies exist."""
        be = self.backends[s.backend]
        for n in nodes:
            if n.op in VIEW_OPS:          # views compute nothing; their readers get the copies
                continue
            for src in n.src:
                b = sch.assignment.get(id(src), sch.assignment.get(id(src.view_src), -1) if src.view_src is not None else -1)
                if b != -1 and not be.supports_buft(self.backends[b].buffer_type):
                    raise RuntimeError(f"{be.name} would read {src.name} from {self.backends[b].name} memory without a copy")

    def get_tensor(self, t: Tensor) -> np.ndarray:
        """``t``'s bytes from the backend that computed it in the last run (ggml_backend_sched_get_tensor_backend,
        then ggml_backend_tensor_get: how llama_context reads the logits)."""
        b = self.last.assignment.get(id(t), self.cpu) if self.last is not None else self.cpu
        return self.backends[b].get_tensor(t)

    def schedule(self, g) -> Schedule:
        """Place and split an LLMGraph without running it."""
        buffers, weights = self.placement(g)
        return self.split_graph(g.gf, buffers, weights)

    def compute(self, g, capture=None, replace=None, callback=None) -> dict:
        """Schedule and run an LLMGraph (a builder's result); placement comes from its model and KV view.
        The same graph run again (a reused graph: same shapes, same placement) keeps its schedule."""
        sch = self.last if self.last is not None and self.last.graph is g.gf else None
        if sch is None:
            buffers, weights = self.placement(g)
            self.load(g, buffers, weights)
            sch = self.split_graph(g.gf, buffers, weights)
        return self.compute_schedule(sch, capture, replace, callback)

    def load(self, g, buffers: dict[int, str], weights: set[int]) -> None:
        """Hand each backend the weights and KV cache placed on its buffer type (it keeps what it already has)."""
        from .placement import placed_tensors
        by_buft: dict[str, list[Tensor]] = {}
        for t, _, _ in placed_tensors(g.model, g.kv):
            by_buft.setdefault(buffers[id(t)], []).append(t)
        for be in self.backends:
            if by_buft.get(be.buffer_type):
                be.load(by_buft[be.buffer_type], weights)

    # ---- placement of weights and KV cache by n_gpu_layers
    def placement(self, g) -> tuple[dict[int, str], set[int]]:
        from .placement import place_model
        return place_model(g.model, g.kv, self.n_gpu_layers, self.backends, self.tensor_split)
