"""The learner's slots: named places where a learner's function replaces one piece of the engine.

A slot is one :class:`Slot` record, made in a module of ``llmlab.plug.slots`` (one module per
notebook's group of slots) and listed in :data:`SLOT_MODULES`: a new slot is a new record plus, for a
new group, one line there. A slot knows

- its name, notebook, the learner's function's signature and what the engine uses it for;
- ``reference``: the solution, written as a learner would write it (the teacher's edition), which
  must keep the engine bit for bit what it is;
- ``skeleton``: the learner's edition, a function that does not work yet;
- ``install(probe)``: a context manager that swaps the engine's piece for a wrapper which hands
  every call to ``probe`` (``llmlab.plug.probe``: it runs the learner's function under guard,
  compares it with the engine's own piece on the same inputs and returns what the engine goes on
  with), and restores the piece on the way out whatever happens (an error, Ctrl-C);
- ``models``: the models whose generation runs through the slot;
- ``mistakes``: typical mistakes, each a mistaken implementation and the hint that teaches it. A
  learner's departing output is compared with each mistake's output on the same inputs (the
  signature of the difference), never with the learner's source text.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager

import numpy as np

# one module per notebook's group of slots (a new group: a new module and one line here)
SLOT_MODULES = (
    "llmlab.plug.slots.s01_gguf",
    "llmlab.plug.slots.s02_tokenizer",
    "llmlab.plug.slots.s03_block",
    "llmlab.plug.slots.s04_kv_cache",
    "llmlab.plug.slots.s05_quant",
    "llmlab.plug.slots.s06_graph",
    "llmlab.plug.slots.s07_mmvq",
    "llmlab.plug.slots.s08_sampling",
)


@dataclass
class Mistake:
    """A typical mistake: ``fn`` computes what that mistake computes (same signature as the slot's
    function); ``hint`` is the line shown when the learner's output matches it. ``hint`` may name
    ``{node}``, ``{layer}``, ``{max_diff}`` and whatever ``detail(args, out) -> dict`` adds."""
    name: str
    fn: Callable
    hint: str
    detail: Callable[..., dict] | None = None
    close: bool = False          # a mistake that changes the last bits only (status close, not different)


@dataclass
class Slot:
    name: str
    notebook: str                # "03": the notebook whose "Build it" exercise it is
    signature: str               # the learner's function, as the notebook documents it
    used_for: str                # what the engine uses it for
    reference: Callable          # the solution (teacher's edition)
    skeleton: Callable           # the learner's edition: does not work yet
    install: Callable[[Any], ContextManager]
    models: tuple[str, ...]      # the models whose generation runs through the slot
    mistakes: list[Mistake] = field(default_factory=list)
    check: Callable[[Any, Any], Any] | None = None   # (learner's output, engine's) -> output to use; raises BadOutput
    equal: Callable[[Any, Any], bool] | None = None  # default: the same bits
    diff: Callable[[Any, Any], float] | None = None  # default: max |a - b| over arrays
    hint_close: str = "the values agree to the last bits only: the same arithmetic in another order or precision"
    hint_different: str = "the values differ from the engine's at the first call"
    sampling: bool = False       # the slot works inside a sampled (not greedy) generation
    shadow: bool = False         # the slot's values run beside the engine's (they cannot change the text): its
                                 # status is close or different by the size of the departure (relative 1e-3)
    func_name: str = ""          # the function's name in a learner's file (default: the slot's name)

    @property
    def function(self) -> str:
        return self.func_name or self.name

    def to_json(self) -> dict:
        return {"name": self.name, "notebook": self.notebook, "signature": self.signature,
                "used_for": self.used_for, "models": list(self.models), "function": self.function,
                "mistakes": [m.name for m in self.mistakes]}


class BadOutput(Exception):
    """The learner's function returned something the engine cannot take (shape, dtype, NaN, type)."""


def check_array(out, ref: np.ndarray, what: str = "array") -> np.ndarray:
    """The learner's array output checked against the engine's: same shape, same dtype, finite where
    the engine's is."""
    if not isinstance(out, np.ndarray):
        if isinstance(out, (list, tuple)) or np.isscalar(out):
            raise BadOutput(f"returned a {type(out).__name__}, the engine needs a numpy {what} of shape "
                            f"{tuple(ref.shape)} ({ref.dtype})")
        raise BadOutput(f"returned {type(out).__name__}, the engine needs a numpy {what} of shape "
                        f"{tuple(ref.shape)} ({ref.dtype})")
    if out.shape != ref.shape:
        if out.size == ref.size:
            raise BadOutput(f"returned shape {tuple(out.shape)}, the engine needs {tuple(ref.shape)} "
                            f"(the same {out.size} values in another shape: reshape, or check the axes)")
        raise BadOutput(f"returned shape {tuple(out.shape)}, the engine needs {tuple(ref.shape)}")
    if out.dtype != ref.dtype:
        raise BadOutput(f"returned {out.dtype}, the engine needs {ref.dtype} (ggml's tensors are "
                        f"{ref.dtype}: convert at the end with .astype(np.{ref.dtype}))")
    if out.dtype.kind == "f":
        bad = ~np.isfinite(out) & np.isfinite(ref)
        if bad.any():
            i = np.unravel_index(int(np.flatnonzero(bad.reshape(-1))[0]), out.shape)
            kind = "NaN" if np.isnan(out[i]) else "inf"
            raise BadOutput(f"returned {kind} at index {tuple(int(x) for x in i)} where the engine has "
                            f"{float(ref[i]):.6g}")
    return out


_SLOTS: dict[str, Slot] = {}
_LOADED = False


def register_slot(slot: Slot) -> Slot:
    if slot.name in _SLOTS:
        raise ValueError(f"slot {slot.name!r} registered twice")
    _SLOTS[slot.name] = slot
    return slot


def _load() -> None:
    global _LOADED
    if not _LOADED:
        _LOADED = True
        for m in SLOT_MODULES:
            importlib.import_module(m)


def list_slots() -> list[Slot]:
    """Every slot, in notebook order."""
    _load()
    return sorted(_SLOTS.values(), key=lambda s: (s.notebook, list(_SLOTS).index(s.name)))


def get_slot(name: str) -> Slot:
    _load()
    if name not in _SLOTS:
        from .. import LLMLabError
        raise LLMLabError(f"no slot named {name!r}; the slots are: {', '.join(s.name for s in list_slots())}")
    return _SLOTS[name]
