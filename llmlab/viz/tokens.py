"""Pictures of tokenization: coloured token boundaries, merge replays, vocabulary statistics."""
from __future__ import annotations

import html as _html

import numpy as np

from ..llama.vocab import Attr, Tokenizer
from ..llama.vocab.stream import StreamDecoder
from .html import HTML, table

PALETTE = ["#fde2a7", "#c8e6f5", "#d5f0c8", "#f6cde0", "#e0d4f7", "#fbd3b8"]
FAMILIES = [   # the four algorithm families of llama.cpp (llama_vocab_type), as the seed article lists them
    ("SPM", "SentencePiece BPE", "LLaMA 1/2, Gemma", "llama",
     "split into characters, repeatedly merge the adjacent pair whose merged token scores highest"),
    ("BPE", "byte-level BPE", "LLaMA 3, GPT-2, SmolLM", "gpt2",
     "regex pre-tokenization into words, then merge byte pairs in merge-rank order"),
    ("WPM", "WordPiece", "BERT", "bert", "split on spaces, greedy longest-prefix match inside each word"),
    ("UGM", "Unigram", "T5", "t5", "Viterbi dynamic programming: the segmentation with the best total score"),
]


# whitespace drawn as a visible sign (an invisible space or newline would leave a blank box)
VISIBLE_WHITESPACE = {" ": "\u2423", "\n": "\u21b5", "\t": "\u2192", "\r": "\u240d"}      # ␣ ↵ → ␍


def visible(s: str) -> str:
    """``s`` with each space, newline, tab and carriage return written as ␣, ↵, →, ␍."""
    return "".join(VISIBLE_WHITESPACE.get(c, c) for c in s)


def _visible(s: str) -> str:
    return _html.escape(visible(s))


def piece_label(tok: Tokenizer, i: int) -> str:
    """What to print for one token: its text, or its bytes in hex when they are not a whole character."""
    b = tok.token_to_piece(i, special=True)
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return "".join(f"<{x:02X}>" for x in b)


def tokens_html(tok: Tokenizer, text: str, add_bos: bool = False, special: bool = False,
                ids: list[int] | None = None) -> HTML:
    """The tokens of ``text`` as coloured boxes (hover: id and vocabulary entry). Spaces show as ␣,
    newlines as ↵, special tokens in bold, bytes of a split character as <XX>."""
    ids = tok.tokenize(text, add_bos=add_bos, special=special) if ids is None else ids
    spans = []
    for k, i in enumerate(ids):
        label = piece_label(tok, i)
        attr = int(tok.vocab.attrs[i])
        weight = "bold" if attr & (Attr.CONTROL | Attr.USER_DEFINED) else "normal"
        title = _html.escape(f"id {i}: {tok.vocab.tokens[i]!r}")
        spans.append(f"<span title='{title}' style='background:{PALETTE[k % len(PALETTE)]};padding:1px 2px;"
                     f"margin:0 1px;border-radius:3px;font-family:monospace;font-weight:{weight}'>"
                     f"{_visible(label)}</span>")
    return HTML(f"<div style='line-height:1.9'>{''.join(spans)} <span style='color:#888'>({len(ids)} tokens)</span></div>")


def compare_html(tokenizers: dict[str, Tokenizer], texts: list[str], add_bos: bool = False,
                 special: bool = False) -> HTML:
    """One row per text, one column per tokenizer, boundaries coloured, with the ids underneath."""
    head = "".join(f"<th style='text-align:left'>{_html.escape(n)}</th>" for n in tokenizers)
    rows = []
    for t in texts:
        cells = []
        for tok in tokenizers.values():
            ids = tok.tokenize(t, add_bos=add_bos, special=special)
            cells.append(f"<td style='text-align:left;vertical-align:top'>{tokens_html(tok, t, ids=ids)}"
                         f"<div style='font-family:monospace;font-size:80%;color:#555'>{ids}</div></td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return HTML(f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>")


def fragments_html(tok: Tokenizer, text: str, special: bool) -> HTML:
    """The partition step: raw text fragments (plain) and special tokens already decided (bold)."""
    out = []
    for f in tok.fragments(text, special):
        if isinstance(f, int):
            out.append(f"<b style='background:#f6cde0;padding:1px 3px'>{_visible(tok.vocab.tokens[f])}"
                       f" = {f}</b>")
        else:
            out.append(f"<span style='background:#eee;padding:1px 3px;font-family:monospace'>{_visible(f)}</span>")
    return HTML(" ".join(out))


def families_table(tokenizers: dict[str, Tokenizer]) -> HTML:
    """The four families with the real models here that use each."""
    rows = []
    for short, name, models, gguf_model, idea in FAMILIES:
        here = ", ".join(n for n, t in tokenizers.items() if t.vocab.model == gguf_model) or "-"
        rows.append([short, name, f"tokenizer.ggml.model = {gguf_model}", idea, models, here])
    return table(["family", "name", "GGUF", "core idea", "typical models", "real model here"], rows)


def bpe_replay_table(tok: Tokenizer, word: str) -> HTML:
    """Every merge of one pre-tokenized word: which pair merged at which rank, and the symbols after."""
    rows = [[k + 1, m.rank, f"{m.left} + {m.right}", " | ".join(m.symbols)]
            for k, m in enumerate(tok.algorithm.trace(word))]
    return table(["step", "merge rank", "pair", "symbols after the merge"], rows)


def spm_replay_table(tok: Tokenizer, text: str) -> HTML:
    """Every merge SentencePiece makes on ``text`` (spaces escaped to ▁), highest score first."""
    rows = [[k + 1, f"{b.score + 0.0:.2f}", f"{b.left} + {b.right}", " | ".join(b.symbols)]
            for k, b in enumerate(tok.algorithm.trace(text.replace(" ", "\u2581")))]
    return table(["step", "score of merged token", "pair", "symbols after the merge"], rows)


def plot_replay(symbols0: list[str], steps, title: str = "", ax=None):
    """Staircase picture of a merge replay: one row per step, one box per symbol (width = characters)."""
    import matplotlib.pyplot as plt
    rows = [list(symbols0)] + [s.symbols for s in steps]
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 0.4 * len(rows) + 0.9))
    for y, syms in enumerate(rows):
        x = 0
        for k, s in enumerate(syms):
            w = len(s)
            ax.add_patch(plt.Rectangle((x, -y - 0.4), w, 0.8, facecolor=PALETTE[k % len(PALETTE)], edgecolor="#555"))
            ax.text(x + w / 2, -y, s, ha="center", va="center", fontsize=11, family="monospace")
            x += w
    n = max(len("".join(r)) for r in rows)
    ax.set_xlim(0, n)
    ax.set_ylim(-len(rows) + 0.5, 0.5)
    ax.set_yticks([-y for y in range(len(rows))], ["start"] + [f"step {k}" for k in range(1, len(rows))])
    ax.set_xticks([])
    ax.set_title(title)
    for side in ("top", "right", "bottom"):
        ax.spines[side].set_visible(False)
    return ax.figure


def characters_html(tok: Tokenizer, text: str, px: int = 36) -> HTML:
    """Each character of ``text`` (spaces left out): drawn from a font outline (``fonts.glyph_svg``,
    so it shows even where the browser has no font for it), its code point, Unicode name, UTF-8
    bytes, and the tokens it became: one vocabulary entry, or byte fallback's <0xXX> tokens."""
    import unicodedata

    from . import fonts
    head = "".join(f"<th style='text-align:left'>{h}</th>" for h in
                   ("character", "code point", "Unicode name", "UTF-8", "tokens", "how"))
    rows = []
    for ch in dict.fromkeys(c for c in text if not c.isspace()):
        ids = tok.tokenize(ch)
        if ids and tok.vocab.tokens[ids[0]] == "\u2581":       # a word-initial ▁ SentencePiece put in front
            ids = ids[1:]
        how = ("one vocabulary entry" if len(ids) == 1 else
               f"byte fallback: {len(ids)} byte tokens" if all(int(tok.vocab.attrs[i]) & Attr.BYTE for i in ids) else
               f"{len(ids)} tokens, pieces of its UTF-8 bytes")
        glyph = fonts.glyph_svg(ch, px) or f"<span style='font-size:{px * 0.6:.0f}px'>{_html.escape(ch)}</span>"
        entries = " ".join(_html.escape(tok.vocab.tokens[i]) for i in ids)
        nowrap = "<span style='white-space:nowrap'>{}</span>".format
        cells = [glyph, nowrap(f"U+{ord(ch):04X}"), unicodedata.name(ch, "?").lower(), nowrap(ch.encode("utf-8").hex(" ")),
                 f"{ids}<br><code>{entries}</code>",
                 how]
        rows.append("<tr>" + "".join(f"<td style='text-align:left;vertical-align:middle'>{c}</td>" for c in cells) + "</tr>")
    return HTML(f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>")


def stream_rows(tok: Tokenizer, text: str) -> list[list]:
    """Feeding the ids of ``text`` to a StreamDecoder one at a time: what is printed, what waits."""
    dec, rows = StreamDecoder(tok), []
    for i in tok.tokenize(text):
        out = dec.push(i)
        rows.append([i, tok.token_to_piece(i).hex(" "), repr(out), dec.pending.hex(" ") or "-"])
    return rows


# -- vocabulary statistics ---------------------------------------------------
def _script(s: str) -> str:
    if any(0x4E00 <= ord(c) <= 0x9FFF or 0x3400 <= ord(c) <= 0x4DBF or 0xF900 <= ord(c) <= 0xFAFF
           or 0x20000 <= ord(c) <= 0x2FFFF for c in s):
        return "Chinese (CJK ideographs)"
    letters = [c for c in s if c.isalpha()]
    if letters and all("a" <= c.lower() <= "z" for c in letters):
        return "English letters"
    if letters:
        return "other scripts"
    return "digits, punctuation, space"


def vocab_stats(tok: Tokenizer) -> dict:
    """Token types, byte lengths of the pieces and which script each normal token is written in."""
    v = tok.vocab
    lengths, scripts, types = [], {}, {}
    for i in range(len(v)):
        attr = int(v.attrs[i])
        kind = ("control" if attr & Attr.CONTROL else "user-defined" if attr & Attr.USER_DEFINED else
                "byte" if attr & Attr.BYTE else "normal" if attr & Attr.NORMAL else "other")
        types[kind] = types.get(kind, 0) + 1
        if kind != "normal":
            continue
        b = tok.token_to_piece(i)
        lengths.append(len(b))
        try:
            sc = _script(b.decode("utf-8"))
        except UnicodeDecodeError:
            sc = "part of a character"
        scripts[sc] = scripts.get(sc, 0) + 1
    return {"types": types, "lengths": np.array(lengths), "scripts": scripts}


def plot_vocab_stats(stats: dict[str, dict], figsize=(10, 4.8)):
    """Left: histogram of token lengths in bytes; right: how many ids each script gets."""
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=figsize, width_ratios=[1, 1.3])
    bins = np.arange(1, 33) - 0.5
    for name, s in stats.items():
        a.hist(np.minimum(s["lengths"], 31), bins=bins, histtype="step", linewidth=1.8,
               label=f"{name} (mean {s['lengths'].mean():.1f} B)")
    a.set_xlabel("token length in UTF-8 bytes (31 = 31 or more)")
    a.set_ylabel("number of tokens")
    a.legend(loc="upper right", fontsize=10)
    keys = sorted({k for s in stats.values() for k in s["scripts"]})
    x = np.arange(len(keys))
    w = 0.8 / len(stats)
    for k, (name, s) in enumerate(stats.items()):
        vals = [s["scripts"].get(key, 0) for key in keys]
        bars = b.bar(x + k * w, vals, w, label=name)
        b.bar_label(bars, fontsize=10, rotation=90, padding=3)
    short = {"Chinese (CJK ideographs)": "Chinese\n(CJK)", "digits, punctuation, space": "digits,\npunctuation,\nspace"}
    b.set_xticks(x + w * (len(stats) - 1) / 2, [short.get(k, k.replace(" ", "\n", 1)) for k in keys], fontsize=10)
    b.set_yscale("log")
    b.set_ylim(0.8, max(max(s["scripts"].values()) for s in stats.values()) * 40)   # room for the numbers
    b.set_ylabel("normal tokens")
    b.legend(loc="upper left", fontsize=10, ncol=2)
    fig.tight_layout()
    return fig
