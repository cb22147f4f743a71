"""Tiny teaching versions of the two tokenizer families our real models do not use: WordPiece
(BERT, llama.cpp's ``llm_tokenizer_wpm``) and Unigram (T5, ``llm_tokenizer_ugm``).

Each works on a vocabulary of a dozen pieces so every step fits on screen. They follow
llama.cpp's conventions: a piece that starts a word carries the ``▁`` marker (the GGUF converter
rewrites BERT's ``##`` continuation pieces into this form), and Unigram scores are log
probabilities (higher is better).
"""
from __future__ import annotations

import math
import unicodedata

from .html import HTML, table

WORD = "\u2581"   # ▁

# WordPiece: word-initial pieces carry ▁, continuations are bare (BERT's "##able" is "able" here)
WPM_VOCAB = ["[UNK]", "▁un", "▁una", "▁unaff", "aff", "able", "ab", "le", "▁the", "▁play", "ing", "ed",
             "er", "s", "▁!", "▁,"]

# Unigram: piece -> log probability. Built so that greedy longest-prefix and the best total score disagree.
UGM_VOCAB = {"▁": -3.0, "▁h": -5.5, "▁hu": -6.0, "▁hug": -4.0, "▁hugs": -9.5, "ug": -4.5, "ugs": -6.5,
             "s": -2.5, "g": -5.0, "u": -5.0, "h": -5.0, "▁the": -2.0, "▁b": -5.0, "▁bun": -9.8,
             "un": -4.0, "n": -5.0, "b": -5.0}


# ---------------------------------------------------------------- WordPiece

def wpm_preprocess(text: str) -> list[str]:
    """BERT's normalisation as llama.cpp does it: NFD, drop accents, lower case, then split on
    whitespace and make every punctuation character a word of its own; each word gets ▁."""
    text = "".join(c for c in unicodedata.normalize("NFD", text) if unicodedata.category(c) != "Mn").lower()
    words, cur = [], ""
    for c in text:
        if c.isspace():
            if cur:
                words.append(cur)
            cur = ""
        elif unicodedata.category(c).startswith("P"):
            if cur:
                words.append(cur)
            words.append(c)
            cur = ""
        else:
            cur += c
    if cur:
        words.append(cur)
    return [WORD + w for w in words]


def wpm_word(word: str, vocab=WPM_VOCAB) -> tuple[list[str], list[str]]:
    """Greedy longest-prefix match inside one word: (pieces, trace lines). If some position has
    no matching piece at all, the whole word becomes [UNK] (llama.cpp's behaviour)."""
    vs = set(vocab)
    pieces, trace, i = [], [], 0
    while i < len(word):
        for j in range(len(word), i, -1):
            cand = word[i:j]
            if cand in vs:
                tried = [word[i:k] for k in range(len(word), j, -1)]
                trace.append(f"at {i}: longest piece in the vocabulary is {cand!r}"
                             + (f" (tried {', '.join(map(repr, tried[:4]))}{', ...' if len(tried) > 4 else ''} first)" if tried else ""))
                pieces.append(cand)
                i = j
                break
        else:
            trace.append(f"at {i}: no piece starts with {word[i]!r}: the whole word becomes [UNK]")
            return ["[UNK]"], trace
    return pieces, trace


def wordpiece(text: str, vocab=WPM_VOCAB) -> list[str]:
    out = []
    for w in wpm_preprocess(text):
        out += wpm_word(w, vocab)[0]
    return out


def wordpiece_table(text: str, vocab=WPM_VOCAB) -> HTML:
    rows = []
    for w in wpm_preprocess(text):
        pieces, trace = wpm_word(w, vocab)
        rows.append([w, " | ".join(pieces), "; ".join(trace)])
    return table(["word (after normalising)", "pieces", "how"], rows)


# ---------------------------------------------------------------- Unigram

def ugm_normalize(text: str) -> str:
    """T5-style: spaces become ▁ and the text starts with one (llama.cpp's add_space_prefix)."""
    return WORD + text.replace(" ", WORD)


def viterbi(text: str, vocab: dict[str, float] = UGM_VOCAB, unk_penalty: float = 10.0):
    """The segmentation of ``text`` (already normalised) with the highest total log probability.
    best[i] is the best score of ``text[:i]``; a character no piece covers costs the lowest
    score minus ``unk_penalty`` (llama.cpp's unknown-token score). Returns (pieces, total, table
    rows of the dynamic programme)."""
    n = len(text)
    unk = min(vocab.values()) - unk_penalty
    maxlen = max(len(p) for p in vocab)
    best = [0.0] + [-math.inf] * n
    back: list[tuple[int, str] | None] = [None] * (n + 1)
    rows = []
    for end in range(1, n + 1):
        cands = []
        for start in range(max(0, end - maxlen), end):
            piece = text[start:end]
            if piece in vocab and best[start] > -math.inf:
                cands.append((best[start] + vocab[piece], start, piece))
        if not cands and best[end - 1] > -math.inf:
            cands.append((best[end - 1] + unk, end - 1, "<unk>"))
        if cands:
            score, start, piece = max(cands)
            best[end], back[end] = score, (start, piece)
        rows.append([end, repr(text[:end]), ", ".join(f"{p!r} {s:.1f}" for s, _, p in sorted(cands, reverse=True)),
                     f"{best[end]:.1f}"])
    pieces, i = [], n
    while i > 0:
        start, piece = back[i]
        pieces.append(piece if piece != "<unk>" else text[start:i])
        i = start
    return pieces[::-1], best[n], rows


def unigram(text: str, vocab: dict[str, float] = UGM_VOCAB) -> list[str]:
    return viterbi(ugm_normalize(text), vocab)[0]


def greedy_longest(text: str, vocab) -> list[str]:
    """Longest-prefix matching on the same pieces (what WordPiece would do), for comparison."""
    pieces, i = [], 0
    while i < len(text):
        j = next((j for j in range(len(text), i, -1) if text[i:j] in vocab), i + 1)
        pieces.append(text[i:j])
        i = j
    return pieces


def score(pieces: list[str], vocab: dict[str, float] = UGM_VOCAB) -> float:
    return sum(vocab[p] for p in pieces)


def viterbi_table(text: str, vocab: dict[str, float] = UGM_VOCAB) -> HTML:
    _, _, rows = viterbi(ugm_normalize(text), vocab)
    return table(["i", "prefix text[:i]", "ways to end a piece at i: piece, best[start] + score", "best[i]"], rows)
