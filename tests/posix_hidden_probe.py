"""Run as a script: import every llmlab module, then run a few commands, as on Windows: ``fcntl``,
``resource``, ``termios``, ``pwd`` and ``grp`` cannot be imported by llmlab, ``os.fork`` does not
exist and nothing under /proc can be opened. Prints one ``FAIL <what>: <why>`` line per failure and
``ok <n>`` at the end (exit status 1 on any failure). Used by tests/test_portable.py."""
from __future__ import annotations

import builtins
import importlib
import importlib.abc
import io
import os
import pkgutil
import sys
import traceback

HIDDEN = {"fcntl", "resource", "termios", "pwd", "grp"}


class Hide(importlib.abc.MetaPathFinder):
    """Refuse the POSIX-only modules to importers in llmlab (third-party libraries guard their own)."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] not in HIDDEN:
            return None
        f = sys._getframe(1)
        while f is not None and f.f_globals.get("__name__", "").startswith(("importlib", "_frozen_importlib")):
            f = f.f_back
        if f is not None and str(f.f_globals.get("__name__", "")).startswith("llmlab"):
            raise ModuleNotFoundError(f"No module named {name!r} (hidden: not on Windows)", name=name)
        return None


def _proc(path) -> bool:
    try:
        p = os.fsdecode(os.fspath(path))
    except TypeError:
        return False
    return p == "/proc" or p.startswith("/proc/")


def _no_proc(fn):
    def wrapper(file, *a, **k):
        if not isinstance(file, int) and _proc(file):
            raise FileNotFoundError(2, "No such file or directory (hidden: no /proc)", os.fspath(file))
        return fn(file, *a, **k)
    return wrapper


def _hidden_import(name, globals=None, locals=None, fromlist=(), level=0, _real=builtins.__import__):
    """``import fcntl`` in an llmlab module fails even when a library already imported it (sys.modules)."""
    if level == 0 and name.split(".")[0] in HIDDEN and str((globals or {}).get("__name__", "")).startswith("llmlab"):
        raise ModuleNotFoundError(f"No module named {name!r} (hidden: not on Windows)", name=name)
    return _real(name, globals, locals, fromlist, level)


sys.meta_path.insert(0, Hide())
builtins.__import__ = _hidden_import
for mod in HIDDEN:
    if mod in sys.modules and not mod.startswith("llmlab"):
        sys.modules.pop(mod)          # imported by the interpreter's start-up: an llmlab import must find it again
for name in ("fork", "forkpty", "register_at_fork"):
    if hasattr(os, name):
        delattr(os, name)
builtins.open = io.open = _no_proc(io.open)
os.open = _no_proc(os.open)

failed = 0
import llmlab  # noqa: E402

names = []
for info in pkgutil.walk_packages(llmlab.__path__, "llmlab."):
    names.append(info.name)
for name in sorted(names):
    if name == "llmlab.__main__":
        continue                      # runs the command line: imported below through runpy
    try:
        importlib.import_module(name)
    except Exception as e:            # noqa: BLE001 - every module's failure is reported
        failed += 1
        print(f"FAIL import {name}: {type(e).__name__}: {e}")

import contextlib  # noqa: E402
import runpy  # noqa: E402
import tempfile  # noqa: E402


def library_calls():
    """What the commands reach without /proc, fcntl or resource: safe reads in a folder whose name has a
    space and a non-ASCII letter, the peak memory, a chat template's render."""
    from llmlab import bench, safeio
    from llmlab.llama import chat
    with tempfile.TemporaryDirectory(prefix="Zoë dir ") as d:
        p = os.path.join(d, "a b ü.txt")
        with safeio.atomic_write(p) as fh:
            fh.write(b"line\r\nnext")
        assert safeio.read_regular(p, 100) == b"line\r\nnext"
    assert bench.peak_rss_mb() >= 0.0
    out = chat.render_jinja("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}",
                            [{"role": "user", "content": "héllo"}])
    assert out == "<user>héllo", out


try:
    library_calls()
except Exception:                     # noqa: BLE001
    failed += 1
    print(f"FAIL library calls:\n{traceback.format_exc()}")

for argv in (["--version"], ["doctor", "--cli"], ["doctor", "--cli", "--json"]) + tuple(
        a.split("\x00") for a in sys.argv[1:]):
    out = io.StringIO()
    sys.argv = ["llmlab", *argv]
    code = None
    real_exit = os._exit
    try:
        os._exit = lambda c: (_ for _ in ()).throw(SystemExit(c))       # __main__ leaves through os._exit
        with contextlib.redirect_stdout(out):
            runpy.run_module("llmlab", run_name="__main__", alter_sys=False)
    except SystemExit as e:
        code = e.code
    except Exception:                 # noqa: BLE001
        code = "traceback"
        print(f"FAIL {' '.join(argv)}:\n{traceback.format_exc()}")
    finally:
        os._exit = real_exit
    if code not in (0, 1) or (argv[0] == "--version" and "llmlab" not in out.getvalue()):
        failed += 1
        print(f"FAIL {' '.join(argv)}: exit {code!r}; output: {out.getvalue()[-2000:]!r}")
    else:
        print(f"ran {' '.join(argv)}: exit {code}")
print(f"ok {len(names)}" if not failed else f"{failed} failures")
sys.stdout.flush()
real_exit = os._exit
real_exit(1 if failed else 0)
