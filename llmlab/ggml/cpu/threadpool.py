"""How many threads a graph runs on, chosen from measured step times.

ggml's threadpool runs a graph on the count it is given (llama.cpp's ``-t``, by default
``cpu_get_num_math()``: the physical cores). On a quiet machine a parallel region costs microseconds.
Beside other work (a browser, a second notebook, a compiler) a region waits for whichever of its
threads the OS has not scheduled yet, and a decode step has hundreds of regions: so on a busy machine
fewer threads can be many times faster than more, and which count wins changes from minute to minute.
No fixed count is right; only timing the steps tells.

llmlab's results never depend on the thread count (each output row is summed by one thread in a
fixed order), so the count may change between any two steps. :class:`Governor` times each step with
the count it chose and now and then tries another count once; it keeps the count whose recent steps
were fastest. Steps are timed per kind (one token, or a batch), because a batch has more work per
region than one token; a kind with no timings yet follows the one-token steps' choice. How busy the
machine is belongs to the process, not to one context: :func:`governor` gives every context the same one.

The first steps start from the cores other work leaves free (:func:`start_count`, read once per
process): a learner's first generation is short, and steps on more threads than there are free cores
would each wait in every region before any timing could say so. Fewer threads than the
start are tried at once; more only on the probe schedule, and only when the cores are free then.
"""
from __future__ import annotations

import os
import statistics
import time
from collections import deque
from typing import Callable

KEEP = 5            # timings kept per (kind, count): the median of these is the estimate
PROBE_MIN = 8       # steps between two tries of another count, while the counts are close
PROBE_MAX = 256     # ... and at most, while the count in use is clearly the fastest
CLEAR = 1.25        # "clearly": the other counts' estimates are this many times slower


def candidates(n_max: int) -> tuple[int, ...]:
    """The counts worth trying: all threads, half of them, one (largest first)."""
    return tuple(sorted({max(1, n_max), max(1, n_max // 2), 1}, reverse=True))


def busy_cores(window: float = 0.05) -> float | None:
    """How many cores other work keeps busy right now: /proc/stat's idle share over ``window`` seconds,
    read while this process waits (so its own earlier work does not count, as it would in the load
    average). None where there is no /proc/stat (macOS, Windows)."""
    def sample():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return sum(v), v[3] + (v[4] if len(v) > 4 else 0)        # all jiffies, idle + iowait
    try:
        t0, i0 = sample()
        time.sleep(window)
        t1, i1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    n = os.cpu_count() or 1
    return n * (1 - (i1 - i0) / (t1 - t0)) if t1 > t0 else None


class BusySince:
    """:func:`busy_cores` without the wait, for a probe in the middle of a decode: the cores other work
    kept busy since the previous call, /proc/stat's busy jiffies minus this process's own CPU time (all
    its threads, ``os.times``) over that interval. A decode step calls it every 8 to 256 steps, so the
    interval is tens of milliseconds or more, where busy_cores' own 30 ms sleep was paid by the step
    that probed. None on the first call, for an interval under ``min_s``, or without /proc/stat."""

    def __init__(self, min_s: float = 0.02):
        self.min_s = min_s
        self.last = self._sample()

    @staticmethod
    def _sample():
        try:
            with open("/proc/stat") as f:
                v = [int(x) for x in f.readline().split()[1:]]
        except (OSError, ValueError, IndexError):
            return None
        t = os.times()
        return time.perf_counter(), sum(v), v[3] + (v[4] if len(v) > 4 else 0), t.user + t.system

    def __call__(self) -> float | None:
        now = self._sample()
        last, self.last = self.last, now
        if now is None or last is None or now[0] - last[0] < self.min_s or now[1] <= last[1]:
            return None
        n = os.cpu_count() or 1
        jiffy_s = (now[0] - last[0]) * n / (now[1] - last[1])       # seconds per jiffy of one CPU
        own = (now[3] - last[3]) / jiffy_s                          # this process's jiffies
        busy = (now[1] - last[1]) - (now[2] - last[2]) - own
        return max(0.0, n * busy / (now[1] - last[1]))


def start_count(n_max: int, busy: float | None, n_cpus: int | None = None) -> int:
    """The count to start from: the largest candidate not above the cores that other work leaves free
    (``busy``: cores in use, None: unknown, all threads). A momentary reading only moves the start:
    the step timings decide from there."""
    if busy is None:
        return max(1, n_max)
    free = (n_cpus or os.cpu_count() or n_max) - busy
    return next((n for n in candidates(n_max) if n <= free + 0.5), 1)


class Governor:
    """Chooses the thread count of each step (``choose``) from the step times it is told (``record``).
    The first step of each kind is not counted: it pays for first-touch of the weights and, on a cold
    cache, for compiling the kernels. ``start``: the count of the first steps (all threads if None)."""

    def __init__(self, n_max: int, start: int | None = None, busy: Callable[[], float | None] | None = None):
        self.n_max = n_max
        self.counts = candidates(n_max)
        self.start = self.counts[0] if start is None else max(1, min(start, self.counts[0]))
        self.busy = busy                        # cores other work keeps busy now (busy_cores), asked before
        self.n_skipped = 0                      # ... a try of more threads: a loaded machine's is a slow step
        self.times: dict[tuple[str, int], deque] = {}
        self.current: dict[str, int] = {}
        self.wait: dict[str, int] = {}          # steps between two tries of another count, per kind
        self.since: dict[str, int] = {}         # steps since the last try
        self.seen: dict[str, int] = {}          # steps recorded (the first one is dropped)
        self._next = 0                          # round robin over the other counts

    def estimate(self, kind: str, n: int) -> float | None:
        t = self.times.get((kind, n))
        return statistics.median(t) if t else None

    def choose(self, kind: str = "token") -> int:
        """The count for the next step of this kind ("token": one token per step; "batch": more)."""
        if len(self.counts) == 1:
            return self.counts[0]
        if kind not in self.current:
            self.current[kind] = self.start
            self.wait[kind], self.since[kind] = PROBE_MIN, 0
        if kind != "token" and not any((kind, n) in self.times for n in self.counts):
            self.current[kind] = self.current.get("token", self.start)   # no timings yet: the one-token choice
            return self.current[kind]
        self.since[kind] += 1
        untried = [n for n in self.counts if (kind, n) not in self.times and n <= self.current[kind]]
        if kind == "token" and untried and self.seen.get(kind, 0) >= 1:
            return untried[0]                   # one-token steps try fewer threads early on (never costly)
        if self.since[kind] >= self.wait[kind]:
            self.since[kind] = 0
            others = [n for n in self.counts if n != self.current[kind]]
            self._next += 1
            n = others[self._next % len(others)]
            if n > self.current[kind] and self.busy is not None:
                b = self.busy()                 # a probe beyond the free cores waits in every region: skip it
                if b is not None and start_count(n, b) < n:
                    self.n_skipped += 1
                    self.wait[kind] = min(PROBE_MAX, 2 * self.wait[kind])
                    return self.current[kind]
            return n
        return self.current[kind]

    def record(self, kind: str, n: int, seconds: float) -> None:
        """A step of this kind took ``seconds`` on ``n`` threads: keep the fastest count, and try the
        others less often while the one in use stays clearly the fastest."""
        self.seen[kind] = self.seen.get(kind, 0) + 1
        if self.seen[kind] == 1 or kind not in self.current:
            return
        before = self.current[kind]
        times = self.times.setdefault((kind, n), deque(maxlen=KEEP))
        if n != before and (now := self.estimate(kind, before)) is not None and seconds < now:
            times.clear()                       # a try beat the count in use: the machine changed, forget the past
        times.append(seconds)
        est = {c: e for c in self.counts if (e := self.estimate(kind, c)) is not None}
        best = min(est, key=est.get)
        self.current[kind] = best
        if best != before:
            self.wait[kind] = PROBE_MIN
        elif n != best:                         # a try of another count confirmed the one in use
            rest = [e for c, e in est.items() if c != best]
            clear = len(rest) == len(self.counts) - 1 and min(rest) > CLEAR * est[best]
            self.wait[kind] = min(PROBE_MAX, 2 * self.wait[kind]) if clear else PROBE_MIN


# ---- numba's threading layers --------------------------------------------------------------------
# numba runs a parallel region on one of three layers: ``tbb`` (Intel oneTBB: ``pip install tbb``, wheels
# for Linux and Windows x86-64, none for macOS arm64), ``omp`` (OpenMP: GNU libgomp on Linux, the MSVC
# runtime's vcomp on Windows, on macOS only with libomp from Homebrew or conda's llvm-openmp: numba's
# macOS wheels link it but do not ship it) and ``workqueue`` (numba's own, always there). Every layer
# exports the get/set_num_threads entries llmlab's thread limit calls (fast._common), so the governor and
# the limit work on each. workqueue hands even a one-thread region to a worker thread and wakes it (two
# rounds through each worker's condition variable: the thread counts synced, then the work): tens to
# hundreds of microseconds a region, where omp and tbb run a one-thread region inline in 1-3. So llmlab
# runs every one-thread region itself on the calling thread, on every layer (:func:`install_inline_regions`),
# and sizes the work from which a product is threaded by what waking the layer's threads costs here
# (:func:`wake_cost_us`): under workqueue a decode step's small products run on the calling thread and
# only large ones (prefill, the output head) wake the workers.

LAYERS = ("tbb", "omp", "workqueue")             # numba's own order for its "default"
_MODULES = {"tbb": "tbbpool", "omp": "omppool", "workqueue": "workqueue"}


def threading_layers() -> dict:
    """Which of numba's threading layers load on this machine, and which one numba runs (``layer``: the
    one it launched, else the one it will take: the configured one, or the first of its priority that
    loads). Loads the layers' libraries, starts no thread."""
    import importlib
    import numba
    available = []
    for name in LAYERS:
        try:
            importlib.import_module(f"numba.np.ufunc.{_MODULES[name]}")
            available.append(name)
        except Exception:       # noqa: BLE001 - a library the layer needs is missing (ImportError, OSError)
            pass
    try:
        layer, launched = numba.threading_layer(), True
    except ValueError:                           # threads not launched yet
        want = numba.config.THREADING_LAYER
        order = {"default": list(numba.config.THREADING_LAYER_PRIORITY), "safe": ["tbb"],
                 "threadsafe": ["tbb", "omp"], "forksafe": ["tbb", "omp", "workqueue"]}.get(want, [want])
        layer, launched = next((n for n in order if n in available), None), False
    return {"layer": layer, "launched": launched, "available": available,
            "configured": numba.config.THREADING_LAYER}


_SHARED: list[Governor] = []


def governor(n_max: int) -> Governor:
    """The process's governor for up to ``n_max`` threads (a new one when the maximum changes)."""
    if not _SHARED or _SHARED[0].n_max != n_max:
        _SHARED[:] = [Governor(n_max, start_count(n_max, busy_cores() if n_max > 1 else None),
                               busy=BusySince())]
    return _SHARED[0]


def forget() -> None:
    """Drop the process's governor and its timings (after a warm-up, whose steps time the compiler)."""
    _SHARED.clear()


# ---- one-thread regions on the calling thread ------------------------------------------------------
# numba's parallel code calls its layer through one symbol, ``numba_parallel_for(fn, args, dims, steps,
# data, inner_ndim, array_count, num_threads)`` (numba.np.ufunc.parallel.build_gufunc_kernel), bound
# when a kernel's machine code is linked (compiled or loaded from the cache). Once numba has launched its
# layer, llmlab binds that symbol to a small entry of its own: a region of one thread calls ``fn`` on the
# whole schedule directly, what every layer computes for one thread (same chunk, same order, the same
# bits); a larger one goes on to the layer. It also counts both kinds (``region_counts``).

_INLINE: dict = {}                 # the entry's library (kept alive), addresses and counters, once built


def _build_inline_entry(layer_entry: int) -> dict:
    """Compile (LLVM IR, numba's JIT) the entry that forwards to ``layer_entry`` (the layer's parallel_for)
    and a no-op task for :func:`wake_cost_us`."""
    import ctypes
    from llvmlite import ir
    from numba.core.compiler_lock import global_compiler_lock
    from numba.core.registry import cpu_target

    i8p, i64 = ir.IntType(8).as_pointer(), ir.IntType(64)
    mod = ir.Module("llmlab_regions")
    counts = (ctypes.c_int64 * 2)()                  # (inline, handed to the layer), read by region_counts
    fnty = ir.FunctionType(ir.VoidType(), [i8p] * 5 + [i64] * 3)       # as numba declares numba_parallel_for
    task = ir.FunctionType(ir.VoidType(), [i8p.as_pointer(), i64.as_pointer(), i64.as_pointer(), i8p])
    f = ir.Function(mod, fnty, "llmlab_parallel_for")
    fn, args, dims, steps, data, _, _, nth = f.args
    b = ir.IRBuilder(f.append_basic_block())
    inline, layer = f.append_basic_block("inline"), f.append_basic_block("layer")
    n32 = b.trunc(nth, ir.IntType(32))               # the C entries take an int
    b.cbranch(b.icmp_signed("<=", n32, ir.IntType(32)(1)), inline, layer)
    for block, k in ((inline, 0), (layer, 1)):
        b = ir.IRBuilder(block)
        at = b.inttoptr(i64(ctypes.addressof(counts) + 8 * k), i64.as_pointer())
        b.atomic_rmw("add", at, i64(1), "monotonic")
        if k == 0:
            b.call(b.bitcast(fn, task.as_pointer()), [b.bitcast(args, i8p.as_pointer()), b.bitcast(dims, i64.as_pointer()),
                                                        b.bitcast(steps, i64.as_pointer()), data])
        else:
            b.call(b.inttoptr(i64(layer_entry), fnty.as_pointer()), list(f.args))
        b.ret_void()
    noop = ir.Function(mod, task, "llmlab_noop_task")
    ir.IRBuilder(noop.append_basic_block()).ret_void()
    with global_compiler_lock:
        lib = cpu_target.target_context.codegen().create_library("llmlab_regions")
        lib.add_ir_module(mod)
        lib.finalize()
        addr = {name: lib.get_pointer_to_function(name) for name in ("llmlab_parallel_for", "llmlab_noop_task")}
    return {"lib": lib, "entry": addr["llmlab_parallel_for"], "noop": addr["llmlab_noop_task"],
            "layer_entry": layer_entry, "counts": counts}


def _bind_inline_entry() -> None:
    import llvmlite.binding as ll
    if _INLINE:
        return
    layer_entry = ll.address_of_symbol("numba_parallel_for")
    if not layer_entry:
        return
    _INLINE.update(_build_inline_entry(layer_entry))
    ll.add_symbol("numba_parallel_for", _INLINE["entry"])


def install_inline_regions() -> None:
    """Have every one-thread parallel region of kernels linked from now on run on the calling thread. numba
    binds its layer lazily (``numba.np.ufunc.parallel._launch_threads``, called before any parallel kernel
    is compiled or loaded from the cache): that function is wrapped so that the entry is bound right after
    (at once if numba already launched its layer). Called when the fast kernels are imported."""
    from numba.np.ufunc import parallel
    if getattr(parallel, "_is_initialized", False):
        _bind_inline_entry()
        return
    launch = parallel._launch_threads
    if getattr(launch, "llmlab_inline", False):
        return

    def launch_then_bind():
        launch()
        _bind_inline_entry()
    launch_then_bind.llmlab_inline = True
    parallel._launch_threads = launch_then_bind


def region_counts() -> tuple[int, int]:
    """Parallel regions entered so far in this process through llmlab's entry: (run inline on one thread,
    handed to the layer's threads). (0, 0) before numba launched its layer."""
    c = _INLINE.get("counts")
    return (int(c[0]), int(c[1])) if c is not None else (0, 0)


_WAKE: dict[int, float] = {}
# What a region of 2 threads cost the caller on the Zen 3 (2 cores, KVM), the fastest of back-to-back
# empty regions: omp 1.5 us, tbb 2.9 (their workers spin between regions), workqueue 60-150 (condition
# variables). A measurement only adds what a loaded machine adds, so it is never taken above these; and
# on the spinning layers it would only see the load (beside 4 busy threads on 2 cores, omp's fastest
# region took 4-8 ms): there the table's value is the answer.
QUIET_WAKE_US = {"omp": 3.0, "tbb": 3.0, "workqueue": 150.0}
MEASURE_FROM_US = 10.0


def wake_cost_us(n: int) -> float:
    """What a parallel region of ``n`` threads costs the calling thread beyond running its work there, in
    microseconds, on the layer numba launched: the fastest of some empty regions through the layer minus
    the fastest through the inline entry (the fastest, because that is the layer's own cost, where a
    loaded machine adds its waits to the others: the governor answers those), at most QUIET_WAKE_US;
    the table's value for a layer whose workers spin (omp, tbb). Measured once per process and count, 8
    to 32 regions (about 10 ms at most); 0.0 for one thread."""
    if n <= 1:
        return 0.0
    if n in _WAKE:
        return _WAKE[n]
    import ctypes
    import numba
    from numba.np.ufunc import parallel
    parallel._launch_threads()
    if not _INLINE:
        _bind_inline_entry()
    ceiling = QUIET_WAKE_US.get(numba.threading_layer(), float("inf"))
    if ceiling < MEASURE_FROM_US:
        _WAKE[n] = ceiling
        return ceiling
    c = ctypes
    proto = c.CFUNCTYPE(None, c.c_void_p, c.c_void_p, c.c_void_p, c.c_void_p, c.c_void_p, c.c_ssize_t, c.c_ssize_t,
                        c.c_ssize_t)
    layer, inline = proto(_INLINE["layer_entry"]), proto(_INLINE["entry"])
    args, dims, steps = (c.c_void_p * 1)(), (c.c_ssize_t * 2)(n, 1), (c.c_ssize_t * 1)(0)
    noop = _INLINE["noop"]

    def fastest(entry, threads: int) -> float:
        best, t_end = float("inf"), time.perf_counter() + 0.005
        for i in range(32):
            t = time.perf_counter()
            entry(noop, args, dims, steps, None, 1, 0, threads)
            now = time.perf_counter()
            best = min(best, now - t)
            if i >= 7 and now > t_end:
                break
        return best

    fastest(layer, n)                                # the workers woken and their code paged in first
    pooled, alone = fastest(layer, n), fastest(inline, 1)
    _WAKE[n] = min(ceiling, max(0.0, pooled - alone) * 1e6)
    return _WAKE[n]
