"""ggml-alloc's graph allocator (ggml_gallocr): the intermediate results of a graph share one arena.

:func:`reserve` is ``ggml_gallocr_reserve``: it walks the nodes once, in the order they run. A node
that owns bytes (not a view) takes a block of the free list (``ggml_dyn_tallocr_alloc``: the best
fitting hole, else the free space at the end, sizes rounded up to :data:`ALIGN`); after the node,
every tensor whose last reader it was gives its block back, merged with the free neighbours
(``ggml_dyn_tallocr_free_tensor``). A view owns nothing: its readers keep its root alive, and a view
nobody reads keeps its root to the end. Outputs (``FLAG_OUTPUT``, or nodes nobody reads) keep their
bytes. The arena is as large as the highest block end. :func:`alloc_graph` is
``ggml_gallocr_alloc_graph``: the same plan, then every node's bytes pointed at its offset; the CPU
backend's plans run it (``llmlab.ggml.cpu.cplan``). :func:`plan_memory` is the accounting notebook 06
draws, from the same walk.

Not reproduced: reusing a parent's block in place (``ggml_op_can_inplace``) and arenas in chunks.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .tensor import FLAG_OUTPUT, Tensor

ALIGN = 64            # bytes: a cache line, one AVX-512 register


def _aligned(n: int) -> int:
    return -(-max(n, 1) // ALIGN) * ALIGN


class FreeList:
    """ggml_dyn_tallocr: free blocks ``[offset, size]`` sorted by offset; the last one is the open end."""

    def __init__(self):
        self.blocks: list[list[int]] = [[0, -1]]      # size -1: the end, unbounded
        self.max_size = 0
        self.node: Tensor | None = None                # the node asking (named in a learner's plug report)

    def alloc(self, size: int) -> int:
        best = None
        for i, (_, s) in enumerate(self.blocks[:-1]):            # best fit among the holes (ties: the later)
            if s >= size and (best is None or s <= self.blocks[best][1]):
                best = i
        i = len(self.blocks) - 1 if best is None else best
        b = self.blocks[i]
        off = b[0]
        b[0] += size
        if b[1] >= 0:
            b[1] -= size
            if b[1] == 0:
                del self.blocks[i]
        self.max_size = max(self.max_size, off + size)
        return off

    def free(self, off: int, size: int) -> None:
        i = next(i for i, b in enumerate(self.blocks) if b[0] > off)   # the open end is always after
        prev = self.blocks[i - 1] if i else None
        if prev is not None and prev[0] + prev[1] == off:
            prev[1] += size
        else:
            prev = [off, size]
            self.blocks.insert(i, prev)
            i += 1
        nxt = self.blocks[i]
        if prev[0] + prev[1] == nxt[0]:                          # merged with the block after it
            prev[1] = -1 if nxt[1] < 0 else prev[1] + nxt[1]
            del self.blocks[i]


@dataclass
class Allocation:
    """Where each node's bytes sit in the arena (by ``id(node)``), and the walk that placed them."""
    size: int                                              # the arena's bytes: the highest block end
    offsets: dict[int, int] = field(default_factory=dict)
    sizes: dict[int, int] = field(default_factory=dict)    # aligned block sizes
    rows: list[tuple[str, str, int, int]] = field(default_factory=list)   # (name, op, own bytes, live after)


def reserve(nodes: list[Tensor], owns: Callable[[Tensor], bool] | None = None) -> Allocation:
    """Plan the arena for ``nodes`` (ggml_gallocr_reserve); nothing is allocated. ``owns``: the nodes that
    get a block (default: every node that is not a view)."""
    owns = owns or (lambda n: n.view_src is None)
    last_use: dict[int, int] = {}
    read = {id(s) for n in nodes for s in n.src if s is not None}
    keep = {id(n.root()) for n in nodes if n.view_src is not None and id(n) not in read}   # unread views
    for i, n in enumerate(nodes):
        for s in n.src:
            if s is not None:
                last_use[id(s.root())] = i
    free, out = FreeList(), Allocation(0)
    frees_at: dict[int, list[int]] = {}
    live = 0
    for i, n in enumerate(nodes):
        own = 0
        if owns(n):
            own = out.sizes[id(n)] = _aligned(n.nbytes())
            free.node = n
            out.offsets[id(n)] = free.alloc(own)
            live += own
            end = last_use.get(id(n))
            if end is not None and end > i and id(n) not in keep and not n.flags & FLAG_OUTPUT:
                frees_at.setdefault(end, []).append(id(n))
        for k in frees_at.pop(i, []):
            free.free(out.offsets[k], out.sizes[k])
            live -= out.sizes[k]
        out.rows.append((n.name, n.op, own, live))
    out.size = free.max_size
    return out


def alloc_graph(nodes: list[Tensor]) -> int:
    """Give every node that owns bytes and has none yet its place in one new arena (ggml_gallocr_alloc_graph);
    returns the arena's size in bytes."""
    plan = reserve(nodes, lambda n: n.view_src is None and n.data is None)
    if not plan.offsets:
        return 0
    arena = np.empty(plan.size, np.uint8)
    for n in nodes:
        off = plan.offsets.get(id(n))
        if off is not None:
            n.data = arena[off:off + n.nbytes()]
    return plan.size


# ---- the accounting notebook 06 draws ----------------------------------------------------------------

@dataclass
class MemoryPlan:
    """What a graph needs: the weights/inputs it reads, and its intermediate bytes with and without reuse."""
    leaf_bytes: int
    node_bytes_no_reuse: int          # every node its own (aligned) buffer
    peak_bytes: int                   # the arena reserve() plans: what the CPU backend allocates
    per_node: list[tuple[str, str, int, int]]   # (name, op, own bytes, live bytes after it runs)


def plan_memory(graph) -> MemoryPlan:
    """The allocator's plan for a graph's nodes, with every node that is not a view owning bytes."""
    plan = reserve(graph.nodes)
    return MemoryPlan(sum(l.nbytes() for l in graph.leafs), sum(plan.sizes.values()), plan.size, plan.rows)
