"""``FILE.py[:FUNC]``: a learner's function from a file, loaded as a module of its own.

Loading runs the file's top-level code, so a file that does not even load (a syntax error, an
import that fails, a raise at the top) is bad input: one ``error:`` line, no traceback.
"""
from __future__ import annotations

import importlib.util
import itertools
import os
from pathlib import Path

from .. import LLMLabError
from . import guard

_N = itertools.count()


def load_function(spec: str, default_name: str, limit: float = guard.DEFAULT_LIMIT_S):
    """(the function, a label) for ``FILE.py`` or ``FILE.py:FUNC`` (default FUNC: the slot's name)."""
    path, _, func = spec.rpartition(":") if spec.rpartition(":")[2].isidentifier() and \
        not os.path.exists(spec) else (spec, "", "")
    path = path or spec
    func = func or default_name
    p = Path(path)
    if not p.is_file():
        raise LLMLabError(f"{path}: no such file (give --slot NAME=FILE.py[:FUNC])")
    name = f"llmlab_learner_{next(_N)}_{''.join(c if c.isalnum() else '_' for c in p.stem)}"
    try:
        mspec = importlib.util.spec_from_file_location(name, p)
        if mspec is None or mspec.loader is None:
            raise LLMLabError(f"{path}: not a Python file")
        mod = importlib.util.module_from_spec(mspec)
        guard.call(mspec.loader.exec_module, (mod,), limit, f"loading {p.name}")
    except guard.Fault as f:
        raise LLMLabError(f"{path}: {f}") from None
    except SyntaxError as e:
        raise LLMLabError(f"{path}: syntax error at line {e.lineno}: {e.msg}") from None
    fn = getattr(mod, func, None)
    if fn is None:
        funcs = [k for k, v in vars(mod).items() if callable(v) and getattr(v, "__module__", "") == name]
        raise LLMLabError(f"{path}: no function named {func!r}" + (f" (it defines {', '.join(funcs)}; "
                          f"give FILE.py:FUNC)" if funcs else ""))
    if not callable(fn):
        raise LLMLabError(f"{path}: {func} is not a function")
    return fn, f"{func} from {p.name}"
