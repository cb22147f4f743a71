"""Special tokens written in the text: llama.cpp's partition step (``tokenizer_st_partition``).

Before any algorithm runs, the text is cut around special tokens. Candidates are the tokens of
type CONTROL, USER_DEFINED or UNKNOWN, longest text first; each one splits every remaining raw
fragment at all its (leftmost, non-overlapping) occurrences. With ``parse_special`` false the
CONTROL and UNKNOWN ones are skipped, but USER_DEFINED tokens are still split out: Gemma 3's
runs of newlines, tabs and spaces are user-defined tokens, so they never reach SentencePiece.
"""
from __future__ import annotations

from collections import defaultdict
from functools import cached_property

from .vocab import Attr, Vocab

Fragment = str | int   # raw text, or a token id already decided


class SpecialTokens:
    """The candidate lists of one vocabulary, ordered and bucketed for fast filtering."""

    def __init__(self, vocab: Vocab):
        self.vocab = vocab

    def _ordered(self, mask: int) -> list[tuple[str, int]]:
        v = self.vocab
        ids = (v.attrs & mask).nonzero()[0].tolist()
        ids.sort(key=lambda i: -len(v.tokens[i].encode()))   # stable: equal lengths keep id order
        return [(v.tokens[i], i) for i in ids]

    @cached_property
    def all(self) -> list[tuple[str, int]]:
        return self._ordered(int(Attr.CONTROL | Attr.USER_DEFINED | Attr.UNKNOWN))

    @cached_property
    def user_defined(self) -> list[tuple[str, int]]:
        skip = (self.vocab.attrs & int(Attr.CONTROL | Attr.UNKNOWN)) != 0
        return [(t, i) for t, i in self.all if not skip[i]]

    @cached_property
    def _buckets(self) -> dict[bool, dict[str, list[int]]]:
        """Candidate positions grouped by their first two characters, to skip absent ones quickly."""
        out = {}
        for parse_special, cands in ((True, self.all), (False, self.user_defined)):
            b = defaultdict(list)
            for k, (t, _) in enumerate(cands):
                b[t[:2]].append(k)
            out[parse_special] = dict(b)
        return out

    @cached_property
    def _index(self) -> dict[bool, dict[str, int]]:
        """Each candidate's position in its partition order, by its text."""
        return {ps: {t: k for k, (t, _) in enumerate(self.all if ps else self.user_defined)} for ps in (True, False)}

    def present(self, text: str, parse_special: bool) -> list[tuple[str, int]]:
        """The candidates that occur in ``text``, in partition order."""
        cands = self.all if parse_special else self.user_defined
        hits = []
        for prefix, ks in self._buckets[parse_special].items():
            if prefix in text:
                hits.extend(k for k in ks if cands[k][0] in text)
        hits.sort()
        return [cands[k] for k in hits]

    def occurrences(self, text: str, parse_special: bool) -> list[tuple[int, list[int] | None]]:
        """The candidates present in ``text``, in partition order, each with the sorted start of every
        occurrence (overlapping ones too), or None where finding them by scanning the text is cheaper.

        Per group of candidates sharing their first two characters, whichever costs less: look each of
        the group's lengths up at every place the two characters occur (a dict lookup each), or scan the
        text once per candidate (C speed). Both are linear in the text."""
        cands = self.all if parse_special else self.user_defined
        index = self._index[parse_special]
        found: dict[int, list[int] | None] = {}
        for prefix, ks in self._buckets[parse_special].items():
            count = text.count(prefix)
            if not count:
                continue
            lengths = sorted({len(cands[k][0]) for k in ks})
            if count * len(lengths) * 300 < len(ks) * len(text):    # ~0.3 us a lookup, ~1 ns a character scanned
                at = text.find(prefix)
                while at >= 0:
                    for n in lengths:
                        k = index.get(text[at:at + n])
                        if k is not None:
                            found.setdefault(k, []).append(at)
                    at = text.find(prefix, at + 1)
            else:
                found.update((k, None) for k in ks if cands[k][0] in text)
        return [(k, found[k]) for k in sorted(found)]

    def partition(self, text: str, parse_special: bool) -> list[Fragment]:
        """``text`` as a list of raw strings and token ids, in order.

        Each candidate in turn claims its leftmost non-overlapping occurrences inside the text that no
        earlier candidate claimed (what splitting every raw fragment at it does); claimed characters are
        marked in a bytearray, so a claimed stretch is stepped over at C speed. The work is linear in the
        text, however many fragments the candidates make (a pass over every fragment per candidate was
        quadratic)."""
        if not text:
            return []
        cands = self.all if parse_special else self.user_defined
        claimed = bytearray(len(text))
        hits: list[tuple[int, int, int]] = []          # (start, end, token id)
        for k, starts in self.occurrences(text, parse_special):
            token_text, token_id = cands[k]
            n = len(token_text)
            if starts is not None:
                free = 0                               # this candidate's own claims do not overlap
                for at in starts:
                    if at >= free and claimed.find(1, at, at + n) < 0:
                        claimed[at:at + n] = b"\x01" * n
                        hits.append((at, at + n, token_id))
                        free = at + n
                continue
            at = text.find(token_text)
            while at >= 0:
                q = claimed.find(1, at, at + n)
                if q < 0:
                    claimed[at:at + n] = b"\x01" * n
                    hits.append((at, at + n, token_id))
                    at = text.find(token_text, at + n)
                else:                                  # every start up to q overlaps q: go past the claimed stretch
                    nxt = claimed.find(0, q)
                    at = text.find(token_text, nxt) if nxt >= 0 else -1
        hits.sort()
        fragments: list[Fragment] = []
        at = 0
        for lo, hi, token_id in hits:
            if lo > at:
                fragments.append(text[at:lo])
            fragments.append(token_id)
            at = hi
        if at < len(text):
            fragments.append(text[at:])
        return fragments
