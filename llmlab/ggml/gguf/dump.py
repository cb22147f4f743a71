"""Describe a GGUF file: the JSON record and the human summary of ``gguf-dump``."""
from __future__ import annotations

from collections import Counter

import numpy as np

from .reader import GGUFFile, StringArray


def _plain(v):
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, StringArray):
        return v.tolist()
    if isinstance(v, list):
        return [_plain(x) for x in v]
    return v


def to_json(f: GGUFFile) -> dict:
    return {
        "version": f.version,
        "alignment": f.alignment,
        "data_offset": f.data_offset,
        "kv": {k: _plain(v) for k, v in f.kv.items()},
        "tensors": [{"name": t.name, "type": t.type.name, "shape": list(t.shape),
                     "offset": t.offset, "nbytes": t.nbytes} for t in f.tensors],
    }


def _short(v, width: int = 60) -> str:
    if isinstance(v, (np.ndarray, StringArray, list)):
        head = ", ".join(repr(x) if isinstance(x, str) else str(x) for x in list(v[:5]))
        return f"[{head}{', ...' if len(v) > 5 else ''}] ({len(v)} items)"
    s = repr(v) if isinstance(v, str) else str(v)
    return s if len(s) <= width else s[:width - 3] + "..."


def hparams(f: GGUFFile) -> dict:
    """The ``{arch}.*`` keys, without the prefix."""
    arch = f.architecture or ""
    return {k[len(arch) + 1:]: v for k, v in f.kv.items() if k.startswith(arch + ".")}


def type_histogram(f: GGUFFile) -> list[tuple[str, int, int, int]]:
    """(type, tensors, elements, bytes) per ggml type, most bytes first."""
    n, el, by = Counter(), Counter(), Counter()
    for t in f.tensors:
        n[t.type.name] += 1
        el[t.type.name] += t.n_elements
        by[t.type.name] += t.nbytes
    return sorted(((k, n[k], el[k], by[k]) for k in n), key=lambda r: -r[3])


def summary(f: GGUFFile, max_tensors: int | None = None) -> str:
    out = []
    w = out.append
    n_el = sum(t.n_elements for t in f.tensors)
    n_by = sum(t.nbytes for t in f.tensors)
    w(f"file:          {f.path}")
    w(f"format:        GGUF v{f.version}, {f.file_size:,} bytes, alignment {f.alignment}, data at offset {f.data_offset:,}")
    w(f"name:          {f.kv.get('general.name', '?')}")
    w(f"architecture:  {f.architecture}")
    w(f"parameters:    {n_el:,} in {len(f.tensors)} tensors, {n_by:,} bytes, {8 * n_by / max(n_el, 1):.2f} bits per weight")
    toks = f.kv.get("tokenizer.ggml.tokens")
    if toks is not None:
        w(f"tokenizer:     {f.kv.get('tokenizer.ggml.model')} (pre: {f.kv.get('tokenizer.ggml.pre', '-')}), "
          f"{len(toks):,} tokens, {len(f.kv.get('tokenizer.ggml.merges', [])):,} merges")
    w("")
    w("hyperparameters:")
    for k, v in hparams(f).items():
        w(f"  {k:<40} {_short(v)}")
    w("")
    w(f"metadata ({len(f.fields)} pairs):")
    for k, fld in f.fields.items():
        t = fld.type.name.lower() + (f"[{fld.item_type.name.lower()}]" if fld.item_type is not None else "")
        w(f"  {k:<40} {t:<14} {_short(fld.value)}")
    w("")
    w("tensor types:")
    w(f"  {'type':<8} {'tensors':>7} {'elements':>14} {'bytes':>14} {'bpw':>6}")
    for name, n, el, by in type_histogram(f):
        w(f"  {name:<8} {n:>7} {el:>14,} {by:>14,} {8 * by / el:>6.2f}")
    w("")
    shown = f.tensors if max_tensors is None else f.tensors[:max_tensors]
    w(f"tensors ({len(f.tensors)}):")
    w(f"  {'#':>4} {'name':<32} {'type':<6} {'shape (ne)':<20} {'offset':>12} {'bytes':>12}")
    for i, t in enumerate(shown):
        w(f"  {i:>4} {t.name:<32} {t.type.name:<6} {str(list(t.shape)):<20} {t.offset:>12,} {t.nbytes:>12,}")
    if len(shown) < len(f.tensors):
        w(f"  ... {len(f.tensors) - len(shown)} more")
    return "\n".join(out)
