"""Compile, or load from numba's cache, the kernels a model runs, before anything is timed.

numba compiles a kernel the first time it is called with new argument types and keeps the machine
code in its cache (next to the module, or in ``NUMBA_CACHE_DIR``), so the first run on a machine
pays a minute or two that later runs do not. A speed measured across that first run says nothing
about the engine. :func:`warm` runs the engine on what a model's generation needs (a short and a long
batch, each bound to serial or threaded kernels, and one decode step) on a throwaway context, and
counts what numba compiled and what it loaded; ``generate``, ``chat``, ``bench``, the notebooks and
``python -m llmlab warm`` report that apart from the tokens per second.

What happened is measured, not inferred from the time taken: numba's ``numba:compile`` event (fired
only when it compiles, never for a cache load) times the compiling, whichever dispatcher it was for, and
the dispatchers' cache statistics count the kernels loaded and compiled. Where llmlab's shipped kernels
(``ggml.cpu.shipped_kernels``) serve this CPU, the line says they were loaded from them; where they could
not serve it, the compile line says why (another numba, sources newer than the archive).
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Callable

STAGES = ("a short batch", "a long batch", "a decode step")


@dataclass
class Warmup:
    seconds: float
    compiled: int       # kernels numba compiled now (a cold cache, or code that changed)
    loaded: int         # kernels loaded from numba's cache
    compile_seconds: float | None = None    # time numba spent compiling (None: not measured)

    def summary(self) -> str:
        from .ggml.cpu import shipped_kernels
        target, seeded = shipped_kernels.active(), shipped_kernels.shipped()
        source = ("numba's cache" if target is None else f"numba's cache (shipped with llmlab for {target.name})" if seeded
                  else f"numba's cache ({target.name} code, LLMLAB_KERNEL_TARGET)")
        c = self.compile_seconds
        if self.compiled or (c is not None and c >= 0.05):
            took = f"{c:.1f} s of the {self.seconds:.1f} s warm-up" if c is not None else f"{self.seconds:.1f} s"
            also = f", {self.loaded} loaded from {source}" if self.loaded else ""
            what = f"{self.compiled}" if self.compiled else "helper functions"
            from .ggml.cpu.numba_cache import PROBLEMS
            why = (f"not in the shipped kernels for {target.name}; " if target and seeded else
                   f"for {target.name}, LLMLAB_KERNEL_TARGET; " if target else
                   f"{shipped_kernels.note()}; " if shipped_kernels.note() else "")
            later = ("the kernel cache is off in this run, so the next compiles them again" if PROBLEMS else
                     "once per machine; later runs load them from numba's cache")
            return f"kernels: compiled {what} in {took}{also} ({why}{later})"
        if c is not None and self.seconds >= 1:
            return (f"kernels: {self.loaded} loaded from {source} (no compiling; the {self.seconds:.1f} s "
                    f"warm-up ran the model)")
        return f"kernels: {self.loaded} loaded from {source} in {self.seconds:.2f} s"


def _dispatchers() -> list:
    """Every numba dispatcher of llmlab's loaded modules (the fast kernels and their helpers)."""
    from numba.core.dispatcher import Dispatcher
    out, seen = [], set()
    for name, mod in list(sys.modules.items()):
        if not name.startswith("llmlab.") or mod is None:
            continue
        for v in vars(mod).values():
            if isinstance(v, Dispatcher) and id(v) not in seen:
                seen.add(id(v))
                out.append(v)
    return out


def cache_counts() -> tuple[int, int]:
    """(loaded from the cache, compiled) so far in this process, over llmlab's kernels."""
    hits = misses = 0
    for d in _dispatchers():
        s = d.stats
        hits += sum(s.cache_hits.values())
        misses += sum(s.cache_misses.values())
    return hits, misses


def warm(model, cpu=None, progress: Callable[[int, str], None] | None = None) -> Warmup:
    """Run ``model`` (a :class:`llmlab.llama.Model`) on a throwaway context so that every kernel its
    generation takes is compiled or loaded; ``progress(i, stage)`` is called before each stage. Where
    numba compiled, the thread governor forgets the steps' times (they were the compiler's)."""
    from numba.core import event
    from .ggml.cpu import threadpool
    from .llama import Batch, Context
    hits0, misses0 = cache_counts()
    t0 = time.perf_counter()
    timer = event.TimingListener()
    with event.install_listener("numba:compile", timer):
        n = min(128, model.hparams.n_ctx_train - 8)
        ctx = Context(model, n_ctx=n + 8, n_batch=n, cpu=cpu)
        batches = (Batch.from_tokens([1, 2]), Batch.from_tokens([3] * n, pos0=2), Batch.from_tokens([4], pos0=n + 2))
        for i, (stage, batch) in enumerate(zip(STAGES, batches)):
            if progress:
                progress(i, stage)
            ctx.decode(batch)
    hits, misses = cache_counts()
    compile_s = timer.duration if timer.done else 0.0
    if misses > misses0 or compile_s >= 0.05:
        threadpool.forget()
    return Warmup(time.perf_counter() - t0, misses - misses0, hits - hits0, compile_s)
