"""Build it yourself: a learner's own functions plugged into the engine, on the real model.

    from llmlab import plug
    plug.list_slots()                                 # the slots: name, notebook, signature, use
    report = plug.run("smollm2", "The capital of France is", 4, {"rms_norm": my_rms_norm})
    print(report.summary())

``python -m llmlab plug --list`` and ``python -m llmlab plug -m MODEL -p PROMPT --slot NAME=FILE.py``
do the same on the command line; ``llmlab.nb.plug`` in the notebooks. See ``registry`` (what a slot
is), ``probe`` and ``guard`` (the learner's code as untrusted code), ``runner`` (the verdicts) and
``hints`` (typical mistakes).
"""
from __future__ import annotations

from .registry import Mistake, Slot, get_slot, list_slots, register_slot

__all__ = ["Mistake", "Slot", "get_slot", "register_slot", "list_slots", "run", "plugged", "load_function"]


def run(*args, **kw):
    from .runner import run as _run
    return _run(*args, **kw)


def plugged(cpu=None, limit=None, **fns):
    """A context manager that plugs ``fns`` ({slot: function}) into the engine for the block, with
    probes that record every call (``as probes``); the engine is restored on the way out."""
    from .runner import plugged as _p
    return _p(cpu=cpu, limit=limit, **fns)


def load_function(spec: str, default_name: str):
    from .loader import load_function as _l
    return _l(spec, default_name)
