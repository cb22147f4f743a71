"""Notebook 02, the tokenizer: the BPE merge loop of one pre-tokenized word (SmolLM2's GPT-2 BPE).

The tokenizer calls ``bpe_merge`` once per distinct word of the prompt with the word's byte symbols
("Ġ" for a space) and the merge ranks (``"left right" -> rank``); the symbols it returns are looked
up in the vocabulary and become the prompt's token ids.
"""
from __future__ import annotations

from ..hooks import swap_attr
from ..probe import Where
from ..registry import BadOutput, Mistake, Slot, register_slot


def bpe_merge(symbols, ranks):
    """Merge the adjacent pair with the lowest rank (the leftmost of equal ones), again and again,
    until no adjacent pair is in ``ranks``."""
    sym = list(symbols)
    while len(sym) > 1:
        best, at = None, -1
        for i in range(len(sym) - 1):
            r = ranks.get(sym[i] + " " + sym[i + 1])
            if r is not None and (best is None or r < best):
                best, at = r, i
        if best is None:
            break
        sym[at:at + 2] = [sym[at] + sym[at + 1]]
    return sym


def bpe_merge_skeleton(symbols, ranks):
    # symbols: list of str (one per byte of the word); ranks: dict "left right" -> rank
    # -> the merged symbols, list of str
    raise NotImplementedError("bpe_merge: your code here")


def _leftmost(symbols, ranks):
    sym = list(symbols)
    while True:
        for i in range(len(sym) - 1):
            if sym[i] + " " + sym[i + 1] in ranks:
                sym[i:i + 2] = [sym[i] + sym[i + 1]]
                break
        else:
            return sym


def _highest(symbols, ranks):
    sym = list(symbols)
    while len(sym) > 1:
        cands = [(ranks[sym[i] + " " + sym[i + 1]], i) for i in range(len(sym) - 1) if sym[i] + " " + sym[i + 1] in ranks]
        if not cands:
            break
        _, at = max(cands, key=lambda c: (c[0], -c[1]))
        sym[at:at + 2] = [sym[at] + sym[at + 1]]
    return sym


def _one_pass(symbols, ranks):
    sym = list(symbols)
    pairs = sorted((ranks[sym[i] + " " + sym[i + 1]], i) for i in range(len(sym) - 1) if sym[i] + " " + sym[i + 1] in ranks)
    used, out, merged = set(), list(sym), {}
    for _, i in pairs:
        if i in used or i + 1 in used:
            continue
        used.update((i, i + 1))
        merged[i] = sym[i] + sym[i + 1]
    res, i = [], 0
    while i < len(sym):
        if i in merged:
            res.append(merged[i])
            i += 2
        else:
            res.append(out[i])
            i += 1
    return res


def _first_merge_only(symbols, ranks):
    sym = list(symbols)
    cands = [(ranks[sym[i] + " " + sym[i + 1]], i) for i in range(len(sym) - 1) if sym[i] + " " + sym[i + 1] in ranks]
    if cands:
        _, at = min(cands)
        sym[at:at + 2] = [sym[at] + sym[at + 1]]
    return sym


def _check(out, engine):
    if isinstance(out, tuple):
        out = list(out)
    if not isinstance(out, list) or not all(isinstance(s, str) for s in out):
        raise BadOutput(f"returned {type(out).__name__}; the tokenizer needs a list of str (the merged symbols)")
    if "".join(out) != "".join(engine):
        raise BadOutput(f"returned symbols that spell {''.join(out)!r}, not the word {''.join(engine)!r}: "
                        "merging joins neighbours, it never drops or adds characters")
    return out


def _install(probe):
    from ...llama.vocab import bpe
    orig = bpe.bpe_merge

    def merge(symbols, ranks, trace=None):
        engine = orig(symbols, ranks, trace)
        word = "".join(symbols)
        return probe(Where(f"word {word!r}", "BPE_MERGE", None, f"{len(symbols)} symbols"),
                     (list(symbols), ranks), engine)
    return swap_attr(bpe, "bpe_merge", merge)


def _diff(a, b) -> float:
    return float(sum(x != y for x, y in zip(a, b)) + abs(len(a) - len(b)))


register_slot(Slot(
    name="bpe_merge", notebook="02",
    signature="bpe_merge(symbols: list[str], ranks: dict[str, int]) -> list[str]",
    used_for="every distinct word of the prompt (GPT-2 byte-level BPE: SmolLM2's tokenizer)",
    reference=bpe_merge, skeleton=bpe_merge_skeleton, install=_install, models=("smollm2",),
    check=_check, diff=_diff,
    mistakes=[
        Mistake("leftmost pair first", _leftmost,
                "merged the leftmost mergeable pair first ({node}): the pair with the lowest rank goes first, "
                "wherever it is"),
        Mistake("highest rank first", _highest,
                "merged the highest rank first ({node}): a lower rank is an earlier, more frequent merge"),
        Mistake("one pass", _one_pass,
                "one pass over the pairs ({node}): a merged symbol makes new pairs with its neighbours; "
                "repeat until no pair is in the ranks"),
        Mistake("first merge only", _first_merge_only, "stopped after one merge ({node}): repeat until no pair merges"),
    ],
    hint_different="the first word merged differently is {node}: lowest rank first, leftmost on ties, until no "
                   "pair is left"))
