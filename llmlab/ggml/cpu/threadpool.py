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
# the limit work on each. workqueue hands even a one-thread region to a worker thread and wakes it
# (a region costs the caller tens to hundreds of microseconds where omp and tbb run it inline).

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
