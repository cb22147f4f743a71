"""``generate``: text from a prompt, sampled with llama.cpp's chain and streamed token by token
(like ``llama-completion``); ``--json`` prints one object at the end instead.

The options shared with ``chat`` (model, sampling, context, CPU) live here too.
"""
from __future__ import annotations

import argparse
import json
import sys

from .. import LLMLabError, models
from ._common import add_flash_attn, flash_attn, parse_float, parse_int, positive_int
from ._cpu import add_cpu_argument, add_kernels_argument, resolve_cpu


def add_engine_args(p) -> None:
    """Model, context, sampling and CPU options, with llama.cpp's names and defaults."""
    from ..llama.sampling import SamplingParams
    d = SamplingParams()
    p.add_argument("-m", "--model", default=models.DEFAULT_MODEL, help="registry name or path to a .gguf file")
    p.add_argument("--temp", type=parse_float, default=d.temp, help=f"temperature; 0 is greedy (default {d.temp})")
    p.add_argument("--top-k", type=parse_int, default=d.top_k, help=f"top-k, <= 0 is off (default {d.top_k})")
    p.add_argument("--top-p", type=parse_float, default=d.top_p, help=f"top-p, 1.0 is off (default {d.top_p})")
    p.add_argument("--min-p", type=parse_float, default=d.min_p, help=f"min-p, 0.0 is off (default {d.min_p})")
    p.add_argument("--typical", type=parse_float, default=d.typ_p, help=f"locally typical p, 1.0 is off (default {d.typ_p})")
    p.add_argument("--repeat-penalty", type=parse_float, default=d.penalty_repeat,
                   help=f"penalty for tokens among the last --repeat-last-n, 1.0 is off (default {d.penalty_repeat})")
    p.add_argument("--repeat-last-n", type=parse_int, default=d.penalty_last_n,
                   help=f"window of the penalties (default {d.penalty_last_n})")
    p.add_argument("--frequency-penalty", type=parse_float, default=d.penalty_freq, help="subtract count x this (default 0)")
    p.add_argument("--presence-penalty", type=parse_float, default=d.penalty_present, help="subtract this once seen (default 0)")
    p.add_argument("-s", "--seed", type=_seed, default=d.seed,
                   help="RNG seed; -1 (the default) draws a random one, as llama.cpp does")
    p.add_argument("-c", "--ctx-size", "--n-ctx", dest="n_ctx", type=parse_int, default=None, help="context size")
    p.add_argument("-t", "--threads", type=positive_int, default=None,
                   help="CPU threads for the kernels (default: LLMLAB_THREADS, else the physical cores)")
    add_cpu_argument(p)
    add_kernels_argument(p)
    add_flash_attn(p)
    add_rpc_args(p)


def _seed(text: str) -> int:
    """llama.cpp's ``-s``: -1 is a random seed (its uint32 seed -1 is LLAMA_DEFAULT_SEED); the sampler checks the
    rest (0..2^32-1)."""
    v = parse_int(text)
    return 0xFFFFFFFF if v == -1 else v


def _endpoints(text: str) -> list[str]:
    from ..ggml.rpc import RPCError, parse_endpoint
    eps = [e.strip() for e in text.split(",")]
    try:
        for e in eps:
            parse_endpoint(e)
    except RPCError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return eps


def _split(text: str) -> list[float]:
    try:
        vals = [parse_float(x) for x in text.replace("/", ",").split(",")]
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"bad tensor split {text!r}: expected numbers like 3,1") from None
    if any(v < 0 for v in vals) or sum(vals) <= 0:
        raise argparse.ArgumentTypeError(f"bad tensor split {text!r}: weights must be >= 0, not all 0")
    return vals


def add_rpc_args(p) -> None:
    """llama.cpp's ``--rpc``, ``-ngl`` and ``-ts`` (common/arg.cpp): offload layers to llama.cpp's rpc-server."""
    p.add_argument("--rpc", type=_endpoints, default=None, metavar="HOST:PORT[,HOST:PORT...]",
                   help="offload to these rpc-servers (make rpc-server), every device of each")
    p.add_argument("-ngl", "--gpu-layers", "--n-gpu-layers", dest="n_gpu_layers", type=parse_int, default=None,
                   metavar="N", help="layers to offload, counted from the last, the output layer included "
                                     "(default: all; needs --rpc)")
    p.add_argument("-ts", "--tensor-split", type=_split, default=None, metavar="N0,N1,...",
                   help="share of the offloaded layers per device (default: by each device's free memory)")


def rpc_options(args) -> dict:
    """Context's ``devices``, ``n_gpu_layers`` and ``tensor_split`` from the options."""
    if not getattr(args, "rpc", None):
        if getattr(args, "n_gpu_layers", None) is not None or getattr(args, "tensor_split", None) is not None:
            raise LLMLabError("-ngl and --tensor-split place layers on devices: give them with --rpc HOST:PORT")
        return {}
    return dict(devices=args.rpc, n_gpu_layers=args.n_gpu_layers, tensor_split=args.tensor_split)


def sampling_params(args):
    from ..llama.sampling import SamplingParams
    return SamplingParams(seed=args.seed, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p, typ_p=args.typical,
                          temp=args.temp, penalty_last_n=args.repeat_last_n, penalty_repeat=args.repeat_penalty,
                          penalty_freq=args.frequency_penalty, penalty_present=args.presence_penalty)


def load_context(args, path, n_ctx: int):
    """(Context, the CPU profile's name, the kernels' warm-up) for the options: threads, profile and kernel
    set go to the engine. The fast kernels are compiled or loaded here (``llmlab.warm``), so the speeds
    printed later are the engine's and the compile time is said apart."""
    from ..ggml.cpu.fast import set_threads
    from ..llama import Context, Model
    from .. import sigbus
    from ..warm import warm
    sigbus.install()     # generate and chat run for long: a model file cut short under them is one error line
    set_threads(args.threads)
    cpu = resolve_cpu(args)
    model = Model(path, cpu=cpu)
    if n_ctx <= 0 or n_ctx > model.hparams.n_ctx_train:
        raise LLMLabError(f"a context of {n_ctx} tokens is outside 1..{model.hparams.n_ctx_train} (the model's "
                          f"context_length); lower -n or --n-ctx")
    ctx = Context(model, n_ctx=n_ctx, n_batch=n_ctx, flash_attn=flash_attn(args), kernels=args.kernels, cpu=cpu,
                  **rpc_options(args))
    if ctx.sched is not None and args.tensor_split is not None and len(args.tensor_split) != len(ctx.sched.backends) - 1:
        raise LLMLabError(f"--tensor-split has {len(args.tensor_split)} values for {len(ctx.sched.backends) - 1} devices")
    # with --rpc the graph runs through the scheduler, whose CPU splits use the reference ops: nothing to compile
    return ctx, cpu.name, warm(model, cpu) if args.kernels == "fast" and ctx.sched is None else None


def register(sub) -> None:
    p = sub.add_parser("generate", help="generate text from a prompt with llama.cpp's sampler chain, streamed")
    p.add_argument("-p", "--prompt", required=True, help="prompt text (tokenized with BOS and special tokens)")
    p.add_argument("-n", "--n-predict", type=parse_int, default=32,
                   help="tokens to generate at most; -1: until the context is full (default 32)")
    add_engine_args(p)
    p.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop when the output contains TEXT (repeatable)")
    p.add_argument("--json", action="store_true", help="print one JSON object at the end instead of streaming")
    p.add_argument("--no-timings", action="store_true", help="do not print the speed summary on stderr")
    p.set_defaults(func=run)


def sampler_and_model(args):
    """(the sampler chain, the model file, its tokenizer) for generate's and chat's options."""
    from ..llama.sampling import common_sampler_init
    from ..llama.vocab import Tokenizer
    if args.n_predict < -1:
        raise LLMLabError("-n must be >= -1")
    sampler = common_sampler_init(sampling_params(args))
    path = models.resolve(args.model)
    return sampler, path, Tokenizer.from_model(path)


def run(args) -> int:
    from ..generate import Generation, generate
    sampler, path, tok = sampler_and_model(args)
    from ..llama.validate import check_text_fits, context_length
    limit = args.n_ctx if args.n_ctx is not None else context_length(path)
    if limit:                  # before tokenizing: the work is bounded by the context, not by the prompt
        check_text_fits(tok, args.prompt, limit)
    ids = tok.tokenize(args.prompt, add_bos=True, special=True)
    if not ids:
        raise LLMLabError("the prompt produced no tokens")
    if args.n_ctx is not None and len(ids) > args.n_ctx:    # before loading anything (llama.cpp: "prompt is too long")
        raise LLMLabError(f"the prompt ({len(ids)} tokens) does not fit in -c {args.n_ctx}; raise -c or shorten "
                          f"the prompt")
    n_ctx = args.n_ctx if args.n_ctx is not None else (
        4096 if args.n_predict < 0 else len(ids) + max(args.n_predict - 1, 0))
    ctx, cpu, warmup = load_context(args, path, n_ctx)
    out = Generation()
    if not args.json:
        sys.stdout.write(args.prompt)
        sys.stdout.flush()
    for _, text in generate(ctx, tok, ids, args.n_predict, sampler, args.stop, result=out):
        if not args.json:
            sys.stdout.write(text)
            sys.stdout.flush()
    t = out.timings
    if args.json:
        print(json.dumps({"prompt_ids": out.prompt_ids, "ids": out.ids, "text": out.text, "cpu": cpu,
                          "prompt_tokens_per_s": round(t.prompt_tokens_per_s, 3),
                          "decode_tokens_per_s": round(t.decode_tokens_per_s, 3)}, ensure_ascii=False, allow_nan=False))
    else:
        sys.stdout.write("\n")
    if not args.no_timings:
        if warmup is not None:
            print(warmup.summary(), file=sys.stderr)
        print(f"{t.summary()}; stop: {out.stop_reason}; cpu: {cpu}", file=sys.stderr)
    return 0
