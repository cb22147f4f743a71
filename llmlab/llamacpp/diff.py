"""Align llmlab's named nodes with llama.cpp's and measure how far their values are apart.

The llmlab side is deliberately plain, so any graph can be compared: a mapping
``name -> (op, ne, values)`` or a sequence of ``(name, op, ne, values)``
(or of objects with ``name``, ``op``, ``ne`` and ``values`` attributes), where

- ``op`` is a ggml op name (``MUL_MAT``, ``RMS_NORM``...) or the sub-op of a
  unary/GLU node (``SILU``, ``SWIGLU``, ``GELU``...): either matches;
- ``ne`` is the ggml shape, fastest dimension first (trailing 1s ignored);
- ``values`` is an array with ``prod(ne)`` elements in ggml's memory order,
  i.e. C order of ``ne[::-1]`` (or ``None``).

Errors, per node, over the elements where both sides are finite:
``max_abs_err = max |a - b|`` and ``max_rel_err = max |a - b| / max |b|``
(relative to the llama.cpp tensor's largest magnitude, so that values near 0
do not blow it up). Infinities (masked scores) must sit in the same places,
or the relative error is infinite.

The first divergence is the first node, in llama.cpp's execution order, whose
``max_rel_err`` exceeds the tolerance of :func:`float32_tolerance`.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Mapping

import numpy as np

# Why this bound (stated once, used by the tests and the CLI):
# - f32 noise: ggml and NumPy sum the same products in different orders (SIMD lanes, blocking). A length-K dot
#   product then differs by about sqrt(K) * 2^-24 relative to its magnitude: K <= 2048 here, so ~3e-6.
# - rounding flips: values stored as f16 (KV cache, the non-flash softmax output) or quantized to 8 bits before
#   a quantized matmul (q8_0/q8_1/q8_K) round identically on both sides when their inputs are identical; an
#   input that differs by f32 noise sometimes lands on the other side of a rounding boundary. One f16 flip is
#   2^-11 of the value (5e-4 relative); one q8 flip moves an activation by 1/127 of its block maximum, which
#   after the matmul is a few 1e-4 of the output's range.
# So a node whose max_rel_err stays below 1e-3 agrees "up to float32 noise and the roundings it causes";
# above that, something is computed differently (a missing activation quantization, another rounding, a bug).
DIVERGE_TOL = 1e-3


def float32_tolerance(op: str | None = None) -> float:
    """The relative error (normwise, see the module doc) above which a node counts as diverging."""
    return DIVERGE_TOL


@dataclass
class NodeDiff:
    name: str
    op: str | None                      # llmlab's op (None: llmlab has no node of that name)
    shape: list[int] | None             # llmlab's ne (trailing 1s dropped)
    llama_cpp_op: str
    llama_cpp_shape: list[int]
    max_abs_err: float | None = None
    max_rel_err: float | None = None

    @property
    def present(self) -> bool:
        return self.op is not None

    @property
    def op_match(self) -> bool:
        return self.present and self.op in self._llama_ops

    @property
    def shape_match(self) -> bool:
        return self.present and self.shape == self.llama_cpp_shape

    @property
    def matched(self) -> bool:
        return self.op_match and self.shape_match

    _llama_ops: tuple = ()

    def to_json(self) -> dict:
        d = asdict(self)
        d.pop("_llama_ops", None)
        for k in ("max_abs_err", "max_rel_err"):
            if d[k] is not None and not math.isfinite(d[k]):
                d[k] = None if math.isnan(d[k]) else "inf"
        return d


@dataclass
class DiffReport:
    nodes: list[NodeDiff]
    tol: float

    @property
    def matched(self) -> int:
        return sum(n.matched for n in self.nodes)

    @property
    def total(self) -> int:
        return len(self.nodes)

    @property
    def first_divergence(self) -> str | None:
        for n in self.nodes:
            if n.max_rel_err is not None and not n.max_rel_err <= self.tol:
                return n.name
        return None

    @property
    def first_inexact(self) -> str | None:
        """The first node whose values differ at all (where an exact reimplementation first departs)."""
        return next((n.name for n in self.nodes if n.max_abs_err), None)

    @property
    def unmatched(self) -> list[NodeDiff]:
        return [n for n in self.nodes if not n.matched]

    def to_json(self) -> dict:
        return {"nodes": [n.to_json() for n in self.nodes], "matched": self.matched, "total": self.total,
                "first_divergence": self.first_divergence}

    def summary(self) -> str:
        fd = self.first_divergence
        return (f"compute nodes matched: {self.matched}/{self.total}; "
                f"first divergence (max rel err > {self.tol:g}): {fd or 'none'}; "
                f"first inexact node: {self.first_inexact or 'none (bit-identical)'}")

    def table(self) -> str:
        rows = [f"{'name':<28} {'op':<14} {'shape':<22} {'llama.cpp op':<14} {'max rel err':>12}"]
        for n in self.nodes:
            err = "-" if n.max_rel_err is None else f"{n.max_rel_err:.3g}"
            flag = "" if n.matched else ("  MISSING" if not n.present else "  MISMATCH")
            rows.append(f"{n.name:<28} {(n.op or '-'):<14} {str(n.shape or '-'):<22} "
                        f"{n.llama_cpp_op:<14} {err:>12}{flag}")
        return "\n".join(rows)


def _norm_ne(ne: Iterable[int]) -> list[int]:
    ne = [int(x) for x in ne]
    while len(ne) > 1 and ne[-1] == 1:
        ne.pop()
    return ne


def _as_entries(run: Any) -> list[tuple[str, str, list[int], Any]]:
    """llmlab's side in any accepted form -> [(name, OP, ne, values)] in order."""
    if isinstance(run, Mapping):
        items = [(k, *v) for k, v in run.items()]
    else:
        items = []
        for x in run:
            if isinstance(x, (tuple, list)):
                items.append(tuple(x))
            else:
                items.append((x.name, x.op, x.ne, getattr(x, "values", None)))
    return [(str(name), str(op).upper(), _norm_ne(ne), vals) for name, op, ne, vals in items]


def errors(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """(max |a - b|, max |a - b| / max |b|) over the elements finite in both; inf if the infinities differ."""
    a = np.asarray(a, np.float64).reshape(-1)
    b = np.asarray(b, np.float64).reshape(-1)
    if a.shape != b.shape:
        return math.inf, math.inf
    fa, fb = np.isfinite(a), np.isfinite(b)
    if not np.array_equal(fa, fb) or not np.array_equal(a[~fa], b[~fb]):
        return math.inf, math.inf
    if not fa.any():
        return 0.0, 0.0
    d = np.abs(a[fa] - b[fb])
    scale = np.abs(b[fb]).max()
    m = float(d.max())
    return m, (m / scale if scale > 0 else (0.0 if m == 0 else math.inf))


def diff(llmlab_run: Any, llamacpp_run: Any, tol: float | None = None, layers: range | None = None) -> DiffReport:
    """Compare every named compute node of llama.cpp's graph with llmlab's node of the same name.

    ``llamacpp_run``: a :class:`~llmlab.llamacpp.eval_callback.Capture` (its
    ``compute_nodes()`` are used) or a list of its nodes. ``layers``: only
    nodes of these layers (plus the layer-less ones, like ``result_output``).
    """
    ours = _as_entries(llmlab_run)
    by_name: dict[str, list[int]] = {}
    for i, (name, *_rest) in enumerate(ours):
        by_name.setdefault(name, []).append(i)
    used: set[int] = set()
    nodes = llamacpp_run.compute_nodes() if hasattr(llamacpp_run, "compute_nodes") else list(llamacpp_run)
    out = []
    for n in nodes:
        label = getattr(n, "label", "") or n.name
        il = getattr(n, "il", None) if getattr(n, "il", None) is not None else n.layer
        if layers is not None and il is not None and il not in layers:
            continue
        ops = (n.op, n.op_desc)
        d = NodeDiff(label, None, None, n.op if n.op == n.op_desc else n.op_desc, _norm_ne(n.ne))
        d._llama_ops = ops
        # the same name can occur several times (Qcur-0: MUL_MAT, then ROPE; norm-0 four times in Gemma 3):
        # take llmlab's first unused node of that name with a matching op, in order
        cands = [i for i in by_name.get(label, ()) if i not in used]
        pick = next((i for i in cands if ours[i][1] in ops), None)
        if pick is not None:
            used.add(pick)
            _, d.op, d.shape, vals = ours[pick]
            if vals is not None and n.values is not None and d.shape_match:
                d.max_abs_err, d.max_rel_err = errors(vals, n.values)
        elif cands:                      # a node of that name, but computing something else
            _, d.op, d.shape, _ = ours[cands[0]]
        out.append(d)
    return DiffReport(out, DIVERGE_TOL if tol is None else tol)
