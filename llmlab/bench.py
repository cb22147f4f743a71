"""Speed against llama.cpp in the same run, as llama-bench reports it: prompt processing (pp) and
token generation (tg) in tokens per second, then ratios.

Both engines get the same file, the same thread count and the same tokens: a prompt of
``n_prompt`` tokens cut from a real text, decoded in one batch, then ``n_gen`` greedy steps of one
token each. llama.cpp runs in a process of its own so that each side's peak memory is its own.
Decode is bound by memory bandwidth: every step reads every weight once (the tied LM head
included), so ``decode_gb_per_s`` = weight bytes x decode tokens/s says how close each side is.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from . import LLMLabError

TEXT = Path(__file__).resolve().parent / "data" / "english_python_docs.txt"


def prompt_tokens(tokenizer, n: int) -> list[int]:
    """The first ``n`` tokens of a real English text (repeated if it is short), BOS first when the
    model asks for one."""
    text = TEXT.read_text(encoding="utf-8") if TEXT.exists() else "The quick brown fox jumps over the lazy dog. "
    ids = tokenizer.tokenize(text, add_bos=True, special=False)
    while len(ids) < n:
        ids += tokenizer.tokenize(text, add_bos=False, special=False)
    return ids[:n]


def peak_rss_mb() -> float:
    """This process's peak resident memory in MiB, on every OS: Linux's VmHWM (per address space, so a
    child started from a big parent reports its own, unlike ru_maxrss, which survives exec), Windows'
    PeakWorkingSetSize, else ``getrusage`` (kilobytes on Linux, bytes on macOS); 0.0 where none answers."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    if sys.platform == "win32":
        return _windows_peak_working_set() / (1 << 20)
    try:
        import resource
    except ModuleNotFoundError:
        return 0.0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1 << 20) if sys.platform == "darwin" else peak / 1024


def _windows_peak_working_set() -> int:
    """GetProcessMemoryInfo(GetCurrentProcess()).PeakWorkingSetSize in bytes (0 if the call fails)."""
    import ctypes
    from ctypes import wintypes

    class Counters(ctypes.Structure):          # PROCESS_MEMORY_COUNTERS (psapi.h)
        _fields_ = [("cb", wintypes.DWORD), ("PageFaultCount", wintypes.DWORD),
                    ("PeakWorkingSetSize", ctypes.c_size_t), ("WorkingSetSize", ctypes.c_size_t),
                    ("QuotaPeakPagedPoolUsage", ctypes.c_size_t), ("QuotaPagedPoolUsage", ctypes.c_size_t),
                    ("QuotaPeakNonPagedPoolUsage", ctypes.c_size_t), ("QuotaNonPagedPoolUsage", ctypes.c_size_t),
                    ("PagefileUsage", ctypes.c_size_t), ("PeakPagefileUsage", ctypes.c_size_t)]
    c = Counters()
    c.cb = ctypes.sizeof(c)
    k32 = ctypes.WinDLL("kernel32")
    k32.GetCurrentProcess.restype = wintypes.HANDLE
    try:
        get = ctypes.WinDLL("psapi").GetProcessMemoryInfo   # K32GetProcessMemoryInfo in kernel32 since Windows 7
    except (OSError, AttributeError):
        get = k32.K32GetProcessMemoryInfo
    get.argtypes = [wintypes.HANDLE, ctypes.POINTER(Counters), wintypes.DWORD]
    get.restype = wintypes.BOOL
    return c.PeakWorkingSetSize if get(k32.GetCurrentProcess(), ctypes.byref(c), c.cb) else 0


def weight_bytes(model) -> int:
    """Bytes of weights one decode step reads: every tensor once (the tied LM head is token_embd)."""
    return sum(t.nbytes() for t in model.weights.values())


@dataclass
class Side:
    prefill_tokens_per_s: float = 0.0
    decode_tokens_per_s: float = 0.0
    peak_rss_mb: float = 0.0
    load_s: float = 0.0
    ids: list[int] = field(default_factory=list)
    decode_short_tokens_per_s: float | None = None      # decoding from a SHORT_PROMPT-token prompt


SHORT_PROMPT = 10       # llama-bench's tg convention: decode speed with (almost) nothing in the KV cache


def median_side(sides: list[Side]) -> Side:
    """One engine's rounds as one: the median of each speed; the first round's peak memory, load time and
    tokens (every round decodes the same greedy tokens; llmlab's later rounds run in the process the first
    one used, on its heap, so only the first round's peak is a fresh process's, as each llama.cpp round is)."""
    def med(key):
        vals = [getattr(s, key) for s in sides]
        return None if any(v is None for v in vals) else float(np.median(vals))
    return Side(med("prefill_tokens_per_s"), med("decode_tokens_per_s"), sides[0].peak_rss_mb,
                sides[0].load_s, sides[0].ids, med("decode_short_tokens_per_s"))


def side_json(s: Side) -> dict:
    """A round's figures for bench's JSON (the tokens left out: the top level compares them)."""
    return {k: v for k, v in asdict(s).items() if k != "ids"}


def round_ratios(rounds: list[dict]) -> dict:
    """Per speed, the median over rounds of llmlab's figure over llama.cpp's in the same round (None where a
    round has no figure): a ratio of two runs close in time drifts less than a ratio of two medians."""
    out = {}
    for key in ("prefill_tokens_per_s", "decode_tokens_per_s", "decode_short_tokens_per_s"):
        vals = [getattr(g["llmlab"], key) / getattr(g["llama.cpp"], key) for g in rounds
                if getattr(g["llmlab"], key) and getattr(g["llama.cpp"], key)]
        out[key] = float(np.median(vals)) if vals and len(vals) == len(rounds) else None
    return out


def run_llmlab(path, ids: list[int], n_gen: int, threads: int, cpu=None, kernels: str = "fast",
               short: int = 0) -> Side:
    """Prefill ``ids``, then decode ``n_gen`` greedy tokens; with ``short``, decode ``n_gen`` tokens again
    from the first ``short`` prompt tokens (an almost empty KV cache: attention costs little there)."""
    from .generate import greedy
    from .ggml.cpu.fast import set_threads
    from .llama import Batch, Context, Model
    set_threads(threads)
    t0 = time.perf_counter()
    model = Model(path, cpu=cpu)
    load = time.perf_counter() - t0
    ctx = Context(model, n_ctx=len(ids) + n_gen + 1, n_batch=len(ids), n_ubatch=512, kernels=kernels, cpu=cpu)
    ctx.decode(Batch.from_tokens(ids, logits="last"))               # warm-up with the same shapes, as
    ctx.decode(Batch.from_tokens(ids[:1], pos0=len(ids), logits="last"))    # llama-bench does: every
    ctx.clear()                                                     # kernel compiled (or loaded) once
    steps = greedy(ctx, ids)                                        # the engine's loop, argmax each step
    t0 = time.perf_counter()
    step = next(steps)
    t_pp = time.perf_counter() - t0
    out: list[int] = []
    t0 = time.perf_counter()
    for _ in range(n_gen):
        out.append(step.token)
        step = next(steps)
    t_tg = time.perf_counter() - t0
    tg_short = None
    if short and n_gen:
        steps.close()
        ctx.clear()
        steps = greedy(ctx, ids[:short])
        step = next(steps)
        t0 = time.perf_counter()
        for _ in range(n_gen):
            step = next(steps)
        tg_short = n_gen / (time.perf_counter() - t0)
    return Side(len(ids) / t_pp, n_gen / t_tg if n_gen else 0.0, peak_rss_mb(), load, out, tg_short)


def run_llama_cpp(path, ids: list[int], n_gen: int, threads: int, short: int = 0) -> Side:
    """The same run in llama.cpp, set up as llama-cpp-python's ``Llama(n_ctx=len(ids) + n_gen + 1,
    n_batch=512, n_threads=threads)``, in a llama.cpp worker of its own (its peak memory is llama.cpp's)."""
    from .llamacpp.worker import isolated_once
    return Side(**isolated_once(_llama_cpp_side, str(path), [int(i) for i in ids], int(n_gen), int(threads),
                                int(short)))


def _llama_cpp_side(path: str, ids: list[int], n_gen: int, threads: int, short: int = 0) -> dict:
    """:func:`run_llama_cpp`, in the worker."""
    from .llamacpp.session import Session
    n_ctx = len(ids) + n_gen + 1
    n_batch = min(n_ctx, 512)
    t0 = time.perf_counter()
    s = Session(path, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_batch, n_threads=threads, flash_attn=False,
                no_perf=False)
    load = time.perf_counter() - t0

    def decode(tokens, pos0):
        for i in range(0, len(tokens), n_batch):             # Llama.eval: n_batch tokens per llama_decode
            if s.decode(tokens[i:i + n_batch], pos0=pos0 + i, logits="last") != 0:
                raise LLMLabError(f"llama_decode failed: {s.log(300)}")

    with s:
        decode(ids, 0)                                        # warm-up with the same shapes
        s.seq_rm(-1, -1, -1)
        t0 = time.perf_counter()
        decode(ids, 0)
        t_pp = time.perf_counter() - t0
        out: list[int] = []
        t0 = time.perf_counter()
        for i in range(n_gen):
            tok = int(np.argmax(s.logits([-1])[0]))
            out.append(tok)
            decode([tok], len(ids) + i)
        t_tg = time.perf_counter() - t0
        tg_short = None
        if short and n_gen:
            s.seq_rm(-1, -1, -1)
            decode(ids[:short], 0)
            t0 = time.perf_counter()
            for i in range(n_gen):
                decode([int(np.argmax(s.logits([-1])[0]))], short + i)
            tg_short = n_gen / (time.perf_counter() - t0)
    return {"prefill_tokens_per_s": len(ids) / t_pp, "decode_tokens_per_s": n_gen / t_tg if n_gen else 0.0,
            "peak_rss_mb": peak_rss_mb(), "load_s": load, "ids": out, "decode_short_tokens_per_s": tg_short}


def plot_speeds(sides: dict, title: str = "", ax=None):
    """Grouped bars of prompt (pp) and decode (tg) tokens per second for each engine in ``sides``
    (name -> :class:`Side`), on a log scale, each bar labelled with its value."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(7.5, 3.4))
    names = list(sides)
    x = np.arange(len(names))
    for k, (attr, label, color) in enumerate((("prefill_tokens_per_s", "prompt (pp)", "#4c72b0"),
                                               ("decode_tokens_per_s", "decode (tg)", "#dd8452"))):
        vals = [getattr(sides[n], attr) for n in names]
        bars = ax.bar(x + (k - 0.5) * 0.38, vals, 0.38, label=label, color=color)
        for b, v in zip(bars, vals):
            ax.annotate(f"{v:.3g}", (b.get_x() + b.get_width() / 2, v), ha="center", va="bottom", fontsize=9)
    ax.set_yscale("log")
    ax.set_xticks(x, names)
    ax.set_ylabel("tokens / s (log scale)")
    ax.set_title(title or "tokens per second")
    ax.legend(loc="upper left", fontsize=9)
    ax.margins(y=0.2)
    return ax


def threading_layer() -> str:
    """The threading layer numba's parallel kernels ran on in this process ("" if none ran yet)."""
    import numba
    try:
        return numba.threading_layer()
    except ValueError:
        return ""


def threading_pool() -> bool:
    """Whether llmlab's spinning pool served threaded regions in this process (workqueue's, see threadpool)."""
    from .ggml.cpu import threadpool
    return threadpool.pooled_regions() > 0


def cpu_model() -> str:
    """The CPU's name as the OS gives it (speed ratios differ by vendor: say which CPU a figure comes from)."""
    import platform
    from .ggml.cpu import profiles
    return profiles.cpu_features().model or platform.processor() or platform.machine()


@contextmanager
def busy(n: int):
    """``n`` processes that keep a core busy each, for as long as the block runs: a learner's laptop is
    never quiet (a browser, a second notebook). Both engines are measured beside the same load."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        time.sleep(0.2 if n else 0)
        yield
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def first_token_s(model: str, threads: int, cold: bool = False) -> float:
    """Seconds from starting ``python -m llmlab generate -n 1`` to its exit: interpreter, imports, load,
    kernels (from numba's cache, or compiled from scratch with ``cold``), prefill and one token."""
    import tempfile
    env = dict(os.environ)
    with tempfile.TemporaryDirectory() as tmp:
        if cold:
            env["NUMBA_CACHE_DIR"] = tmp
        t0 = time.perf_counter()
        res = subprocess.run([sys.executable, "-m", "llmlab", "generate", "-m", model, "-p", "Hello", "-n", "1",
                              "-t", str(threads), "--no-timings"], capture_output=True, text=True, env=env)
        dt = time.perf_counter() - t0
    if res.returncode != 0:
        raise RuntimeError(f"first-token run failed: {(res.stderr.strip().splitlines() or ['?'])[-1]}")
    return dt


@dataclass
class BenchResult:
    model: str
    threads: int
    cpu: str
    kernels: str
    cpu_model: str
    load: int                   # busy processes beside both engines while they were measured
    prompt_tokens: int
    gen_tokens: int
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    decode_gb_per_s: float
    weight_mb: float
    peak_rss_mb: float
    first_token_s: float | None = None
    first_token_cold_s: float | None = None
    llama_cpp: dict | None = None
    decode_ratio: float | None = None
    prefill_ratio: float | None = None
    rss_ratio: float | None = None
    same_tokens: int | None = None
    decode_short_tokens_per_s: float | None = None      # from a SHORT_PROMPT-token prompt (llama-bench's tg)
    decode_short_ratio: float | None = None
    threading: str = ""         # numba's threading layer the fast kernels ran on ("" before any parallel kernel ran)
    threading_pool: bool = False    # llmlab's spinning pool served the layer's threaded regions (under workqueue)
    repeat: int = 1             # rounds measured (engines' order alternating); the figures above are medians
    rounds: list = field(default_factory=list)      # each round's figures per engine

    def to_json(self) -> dict:
        return asdict(self)
