"""Quantized matmul speed: the fast (numba) kernels next to the NumPy reference, on the decode shapes
(one activation row) of the two real models, and the effective matvec time of one decoded token.

For every distinct (type, K, R) weight of the model (the token embedding counted once more as the tied
LM head), the real weight bytes from the GGUF file go through ``llmlab.ggml.cpu.fast.mul_mat_quantized``
and ``llmlab.ggml.cpu.ops.mul_mat_quantized`` (same path: q4_K in the REPACK buffer where rows % 8 == 0,
as ops.mul_mat decides). Times are the minimum over repeats (the machine is shared: take the min);
GB/s = weight bytes read per call / time. The per-token sum multiplies each shape by its count.

    python benchmarks/bench_kernels.py [--models smollm2,gemma3] [--threads 1,2] [--T 1] [--no-ref]
"""
from __future__ import annotations

import argparse
import collections
import time

import numpy as np

from llmlab import models
from llmlab.ggml.cpu import fast, profiles
from llmlab.ggml.cpu.ops import quantized_path
from llmlab.ggml.cpu.ops import mul_mat_quantized as reference
from llmlab.ggml.gguf import GGUFFile


def best_time(fn, min_reps=5, budget_s=0.5, max_reps=200, cpu=None) -> float:
    """Minimum wall time over repeats; ``cpu`` (a list) receives the minimum process CPU time per call
    (all threads together: less affected by other processes on a shared machine)."""
    fn()
    best, best_cpu, spent, n = float("inf"), float("inf"), 0.0, 0
    while n < min_reps or (spent < budget_s and n < max_reps):
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        best, best_cpu, spent, n = min(best, dt), min(best_cpu, dc), spent + dt, n + 1
    if cpu is not None:
        cpu.append(best_cpu)
    return best


def weight_shapes(gguf: GGUFFile):
    """{(tensor, type, K, R, repacked): count per token} for the model's quantized 2-D weights."""
    groups = collections.OrderedDict()
    for t in gguf.tensors:
        t = t if hasattr(t, "type") else gguf.tensor(t)
        if t.type.block_size == 1 or len(t.shape) != 2:
            continue
        K, R = t.shape
        kind = "lm_head(token_embd)" if t.name == "token_embd.weight" else t.name.split(".", 2)[-1]
        key = (kind, t.type.name, K, R, t.type.name == "q4_k" and R % 8 == 0)
        if key not in groups:
            groups[key] = [t, 0]
        groups[key][1] += 1
    return groups


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="smollm2,gemma3")
    ap.add_argument("--threads", default=None, help="comma list, e.g. 1,2 (default: LLMLAB_THREADS, else the physical cores)")
    ap.add_argument("--T", type=int, default=1, help="activation rows (1 = a decode step)")
    ap.add_argument("--no-ref", action="store_true", help="skip the NumPy reference timings")
    args = ap.parse_args(argv)
    threads = [int(n) for n in args.threads.split(",")] if args.threads else [fast.thread_count()]
    rng = np.random.default_rng(0)
    for m in args.models.split(","):
        g = GGUFFile(models.resolve(m))
        shapes = weight_shapes(g)
        fast.clear_cache()
        print(f"\n== {m}: T={args.T}  ({len(shapes)} distinct weight shapes)")
        hdr = f"{'weight':28s} {'type':5s} {'K':>5s} {'R':>7s} {'path':8s} {'n':>3s} {'MB':>7s}"
        for n in threads:
            hdr += f" {'fast@' + str(n) + ' us':>12s} {'GB/s':>6s} {'cpu us':>9s}"
        if not args.no_ref:
            hdr += f" {'numpy us':>11s} {'GB/s':>6s} {'speedup':>8s}"
        print(hdr)
        totals = {n: 0.0 for n in threads}
        cpus = {n: 0.0 for n in threads}
        total_ref, total_bytes = 0.0, 0
        for (kind, tname, K, R, rp), (t, count) in shapes.items():
            raw = np.asarray(t.data).reshape(R, -1)
            x = rng.standard_normal((args.T, K)).astype(np.float32)
            path = quantized_path(t.type, args.T, rp, profiles.resolve(None))
            line = f"{kind:28s} {tname:5s} {K:5d} {R:7d} {path:8s} {count:3d} {raw.nbytes / 1e6:7.2f}"
            run = (fast.bind(raw, t.type, rp) if hasattr(fast, "bind")   # as a graph plan binds a node
                   else lambda x, raw=raw, t=t, rp=rp: fast.mul_mat_quantized(raw, t.type, x, rp))
            run(x)                                                       # pack + compile outside the timing
            for n in threads:
                fast.set_threads(n)
                run(x)
                cpu = []
                dt = best_time(lambda: run(x), cpu=cpu)
                totals[n] += dt * count
                cpus[n] += cpu[0] * count
                line += f" {dt * 1e6:12.1f} {raw.nbytes / dt / 1e9:6.2f} {cpu[0] * 1e6:9.1f}"
            total_bytes += raw.nbytes * count
            if not args.no_ref:
                big = raw.nbytes > 20e6
                dr = best_time(lambda: reference(raw, t.type, x, rp), min_reps=1 if big else 3, budget_s=0.2)
                total_ref += dr * count
                line += f" {dr * 1e6:11.0f} {raw.nbytes / dr / 1e9:6.2f} {dr / dt:8.1f}"
            print(line, flush=True)
        print(f"per token: {total_bytes / 1e6:.1f} MB of weights; packed copies held: {fast.packed_nbytes() / 1e6:.1f} MB")
        for n in threads:
            print(f"  fast, {n} thread(s): matvecs {totals[n] * 1e3:8.2f} ms/token -> {total_bytes / totals[n] / 1e9:5.2f} GB/s, "
                  f"at most {1 / totals[n]:6.1f} tok/s from the matmuls alone; CPU {cpus[n] * 1e3:8.2f} ms/token")
        if not args.no_ref:
            print(f"  numpy reference:     matvecs {total_ref * 1e3:8.2f} ms/token")
        fast.set_threads()


if __name__ == "__main__":
    main()
