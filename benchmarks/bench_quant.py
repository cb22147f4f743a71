"""The quant type table: bits per weight, RMS error on a real tensor, and dequantize speed of
llmlab.ggml.quant next to gguf-py's (same input, same run, ratio printed).

The real tensor is 400 rows of Gemma 3's token embedding (q8_0 in the file, decoded to float32).
Dequantize speed is measured on 4 MB of blocks of each type (quantized from that tensor where
llmlab has a quantizer, random blocks with tame scales otherwise), best of --repeat runs.

    python benchmarks/bench_quant.py [--repeat N] [--mb MB]
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import llmlab.ggml.quant as Q
from llmlab import models
from llmlab.ggml.gguf import GGUFFile
from llmlab.ggml.quant.checklist import rms_error, same_bits
from llmlab.ggml.quant.core import random_blocks
from llmlab.ggml.types import TYPES

try:
    import gguf
    from gguf import GGMLQuantizationType as G
except ImportError:       # gguf-py is a dev dependency
    gguf = None


def best_of(fn, repeat):
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def blocks_for(t, x, nbytes, rng):
    n_blocks = max(1, nbytes // t.type_size)
    if t.from_float is not None:
        m = x.size // t.block_size * t.block_size
        raw = Q.quantize(x[:m], t)
        return np.resize(raw.reshape(-1, t.type_size), (n_blocks, t.type_size)).reshape(-1)
    return random_blocks(t, n_blocks, int(rng.integers(1 << 31)), scale=1.0)


def main(argv=None) -> int:
    np.seterr(all="ignore")        # random i-quant blocks may hold inf/NaN scales
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--mb", type=float, default=4.0, help="MB of quantized blocks per speed measurement")
    args = ap.parse_args(argv)

    with GGUFFile(models.resolve("gemma3")) as f:
        emb = f.tensor("token_embd.weight")
        rb = emb.type.row_size(emb.shape[0])
        x = Q.dequantize(emb.data[1000 * rb:1400 * rb], emb.type)
    rng = np.random.default_rng(0)
    print(f"real tensor: gemma3 token_embd.weight rows 1000-1399 ({x.size} values); {args.mb:g} MB per speed test\n")
    print(f"{'type':<8} {'bpw':>6} {'RMS err':>9} {'llmlab MB/s':>12} {'gguf-py MB/s':>13} {'ratio':>6}  same bits")
    for t in TYPES.values():
        if t.removed or t.to_float is None:
            continue
        err = f"{rms_error(x[: x.size // t.block_size * t.block_size], t):.5f}" if t.from_float else "-"
        raw = blocks_for(t, x, int(args.mb * 1e6), rng)
        ours = raw.size / best_of(lambda: Q.dequantize(raw, t), args.repeat) / 1e6
        theirs, ratio, same = "-", "", ""
        if gguf is not None and t.name.upper() in G.__members__ and t.name != "q8_1":
            gt = G[t.name.upper()]
            if t.name == "f32":                 # gguf-py returns a view of the input for f32
                print(f"{t.name:<8} {t.bits_per_weight:>6.3f} {err:>9} {ours:>12.0f} {'(a view)':>13} {'':>6}  yes")
                continue
            try:
                ref = gguf.quants.dequantize(raw, gt)
                mbps = raw.size / best_of(lambda: gguf.quants.dequantize(raw, gt), args.repeat) / 1e6
                theirs, ratio = f"{mbps:.0f}", f"{ours / mbps:.2f}"
                same = "yes" if same_bits(Q.dequantize(raw, t), ref) else "NO"
            except NotImplementedError:
                pass
        print(f"{t.name:<8} {t.bits_per_weight:>6.3f} {err:>9} {ours:>12.0f} {theirs:>13} {ratio:>6}  {same}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
