"""Tokenizer throughput: llmlab against llama.cpp (llama-cpp-python, vocab only) on the same text.

    python benchmarks/bench_tokenizer.py [--repeat 3]

For each model and text it checks that the ids are identical, then prints MB/s (UTF-8 bytes of
input per second) for llama.cpp, for llmlab with empty caches (every distinct word or chunk
merged once, as on a first call) and with warm caches (a second pass), and the cold ratio.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # this checkout's llmlab

from llmlab import models
from llmlab.ggml.gguf import GGUFFile
from llmlab.llama.vocab import Tokenizer, Vocab

DATA = Path(__file__).resolve().parent.parent / "llmlab" / "data"
TEXTS = {"English (Python docs)": DATA / "english_python_docs.txt",
         "Chinese (course notes)": DATA / "zh_inference_notes.txt"}


def best_of(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    from llmlab.llamacpp import available, session
    from llmlab.llamacpp.worker import isolated
    if not available():
        print("llama-cpp-python is not installed: llmlab figures only")

    for name in ("smollm2", "gemma3"):
        path = models.resolve(name)
        t = time.perf_counter()
        with GGUFFile(path) as f:
            vocab = Vocab.from_gguf(f)
        t_vocab = time.perf_counter() - t
        tok = Tokenizer(vocab)
        t = time.perf_counter()
        tok.tokenize("warm up the lazily built tables: 文")
        t_first = time.perf_counter() - t
        print(f"\n{name}: {tok!r}; vocabulary loaded in {t_vocab * 1e3:.0f} ms "
              f"(+{t_first * 1e3:.0f} ms of lazy tables on the first call)")
        print(f"  {'text':<24}{'KB':>6}{'tokens':>8}{'llama.cpp':>11}{'llmlab cold':>13}{'warm':>8}{'ratio':>7}")
        for label, file in TEXTS.items():
            text = file.read_text(encoding="utf-8")
            raw = text.encode()
            mb = len(raw) / 1e6

            def cold():
                tok.algorithm._cache.clear()
                return tok.tokenize(text)
            ids = cold()
            t_cold = best_of(cold, args.repeat)
            t_warm = best_of(lambda: tok.tokenize(text), args.repeat)
            row = f"  {label:<24}{len(raw) / 1e3:>6.0f}{len(ids):>8}"
            if available():            # timed in the llama.cpp worker process, without the trip there
                ref, t_ref = isolated(session.tokenize_timed, str(path), raw, args.repeat)
                assert ids == ref, f"{name}: ids differ from llama.cpp on {file.name}"
                row += f"{mb / t_ref:>8.2f} MB/s"
            else:
                row += f"{'-':>13}"
            row += f"{mb / t_cold:>8.2f} MB/s{mb / t_warm:>6.2f}"
            if available():
                row += f"{t_ref / t_cold:>7.2f}x"
            print(row)


if __name__ == "__main__":
    main()
