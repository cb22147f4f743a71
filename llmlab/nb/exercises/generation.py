"""Checkers of notebook 08_full_generation: each runs the reader's function against llmlab's own and
says "correct", or the first case where they differ and how."""
from __future__ import annotations

import numpy as np

from .verdict import Verdict, call_learner


def _cases(seed: int = 0, n: int = 8, n_vocab: int = 64):
    rng = np.random.default_rng(seed)
    for i in range(n):
        logits = (rng.standard_normal(n_vocab) * (1 + i)).astype(np.float32)
        if i == 1:
            logits[:] = 0.0                                   # all tokens equally likely
        yield logits


def check_top_p(fn) -> Verdict:
    """``fn(logits, p) -> token ids kept``, most likely first: the fewest tokens whose probabilities
    reach ``p`` (llama.cpp's top-p with min_keep = 1)."""
    from ...llama.sampling import TokenDataArray, TopP
    for logits in _cases(1):
        for p in (0.1, 0.5, 0.9, 0.99):
            want = TopP(p)(TokenDataArray.from_logits(logits)).id.tolist()
            got, err = call_learner(fn, logits.copy(), p)
            if err is not None:
                return err
            got = [int(i) for i in got]
            if got != want:
                return Verdict.not_yet(f"for p={p} and logits starting {np.round(logits[:4], 2).tolist()}, top-p keeps "
                                       f"{len(want)} tokens {want[:6]}{'...' if len(want) > 6 else ''}, yours {len(got)}: "
                                       f"{got[:6]}{'...' if len(got) > 6 else ''}")
    return Verdict.correct()


def check_repeat_penalty(fn) -> Verdict:
    """``fn(logits, history, penalty, last_n) -> new logits``: llama.cpp's repeat penalty over the
    last ``last_n`` tokens of ``history`` (divide positive logits, multiply negative ones)."""
    from ...llama.sampling import Penalties, TokenDataArray
    rng = np.random.default_rng(2)
    for logits in _cases(2):
        history = rng.integers(0, len(logits), 20).tolist()
        for penalty, last_n in ((1.3, 64), (2.0, 5), (0.8, 10)):
            pen = Penalties(last_n, penalty)
            for t in history:
                pen.accept(t)
            want = pen(TokenDataArray.from_logits(logits)).logit
            got, err = call_learner(fn, logits.copy(), list(history), penalty, last_n)
            if err is not None:
                return err
            got = np.asarray(got, np.float32)
            if got.shape != want.shape:
                return Verdict.not_yet(f"expected {want.shape[0]} logits back, got shape {got.shape}")
            bad = np.flatnonzero(~np.isclose(got, want, rtol=1e-6, atol=1e-7))
            if len(bad):
                i = int(bad[0])
                seen = i in history[-last_n:]
                return Verdict.not_yet(f"penalty={penalty}, last_n={last_n}: token {i} (logit {logits[i]:.3f}, "
                                       f"{'in' if seen else 'not in'} the last {last_n}) should become {want[i]:.4f}, "
                                       f"yours is {got[i]:.4f}")
    return Verdict.correct()


def check_greedy_loop(fn, model, tokenizer, prompt: str = "The capital of France is", n: int = 4) -> Verdict:
    """``fn(ctx, prompt_ids, n) -> generated ids``: prefill, then greedy one token at a time (stop at
    an end-of-generation token), compared with ``llmlab.generate`` on a fresh context."""
    from ...generate import generate
    from ...llama import Context
    ids = tokenizer.tokenize(prompt, add_bos=True, special=True)
    want = [t for t, _ in generate(Context(model, n_ctx=len(ids) + n), tokenizer, ids, n)
            if t not in tokenizer.vocab.eog]
    got, err = call_learner(fn, Context(model, n_ctx=len(ids) + n), ids, n)
    if err is not None:
        return err
    got = [int(t) for t in got]
    if got != want:
        k = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        return Verdict.not_yet(f"greedy gives {want} ({tokenizer.detokenize(want)!r}), yours {got}; they part at step {k}")
    return Verdict.correct()
