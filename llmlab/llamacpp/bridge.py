"""llmlab's side of a diff: run llmlab's own forward pass and list its nodes the way ``capture`` lists llama.cpp's."""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

import numpy as np

from ..ggml.ops import VIEW_OPS
from ..llama import Batch, Context, Model
from .eval_callback import labels


def llmlab_nodes(model_path: str | Path, tokens: Iterable[int], flash_attn: bool = False, output: str = "all",
                 n_ctx: int | None = None, dispatch=None, cpu=None) -> list[tuple[str, str, tuple[int, ...], np.ndarray | None]]:
    """Decode ``tokens`` with llmlab (one micro-batch, one sequence) and return its compute nodes in order.

    Each entry is ``(label, op, ne, values)`` as :func:`llmlab.llamacpp.diff`
    takes it; unnamed nodes get the same ``<op>-<layer>`` labels as
    llama.cpp's (:func:`~llmlab.llamacpp.eval_callback.labels`). ``dispatch``: an executor hook that
    swaps kernels (e.g. :func:`llmlab.ggml.cpu.float_path.f32_activations`, no 8-bit activations).
    ``cpu``: the CPU profile to reproduce (default: this machine's llama.cpp).
    """
    toks = np.asarray(list(tokens), np.int32)
    n = len(toks)
    model = Model(model_path, cpu=cpu)
    ctx = Context(model, n_ctx=max(n_ctx or 0, 256, n), n_batch=n, n_ubatch=n, flash_attn=bool(flash_attn))
    seen: list = []

    def on_node(t) -> None:
        if t.op in VIEW_OPS or t.view_src is not None:
            return
        seen.append((t.name, t.op, tuple(t.ne), t.numpy()))

    ctx.decode(Batch.from_tokens(toks, logits="all" if output == "all" else "last"), callback=on_node,
               dispatch=dispatch)
    # llmlab's internal names (``__fattn__-0``) are not llama.cpp's: label those nodes as unnamed ones
    names = labels([("" if name.startswith("__") else name, op) for name, op, _, _ in seen])
    return [(lab, op, ne, vals) for lab, (_, op, ne, vals) in zip(names, seen)]
