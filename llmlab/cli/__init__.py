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
import sys

from .. import LLMLabError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m llmlab", description="llmlab: llama.cpp rebuilt layer by layer; tools in the spirit of llama.cpp's own.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        mod = importlib.import_module(f"{__name__}.{info.name}")
        if hasattr(mod, "register"):
            mod.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args) or 0
    except BrokenPipeError:   # output piped into head & co.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (LLMLabError, ValueError, KeyError, OSError, UnicodeError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
