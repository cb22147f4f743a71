"""Where one decode step's time goes: each step of the compiled plan timed on its own, summed per op and
per node name, next to the whole token (the part outside the plan: graph build, sampling, the thread
governor), the thread counts the governor chose and the parallel regions per token.

The prompt is decoded first (timed as prefill), then ``--gen`` tokens one at a time (greedy), each
plan step between two ``perf_counter`` calls. Timing each step adds about a microsecond per step, so
the per-op sum is a little above the plan's own time; the machine is shared, so compare medians of
several runs (and read the load average printed first).

    python benchmarks/bench_decode_profile.py [-m smollm2] [--prompt 256] [--gen 64] [--cpu PROFILE] [--no-steps]
"""
from __future__ import annotations

import argparse
import collections
import os
import time

from llmlab import bench, models
from llmlab.generate import greedy
from llmlab.ggml.cpu import cplan, threadpool
from llmlab.ggml.cpu.fast import set_threads
from llmlab.llama import Batch, Context, Model
from llmlab.llama.vocab import Tokenizer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default="smollm2")
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("-t", "--threads", type=int, default=None)
    ap.add_argument("--cpu", default=None, help="CPU profile (as bench --cpu: arm_dotprod_fp16, arm_i8mm, ...)")
    ap.add_argument("--no-steps", action="store_true", help="time whole tokens only (no per-step timing)")
    ap.add_argument("--top", type=int, default=20, help="node names listed")
    args = ap.parse_args()
    if hasattr(os, "getloadavg"):
        print("load average %.2f %.2f %.2f" % os.getloadavg())
    set_threads(args.threads)
    path = models.resolve(args.model)
    model = Model(path, cpu=args.cpu)
    ids = bench.prompt_tokens(Tokenizer.from_model(path), args.prompt)
    ctx = Context(model, n_ctx=len(ids) + args.gen + 1, n_batch=len(ids), n_ubatch=512, kernels="fast", cpu=args.cpu)
    ctx.decode(Batch.from_tokens(ids, logits="last"))                 # warm-up, as bench does
    ctx.decode(Batch.from_tokens(ids[:1], pos0=len(ids), logits="last"))
    ctx.clear()

    by_op: dict[str, float] = collections.defaultdict(float)
    by_node: dict[str, float] = collections.defaultdict(float)
    count: collections.Counter = collections.Counter()
    plan_s, decoding, chosen = [0.0], [False], collections.Counter()
    plain = cplan.CPlan.compute

    def compute(self, capture=None, replace=None, callback=None):
        t0 = time.perf_counter()
        if decoding[0] and not args.no_steps and not (capture or replace or callback):
            for i, step in zip(self._order, self._run):
                a = time.perf_counter()
                step()
                dt = time.perf_counter() - a
                n = self.nodes[i]
                by_op[n.op] += dt
                by_node[n.name.split("-")[0]] += dt
                count[n.op] += 1
            got = {}
        else:
            got = plain(self, capture, replace, callback)
        plan_s[0] += time.perf_counter() - t0
        return got

    choose = threadpool.Governor.choose

    def counted(self, kind="token"):
        n = choose(self, kind)
        if decoding[0]:
            chosen[n] += 1
        return n

    cplan.CPlan.compute, threadpool.Governor.choose = compute, counted
    try:
        steps = greedy(ctx, ids)
        t0 = time.perf_counter()
        next(steps)
        pp = time.perf_counter() - t0
        print(f"prefill {len(ids)} tokens: {len(ids) / pp:.1f} tok/s ({plan_s[0] * 1e3:.1f} ms in the plan of "
              f"{pp * 1e3:.1f})")
        decoding[0], plan_s[0] = True, 0.0
        r0 = threadpool.region_counts()
        t0 = time.perf_counter()
        for _ in range(args.gen):
            next(steps)
        tg = time.perf_counter() - t0
        r1 = threadpool.region_counts()
    finally:
        cplan.CPlan.compute, threadpool.Governor.choose = plain, choose
    n = args.gen
    plan = ctx.backend.plan(ctx.last_graph.gf)
    print(f"decode {n} tokens: {n / tg:.2f} tok/s = {tg / n * 1e3:.3f} ms/token; in the plan {plan_s[0] / n * 1e3:.3f} ms, "
          f"outside {(tg - plan_s[0]) / n * 1e3:.3f} ms; thread counts chosen {dict(chosen)}")
    print(f"threading layer {threadpool.threading_layers()['layer']}: parallel regions per token "
          f"{(r1[0] - r0[0]) / n:.1f} on the calling thread, {(r1[1] - r0[1]) / n:.1f} woke the layer's threads")
    print(f"plan: {plan}; parallel-capable steps per token (MUL_MAT, SOFT_MAX): "
          f"{sum(1 for i in plan._order if plan.nodes[i].op in ('MUL_MAT', 'SOFT_MAX'))}")
    if args.no_steps:
        return
    print(f"steps timed: {sum(by_op.values()) / n * 1e3:.3f} ms/token")
    for op, s in sorted(by_op.items(), key=lambda kv: -kv[1]):
        print(f"  {op:10s} {s / n * 1e3:7.3f} ms/token  {count[op] // n:4d} steps  {s / count[op] * 1e6:7.1f} us each")
    for name, s in sorted(by_node.items(), key=lambda kv: -kv[1])[:args.top]:
        print(f"  {name:20s} {s / n * 1e3:7.3f} ms/token")


if __name__ == "__main__":
    main()
