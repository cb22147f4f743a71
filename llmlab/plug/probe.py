"""The probe between the engine and a learner's function: every call of a plugged piece comes here.

The slot's wrapper computes the engine's own result first, then asks the probe for the value to go
on with. The probe runs the learner's function on copies of the inputs (under ``guard``: time
limit, no traceback), checks the output (shape, dtype, NaN: ``Slot.check``), compares it bit for bit
with the engine's result and keeps the first call where the two part, with its inputs, so that the
report can name the node and say which typical mistake it looks like.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import guard
from .registry import BadOutput, Slot, check_array


@dataclass
class Where:
    """Where a call happened: the node (or the key, the word, the step) the engine was computing."""
    name: str
    op: str
    layer: int | None = None
    detail: str = ""

    def to_json(self) -> dict:
        return {"name": self.name, "op": self.op, "layer": self.layer, "detail": self.detail}

    def __str__(self) -> str:
        return f"{self.name} ({self.op}{', ' + self.detail if self.detail else ''})"


@dataclass
class Departure:
    where: Where
    step: int
    args: tuple
    out: Any
    engine: Any
    max_diff: float


class SlotStopped(Exception):
    """A learner's call failed (raised, timed out, returned what the engine cannot take): the run stops."""

    def __init__(self, probe: "Probe"):
        super().__init__(str(probe.fault))
        self.probe = probe


def _copy(a):
    if isinstance(a, np.ndarray):
        return a.copy()
    try:
        return copy.deepcopy(a)
    except Exception:
        return a


def max_diff(a, b) -> float:
    """max |a - b| of two arrays (inf where their infinities or NaNs differ); 0/1 for other values."""
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.shape == b.shape and a.dtype.kind in "fiu":
        x, y = a.astype(np.float64), b.astype(np.float64)
        fx, fy = np.isfinite(x), np.isfinite(y)
        if not np.array_equal(fx, fy) or not np.array_equal(x[~fx], y[~fy], equal_nan=True):
            return float("inf")
        return float(np.abs(x[fx] - y[fy]).max()) if fx.any() else 0.0
    return 0.0 if _same(a, b) else 1.0


def _same(a, b) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float):
        return np.float64(a).tobytes() == np.float64(b).tobytes()
    return type(a) is type(b) and a == b


@dataclass
class Probe:
    slot: Slot
    fn: Any
    limit: float = guard.DEFAULT_LIMIT_S
    label: str = ""                  # how the report names the function ("rms_norm from my.py")
    calls: int = 0
    departures: int = 0
    first: Departure | None = None
    fault: guard.Fault | None = None
    fault_where: Where | None = None
    fault_args: tuple | None = None
    step: int = 0                    # the runner's decode step (0: the prompt, and anything before it)
    worst: float = 0.0
    extra: dict = field(default_factory=dict)

    def equal(self, out, engine) -> bool:
        return self.slot.equal(out, engine) if self.slot.equal else _same(out, engine)

    def diff(self, out, engine) -> float:
        return self.slot.diff(out, engine) if self.slot.diff else max_diff(out, engine)

    def stop(self, where: Where, message: str):
        """Stop the run: the learner's output, checked and taken, is one the engine cannot use after all (a
        cell outside the cache, a hole too small), which the slot's wrapper found at ``where``."""
        self.fault, self.fault_where = guard.Fault("output", message), where
        raise SlotStopped(self)

    def __call__(self, where: Where, args: tuple, engine):
        """The value the engine goes on with: the learner's, once checked."""
        self.calls += 1
        mine = tuple(_copy(a) for a in args)
        try:
            out = guard.call(self.fn, mine, self.limit, f"{self.slot.function}()")
            try:
                out = self.slot.check(out, engine) if self.slot.check else check_array(out, engine)
            except BadOutput as e:
                self.extra["bad_output"] = out
                raise guard.Fault("output", f"{self.slot.function}() {e}") from None
        except guard.Fault as f:
            self.fault, self.fault_where, self.fault_args = f, where, tuple(_copy(a) for a in args)
            raise SlotStopped(self) from None
        if not self.equal(out, engine):
            self.departures += 1
            d = self.diff(out, engine)
            self.worst = max(self.worst, d)
            if self.first is None:
                self.first = Departure(where, self.step, tuple(_copy(a) for a in args), _copy(out), _copy(engine), d)
        return out
