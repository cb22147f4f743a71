"""``plug``: run generation with the learner's own functions plugged into the engine (``llmlab.plug``).

    python -m llmlab plug --list [--json]
    python -m llmlab plug -m MODEL -p PROMPT [-n N] --slot NAME=FILE.py[:FUNC] [--slot ...] [--json]

``--slot NAME=reference`` plugs the slot's reference solution, ``NAME=skeleton`` the learner's
edition. Per slot: bit-identical, close, different or error, the first node that departs and a hint.
The exit status is 0 whatever the verdicts (a verdict is a result, not an error); bad input (an
unknown slot, a file that does not load) is one ``error:`` line and status 2.
"""
from __future__ import annotations

import json
import sys

from .. import LLMLabError, models
from ._common import dumps, parse_float, parse_int, positive_int
from ._cpu import add_cpu_argument, resolve_cpu


def register(sub) -> None:
    p = sub.add_parser("plug", help="run generation with your own functions plugged into the engine, "
                                    "diffed node by node against llama.cpp's path")
    p.add_argument("--list", action="store_true", help="list the slots (name, notebook, signature, use)")
    p.add_argument("-m", "--model", default=models.DEFAULT_MODEL, help="registry name or path to a .gguf file")
    p.add_argument("-p", "--prompt", default=None, help="prompt text (tokenized with BOS and special tokens)")
    p.add_argument("-n", "--n-predict", type=positive_int, default=4, help="tokens to generate (default 4)")
    p.add_argument("--slot", action="append", default=[], metavar="NAME=FILE.py[:FUNC]",
                   help="plug a function into a slot (repeatable); FILE may be 'reference' or 'skeleton'")
    p.add_argument("--temp", type=parse_float, default=0.0,
                   help="temperature; 0 is greedy (default; a sampling slot switches to llama.cpp's default chain)")
    p.add_argument("-s", "--seed", type=parse_int, default=42, help="seed of a sampled generation (default 42)")
    p.add_argument("--time-limit", type=parse_float, default=10.0, help="seconds one call of a function may take")
    p.add_argument("--no-oracle", action="store_true", help="do not run the installed llama.cpp")
    add_cpu_argument(p)
    p.add_argument("--json", action="store_true", help="print one JSON object (see the README)")
    p.set_defaults(func=run)


def _list(args) -> int:
    from ..plug import list_slots
    ss = list_slots()
    if args.json:
        print(json.dumps({"slots": [s.to_json() for s in ss],
                          "notebooks": sorted({s.notebook for s in ss})}, ensure_ascii=False))
        return 0
    for s in ss:
        print(f"{s.notebook}  {s.name:<12} {s.signature}")
        print(f"    used for: {s.used_for}; models: {', '.join(s.models) or '-'}")
    return 0


def run(args) -> int:
    if args.list:
        return _list(args)
    from ..plug import get_slot, load_function
    from ..plug.runner import run as plug_run
    if not args.slot:
        raise LLMLabError("give at least one --slot NAME=FILE.py[:FUNC] (or --list)")
    if args.prompt is None:
        raise LLMLabError("give a prompt with -p")
    if not args.time_limit > 0:
        raise LLMLabError("--time-limit must be positive")
    plugs, sources = {}, {}
    for spec in args.slot:
        name, eq, src = spec.partition("=")
        if not eq or not src:
            raise LLMLabError(f"--slot {spec!r}: expected NAME=FILE.py[:FUNC], NAME=reference or NAME=skeleton")
        slot = get_slot(name.strip())
        if slot.name in plugs:
            raise LLMLabError(f"slot {slot.name} given twice")
        if src in ("reference", "skeleton"):
            plugs[slot.name], sources[slot.name] = src, src
        else:
            plugs[slot.name], sources[slot.name] = load_function(src, slot.function)
    cpu = resolve_cpu(args)
    report = plug_run(args.model, args.prompt, args.n_predict, plugs, cpu=cpu, limit=args.time_limit,
                      temp=args.temp, seed=args.seed, oracle=not args.no_oracle, sources=sources)
    if args.json:
        print(dumps(report.to_json(), ensure_ascii=False))
    else:
        sys.stdout.write(report.summary() + "\n")
    return 0
