"""``gguf-dump``: what a GGUF file holds, like llama.cpp's gguf-dump."""
from __future__ import annotations

from .. import models
from ._common import dumps, nonnegative_int
from ..ggml.gguf import GGUFFile
from ..ggml.gguf.dump import summary, to_json


def register(sub) -> None:
    p = sub.add_parser("gguf-dump", help="describe a GGUF file: metadata, hparams, tensor table")
    p.add_argument("model", nargs="?", default=models.DEFAULT_MODEL, help="registry name or path to a .gguf file")
    p.add_argument("--json", action="store_true", help="full record as JSON (arrays in full)")
    p.add_argument("--max-tensors", type=nonnegative_int, default=None, help="show at most this many tensor rows")
    p.set_defaults(func=run)


def run(args) -> int:
    with GGUFFile(models.resolve(args.model)) as f:
        if args.json:
            print(dumps(to_json(f), ensure_ascii=False))
        else:
            print(summary(f, args.max_tensors))
    return 0
