"""Text generation, llama.cpp's main loop (``examples/simple/simple.cpp``, ``tools/completion``):
decode the prompt in one batch, then repeat: sample a token from the last logits, turn it into
text, feed it back as the next one-token batch (its K and V join the cache), until an
end-of-generation token, the token budget or a stop string.

``generate`` is an iterator of ``(token id, text)``; the text is what became printable with that
token (UTF-8 safe: a token ending inside a character prints nothing until the character is
whole; text that may be the start of a stop string is held back too). A :class:`Generation`
record keeps the ids, the text, why it stopped, where the cache ends and llama.cpp's timings.

The loop itself is :func:`decode_loop` (decode a batch, hand back its logits, take the next token); ``generate``
samples and stops around it, and :func:`greedy` takes the argmax each step for whoever needs the steps
themselves (``bench``, the RPC lab of notebook 06, :func:`prefill_decode_run` of notebook 04, notebook 03).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Generator, Iterator, Sequence

import numpy as np

from . import LLMLabError
from .llama.batch import Batch
from .llama.validate import check_finite
from .llama.sampling import Greedy, SamplerChain
from .llama.vocab.stream import StreamDecoder


@dataclass
class Timings:
    """llama.cpp's perf counters: prompt eval (one batch), eval (one token per run), sampling,
    and the time to the first token (prompt eval + its sampling)."""
    n_prompt: int = 0
    t_prompt: float = 0.0
    n_eval: int = 0
    t_eval: float = 0.0
    n_sample: int = 0
    t_sample: float = 0.0
    t_first: float = 0.0

    @property
    def prompt_tokens_per_s(self) -> float:
        return self.n_prompt / self.t_prompt if self.t_prompt else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        return self.n_eval / self.t_eval if self.t_eval else 0.0

    def summary(self) -> str:
        return (f"prompt eval: {self.n_prompt} tokens in {self.t_prompt:.2f} s ({self.prompt_tokens_per_s:.2f} tok/s); "
                f"eval: {self.n_eval} runs in {self.t_eval:.2f} s ({self.decode_tokens_per_s:.2f} tok/s); "
                f"sampling: {self.n_sample} in {self.t_sample * 1e3:.0f} ms; first token after {self.t_first:.2f} s")


@dataclass
class Generation:
    """What one ``generate`` call did. ``ids`` excludes the end-of-generation token (``eog``);
    ``pending`` are sampled tokens whose K/V are not in the cache yet (the last one: nobody
    needed its logits); ``n_past`` is the next free position."""
    prompt_ids: list[int] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    text: str = ""
    stop_reason: str = ""       # "eog", "length", "stop" (a stop string), "" while running or interrupted
    eog: int | None = None
    pending: list[int] = field(default_factory=list)
    n_cached: int = 0           # positions the cache held before the prompt
    n_past: int = 0
    n_decoded: int = 0          # tokens this call ran through decode
    timings: Timings = field(default_factory=Timings)


def _split_stop(text: str, stops: Sequence[str]) -> tuple[str, str, bool]:
    """(text to print, text to hold back, a stop string was hit). Held back: the longest tail
    that could still grow into a stop string."""
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    if hits:
        return text[:min(hits)], "", True
    hold = max((k for s in stops for k in range(min(len(s) - 1, len(text)), 0, -1) if text.endswith(s[:k])),
               default=0)
    return text[:len(text) - hold], text[len(text) - hold:], False


def _servers(ctx) -> list[str]:
    """The rpc-servers computing part of ``ctx``'s graph (their endpoints), to name them when logits go bad."""
    sched = getattr(ctx, "sched", None)
    return sorted({b.endpoint for b in getattr(sched, "backends", ()) if hasattr(b, "endpoint")})


RECHECK_S = 1e-3     # a caller that took longer than this over a token: the model file is checked again first


def _decode(ctx, tokens: list[int], pos0: int, checked: bool = False) -> np.ndarray:
    """One batch at ``pos0``; if it is interrupted, the cache forgets the batch's positions.
    Non-finite logits are an error (a file whose weights lie), never a token. The model file is checked
    after the decode, and before it unless ``checked`` (the loop's previous decode checked it after itself
    less than ``RECHECK_S`` ago: only the sampling of one token lay between)."""
    gguf = getattr(getattr(ctx, "model", None), "gguf", None)
    try:
        if gguf is not None and not checked:    # the model file cut short or rewritten under the mapping:
            gguf.check_unchanged()              # an error, not SIGBUS
        logits = ctx.decode(Batch.from_tokens(tokens, pos0=pos0, logits="last"))[-1]
        if gguf is not None:
            gguf.check_unchanged()
        check_finite(logits, servers=_servers(ctx))
        return logits
    except BaseException:
        ctx.kv.seq_rm(-1, pos0, None)
        raise


@dataclass
class Step:
    """One decode of the loop: the batch it ran (``tokens`` at positions ``pos0``, ``pos0 + 1``, ...), the
    logits of its last position, the seconds the decode took, and the token taken from the logits (set by
    whoever samples: :func:`greedy`, :func:`generate`)."""
    tokens: list[int]
    pos0: int
    logits: np.ndarray
    decode_s: float
    token: int | None = None


def decode_loop(ctx, prompt: Sequence[int], n_past: int = 0) -> Generator[Step, int, None]:
    """llama.cpp's loop without its sampler: decode ``prompt`` at ``n_past, n_past + 1, ...`` and yield the
    :class:`Step`; ``send`` it the next token, which is decoded as the next one-token batch, at the next
    position, and so on. The caller samples, and stops when it wants (``generate``: at an end-of-generation
    token, the budget, a stop string). Every decode checks its model file and its logits (``_decode``)."""
    batch, pos, t_end = [int(t) for t in prompt], n_past, None
    while True:
        t0 = time.perf_counter()
        logits = _decode(ctx, batch, pos, checked=t_end is not None and t0 - t_end < RECHECK_S)
        t_end = time.perf_counter()
        token = yield Step(batch, pos, logits, t_end - t0)
        pos += len(batch)
        batch = [int(token)]


def greedy(ctx, prompt: Sequence[int], n_past: int = 0) -> Iterator[Step]:
    """:func:`decode_loop` taking the first of the largest logits each step (``np.argmax``, as llama.cpp's
    greedy sampler), with no end: the caller takes as many steps as it needs. Step k's ``token`` is the
    k-th token generated; computing step k + 1 decodes it."""
    loop = decode_loop(ctx, prompt, n_past)
    step = next(loop)
    while True:
        step.token = int(np.argmax(step.logits))
        yield step
        step = loop.send(step.token)


def generate(ctx, tokenizer, prompt: Sequence[int], n_predict: int = -1,
             sampler: Callable[[np.ndarray], int] | None = None, stop: Sequence[str] = (), n_past: int = 0,
             result: Generation | None = None, accept_prompt: bool = True) -> Iterator[tuple[int, str]]:
    """Yield ``(token, text)`` per generated token; an end-of-generation token (``tokenizer.vocab.eog``)
    comes last, with any text still held back, and ends the loop.

    ``prompt`` is decoded at positions ``n_past, n_past + 1, ...`` (the cache must hold exactly the
    positions before; a chat passes only the new turn). ``n_predict < 0`` runs until the context is
    full. ``sampler`` is a :class:`SamplerChain` or any ``logits -> id`` callable (default: greedy);
    a chain first sees the prompt tokens (``accept_prompt``), as llama.cpp's tools do for penalties.
    ``result`` is filled as the loop runs."""
    prompt = [int(t) for t in prompt]
    if not prompt:
        raise LLMLabError("the prompt is empty: generation needs at least one token")
    room = ctx.n_ctx - n_past - len(prompt)
    if room < 0:
        raise LLMLabError(f"the prompt ({len(prompt)} tokens after {n_past} cached) does not fit the context "
                          f"(n_ctx = {ctx.n_ctx})")
    budget = room + 1 if n_predict < 0 else n_predict   # the last token is sampled, never decoded
    if budget > room + 1:
        raise LLMLabError(f"prompt ({len(prompt)} tokens after {n_past} cached) + {n_predict} new tokens "
                          f"need a context of {n_past + len(prompt) + n_predict - 1}, this one has n_ctx = {ctx.n_ctx}")
    sampler = sampler or SamplerChain([Greedy()])
    if accept_prompt and hasattr(sampler, "accept"):
        for t in prompt:
            sampler.accept(t)
    eog = tokenizer.vocab.eog
    r = result if result is not None else Generation()
    r.prompt_ids, r.n_cached, r.n_past, t = prompt, n_past, n_past, r.timings
    stream, held = StreamDecoder(tokenizer), ""

    t0 = time.perf_counter()
    loop = decode_loop(ctx, prompt, n_past)
    step = next(loop)
    t.n_prompt, t.t_prompt = len(prompt), step.decode_s
    r.n_past += len(prompt)
    r.n_decoded += len(prompt)
    for i in range(budget):
        t1 = time.perf_counter()
        token = step.token = int(sampler(step.logits))
        t.n_sample, t.t_sample = t.n_sample + 1, t.t_sample + time.perf_counter() - t1
        if i == 0:
            t.t_first = time.perf_counter() - t0
        if token in eog:
            r.eog, r.pending, r.stop_reason = token, [token], "eog"
            tail = held + stream.flush()
            r.text += tail
            yield token, tail
            return
        r.ids.append(token)
        r.pending = [token]
        text, held, hit = _split_stop(held + stream.push(token), stop)
        if i == budget - 1 and not hit:   # the last one: nothing more will come
            text, held = text + held + stream.flush(), ""
        r.text += text
        yield token, text
        if hit:
            r.stop_reason = "stop"
            return
        if i == budget - 1:
            break
        step = loop.send(token)
        t.n_eval, t.t_eval = t.n_eval + 1, t.t_eval + step.decode_s
        r.n_past += 1
        r.n_decoded += 1
        r.pending = []
    r.stop_reason = "length"


def prefill_decode_run(model_path, prompt: Sequence[int], n_decode: int = 8, n_ctx: int = 512) -> dict:
    """Prefill ``prompt`` with llmlab in one batch, then decode ``n_decode`` greedy tokens one at a time
    (notebook 04: what the KV cache saves).

    One untimed run with the same shapes comes first (kernels loaded). Returns the times (``prefill_s``,
    ``decode_s`` per step), the generated ids, the last step's logits
    (``last_logits``, computed from the cache), those of a fresh one-batch run over the whole sequence
    (``fresh_logits``, recomputing every K and V), and ``max_abs_diff`` between the two.
    """
    from .llama import Context, Model
    model = Model(model_path)
    prompt = [int(t) for t in prompt]
    warm = Context(model, n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx)     # the same shapes once, untimed:
    warm.decode(Batch.from_tokens(prompt, logits="last"))                  # kernels loaded (or compiled) first,
    warm.decode(Batch.from_tokens(prompt[:1], pos0=len(prompt), logits="last"))   # as llama-bench warms up
    del warm
    steps = greedy(Context(model, n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx), prompt)
    step = next(steps)
    prefill_s, out, decode_s = step.decode_s, [], []
    for _ in range(n_decode):
        out.append(step.token)
        step = next(steps)
        decode_s.append(step.decode_s)
    fresh = Context(model, n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx)
    full = fresh.decode(Batch.from_tokens(prompt + out, logits="last"))
    return dict(n_prompt=len(prompt), prefill_s=prefill_s, decode_s=decode_s, generated=out,
                last_logits=step.logits, fresh_logits=full[-1],
                max_abs_diff=float(np.abs(full[-1] - step.logits).max()), logits_scale=float(np.abs(full[-1]).max()))


class ChatSession:
    """A conversation on one context. The KV cache keeps every turn: a new turn renders the whole
    conversation with the chat template, keeps the longest run of cached tokens whose text the
    rendering starts with, drops the rest from the cache (``seq_rm``) and decodes only what
    follows, at the positions after it. Usually that is the new turn alone (plus the reply's
    end-of-turn token, sampled but never decoded); a template that rewrites its past, or a reply
    it would format differently (Gemma trims spaces), costs a few tokens more, never a wrong cache."""

    def __init__(self, ctx, tokenizer, template, sampler=None, system: str | None = None):
        self.ctx, self.tokenizer, self.template, self.sampler = ctx, tokenizer, template, sampler
        self.system = system
        self.clear()

    def clear(self) -> None:
        """Forget the conversation, empty the cache and reset the sampler (its penalties and seed)."""
        if hasattr(self.sampler, "reset"):
            self.sampler.reset()
        self.messages: list[dict] = [{"role": "system", "content": self.system}] if self.system else []
        self.cached: list[int] = []      # tokens in the cache, at positions 0, 1, ...
        self.pending: list[int] = []     # sampled, not decoded (the last token of the last reply)
        self.last: Generation | None = None
        self.ctx.kv.seq_rm(-1, 0, None)

    def _reuse(self, text: str) -> tuple[int, list[int]]:
        """(tokens of cached + pending to keep, the tokens to decode after them) for the prompt text."""
        tok = self.tokenizer
        bos = tok.vocab.bos if tok.vocab.add_bos else None
        full = (tok.token_to_piece(bos, special=True) if bos is not None else b"") + text.encode("utf-8")
        have, k, offsets = self.cached + self.pending, 0, [0]
        while k < len(have):
            piece = tok.token_to_piece(have[k], special=True)
            if not full.startswith(piece, offsets[-1]):
                break
            offsets.append(offsets[-1] + len(piece))
            k += 1
        while k > 0:
            if offsets[k] < len(full):   # at least one token left to decode, cut on a character boundary
                try:
                    return k, tok.tokenize(full[offsets[k]:].decode("utf-8"), add_bos=False, special=True)
                except UnicodeDecodeError:
                    pass
            k -= 1
        return 0, tok.tokenize(text, add_bos=True, special=True)

    def send(self, user: str, n_predict: int = -1, stop=()) -> Iterator[tuple[int, str]]:
        """Add a user message and stream the reply as ``generate`` does; the reply joins the
        conversation even when the loop is stopped early (Ctrl-C, ``close()``)."""
        from .llama.validate import check_text_fits
        messages = self.messages + [{"role": "user", "content": user}]
        check_text_fits(self.tokenizer, user, self.ctx.n_ctx, "the message")       # before any work on it
        text = self.template.apply(messages, add_generation_prompt=True)
        check_text_fits(self.tokenizer, text, self.ctx.n_ctx, "the conversation")  # it all lives in the context
        keep, new = self._reuse(text)
        have = self.cached + self.pending
        n_cached = min(keep, len(self.cached))
        if n_cached < len(self.cached):
            self.ctx.kv.seq_rm(-1, n_cached, None)
        prompt = have[n_cached:keep] + new          # matching pending tokens are decoded now
        self.cached, self.pending = have[:n_cached], have[n_cached:keep]
        self.last = gen = Generation()
        try:
            yield from generate(self.ctx, self.tokenizer, prompt, n_predict, self.sampler, stop,
                                n_past=n_cached, result=gen)
        finally:
            if gen.prompt_ids:                      # it ran (maybe not to the end): the turn counts
                self.cached = (self.cached + prompt + gen.ids)[:gen.n_past]
                self.pending = gen.pending
                self.messages = messages + [{"role": "assistant", "content": gen.text}]
