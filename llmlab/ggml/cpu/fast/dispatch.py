"""The fast kernel set's entry point: the same contract and the same path choice as the reference
``llmlab.ggml.cpu.ops.mul_mat_quantized``, each path through its numba twin.

    mul_mat_quantized(raw, qtype, x, repacked=False) -> (T, R) float32

* q4_0, q4_1, q5_0, q8_0: ggml's AVX2 vec_dot order (``q32.mul_mat_<type>``, below MV_MAX_ROWS rows the decode
  kernels ``q32.mv_<type>``), for every T
  (q4_0 in the REPACK buffer computes the same sums here, as in the reference); where the host has
  AVX512-VNNI or AVX2, q4_0, q4_1, q5_0 and q8_0 take ``dot4``'s kernels instead (byte dot products:
  the same bits, their own packed layout);
* q4_K in the REPACK buffer (``repacked`` and rows % 8 == 0, decided by the caller as ops.mul_mat does):
  gemv / gemm (``kquants.mul_mat_q4_k_repacked``; with byte dot products ``dot4``'s);
* q4_K / q6_K otherwise: vec_dot below 8 activation rows, the tiled kernels from 8 rows on (q6_K by
  ``dot4``'s kernels where the host has byte dot products);
* anything else: the NumPy reference.

Weights are repacked once (the packed arrays are cached, keyed by the weight buffer's address, shape
and type; the cache keeps the weight array alive so that the address cannot be reused).

Memory: a packed weight replaces its file bytes. Packing runs in row chunks; after each chunk the file
pages it read are dropped from this process (``madvise(MADV_DONTNEED)`` on the read-only mmap: the
kernel frees them from RSS, and a later read of those bytes faults them back in from the page cache), so
the peak is the packed copy plus one chunk, not file + copy + packing temporaries. Large packed arrays
get huge pages from numpy's allocator (MADV_HUGEPAGE: fewer TLB misses when a decode step streams them).

Threads: below ``parallel_min_work()`` multiply-adds a call runs single-threaded (q32: the serial twin of
its kernel, same body, same bits; K-quants: the threaded kernel in a one-thread region): waking the other threads costs 5-20 us on a quiet machine and milliseconds on a
loaded one, more than a small matvec saves.
"""
from __future__ import annotations

import mmap

import numba
import numpy as np

from . import dot4, kquants, q32
from ._common import G, TILED_MIN_ROWS, parallel_min_work, threads
from .quantize import quantize_q8_0, quantize_q8_1, quantize_q8_k

Q32_TYPES = ("q4_0", "q4_1", "q5_0", "q8_0")
K_TYPES = ("q4_k", "q6_k")
PACK_CHUNK_ROWS = 8192          # rows packed at a time (a multiple of G)
MV_MAX_ROWS = 4                 # q32 types: below this many activation rows the decode kernels (q32.mv_*)

_PACKED: dict[tuple, tuple] = {}


def supports(qtype) -> bool:
    return qtype.name in Q32_TYPES or qtype.name in K_TYPES


def path_of(qtype, n_rows: int, repacked: bool = False) -> str:
    """Which kernel the reference takes: 'vec_dot', 'tiled', 'repack' (or 'reference' without a twin)."""
    name = qtype.name
    if name in Q32_TYPES:
        return "vec_dot"
    if name in K_TYPES:
        if repacked and name == "q4_k":  # in the REPACK buffer (the caller asked the CPU profile)
            return "repack"
        return "tiled" if n_rows >= TILED_MIN_ROWS else "vec_dot"
    return "reference"


def uses_dot4(qtype, repacked: bool = False) -> bool:
    """dot4's kernels take this weight: q4_0 / q4_1 / q5_0 / q8_0 / q6_K, and q4_K in the REPACK buffer."""
    return dot4.AVAILABLE and (qtype.name in dot4.TYPES or qtype.name == "q6_k" or (repacked and qtype.name == "q4_k"))


def packed(raw: np.ndarray, qtype, K: int, repacked: bool = False) -> tuple:
    """The kernel layout of a weight, made once and cached."""
    arr = np.asarray(raw)
    v = uses_dot4(qtype, repacked)
    key = (arr.__array_interface__["data"][0], arr.shape, arr.strides, arr.dtype.str, qtype.name, K, v)
    hit = _PACKED.get(key)
    if hit is None:
        rows = np.ascontiguousarray(arr).view(np.uint8).reshape(-1, K // qtype.block_size * qtype.type_size)
        name = qtype.name
        if v:
            p = _pack_chunked(rows, name, K, dot4.packer(name), dot4.R16)
        elif name in Q32_TYPES:
            p = _pack_chunked(rows, name, K, q32.pack_q32, G)
        else:
            p = kquants.pack_q4_k(rows, K) if name == "q4_k" else kquants.pack_q6_k(rows, K)
            drop_file_pages(rows)
        hit = (arr, rows.shape[0], p)
        _PACKED[key] = hit
    return hit[1], hit[2]


def _pack_chunked(rows: np.ndarray, name: str, K: int, pack, group: int) -> tuple:
    """pack (rows -> arrays whose first axis is groups of ``group`` rows) over PACK_CHUNK_ROWS rows at
    a time into preallocated arrays, dropping each chunk's file pages once packed."""
    R = rows.shape[0]
    ng = -(-R // group)
    out = None
    for r0 in range(0, R, PACK_CHUNK_ROWS):
        part = pack(rows[r0:r0 + PACK_CHUNK_ROWS], name, K)
        if out is None:
            out = tuple(_alloc((ng if len(a) else 0,) + a.shape[1:], a.dtype) for a in part)
        g0 = r0 // group
        for o, a in zip(out, part):
            o[g0:g0 + len(a)] = a
        del part
        drop_file_pages(rows[r0:r0 + PACK_CHUNK_ROWS])
    return out


def _alloc(shape: tuple, dtype) -> np.ndarray:
    """np.empty: numpy already advises MADV_HUGEPAGE on its large allocations (private anonymous memory;
    an anonymous ``mmap.mmap`` is shared memory, which transparent huge pages skip)."""
    return np.empty(shape, dtype)


def _mmap_of(arr: np.ndarray):
    base = arr
    while base is not None and not isinstance(base, mmap.mmap):
        base = base.obj if isinstance(base, memoryview) else getattr(base, "base", None)
    return base


def drop_file_pages(arr: np.ndarray) -> bool:
    """Drop the pages of a read-only mmap that ``arr`` views from this process's memory
    (MADV_DONTNEED; they read back from the page cache when touched again). False when arr does not
    view an ACCESS_READ mmap (nothing is done)."""
    m = _mmap_of(arr)
    if m is None or not hasattr(mmap, "MADV_DONTNEED") or arr.size == 0:
        return False
    try:
        head = np.frombuffer(m, np.uint8, count=1)
    except (TypeError, ValueError):
        return False
    if head.flags.writeable:
        return False                                   # a writable map: DONTNEED could lose data
    start = head.__array_interface__["data"][0]
    a = arr.__array_interface__["data"][0] - start
    lo = a - a % mmap.PAGESIZE
    hi = min(len(m), a + arr.nbytes)
    try:
        m.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
    except (OSError, ValueError):
        return False
    return True


def packed_nbytes() -> int:
    """Bytes held by the packed-weight cache (the extra memory of the fast path)."""
    return sum(a.nbytes for _, _, p in _PACKED.values() for a in p)


def clear_cache() -> None:
    _PACKED.clear()


def mul_mat_quantized(raw: np.ndarray, qtype, x: np.ndarray, repacked: bool = False) -> np.ndarray:
    """x (T, K) float32 times the quantized rows raw (R, row_bytes) -> (T, R) float32, bit for bit
    what the reference ``ops.mul_mat_quantized(raw, qtype, x, repacked)`` returns."""
    return bind(raw, qtype, repacked)(x)


def bind_step(raw: np.ndarray, qtype, X: np.ndarray, Y: np.ndarray, repacked: bool = False):
    """A step computing Y[...] = mul_mat_quantized(raw, qtype, X, repacked) for the fixed buffers of a
    graph node (X (T, K) float32, Y (T, R) float32, both contiguous). On dot4's kernels the step is
    the kernel call itself (packed and chosen here, once): no Python between the plan and the kernel."""
    if uses_dot4(qtype, repacked) and X.dtype == np.float32 and X.flags.c_contiguous and Y.flags.c_contiguous:
        T, K = X.shape
        R, p = packed(raw, qtype, K, repacked)
        kern, extra = _dot4_kernel(qtype, R, K, T)
        args = (*p, X, Y, *extra)
        return lambda: kern(*args)
    run = bind(raw, qtype, repacked)
    return lambda: run(X, Y)


def _dot4_kernel(qtype, R: int, K: int, T: int) -> tuple:
    """dot4's kernel for a product (threaded from parallel_min_work() multiply-adds when there are threads
    to wake, else its serial twin) and the arguments it takes after out."""
    threaded, serial = dot4.kernels(qtype.name)
    kern = threaded if threads() > 1 and R * K * T >= parallel_min_work() else serial
    return kern, dot4.extra_args(qtype.name, T)


def bind(raw: np.ndarray, qtype, repacked: bool = False):
    """``fn(x, out=None) -> mul_mat_quantized(raw, qtype, x, repacked)`` (into ``out`` (T, R) float32
    when given), prepared once for a weight (the packed
    arrays, and per activation row count the quantizer and kernels): a graph plan binds it per node, so
    a decode step's matvec pays no lookups."""
    if not supports(qtype):
        from ..ops import mul_mat_quantized as reference
        def run_reference(x, out=None):
            res = reference(raw, qtype, x, repacked)
            if out is None:
                return res
            out[...] = res
            return out
        return run_reference
    name = qtype.name
    state: dict = {}
    if uses_dot4(qtype, repacked):                          # the kernel quantizes and writes into out
        def run_dot4(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
            x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, x.shape[-1])
            T, K = x.shape
            R, p = packed(raw, qtype, K, repacked)
            kern, extra = _dot4_kernel(qtype, R, K, T)
            if out is None:
                out = np.empty((T, R), np.float32)
            kern(*p, x, out, *extra)
            return out
        return run_dot4

    def choose(T: int, K: int):
        if "p" not in state:
            state["R"], state["p"] = packed(raw, qtype, K, repacked)
        R = state["R"]
        if name in Q32_TYPES:
            quant = quantize_q8_1 if name == "q4_1" else quantize_q8_0
            pre = "mv_" if T < MV_MAX_ROWS else "mul_mat_"
            threaded, single = getattr(q32, pre + name), getattr(q32, pre + name + "_serial")
        else:
            quant = quantize_q8_k
            path = path_of(qtype, T, repacked)
            threaded = (kquants.mul_mat_q4_k_repacked if path == "repack" else
                        getattr(kquants, f"mul_mat_{name}_tiled" if path == "tiled" else f"mul_mat_{name}"))
            single = None              # a one-thread region: LLVM compiles the outlined prange body of these
        c = state[T] = (quant, threaded, single, R * K * T >= parallel_min_work(), R)   # kernels better than a serial twin's
        return c

    def run(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        if x.dtype != np.float32 or not x.flags.c_contiguous:
            x = np.ascontiguousarray(x, dtype=np.float32)
        if x.ndim != 2:
            x = x.reshape(-1, x.shape[-1])
        T = x.shape[0]
        c = state.get(T)
        if c is None:
            c = choose(T, x.shape[1])
        quant, threaded, single, parallel, R = c
        p = state["p"]
        n = threads()
        if n == 1 or parallel:
            res = threaded(*p, *quant(x))
        elif single is not None:
            res = single(*p, *quant(x))
        else:
            n = numba.get_num_threads()
            a = quant(x)
            numba.set_num_threads(1)
            try:
                res = threaded(*p, *a)
            finally:
                numba.set_num_threads(n)
        if out is None:
            return res if res.shape[1] == R else np.ascontiguousarray(res[:, :R])
        out[...] = res[:, :R]
        return out

    return run

