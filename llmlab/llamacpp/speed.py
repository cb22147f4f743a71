"""llama.cpp's own speed, as llmlab's ``bench`` compares it: one prompt in batches, then greedy steps of one
token, timed inside a fresh llama.cpp worker (so that its peak memory is llama.cpp's alone)."""
from __future__ import annotations

import time

import numpy as np

from .. import LLMLabError
from .session import Session
from .worker import isolated_once


def measure(path, ids: list[int], n_gen: int, threads: int) -> dict:
    """Prefill and decode tokens per second, peak memory (MB), load time (s) and the greedy ids of llama.cpp,
    set up as llama-cpp-python's ``Llama(n_ctx=len(ids) + n_gen + 1, n_batch=512, n_threads=threads)``."""
    return isolated_once(measure_here, str(path), [int(i) for i in ids], int(n_gen), int(threads))


def measure_here(path: str, ids: list[int], n_gen: int, threads: int) -> dict:
    from ..bench import peak_rss_mb
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
    return {"prefill_tokens_per_s": len(ids) / t_pp, "decode_tokens_per_s": n_gen / t_tg if n_gen else 0.0,
            "peak_rss_mb": peak_rss_mb(), "load_s": load, "ids": out}
