"""``bench``: prompt and generation speed, optionally against llama.cpp in the same run (like llama-bench)."""
from __future__ import annotations

import gc
import json
import sys

from .. import models
from ._common import parse_int, positive_int
from ._cpu import add_cpu_argument, add_kernels_argument, resolve_cpu


def register(sub) -> None:
    p = sub.add_parser("bench", help="prefill and decode tokens/s (and llama.cpp's, with --vs-llama-cpp)")
    p.add_argument("-m", "--model", default=models.DEFAULT_MODEL, help="registry name or path to a .gguf file")
    p.add_argument("-t", "--threads", type=positive_int, default=None, help="threads (default: LLMLAB_THREADS, else the physical cores)")
    p.add_argument("--prompt-tokens", type=parse_int, default=256, help="prompt length (default 256)")
    p.add_argument("--gen-tokens", type=parse_int, default=128, help="tokens to generate (default 128)")
    add_kernels_argument(p)
    p.add_argument("--vs-llama-cpp", action="store_true", help="measure llama.cpp (llama-cpp-python) in the same run")
    p.add_argument("--first-token", action="store_true",
                   help="also time a whole `generate -n 1` process, warm and cold numba cache")
    p.add_argument("--load", type=parse_int, default=0, metavar="N",
                   help="keep N other processes busy (one core each) while both engines are measured (default 0)")
    p.add_argument("--repeat", type=parse_int, default=1, metavar="N",
                   help="measure N rounds, the engines' order alternating each round; report medians (default 1)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_cpu_argument(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from .. import bench
    from ..ggml.cpu.fast import set_threads

    if args.prompt_tokens < 10 or args.gen_tokens < 0:
        raise ValueError("--prompt-tokens must be at least 10 and --gen-tokens at least 0")
    if not 0 <= args.load <= 64:
        raise ValueError("--load must be between 0 and 64 busy processes")
    if not 1 <= args.repeat <= 50:
        raise ValueError("--repeat must be between 1 and 50 rounds")
    threads = set_threads(args.threads)
    path = models.resolve(args.model)
    ids, wb = _prompt(path, args.prompt_tokens, args.gen_tokens)
    prof = resolve_cpu(args)
    cpu = prof.name
    short = bench.SHORT_PROMPT if args.prompt_tokens > bench.SHORT_PROMPT else 0     # both contexts, one run
    rounds = []
    for r in range(args.repeat):          # a shared machine drifts: rounds alternate which engine goes first
        order = ("llmlab", "llama.cpp") if r % 2 == 0 else ("llama.cpp", "llmlab")
        got = {}
        for engine in order:
            if engine == "llama.cpp" and not args.vs_llama_cpp:
                continue
            with bench.busy(args.load):
                if engine == "llmlab":
                    side = bench.run_llmlab(path, ids, args.gen_tokens, threads, cpu=prof, kernels=args.kernels,
                                            short=short)
                else:
                    side = bench.run_llama_cpp(path, ids, args.gen_tokens, threads, short=short)
            if not short and args.gen_tokens:           # the prompt is the short one already
                side.decode_short_tokens_per_s = side.decode_tokens_per_s
            got[engine] = side
            gc.collect()                        # the round's model and context (their packed weights) go
        rounds.append(got)
    me = bench.median_side([g["llmlab"] for g in rounds])
    res = bench.BenchResult(
        model=args.model, threads=threads, cpu=cpu, kernels=args.kernels, cpu_model=bench.cpu_model(), load=args.load,
        prompt_tokens=len(ids),
        gen_tokens=args.gen_tokens, prefill_tokens_per_s=me.prefill_tokens_per_s,
        decode_tokens_per_s=me.decode_tokens_per_s, decode_gb_per_s=wb * me.decode_tokens_per_s / 1e9,
        weight_mb=wb / 2**20, peak_rss_mb=me.peak_rss_mb, decode_short_tokens_per_s=me.decode_short_tokens_per_s,
        threading=bench.threading_layer(), threading_pool=bench.threading_pool(), repeat=args.repeat,
        rounds=[{k: bench.side_json(v) for k, v in g.items()} for g in rounds])
    if args.first_token:
        res.first_token_s = bench.first_token_s(args.model, threads)
        res.first_token_cold_s = bench.first_token_s(args.model, threads, cold=True)
    if args.vs_llama_cpp:
        ll = bench.median_side([g["llama.cpp"] for g in rounds])
        res.llama_cpp = {"prefill_tokens_per_s": ll.prefill_tokens_per_s, "decode_tokens_per_s": ll.decode_tokens_per_s,
                         "decode_gb_per_s": wb * ll.decode_tokens_per_s / 1e9, "peak_rss_mb": ll.peak_rss_mb,
                         "load_s": ll.load_s, "decode_short_tokens_per_s": ll.decode_short_tokens_per_s}
        ratios = bench.round_ratios(rounds)     # each round's ratio pairs runs close in time: their median
        res.decode_ratio, res.prefill_ratio = ratios["decode_tokens_per_s"], ratios["prefill_tokens_per_s"]
        res.decode_short_ratio = ratios["decode_short_tokens_per_s"]
        res.rss_ratio = me.peak_rss_mb / ll.peak_rss_mb
        res.same_tokens = min(next((i for i, (a, b) in enumerate(zip(g["llmlab"].ids, g["llama.cpp"].ids)) if a != b),
                                   min(len(g["llmlab"].ids), len(g["llama.cpp"].ids))) for g in rounds)
    if args.json:
        print(json.dumps(res.to_json()))
        return 0
    _print(res, sys.stdout)
    return 0


def _prompt(path, n_prompt: int, n_gen: int) -> tuple[list[int], int]:
    """The prompt's token ids and the weight bytes a decode step reads. The model and tokenizer used here are
    gone when it returns: llmlab's peak memory is measured in this process, and llama.cpp's worker gets
    only the ids, so neither side holds a second model or a tokenizer while it runs."""
    from .. import bench
    from ..llama import Model
    from ..llama.vocab import Tokenizer
    model = Model(path)
    if n_prompt + n_gen > model.hparams.n_ctx_train:     # before building the prompt
        raise ValueError(f"{n_prompt} + {n_gen} tokens exceed the model's context ({model.hparams.n_ctx_train})")
    wb = bench.weight_bytes(model)
    return bench.prompt_tokens(Tokenizer.from_model(path), n_prompt), wb


def _ratio(v) -> str:
    """A number in its column; ``-`` where there is none (``--gen-tokens 0``: nothing decoded to compare)."""
    return f"{'-':>10}" if v is None else f"{v:10.2f}"


def _round_ratio(g: dict, key: str) -> str:
    a, b = g["llmlab"].get(key), g["llama.cpp"].get(key)
    return f"{a / b:.2f}" if a and b else "-"


def _print(r, out) -> None:
    from ..bench import SHORT_PROMPT
    rows = [("llmlab", r.prefill_tokens_per_s, r.decode_tokens_per_s, r.decode_short_tokens_per_s,
             r.decode_tokens_per_s * r.weight_mb * 2**20 / 1e9, r.peak_rss_mb)]
    if r.llama_cpp:
        ll = r.llama_cpp
        rows.append(("llama.cpp", ll["prefill_tokens_per_s"], ll["decode_tokens_per_s"],
                     ll.get("decode_short_tokens_per_s"), ll["decode_gb_per_s"], ll["peak_rss_mb"]))
    layer = f" on numba's {r.threading} layer" if r.threading else ""
    layer += " (its regions served by llmlab's spinning pool)" if r.threading_pool else ""
    print(f"model {r.model}, {r.threads} threads, cpu {r.cpu} ({r.cpu_model}), kernels {r.kernels}{layer}; "
          f"pp{r.prompt_tokens} then tg{r.gen_tokens}, and tg{r.gen_tokens} from a {SHORT_PROMPT}-token prompt "
          f"(tg@pp{SHORT_PROMPT}); {r.weight_mb:.1f} MiB of weights per token"
          + (f"; beside {r.load} busy process{'es' if r.load > 1 else ''}" if r.load else "; no added load"), file=out)
    print(f"{'engine':<10} {'pp tok/s':>10} {'tg tok/s':>10} {'tg@pp' + str(SHORT_PROMPT):>10} {'tg GB/s':>8} "
          f"{'peak RSS MB':>12}", file=out)
    for name, pp, tg, tgs, gbs, rss in rows:
        print(f"{name:<10} {pp:10.1f} {tg:10.2f} {_ratio(tgs or None)} {gbs:8.2f} {rss:12.0f}", file=out)
    if r.llama_cpp:
        print(f"ratio      {_ratio(r.prefill_ratio)} {_ratio(r.decode_ratio)} {_ratio(r.decode_short_ratio)} {'':>8} "
              f"{r.rss_ratio:12.2f}   (greedy tokens equal for {r.same_tokens}/{r.gen_tokens})", file=out)
    if r.repeat > 1:
        each = ", ".join(f"{_round_ratio(g, 'decode_tokens_per_s')}/{_round_ratio(g, 'decode_short_tokens_per_s')}"
                         for g in r.rounds) if r.llama_cpp else ""
        print(f"medians of {r.repeat} rounds, the engines' order alternating"
              + (f"; per round decode ratio (after the prompt/from {SHORT_PROMPT}): {each}" if each else ""), file=out)
    if r.first_token_s is not None:
        print(f"first token from process start: {r.first_token_s:.2f} s warm, {r.first_token_cold_s:.2f} s cold cache",
              file=out)
