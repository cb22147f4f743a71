"""Tiny random models of the architectures llmlab compares with llama.cpp node by node (qwen3, qwen3moe,
deepseek2): every shape of ``llmlab.llama.tiny_zoo`` in every weight type.

    python tools/gen_tiny_models.py OUTDIR [--arch A ...] [--wtype T ...] [--seed N] [--vocab-from MODEL]

Each file is a real GGUF written by llmlab's own writer with llama.cpp's tensor names and metadata
keys (``OUTDIR/<arch>-s<shape>-<wtype>.gguf``, 60 KB to 2.5 MB with a 256-token vocabulary).
``--vocab-from smollm2`` copies a real tokenizer so that llama.cpp loads them too (the LM head then
has 49152 rows). The tests do not read these files: they draw their own shapes and seeds at test time
(tests/test_arch_zoo.py); this tool is for looking at one, or for handing a set to someone.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from llmlab.llama import tiny_zoo  # noqa: E402
from llmlab.llama.tiny import write_tiny  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--arch", action="append", choices=sorted(tiny_zoo.SHAPES))
    ap.add_argument("--wtype", action="append", choices=tiny_zoo.WTYPES)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vocab-from", default=None, help="a registry name or .gguf whose tokenizer to copy")
    a = ap.parse_args(argv)
    vocab = None
    if a.vocab_from:
        from llmlab import models
        vocab = models.resolve(a.vocab_from)
    a.outdir.mkdir(parents=True, exist_ok=True)
    for arch in a.arch or sorted(tiny_zoo.SHAPES):
        for i, shape in enumerate(tiny_zoo.SHAPES[arch]):
            for wtype in a.wtype or tiny_zoo.WTYPES:
                p = write_tiny(a.outdir / f"{arch}-s{i}-{wtype}.gguf", arch, vocab_from=vocab,
                               seed=a.seed + i, wtype=wtype, **tiny_zoo.scaled(shape, wtype))
                print(f"{p}  {p.stat().st_size:>9,} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
