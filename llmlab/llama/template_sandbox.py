"""The template sandbox: untrusted Jinja rendered in a separate process, killed at its deadline, on every OS.

A chat template comes from a file anyone can edit, so it is untrusted code. Two walls stand around it:

- **The language.** jinja2's ``ImmutableSandboxedEnvironment`` (no attributes that start with ``_``, no
  ``__globals__`` or ``__subclasses__``, no mutating methods), refusing loudly instead of with jinja2's silent
  undefined; a name with ``__`` is refused before the template runs (the known injection payloads); ``**``
  exponents, the size of ``*`` results, calls nested in calls and how deeply containers nest are capped
  (hashing a tuple nested 100,000 deep overflows CPython's C stack); the output is capped.
- **The process.** The render runs in a *spawned* worker (a fresh interpreter: no ``fork``, so the same on
  Windows, on macOS, where a multi-threaded process must not fork, and on Linux), which the caller kills at the
  deadline: no C-level loop, big multiplication or compile-time constant folding can outrun it, a crash of the
  worker is an error here, not a crash of the caller, and Ctrl-C kills it at once. Its memory is capped
  (RLIMIT_AS on Linux; a job object's process memory limit on Windows). It ends by itself when its caller dies:
  an idle worker reads end-of-file; a busy one is stopped by its alarm (POSIX) or its job object (Windows,
  killed when the caller's handle closes).

The worker is started once and reused (about a millisecond a render instead of a fork of a big process or a
new interpreter); a worker that was killed, crashed or ran out of memory is replaced on the next render.
This module runs as the worker's script too (``python -P template_sandbox.py``), so it imports nothing of
llmlab's and only the standard library at the top: the worker starts in the time jinja2 takes to import.
"""
from __future__ import annotations

import json
import math
import os
import queue
import signal
import subprocess
import sys
import threading
import time

MAX_SECONDS = 2.0          # per render
MAX_OUTPUT = 1 << 20       # characters
MAX_EXTRA_MEMORY = 256 << 20   # bytes the worker may add to its address space after start-up
MAX_NESTING = 100          # containers in containers a template may build (real templates: a few levels)
MAX_INT_BITS = 65536       # the largest integer (in bits) ``**`` and ``*`` may make
MAX_ITEMS = 1 << 24        # the longest string or list ``*`` may make
MAX_CALL_DEPTH = 100       # nested calls (a macro calling itself): far past real templates, far short of
                           # Python's recursion limit, where jinja's error handling itself can fail or the
                           # C stack can outgrow the address-space cap (a crash, seen in CI)
START_SECONDS = 60.0       # a worker's start-up (an interpreter and jinja2; slow under emulation)
CACHED_TEMPLATES = 8       # compiled templates a worker keeps (a chat renders one template on every turn)


class TemplateRefused(Exception):
    """A template that is malformed, hostile, or too expensive to render (``chat.ChatTemplateError`` to callers)."""


# ---- the worker's side: the sandboxed environment ---------------------------------------------------------

def _sandbox():
    from jinja2 import nodes
    from jinja2.exceptions import SecurityError
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from jinja2.visitor import NodeTransformer

    def nested(node):
        return nodes.Call(nodes.EnvironmentAttribute("nested"), [node], [], None, None, lineno=node.lineno)

    class Nest(NodeTransformer):
        """Every tuple, list and dict literal, and every value a ``set`` or ``with`` stores, goes
        through ``environment.nested``, which bounds how deeply containers nest."""

        def visit_Tuple(self, node):
            node = self.generic_visit(node)
            return nested(node) if node.ctx == "load" else node

        def visit_List(self, node):
            return nested(self.generic_visit(node))

        visit_Dict = visit_List

        def visit_Assign(self, node):
            node = self.generic_visit(node)
            node.node = nested(node.node)
            return node

        def visit_With(self, node):
            node = self.generic_visit(node)
            node.values = [nested(v) for v in node.values]
            return node

    class Sandbox(ImmutableSandboxedEnvironment):
        """jinja2's immutable sandbox that refuses loudly and caps ``**``, ``*`` and nesting."""
        intercepted_binops = frozenset({"**", "*"})

        def _parse(self, source, name, filename):
            return Nest().visit(super()._parse(source, name, filename))

        def unsafe_undefined(self, obj, attribute):
            raise TemplateRefused(f"chat template refused: it reaches for {attribute!r} of a "
                                    f"{type(obj).__name__} object, which templates may not touch (Python internals)")

        def call_binop(self, context, operator, left, right):
            if operator == "**" and isinstance(left, int) and isinstance(right, int) and \
                    right > 0 and right * math.log2(abs(left) + 2) > MAX_INT_BITS:
                raise TemplateRefused(f"chat template refused: {_short(left)} ** {_short(right)} is too large a number")
            if operator == "*":
                _check_product(left, right)
            return super().call_binop(context, operator, left, right)

        def call(__self, __context, __obj, *args, **kwargs):   # noqa: N805 (jinja2's signature)
            depth = getattr(_CALLS, "depth", 0)
            if depth >= MAX_CALL_DEPTH:
                raise TemplateRefused(f"chat template recursed too deeply (calls nested {MAX_CALL_DEPTH} deep)")
            _CALLS.depth = depth + 1
            try:
                return super().call(__context, __obj, *args, **kwargs)
            except SecurityError as e:
                raise TemplateRefused(f"chat template refused: {e}") from None
            finally:
                _CALLS.depth = depth

    # the environment Hugging Face's apply_chat_template uses, which chat templates are written for;
    # no constant folding at compile time (jinja2 turns any error inside it, a time limit's too, into "not constant")
    env = Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"], optimized=False)
    env.nested = _nested
    env.filters["tojson"] = lambda x, indent=None, separators=None, sort_keys=False: json.dumps(
        x, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)
    env.globals.update(raise_exception=_raise_exception, strftime_now=lambda fmt: time.strftime(fmt))
    return env


def _short(n: int) -> str:
    return str(n) if n.bit_length() < 64 else f"(a {n.bit_length()}-bit integer)"


def _check_product(left, right) -> None:
    """Refuse a ``*`` whose result is a huge integer or a huge repeated sequence, before computing it
    (one C multiplication of two huge integers cannot be interrupted)."""
    if isinstance(left, int) and isinstance(right, int):
        if left.bit_length() + right.bit_length() > MAX_INT_BITS:
            raise TemplateRefused(f"chat template refused: {_short(left)} * {_short(right)} is too large a number")
        return
    for seq, n in ((left, right), (right, left)):
        if isinstance(n, int) and isinstance(seq, (str, list, tuple)) and len(seq) * max(n, 0) > MAX_ITEMS:
            raise TemplateRefused(f"chat template refused: a {type(seq).__name__} of {len(seq)} repeated {n} times "
                                    f"is too large (more than {MAX_ITEMS} items)")


_DEPTHS: dict[int, tuple[object, int]] = {}   # id -> (container, nesting depth) seen in the current render


def _children(obj):
    from jinja2.utils import Namespace
    if isinstance(obj, dict):
        return [*obj.keys(), *obj.values()]
    if isinstance(obj, (list, tuple, set, frozenset)):
        return obj
    if isinstance(obj, Namespace):
        return list(object.__getattribute__(obj, "_Namespace__attrs").values())
    return None


def _too_deep() -> TemplateRefused:
    return TemplateRefused(f"chat template refused: it nests containers more than {MAX_NESTING} deep")


def _nested(value):
    """``value``, once it is known to nest no deeper than MAX_NESTING containers (walked without
    recursion; containers already measured are not walked again)."""
    if _children(value) is None:
        return value
    # iterative post-order walk: a stack of (container, iterator over its children, depth so far)
    stack = [(value, iter(_children(value)), 0)]
    on_path = {id(value)}
    while stack:
        obj, it, best = stack[-1]
        for child in it:
            known = _DEPTHS.get(id(child))
            if known is not None and known[0] is child:
                best = max(best, known[1])
                continue
            kids = _children(child)
            if kids is None or id(child) in on_path:
                continue
            if len(stack) >= MAX_NESTING:
                raise _too_deep()
            stack[-1] = (obj, it, best)
            stack.append((child, iter(kids), 0))
            on_path.add(id(child))
            break
        else:
            stack.pop()
            on_path.discard(id(obj))
            if best + 1 > MAX_NESTING:
                raise _too_deep()
            _DEPTHS[id(obj)] = (obj, best + 1)
            if stack:
                parent, pit, pbest = stack[-1]
                stack[-1] = (parent, pit, max(pbest, best + 1))
    return value


_CALLS = threading.local()      # how deep the calls of the render on this thread are nested


def _raise_exception(message):
    raise TemplateRefused(f"chat template says: {message}")


_ENV = None


def _env():
    global _ENV
    if _ENV is None:
        _ENV = _sandbox()
    return _ENV


def _render(source: str, context: dict, max_output: int, compiled: dict | None = None) -> str:
    """The render itself (the pre-scan, compiling and running the template); every failure is a TemplateRefused."""
    from jinja2 import TemplateError
    parts, size = [], 0
    _DEPTHS.clear()
    try:
        for line, kind, value in _env().lex(source):   # payloads reach internals through dunder names
            if kind == "name" and "__" in value:
                raise TemplateRefused(f"chat template refused: line {line} names {value!r}; "
                                        "names with '__' lead to Python internals")
        template = compiled.get(source) if compiled is not None else None
        if template is None:
            template = _env().from_string(source)
            if compiled is not None:
                if len(compiled) >= CACHED_TEMPLATES:
                    compiled.pop(next(iter(compiled)))
                compiled[source] = template
        for chunk in template.generate(**context):
            size += len(chunk)
            if size > max_output:
                raise TemplateRefused(f"chat template output exceeds {max_output} characters")
            parts.append(chunk)
    except TemplateRefused:
        raise
    except MemoryError:
        raise TemplateRefused("chat template needed too much memory") from None
    except RecursionError:
        raise TemplateRefused("chat template recursed too deeply") from None
    except TemplateError as e:
        where = f" (line {e.lineno})" if getattr(e, "lineno", None) else ""
        raise TemplateRefused(f"chat template error{where}: {e.message or type(e).__name__}") from None
    except Exception as e:   # an operation inside the template failed (TypeError, OverflowError, ...)
        raise TemplateRefused(f"chat template failed: {type(e).__name__}: {e}") from None
    finally:
        _DEPTHS.clear()
    return "".join(parts)


def _cap_address_space(extra: int) -> None:
    """Cap this process's address space at what it uses now plus ``extra`` (Linux; macOS does not enforce
    RLIMIT_AS, Windows caps the worker with a job object)."""
    if not sys.platform.startswith("linux") or not extra:
        return
    import resource
    with open("/proc/self/statm") as f:
        now = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = now + extra
    if hard == resource.RLIM_INFINITY or cap < hard:
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))


def serve(max_extra_memory: int) -> int:
    """The worker: one JSON request per line on stdin, one JSON answer per line on (a private copy of)
    stdout; ends at end-of-file. An answer with ``"restart"`` is its last (after running out of memory)."""
    out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)         # nothing else may write into the answers
    if hasattr(signal, "SIGINT"):
        signal.signal(signal.SIGINT, signal.SIG_IGN)     # the caller decides what Ctrl-C does
    try:
        import faulthandler
        faulthandler.disable()                           # a crash is the caller's to report, in one line
        _env()
        _cap_address_space(max_extra_memory)
        out.write(b'{"ready": true}\n')
    except Exception as e:                               # noqa: BLE001 - jinja2 missing or broken: say it
        out.write(json.dumps({"fatal": f"{type(e).__name__}: {e}"}).encode() + b"\n")
        return 1
    compiled: dict[str, object] = {}
    for line in sys.stdin.buffer:
        req = json.loads(line)
        alarm = getattr(signal, "alarm", None)           # the caller may die mid-render: stop by ourselves
        if alarm:
            alarm(int(math.ceil(req["max_seconds"])) + 2)
        restart = False
        try:
            answer = {"text": _render(req["source"], req["context"], req["max_output"], compiled)}
        except TemplateRefused as e:
            answer = {"error": str(e)}
            restart = "too much memory" in str(e)
        if alarm:
            alarm(0)
        if restart:
            answer["restart"] = True
        out.write(json.dumps(answer).encode() + b"\n")  # ASCII (\\u escapes): one line, on every code page
        if restart:
            return 0
    return 0


# ---- the caller's side: one worker, reused, killed at the deadline ---------------------------------------------

class _Worker:
    """A spawned renderer and a thread that reads its answers (a pipe cannot be waited on with a timeout on
    Windows, a queue can)."""

    def __init__(self, max_extra_memory: int):
        flags = getattr(subprocess, "CREATE_NO_WINDOW", 0)
        self.proc = subprocess.Popen([sys.executable, "-P", "-u", os.path.abspath(__file__), str(max_extra_memory)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     creationflags=flags, close_fds=True)
        self.job = _windows_job(self.proc, max_extra_memory) if sys.platform == "win32" else None
        self.answers: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True, name="template-sandbox-reader").start()
        self.memory = max_extra_memory

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.answers.put(line)
        self.answers.put(None)

    def wait(self, seconds: float, what: str):
        """The next answer, or None when the worker ended; TimeoutError past ``seconds``. Polled in short
        steps, so Ctrl-C is seen at once on every OS."""
        deadline = time.monotonic() + seconds
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(what)
            try:
                line = self.answers.get(timeout=min(left, 0.05))
            except queue.Empty:
                continue
            return None if line is None else json.loads(line)

    def kill(self) -> None:
        try:
            self.proc.kill()
        except OSError:
            pass
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass

    def how_it_ended(self) -> str:
        code = self.proc.wait()
        if code < 0:
            try:
                return f"signal {signal.Signals(-code).name}"
            except ValueError:
                return f"signal {-code}"
        return f"exit status {code:#x}" if code > 255 else f"exit status {code}"


_WORKER: _Worker | None = None
_LOCK = threading.Lock()


def worker_pid() -> int | None:
    """The pid of the running worker (None before the first render or after one was killed)."""
    w = _WORKER
    return w.proc.pid if w is not None and w.proc.poll() is None else None


def _started(max_extra_memory: int) -> _Worker:
    global _WORKER
    if _WORKER is not None and (_WORKER.proc.poll() is not None or _WORKER.memory != max_extra_memory):
        _WORKER.kill()
        _WORKER = None
    if _WORKER is None:
        w = _Worker(max_extra_memory)
        try:
            hello = w.wait(START_SECONDS, "start")
        except BaseException:
            w.kill()
            raise
        if not hello or "ready" not in hello:
            w.kill()
            why = hello["fatal"] if hello and "fatal" in hello else w.how_it_ended()
            raise TemplateRefused(f"the chat template renderer did not start ({why})")
        _WORKER = w
    return _WORKER


def render(source: str, context: dict, max_seconds: float = MAX_SECONDS, max_output: int = MAX_OUTPUT,
           max_extra_memory: int = MAX_EXTRA_MEMORY) -> str:
    """Render ``source`` with ``context`` in the worker within the limits; any failure is a :class:`TemplateRefused`."""
    global _WORKER
    request = json.dumps({"source": source, "context": context, "max_output": max_output,
                          "max_seconds": max_seconds}).encode() + b"\n"
    with _LOCK:
        try:
            w = _started(max_extra_memory)
        except TimeoutError:
            raise TemplateRefused(f"the chat template renderer did not start within {START_SECONDS:g} s") from None
        answer = None
        try:
            try:
                w.proc.stdin.write(request)
                w.proc.stdin.flush()
            except OSError:
                pass                                     # it died: its end is read below
            answer = w.wait(max_seconds, "render")
        except TimeoutError:
            raise TemplateRefused(f"chat template ran longer than {max_seconds:g} s") from None
        finally:
            if answer is None or answer.get("restart"):  # too slow, crashed, out of memory, or Ctrl-C: a new one next time
                w.kill()
                _WORKER = None
        if answer is None:
            raise TemplateRefused(f"chat template crashed its sandboxed renderer ({w.how_it_ended()})")
    if "error" in answer:
        raise TemplateRefused(answer["error"])
    return answer["text"]


def _windows_job(proc, max_extra_memory: int):
    """A job object holding the worker: killed when this process's handle closes (it dies), and its committed
    memory capped. Best effort: None where Windows (or Wine) refuses."""
    import ctypes
    from ctypes import wintypes

    class Basic(ctypes.Structure):                       # JOBOBJECT_BASIC_LIMIT_INFORMATION
        _fields_ = [("PerProcessUserTimeLimit", ctypes.c_int64), ("PerJobUserTimeLimit", ctypes.c_int64),
                    ("LimitFlags", wintypes.DWORD), ("MinimumWorkingSetSize", ctypes.c_size_t),
                    ("MaximumWorkingSetSize", ctypes.c_size_t), ("ActiveProcessLimit", wintypes.DWORD),
                    ("Affinity", ctypes.c_size_t), ("PriorityClass", wintypes.DWORD),
                    ("SchedulingClass", wintypes.DWORD)]

    class Extended(ctypes.Structure):                    # JOBOBJECT_EXTENDED_LIMIT_INFORMATION
        _fields_ = [("Basic", Basic), ("IoInfo", ctypes.c_uint64 * 6), ("ProcessMemoryLimit", ctypes.c_size_t),
                    ("JobMemoryLimit", ctypes.c_size_t), ("PeakProcessMemoryUsed", ctypes.c_size_t),
                    ("PeakJobMemoryUsed", ctypes.c_size_t)]

    k32 = ctypes.WinDLL("kernel32", use_last_error=True)
    k32.CreateJobObjectW.restype = wintypes.HANDLE
    k32.CreateJobObjectW.argtypes = [ctypes.c_void_p, wintypes.LPCWSTR]
    k32.SetInformationJobObject.argtypes = [wintypes.HANDLE, ctypes.c_int, ctypes.c_void_p, wintypes.DWORD]
    k32.AssignProcessToJobObject.argtypes = [wintypes.HANDLE, wintypes.HANDLE]
    job = k32.CreateJobObjectW(None, None)
    if not job:
        return None
    info = Extended()
    info.Basic.LimitFlags = 0x2000 | 0x100               # KILL_ON_JOB_CLOSE | PROCESS_MEMORY
    info.ProcessMemoryLimit = (96 << 20) + max_extra_memory   # an interpreter with jinja2 commits well under 96 MiB
    if not k32.SetInformationJobObject(job, 9, ctypes.byref(info), ctypes.sizeof(info)):   # ExtendedLimitInformation
        info.Basic.LimitFlags = 0x2000
        k32.SetInformationJobObject(job, 9, ctypes.byref(info), ctypes.sizeof(info))
    k32.AssignProcessToJobObject(job, wintypes.HANDLE(int(proc._handle)))
    return job                                           # kept open for the worker's life; closed when we exit


if __name__ == "__main__":
    sys.exit(serve(int(sys.argv[1]) if len(sys.argv) > 1 else MAX_EXTRA_MEMORY))
