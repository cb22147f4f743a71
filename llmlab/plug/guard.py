"""A learner's function is untrusted code in the learner's own process: call it so that whatever it
does (raise, exit, loop forever) ends as a :class:`Fault`, one line with the learner's own line
number, never a traceback from inside the engine.

The time limit is in-process. Where the OS has ``SIGALRM`` and the call is on the main thread (the
command line, a Jupyter kernel), an interval timer interrupts the learner's code wherever it is,
even inside a tight ``while True`` of pure Python; the handler and the timer in place before are put
back after every call. Elsewhere (Windows, a worker thread) a trace function checks the clock on
each line the learner's code runs: slower, but it stops a loop too. A forked child process would
isolate more (a crash of the interpreter itself), but would copy the model for every call and could
not run on Windows; the learner's function only computes, so one process is enough.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass

import numpy as np

DEFAULT_LIMIT_S = 10.0     # seconds one call of a learner's function may take


class TimeLimit(BaseException):
    """Raised into the learner's code when its time is up (a BaseException: ``except Exception``
    in the learner's code does not swallow it)."""


@dataclass
class Fault(Exception):
    """What went wrong in a learner's call: ``kind`` is raised, timeout, exit or output."""
    kind: str
    message: str

    def __str__(self) -> str:
        return self.message


def _where(exc: BaseException, fn) -> str:
    """' (line N of FILE)' for the deepest frame of the traceback inside the learner's file."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return ""
    fname = code.co_filename
    line = None
    for fr in traceback.extract_tb(exc.__traceback__):
        if fr.filename == fname:
            line = fr.lineno
    if line is None:
        return ""
    return f" (line {line} of {os.path.basename(fname)})"


def _alarm(signum, frame):
    raise TimeLimit()


def _can_alarm() -> bool:
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


def call(fn, args: tuple, limit: float = DEFAULT_LIMIT_S, name: str = "your function"):
    """``fn(*args)``; any way it fails is a :class:`Fault`. KeyboardInterrupt passes through (the
    learner's Ctrl-C stops the run; the slots restore the engine on the way out)."""
    try:
        with np.errstate(all="ignore"):    # a NaN or an overflow is judged by the verdict, not warned about
            return _call(fn, args, limit)
    except TimeLimit:
        raise Fault("timeout", f"{name} ran past the time limit of {limit:g} s (an endless loop?) and was stopped") from None
    except KeyboardInterrupt:
        raise
    except SystemExit as e:
        raise Fault("exit", f"{name} called exit({e.code!r}); return a value instead") from None
    except RecursionError as e:
        raise Fault("raised", f"{name} raised RecursionError{_where(e, fn)}: it calls itself without end") from None
    except MemoryError as e:
        raise Fault("raised", f"{name} raised MemoryError{_where(e, fn)}: it asked for more memory than there is") from None
    except Exception as e:
        msg = " ".join(str(e).split())[:200]
        raise Fault("raised", f"{name} raised {type(e).__name__}{_where(e, fn)}" + (f": {msg}" if msg else "")) from None


def _call(fn, args, limit):
    if _can_alarm():
        old = signal.signal(signal.SIGALRM, _alarm)
        prev = signal.setitimer(signal.ITIMER_REAL, limit)
        try:
            return fn(*args)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
            if prev[0]:                         # someone else's timer: give back what was left of it
                signal.setitimer(signal.ITIMER_REAL, prev[0], prev[1])
    return _traced(fn, args, limit)


def _traced(fn, args, limit):
    """The fallback limit: a trace function raises TimeLimit on the first line run after the deadline."""
    deadline = time.monotonic() + limit
    old = sys.gettrace()

    def tracer(frame, event, arg):
        if time.monotonic() > deadline:
            raise TimeLimit()
        return tracer

    sys.settrace(tracer)
    try:
        return fn(*args)
    finally:
        sys.settrace(old)
