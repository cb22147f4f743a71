"""How many threads a graph runs on, chosen from measured step times.

ggml's threadpool runs a graph on the count it is given (llama.cpp's ``-t``, by default
``cpu_get_num_math()``: the physical cores). On a quiet machine a parallel region costs microseconds.
Beside other work (a browser, a second notebook, a compiler) a region waits for whichever of its
threads the OS has not scheduled yet, and a decode step has hundreds of regions: on this project's
2-core machine, with other processes busy, SmolLM2 decoded at 0.2-2 tok/s on 2 threads and at 15-22
tok/s on 1 thread, in the same minutes.

llmlab's results never depend on the thread count (each output row is summed by one thread in a
fixed order), so the count may change between any two steps. :class:`Governor` times each step with
the count it chose and now and then tries another count once; it keeps the count whose recent steps
were fastest. Steps are timed per kind (one token, or a batch), because a batch has more work per
region than one token; a kind with no timings yet follows the one-token steps' choice. How busy the
machine is belongs to the process, not to one context: :func:`governor` gives every context the same one.
"""
from __future__ import annotations

import statistics
from collections import deque

KEEP = 5            # timings kept per (kind, count): the median of these is the estimate
PROBE_MIN = 8       # steps between two tries of another count, while the counts are close
PROBE_MAX = 256     # ... and at most, while the count in use is clearly the fastest
CLEAR = 1.25        # "clearly": the other counts' estimates are this many times slower


def candidates(n_max: int) -> tuple[int, ...]:
    """The counts worth trying: all threads, half of them, one (largest first)."""
    return tuple(sorted({max(1, n_max), max(1, n_max // 2), 1}, reverse=True))


class Governor:
    """Chooses the thread count of each step (``choose``) from the step times it is told (``record``).
    The first step of each kind is not counted: it pays for first-touch of the weights and, on a cold
    cache, for compiling the kernels."""

    def __init__(self, n_max: int):
        self.n_max = n_max
        self.counts = candidates(n_max)
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
            self.current[kind] = self.counts[0]
            self.wait[kind], self.since[kind] = PROBE_MIN, 0
        if kind != "token" and not any((kind, n) in self.times for n in self.counts):
            self.current[kind] = self.current.get("token", self.counts[0])   # no timings yet: the one-token choice
            return self.current[kind]
        self.since[kind] += 1
        untried = [n for n in self.counts if (kind, n) not in self.times]
        if kind == "token" and untried and self.seen.get(kind, 0) >= 1:
            return untried[0]                   # one-token steps try every count early on
        if self.since[kind] >= self.wait[kind]:
            self.since[kind] = 0
            others = [n for n in self.counts if n != self.current[kind]]
            self._next += 1
            return others[self._next % len(others)]
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


_SHARED: list[Governor] = []


def governor(n_max: int) -> Governor:
    """The process's governor for up to ``n_max`` threads (a new one when the maximum changes)."""
    if not _SHARED or _SHARED[0].n_max != n_max:
        _SHARED[:] = [Governor(n_max)]
    return _SHARED[0]


def forget() -> None:
    """Drop the process's governor and its timings (after a warm-up, whose steps time the compiler)."""
    _SHARED.clear()
