"""``python -m llmlab COMMAND``: tools in the spirit of llama.cpp's (gguf-dump, tokenize, ...).

Each module in this package that defines ``register(subparsers)`` adds one
command, so a new tool is a new file, not an edit here. A command's handler
returns an exit code; user errors (bad model, corrupt file, bad input) are
printed as one ``error:`` line with exit status 2, never as a traceback.
"""
from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import re
import signal
import sys
import traceback
import warnings

from .. import LLMLabError, __version__, config


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m llmlab",
                                     description="llmlab: llama.cpp rebuilt layer by layer; tools in the spirit of llama.cpp's own.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        mod = importlib.import_module(f"{__name__}.{info.name}")
        if hasattr(mod, "register"):
            mod.register(sub)
    parser.add_argument("--version", action="version", version=f"llmlab {__version__}", help="print llmlab's version and exit")
    debug_help = "on an error, show the Python traceback too"
    parser.add_argument("--debug", action="store_true", help=debug_help)
    for p in set(sub.choices.values()):   # also after the command: python -m llmlab logits --debug ...
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=debug_help)
        p._negative_number_matcher = NEGATIVE_NUMBER   # --presence-penalty -1e-3 is a value, not an option
    return parser


# what argparse takes for a negative number rather than an option: its own '-1' and '-.5', and exponents too
NEGATIVE_NUMBER = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


def _hard_interrupt(signum, frame):
    os.write(2, b"interrupted\n")
    os._exit(130)


_NO_UNWIND = ("numba", "llvmlite")


def _interrupt(signum, frame):
    """Ctrl-C while a command runs: unwind with KeyboardInterrupt (so what it writes is cleaned up),
    except inside numba's compiler, whose callbacks from LLVM swallow exceptions: there nothing of
    ours is half-written, so exit at once."""
    f = frame
    while f is not None:
        if str(f.f_globals.get("__name__", "")).startswith(_NO_UNWIND):
            _hard_interrupt(signum, frame)
        f = f.f_back
    raise KeyboardInterrupt


def _owns_sigint() -> bool:
    """True when ``python -m llmlab`` installed its early Ctrl-C handler (not when a test calls main)."""
    try:
        return getattr(signal.getsignal(signal.SIGINT), "__name__", "") == "_interrupted"
    except ValueError:
        return False


def main(argv: list[str] | None = None) -> int:
    """Run one command. Bad input is one ``error:`` line and exit 2 (``--debug``: the traceback too);
    Ctrl-C at any moment is one ``interrupted`` line and exit 130."""
    cli = _owns_sigint()
    utf8_output()
    try:
        return _run(argv, cli)
    except KeyboardInterrupt:
        if cli:
            _on_signals(_hard_interrupt)
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        if cli:          # from here to the exit a second Ctrl-C exits at once, without a traceback
            _on_signals(_hard_interrupt)


def _on_signals(handler) -> None:
    """Ctrl-C and SIGTERM alike (and Ctrl-Break on Windows): each ends a command with ``interrupted``,
    exit 130, after cleaning up."""
    for name in INTERRUPTS:
        signal.signal(getattr(signal, name), handler)


INTERRUPTS = tuple(n for n in ("SIGINT", "SIGTERM", "SIGBREAK") if hasattr(signal, n))   # those this OS has


def utf8_output() -> None:
    """Text out as UTF-8 on Windows too: a pipe or a file there gets the ANSI code page (cp1252), which
    cannot write a tokenizer's pieces or a Chinese reply (UnicodeEncodeError, or '?' garbage). Elsewhere
    the locale's encoding is left alone (it is UTF-8 on every supported setup)."""
    if sys.platform != "win32":
        return
    errors = {"stdin": "surrogateescape", "stdout": "strict", "stderr": "backslashreplace"}
    for name, err in errors.items():     # stdin as on POSIX: a line that is not UTF-8 keeps its bytes (chat says so)
        stream = getattr(sys, name)
        enc = (getattr(stream, "encoding", None) or "").lower().replace("-", "")
        if enc != "utf8" and hasattr(stream, "reconfigure"):
            try:
                stream.reconfigure(encoding="utf-8", errors=err)
            except (ValueError, OSError):
                pass


def _run(argv, cli: bool) -> int:
    try:          # the commands import llmlab's engine (numba, its kernel cache): a fault there is one error line too
        parser = build_parser()
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as e:     # noqa: BLE001
        return _failed(e, config.debug() or "--debug" in (sys.argv[1:] if argv is None else argv))
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:     # usage errors (argparse's usage and error lines: 2), --help and --version (0)
        return e.code if isinstance(e.code, int) else 0 if e.code is None else 2
    debug = getattr(args, "debug", False) or config.debug()
    if not debug:        # numpy's overflow/NaN warnings: a non-finite result is reported as one error instead
        warnings.simplefilter("ignore", RuntimeWarning)
    if cli:              # from here Ctrl-C (and SIGTERM) unwinds, so what a command writes is cleaned up
        _on_signals(_interrupt)
    try:
        return args.func(args) or 0
    except BrokenPipeError:   # output piped into head & co.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        raise
    except Exception as e:     # noqa: BLE001
        return _failed(e, debug)


def _failed(e: Exception, debug: bool) -> int:
    """One ``error:`` line for ``e`` (and the traceback with ``--debug``): exit status 2."""
    _debug(debug)
    if isinstance(e, MemoryError):
        print("error: out of memory: the input asks for more memory than this machine can give", file=sys.stderr)
    elif isinstance(e, (LLMLabError, ValueError, KeyError, OSError, UnicodeError)):
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"error: {_one_line(msg)}", file=sys.stderr)
    else:          # a bug, most likely reached by odd input: still one line (and the traceback with --debug)
        print(f"error: unexpected {type(e).__name__}: {_one_line(e)} (rerun with --debug for the traceback)",
              file=sys.stderr)
    return 2


def _one_line(msg) -> str:
    """One line, with what a terminal would act on (ESC, BEL, CR from a file's strings) escaped."""
    from ..safeio import printable
    return printable(" ".join(str(msg).split("\n")).strip()) or "(no message)"


def _debug(on: bool) -> None:
    if on:
        traceback.print_exc()


if __name__ == "__main__":
    sys.exit(main())
