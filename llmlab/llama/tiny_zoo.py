"""Shapes of tiny random models for the architectures llmlab compares with llama.cpp node by node.

Each architecture's spec lists a few shapes (``ArchSpec.tiny_shapes``) that exercise what makes it itself (odd head counts, MQA, one
expert per token and several, MLA with and without the low-rank q path, softmax and sigmoid
gating, a selection bias); :func:`draw` picks one with a seed and scales it for a weight type
(a K-quant needs rows of 256). ``tools/gen_tiny_models.py`` writes them all; the tests draw theirs
at test time, so every run checks models nobody looked at before.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .arch import ARCHS, get_arch
from .tiny import write_tiny

WTYPES = ("f32", "f16", "q8_0", "q4_0", "q4_k")

class _Shapes(dict):
    """``{arch: [shape, ...]}`` read off the registry: each spec's ``tiny_shapes`` (the architectures
    without any are not in it)."""

    def __missing__(self, arch: str) -> list[dict]:
        shapes = list(get_arch(arch).tiny_shapes)
        if not shapes:
            raise KeyError(arch)
        return shapes

    def __iter__(self):
        return iter([a for a, spec in sorted(ARCHS.items()) if spec.tiny_shapes])


SHAPES = _Shapes()


def scaled(shape: dict, wtype: str) -> dict:
    """The shape with its matrix row lengths fit for ``wtype``: a K-quant (256-value blocks) gets
    n_embd, n_ff and the expert width of 256 (the rows it cannot split fall back to q8_0)."""
    s = dict(shape, kv=dict(shape.get("kv", {})))
    if wtype.lower().endswith("_k"):
        s["n_embd"], s["n_ff"] = 256, 256
        if "expert_feed_forward_length" in s["kv"] or "expert_count" in s["kv"]:
            s["kv"]["expert_feed_forward_length"] = 256
    return s


def draw(arch: str, seed: int, wtype: str = "q8_0") -> dict:
    """One shape of ``arch`` (by the seed) as write_tiny's keyword arguments, with the seed for its weights."""
    rng = np.random.default_rng(seed)
    shape = SHAPES[arch][int(rng.integers(len(SHAPES[arch])))]
    return dict(scaled(shape, wtype), seed=int(rng.integers(1 << 31)), wtype=wtype)


def write(path: str | Path, arch: str, seed: int, wtype: str = "q8_0", vocab_from=None,
          vocab_size: int | None = None) -> Path:
    """Write the tiny model :func:`draw` picks (``vocab_from``/``vocab_size``: see ``write_tiny``)."""
    return write_tiny(path, arch, vocab_from=vocab_from, vocab_size=vocab_size, **draw(arch, seed, wtype))
