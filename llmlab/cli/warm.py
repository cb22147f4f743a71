"""``warm``: compile the fast kernels a model runs (once per machine) or load them from numba's cache,
with progress, so that a first generation measures the engine, not the compiler. ``make demo`` and
``make lab`` run it; it is the step for other set-ups (a JupyterHub image, a classroom machine)."""
from __future__ import annotations

import sys

from .. import models
from ..progress import Progress
from ._cpu import add_cpu_argument, resolve_cpu


def register(sub) -> None:
    p = sub.add_parser("warm", help="compile the fast kernels once per machine (or load them from numba's cache)")
    p.add_argument("-m", "--model", action="append", default=None,
                   help="registry name or path to a .gguf file (repeatable; default: the default model)")
    add_cpu_argument(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from ..llama import Model
    from ..warm import STAGES, warm
    cpu = resolve_cpu(args)
    for name in args.model or [models.DEFAULT_MODEL]:
        model = Model(models.resolve(name), cpu=cpu)
        from ..ggml.cpu import fast, shipped_kernels  # noqa: F401 (importing the kernels chooses their target)
        t = shipped_kernels.active()
        print(f"warming the kernels for {name} (compiled for {t.name}, shipped with llmlab: loaded in seconds)" if t else
              f"warming the kernels for {name} (the first time on a machine numba compiles them, a minute or two; "
              f"later runs load them in seconds)", file=sys.stderr)
        bar = Progress(len(STAGES), "kernels", enabled=sys.stderr.isatty())
        w = warm(model, cpu, progress=lambda i, stage: bar.update(i) if bar.enabled else
                 print(f"  {i + 1}/{len(STAGES)} {stage}", file=sys.stderr, flush=True))
        bar.update(len(STAGES))
        bar.close()
        print(w.summary())
    return 0
