"""Describe a GGUF file: the JSON record and the human summary of ``gguf-dump``."""
from __future__ import annotations

from collections import Counter

import numpy as np

from .meta import Metadata, json_safe
from .reader import GGUFFile, StringArray
from ...safeio import printable


def to_json(f: GGUFFile) -> dict:
    """The whole record as strict JSON can hold it: NaN and infinite metadata values as strings."""
    return {
        "version": f.version,
        "alignment": f.alignment,
        "data_offset": f.data_offset,
        "kv": {k: json_safe(v) for k, v in f.kv.items()},
        "tensors": [{"name": t.name, "type": t.type.name, "shape": list(t.shape),
                     "offset": t.offset, "nbytes": t.nbytes} for t in f.tensors],
        "problems": Metadata.of(f).problems(),
    }


def _short(v, width: int = 60) -> str:
    if isinstance(v, (np.ndarray, StringArray, list)):
        head = ", ".join(repr(x) if isinstance(x, str) else str(x) for x in list(v[:5]))
        return f"[{head}{', ...' if len(v) > 5 else ''}] ({len(v)} items)"
    s = repr(v) if isinstance(v, str) else str(v)
    return s if len(s) <= width else s[:width - 3] + "..."


def hparams(f: GGUFFile) -> dict:
    """The ``{arch}.*`` keys, without the prefix (none when general.architecture is not a string)."""
    arch = Metadata.of(f).peek("general.architecture", "str")
    if not arch:
        return {}
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
    md = Metadata.of(f)      # values shown as stored; the typed reads only decide what can be summarised
    w(f"name:          {_short(md.raw('general.name', '?'))}")
    w(f"architecture:  {_short(md.raw('general.architecture'))}")
    w(f"parameters:    {n_el:,} in {len(f.tensors)} tensors, {n_by:,} bytes, {8 * n_by / max(n_el, 1):.2f} bits per weight")
    toks = md.peek("tokenizer.ggml.tokens", "str[]")
    if toks is not None:
        merges = md.peek("tokenizer.ggml.merges", "str[]", [])
        w(f"tokenizer:     {_short(md.raw('tokenizer.ggml.model'))} (pre: {_short(md.raw('tokenizer.ggml.pre', '-'))}), "
          f"{len(toks):,} tokens, {len(merges):,} merges")
    problems = md.problems()
    if problems:
        w("")
        w(f"problems ({len(problems)}): this file cannot be loaded as it is")
        for p in problems:
            w(f"  {p}")
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
        w(f"  {name:<8} {n:>7} {el:>14,} {by:>14,} " + (f"{8 * by / el:>6.2f}" if el else f"{'-':>6}"))
    w("")
    shown = f.tensors if max_tensors is None else f.tensors[:max_tensors]
    w(f"tensors ({len(f.tensors)}):")
    w(f"  {'#':>4} {'name':<32} {'type':<6} {'shape (ne)':<20} {'offset':>12} {'bytes':>12}")
    for i, t in enumerate(shown):
        w(f"  {i:>4} {t.name:<32} {t.type.name:<6} {str(list(t.shape)):<20} {t.offset:>12,} {t.nbytes:>12,}")
    if len(shown) < len(f.tensors):
        w(f"  ... {len(f.tensors) - len(shown)} more")
    return "\n".join(printable(line) for line in out)   # names and keys from the file: no control characters
