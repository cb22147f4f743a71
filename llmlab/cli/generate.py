"""``generate``: greedy text generation from a prompt, streamed token by token (like llama-cli -no-cnv)."""
from __future__ import annotations

import sys

from .. import models
from ._cpu import add_cpu_argument, resolve_cpu


def register(sub) -> None:
    p = sub.add_parser("generate", help="generate text from a prompt (greedy), streaming tokens as they come")
    p.add_argument("-m", "--model", default=models.DEFAULT_MODEL, help="registry name or path to a .gguf file")
    p.add_argument("-p", "--prompt", required=True, help="prompt text (special tokens such as <|im_start|> are parsed)")
    p.add_argument("-n", "--n-predict", type=int, default=32, help="tokens to generate at most (default 32)")
    p.add_argument("--n-ctx", type=int, default=None, help="context size (default: prompt + n-predict)")
    p.add_argument("--flash-attn", action="store_true", help="use the flash-attention path")
    p.add_argument("--no-timings", action="store_true", help="do not print the speed summary on stderr")
    add_cpu_argument(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from ..generate import Timings, generate
    from ..llama import Context, Model
    from ..llama.vocab import Tokenizer
    from ..llama.vocab.stream import StreamDecoder

    path = models.resolve(args.model)
    model = Model(path, cpu=resolve_cpu(args))
    tok = Tokenizer.from_model(path)
    ids = tok.tokenize(args.prompt, add_bos=True, special=True)
    if not ids:
        raise ValueError("the prompt produced no tokens")
    n_ctx = args.n_ctx or len(ids) + max(args.n_predict, 0)
    ctx = Context(model, n_ctx=n_ctx, n_batch=max(len(ids), 1), flash_attn=args.flash_attn)
    stream = StreamDecoder(tok)
    sys.stdout.write(args.prompt)
    sys.stdout.flush()
    timings = Timings()
    for token in generate(ctx, ids, args.n_predict, stop=tok.vocab.eog, timings=timings):
        sys.stdout.write(stream.push(token))
        sys.stdout.flush()
    sys.stdout.write(stream.flush() + "\n")
    if not args.no_timings:
        print(timings.summary(), file=sys.stderr)
    return 0
