"""llama.cpp in a child process: a crash of the oracle is one Python exception, not a dead test run or kernel.

llama.cpp is C++; when it dies (its AMX path raises SIGILL at the first decode on some Intel Xeons, an
assertion aborts, a bad pointer segfaults) it takes the process with it. So llmlab never loads it in
the caller's process: :func:`isolated` sends a function of llmlab (mostly of :mod:`llmlab.llamacpp`) and
its arguments to one persistent worker (``python -m llmlab.llamacpp.worker``, started on first use), which runs it and
sends back the result: NumPy arrays, captured nodes, token ids. If the worker dies, the call raises
:class:`LlamaCppCrashed` naming the signal, and the next call starts a new worker.

:func:`open_remote` keeps an object in the worker (a :class:`~llmlab.llamacpp.session.Session`, a
sampler chain) and returns a proxy whose method calls go there.

Requests and replies are pickled, length-prefixed frames on the worker's stdin and stdout; the worker
writes nothing else there (its C code's stdout goes to its stderr, a temporary file whose tail a crash
report quotes).
"""
from __future__ import annotations

import atexit
import importlib
import os
import pickle
import signal
import struct
import subprocess
import sys
import tempfile
import threading
from typing import Any, Callable

from .. import LLMLabError

_HEADER = struct.Struct("<QQ")       # pickle length, number of out-of-band buffers (each: length, bytes)
_LEN = struct.Struct("<Q")
_IN_WORKER = False          # True inside the worker: calls run directly


class LlamaCppCrashed(LLMLabError):
    """llama.cpp killed the worker process that ran it (a signal, an abort): one failed call."""

    def __init__(self, message: str, signal_name: str | None = None, log: str = ""):
        super().__init__(message)
        self.signal_name = signal_name
        self.log = log

    def __reduce__(self):
        return (type(self), (str(self), self.signal_name, self.log))


def _frame(obj) -> list:
    """The pieces of one message: NumPy arrays travel as raw out-of-band buffers (pickle protocol 5), uncopied."""
    bufs: list = []
    data = pickle.dumps(obj, protocol=5, buffer_callback=bufs.append)
    raws = [b.raw() for b in bufs]
    out = [_HEADER.pack(len(data), len(raws)), data]
    for r in raws:
        out += [_LEN.pack(r.nbytes), r]
    return out


def _send(f, pieces) -> None:
    for p in pieces:
        f.write(p)
    f.flush()


def _write(f, obj) -> None:
    _send(f, _frame(obj))


def _read_exact(f, n: int) -> bytearray | None:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = f.readinto(view[got:])
        if not k:
            return None
        got += k
    return buf


def _read(f):
    head = _read_exact(f, _HEADER.size)
    if head is None:
        return None
    n_data, n_bufs = _HEADER.unpack(head)
    data = _read_exact(f, n_data)
    bufs = []
    for _ in range(n_bufs):
        size = _read_exact(f, _LEN.size)
        buf = None if size is None else _read_exact(f, _LEN.unpack(size)[0])
        if data is None or buf is None:
            return None
        bufs.append(buf)
    return None if data is None else pickle.loads(data, buffers=bufs)


def _describe(rc: int) -> tuple[str, str | None]:
    """'died with SIGILL (illegal instruction)' for a worker's return code, and the signal's name."""
    if rc < 0:
        try:
            sig = signal.Signals(-rc)
            return f"died with {sig.name} ({signal.strsignal(sig) or sig.name})", sig.name
        except (ValueError, AttributeError):
            return f"died with signal {-rc}", f"signal {-rc}"
    if rc == 0xC000001D:                                   # Windows: STATUS_ILLEGAL_INSTRUCTION
        return "died with an illegal instruction (0xC000001D)", "SIGILL"
    if rc == 0xC0000005:
        return "died with an access violation (0xC0000005)", "SIGSEGV"
    return f"exited with status {rc}", None


def _where(log: str) -> str:
    """The innermost Python function of the faulthandler dump in the worker's stderr (where C was entered)."""
    for line in log.splitlines():
        line = line.strip()
        if line.startswith("File ") and " in " in line:
            return line.rsplit(" in ", 1)[1]
    return ""


class Worker:
    """One worker process, started on demand and restarted after a crash."""

    def __init__(self):
        self.proc: subprocess.Popen | None = None
        self.err = None
        self.lock = threading.RLock()
        self.generation = 0          # bumped at each start: proxies of a dead worker know they are stale
        self.crashes: list[LlamaCppCrashed] = []

    def _start(self) -> None:
        self.err = tempfile.TemporaryFile()
        env = dict(os.environ, PYTHONFAULTHANDLER="1")
        here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = os.pathsep.join([here] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        self.proc = subprocess.Popen([sys.executable, "-m", "llmlab.llamacpp.worker"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.err, env=env)
        self.generation += 1

    def _log_tail(self, n: int = 4000) -> str:
        if self.err is None:
            return ""
        self.err.seek(0, os.SEEK_END)
        size = self.err.tell()
        self.err.seek(max(0, size - n))
        return self.err.read().decode(errors="replace")

    def _crashed(self, what: str) -> LlamaCppCrashed:
        proc, self.proc = self.proc, None
        try:
            rc = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
        how, sig = _describe(rc)
        log = self._log_tail()
        where = _where(log)
        self.err.close()
        self.err = None
        crash = LlamaCppCrashed(f"llama.cpp {how} in {what}" + (f" (at {where})" if where else "")
                                + "; the next call starts a new worker", sig, log)
        self.crashes.append(crash)
        return crash

    def request(self, what: str, msg: tuple) -> Any:
        """Send one request, return its result (re-raising the worker's exception)."""
        frame = _frame(msg)                      # an argument that does not pickle fails here, harmlessly
        with self.lock:
            if self.proc is None or self.proc.poll() is not None:
                self._start()
            try:
                _send(self.proc.stdin, frame)
                reply = _read(self.proc.stdout)
            except (BrokenPipeError, OSError):
                reply = None
            except BaseException:                # interrupted mid-request: the stream is out of step, start over
                self._kill()
                raise
            if reply is None:
                raise self._crashed(what)
        ok, value = reply
        if ok:
            return value
        raise value

    def _kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None
        if self.err is not None:
            self.err.close()
            self.err = None

    def stop(self) -> None:
        with self.lock:
            if self.proc is not None:
                try:
                    self.proc.stdin.close()
                    self.proc.wait(timeout=10)
                except Exception:
                    self.proc.kill()
                self.proc = None
            if self.err is not None:
                self.err.close()
                self.err = None


_WORKER = Worker()
atexit.register(_WORKER.stop)


def _ours(mod: str) -> bool:
    return mod == "llmlab" or mod.startswith("llmlab.")


def _name(fn: Callable) -> tuple[str, str]:
    mod, qual = getattr(fn, "__module__", "") or "", getattr(fn, "__qualname__", "")
    if not _ours(mod) or "<" in qual or not qual:
        raise ValueError(f"only module-level functions of llmlab run in the llama.cpp worker, not {mod}.{qual}")
    return mod, qual


def _resolve(mod: str, qual: str):
    if not _ours(mod):
        raise ValueError(f"refusing to run {mod}.{qual} in the llama.cpp worker")
    obj = importlib.import_module(mod)
    for part in qual.split("."):
        obj = getattr(obj, part)
    return obj


def isolated(fn: Callable, *args, **kwargs):
    """``fn(*args, **kwargs)`` in the llama.cpp worker; its result, or its exception, comes back here.

    ``fn`` is a module-level function of llmlab (usually of :mod:`llmlab.llamacpp`). Raises
    :class:`LlamaCppCrashed` if the worker dies meanwhile.
    """
    if _IN_WORKER:
        return fn(*args, **kwargs)
    mod, qual = _name(fn)
    return _WORKER.request(f"{qual}()", ("call", mod, qual, args, kwargs))


def isolated_once(fn: Callable, *args, **kwargs):
    """As :func:`isolated`, in a worker of its own that stops afterwards: a fresh process, whose peak memory
    is this call's alone (the speed comparison)."""
    if _IN_WORKER:
        return fn(*args, **kwargs)
    mod, qual = _name(fn)
    w = Worker()
    try:
        return w.request(f"{qual}()", ("call", mod, qual, args, kwargs))
    except LlamaCppCrashed as e:
        _WORKER.crashes.append(e)
        raise
    finally:
        w.stop()


class Remote:
    """A proxy of an object kept in the worker: ``remote.method(...)`` runs there."""

    def __init__(self, handle: int, generation: int, what: str):
        self._handle, self._generation, self._what = handle, generation, what

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)

        def call(*args, **kwargs):
            if self._generation != _WORKER.generation or _WORKER.proc is None:
                raise LlamaCppCrashed(f"the llama.cpp worker that held this {self._what} is gone (it crashed)")
            return _WORKER.request(f"{self._what}.{name}()", ("method", self._handle, name, args, kwargs))
        return call

    def close(self) -> None:
        """Drop the object in the worker (its ``close``, if it has one, runs there)."""
        if self._handle is not None and self._generation == _WORKER.generation and _WORKER.proc is not None:
            _WORKER.request(f"{self._what}.close()", ("drop", self._handle))
        self._handle = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def open_remote(cls: Callable, *args, **kwargs):
    """``cls(*args, **kwargs)`` made in the worker; a :class:`Remote` proxy of it (in the worker: the object)."""
    if _IN_WORKER:
        return cls(*args, **kwargs)
    mod, qual = _name(cls)
    with _WORKER.lock:
        handle = _WORKER.request(f"{qual}()", ("new", mod, qual, args, kwargs))
        return Remote(handle, _WORKER.generation, qual)


def last_crash() -> LlamaCppCrashed | None:
    """The last crash of llama.cpp in this process's worker (None if it never crashed, or since :func:`forget_crashes`)."""
    return _WORKER.crashes[-1] if _WORKER.crashes else None


def forget_crashes() -> None:
    _WORKER.crashes.clear()


def restart() -> None:
    """Stop the worker; the next call starts a fresh one."""
    _WORKER.stop()


def ping() -> int:
    """The worker's process id (starts it if needed)."""
    return os.getpid()


def die(signum: int) -> None:
    """Kill the worker with ``signum``, as a crash of llama.cpp would (for the tests of this module)."""
    os.kill(os.getpid(), signum)


# ---- the worker's side ------------------------------------------------------------------------------------------
def _serve() -> None:
    global _IN_WORKER
    _IN_WORKER = True
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C is the caller's: it stops this worker if it must
    out = os.fdopen(os.dup(1), "wb")            # the protocol's channel; fd 1 now goes to stderr
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    inp = sys.stdin.buffer
    objects: dict[int, Any] = {}
    while True:
        try:
            msg = _read(inp)
        except Exception as e:                   # a frame that does not unpickle: answer, keep serving
            _write(out, (False, LLMLabError(f"bad request to the llama.cpp worker: {e}")))
            continue
        if msg is None:
            return
        try:
            kind = msg[0]
            if kind == "call":
                _, mod, qual, args, kwargs = msg
                value = _resolve(mod, qual)(*args, **kwargs)
            elif kind == "new":
                _, mod, qual, args, kwargs = msg
                obj = _resolve(mod, qual)(*args, **kwargs)
                value = id(obj)
                objects[value] = obj
            elif kind == "method":
                _, handle, name, args, kwargs = msg
                value = getattr(objects[handle], name)(*args, **kwargs)
            elif kind == "drop":
                obj = objects.pop(msg[1], None)
                value = obj.close() if hasattr(obj, "close") else None
            else:
                raise ValueError(f"unknown request {kind!r}")
            reply = (True, value)
        except BaseException as e:               # the caller gets the exception, the worker keeps serving
            reply = (False, e)
        try:
            _write(out, reply)
        except Exception as e:                   # an unpicklable result or exception: say so
            _write(out, (False, LLMLabError(f"the llama.cpp worker could not send back {type(reply[1]).__name__}: {e}")))


if __name__ == "__main__":                      # run as a script: serve from the importable module, whose
    from llmlab.llamacpp import worker as _w     # _IN_WORKER the library reads (not __main__'s copy)
    _w._serve()
