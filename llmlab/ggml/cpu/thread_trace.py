"""The CPU backend's execution model: nodes one after another (a barrier between them), work
inside a node split across threads in one of three ways (ggml-cpu's ops.cpp):

- interleaved rows (``for i01 = ith; i01 < ne01; i01 += nth``): SOFT_MAX, RMS_NORM, NORM;
- contiguous blocks of rows (``dr = ceil(nr / nth)``, thread ith takes ``[dr*ith, dr*ith + dr)``):
  ADD, MUL, SCALE, ROPE, GET_ROWS, the unary and gated activations, CPY/CONT;
- chunks handed out by a shared atomic counter: MUL_MAT. Thread ith starts with chunk ith,
  then each takes ``atomic_fetch_add(&current_chunk, 1)`` until the chunks run out, so fast
  threads take more.

``trace_graph`` runs a graph's nodes with real Python threads doing MUL_MAT chunk by chunk
from a shared counter, and records who did what, for drawing.
"""
from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field

import numpy as np

from . import profiles
from .ops import COMPUTE, f32, mul_mat_quantized
from ..tensor import F16, Tensor

INTERLEAVED = frozenset({"SOFT_MAX", "RMS_NORM", "NORM"})
BLOCKS = frozenset({"ADD", "MUL", "SCALE", "ROPE", "GET_ROWS", "SILU", "GELU", "SWIGLU", "GEGLU", "CPY", "SET_ROWS", "CONT"})


def partition_kind(op: str) -> str:
    if op == "MUL_MAT":
        return "chunks"
    if op in INTERLEAVED:
        return "interleaved"
    if op in BLOCKS:
        return "blocks"
    return "single"


def rows_interleaved(nr: int, nth: int) -> list[list[int]]:
    return [list(range(ith, nr, nth)) for ith in range(nth)]


def rows_blocks(nr: int, nth: int) -> list[list[int]]:
    dr = (nr + nth - 1) // nth
    return [list(range(dr * ith, min(dr * ith + dr, nr))) for ith in range(nth)]


def mul_mat_chunking(nr0: int, nr1: int, nth: int) -> tuple[int, int, int, int]:
    """(nchunk0, nchunk1, dr0, dr1) as ggml_compute_forward_mul_mat chooses them."""
    chunk_size = 64 if (nr0 == 1 or nr1 == 1) else 16
    nchunk0 = (nr0 + chunk_size - 1) // chunk_size
    nchunk1 = (nr1 + chunk_size - 1) // chunk_size
    if nchunk0 * nchunk1 < nth * 4:
        nchunk0 = nth if nr0 > nr1 else 1
        nchunk1 = 1 if nr0 > nr1 else nth
    dr0 = (nr0 + nchunk0 - 1) // nchunk0
    dr1 = (nr1 + nchunk1 - 1) // nchunk1
    return nchunk0, nchunk1, dr0, dr1


@dataclass
class NodeTrace:
    name: str
    op: str
    kind: str
    nrows: int
    work: list[list] = field(default_factory=list)   # per thread: rows, or (chunk, r0, r1, c0, c1) for mul_mat


def _mul_mat_chunk(node: Tensor, r0: int, r1: int, c0: int, c1: int, cpu=None) -> None:
    """Output rows [r0, r1) (weight rows) x columns [c0, c1) (token rows, flattened over ne2, ne3)."""
    a, b = node.src
    out = node.array()
    B = f32(b).reshape(-1, b.ne[0])
    O = out.reshape(-1, node.ne[0])
    r2 = b.ne[2] // a.ne[2]
    for col in range(c0, c1):
        i2 = (col // b.ne[1]) % b.ne[2]
        i3 = col // (b.ne[1] * b.ne[2])
        A = a.array()[i3 // (b.ne[3] // a.ne[3]), i2 // r2]
        x = B[col:col + 1]
        if a.type.block_size != 1:
            O[col, r0:r1] = mul_mat_quantized(A[r0:r1], a.type, x, cpu=cpu)[0]
        else:
            w = A[r0:r1].astype(np.float32)
            if a.type is F16:
                x = x.astype(np.float16).astype(np.float32)
            O[col, r0:r1] = (x @ w.T)[0]


def mul_mat_threaded(node: Tensor, nth: int, cpu=None) -> list[list]:
    """Compute a MUL_MAT with nth real threads taking chunks from a shared counter; returns who did what."""
    nr0, nr1 = node.ne[0], node.ne[1] * node.ne[2] * node.ne[3]
    nchunk0, nchunk1, dr0, dr1 = mul_mat_chunking(nr0, nr1, nth)
    counter = itertools.count(nth)            # current_chunk starts at nth: chunk ith is thread ith's first
    lock = threading.Lock()
    done: list[list] = [[] for _ in range(nth)]

    def worker(ith: int) -> None:
        chunk = ith
        while chunk < nchunk0 * nchunk1:
            i0, i1 = chunk % nchunk0, chunk // nchunk0
            r0, r1 = dr0 * i0, min(dr0 * i0 + dr0, nr0)
            c0, c1 = dr1 * i1, min(dr1 * i1 + dr1, nr1)
            _mul_mat_chunk(node, r0, r1, c0, c1, cpu)
            done[ith].append((chunk, r0, r1, c0, c1))
            if nth >= nchunk0 * nchunk1:
                break
            with lock:                        # atomic_fetch_add
                chunk = next(counter)

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(nth)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()                              # ggml_barrier
    return done


def trace_nodes(nodes, nth: int = 2, cpu=None) -> list[NodeTrace]:
    """Run nodes as the CPU backend does with nth threads, recording the partition of each node."""
    cpu = profiles.resolve(cpu)
    traces = []
    for node in nodes:
        if node.view_src is None and node.data is None:
            node.data = np.empty(node.nbytes(), np.uint8)
        kind = partition_kind(node.op)
        nr = node.nrows()
        tr = NodeTrace(node.name, node.op, kind, nr)
        if kind == "chunks":
            tr.work = mul_mat_threaded(node, nth, cpu)
        else:
            COMPUTE[node.op](node, cpu)
            if kind == "interleaved":
                tr.work = rows_interleaved(node.ne[1], nth)
            elif kind == "blocks":
                tr.work = rows_blocks(nr, nth)
            else:
                tr.work = [[] for _ in range(nth)]
        traces.append(tr)
    return traces
