"""The fast kernel set's entry point: the same contract and the same path as the reference
``llmlab.ggml.cpu.ops.mul_mat_quantized``, each path through its numba twin.

    mul_mat_quantized(raw, qtype, x, repacked=False, cpu=None) -> (T, R) float32

The path is the reference's (``ops.quantized_path``, from the CPU profile); its kernels come from the
one table ``twins.TWINS``: the byte-dot kernels (``dot4``) where the host has AVX512-VNNI or AVX2 and
the twin has them, else the generic ones; a type without a twin runs the NumPy reference.

Weights are repacked once (the packed arrays are cached, keyed by the weight buffer's address, shape
and type). An entry lives as long as the array that owns the weight's bytes (a model's tensor data): it
leaves the cache when that array is freed, before its address can be reused, so a notebook that loads
a second model, or a bench that measures several rounds, does not keep the first one's packed copy.

Memory: a packed weight replaces its file bytes. Packing runs in row chunks; after each chunk the file
pages it read are dropped from this process (``madvise(MADV_DONTNEED)`` on the read-only mmap: the
kernel frees them from RSS, and a later read of those bytes faults them back in from the page cache), so
the peak is the packed copy plus one chunk, not file + copy + packing temporaries. Large packed arrays
get huge pages from numpy's allocator (MADV_HUGEPAGE: fewer TLB misses when a decode step streams them).

Threads: below ``parallel_min_work()`` multiply-adds a call runs single-threaded: the byte-dot kernels
take a thread limit (1), the generic ones a serial twin (same body, same bits) or their threaded kernel
in a one-thread region, which runs on the calling thread on every layer (``threadpool.install_inline_regions``).
Waking the other threads costs a few microseconds on omp or tbb on a quiet machine, tens to hundreds
under workqueue and milliseconds on a loaded machine, more than a small matvec saves: the threshold is
derived from the layer's measured wake-up cost (``_common.parallel_min_work``). (A limit of 1 runs the kernel's
outlined prange body on the calling thread, which LLVM compiles better than a plain serial loop:
2.3x faster for Gemma's q8_0 head.)
"""
from __future__ import annotations

import mmap
import weakref

import numba
import numpy as np

from .. import profiles
from ..ops import quantized_path
from . import dot4
from ._common import parallel_min_work, threads
from .twins import Kernels, twin

PACK_CHUNK_ROWS = 2048          # rows packed at a time (a multiple of G and of dot4.R16)

_PACKED: dict[tuple, tuple] = {}


def supports(qtype) -> bool:
    """Whether some path of this type has a fast twin."""
    return any(twin(qtype.name, p) is not None for p in ("vec_dot", "tiled", "repack"))


def kernels_for(qtype, n_rows: int, repacked: bool, cpu) -> Kernels | None:
    """The kernels that compute the reference's path (``ops.quantized_path``) on this host: byte-dot
    ones where dot4 runs here and the twin has them, else the generic ones; None without a twin."""
    cpu = profiles.resolve(cpu)
    tw = twin(qtype.name, quantized_path(qtype, n_rows, repacked, cpu), cpu.quant_kernels)
    if tw is None:
        return None
    if dot4.AVAILABLE and tw.byte_dot is not None:
        return tw.byte_dot[dot4.ISA]
    return tw.generic


def packed(raw: np.ndarray, qtype, K: int, pack) -> tuple:
    """The layout ``pack`` makes of a weight, made once and cached."""
    arr = np.asarray(raw)
    key = (arr.__array_interface__["data"][0], arr.shape, arr.strides, arr.dtype.str, qtype.name, K, pack)
    hit = _PACKED.get(key)
    if hit is not None and not hit[0]():
        hit = None                          # its owner is gone or closed: the address may hold new bytes
    if hit is None:
        rows = np.ascontiguousarray(arr).view(np.uint8).reshape(-1, K // qtype.block_size * qtype.type_size)
        p = _pack_chunked(rows, qtype.name, K, pack)
        hit = _lifetime(arr, key) + (rows.shape[0], p)
        _PACKED[key] = hit
    return hit[2], hit[3]


def _owner(a: np.ndarray):
    """What holds ``a``'s bytes: the file's mmap (through numpy views and memoryviews), else the array
    that owns them, else whatever exports them."""
    while True:
        b = a.base
        if isinstance(b, memoryview):
            b = b.obj
        if not isinstance(b, np.ndarray):
            return a if b is None else b
        a = b


def _lifetime(arr: np.ndarray, key: tuple) -> tuple:
    """(alive, file_bytes) for a cache entry of ``arr``'s bytes, neither holding them. The entry leaves
    the cache as their owner is freed (before the address can be reused); ``alive()`` is False once the
    owner is gone or, an mmap, closed; ``file_bytes()`` is a fresh view of them in the file's mmap (for
    ``settle_file_pages``), or None. An owner without weak references (``bytes``) is held instead."""
    owner = _owner(arr)
    try:
        weakref.finalize(owner, _PACKED.pop, key, None)
        ref = weakref.ref(owner)
    except TypeError:
        return (lambda: True), (lambda: None)
    if not isinstance(owner, mmap.mmap):
        return (lambda: ref() is not None), (lambda: None)
    start = arr.__array_interface__["data"][0] - np.frombuffer(owner, np.uint8, count=1).__array_interface__["data"][0]
    extent = sum((n - 1) * st for n, st in zip(arr.shape, arr.strides)) + arr.itemsize if arr.size else 0

    def alive():
        m = ref()
        return m is not None and not m.closed

    def file_bytes():
        m = ref()
        return None if m is None or m.closed else np.frombuffer(m, np.uint8, count=extent, offset=start)
    return alive, file_bytes


def _pack_chunked(rows: np.ndarray, name: str, K: int, pack) -> tuple:
    """pack (rows -> arrays whose first axis is row groups) over PACK_CHUNK_ROWS rows at a time into
    preallocated arrays (numpy advises MADV_HUGEPAGE on large ones), dropping each chunk's file pages
    once packed. Empty arrays (a slot a type does not use) stay empty."""
    R = rows.shape[0]
    if R <= PACK_CHUNK_ROWS:
        part = pack(rows, name, K)
        drop_file_pages(rows)
        return part
    out = None
    for r0 in range(0, R, PACK_CHUNK_ROWS):
        part = pack(rows[r0:r0 + PACK_CHUNK_ROWS], name, K)
        if out is None:                     # a full chunk: its first axis is PACK_CHUNK_ROWS / group
            group = PACK_CHUNK_ROWS // len(part[0])
            out = tuple(np.empty((-(-R // group),) + a.shape[1:], a.dtype) if len(a) else a for a in part)
        g0 = r0 // group
        for o, a in zip(out, part):
            if len(a):
                o[g0:g0 + len(a)] = a
        del part
        drop_file_pages(rows[r0:r0 + PACK_CHUNK_ROWS])
    return out


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


def settle_file_pages() -> None:
    """Drop again the file pages of every packed weight (a plan calls it once its steps are bound: about
    a millisecond). Each weight's pages are dropped as it is packed, but a later read fault near them
    (the next weight's first bytes, a norm's weight read by a step being bound) maps back up to 64 KiB
    of cached file pages around it (the kernel's fault-around): about 15 MB of SmolLM2's file stayed
    resident that way."""
    for _, file_bytes, _, _ in list(_PACKED.values()):
        arr = file_bytes()
        if arr is not None:
            drop_file_pages(arr)


def packed_nbytes() -> int:
    """Bytes held by the packed-weight cache (the extra memory of the fast path)."""
    return sum(a.nbytes for *_, p in _PACKED.values() for a in p)


def clear_cache() -> None:
    _PACKED.clear()


def mul_mat_quantized(raw: np.ndarray, qtype, x: np.ndarray, repacked: bool = False, cpu=None) -> np.ndarray:
    """x (T, K) float32 times the quantized rows raw (R, row_bytes) -> (T, R) float32, bit for bit
    what the reference ``ops.mul_mat_quantized(raw, qtype, x, repacked, cpu)`` returns."""
    return bind(raw, qtype, repacked, cpu)(x)


def bind_step(raw: np.ndarray, qtype, X: np.ndarray, Y: np.ndarray, repacked: bool = False, cpu=None):
    """A step computing Y[...] = mul_mat_quantized(raw, qtype, X, repacked, cpu) for the fixed buffers of
    a graph node (X (T, K) float32, Y (T, R) float32, both contiguous). On byte-dot kernels the step is
    the kernel call itself (packed and chosen here, once): no Python between the plan and the kernel."""
    cpu = profiles.resolve(cpu)
    T, K = X.shape
    k = kernels_for(qtype, T, repacked, cpu)
    if k is not None and k.quantize is None and X.dtype == np.float32 and X.flags.c_contiguous and Y.flags.c_contiguous:
        R, p = packed(raw, qtype, K, k.pack)
        kern, args = k.threaded, (*p, X, Y, *k.extra, n_threads(R * K * T >= parallel_min_work()))
        return lambda: kern(*args)
    run = bind(raw, qtype, repacked, cpu)
    return lambda: run(X, Y)


def bind_multi_step(raws: list, qtype, X: np.ndarray, Ys: list, repacked: bool = False, cpu=None):
    """One step computing Y_i[...] = mul_mat_quantized(raws[i], qtype, X, repacked, cpu) for several weights
    of one type that read the same activations (attention's Q, K and V; the FFN's gate and up): the
    activations quantized once and all the rows in one parallel region (``dot4.MULTI``), each output
    row summed as its own step sums it. None where the weights' kernel has no such form (only the
    byte-dot legacy kernels have)."""
    cpu = profiles.resolve(cpu)
    T, K = X.shape
    k = kernels_for(qtype, T, repacked, cpu)
    if k is None or k.quantize is not None or not dot4.AVAILABLE or X.dtype != np.float32 or not X.flags.c_contiguous:
        return None
    multi = dot4.MULTI[dot4.ISA].get("legacy")
    if multi is None or k.threaded is not dot4.KERNELS[dot4.ISA]["legacy"]:
        return None
    if any(Y.dtype != np.float32 or not Y.flags.c_contiguous or Y.shape[0] != T for Y in Ys):
        return None
    packs = [packed(raw, qtype, K, k.pack) for raw in raws]
    qs_t, qh_t, d_t, m_t = (tuple(p[j] for _, p in packs) for j in range(4))
    Ys = tuple(Ys)
    n = n_threads(sum(R for R, _ in packs) * K * T >= parallel_min_work())
    return lambda: multi(qs_t, qh_t, d_t, m_t, X, Ys, n)


def n_threads(parallel: bool) -> int:
    """A byte-dot kernel's thread limit: 0 (the step's count) for a product of parallel_min_work()
    multiply-adds or more (``parallel``) when there are threads to wake, else 1 (serial)."""
    return 0 if threads() > 1 and parallel else 1


def bind(raw: np.ndarray, qtype, repacked: bool = False, cpu=None):
    """``fn(x, out=None) -> mul_mat_quantized(raw, qtype, x, repacked, cpu)`` (into ``out`` (T, R)
    float32 when given), prepared once for a weight (per activation row count the kernels and their
    packed arrays): a graph plan binds it per node, so a decode step's matvec pays no lookups."""
    cpu = profiles.resolve(cpu)
    state: dict = {}

    def choose(T: int, K: int):
        k = kernels_for(qtype, T, repacked, cpu)
        if k is None:
            c = state[T] = None
            return c
        R, p = packed(raw, qtype, K, k.pack)
        c = state[T] = (k, p, R * K * T >= parallel_min_work(), R)      # the threshold read when bound
        return c

    def run(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        if x.dtype != np.float32 or not x.flags.c_contiguous:
            x = np.ascontiguousarray(x, dtype=np.float32)
        if x.ndim != 2:
            x = x.reshape(-1, x.shape[-1])
        T = x.shape[0]
        c = state[T] if T in state else choose(T, x.shape[1])
        if c is None:                                       # no twin: the NumPy reference
            from ..ops import mul_mat_quantized as reference
            res = reference(raw, qtype, x, repacked, cpu)
            if out is None:
                return res
            out[...] = res
            return out
        k, p, parallel, R = c
        if k.quantize is None:                              # byte-dot: quantizes and writes into out
            if out is None:
                out = np.empty((T, R), np.float32)
            k.threaded(*p, x, out, *k.extra, n_threads(parallel))
            return out
        if threads() == 1 or parallel:
            res = k.threaded(*p, *k.quantize(x))
        elif k.serial is not None:
            res = k.serial(*p, *k.quantize(x))
        else:                                   # a one-thread region: LLVM compiles the outlined prange
            n = numba.get_num_threads()         # body of these kernels better than a serial twin's
            a = k.quantize(x)
            numba.set_num_threads(1)
            try:
                res = k.threaded(*p, *a)
            finally:
                numba.set_num_threads(n)
        if out is None:
            return res if res.shape[1] == R else np.ascontiguousarray(res[:, :R])
        out[...] = res[:, :R]
        return out

    return run
