"""``logits``: run a prompt through the model's graph and print, for every prompt position,
the top-K token ids and logits (tokenized with BOS and special tokens, as llama.cpp's refs)."""
from __future__ import annotations


from .. import models
from ._cpu import add_cpu_argument, add_kernels_argument, resolve_cpu
from ._common import add_flash_attn, dumps, flash_attn, positive_int


def register(sub) -> None:
    p = sub.add_parser("logits", help="top-K logits at every prompt position (the model's forward pass)")
    p.add_argument("-m", "--model", default=models.DEFAULT_MODEL,
                   help=f"GGUF file or known model name (see `models`; default {models.DEFAULT_MODEL})")
    p.add_argument("-p", "--prompt", required=True, help="prompt text")
    p.add_argument("--top", type=positive_int, default=5, help="how many logits per position (default 5)")
    p.add_argument("--json", action="store_true", help='print {"ids", "top_ids", "top_logits"} as JSON')
    p.add_argument("-c", "--ctx-size", "--n-ctx", dest="n_ctx", type=positive_int, default=None,
                   help="context size (default: the prompt length)")
    add_flash_attn(p)
    add_cpu_argument(p)
    add_kernels_argument(p)
    p.set_defaults(func=run)


def run(args) -> int:
    import numpy as np

    from ..llama import Batch, Context, Model
    from ..llama.validate import check_context, check_finite
    from ..llama.vocab import Tokenizer

    if args.top <= 0:
        raise ValueError("--top must be positive")
    path = models.resolve(args.model)
    cpu = resolve_cpu(args)
    model = Model(path, cpu=cpu)
    if args.top > model.hparams.n_vocab:
        raise ValueError(f"--top {args.top} exceeds the vocabulary ({model.hparams.n_vocab})")
    tok = Tokenizer.from_model(path)
    ids = tok.tokenize(args.prompt, add_bos=True, special=True)
    if not ids:
        raise ValueError("the prompt produced no tokens")
    n_ctx = args.n_ctx if args.n_ctx is not None else len(ids)
    check_context(model.hparams, n_ctx, n_prompt=len(ids))
    ctx = Context(model, n_ctx=n_ctx, n_batch=max(len(ids), 1), n_ubatch=512, flash_attn=flash_attn(args),
                  kernels=args.kernels)
    logits = ctx.decode(Batch.from_tokens(ids, logits="all"))
    check_finite(logits)
    k = args.top
    top = np.argsort(-logits, axis=1, kind="stable")[:, :k]
    vals = np.take_along_axis(logits, top, 1)
    if args.json:
        print(dumps({"ids": [int(i) for i in ids], "top_ids": top.tolist(),
                     "top_logits": [[float(v) for v in row] for row in vals], "cpu": cpu.name}))
        return 0
    for i, t in enumerate(ids):
        piece = tok.token_to_piece(int(t)).decode("utf-8", "replace")
        pairs = "  ".join(f"{int(a)}:{v:.4f}" for a, v in zip(top[i], vals[i]))
        print(f"{i:4d} {int(t):7d} {piece!r:>14}  {pairs}")
    return 0
