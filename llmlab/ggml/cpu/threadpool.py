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
# serves workqueue's larger regions from its own spinning pool (a few microseconds a region, as omp), and
# sizes the work from which a product is threaded by what waking the threads costs here (:func:`wake_cost_us`).

LAYERS = ("tbb", "omp", "workqueue")             # numba's own order for its "default"
_MODULES = {"tbb": "tbbpool", "omp": "omppool", "workqueue": "workqueue"}


def threading_layers() -> dict:
    """Which of numba's threading layers load on this machine, and which one numba runs (``layer``: the
    one it launched, else the one it will take: the configured one, or the first of its priority that
    loads), and whether llmlab's spinning pool serves its regions (``pool``: under workqueue, with more
    than one thread). Loads the layers' libraries, starts no thread."""
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
    pool = bool(pool_threads()) if launched else layer == "workqueue" and numba.config.NUMBA_NUM_THREADS > 1
    return {"layer": layer, "launched": launched, "available": available,
            "configured": numba.config.THREADING_LAYER, "pool": pool}


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


# ---- one-thread regions on the calling thread, and a spinning pool under workqueue ------------------
# numba's parallel code calls its layer through one symbol, ``numba_parallel_for(fn, args, dims, steps,
# data, inner_ndim, array_count, num_threads)`` (numba.np.ufunc.parallel.build_gufunc_kernel), bound
# when a kernel's machine code is linked (compiled or loaded from the cache). Once numba has launched its
# layer, llmlab binds that symbol to a small entry of its own: a region of one thread calls ``fn`` on the
# whole schedule directly, what every layer computes for one thread (same chunk, same order, the same
# bits); a larger one goes on to the layer. It also counts both kinds (``region_counts``).
#
# Under workqueue the entry serves larger regions itself, as ggml's threadpool does: persistent workers
# (NUMBA_NUM_THREADS - 1 of them) spin on their own generation counter with the CPU's pause hint, run their
# chunk when it moves, and after SPIN rounds sleep on a condition variable, which the caller signals only
# when a worker said it sleeps. The caller runs chunk 0 and spins until the workers' chunks are done, and
# after SPIN rounds sleeps on a second condition variable, which a worker signals when it finishes a chunk
# and the caller said it sleeps (ggml's threadpool: a bounded spin, then the OS). On a machine busier than
# its threads, a waiting caller that only spun and yielded kept its core from the worker it waited for.
# A region costs a few microseconds where workqueue's two condition-variable rounds cost 60-150. The chunks
# are workqueue's (``total // n`` schedule entries each, the last one the rest), chunk i on the thread that
# numba's ``get_thread_id`` calls i (reductions keep their slots), so the bits are workqueue's. A region
# the pool cannot take (one already running: a nested region or a second Python thread) goes to workqueue.

SPIN = 1 << 14          # pause rounds (tens of ns each) a worker spins before it sleeps, the caller too
_INLINE: dict = {}      # the entry's library (kept alive), addresses and counters, once built
_POOL: dict = {}        # the pool's control block, OS calls and threads, under workqueue only
# the control block: int64 words, each thread's on its own 64-byte line
READY, BUSY, STOP, TASK, LINE = 0, 8, 16, 24, 8     # TASK: fn, steps, data, num_threads; worker k's line at
WAITS = 28                                          # the caller sleeps until the workers' chunks are done
GEN, DONE, SLEEPS, ARGS, DIMS = 0, 1, 2, 3, 4       # 32 + 8k: generation, done, sleeps, its args and dims


def _os_calls() -> dict:
    """The OS's lock, condition variable, yield and thread-local calls the pool's machine code calls by
    address: POSIX threads (Linux, macOS), or Windows' SRW locks, condition variables and TLS."""
    import ctypes
    import sys
    sync = tuple((ctypes.c_int64 * 32)() for _ in range(3))        # mutex, the workers' condition, the
    #                                                                   caller's (zeroed: Windows' init)
    if sys.platform == "win32":
        k = ctypes.WinDLL("kernel32")
        fns = [k.AcquireSRWLockExclusive, k.ReleaseSRWLockExclusive, k.SleepConditionVariableSRW,
               k.WakeAllConditionVariable, k.SwitchToThread, k.TlsGetValue, k.TlsSetValue]
        key = k.TlsAlloc()
        key_bits, set_tls = 32, lambda v: k.TlsSetValue(ctypes.c_uint32(key), ctypes.c_void_p(v))
        init = lambda: None                                             # noqa: E731
    else:
        c = ctypes.CDLL(None)
        fns = [c.pthread_mutex_lock, c.pthread_mutex_unlock, c.pthread_cond_wait, c.pthread_cond_broadcast,
               c.sched_yield, c.pthread_getspecific, c.pthread_setspecific]
        ktype = ctypes.c_ulong if sys.platform == "darwin" else ctypes.c_uint
        kbox = ktype()
        if c.pthread_key_create(ctypes.byref(kbox), None):
            raise OSError("pthread_key_create failed")
        key, key_bits = kbox.value, 8 * ctypes.sizeof(ktype)
        set_tls = lambda v: c.pthread_setspecific(ktype(key), ctypes.c_void_p(v))   # noqa: E731

        def init():
            c.pthread_mutex_init(sync[0], None)
            c.pthread_cond_init(sync[1], None)
            c.pthread_cond_init(sync[2], None)
    init()
    addr = [ctypes.cast(f, ctypes.c_void_p).value for f in fns]
    names = ("lock", "unlock", "wait", "wake", "yield", "tls_get", "tls_set")
    return {**dict(zip(names, addr)), "sync": sync, "init": init, "key": key, "key_bits": key_bits,
            "set_tls": set_tls, "windows": sys.platform == "win32"}


def _pause_intrinsic() -> tuple[str, list[int]]:
    """The spin-wait hint of this CPU as an LLVM intrinsic (no assembler needed): x86's pause, aarch64's
    isb sy (a longer wait than yield, as Rust's spin_loop); none elsewhere."""
    import platform
    m = platform.machine().lower()
    if m in ("x86_64", "amd64", "i686", "i386", "x86"):
        return "llvm.x86.sse2.pause", []
    if m in ("arm64", "aarch64"):
        return "llvm.aarch64.isb", [15]
    return "", []


def _build_inline_entry(layer_entry: int, pool: dict | None = None) -> dict:
    """Compile (LLVM IR, numba's JIT) the entry that forwards to ``layer_entry`` (the layer's parallel_for),
    a no-op task for :func:`wake_cost_us` and, with ``pool`` (its control block and OS calls), the pool's
    worker loop and a ``get_thread_id`` that names the pool's threads by their chunk. The IR names this
    process's addresses (blocks, C functions) by external symbols bound with ``ll.add_symbol`` before it is
    linked, so it is the same text in every process and its machine code is compiled once and then loaded
    (``numba_cache.cached_library``: no LLVM code generator, whose pages would stay resident)."""
    import ctypes

    import llvmlite.binding as ll
    from llvmlite import ir
    from numba.core import cgutils
    from numba.core.registry import cpu_target

    from .numba_cache import cached_library

    i8p, i32, i64 = ir.IntType(8).as_pointer(), ir.IntType(32), ir.IntType(64)
    void = ir.VoidType()
    mod = ir.Module("llmlab_regions")
    counts = (ctypes.c_int64 * 3)()                  # (inline, handed to the layer, served by the pool)
    fnty = ir.FunctionType(void, [i8p] * 5 + [i64] * 3)                  # as numba declares numba_parallel_for
    task = ir.FunctionType(void, [i8p.as_pointer(), i64.as_pointer(), i64.as_pointer(), i8p])
    symbols = {"counts": ctypes.addressof(counts), "layer_entry": layer_entry}
    keep = {"counts": counts}                        # what the symbols point into, kept alive with the entry
    if pool is not None:
        keep["tls_key"] = (ctypes.c_int64 * 1)(pool["os"]["key"])
        symbols.update(dict(zip(("mutex", "cond", "done_cond"), map(ctypes.addressof, pool["os"]["sync"]))),
                       ctrl=ctypes.addressof(pool["ctrl"]), tls_key=ctypes.addressof(keep["tls_key"]),
                       set_num_threads=pool["set_num_threads"], layer_thread_id=pool["layer_thread_id"],
                       **{k: pool["os"][k] for k in ("lock", "unlock", "wait", "wake", "tls_get")})

    def at(b, name):                                 # this process's address ``name``, as an int64
        sym = f"llmlab_regions_{name}"
        g = mod.globals.get(sym) or ir.GlobalVariable(mod, ir.IntType(8), sym)     # external: bound at link
        return b.ptrtoint(g, i64)

    def word(b, base, k):                            # an int64 word of a ctypes block (by its name), as a pointer
        return b.inttoptr(b.add(at(b, base), i64(8 * k)), i64.as_pointer())

    def count(b, k):
        b.atomic_rmw("add", word(b, "counts", k), i64(1), "monotonic")

    def call(b, name, ret, args):                    # a C function by its address's name
        sym = f"llmlab_regions_{name}"
        fn = mod.globals.get(sym) or ir.Function(mod, ir.FunctionType(ret, [a.type for a in args]), sym)
        return b.call(fn, args)

    def pause(b):
        if hint:
            fty = ir.FunctionType(void, [i32] * len(hint_args))
            b.call(mod.globals.get(hint) or ir.Function(mod, fty, hint), [i32(v) for v in hint_args])

    hint, hint_args = _pause_intrinsic()
    f = ir.Function(mod, fnty, "llmlab_parallel_for")
    fn, args, dims, steps, data, inner_ndim, array_count, nth = f.args
    b = ir.IRBuilder(f.append_basic_block())
    inline, layer = f.append_basic_block("inline"), f.append_basic_block("layer")
    n32 = b.trunc(nth, i32)                          # the C entries take an int
    if pool is None:
        b.cbranch(b.icmp_signed("<=", n32, i32(1)), inline, layer)
    else:
        ctrl, osc = "ctrl", pool["os"]
        served = f.append_basic_block("pool")
        b.cbranch(b.icmp_signed("<=", n32, i32(1)), inline, f.append_basic_block("many"))
        b = ir.IRBuilder(f.blocks[-1])
        n = b.sext(n32, i64)
        fits = b.and_(b.icmp_signed("<=", n, i64(pool["workers"] + 1)), b.icmp_signed("!=", b.load_atomic(
            word(b, ctrl, READY), "acquire", 8), i64(0)))
        take = f.append_basic_block("take")
        b.cbranch(fits, take, layer)
        b = ir.IRBuilder(take)
        got = b.extract_value(b.cmpxchg(word(b, ctrl, BUSY), i64(0), i64(1), "acquire", "monotonic"), 1)
        b.cbranch(got, served, layer)

        b = ir.IRBuilder(served)                     # workqueue's chunks, then chunk k to worker k, 0 here
        count(b, 2)
        dims64, steps64 = b.bitcast(dims, i64.as_pointer()), b.bitcast(steps, i64.as_pointer())
        total = b.load(dims64)
        each = b.udiv(total, n)
        arg_len = b.add(inner_ndim, i64(1))
        all_dims = b.alloca(i64, b.mul(n, arg_len))
        all_args = b.alloca(i8p, b.mul(n, array_count))
        with cgutils.for_range(b, n) as i:
            d = b.gep(all_dims, [b.mul(i.index, arg_len)])
            with cgutils.for_range(b, arg_len) as j:
                b.store(b.load(b.gep(dims64, [j.index])), b.gep(d, [j.index]))
            last = b.icmp_signed("==", i.index, b.sub(n, i64(1)))
            b.store(b.select(last, b.sub(total, b.mul(each, i.index)), each), d)
            a = b.gep(all_args, [b.mul(i.index, array_count)])
            with cgutils.for_range(b, array_count) as j:
                off = b.mul(b.mul(b.load(b.gep(steps64, [j.index])), each), i.index)
                b.store(b.gep(b.load(b.gep(b.bitcast(args, i8p.as_pointer()), [j.index])), [off]), b.gep(a, [j.index]))
        for k, v in enumerate((fn, steps, data)):
            b.store(b.ptrtoint(v, i64), word(b, ctrl, TASK + k))
        b.store(nth, word(b, ctrl, TASK + 3))
        line = lambda b, k, slot: b.inttoptr(b.add(b.add(at(b, ctrl), i64(8 * (32 + slot))),  # noqa: E731
                                                     b.mul(k, i64(8 * LINE))), i64.as_pointer())
        with cgutils.for_range(b, n, start=i64(1)) as k:
            b.store(b.ptrtoint(b.gep(all_args, [b.mul(k.index, array_count)]), i64), line(b, k.index, ARGS))
            b.store(b.ptrtoint(b.gep(all_dims, [b.mul(k.index, arg_len)]), i64), line(b, k.index, DIMS))
            gen = line(b, k.index, GEN)
            b.store_atomic(b.add(b.load(gen), i64(1)), gen, "seq_cst", 8)
            with b.if_then(b.icmp_signed("!=", b.load_atomic(line(b, k.index, SLEEPS), "seq_cst", 8), i64(0))):
                call(b, "lock", void, [b.inttoptr(at(b, "mutex"), i8p)])
                call(b, "wake", void, [b.inttoptr(at(b, "cond"), i8p)])
                call(b, "unlock", void, [b.inttoptr(at(b, "mutex"), i8p)])
        b.call(b.bitcast(fn, task.as_pointer()), [all_args, all_dims, steps64, data])
        with cgutils.for_range(b, n, start=i64(1)) as k:       # wait for the workers: spin, then sleep
            spin = cgutils.alloca_once_value(b, i64(0))
            check, wait, nap, doze, up, over = (f.append_basic_block(x) for x in
                                                ("check", "wait", "nap", "doze", "up", "over"))
            b.branch(check)
            b.position_at_end(check)
            done = b.icmp_signed("==", b.load_atomic(line(b, k.index, DONE), "acquire", 8), b.load(line(b, k.index, GEN)))
            b.cbranch(done, over, wait)
            b.position_at_end(wait)
            pause(b)
            s = b.add(b.load(spin), i64(1))
            b.store(s, spin)
            b.cbranch(b.icmp_signed(">", s, i64(SPIN)), nap, check)
            b.position_at_end(nap)                   # say it sleeps, then check again under the lock (the
            m, c = b.inttoptr(at(b, "mutex"), i8p), b.inttoptr(at(b, "done_cond"), i8p)    # worker stores
            call(b, "lock", void, [m])               # DONE, then reads WAITS: one of the two sees the other)
            b.store_atomic(i64(1), word(b, ctrl, WAITS), "seq_cst", 8)
            b.branch(doze)
            b.position_at_end(doze)
            gen = b.load(line(b, k.index, GEN))
            with b.if_then(b.icmp_signed("!=", b.load_atomic(line(b, k.index, DONE), "seq_cst", 8), gen)):
                call(b, "wait", void, [c, m] + ([i32(-1), i32(0)] if osc["windows"] else []))
                b.branch(doze)
            b.branch(up)
            b.position_at_end(up)
            b.store_atomic(i64(0), word(b, ctrl, WAITS), "seq_cst", 8)
            call(b, "unlock", void, [m])
            b.branch(over)
            b.position_at_end(over)
        b.store_atomic(i64(0), word(b, ctrl, BUSY), "release", 8)
        b.ret_void()
    for block, k in ((inline, 0), (layer, 1)):
        b = ir.IRBuilder(block)
        count(b, k)
        if k == 0:
            b.call(b.bitcast(fn, task.as_pointer()), [b.bitcast(args, i8p.as_pointer()), b.bitcast(dims, i64.as_pointer()),
                                                        b.bitcast(steps, i64.as_pointer()), data])
        else:
            call(b, "layer_entry", void, list(f.args))
        b.ret_void()
    noop = ir.Function(mod, task, "llmlab_noop_task")
    ir.IRBuilder(noop.append_basic_block()).ret_void()
    names = ["llmlab_parallel_for", "llmlab_noop_task"]
    if pool is not None:
        _build_worker(mod, pool, at, word, call, pause, line)
        names += ["llmlab_pool_worker", "llmlab_get_thread_id"]
    for name, address in symbols.items():           # bound before the machine code is linked
        ll.add_symbol(f"llmlab_regions_{name}", address)
    lib = cached_library(cpu_target.target_context.codegen(), "llmlab_regions", mod)
    addr = {name: lib.get_pointer_to_function(name) for name in names}
    return {"lib": lib, "entry": addr["llmlab_parallel_for"], "noop": addr["llmlab_noop_task"],
            "worker": addr.get("llmlab_pool_worker"), "get_thread_id": addr.get("llmlab_get_thread_id"),
            "layer_entry": layer_entry, "counts": counts, "keep": keep}


def _build_worker(mod, pool: dict, at, word, call, pause, line) -> None:
    """The worker loop ``llmlab_pool_worker(k)`` (returns when STOP is set) and ``llmlab_get_thread_id``: a
    pool thread's chunk number (its thread-local slot holds k + 1), else the layer's own answer."""
    from llvmlite import ir
    from numba.core import cgutils
    i8p, i32, i64, void = ir.IntType(8).as_pointer(), ir.IntType(32), ir.IntType(64), ir.VoidType()
    ctrl, osc = "ctrl", pool["os"]
    task = ir.FunctionType(void, [i8p.as_pointer(), i64.as_pointer(), i64.as_pointer(), i8p])

    f = ir.Function(mod, ir.FunctionType(void, [i64]), "llmlab_pool_worker")
    k = f.args[0]
    b = ir.IRBuilder(f.append_basic_block())
    seen, spin = cgutils.alloca_once_value(b, i64(0)), cgutils.alloca_once(b, i64)    # 0: the pool's start (a
    # region published before this thread got here is not missed)
    head, wait, nap, sleep, woke, run, stop = (f.append_basic_block(x) for x in
                                               ("head", "wait", "nap", "sleep", "woke", "run", "stop"))
    b.store(i64(0), spin)
    b.branch(head)
    b = ir.IRBuilder(head)                           # a new generation? stop? else pause, and sleep after SPIN
    moved = b.icmp_signed("!=", b.load_atomic(line(b, k, GEN), "acquire", 8), b.load(seen))
    stopped = b.icmp_signed("!=", b.load_atomic(word(b, ctrl, STOP), "monotonic", 8), i64(0))
    b.cbranch(stopped, stop, wait)
    b = ir.IRBuilder(wait)
    spinning = f.append_basic_block("spinning")
    b.cbranch(moved, run, spinning)
    b = ir.IRBuilder(spinning)
    pause(b)
    s = b.add(b.load(spin), i64(1))
    b.store(s, spin)
    b.cbranch(b.icmp_signed(">", s, i64(SPIN)), nap, head)
    b = ir.IRBuilder(nap)                            # say it sleeps, then check again under the lock
    m, c = b.inttoptr(at(b, "mutex"), i8p), b.inttoptr(at(b, "cond"), i8p)
    call(b, "lock", void, [m])
    b.store_atomic(i64(1), line(b, k, SLEEPS), "seq_cst", 8)
    b.branch(sleep)
    b = ir.IRBuilder(sleep)
    idle = b.and_(b.icmp_signed("==", b.load_atomic(line(b, k, GEN), "seq_cst", 8), b.load(seen)),
                  b.icmp_signed("==", b.load_atomic(word(b, ctrl, STOP), "seq_cst", 8), i64(0)))
    with b.if_then(idle):
        call(b, "wait", void, [c, m] + ([i32(-1), i32(0)] if osc["windows"] else []))
        b.branch(sleep)
    b.branch(woke)
    b = ir.IRBuilder(woke)
    b.store_atomic(i64(0), line(b, k, SLEEPS), "seq_cst", 8)
    call(b, "unlock", void, [m])
    b.store(i64(0), spin)
    b.branch(head)
    b = ir.IRBuilder(run)                            # chunk k of the region the caller published
    gen = b.load(line(b, k, GEN))
    b.store(gen, seen)
    call(b, "set_num_threads", void, [b.trunc(b.load(word(b, ctrl, TASK + 3)), i32)])   # as workqueue's sync_tls
    fn = b.inttoptr(b.load(word(b, ctrl, TASK)), task.as_pointer())
    b.call(fn, [b.inttoptr(b.load(line(b, k, ARGS)), i8p.as_pointer()), b.inttoptr(b.load(line(b, k, DIMS)), i64.as_pointer()),
                b.inttoptr(b.load(word(b, ctrl, TASK + 1)), i64.as_pointer()), b.inttoptr(b.load(word(b, ctrl, TASK + 2)), i8p)])
    b.store_atomic(gen, line(b, k, DONE), "seq_cst", 8)
    with b.if_then(b.icmp_signed("!=", b.load_atomic(word(b, ctrl, WAITS), "seq_cst", 8), i64(0))):
        m = b.inttoptr(at(b, "mutex"), i8p)          # the caller sleeps (or is about to): wake it
        call(b, "lock", void, [m])
        call(b, "wake", void, [b.inttoptr(at(b, "done_cond"), i8p)])
        call(b, "unlock", void, [m])
    b.store(i64(0), spin)
    b.branch(head)
    ir.IRBuilder(stop).ret_void()

    g = ir.Function(mod, ir.FunctionType(i64, []), "llmlab_get_thread_id")   # as numba declares it (intp)
    b = ir.IRBuilder(g.append_basic_block())
    key = b.load(word(b, "tls_key", 0))             # the key, a value of this process, from its block
    if osc["key_bits"] < 64:
        key = b.trunc(key, ir.IntType(osc["key_bits"]))
    v = b.ptrtoint(call(b, "tls_get", i8p, [key]), i64)
    mine = b.icmp_signed("!=", v, i64(0))
    with b.if_else(mine) as (then, other):
        with then:
            b.ret(b.sub(v, i64(1)))
        with other:
            b.ret(b.sext(call(b, "layer_thread_id", i32, []), i64))     # the layer's C int
    b.unreachable()
def _bind_inline_entry() -> None:
    import llvmlite.binding as ll
    import numba
    if _INLINE:
        return
    layer_entry = ll.address_of_symbol("numba_parallel_for")
    if not layer_entry:
        return
    pool = None
    if numba.threading_layer() == "workqueue" and numba.config.NUMBA_NUM_THREADS > 1:
        try:
            pool = _new_pool(numba.config.NUMBA_NUM_THREADS - 1)
            _INLINE.update(_build_inline_entry(layer_entry, pool))
        except Exception:       # noqa: BLE001 - an OS call missing: workqueue serves the regions, as before
            pool = None
    if not _INLINE:
        _INLINE.update(_build_inline_entry(layer_entry))
    ll.add_symbol("numba_parallel_for", _INLINE["entry"])
    if pool is not None:
        ll.add_symbol("get_thread_id", _INLINE["get_thread_id"])
        _POOL.update(pool)
        _start_pool()


def _new_pool(workers: int) -> dict:
    import ctypes
    import llvmlite.binding as ll
    return {"workers": workers, "ctrl": (ctypes.c_int64 * (32 + LINE * (workers + 1)))(), "os": _os_calls(),
            "set_num_threads": ll.address_of_symbol("set_num_threads"),
            "layer_thread_id": ll.address_of_symbol("get_thread_id"), "threads": []}


def _start_pool() -> None:
    """Start the workers (daemon threads whose loop runs without the GIL), then open the pool; stop them at
    exit, and start fresh ones in a forked child (the parent's threads do not exist there)."""
    import atexit
    import ctypes
    import threading
    loop = ctypes.CFUNCTYPE(None, ctypes.c_int64)(_INLINE["worker"])     # ctypes drops the GIL for the call

    def work(k: int) -> None:
        _POOL["os"]["set_tls"](k + 1)                # get_thread_id: this thread runs chunk k
        loop(k)
    _POOL["threads"] = [threading.Thread(target=work, args=(k,), name=f"llmlab-pool-{k}", daemon=True)
                        for k in range(1, _POOL["workers"] + 1)]
    for t in _POOL["threads"]:
        t.start()
    _POOL["ctrl"][READY] = 1
    if not _POOL.get("hooked"):
        _POOL["hooked"] = True
        atexit.register(stop_pool)
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=_restart_in_child)


def stop_pool(timeout: float = 1.0) -> bool:
    """Close the pool (regions go to workqueue from now on), wake and end its workers; True when all ended."""
    import ctypes
    if not _POOL:
        return True
    ctrl, osc = _POOL["ctrl"], _POOL["os"]
    ctrl[READY] = 0
    while ctrl[BUSY]:                                # a region in flight on another thread finishes first
        time.sleep(1e-4)
    ctrl[STOP] = 1
    m, c, _ = (ctypes.addressof(x) for x in osc["sync"])
    ctypes.CFUNCTYPE(None, ctypes.c_void_p)(osc["lock"])(m)
    ctypes.CFUNCTYPE(None, ctypes.c_void_p)(osc["wake"])(c)
    ctypes.CFUNCTYPE(None, ctypes.c_void_p)(osc["unlock"])(m)
    for t in _POOL["threads"]:
        t.join(timeout)
    return not any(t.is_alive() for t in _POOL["threads"])


def _restart_in_child() -> None:
    """After fork: the control block and the lock are copies of the parent's at an arbitrary moment, its
    threads are gone: clear, re-initialise, start new workers."""
    if not _POOL:
        return
    import ctypes
    ctypes.memset(_POOL["ctrl"], 0, ctypes.sizeof(_POOL["ctrl"]))
    for x in _POOL["os"]["sync"]:
        ctypes.memset(x, 0, ctypes.sizeof(x))
    _POOL["os"]["init"]()
    _start_pool()


def pool_threads() -> list:
    """The pool's running worker threads (Python's Thread objects); empty where no pool serves the layer."""
    return [t for t in _POOL.get("threads", []) if t.is_alive()] if _POOL.get("ctrl") and _POOL["ctrl"][READY] else []


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
    run on more: by the layer's threads or the pool's). (0, 0) before numba launched its layer."""
    c = _INLINE.get("counts")
    return (int(c[0]), int(c[1]) + int(c[2])) if c is not None else (0, 0)


def pooled_regions() -> int:
    """How many of the threaded regions the pool served (0 where no pool serves the layer)."""
    c = _INLINE.get("counts")
    return int(c[2]) if c is not None else 0


_WAKE: dict[int, float] = {}
# What a region of 2 threads cost the caller on the Zen 3 (2 cores, KVM), the fastest of back-to-back
# empty regions: omp 1.5 us, tbb 2.9, llmlab's pool under workqueue 0.7-1.5 (their workers spin between
# regions), workqueue alone 60-150 (condition variables). A measurement only adds what a loaded machine
# adds, so it is never taken above these; and on the spinning layers it would only see the load (beside 4
# busy threads on 2 cores, omp's fastest region took 4-8 ms): there the table's value is the answer.
QUIET_WAKE_US = {"omp": 3.0, "tbb": 3.0, "pool": 3.0, "workqueue": 150.0}
MEASURE_FROM_US = 10.0


def wake_cost_us(n: int) -> float:
    """What a parallel region of ``n`` threads costs the calling thread beyond running its work there, in
    microseconds, on the layer numba launched: the fastest of some empty regions through the layer minus
    the fastest through the inline entry (the fastest, because that is the layer's own cost, where a
    loaded machine adds its waits to the others: the governor answers those), at most QUIET_WAKE_US;
    the table's value for a layer whose workers spin (omp, tbb, the pool). Measured once per process and
    count, 8 to 32 regions (about 10 ms at most); 0.0 for one thread."""
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
    ceiling = QUIET_WAKE_US.get("pool" if _POOL else numba.threading_layer(), float("inf"))
    if ceiling < MEASURE_FROM_US:
        _WAKE[n] = ceiling
        return ceiling
    c = ctypes
    proto = c.CFUNCTYPE(None, c.c_void_p, c.c_void_p, c.c_void_p, c.c_void_p, c.c_void_p, c.c_ssize_t, c.c_ssize_t,
                        c.c_ssize_t)
    inline = proto(_INLINE["entry"])                 # n threads: the layer's (or the pool's), 1: inline
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

    fastest(inline, n)                               # the workers woken and their code paged in first
    pooled, alone = fastest(inline, n), fastest(inline, 1)
    _WAKE[n] = min(ceiling, max(0.0, pooled - alone) * 1e6)
    return _WAKE[n]
