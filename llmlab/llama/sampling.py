"""Sampling: from one row of logits to one token, as llama.cpp's ``src/llama-sampler.cpp`` does it.

A sampler works on the candidates, a :class:`TokenDataArray` (``llama_token_data_array``: ids,
logits, probabilities, a "sorted" flag and the selected index). Filters (top-k, typical, top-p,
min-p) shrink it, transforms (penalties, temperature) change logits, and a selector (greedy,
dist) sets ``selected``. A :class:`SamplerChain` (``llama_sampler_chain``) runs samplers in
order; :func:`common_sampler_init` builds the chain llama.cpp's tools use from
:class:`SamplingParams` (``common_params_sampling``), with its defaults and order:
penalties → top-k → typical → top-p → min-p → temperature → dist.

Each sampler does llama.cpp's arithmetic in its order and precision (float32 logits,
sequential float32 sums, a float64 running sum in ``dist``), and :class:`Dist` draws from the
same generator: ``std::mt19937`` seeded with the seed, one ``std::uniform_real_distribution<double>``
value (two 32-bit words, as libstdc++'s ``generate_canonical`` takes them) per token. So
**seeded sampling follows llama.cpp's RNG stream**: for the same seed and logits, the candidates
(ids, logits, order) are llama.cpp's exactly and the chosen tokens are the same; the
probabilities agree to 2 float32 ulps, because glibc's ``expf`` is not always correctly rounded
and numpy's exp differs from it in the last bit now and then (a draw would have to land within
that distance of a boundary, about 1e-7 per token, to pick another token).
``tests/test_sampling.py`` checks all of it against llama.cpp's own samplers. Two liberties:
equal logits keep their order here (llama.cpp's ``std::partial_sort`` leaves it unspecified),
and ``typical`` takes 0·log 0 as 0 where llama.cpp's float math gives NaN.
"""
from __future__ import annotations

import inspect
import math
import secrets
from collections import Counter, deque
from dataclasses import dataclass, fields

import numpy as np

from .. import LLMLabError

LLAMA_DEFAULT_SEED = 0xFFFFFFFF   # "no seed": a fresh random one, as llama.cpp's get_rng_seed does
F32 = np.float32


def _expf(x: np.ndarray) -> np.ndarray:
    """float32 exp rounded from float64, which is what glibc's expf returns."""
    return np.exp(x.astype(np.float64)).astype(F32)


def _logf(x) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.log(np.asarray(x, np.float64)).astype(F32)


def _first(mask: np.ndarray, default: int) -> int:
    """Index of the first True, or ``default``."""
    return int(np.argmax(mask)) if mask.any() else default


class TokenDataArray:
    """``llama_token_data_array``: the candidates in their current order, ``sorted`` when that order
    is by logit, descending (samplers use it to skip work), and the index ``selected``."""

    def __init__(self, ids, logits, p=None, sorted: bool = False, selected: int = -1):
        self.id = np.asarray(ids, np.int32)
        self.logit = np.asarray(logits, F32)
        self.p = np.zeros(len(self.id), F32) if p is None else np.asarray(p, F32)
        self.sorted, self.selected = sorted, selected

    @classmethod
    def from_logits(cls, logits) -> "TokenDataArray":
        """Every token of the vocabulary, in id order (what ``llama_sampler_sample`` starts from)."""
        logits = np.array(logits, F32).reshape(-1)
        return cls(np.arange(len(logits), dtype=np.int32), logits)

    def __len__(self) -> int:
        return len(self.id)

    def __repr__(self) -> str:
        head = ", ".join(f"{i}:{x:.2f}" for i, x in zip(self.id[:5], self.logit[:5]))
        return (f"TokenDataArray({len(self)} candidates, sorted={self.sorted}, selected={self.selected}: "
                f"{head}{', ...' if len(self) > 5 else ''})")

    def copy(self) -> "TokenDataArray":
        return TokenDataArray(self.id.copy(), self.logit.copy(), self.p.copy(), self.sorted, self.selected)

    def keep(self, idx, sorted: bool) -> None:
        """Keep the candidates at ``idx`` (indices or a slice), in that order."""
        self.id, self.logit, self.p = self.id[idx], self.logit[idx], self.p[idx]
        self.sorted = sorted

    def sort(self) -> None:
        self.keep(np.argsort(-self.logit, kind="stable"), True)

    def softmax(self, do_sort: bool) -> None:
        """``llama_sampler_softmax_impl``: ``p`` from the logits, summed in the current order."""
        if do_sort and not self.sorted:
            self.sort()
        p = _expf(self.logit - (self.logit[0] if self.sorted else self.logit.max()))
        self.p = p / np.cumsum(p)[-1]

    def probs(self) -> np.ndarray:
        """The distribution these candidates stand for (float64, for plots), leaving ``p`` alone."""
        z = np.exp(self.logit.astype(np.float64) - self.logit.max())
        return z / z.sum()

    @property
    def token(self) -> int:
        """The selected token's id."""
        return int(self.id[self.selected])


class Sampler:
    """One stage of a chain (``llama_sampler_i``): ``apply`` changes the candidates in place,
    ``accept`` sees each token that was chosen, ``reset`` forgets. Calling a sampler on an array
    returns a changed copy, which is how the notebook shows one stage's effect."""
    name = "?"

    def apply(self, cur: TokenDataArray) -> None:
        raise NotImplementedError

    def accept(self, token: int) -> None:
        pass

    def reset(self) -> None:
        pass

    def __call__(self, cur: TokenDataArray) -> TokenDataArray:
        out = cur.copy()
        self.apply(out)
        return out

    def __repr__(self) -> str:
        names = [n for n in inspect.signature(type(self)).parameters if hasattr(self, n)]
        show = lambda v: f"{float(v):g}" if isinstance(v, (float, np.floating)) else repr(v)   # noqa: E731
        return f"{type(self).__name__}({', '.join(f'{n}={show(getattr(self, n))}' for n in names)})"


class Greedy(Sampler):
    """``llama_sampler_init_greedy``: the highest logit (the first one among equals)."""
    name = "greedy"

    def apply(self, cur):
        cur.selected = int(np.argmax(cur.logit))


class MT19937:
    """``std::mt19937(seed)`` (the standard's init_genrand seeding), drawing as libstdc++'s
    ``std::uniform_real_distribution<double>(0, 1)``: two words ``a, b`` give ``(a + b·2³²) / 2⁶⁴``."""

    def __init__(self, seed: int):
        key = [seed & 0xFFFFFFFF]
        for i in range(1, 624):
            key.append((1812433253 * (key[-1] ^ (key[-1] >> 30)) + i) & 0xFFFFFFFF)
        self._bits = np.random.MT19937(0)
        self._bits.state = {"bit_generator": "MT19937", "state": {"key": np.array(key, np.uint32), "pos": 624}}

    def next_u32(self) -> int:
        return int(self._bits.random_raw())

    def uniform(self) -> float:
        a, b = (float(x) for x in self._bits.random_raw(2))
        r = (a + b * 4294967296.0) / 18446744073709551616.0
        return r if r < 1.0 else math.nextafter(1.0, 0.0)


class Dist(Sampler):
    """``llama_sampler_init_dist``: draw one token from the softmax of the candidates.

    One uniform draw ``r`` per call; the token is the first whose running sum of ``exp(logit - max)``
    (float64) reaches ``r`` times the total, in the candidates' current order."""
    name = "dist"

    def __init__(self, seed: int = LLAMA_DEFAULT_SEED):
        self.seed = int(seed)
        self.reset()

    def reset(self):
        self.seed_cur = secrets.randbits(32) if self.seed == LLAMA_DEFAULT_SEED else self.seed & 0xFFFFFFFF
        self._rng = MT19937(self.seed_cur)

    def apply(self, cur):
        if not len(cur):
            cur.selected = -1
            return
        if len(cur) == 1:
            self._rng.uniform()   # one draw per token, always: the stream stays aligned
            cur.selected, cur.p = 0, np.ones(1, F32)
            return
        p = _expf(cur.logit - (cur.logit[0] if cur.sorted else cur.logit.max()))
        run = np.cumsum(p, dtype=np.float64)
        target = run[-1] * self._rng.uniform()
        cur.selected = _first(run >= target, len(cur) - 1)
        cur.p = (p / run[-1]).astype(F32)


class TopK(Sampler):
    """``llama_sampler_init_top_k``: keep the ``k`` highest logits, sorted (``k <= 0``: off)."""
    name = "top-k"

    def __init__(self, k: int):
        self.k = int(k)

    def apply(self, cur):
        if self.k <= 0:
            return
        k = min(self.k, len(cur))
        if cur.sorted:
            cur.keep(slice(0, k), True)
        else:
            cur.keep(top_k_order(cur.logit, k), True)


def top_k_order(logit: np.ndarray, k: int) -> np.ndarray:
    """The indices of the ``k`` highest logits, highest first, equal logits in index order: the first
    ``k`` of a stable sort, found as llama.cpp finds them (a partial sort, not the whole vocabulary:
    Gemma's 262k logits took 30-100 ms to sort). The k-th largest value splits the candidates; of
    those equal to it, the first ones by index are kept, as the stable sort would keep them."""
    n = len(logit)
    if k >= n or np.isnan(logit).any():
        return np.argsort(-logit, kind="stable")[:k]
    v = np.partition(logit, n - k)[n - k]                     # the k-th largest
    above = np.flatnonzero(logit > v)
    idx = np.concatenate([above, np.flatnonzero(logit == v)[:k - len(above)]])
    idx.sort()
    return idx[np.argsort(-logit[idx], kind="stable")]


class TopP(Sampler):
    """``llama_sampler_init_top_p`` (nucleus): the fewest most likely tokens whose probabilities sum
    to ``p`` or more, at least ``min_keep`` (``p >= 1``: off)."""
    name = "top-p"

    def __init__(self, p: float, min_keep: int = 1):
        self.p, self.min_keep = F32(p), int(min_keep)

    def apply(self, cur):
        if self.p >= 1:
            return
        cur.softmax(do_sort=False)     # probabilities summed in the current order, then sorted
        if not cur.sorted:
            cur.sort()
        enough = (np.cumsum(cur.p) >= self.p) & (np.arange(1, len(cur) + 1) >= self.min_keep)
        cur.keep(slice(0, _first(enough, len(cur) - 1) + 1), True)


class MinP(Sampler):
    """``llama_sampler_init_min_p``: keep tokens at least ``p`` times as likely as the best one,
    i.e. ``logit >= max_logit + log p`` (``p <= 0``: off)."""
    name = "min-p"

    def __init__(self, p: float, min_keep: int = 1):
        self.p, self.min_keep = F32(p), int(min_keep)

    def apply(self, cur):
        if self.p <= 0 or not len(cur):
            return
        if not cur.sorted:             # unsorted: filter in place, order kept
            keep = np.flatnonzero(cur.logit >= cur.logit.max() + _logf(self.p))
            if len(keep) and len(keep) >= self.min_keep:
                cur.keep(keep, False)
                return
            cur.sort()
        below = (cur.logit[1:] < cur.logit[0] + _logf(self.p)) & (np.arange(1, len(cur)) >= self.min_keep)
        cur.keep(slice(0, 1 + _first(below, len(cur) - 1)), True)


class Typical(Sampler):
    """``llama_sampler_init_typical`` (locally typical sampling): rank tokens by how far their
    surprise ``-log p`` is from the entropy, keep the closest until their mass exceeds ``p``."""
    name = "typical"

    def __init__(self, p: float, min_keep: int = 1):
        self.p, self.min_keep = F32(p), int(min_keep)

    def apply(self, cur):
        if self.p >= 1:
            return
        cur.softmax(do_sort=True)
        logp = _logf(cur.p)
        with np.errstate(invalid="ignore"):
            terms = np.where(cur.p > 0, -cur.p * logp, F32(0))
        entropy = np.cumsum(terms)[-1]
        order = np.argsort(np.abs(-logp - entropy), kind="stable")
        i = np.arange(len(cur))
        enough = (np.cumsum(cur.p[order]) > self.p) & ((self.min_keep == 0) | (i >= self.min_keep - 1))
        cur.keep(order[:_first(enough, len(cur) - 1) + 1], False)


class Temp(Sampler):
    """``llama_sampler_init_temp``: divide the logits by ``temp``. ``temp <= 0`` keeps only the
    highest logit (the others become -inf), which makes any later selector greedy."""
    name = "temp"

    def __init__(self, temp: float):
        self.temp = F32(temp)

    def apply(self, cur):
        if not len(cur) or self.temp == 1:
            return
        if self.temp <= 0:
            best = int(np.argmax(cur.logit))
            keep = cur.logit[best]
            cur.logit = np.full(len(cur), -np.inf, F32)
            cur.logit[best] = keep
        else:
            cur.logit = cur.logit / self.temp


class Penalties(Sampler):
    """``llama_sampler_init_penalties``: push down tokens seen among the last ``last_n`` accepted.

    A seen token's logit is divided by ``repeat`` (multiplied, if it is <= 0, so the penalty
    always lowers it), then ``count·freq + present`` is subtracted (OpenAI's frequency and
    presence penalties). Off when ``last_n == 0`` or all three are neutral."""
    name = "penalties"

    def __init__(self, last_n: int = 64, repeat: float = 1.0, freq: float = 0.0, present: float = 0.0):
        self.last_n = max(int(last_n), 0)
        self.repeat, self.freq, self.present = F32(repeat), F32(freq), F32(present)
        self.reset()

    @property
    def disabled(self) -> bool:
        return self.last_n == 0 or (self.repeat == 1 and self.freq == 0 and self.present == 0)

    def reset(self):
        self._prev: deque[int] = deque()
        self.counts: Counter[int] = Counter()

    def accept(self, token):
        if self.last_n == 0:
            return
        if len(self._prev) >= self.last_n:
            old = self._prev.popleft()
            self.counts[old] -= 1
            if not self.counts[old]:
                del self.counts[old]
        self.counts[int(token)] += 1
        self._prev.append(int(token))

    def apply(self, cur):
        if self.disabled:
            return
        if self.counts:
            seen = np.fromiter(self.counts, np.int32, len(self.counts))
            n = np.fromiter(self.counts.values(), np.int32, len(self.counts))
            order = np.argsort(seen)
            at = np.clip(np.searchsorted(seen[order], cur.id), 0, len(seen) - 1)
            hit = np.flatnonzero(seen[order][at] == cur.id)
            c = n[order][at[hit]].astype(F32)
            x = cur.logit[hit]
            x = np.where(x <= 0, x * self.repeat, x / self.repeat)
            cur.logit[hit] = x - (c * self.freq + (c > 0).astype(F32) * self.present)
        cur.sorted = False


class SamplerChain(Sampler):
    """``llama_sampler_chain``: samplers applied in order; every one sees each accepted token."""
    name = "chain"

    def __init__(self, samplers=()):
        self.samplers: list[Sampler] = list(samplers)
        self.n_sample = 0

    def add(self, sampler: Sampler) -> "SamplerChain":
        self.samplers.append(sampler)
        return self

    def apply(self, cur):
        for s in self.samplers:
            s.apply(cur)

    def accept(self, token):
        for s in self.samplers:
            s.accept(token)
        self.n_sample += 1

    def reset(self):
        for s in self.samplers:
            s.reset()
        self.n_sample = 0

    def sample(self, logits) -> int:
        """``llama_sampler_sample``: all tokens as candidates, the chain, then accept the choice."""
        cur = TokenDataArray.from_logits(logits)
        self.apply(cur)
        if not 0 <= cur.selected < len(cur):
            raise LLMLabError("the sampler chain selected no token: it must end with a selector (dist or greedy)")
        token = cur.token
        self.accept(token)
        return token

    __call__ = sample

    def trace(self, logits) -> list[tuple[str, TokenDataArray]]:
        """The candidates at the start and after each sampler (copies), for plots. A ``dist``
        stage draws as ``sample`` would; nothing is accepted."""
        cur = TokenDataArray.from_logits(logits)
        steps = [("logits", cur.copy())]
        for s in self.samplers:
            s.apply(cur)
            steps.append((s.name, cur.copy()))
        return steps

    def __repr__(self) -> str:
        return " -> ".join(repr(s) for s in self.samplers) or "SamplerChain()"


# ---- common_params_sampling / common_sampler_init ---------------------------------------------------------

@dataclass
class SamplingParams:
    """``common_params_sampling``: names and defaults of llama.cpp's tools (``common/common.h``).

    ``samplers`` is the chain's order, named as llama.cpp's ``--samplers`` names them; a final
    ``dist`` is always added. ``temp <= 0`` is greedy, as in llama.cpp."""
    seed: int = LLAMA_DEFAULT_SEED
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    typ_p: float = 1.0
    temp: float = 0.8
    penalty_last_n: int = 64
    penalty_repeat: float = 1.0
    penalty_freq: float = 0.0
    penalty_present: float = 0.0
    min_keep: int = 0
    samplers: tuple[str, ...] = ("penalties", "top_k", "typ_p", "top_p", "min_p", "temperature")

    def __post_init__(self):
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, float) and not math.isfinite(v):
                raise LLMLabError(f"sampling: {f.name} must be a finite number, not {v}")
        if self.penalty_repeat <= 0:
            raise LLMLabError(f"sampling: penalty_repeat must be > 0, not {self.penalty_repeat}")
        if not 0 <= self.seed <= 0xFFFFFFFF:
            raise LLMLabError(f"sampling: the seed must be in 0..{0xFFFFFFFF}, not {self.seed}")
        unknown = [s for s in self.samplers if s not in _STAGES]
        if unknown:
            raise LLMLabError(f"sampling: unknown sampler {unknown[0]!r}; known: {', '.join(_STAGES)}")


_STAGES = {
    "penalties": lambda p: Penalties(p.penalty_last_n, p.penalty_repeat, p.penalty_freq, p.penalty_present),
    "top_k": lambda p: TopK(p.top_k),
    "typ_p": lambda p: Typical(p.typ_p, p.min_keep),
    "top_p": lambda p: TopP(p.top_p, p.min_keep),
    "min_p": lambda p: MinP(p.min_p, p.min_keep),
    "temperature": lambda p: Temp(p.temp),
}


def common_sampler_init(params: SamplingParams | None = None) -> SamplerChain:
    """The chain llama.cpp's tools build (``common_sampler_init``): ``params.samplers`` in order,
    then ``dist``."""
    params = params or SamplingParams()
    return SamplerChain([_STAGES[name](params) for name in params.samplers] + [Dist(params.seed)])
