"""Text generation, llama.cpp's main loop: prefill the prompt in one batch, then decode one
token at a time, each new token's K and V appended to the cache, until an end-of-generation
token or the token budget.

The sampler is any callable ``logits -> token id``; greedy (argmax, llama.cpp's
``llama_sampler_init_greedy``) is the default. Sampling chains plug in here.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np

from .llama.batch import Batch


def greedy(logits: np.ndarray) -> int:
    """The highest logit; ties go to the lowest id, as argmax does in llama.cpp."""
    return int(np.argmax(logits))


@dataclass
class Timings:
    """What llama.cpp's perf print reports: prompt and generation time and token counts."""
    n_prompt: int = 0
    t_prompt: float = 0.0
    n_gen: int = 0
    t_gen: float = 0.0
    tokens: list[int] = field(default_factory=list)

    def summary(self) -> str:
        pp = self.n_prompt / self.t_prompt if self.t_prompt else 0.0
        tg = self.n_gen / self.t_gen if self.t_gen else 0.0
        return (f"prompt: {self.n_prompt} tokens in {self.t_prompt:.2f} s ({pp:.1f} tok/s); "
                f"generation: {self.n_gen} tokens in {self.t_gen:.2f} s ({tg:.2f} tok/s)")


def generate(ctx, prompt: list[int], n_predict: int, sampler: Callable[[np.ndarray], int] = greedy,
             stop: frozenset[int] | set[int] = frozenset(), timings: Timings | None = None) -> Iterator[int]:
    """Yield generated token ids (a stop token ends the loop and is not yielded)."""
    if not prompt:
        raise ValueError("the prompt is empty: generation needs at least one token")
    if n_predict < 0:
        raise ValueError("n_predict must be >= 0")
    need = len(prompt) + n_predict
    if need > ctx.n_ctx:
        raise ValueError(f"prompt ({len(prompt)} tokens) + {n_predict} new tokens need a context of {need}, "
                         f"this one has n_ctx = {ctx.n_ctx}")
    t = timings or Timings()
    t0 = time.perf_counter()
    logits = ctx.decode(Batch.from_tokens(prompt, logits="last"))[-1]
    t.n_prompt, t.t_prompt = len(prompt), time.perf_counter() - t0
    pos = len(prompt)
    for _ in range(n_predict):
        t0 = time.perf_counter()
        token = sampler(logits)
        if token in stop:
            break
        t.tokens.append(token)
        yield token
        logits = ctx.decode(Batch.from_tokens([token], pos0=pos, logits="last"))[-1]
        pos += 1
        t.n_gen += 1
        t.t_gen += time.perf_counter() - t0
