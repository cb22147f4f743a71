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

    def present(self, text: str, parse_special: bool) -> list[tuple[str, int]]:
        """The candidates that occur in ``text``, in partition order."""
        cands = self.all if parse_special else self.user_defined
        hits = []
        for prefix, ks in self._buckets[parse_special].items():
            if prefix in text:
                hits.extend(k for k in ks if cands[k][0] in text)
        hits.sort()
        return [cands[k] for k in hits]

    def partition(self, text: str, parse_special: bool) -> list[Fragment]:
        """``text`` as a list of raw strings and token ids, in order."""
        fragments: list[Fragment] = [text] if text else []
        for token_text, token_id in self.present(text, parse_special):
            out: list[Fragment] = []
            for frag in fragments:
                if isinstance(frag, int) or token_text not in frag:
                    out.append(frag)
                    continue
                pieces = frag.split(token_text)
                for k, piece in enumerate(pieces):
                    if k:
                        out.append(token_id)
                    if piece:
                        out.append(piece)
            fragments = out
        return fragments
