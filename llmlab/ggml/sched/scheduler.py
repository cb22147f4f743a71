"""ggml_backend_sched: assign every node to a backend, cut the graph into splits, copy across.

Backends are given in priority order, the CPU last (as llama.cpp does). Tensors
that already live in a buffer (weights, the KV cache) are pinned to the backend
of that buffer; everything else is decided by the five passes of
``ggml_backend_sched_split_graph``:

1. assign from pre-allocated tensors: a node whose data or view source lives in a
   buffer goes there; graph inputs go to the CPU; an op reading a weight runs
   where the weight is (unless a higher-priority backend asks to offload it);
2. expand: accelerator assignments spread down then up to unassigned neighbours
   (the CPU does not spread), then every assignment spreads down and up; an op
   the backend does not support is left for later;
3. upgrade to a higher-priority backend with the same buffer type that supports
   the op; unassigned nodes go to the backend that supports them and holds the
   most of their inputs;
4. views follow their source; unassigned sources follow the node that reads them;
5. cut: a new split starts where the backend changes; every source living on a
   buffer the split's backend cannot read gets a copy (made once per backend),
   and the node reads the copy.

Each pass's assignment is kept in ``Schedule.passes`` so it can be replayed.
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
    bytes_copied: int = 0

    @property
    def n_splits(self) -> int:
        return len(self.splits)

    @property
    def n_copies(self) -> int:
        return len(self.copies)

    def backend_of(self, t: Tensor) -> str:
        b = self.assignment.get(id(t), -1)
        return self.backends[b].name if b >= 0 else "?"

    def split_nodes(self, s: Split) -> list[Tensor]:
        return self.graph.nodes[s.i_start:s.i_end]

    def summary(self) -> list[dict]:
        rows = []
        for i, s in enumerate(self.splits):
            nodes = self.split_nodes(s)
            rows.append(dict(split=i, backend=self.backends[s.backend].name, nodes=len(nodes),
                             first=nodes[0].name if nodes else "", last=nodes[-1].name if nodes else "",
                             inputs=[t.name for t in s.inputs],
                             input_bytes=sum(t.nbytes() for t in s.inputs)))
        return rows


class Scheduler:
    def __init__(self, backends: list[Backend], n_gpu_layers: int = 0, op_offload: bool = True):
        if not backends or not isinstance(backends[-1], CPUBackend):
            raise ValueError("the scheduler needs the CPU backend last (lowest priority)")
        self.backends = backends
        self.op_offload = op_offload
        self.n_gpu_layers = n_gpu_layers
        self.cpu = len(backends) - 1
        self.last: Schedule | None = None

    # ---- buffers: which buffer type holds a pre-allocated tensor (weights and KV cache)
    def _buft(self, t: Tensor, buffers: dict[int, str]) -> str | None:
        return buffers.get(id(t)) or (buffers.get(id(t.view_src)) if t.view_src is not None else None)

    def _backend_from_buffer(self, t: Tensor, buffers) -> int:
        buft = buffers.get(id(t))
        if buft is None:
            return -1
        for b, be in enumerate(self.backends):
            if be.supports_buft(buft):
                return b
        raise ValueError(f"no backend can use buffer type {buft} of {t.name}")

    def split_graph(self, graph: CGraph, buffers: dict[int, str], weights: set[int]) -> Schedule:
        """The five passes. ``buffers``: id -> buffer type of pre-allocated tensors; ``weights``: ids of weights."""
        bk = self.backends
        cpu = self.cpu
        assign: dict[int, int] = {}
        cause: dict[int, str] = {}
        nodes = graph.nodes

        def tid(t):
            return assign.get(id(t), -1)

        def buffer_supported(t: Tensor, b: int) -> bool:
            buft = self._buft(t, buffers)
            if buft is None:
                tb = tid(t)
                if tb == -1 and t.view_src is not None:
                    tb = tid(t.view_src)
                if tb != -1:
                    buft = bk[tb].buffer_type
            return buft is not None and bk[b].supports_buft(buft)

        def from_cur(t: Tensor) -> int:
            b = self._backend_from_buffer(t, buffers)
            if b != -1:
                cause[id(t)] = "1.dst"
                return b
            if t.view_src is not None:
                b = self._backend_from_buffer(t.view_src, buffers)
                if b != -1:
                    cause[id(t)] = "1.vsrc"
                    return b
            if t.flags & FLAG_INPUT:
                cause[id(t)] = "1.inp"
                return cpu
            for i, s in enumerate(t.src):
                if t.op != "ROPE" and id(s) in weights:
                    sb = self._backend_from_buffer(s, buffers)
                    if self.op_offload and sb == cpu:
                        for b in range(sb):
                            if bk[b].supports_op(t) and bk[b].offload_op(t):
                                cause[id(t)] = "1.off"
                                return b
                    cause[id(t)] = f"1.wgt{i}"
                    return sb
            return -1

        def snapshot(name):
            passes.append((name, [tid(n) for n in nodes]))

        passes: list[tuple[str, list[int]]] = []
        # pass 1
        for t in list(graph.leafs) + list(nodes):
            if tid(t) == -1:
                b = from_cur(t)
                if b != -1:
                    assign[id(t)] = b
        snapshot("1: pre-allocated tensors, inputs and weights")

        # pass 2
        def expand(order, skip_cpu: bool):
            cur = -1
            for n in order:
                if n.op in VIEW_OPS:
                    continue
                b = tid(n)
                if b != -1:
                    cur = -1 if (skip_cpu and b == cpu) else b
                elif cur != -1 and bk[cur].supports_op(n):
                    assign[id(n)] = cur
                    cause[id(n)] = "2.sup"
        expand(nodes, True)
        expand(reversed(nodes), True)
        expand(nodes, False)
        expand(reversed(nodes), False)
        snapshot("2: expand accelerator assignments, then all")

        # pass 3
        for n in nodes:
            if n.op in VIEW_OPS:
                continue
            b = tid(n)
            if b == -1:
                best = -1
                for cand in range(len(bk)):
                    if bk[cand].supports_op(n):
                        k = sum(1 for s in n.src if (tid(s) != -1 or (s.view_src is not None and tid(s.view_src) != -1))
                                and buffer_supported(s, cand))
                        if k > best:
                            best = k
                            assign[id(n)] = cand
                            cause[id(n)] = "3.best"
            else:
                for cand in range(b):
                    if bk[cand].buffer_type == bk[b].buffer_type and bk[cand].supports_op(n) and \
                            all(buffer_supported(s, cand) for s in n.src):
                        assign[id(n)] = cand
                        cause[id(n)] = "3.upg"
                        break
        snapshot("3: upgrade to higher priority, place the rest by their inputs")

        # pass 4
        for n in nodes:
            if n.view_src is not None and tid(n) == -1:
                assign[id(n)] = tid(n.view_src)
                cause[id(n)] = "4.vsrc"
            for s in n.src:
                if tid(s) == -1:
                    if s.view_src is not None:
                        assign[id(s)] = tid(s.view_src)
                        cause[id(s)] = "4.vsrc"
                    else:
                        assign[id(s)] = tid(n)
                        cause[id(s)] = "4.cur"
        snapshot("4: views follow their source, sources follow their reader")
        for n in nodes:
            if tid(n) == -1:
                raise RuntimeError(f"node {n.name} ({n.op}) could not be assigned to any backend")

        # pass 5
        splits: list[Split] = []
        copies: dict[tuple[int, int], Tensor] = {}
        i = 0
        while i < len(nodes) and nodes[i].op in VIEW_OPS:
            i += 1
        cur = tid(nodes[i]) if i < len(nodes) else cpu
        split = Split(cur, 0)
        splits.append(split)
        for i in range(i, len(nodes)):
            n = nodes[i]
            if n.op in VIEW_OPS:
                continue
            b = tid(n)
            need_new = False
            if b == cur and split.inputs:
                for s in n.src:
                    if id(s) in weights and tid(s) != cur and not buffer_supported(s, cur):
                        need_new = True
                        break
            if b != cur or need_new:
                split.i_end = i
                split = Split(b, i)
                splits.append(split)
                cur = b
            new_src = list(n.src)
            for j, s in enumerate(n.src):
                sb = tid(s)
                if sb != cur and not buffer_supported(s, cur):
                    key = (id(s), cur)
                    if key not in copies:
                        c = Tensor(s.type, s.ne, nb=s.nb, name=f"{bk[cur].name}#{s.name}#0")
                        copies[key] = c
                        assign[id(c)] = cur
                        cause[id(c)] = "5.cpy"
                        split.inputs.append(s)
                    new_src[j] = copies[key]
            if new_src != list(n.src):
                n.src = tuple(new_src)
        split.i_end = len(nodes)
        sch = Schedule(graph, bk, assign, passes, cause, splits, copies)
        self.last = sch
        return sch

    # ---- running
    def compute_schedule(self, sch: Schedule, capture=None, replace=None, callback=None) -> dict:
        got = {}
        total = 0
        for s in sch.splits:
            be = self.backends[s.backend]
            for src in s.inputs:                                   # ggml_backend_tensor_copy
                c = sch.copies[(id(src), s.backend)]
                raw = np.ndarray((src.nbytes(),), np.uint8, src.root().data, src.view_offs)
                c.data = raw.copy()
                total += src.nbytes()
            nodes = sch.split_nodes(s)
            self._check_reads(sch, s, nodes)
            got.update(be.compute(nodes, capture, replace, callback))
        sch.bytes_copied = total
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

    def schedule(self, g) -> Schedule:
        """Place and split an LLMGraph without running it."""
        buffers, weights = self.placement(g)
        return self.split_graph(g.gf, buffers, weights)

    def compute(self, g, capture=None, replace=None, callback=None) -> dict:
        """Schedule and run an LLMGraph (a builder's result); placement comes from its model and KV view."""
        buffers, weights = self.placement(g)
        sch = self.split_graph(g.gf, buffers, weights)
        return self.compute_schedule(sch, capture, replace, callback)

    # ---- placement of weights and KV cache by n_gpu_layers
    def placement(self, g) -> tuple[dict[int, str], set[int]]:
        from .placement import place_model
        return place_model(g.model, g.kv, self.n_gpu_layers, self.backends)
