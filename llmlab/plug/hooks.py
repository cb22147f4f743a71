"""How slots swap the engine's pieces, and always put them back.

Each swap is a context manager whose ``finally`` restores what was there, so an error, a
``SlotStopped`` or Ctrl-C inside the block leaves the engine exactly as it was. Op slots wrap an
entry of the reference kernel table (``llmlab.ggml.cpu.ops.COMPUTE``, which the reference plans bind
when a context first runs a graph): the engine computes its own result first, then the probe decides
what the node holds.
"""
from __future__ import annotations

import contextlib
from typing import Callable

import numpy as np

from .probe import Where


@contextlib.contextmanager
def swap_attr(obj, name: str, new):
    old = getattr(obj, name)
    setattr(obj, name, new)
    try:
        yield old
    finally:
        setattr(obj, name, old)


@contextlib.contextmanager
def swap_item(d: dict, key, new):
    had, old = key in d, d.get(key)
    d[key] = new
    try:
        yield old
    finally:
        if had:
            d[key] = old
        else:
            d.pop(key, None)


def layer_of(name: str):
    from ..llamacpp.eval_callback import layer_of as lo
    return lo(name)


@contextlib.contextmanager
def op_slot(op: str, probe, args: Callable, engine: Callable, write: Callable,
            applies: Callable = lambda dst: True, calls: Callable | None = None):
    """Wrap COMPUTE[op]: after the engine's own kernel, ``args(dst, cpu)`` are the learner's inputs,
    ``engine(dst)`` the engine's result in the learner's layout, ``write(dst, out)`` stores the value
    the probe returns. ``calls(dst, cpu, orig)``: a slot that makes several calls per node does them itself."""
    from ..ggml.cpu.ops import COMPUTE
    orig = COMPUTE[op]

    def wrapped(dst, cpu=None):
        orig(dst, cpu)
        if not applies(dst):
            return
        if calls is not None:
            calls(dst, cpu)
            return
        out = probe(Where(dst.name, dst.op, layer_of(dst.name)), args(dst, cpu), engine(dst))
        write(dst, out)

    with swap_item(COMPUTE, op, wrapped):
        yield


def rows(a: np.ndarray) -> np.ndarray:
    """An array as 2-D rows of its last axis (a copy, float32)."""
    return np.ascontiguousarray(a, dtype=np.float32).reshape(-1, a.shape[-1]).copy()
