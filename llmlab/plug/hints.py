"""One-line hints: which typical mistake a departing call looks like.

The learner's output at the first call where it parted from the engine is compared with what each
of the slot's typical mistakes computes on the same inputs: the mistake that reproduces it (bit for
bit, or at least ten times closer than the engine's own result) names the hint. This reads the
numbers, never the learner's code, so it also recognises a mistake written in an unexpected way.
"""
from __future__ import annotations

import math

import numpy as np

from . import guard
from .probe import Departure, Probe, _copy, _same, max_diff


def _fields(probe: Probe, dep: Departure, mistake, out) -> dict:
    f = {"node": dep.where.name, "layer": dep.where.layer, "op": dep.where.op, "max_diff": f"{dep.max_diff:.3g}",
         "detail": dep.where.detail, "step": dep.step}
    if mistake is not None and mistake.detail is not None:
        try:
            f.update(mistake.detail(*dep.args, out=out))
        except Exception:
            pass
    return f


def _fmt(text: str, fields: dict) -> str:
    try:
        return text.format(**fields)
    except (KeyError, IndexError, ValueError):
        return text


def which_mistake(probe: Probe, args: tuple, out, engine):
    """The slot's mistake whose output on ``args`` is ``out`` (or nearest to it, ten times nearer than
    the engine's), else None."""
    best, best_d = None, math.inf
    ref_d = max_diff(out, engine) if out is not None and engine is not None else math.inf
    for m in probe.slot.mistakes:
        try:
            mo = guard.call(m.fn, tuple(_copy(a) for a in args), max(probe.limit, 10.0), m.name)
        except guard.Fault:
            continue
        if _same(mo, out) or (isinstance(mo, np.ndarray) and isinstance(out, np.ndarray)
                              and mo.shape == out.shape and np.array_equal(mo, out, equal_nan=True)):
            return m
        if isinstance(mo, np.ndarray) and isinstance(out, np.ndarray) and mo.shape == out.shape:
            d = max_diff(mo, out)
            if d < best_d:
                best, best_d = m, d
    if best is not None and math.isfinite(ref_d) and ref_d > 0 and best_d * 10 <= ref_d:
        return best
    return None


def hint(probe: Probe, status: str) -> str:
    """The one-line hint for a slot's verdict."""
    slot = probe.slot
    if probe.fault is not None:
        f = probe.fault
        if (f.kind == "raised" and "NotImplementedError" in f.message) or \
                (f.kind == "output" and "returned NoneType" in f.message):
            return "not written yet: fill in the function's body (the skeleton raises NotImplementedError)"
        if f.kind == "output" and "bad_output" in probe.extra and probe.fault_args is not None:
            dep = Departure(probe.fault_where, probe.step, probe.fault_args, probe.extra["bad_output"], None, math.inf)
            m = which_mistake(probe, probe.fault_args, probe.extra["bad_output"], None)
            if m is not None:
                return _fmt(m.hint, _fields(probe, dep, m, dep.out))
        if f.kind == "raised" and probe.fault_args is not None:
            m = _raises_like(probe, f.message)
            if m is not None:
                dep = Departure(probe.fault_where, probe.step, probe.fault_args, None, None, math.inf)
                return _fmt(m.hint, _fields(probe, dep, m, None))
        if f.kind == "timeout":
            return "the function did not return in time: look for a loop whose condition never changes"
        if f.kind == "output" and ("NaN" in f.message or " inf " in f.message):
            return ("a NaN or inf where the engine has a number: look for 0/0, the root of a negative, an exp "
                    "that overflows")
        if f.kind == "output":
            return "the engine needs exactly the shape and dtype its own piece gives (see the signature)"
        return "the function stopped with an error; run it on a small input first"
    dep = probe.first
    if dep is None:
        if probe.calls == 0:
            return "the engine never called this slot on this model and prompt (see the slot's models)"
        return f"bit-identical in all {probe.calls} calls"
    m = which_mistake(probe, dep.args, dep.out, dep.engine)
    if m is not None:
        return _fmt(m.hint, _fields(probe, dep, m, dep.out))
    fields = _fields(probe, dep, None, dep.out)
    return _fmt(slot.hint_close if status == "close" else slot.hint_different, fields)


def _raises_like(probe: Probe, message: str):
    """The mistake that raises the same exception as the learner's function did on the same inputs."""
    kind = message.split(" raised ", 1)[-1].split(" ", 1)[0].split(":", 1)[0]
    for m in probe.slot.mistakes:
        try:
            guard.call(m.fn, tuple(_copy(a) for a in probe.fault_args), max(probe.limit, 10.0), m.name)
        except guard.Fault as f:
            if f.kind == "raised" and f.message.split(" raised ", 1)[-1].split(" ", 1)[0].split(":", 1)[0] == kind:
                return m
    return None
