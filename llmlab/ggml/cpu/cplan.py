"""ggml_graph_plan + ggml_graph_compute: a graph bound once to kernels and buffers, then run many times.

The reference executor (``llmlab.ggml.cpu.executor``) looks every node up, builds numpy views of its
sources and allocates as it goes: clear, and about as slow in Python as the arithmetic. A
``CPlan`` does that work once per graph. Each node that computes becomes one *step*, a closure
over the arrays it reads and writes (views of the same bytes the graph owns) that calls a
compiled kernel from ``llmlab.ggml.cpu.fast``. A node with no fast kernel gets its NumPy
reference as its step, so a plan is always complete and always exact.

The graph stays the graph the notebooks draw: the plan neither adds nor fuses nodes, and with
``capture``/``replace``/``callback`` every node is still seen, in order, as the reference
executor shows it. The nodes' bytes come from the graph allocator (``llmlab.ggml.alloc``, ggml_gallocr),
one arena per plan. llama.cpp reuses a graph when the shapes repeat; the CPU backend keeps the plan
with the graph (``CPUBackend.plan``), so a decode step pays for binding once per 256 cells of cache.

A plan is bound for one CPU profile (``cpu``): a fast kernel binds only where it computes that
profile's arithmetic (its lane count, reduction tree and expf); elsewhere the node keeps its
NumPy reference, which takes the profile too.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..alloc import alloc_graph
from .executor import Hooks
from ..ops import VIEW_OPS
from ..tensor import F16, F32, Tensor
from . import sgemm
from .fast import dispatch as fq
from .fast._common import parallel_min_work, threads
from .journal import index_writer, reader
from .numba_cache import drop_llvm_pages
from .fast import ops as fops
from .fast import sgemm as fsgemm
from .fast import vec as fvec
from .fast import vec_f16 as fvec16
from .ops import COMPUTE, dequantize_rows, rope_cache, rope_vec_pairs
from .vec import gelu_table
from .profiles import CPUProfile, resolve

Step = Callable[[], None]
# Threads pay from parallel_min_work() quantized multiply-adds (fast._common); an f16 product's vectorized
# fma is about 8 times cheaper, so it threads from 8 times as many; softmax from as many elements (each
# exp is about 8 multiply-adds).
F16_PARALLEL_FACTOR = 8
# A decode step's attention products (the f16 K and V of the cache against one token: kq, kqv; on the ARM
# profiles every f16 product) compute about a quarter as many multiply-adds a microsecond as a quantized
# product (each cache row widened from f16 and reduced per block), so they thread from a quarter as many.
ATTENTION_PARALLEL_DIVISOR = 4
BINDERS: dict[str, Callable[[Tensor, CPUProfile], Step | None]] = {}


def binder(op: str):
    """Register the fast binding of an op: ``fn(node, cpu) -> step``, or None to use the reference."""
    def deco(fn):
        BINDERS[op] = fn
        return fn
    return deco


def _reference(node: Tensor, cpu: CPUProfile) -> Step:
    fn = COMPUTE.get(node.op)
    if fn is None:
        raise NotImplementedError(f"no CPU implementation for op {node.op} (node {node.name})")
    return lambda: fn(node, cpu)


class CPlan:
    """The steps of one graph; ``compute()`` runs them. Built by :func:`graph_plan`. ``fused`` maps a
    node's index to a step that also does the work of earlier nodes (listed in ``absorbed``): used
    only when no hook asks to see the nodes one by one."""

    def __init__(self, nodes: list[Tensor], steps: list[Step | None], n_fast: int,
                 fused: dict[int, Step] | None = None, absorbed: set[int] = frozenset(), arena_bytes: int = 0):
        self.nodes, self.steps, self.n_fast = nodes, steps, n_fast
        self.arena_bytes = arena_bytes        # what the graph allocator gave the nodes (llmlab.ggml.alloc)
        self.fused, self.absorbed = fused or {}, absorbed
        self.n_fused = len(absorbed)
        self._order = [i for i, s in enumerate(steps) if s is not None and i not in absorbed]
        self._run = [self.fused.get(i, steps[i]) for i in self._order]

    def compute(self, capture=None, replace=None, callback=None) -> dict[str, np.ndarray]:
        hooks = Hooks(capture, replace, callback)
        if not hooks:
            for step in self._run:
                step()
            return {}
        for node, step in zip(self.nodes, self.steps):
            if step is not None:
                step()
            hooks.after(node)
        return hooks.got

    def __repr__(self) -> str:
        return f"CPlan({len(self._run)} steps, {self.n_fast} on fast kernels, {self.n_fused} nodes fused away)"


def graph_plan(nodes: list[Tensor], cpu=None, fast: bool = True) -> CPlan:
    """Give every node its bytes and its step (views: none); ``fast=False`` binds the references.
    ``cpu``: the profile whose arithmetic the kernels reproduce (a profile, its name, or auto)."""
    cpu = resolve(cpu)
    steps: list[Step | None] = []
    n_fast = 0
    arena = alloc_graph(nodes)
    for node in nodes:
        if node.op in VIEW_OPS:
            steps.append(None)
            continue
        step = BINDERS[node.op](node, cpu) if fast and node.op in BINDERS else None
        n_fast += step is not None
        steps.append(step or _reference(node, cpu))
    fused: dict[int, Step] = {}
    absorbed: set[int] = set()
    if fast:
        index = {id(n): i for i, n in enumerate(nodes)}
        readers, prev, after = _chain(nodes)
        parts: dict[int, list[int]] = {}        # a fused step's node -> the nodes it absorbed

        def claim(i: int, got) -> bool:
            """Make ``got`` (step, nodes absorbed) node i's step, unless a node it absorbs is another step's
            already; a step fused before may be taken over whole (its node and all it absorbed listed):
            Gemma's q norm fused with its ROPE, then with the SCALE after."""
            if got is None or not all(id(n) in index for n in got[1]):
                return False
            js = [index[id(n)] for n in got[1]]
            taken = [j for j in js if j in fused]
            owned = {k for j in taken for k in parts[j]}
            if any(j in absorbed and j not in owned for j in js) or not owned <= set(js):
                return False
            for j in taken:
                del fused[j], parts[j]
            fused[i], parts[i] = got[0], js
            absorbed.update(js)
            for n in got[1]:        # work moved earlier leaves the chain; work moved later stays in it,
                if index[id(n)] > i:            # just before the step that does it
                    _unlink(prev, after, n)
            return True

        for i, node in enumerate(nodes):
            if i in absorbed:
                continue
            if not any(claim(i, fuse(node, cpu, readers, prev)) for fuse in FUSIONS):
                claim(i, _fuse_shared_activations(nodes, i, cpu))
    fq.settle_file_pages()
    drop_llvm_pages()                           # LLVM's code runs again only when a kernel loads
    return CPlan(nodes, steps, n_fast, fused, absorbed, arena)


def _chain(nodes: list[Tensor]) -> tuple[dict[int, int], dict[int, Tensor], dict[int, Tensor]]:
    """(readers, prev, after): how many nodes read each tensor, and each computed node's computed
    predecessor and successor (views skipped), all by id. The plan keeps prev as it decides: a node
    whose work a fusion moves into an earlier step leaves the chain (``_unlink``), so ``prev[id(b)] is
    a`` says no step runs between a's and b's, and a fusion moving a's work to b's step finds a's
    sources as a would have."""
    readers: dict[int, int] = {}
    prev: dict[int, Tensor] = {}
    after: dict[int, Tensor] = {}
    last = None
    for n in nodes:
        for src in n.src:
            readers[id(src)] = readers.get(id(src), 0) + 1
        if n.op not in VIEW_OPS:
            if last is not None:
                prev[id(n)], after[id(last)] = last, n
            last = n
    return readers, prev, after


def _unlink(prev: dict, after: dict, n: Tensor) -> None:
    """Take n out of the chain: its successor follows its predecessor."""
    before, nxt = prev.pop(id(n), None), after.pop(id(n), None)
    if nxt is not None:
        if before is None:
            del prev[id(nxt)]
        else:
            prev[id(nxt)] = before
    if before is not None:
        if nxt is None:
            del after[id(before)]
        else:
            after[id(before)] = nxt


# ---- bindings ----------------------------------------------------------------------------------

def _rows(t: Tensor) -> np.ndarray | None:
    """A contiguous float32 tensor as a 2-D (rows, ne0) view, or None."""
    if t.type is not F32 or not t.is_contiguous():
        return None
    return t.array().reshape(-1, t.ne[0])


@binder("RMS_NORM")
def _rms_norm(node, cpu):
    x, out = _rows(node.src[0]), _rows(node)
    if x is None or out is None:
        return None
    eps = np.float32(node.op_params["eps"])
    return lambda: fops.rms_norm(x, eps, out)


SMALL_WEIGHT = 1 << 20      # read-only operands up to this size are read from a private copy


def _resident(X: np.ndarray) -> np.ndarray:
    """A small read-only operand (a norm's weight in the file's mmap) as a private copy: the same bytes
    (a read-only map cannot change), but reading it every step does not fault the file back in: each
    read fault maps up to 64 KiB of cached file pages around it (fault-around), the ends of the
    quantized weights around the norm, whose file pages the packing dropped (about 9 MB for SmolLM2)."""
    return X.copy() if not X.flags.writeable and X.nbytes <= SMALL_WEIGHT else X


def _binary(ufunc):
    def bind(node, cpu):
        a, b = node.src
        if a.type is not F32 or b.type is not F32 or node.type is not F32:
            return None
        A, B, O = _resident(a.array()), _resident(b.array()), node.array()
        try:
            np.broadcast_shapes(B.shape, A.shape)
        except ValueError:
            return None          # ggml's repeat-broadcast of non-unit dimensions: the reference tiles
        return lambda: ufunc(A, B, out=O)
    return bind


binder("ADD")(_binary(np.add))
binder("MUL")(_binary(np.multiply))


@binder("SCALE")
def _scale(node, cpu):
    if node.src[0].type is not F32:
        return None
    X, O, s = node.src[0].array(), node.array(), np.float32(node.op_params["scale"])
    return lambda: np.multiply(X, s, out=O)


@binder("CONT")
def _cont(node, cpu):
    src = node.src[0]
    if src.type is not node.type or src.type.block_size != 1:
        return None
    S = src.array()
    O = node.array().reshape(S.shape)      # the destination is contiguous: element order is ggml's
    flat = S.view()
    try:
        flat.shape = (-1,)                 # the source's elements lie in their order already (one token's
    except AttributeError:                 # attention heads, kqv permuted): one flat copy, not numpy's
        return lambda: np.copyto(O, S)     # strided one
    O = O.reshape(-1)
    return lambda: np.copyto(O, flat)


def _set_rows_args(node):
    """(cells, rows, indices) of a SET_ROWS the fast kernel takes (f32 rows into f16 or f32 cells), or
    None; the step tells the journal which rows changed (``index_writer``)."""
    src, idx = node.src
    if src.type is not F32 or node.type not in (F16, F32) or not src.is_contiguous():
        return None
    V = src.array().reshape(-1, src.ne[0])
    I = idx.array().reshape(-1)
    D = node.array()[0, 0]
    if D.ndim != 2 or D.shape[1] != V.shape[1]:
        return None
    return (D.view(np.uint16) if node.type is F16 else D), V, I


@binder("SET_ROWS")
def _set_rows(node, cpu):
    got = _set_rows_args(node)
    if got is None:
        return None
    cells, V, I = got
    note = index_writer([cells], I)

    def step():
        if not fops.set_rows(cells, V, I):
            raise _rows_out_of_range(cells)
        note()
    return step


def _rows_out_of_range(*cells: np.ndarray) -> IndexError:
    """What a SET_ROWS step raises when an index misses its cache (the smallest, for a K/V pair)."""
    return IndexError(f"set_rows: row index out of range 0..{min(c.shape[0] for c in cells) - 1}")


DROP_ROWS = 32      # embedding rows read between drops of their file pages (at most 2 MiB of them resident)
FAST_GET_ROWS = {"q8_0": fops.get_rows_q8_0}      # quantized rows with a dequantizing twin (the embeddings)


@binder("GET_ROWS")
def _get_rows(node, cpu):
    """Rows of one matrix (the token embeddings, the last layer's output rows): the views taken once,
    quantized rows dequantized by the reference (one row per token; its cost is the call)."""
    a, ids = node.src
    if (node.type is not F32 or a.ne[2] != 1 or a.ne[3] != 1 or ids.ne[1] != 1 or ids.ne[2] != 1
            or (a.type is not F32 and a.type.block_size == 1)):
        return None
    A, I, O = a.array()[0, 0], ids.array().reshape(-1), node.array()[0, 0]
    n, t = A.shape[0], a.type
    rows = FAST_GET_ROWS.get(t.name)
    if rows is not None and A.ndim == 2 and A.dtype == np.uint8 and O.flags.c_contiguous:
        in_file = [0] if fq.drop_file_pages(A) else None     # rows read from the file's mmap (embeddings)

        def fast_step():
            if not rows(A, I, O):
                raise IndexError(f"get_rows: row id out of range 0..{n - 1} in {ids.name}")
            if in_file is not None:     # each row read maps up to 64 KiB of file pages around it (fault-
                in_file[0] += I.size    # around), kept until dropped: a prompt's rows, or a long generation's,
                if in_file[0] >= DROP_ROWS:      # added megabytes. Dropped every DROP_ROWS rows (25 us a drop)
                    in_file[0] = 0
                    fq.drop_file_pages(A)
        return fast_step

    if t is F32 and I.size == 1 and O.shape[0] == 1:       # one row (a decode step's output row): no
        O0 = O[0]                                           # reductions to check one index

        def one_row():
            i = int(I[0])
            if not 0 <= i < n:
                raise IndexError(f"get_rows: row id out of range 0..{n - 1} in {ids.name}")
            np.copyto(O0, A[i])
        return one_row

    def step():
        if I.size and (I.min() < 0 or I.max() >= n):
            raise IndexError(f"get_rows: row id out of range 0..{n - 1} in {ids.name}")
        if t is F32:
            np.take(A, I, axis=0, out=O)
        else:
            O[...] = dequantize_rows(A[I], t)
    return step


def _rope_args(node, cpu):
    """(X, positions, n_dims, neox, vec_pairs, cos_sin) of a ROPE the fast kernel takes, or None;
    ``cos_sin()`` is the cos/sin cache of the current positions."""
    a, pos = node.src[0], node.src[1]
    p = node.op_params
    if len(node.src) > 2 or p["ext_factor"] != 0.0 or a.type is not F32 or a.ne[3] != 1:
        return None
    X = a.array()[0]                       # (tokens, heads, head_dim), any strides
    P = pos.array().reshape(-1)
    n_dims, neox = p["n_dims"], bool(p["mode"] & 2)
    args = (p["freq_base"], p["freq_scale"], p["attn_factor"])
    key = (n_dims, *args)

    def cos_sin():
        pb = P.tobytes()
        hit = _ROPE_LAST.get(key)
        if hit is None or hit[0] != pb:      # the first ROPE of a step; the other 2 n_layer - 1 reuse it
            hit = _ROPE_LAST[key] = (pb, *(fops.rope_cache(P, n_dims, *args) or rope_cache(P, n_dims, *args)))
        return hit
    return X, n_dims, neox, rope_vec_pairs(cpu, n_dims, neox), cos_sin


@binder("ROPE")
def _rope(node, cpu):
    got = _rope_args(node, cpu)
    if got is None:
        return None
    X, n_dims, neox, vec_pairs, cos_sin = got
    O = node.array()[0]

    def step():
        hit = cos_sin()
        fops.rope(X, hit[1], hit[2], n_dims, neox, O, vec_pairs)
    return step


_ROPE_LAST: dict[tuple, tuple] = {}          # per (n_dims, freq_base, ...): the last positions' cos and sin


@binder("SOFT_MAX")
def _soft_max(node, cpu):
    x = node.src[0]
    if x.type is not F32 or x.ne[3] != 1 or node.op_params.get("max_bias", 0.0) != 0.0:
        return None
    X, O = x.array()[0], node.array()[0]
    M = np.zeros((0, x.ne[0]), np.float32)
    if len(node.src) > 1:
        m = node.src[1]
        if m.type is not F32 or m.ne[2] != 1 or m.ne[3] != 1 or m.ne[0] != x.ne[0]:
            return None
        M = m.array()[0, 0][: x.ne[1]]
    scale = np.float32(node.op_params["scale"])
    v = fvec.params(cpu)
    if x.ne[0] % v.lanes:
        return None                         # a scalar tail through libm's expf: the reference has it
    if X.size >= parallel_min_work() and _threads() > 1:
        n = _threads()
        return lambda: fvec.soft_max_mt(X, M, scale, O, v.lanes, v.hsum_prog, v.expf, n)
    return lambda: fvec.soft_max(X, M, scale, O, v.lanes, v.hsum_prog, v.expf)


def _glu_rows(node):
    """(gate, up, out) as 2-D float32 rows for a split GLU (two sources, not swapped), or None."""
    if len(node.src) != 2 or node.op_params.get("swapped"):
        return None
    rows = (_rows(node.src[0]), _rows(node.src[1]), _rows(node))
    return None if any(r is None for r in rows) else rows


@binder("SWIGLU")
def _swiglu(node, cpu):
    rows, v = _glu_rows(node), fvec.params(cpu)
    if rows is None or node.ne[0] % v.lanes:
        return None
    return lambda: fvec.swiglu(*rows, v.expf)


@binder("GEGLU")
def _geglu(node, cpu):
    rows = _glu_rows(node)
    if rows is None:
        return None
    table = gelu_table().view(np.uint16)
    return lambda: fvec.geglu(*rows, table)


@binder("MUL_MAT")
def _mul_mat(node, cpu):
    a, b = node.src
    if b.type is not F32 or node.type is not F32:
        return None
    B, O = b.array(), node.array()
    if a.type.block_size != 1:                              # quantized weights: 2-D, one activation matrix
        if a.ne[2] != 1 or a.ne[3] != 1 or b.ne[2] != 1 or b.ne[3] != 1:
            return None
        A, t = a.array()[0, 0], a.type
        repacked = a.view_src is None and cpu.repacks(t.name, a.ne[1])   # llama.cpp's CPU_REPACK buffer
        X, Y = B[0, 0], O[0, 0]
        if not fq.supports(t):
            return None
        if not (Y.flags.c_contiguous and Y.dtype == np.float32):
            return None
        return fq.bind_step(A, t, X, Y, repacked, cpu)      # prepared once (the weight packed once)
    if a.type is F16 and a.ne[3] == 1 and b.ne[3] == 1 and b.ne[2] % a.ne[2] == 0:
        A = a.array()[0].view(np.uint16)                    # (Hk, R, K) f16 bits, strides of the cache view
        X, Y = B[0], O[0]
        T, R, K = b.ne[1], a.ne[1], a.ne[0]
        half = fvec16.half_order(cpu, R, T, K)              # FP16_VA: half-precision accumulators
        if half is not None:
            n = _attention_limit(Y.size * K)
            rows = A.transpose(1, 0, 2)                     # (R, Hk, K): the cache rows, when contiguous
            if T == 1 and rows.flags.c_contiguous:          # a decode step's kq: the rows read in place
                return _f16h_step(fvec16.mul_mat_f16h_rows, rows, X, Y, half, (R, A.shape[0], 1), n)
            f16h = fvec16.kernel(R)
            return lambda: f16h(A, X, Y, *half, n)
        if sgemm.takes(cpu, R, T, K):                       # llamafile's tinyBLAS: a prompt's kq and kqv
            if not fsgemm.fits(cpu) or A.strides[2] != 2:
                return None
            n = 0 if _f16_parallel(Y.size * K) else 1
            return lambda: fsgemm.mul_mat_f16(A, X, Y, cpu.sgemm_lanes, n)
        order = _f16_order(cpu, R, T, K)
        if order is None:
            return None
        n_reg, lanes, prog = order
        w = n_reg * lanes                                   # elements per step of the registers
        flags = reader(A.transpose(1, 0, 2)) if T == 1 else None
        if flags is not None and flags.shape[0] >= R:       # a decode step: keep the cache rows copied,
            n = _attention_limit(Y.size * K)                # redo those written since
            if fvec.tiles_fit(n_reg, lanes, prog, K):
                AT = np.zeros((A.shape[0], -(-R // fvec.TW), K, fvec.TW), np.uint16)   # 16-row tiles
                return lambda: fvec.mul_mat_f16_tiles(A, X, Y, n_reg, lanes, prog, flags, AT, n)
            AT = np.zeros((A.shape[0], K, -(-R // fvec.RB), fvec.RB), np.uint16)       # transposed
            return lambda: fvec.mul_mat_f16_cached(A, X, Y, n_reg, lanes, prog, flags, AT, n)
        if T == 1 and K >= 4 * w and K % w == 0 and A.strides[2] == 2 and A.strides[1] == 2 * K:
            A4 = A.reshape(A.shape[0], R, K // w, w)      # a long dot per row (V^T . probabilities, not
            return lambda: fvec.mul_mat_f16_long(A4, X, Y, lanes, prog)   # fused): along K, rows in place
        if _f16_parallel(Y.size * K):
            n = _threads()
            return lambda: fvec.mul_mat_f16_mt(A, X, Y, n_reg, lanes, prog, n)
        return lambda: fvec.mul_mat_f16(A, X, Y, n_reg, lanes, prog)
    return None


@binder("MUL_MAT_ID")
def _mul_mat_id(node, cpu):
    """MoE experts: per step the rows are grouped by expert (``ops.expert_rows``) and each chosen expert's
    slab goes through the fast kernel of its quantized path (``fast.dispatch.bind``, bound once per
    expert on first use): what the reference does, so the same bits; the unchosen experts are not read."""
    from .ops import expert_rows
    a, b, ids = node.src
    if a.type.block_size == 1 or b.type is not F32 or not fq.supports(a.type):
        return None
    A, B, I, O = a.array()[0], b.array()[0], ids.array()[0, 0], node.array()[0]
    n_as, n_b1 = a.ne[2], b.ne[1]
    repacked = a.view_src is None and cpu.repacks(a.type.name, a.ne[1])
    bound: dict[int, Callable] = {}

    def step():
        for e, rows in enumerate(expert_rows(I, n_as)):
            if not rows:
                continue
            fn = bound.get(e)
            if fn is None:
                fn = bound[e] = fq.bind(A[e], a.type, repacked, cpu)
            X = np.stack([B[t, j % n_b1] for j, t in rows])
            Y = np.concatenate([fn(X[i:i + 1]) for i in range(len(X))]) if repacked else fn(X)
            for (j, t), y in zip(rows, Y):
                O[t, j] = y
    return step


# ---- fusions: one step for several nodes, when nobody watches the nodes in between -----------------

FUSIONS: list[Callable] = []     # fn(node, cpu, readers, prev) -> (step, [nodes it absorbs]) or None


def _f16_order(cpu, R: int, T: int, K: int) -> tuple | None:
    """ggml_vec_dot_f16's registers for an f16 MUL_MAT that llamafile_sgemm declines (a decode step):
    (GGML_F32_ARR, lanes, reduction program), or None where tinyBLAS takes the shape (``fast.sgemm``) or
    the profile accumulates in float16 (the fast kernels keep float32 registers)."""
    v = fvec.params(cpu)
    if sgemm.takes(cpu, R, T, K) or cpu.f16_acc != "f32" or cpu.f16_step != v.arr * v.lanes:
        return None
    return v.arr, v.lanes, v.vec_prog


def _f16h_step(kernel, rows: np.ndarray, X: np.ndarray, Y: np.ndarray, half: tuple, cls_shape: tuple, n: int):
    """A step of one of ``vec_f16``'s cache-row kernels (kq, the fused kqv of a decode step): the rows'
    classes kept between steps and redone where the journal says a writer changed them (every step
    where the rows are not the cache's own)."""
    flags = reader(rows)
    cls = np.zeros(cls_shape, np.int32)
    always = flags is None
    written = np.ones(rows.shape[0], np.uint8) if always else flags
    return lambda: kernel(rows, X, Y, *half, written, cls, always, n)


F16_MAX = 65504.0


def _fuse_attention(node, cpu, readers, prev, out=None):
    """A decode step's attention, kq = MUL_MAT(K, q) -> SOFT_MAX(kq, mask, scale) -> kqv = MUL_MAT(CONT(V^T),
    probabilities) for one token: one step and one parallel region a layer (``fast.vec.attention_f16_tiles``:
    a head per work item) instead of three, with their bits (the same tiles, registers and softmax as
    ``mul_mat_f16_tiles``, ``soft_max`` and ``mul_mat_f16_vt_tiles``). Only where the three follow one
    another (no computed node in between), nobody else reads the scores, the probabilities or the CONT,
    and all three would take those kernels (the journal's tiles, float32 registers, a row of whole
    lanes); else ``_fuse_v_transpose`` and the nodes' own steps. Ahead of ``_fuse_v_transpose`` in FUSIONS.
    ``out``: where the step writes kqv instead of its own bytes (``_fuse_kqv_cont``)."""
    if node.op != "MUL_MAT" or node.type is not F32:
        return None
    c, sm = node.src
    if sm.op != "SOFT_MAX" or prev.get(id(node)) is not sm or readers.get(id(sm), 0) != 1 or sm.type is not F32:
        return None
    kq = sm.src[0]
    if (kq.op != "MUL_MAT" or prev.get(id(sm)) is not kq or readers.get(id(kq), 0) != 1 or kq.type is not F32
            or c.op != "CONT" or readers.get(id(c), 0) != 1 or c.type is not F16):
        return None
    a, b, v = kq.src[0], kq.src[1], c.src[0]
    if (a.type is not F16 or b.type is not F32 or v.type is not F16 or b.ne[1] != 1 or a.ne[3] != 1 or b.ne[3] != 1
            or c.ne[3] != 1 or a.ne[2] != c.ne[2] or b.ne[2] % a.ne[2] or tuple(node.ne[:3]) != (c.ne[1], 1, b.ne[2])
            or c.ne[0] != a.ne[1] or sm.op_params.get("max_bias", 0.0) != 0.0):
        return None
    H, Hk, R, Dk, Dv = b.ne[2], a.ne[2], a.ne[1], a.ne[0], c.ne[1]
    M = np.zeros((0, R), np.float32)
    if len(sm.src) > 1:
        m = sm.src[1]
        if m.type is not F32 or m.ne[2] != 1 or m.ne[3] != 1 or m.ne[0] != R:
            return None
        M = m.array()[0, 0][:1]
    if fvec16.half_order(cpu, R, 1, Dk) is not None or fvec16.half_order(cpu, Dv, 1, R) is not None:
        return None                 # half-precision accumulators (FP16_VA): the nodes' own vec_f16 steps
    order, vorder = _f16_order(cpu, R, 1, Dk), _f16_order(cpu, Dv, 1, R)
    if order is None or vorder is None or order[:2] != vorder[:2] or not np.array_equal(order[2], vorder[2]):
        return None
    n_reg, lanes, prog = order
    sv = fvec.params(cpu)
    if R % sv.lanes or Dv % fvec.TW or not (fvec.tiles_fit(n_reg, lanes, prog, Dk) and fvec.tiles_fit(n_reg, lanes, prog, R)):
        return None
    K = a.array()[0].view(np.uint16)                       # (Hk, R, Dk): the cache rows' view
    Vt = v.array()[0].transpose(2, 0, 1)                   # (R, Hk, Dv): the cache rows
    if not Vt.flags.c_contiguous:
        return None
    V = Vt.view(np.uint16)
    kflags, vflags = reader(K.transpose(1, 0, 2)), reader(V)
    if kflags is None or vflags is None or kflags.shape[0] < R or vflags.shape[0] < R:
        return None
    Q, Y = b.array()[0], node.array()[0] if out is None else out    # (H, 1, Dk), (H, 1, Dv)
    if M.size and _overlap(_span(M), _span(Y)):
        return None
    scale = np.float32(sm.op_params["scale"])
    # a finite score (|kq| <= Dk * F16_MAX^2) times the scale must stay finite for masked cells to be skipped
    skip = bool(np.isfinite(scale) and abs(float(scale)) * Dk * F16_MAX * F16_MAX * 2 < float(np.finfo(np.float32).max))
    KT = np.zeros((Hk, -(-R // fvec.TW), Dk, fvec.TW), np.uint16)
    VT = np.zeros((Hk, Dv // fvec.TW, R, fvec.TW), np.uint16)
    bad = np.zeros((2, R), np.uint8)
    S, P = np.empty((H, 1, R), np.float32), np.empty((H, 1, R), np.float32)
    n = _attention_limit(H * R * (Dk + Dv))

    def step():
        fvec.attention_f16_tiles(K, Q, M, scale, V, Y, n_reg, lanes, prog, sv.hsum_prog, sv.expf, skip,
                                 kflags, vflags, KT, VT, bad, S, P, n)
    return step, [c, kq, sm]


FUSIONS.append(_fuse_attention)         # (not as decorators: _fuse_kqv_cont calls these two by name)


def _fuse_v_transpose(node, cpu, readers, prev, out=None):
    """kqv = MUL_MAT(CONT(V^T), probabilities) for one token: the CONT only transposes the cache's V rows
    so that each output is a contiguous dot product; the fused step reads the rows in place
    (``mul_mat_f16_vt``; with half-precision accumulators ``vec_f16.mul_mat_f16h_vt``; same arithmetic)
    and the copy is skipped. ``out``: where the step writes kqv instead of its own bytes (``_fuse_kqv_cont``)."""
    if node.op != "MUL_MAT" or node.type is not F32:
        return None
    c, b = node.src
    if c.op != "CONT" or readers.get(id(c), 0) != 1 or c.type is not F16 or b.type is not F32:
        return None
    v = c.src[0]
    if v.type is not F16 or c.ne[3] != 1 or b.ne[3] != 1 or b.ne[1] != 1 or b.ne[2] % c.ne[2]:
        return None
    Vt = v.array()[0].transpose(2, 0, 1)                   # (KV, Hk, D): the cache rows
    if not Vt.flags.c_contiguous:
        return None
    V, X, Y = Vt.view(np.uint16), b.array()[0], node.array()[0] if out is None else out
    KV, Hk, D = V.shape
    n = _attention_limit(Y.size * KV)
    half = fvec16.half_order(cpu, c.ne[1], 1, c.ne[0])      # FP16_VA: half-precision accumulators
    if half is not None:
        return _f16h_step(fvec16.mul_mat_f16h_vt, V, X, Y, half, (KV, Hk, D // fvec16.vt_chunk(D)), n), [c]
    order = _f16_order(cpu, c.ne[1], 1, c.ne[0])
    if order is None:
        return None
    n_reg, lanes, prog = order
    flags = reader(V)
    if flags is not None and flags.shape[0] >= KV and D % fvec.TW == 0 and fvec.tiles_fit(n_reg, lanes, prog, KV):
        VT = np.zeros((Hk, D // fvec.TW, KV, fvec.TW), np.uint16)       # the cells' columns in 16-wide tiles,
        return (lambda: fvec.mul_mat_f16_vt_tiles(V, X, Y, n_reg, lanes, prog, flags, VT, n)), [c]   # kept
    return (lambda: fvec.mul_mat_f16_vt(V, X, Y, n_reg, lanes, prog, n)), [c]


FUSIONS.append(_fuse_v_transpose)


@FUSIONS.append
def _fuse_norm_scale(node, cpu, readers, prev):
    """MUL(RMS_NORM(x), weight row): every norm of a llama layer and its scale, one step
    (``fast.ops.rms_norm_mul``); the residual ADD computing x just before joins it when it is a plain
    same-shape add (its sum is still stored: later layers read it). The nodes must follow one another
    (no computed node in between, so no buffer the allocator recycled between them is touched early),
    the norm's only reader is the MUL, and the buffers either coincide (the allocator's in-place reuse,
    element by element safe) or do not overlap. A decode step of SmolLM2 runs 121 fewer steps."""
    if node.op != "MUL" or node.type is not F32 or len(node.src) != 2:
        return None
    norm, w = node.src
    if norm.op != "RMS_NORM":
        norm, w = w, norm
    if (norm.op != "RMS_NORM" or prev.get(id(node)) is not norm or readers.get(id(norm), 0) != 1
            or norm.type is not F32 or w.type is not F32 or w.ne[0] != norm.ne[0] or w.nelements() != w.ne[0]
            or not w.is_contiguous() or tuple(node.ne) != tuple(norm.ne)):
        return None
    src = norm.src[0]
    x, out = _rows(src), _rows(node)
    if x is None or out is None:
        return None
    eps, W = np.float32(norm.op_params["eps"]), _resident(w.array()).reshape(-1)
    absorbed, a, b = [norm], x[:0], x[:0]
    if (src.op == "ADD" and prev.get(id(norm)) is src and len(src.src) == 2
            and all(t.type is F32 and tuple(t.ne) == tuple(src.ne) for t in src.src)):
        A, B = _rows(src.src[0]), _rows(src.src[1])
        if A is not None and B is not None:
            absorbed, a, b = [src, norm], A, B
    spans = [_span(m) for m in (x, a, b, out) if m.size]
    if any(_overlap(p, q) and p != q for k, p in enumerate(spans) for q in spans[k + 1:]) or _overlap(_span(W), _span(out)):
        return None
    return (lambda: fops.rms_norm_mul(x, eps, W, out, a, b)), absorbed


@FUSIONS.append
def _fuse_norm_rope(node, cpu, readers, prev):
    """ROPE(MUL(RMS_NORM(x), weight row)), and SCALE of it: Gemma's k (and q, then times 1/sqrt(head
    size)) normed per head before its rotation, one step (``fast.ops.rms_norm_mul_rope``, each value
    rounded as each op rounds it) where there were two (the norm with its MUL, the ROPE with its SCALE);
    it takes over those fusions' steps (``graph_plan``). The nodes must follow one another, each be the
    next one's only source, and the output either be x itself (Gemma's q: rows read whole before written)
    or not overlap it."""
    scaled, scale, rope = node.op == "SCALE", np.float32(1.0), node
    if scaled:
        rope, scale = node.src[0], np.float32(node.op_params["scale"])
        if len(node.src) != 1 or node.type is not F32 or prev.get(id(node)) is not rope or readers.get(id(rope), 0) != 1:
            return None
    if rope.op != "ROPE" or rope.type is not F32:
        return None
    mul = rope.src[0]
    if mul.op != "MUL" or mul.type is not F32 or len(mul.src) != 2 or prev.get(id(rope)) is not mul or readers.get(id(mul), 0) != 1:
        return None
    norm, w = mul.src
    if norm.op != "RMS_NORM":
        norm, w = w, norm
    if (norm.op != "RMS_NORM" or prev.get(id(mul)) is not norm or readers.get(id(norm), 0) != 1
            or w.type is not F32 or w.nelements() != w.ne[0] or w.ne[0] != norm.ne[0] or not w.is_contiguous()
            or not all(tuple(t.ne) == tuple(norm.ne) for t in (mul, rope, node)) or not mul.is_contiguous()):
        return None
    got = _rope_args(rope, cpu)
    x, out = _rows(norm.src[0]), _rows(node)
    if got is None or x is None or out is None or x.shape[0] != rope.ne[1] * rope.ne[2]:
        return None
    _, n_dims, neox, vec_pairs, cos_sin = got
    H, eps, W = rope.ne[1], np.float32(norm.op_params["eps"]), _resident(w.array()).reshape(-1)
    same = _span(out) == _span(x) and out.strides == x.strides
    if (not same and _overlap(_span(out), _span(x))) or _overlap(_span(W), _span(out)):
        return None

    def step():
        hit = cos_sin()
        fops.rms_norm_mul_rope(x, H, eps, W, hit[1], hit[2], n_dims, neox, scale, scaled, out, vec_pairs)
    return step, [norm, mul, rope] if scaled else [norm, mul]


@FUSIONS.append
def _fuse_rope_scale(node, cpu, readers, prev):
    """SCALE(ROPE(q)): Gemma's query rotated, then times 1/sqrt(head size), in one call
    (``fast.ops.rope_scale``, each value rounded as the two ops round it). The ROPE must come just before
    (no computed node between), have the SCALE as its only reader, and the SCALE's output either be the
    ROPE's input, element for element, or not overlap it."""
    if node.op != "SCALE" or node.type is not F32 or len(node.src) != 1:
        return None
    rope = node.src[0]
    if (rope.op != "ROPE" or prev.get(id(node)) is not rope or readers.get(id(rope), 0) != 1
            or rope.type is not F32 or tuple(rope.ne) != tuple(node.ne) or not node.is_contiguous()):
        return None
    got = _rope_args(rope, cpu)
    if got is None:
        return None
    X, n_dims, neox, vec_pairs, cos_sin = got
    O = node.array()[0].reshape(X.shape)
    same = _span(O) == _span(X) and O.strides == X.strides
    if not same and _overlap(_span(O), _span(X)):
        return None
    scale = np.float32(node.op_params["scale"])

    def step():
        hit = cos_sin()
        fops.rope_scale(X, hit[1], hit[2], n_dims, neox, scale, O, vec_pairs)
    return step, [rope]


def _set_rows_pair(node, prev):
    """(SET_ROWS of K, its args, V's args) where node is a layer's SET_ROWS of V right after its SET_ROWS
    of K at the same cells (the same k_idxs), the caches apart from each other and from the rows; or None."""
    if node.op != "SET_ROWS":
        return None
    k = prev.get(id(node))
    if k is None or k.op != "SET_ROWS" or k.src[1] is not node.src[1]:
        return None
    got = [_set_rows_args(n) for n in (k, node)]
    if got[0] is None or got[1] is None:
        return None
    (Dk, K, _), (Dv, V, _) = got
    if _overlap(_span(Dk), _span(Dv)) or any(_overlap(_span(D), _span(X)) for D in (Dk, Dv) for X in (K, V)):
        return None
    return k, *got


@FUSIONS.append
def _fuse_rope_set_rows_pair(node, cpu, readers, prev):
    """ROPE of K, then the layer's K/V SET_ROWS pair (``_fuse_set_rows_pair``): K rotated straight into
    its cache cells (``fast.ops.rope_set_rows_pair``), its rotated rows never stored (the SET_ROWS of K,
    through a reshape, is their only reader). SmolLM2's V is computed with K (``_fuse_shared_activations``),
    so its ROPE comes just before the pair: one step a layer fewer."""
    pair = _set_rows_pair(node, prev)
    if pair is None:
        return None
    k, (Dk, K, I), (Dv, V, _) = pair
    rope = prev.get(id(k))
    if rope is None or rope.op != "ROPE" or _sole_source(k.src[0], readers) is not rope:
        return None
    got = _rope_args(rope, cpu)
    if got is None:
        return None
    X, n_dims, neox, vec_pairs, cos_sin = got
    R = rope.array()[0]
    if (not R.flags.c_contiguous or K.shape != (X.shape[0], X.shape[1] * X.shape[2]) or _span(K) != _span(R)
            or I.shape[0] != X.shape[0] or V.shape[0] != I.shape[0] or _overlap(_span(R), _span(X))
            or any(_overlap(_span(D), _span(X)) for D in (Dk, Dv))):
        return None

    note = index_writer([Dk, Dv], I)

    def step():
        hit = cos_sin()
        if not fops.rope_set_rows_pair(X, hit[1], hit[2], n_dims, neox, Dk, Dv, V, I, vec_pairs):
            raise _rows_out_of_range(Dk, Dv)
        note()
    return step, [rope, k]


@FUSIONS.append
def _fuse_set_rows_pair(node, cpu, readers, prev):
    """A layer's SET_ROWS of V right after its SET_ROWS of K, at the same cells (the same k_idxs): one
    call (``fast.ops.set_rows_pair``) and one step fewer a layer."""
    pair = _set_rows_pair(node, prev)
    if pair is None:
        return None
    k, (Dk, K, I), (Dv, V, _) = pair
    note = index_writer([Dk, Dv], I)

    def step():
        if not fops.set_rows_pair(Dk, K, Dv, V, I):
            raise _rows_out_of_range(Dk, Dv)
        note()
    return step, [k]


def _flat(t: Tensor) -> np.ndarray | None:
    """t's elements as one flat view, when they lie in their order in memory (a CONT of them is a pure
    copy: one token's attention heads, kqv permuted), else None."""
    flat = t.array().view()
    try:
        flat.shape = (-1,)
    except AttributeError:
        return None
    return flat


WRITE_INTO: list[Callable] = [_fuse_attention, _fuse_v_transpose]    # kqv's fusions taking ``out=``, in order


@FUSIONS.append
def _fuse_kqv_cont(node, cpu, readers, prev):
    """CONT(kqv permuted) for one token, a pure copy: kqv's fused step (one of ``WRITE_INTO``) writes its
    result straight into the CONT's bytes, and the copy is skipped (SmolLM2: one step a layer fewer).
    kqv must be computed just before, its bytes read by nobody else, and the CONT's bytes apart from all
    the step reads and writes otherwise (the allocator may give the CONT the probabilities' freed bytes,
    as Gemma's plan does)."""
    if node.op != "CONT" or node.type is not F32 or node.src[0].type is not F32 or not node.is_contiguous():
        return None
    kqv = prev.get(id(node))
    if kqv is None or kqv.op != "MUL_MAT" or _sole_source(node.src[0], readers) is not kqv:
        return None
    flat, K = _flat(node.src[0]), kqv.array()
    if flat is None or not K.flags.c_contiguous or _span(flat) != _span(K):
        return None
    out = node.array().reshape(K[0].shape)
    for fuse in WRITE_INTO:
        got = fuse(kqv, cpu, readers, prev, out=out)
        if got is not None:
            break
    else:
        return None
    touched = [sp for n in (*got[1], kqv) for t in (n, *n.src) if t is not kqv and (sp := _span_of(t)) is not None]
    if any(_overlap(_span(out), sp) for sp in touched):
        return None
    return got[0], [*got[1], kqv]


@FUSIONS.append
def _fuse_cont_reader(node, cpu, readers, prev):
    """A quantized matvec of CONT(x), where the CONT is a pure copy (one token's kqv_out, read by attn_out):
    the matvec reads x's bytes in place and the copy is skipped (Gemma: one step a layer fewer). The CONT
    must come just before, have this node as its only reader, and x's bytes not overlap the output
    (SmolLM2's attn_out is given kqv's freed bytes: refused there, ``_fuse_kqv_cont`` skips its CONT)."""
    mv = _quantized_matvec(node, cpu)
    if mv is None:
        return None
    cont = node.src[1]
    if (cont.op != "CONT" or prev.get(id(node)) is not cont or readers.get(id(cont), 0) != 1
            or cont.src[0].type is not F32 or not fq.supports(node.src[0].type)):
        return None
    A, X, Y, repacked = mv
    flat = _flat(cont.src[0])
    if flat is None or flat.size != X.size or _overlap(_span(flat), _span(Y)):
        return None
    step = fq.bind_step(A, node.src[0].type, flat.reshape(X.shape), Y, repacked, cpu)
    return step, [cont]


def _sole_source(t: Tensor, readers) -> Tensor | None:
    """The computed node whose bytes t is (t itself, or the root of its views), when t and every view on
    the way are read by one node each, and the root by the first view; else None."""
    while readers.get(id(t), 0) == 1:
        if t.op not in VIEW_OPS:
            return t
        if t.op == "NONE" or not t.src:
            return None
        t = t.src[0]
    return None


def _quantized_matvec(node: Tensor, cpu: CPUProfile):
    """(weight rows, activations, output, repacked) of a MUL_MAT of a 2-D quantized weight by float32
    activations (as ``_mul_mat`` binds it), or None."""
    if node.op != "MUL_MAT" or node.type is not F32:
        return None
    a, b = node.src
    if (a.type.block_size == 1 or b.type is not F32 or a.ne[2] != 1 or a.ne[3] != 1 or b.ne[2] != 1
            or b.ne[3] != 1):
        return None
    repacked = a.view_src is None and cpu.repacks(a.type.name, a.ne[1])
    return a.array()[0, 0], b.array()[0, 0], node.array()[0, 0], repacked


def _span(a: np.ndarray) -> tuple[int, int]:
    """The bytes an array's elements lie in, [lo, hi) (numpy's byte_bounds, which moved in NumPy 2)."""
    lo = hi = a.__array_interface__["data"][0]
    if a.size == 0:
        return lo, lo
    for n, st in zip(a.shape, a.strides):
        lo, hi = lo + min(0, (n - 1) * st), hi + max(0, (n - 1) * st)
    return lo, hi + a.itemsize


def _span_of(t: Tensor) -> tuple[int, int] | None:
    try:
        return _span(t.array())
    except RuntimeError:                       # no bytes (an input not set): nothing to collide with
        return None


def _overlap(x: tuple[int, int], y: tuple[int, int]) -> bool:
    return x[0] < y[1] and y[0] < x[1]


def _fuse_shared_activations(nodes: list[Tensor], i: int, cpu: CPUProfile, window: int = 16):
    """Attention's Q, K and V (the FFN's gate and up) are MUL_MATs of weights of one type by the same
    activations, a few nodes apart (Q's ROPE lies between Q and K). At the first of them one step
    (``fast.dispatch.bind_multi_step``) quantizes the activations once and computes every weight's rows
    in one parallel region; the later ones are absorbed. Computing a later one early is safe when its
    output bytes are disjoint from the activations, the other outputs, and every buffer the nodes in
    between read or write (the graph allocator may have given it memory freed in between): checked
    here. The graph keeps its nodes; each output row is the bits its own step gives."""
    node = nodes[i]
    if node.op != "MUL_MAT" or node.src[0].type.block_size == 1:
        return None
    a, b = node.src
    stop = min(len(nodes), i + 1 + window)
    later = [j for j in range(i + 1, stop) if nodes[j].op == "MUL_MAT" and nodes[j].src[1] is b
             and nodes[j].src[0].type is a.type]                   # cheap: most MUL_MATs have none
    first = _quantized_matvec(node, cpu) if later else None
    if first is None:
        return None
    run, mv = [node], [first]
    spans = [_span(first[2])]
    x_span = _span(first[1])
    between: list[tuple[int, int]] = []          # buffers read or written by the computed nodes passed
    for j in range(i + 1, later[-1] + 1):
        n = nodes[j]
        if n.op in VIEW_OPS:
            continue
        got = _quantized_matvec(n, cpu) if j in later else None
        if got is not None and got[3] == first[3]:
            out = _span(got[2])
            if _overlap(out, x_span) or any(_overlap(out, o) for o in spans + between):
                break
            run.append(n)
            mv.append(got)
            spans.append(out)
            continue
        between.extend(sp for t in (n, *n.src) if (sp := _span_of(t)) is not None)
    if len(run) < 2:
        return None
    step = fq.bind_multi_step([m[0] for m in mv], a.type, first[1], [m[2] for m in mv], first[3], cpu)
    return None if step is None else (step, run[1:])


def _threads() -> int:
    return threads()        # the count fast.set_threads set (config's policy on first use), as dispatch reads it


def _f16_parallel(work: int) -> bool:
    """Whether an f16 product of ``work`` multiply-adds (a prompt's) pays for waking the other threads."""
    return work >= F16_PARALLEL_FACTOR * parallel_min_work() and _threads() > 1


def _attention_limit(work: int) -> int:
    """The thread limit of an attention product of ``work`` multiply-adds: 0 (the step's count) from
    parallel_min_work() / ATTENTION_PARALLEL_DIVISOR on, else 1 (the calling thread: a short context's
    products are smaller than waking workqueue's threads costs)."""
    return 0 if _threads() > 1 and work * ATTENTION_PARALLEL_DIVISOR >= parallel_min_work() else 1
