"""The one way a checker reports: a :class:`Verdict`, shown as one line."""
from __future__ import annotations

import functools
import inspect
import sys
from dataclasses import dataclass

# The tag of a solution cell in a notebook source (with ``jupyter.source_hidden``, so it opens collapsed)
SOLUTION_TAG = "solution"
# How a verdict line starts: the one of a correct answer, and those of an answer not there yet
CORRECT = "correct"
NOT_YET = ("not yet", "no answer yet")


@dataclass(frozen=True)
class Verdict:
    """What a checker says about an answer: ``ok`` and the line a notebook shows (``message``):
    ``correct[: what]``, ``not yet: what[: hint]`` or ``no answer yet: ...``.

    It is true when the answer is correct (``assert check(...)``, ``if check(...)``). A notebook shows
    it by ending a cell with the checker call: the line, printed, never a bare ``True``/``False``.
    """
    ok: bool
    message: str

    @classmethod
    def correct(cls, what: str = "") -> Verdict:
        return cls(True, f"{CORRECT}: {what}" if what else CORRECT)

    @classmethod
    def not_yet(cls, what: str, hint: str = "") -> Verdict:
        """What is off, and a hint that does not give the answer away."""
        return cls(False, f"not yet: {what}: {hint}" if hint else f"not yet: {what}")

    @classmethod
    def of(cls, ok: bool, what: str, hint: str = "") -> Verdict:
        """``correct: what`` when ``ok``, else ``not yet: what: hint``."""
        return cls.correct(what) if ok else cls.not_yet(what, hint)

    @classmethod
    def unanswered(cls, placeholder) -> Verdict:
        """Names the placeholder the learner sees in the cell (``my_answer = 0``), never the
        checker's parameter, whose name the cell does not show."""
        shown = "..." if placeholder is Ellipsis else repr(placeholder)
        return cls(False, f"no answer yet: the cell still holds its placeholder ({shown}); "
                          "put your answer in its place, then run the cell again")

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        return self.message

    def _ipython_display_(self) -> None:
        sys.stdout.write(f"{self.message}\n")     # one write: one stream output, never split at the newline


def is_correct(line: str) -> bool:
    """Whether a line of a cell's output is the verdict on a correct answer."""
    return line == CORRECT or line.startswith(CORRECT + ": ")


def is_not_yet(line: str) -> bool:
    """Whether a line of a cell's output is a verdict that is not "correct"."""
    return line.startswith(NOT_YET)


def _unanswered(answer) -> bool:
    if answer is None or answer is Ellipsis:
        return True
    if isinstance(answer, (int, float)) and answer == 0:
        return True
    if isinstance(answer, (list, tuple)) and all(isinstance(a, str) and not a for a in answer):
        return True      # [] or ("", "")
    return isinstance(answer, (bytes, str)) and len(answer) == 0


def needs_answer(arg: str):
    """Say "no answer yet" instead of judging the placeholder a notebook starts with (in ``arg``)."""
    def wrap(fn):
        sig = inspect.signature(fn)

        @functools.wraps(fn)
        def check(*a, **kw) -> Verdict:
            answer = sig.bind(*a, **kw).arguments.get(arg)
            if _unanswered(answer):
                return Verdict.unanswered(answer)
            return fn(*a, **kw)
        return check
    return wrap


def call_learner(fn, *args):
    """(result, None), or (None, a ``not yet`` verdict) when the learner's ``fn`` raises or is not
    written yet."""
    try:
        out = fn(*args)
    except Exception as e:   # the reader's code: report, do not crash the notebook
        return None, Verdict.not_yet(f"your function raised {type(e).__name__}: {e}")
    return (None, Verdict.not_yet("your function returned None (not written yet?)")) if out is None else (out, None)
