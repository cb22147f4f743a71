"""Open time of llmlab's GGUF reader vs gguf-py's GGUFReader, side by side on both real models.

Opening = header, all metadata, the tensor directory (no tensor data is read by either).
llmlab decodes string arrays lazily, so it is also timed with every string decoded
(``tolist()`` on the 49,152 / 262,144-token vocabularies), the fairest comparison.

    python benchmarks/bench_gguf_open.py [--repeat N]
"""
from __future__ import annotations

import argparse
import time

from llmlab import models
from llmlab.ggml.gguf import GGUFFile, StringArray


def best_of(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def open_llmlab(path):
    with GGUFFile(path) as f:
        return len(f.tensors)


def open_llmlab_decoded(path):
    with GGUFFile(path) as f:
        for v in f.kv.values():
            if isinstance(v, StringArray):
                v.tolist()
        return len(f.tensors)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    import gguf

    print(f"{'model':<9} {'gguf-py':>9} {'llmlab':>9} {'ratio':>7} {'llmlab+decode':>14} {'ratio':>7}")
    for name in models.REGISTRY:
        path = models.resolve(name)
        ref = best_of(lambda: gguf.GGUFReader(path), max(1, args.repeat // 2))
        lazy = best_of(lambda: open_llmlab(path), args.repeat)
        full = best_of(lambda: open_llmlab_decoded(path), args.repeat)
        print(f"{name:<9} {ref:>8.3f}s {lazy:>8.3f}s {ref / lazy:>6.0f}x {full:>13.3f}s {ref / full:>6.0f}x")


if __name__ == "__main__":
    main()
