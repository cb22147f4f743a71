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
    from ..llama.validate import check_context, check_finite, check_text_fits
    from ..llama.vocab import Tokenizer

    if args.top <= 0:
        raise ValueError("--top must be positive")
    path = models.resolve(args.model)
    cpu = resolve_cpu(args)
    model = Model(path, cpu=cpu)
    if args.top > model.hparams.n_vocab:
        raise ValueError(f"--top {args.top} exceeds the vocabulary ({model.hparams.n_vocab})")
    tok = Tokenizer.from_model(path)
    check_text_fits(tok, args.prompt, args.n_ctx or model.hparams.n_ctx_train)   # before tokenizing it
    ids = tok.tokenize(args.prompt, add_bos=True, special=True)
    if not ids:
        raise ValueError("the prompt produced no tokens")
    n_ctx = args.n_ctx if args.n_ctx is not None else len(ids)
    check_context(model.hparams, n_ctx, n_prompt=len(ids))
    n_ubatch = min(512, len(ids))       # as a single batch of the whole prompt had it
    ctx = Context(model, n_ctx=n_ctx, n_batch=n_ubatch, n_ubatch=n_ubatch, flash_attn=flash_attn(args),
                  kernels=args.kernels)
    # one micro-batch at a time (the micro-batches a single batch of the whole prompt is cut into: the same
    # bits), keeping only each position's top K: memory is bounded by n_ubatch rows, not by the prompt
    k, tops, vals = args.top, [], []
    for lo in range(0, len(ids), n_ubatch):
        logits = ctx.decode(Batch.from_tokens(ids[lo:lo + n_ubatch], pos0=lo, logits="all"))
        check_finite(logits, row0=lo)
        top = top_k(logits, k)
        tops.append(top)
        vals.append(np.take_along_axis(logits, top, 1))
        del logits
    top, vals = np.concatenate(tops), np.concatenate(vals)
    if args.json:
        print(dumps({"ids": [int(i) for i in ids], "top_ids": top.tolist(),
                     "top_logits": [[float(v) for v in row] for row in vals], "cpu": cpu.name}))
        return 0
    for i, t in enumerate(ids):
        piece = tok.token_to_piece(int(t)).decode("utf-8", "replace")
        pairs = "  ".join(f"{int(a)}:{v:.4f}" for a, v in zip(top[i], vals[i]))
        print(f"{i:4d} {int(t):7d} {piece!r:>14}  {pairs}")
    return 0


def top_k(logits, k: int):
    """``np.argsort(-logits, axis=1, kind="stable")[:, :k]`` (the K largest of each row, equal values in
    id order) without sorting whole rows: a partition finds each row's K-th largest value first."""
    import numpy as np
    k = min(k, logits.shape[1])
    kth = -np.partition(-logits, k - 1, axis=1)[:, k - 1]
    out = np.empty((len(logits), k), np.int64)
    for r, row in enumerate(logits):
        above = np.flatnonzero(row > kth[r])
        cand = np.concatenate([above, np.flatnonzero(row == kth[r])[:k - len(above)]])
        cand.sort()
        out[r] = cand[np.argsort(-row[cand], kind="stable")]
    return out
