"""``models`` and ``fetch``: the model registry and its cache."""
from __future__ import annotations

from .. import models
from ..safeio import printable
from ._common import dumps


def register(sub) -> None:
    p = sub.add_parser("models", help="list the known models and whether they are cached")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run_models)
    p = sub.add_parser("fetch", help="download, verify and cache a known model")
    p.add_argument("name", nargs="?", default=models.DEFAULT_MODEL, choices=list(models.REGISTRY))
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run_fetch)


def run_models(args) -> int:
    rows = models.listing()
    if args.json:
        print(dumps(rows, indent=2))
        return 0
    print(f"{'name':<10} {'file':<36} {'size':>10}  {'cached':<6}  path")
    for r in rows:       # paths come from LLMLAB_HOME: what a terminal would act on in them is escaped
        name = r["name"] + ("*" if r["default"] else "")
        print(f"{name:<10} {r['file']:<36} {r['size'] / 1e6:>7.1f} MB  {'yes' if r['cached'] else 'no':<6}  "
              f"{printable(r['path'])}")
    print("(* default model; cache folder:", printable(models.home()), "- set LLMLAB_HOME to move it)")
    return 0


def run_fetch(args) -> int:
    path = models.fetch(args.name, quiet=args.quiet, verify=True)
    print(path)
    return 0
