"""Notebook 08, sampling: the candidates llama.cpp's chain keeps before its random draw.

With this slot plugged the run samples (llama.cpp's default chain, a fixed seed) instead of taking
the argmax. At every step the chain hands the learner's ``sample_filter`` the candidates (after
the penalties) with top-k, top-p, min-p and the temperature; what it returns (the ids kept, in
order, and their logits divided by the temperature) is what the seeded draw (``dist``) picks from.
"""
from __future__ import annotations

import numpy as np

from ..hooks import swap_attr
from ..probe import Where
from ..registry import BadOutput, Mistake, Slot, register_slot

F32 = np.float32


def _expf(x):
    return np.exp(np.asarray(x, np.float64)).astype(F32)       # the C library's expf, correctly rounded here


def _logf(x):
    return F32(np.log(np.float64(x)))


def sample_filter(ids, logits, top_k, top_p, min_p, temp):
    """llama.cpp's top-k, then top-p, then min-p, then the temperature.
    top-k: the k highest logits, highest first, equal ones in id order.
    top-p: softmax in that order (float32), keep the fewest whose cumulative sum reaches p.
    min-p: keep the ones with logit >= the first's + log(min_p) (at least one).
    temperature: divide the logits by it."""
    order = np.argsort(-logits, kind="stable")[:top_k]
    ids, logits = ids[order], logits[order]
    if top_p < 1:
        e = _expf(logits - logits[0])
        p = e / np.cumsum(e)[-1]
        n = int(np.argmax(np.cumsum(p) >= F32(top_p))) + 1 if (np.cumsum(p) >= F32(top_p)).any() else len(p)
        ids, logits = ids[:n], logits[:n]
    if min_p > 0:
        below = np.flatnonzero(logits[1:] < logits[0] + _logf(F32(min_p)))
        n = int(below[0]) + 1 if len(below) else len(logits)
        ids, logits = ids[:n], logits[:n]
    return ids, logits / F32(temp)


def sample_filter_skeleton(ids, logits, top_k, top_p, min_p, temp):
    # ids: int32[n], logits: float32[n] (the candidates); -> (ids kept, their logits / temp)
    raise NotImplementedError("sample_filter: your code here")


def _temp_first(ids, logits, top_k, top_p, min_p, temp):
    return sample_filter(ids, logits / F32(temp), top_k, top_p, min_p, 1.0)


def _temp_multiplied(ids, logits, top_k, top_p, min_p, temp):
    i, lg = sample_filter(ids, logits, top_k, top_p, min_p, 1.0)
    return i, lg * F32(temp)


def _top_p_first(ids, logits, top_k, top_p, min_p, temp):
    order = np.argsort(-logits, kind="stable")
    ids, logits = ids[order], logits[order]
    e = _expf(logits - logits[0])
    p = e / np.cumsum(e)[-1]
    n = int(np.argmax(np.cumsum(p) >= F32(top_p))) + 1
    ids, logits = ids[:n][:top_k], logits[:n][:top_k]
    return sample_filter(ids, logits, top_k, 1.0, min_p, temp)


def _no_min_p(ids, logits, top_k, top_p, min_p, temp):
    return sample_filter(ids, logits, top_k, top_p, 0.0, temp)


def _no_top_p(ids, logits, top_k, top_p, min_p, temp):
    return sample_filter(ids, logits, top_k, 1.0, min_p, temp)


def _check(out, engine):
    if not isinstance(out, tuple) or len(out) != 2:
        raise BadOutput(f"returned {type(out).__name__}; the chain needs a pair (ids, logits)")
    ids, lg = np.asarray(out[0]), np.asarray(out[1])
    if ids.ndim != 1 or lg.shape != ids.shape or len(ids) == 0:
        raise BadOutput(f"returned ids {ids.shape} and logits {lg.shape}: two arrays of the same length, at least one")
    if ids.dtype.kind not in "iu" or lg.dtype.kind != "f":
        raise BadOutput(f"returned ids of {ids.dtype} and logits of {lg.dtype}: int ids, float32 logits")
    if np.isnan(lg).any():
        raise BadOutput("returned NaN logits")
    return ids.astype(np.int32), lg.astype(F32)


def _same(a, b) -> bool:
    return a[0].shape == b[0].shape and np.array_equal(a[0], b[0]) and a[1].tobytes() == b[1].tobytes()


def _diff(a, b) -> float:
    if a[0].shape != b[0].shape or not np.array_equal(a[0], b[0]):
        return float("inf")
    return float(np.abs(a[1].astype(np.float64) - b[1]).max())


def _install(probe):
    from ...llama import sampling as S

    orig = S.SamplerChain.apply

    def apply(self, cur):
        stages = self.samplers
        kinds = [type(s) for s in stages]
        try:
            i = kinds.index(S.TopK)
            tp, mp, tt = (stages[kinds.index(c)] for c in (S.TopP, S.MinP, S.Temp))
        except ValueError:
            return orig(self, cur)
        tk = stages[i]
        tail = [s for s in stages[i:] if not isinstance(s, (S.TopK, S.TopP, S.MinP, S.Temp, S.Dist))]
        if tail and any(getattr(s, "p", 1.0) < 1 for s in tail) or tk.k <= 0 or tt.temp <= 0:
            return orig(self, cur)
        for s in stages[:i]:
            s.apply(cur)
        ref = cur.copy()
        for s in (tk, tp, mp, tt):
            s.apply(ref)
        engine = (ref.id.copy(), ref.logit.copy())
        ids, lg = probe(Where(f"step {probe.step}", "SAMPLE", None, "top-k, top-p, min-p, temperature"),
                        (cur.id.copy(), cur.logit.copy(), int(tk.k), float(tp.p), float(mp.p), float(tt.temp)), engine)
        cur.id, cur.logit, cur.p = ids, lg, np.zeros(len(ids), F32)
        cur.sorted = bool(np.all(lg[1:] <= lg[:-1]))
        for s in stages:
            if isinstance(s, S.Dist):
                s.apply(cur)
    return swap_attr(S.SamplerChain, "apply", apply)


register_slot(Slot(
    name="sample_filter", notebook="08",
    signature="sample_filter(ids: int32[n], logits: float32[n], top_k: int, top_p: float, min_p: float, "
              "temp: float) -> (int32[m], float32[m])",
    used_for="every sampled token (llama.cpp's default chain, a fixed seed): the candidates the seeded draw "
             "picks from",
    reference=sample_filter, skeleton=sample_filter_skeleton, install=_install, models=("smollm2", "gemma3"),
    check=_check, equal=_same, diff=_diff, sampling=True,
    mistakes=[
        Mistake("temperature first", _temp_first,
                "the temperature came first: llama.cpp divides by it last, after top-p and min-p chose on the "
                "untempered probabilities"),
        Mistake("temperature multiplied", _temp_multiplied, "multiplied by the temperature: divide the logits by it"),
        Mistake("top-p before top-k", _top_p_first,
                "top-p over the whole vocabulary: top-k comes first, and top-p renormalises over the k kept"),
        Mistake("min-p forgotten", _no_min_p, "min-p was not applied: drop logits below the first's + log(min_p)"),
        Mistake("top-p forgotten", _no_top_p, "top-p was not applied: keep the fewest whose probabilities reach p"),
    ],
    hint_different="the first step that kept other candidates: {node}: top-k, top-p, min-p, then the temperature"))
