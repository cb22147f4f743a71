"""Run one decode in llama.cpp and record its compute graph node by node.

llama.cpp lets a caller watch every node its scheduler computes:
``llama_context_params.cb_eval`` is a
``bool (*)(struct ggml_tensor * t, bool ask, void * user_data)``. For each
node the scheduler first *asks* (``ask = true``) whether we want to see it;
answering yes makes it compute up to that node and call again with
``ask = false`` once the node's data is ready. We answer yes to every node, so
the second calls arrive in graph order and each one is a node we read with
:class:`~llmlab.llamacpp.ggml_tensor.GGMLTensor`: its name (``attn_norm-0``,
``Qcur-0``, ``kqv_out-0``, ``result_output``...), op, shape, type, sources
and, when asked for, a copy of its values.

Computing node by node costs some speed, and stops ggml-cpu from fusing
neighbouring ops; the values are those of the unfused kernels (the tests
check ``result_output`` against the logits of a run without the callback).
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from .. import LLMLabError
from ..ggml.ops import VIEW_OPS
from . import ggml_tensor as gt
from . import session
from ._lib import llama_cpp
from .session import Session, flash_attn_type
from .worker import isolated

@dataclass
class Node:
    """One node of llama.cpp's graph as the eval callback saw it."""

    index: int                      # position in execution order
    name: str                       # ggml_get_name: "attn_norm-0", "Qcur-0 (reshaped)", "result_output"
    op: str                         # ggml_op_name: "MUL_MAT", "RMS_NORM", "UNARY", "GLU", ...
    op_desc: str                    # ggml_op_desc: the sub-op of UNARY/GLU ("SILU", "SWIGLU"), else op
    ne: tuple[int, int, int, int]   # ggml shape, fastest dimension first
    type: str                       # ggml_type_name: "f32", "f16", ...
    src: tuple[str, ...]            # names of the source tensors (weights included)
    is_view: bool                   # shares another tensor's data (VIEW, RESHAPE, PERMUTE, TRANSPOSE...)
    values: np.ndarray | None = field(default=None, repr=False)   # shape ne[::-1], when requested
    label: str = ""                 # the name, or for an unnamed node ("node_21") "<op>-<layer>": "flash_attn_ext-0"
    ubatch: int = 0                 # which micro-batch's graph computed it
    il: int | None = None           # the layer it belongs to (also for layer-less names inside a layer: "norm")

    @property
    def named(self) -> bool:
        """Named by llama.cpp's graph builder (not an automatic ``node_N`` / ``leaf_N`` name)."""
        return not is_auto_name(self.name)

    @property
    def shape(self) -> tuple[int, ...]:
        """The NumPy shape: ``ne`` reversed, without leading 1s (``ggml_n_dims`` dimensions)."""
        n = max([i + 1 for i, x in enumerate(self.ne) if x != 1] or [1])
        return tuple(self.ne[:n][::-1])

    @property
    def layer(self) -> int | None:
        """The layer index of labels like ``ffn_out-7`` (``None`` for names without one)."""
        return layer_of(self.label or self.name)


_AUTO_NAME = re.compile(r"^(node|leaf)_\d+$")


def layer_of(name: str) -> int | None:
    """``ffn_out-7`` -> 7; ``Qcur-0 (view)`` -> 0; ``result_output`` -> None."""
    head, _, tail = name.split(" ")[0].rpartition("-")
    return int(tail) if head and tail.isdigit() else None


def is_auto_name(name: str) -> bool:
    """Empty, or ggml's automatic ``node_N`` / ``leaf_N``."""
    return not name or bool(_AUTO_NAME.match(name))


def labels(names_ops: list[tuple[str, str]]) -> list[str]:
    """Labels for a graph's nodes given as ``(name, op_desc)`` in execution order.

    llama.cpp leaves a few compute nodes unnamed (the flash-attention node,
    Gemma 3's Q scaling and attention output projection, the output-row
    selection), and ggml calls them ``node_<index>``, which depends on the
    whole graph. Their label is their op and the layer being computed, i.e.
    that of the last named node before them: ``flash_attn_ext-0``,
    ``scale-3``, ``get_rows-29``. Named nodes keep their name.
    """
    out, il = [], None
    for name, op in names_ops:
        if is_auto_name(name):
            out.append(op.lower() + ("" if il is None else f"-{il}"))
        else:
            out.append(name)
            il = layer_of(name) if layer_of(name) is not None else il
    return out


def label_nodes(nodes: list[Node]) -> None:
    """Set ``label`` and ``il`` of every node.

    ``il`` is the layer of the label, or, for a node without one that sits
    between two nodes of the same layer (Gemma 3 names one of its norms just
    ``norm``), that layer; the nodes before the first layer and after the last
    (``embd``, ``result_output``) have none.
    """
    for n, lab in zip(nodes, labels([(n.name, n.op_desc) for n in nodes])):
        n.label = lab
    own = [layer_of(n.label) for n in nodes]
    prev, nxt = [None] * len(nodes), [None] * len(nodes)
    for i in range(len(nodes)):
        prev[i] = own[i] if own[i] is not None else (prev[i - 1] if i else None)
    for i in reversed(range(len(nodes))):
        nxt[i] = own[i] if own[i] is not None else (nxt[i + 1] if i + 1 < len(nodes) else None)
    for n, o, p, q in zip(nodes, own, prev, nxt):
        n.il = o if o is not None else (p if p == q else None)


@dataclass
class Capture:
    """The nodes of one llama.cpp decode, plus what llama.cpp returned and how it was set up."""

    nodes: list[Node]
    logits: np.ndarray              # (n_outputs, n_vocab) from llama_get_logits_ith
    tokens: list[int]
    flash_attn: bool
    params: dict                    # n_ctx, n_threads, type_k, type_v, swa_full, ...
    seconds: float = 0.0

    def __getitem__(self, name: str) -> Node:
        """The last computed node named (or labelled) ``name``: for ``Qcur-0``, the roped one."""
        for n in reversed(self.nodes):
            if name in (n.name, n.label):
                return n
        raise KeyError(f"no node named {name!r} in the llama.cpp graph")

    def __contains__(self, name: str) -> bool:
        return any(name in (n.name, n.label) for n in self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    @property
    def names(self) -> list[str]:
        return [n.name for n in self.nodes]

    def compute_nodes(self) -> list[Node]:
        """The nodes that compute something (not views, reshapes, permutes or cache writes), in order."""
        return [n for n in self.nodes if not n.is_view and n.op not in VIEW_OPS]

    def layer(self, il: int) -> list[Node]:
        return [n for n in self.nodes if n.layer == il]


def _want(values) -> Callable[[str], bool]:
    if values is True:
        return lambda name: True
    if not values:
        return lambda name: False
    if callable(values):
        return values
    wanted = set(values)
    return lambda name: name in wanted


def capture(model_path: str | Path, tokens: Iterable[int], flash_attn: bool | str = False, n_threads: int = 1,
            values: bool | Iterable[str] | Callable[[str], bool] = True, output: str = "all",
            n_ctx: int | None = None, type_k: str = "f16", type_v: str | None = None,
            prefix: Iterable[int] = (), n_ubatch: int | None = None) -> Capture:
    """Decode ``tokens`` (one sequence) in llama.cpp and return the graph it computed, node by node.

    ``flash_attn``: on/off (True/False). ``n_threads``: 1 by default, since the node-by-node run
    synchronizes the threads after every node. ``values``: True for every node's
    values, False for none, or the names (or a predicate on names) of the
    nodes to copy. ``output``: ``"all"`` asks for logits at every position,
    ``"last"`` only at the last (llama.cpp then drops the other rows before
    the last layer's FFN). ``prefix``: tokens decoded first, unobserved, so
    that ``tokens`` continue them (a decode step after a prefill).
    ``n_ubatch``: micro-batch size (default: all tokens in one); each node
    records which micro-batch's graph computed it. ``n_ctx`` defaults to the
    token count; llama.cpp pads it to a multiple of 256, and attention looks
    at ``n_kv`` = 256-padded cells.

    llama.cpp runs in llmlab's worker process (:mod:`llmlab.llamacpp.worker`): if it crashes, this
    raises :class:`~llmlab.llamacpp.worker.LlamaCppCrashed`. A predicate for ``values`` must be a
    module-level function (it is sent to the worker).
    """
    toks = [int(t) for t in tokens]
    if not toks:
        raise ValueError("capture needs at least one token")
    if output not in ("all", "last"):
        raise ValueError(f"output must be 'all' or 'last', not {output!r}")
    flash_attn_type(flash_attn)
    if not Path(model_path).is_file():
        raise LLMLabError(f"model file not found: {model_path}")
    if not (isinstance(values, bool) or callable(values)):
        values = list(values)
    return isolated(capture_here, model_path, toks, flash_attn, n_threads, values, output, n_ctx, type_k, type_v,
                    [int(t) for t in prefix], n_ubatch)


def capture_here(model_path, toks: list[int], flash_attn, n_threads, values, output, n_ctx, type_k, type_v,
                 pre: list[int], n_ubatch) -> Capture:
    """:func:`capture`, in this process."""
    gt.check_layout()
    fa = flash_attn_type(flash_attn)
    nodes: list[Node] = []
    errors: list[BaseException] = []
    want = _want(values)
    watching = [False]
    first_name: list[str] = []
    graphs = [0]

    def on_node(ptr, ask, user):
        if ask:
            return watching[0]
        try:
            t = gt.GGMLTensor.from_address(ptr)
            name = t.name.decode(errors="replace")
            op = gt.op_name(t.op)
            if not first_name:
                first_name.append(name)
            elif name == first_name[0]:      # every micro-batch's graph starts with the same input node
                graphs[0] += 1
            nodes.append(Node(
                index=len(nodes), name=name, op=op, op_desc=gt.op_desc(ptr),
                ne=tuple(int(x) for x in t.ne), type=gt.type_name(t.type),
                src=tuple(gt.tensor_name(s) for s in t.src if s), is_view=bool(t.view_src) or op in VIEW_OPS,
                values=gt.read_values(t) if want(name) else None, ubatch=graphs[0]))
            return True
        except BaseException as e:     # an exception must not cross into C: stop the graph instead
            errors.append(e)
            return False

    n = len(toks)
    n_batch = max(n, len(pre), 1)
    with Session(model_path, n_ctx=max(len(pre) + n, n_ctx or 0), n_batch=n_batch, n_ubatch=n_ubatch,
                 n_threads=n_threads, flash_attn=fa, type_k=type_k, type_v=type_v, cb_eval=on_node) as s:
        p = s.params
        params = dict(n_ctx=p["n_ctx"], n_batch=p["n_batch"], n_ubatch=p["n_ubatch"], n_prefix=len(pre),
                      n_threads=n_threads, flash_attn=bool(fa), type_k=p["type_k"], type_v=p["type_v"],
                      swa_full=p["swa_full"], kv_unified=p["kv_unified"])
        if pre and s.decode(pre, logits="none") != 0:
            raise LLMLabError(f"llama_decode of the prefix failed: {s.log(500)}")
        watching[0] = True
        t0 = time.perf_counter()
        rc = s.decode(toks, pos0=len(pre), logits=output)
        seconds = time.perf_counter() - t0
        if errors:
            raise errors[0]
        if rc != 0:
            raise LLMLabError(f"llama_decode failed ({rc}): {s.log(500)}")
        logits = s.logits(range(n) if output == "all" else [n - 1])
        params["n_ctx"] = s.n_ctx
    label_nodes(nodes)
    return Capture(nodes=nodes, logits=logits, tokens=toks, flash_attn=bool(fa), params=params, seconds=seconds)


def run_logits(model_path: str | Path, tokens: Iterable[int], flash_attn: bool | str = False, n_threads: int = 2,
               n_ctx: int | None = None, n_ubatch: int | None = None) -> np.ndarray:
    """llama.cpp's logits for every position of ``tokens``, without the callback (the fused, normal run).
    ``n_ubatch``: micro-batch size (default: all tokens in one; 1 decodes token by token)."""
    return isolated(run_logits_here, model_path, [int(t) for t in tokens], flash_attn, n_threads, n_ctx, n_ubatch)


def run_logits_here(model_path, toks: list[int], flash_attn, n_threads, n_ctx, n_ubatch) -> np.ndarray:
    n = len(toks)
    with Session(model_path, n_ctx=max(n, n_ctx or 0), n_batch=n, n_ubatch=n_ubatch, n_threads=n_threads,
                 flash_attn=flash_attn) as s:
        if s.decode(toks, logits="all") != 0:
            raise LLMLabError("llama_decode failed")
        return s.logits(range(n))


def cached_vs_fresh(model_path: str | Path, prompt: Iterable[int], generated: Iterable[int], n_ctx: int = 64,
                    n_threads: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """llama.cpp's logits for the last token of ``prompt + generated``, computed two ways: the prompt in
    one batch and then each generated token alone, reading the KV cache (``cached``), and everything in
    one fresh batch (``fresh``). Returns ``(cached, fresh)``, each of shape ``(n_vocab,)``."""
    return isolated(cached_vs_fresh_here, model_path, [int(t) for t in prompt], [int(t) for t in generated],
                    n_ctx, n_threads)


def cached_vs_fresh_here(model_path, prompt: list[int], generated: list[int], n_ctx: int, n_threads: int):
    # as llama-cpp-python's Llama(n_ctx, n_threads, logits_all=True).eval: batches of n_batch = min(n_ctx, 512)
    # tokens, and n_threads_batch = the CPU count
    import os
    n_batch = min(n_ctx, 512)
    kw = dict(n_ctx=n_ctx, n_batch=n_batch, n_threads=n_threads, n_threads_batch=os.cpu_count() or 1, no_perf=False)
    seq = prompt + generated

    def chunks(n):
        return [min(n_batch, n - i) for i in range(0, n, n_batch)]
    with Session(model_path, **kw) as s:
        cached = s.eval_chunks(seq, chunks(len(prompt)) + [1] * len(generated))[-1]
    with Session(model_path, **kw) as s:
        fresh = s.eval_chunks(seq, chunks(len(seq)))[-1]
    return cached, fresh


def tokenize(model_path: str | Path, text: str | list[str], add_special: bool = True,
             parse_special: bool = True) -> list[int] | list[list[int]]:
    """llama.cpp's own tokenization (``llama_tokenize``; BOS where the model asks for it).

    ``text`` may be a list of texts: the vocabulary is then loaded once and a list of id lists returned.
    """
    return isolated(session.tokenize, model_path, text if isinstance(text, (str, bytes)) else list(text),
                    add_special, parse_special)


_KV_LINE = re.compile(r"llama_kv_cache: size = +([\d.]+) MiB \( *(\d+) cells, +(\d+) layers, +(\d+)/(\d+) seqs\), "
                      r"K \((\w+)\): +([\d.]+) MiB, V \((\w+)\): +([\d.]+) MiB")
_COMPUTE_LINE = re.compile(r"\w+: +(\S+) compute buffer size = +([\d.]+) MiB")


def context_report(model_path: str | Path, n_ctx: int, n_ubatch: int = 512, n_batch: int | None = None,
                   type_k: str = "f16", type_v: str | None = None, flash_attn: bool = False, swa_full: bool = True,
                   n_seq_max: int = 1) -> dict:
    """What llama.cpp allocates for a context, from its own log lines.

    ``kv``: one dict per KV cache (two for Gemma 3's sliding-window layers):
    ``cells``, ``layers``, ``type_k``, ``k_mib``, ``type_v``, ``v_mib``,
    ``mib``. ``compute_mib``: the compute buffer per backend (the peak memory
    of the intermediate tensors of one micro-batch, which grows with
    ``n_ubatch``). MiB to two decimals, as llama.cpp prints them.
    """
    text = isolated(context_log_here, model_path, n_ctx, n_ubatch, n_batch, type_k, type_v, flash_attn, swa_full,
                    n_seq_max)
    kv = [dict(mib=float(m[0]), cells=int(m[1]), layers=int(m[2]), type_k=m[5], k_mib=float(m[6]),
               type_v=m[7], v_mib=float(m[8])) for m in _KV_LINE.findall(text)]
    return dict(kv=kv, compute_mib={dev: float(mib) for dev, mib in _COMPUTE_LINE.findall(text)})


def kv_cache_report(model_path: str | Path, n_ctx: int, type_k: str = "f16", type_v: str | None = None,
                    flash_attn: bool = False, swa_full: bool = True, n_seq_max: int = 1,
                    n_ubatch: int = 512) -> list[dict]:
    """The ``kv`` part of :func:`context_report`."""
    return context_report(model_path, n_ctx, n_ubatch, type_k=type_k, type_v=type_v, flash_attn=flash_attn,
                          swa_full=swa_full, n_seq_max=n_seq_max)["kv"]


def context_log_here(model_path, n_ctx, n_ubatch, n_batch, type_k, type_v, flash_attn, swa_full, n_seq_max) -> str:
    """llama.cpp's log lines while it makes a context with these parameters (n_threads left at its default)."""
    n_batch = max(n_batch or llama_cpp().llama_context_default_params().n_batch, n_ubatch)
    try:
        s = Session(model_path, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_ubatch, n_seq_max=n_seq_max,
                    n_threads=None, flash_attn=flash_attn, type_k=type_k, type_v=type_v, swa_full=swa_full,
                    no_perf=True)
    except LLMLabError as e:
        if "could not create a context" in str(e):
            raise LLMLabError(str(e).replace("could not create a context", "refused the context")) from None
        raise
    with s:
        return s.logs.since(s.log_ctx)
