"""Tokenizers against llama.cpp's reference ids (llmlab/data/refs) and their own invariants."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import ref_tokens
from llmlab import LLMLabError, models
from llmlab.llama.vocab import Tokenizer, Vocab
from llmlab.llama.vocab.pretokenize import PRE_TOKENIZERS, PreTokenizer
from llmlab.llama.vocab.stream import StreamDecoder

_TOKENIZERS: dict[str, Tokenizer] = {}


def tokenizer(name: str) -> Tokenizer:
    if name not in _TOKENIZERS:
        _TOKENIZERS[name] = Tokenizer.from_model(models.resolve(name))
    return _TOKENIZERS[name]


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def tok(request) -> Tokenizer:
    return tokenizer(request.param)


# text that exercises the tricky parts: whitespace runs, digits, contractions, special-token text
ALPHABET = ["a", "Z", "the", " ", "  ", "\t", "\n", "\r", "1", "42", "'s", "'", "é", "e\u0301", "中", "文", "，", "。",
            "🙂", "👨\u200d👩\u200d👧", "\u3000", "\u00a0", "x²", "٣", "<|im_start|>", "<|im_end|>", "<s>", "</s>", "<bos>",
            "<start_of_turn>", "<table>", "▁", "Ġ", "\x00", "~", "$", "€", "ß", "İ", "\ufeff", ">▁</", "<0x41>",
            "<unused0>", "<end_of_turn>", "<|endoftext|>", "<pad>", "[multimodal]", "<b>"]
texts = st.one_of(
    st.lists(st.sampled_from(ALPHABET), max_size=24).map("".join),
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=24),
    st.text(st.sampled_from(" \t\n\u3000a1"), max_size=16),
)


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_reference_cases(name):
    """Every shared llama.cpp case: plain, special and BOS variants."""
    tok = tokenizer(name)
    for case in ref_tokens(name):
        t = case["text"]
        assert tok.tokenize(t) == case["ids"], t
        assert tok.tokenize(t, special=True) == case["ids_special"], t
        assert tok.tokenize(t, add_bos=True) == case["ids_bos"], t
        assert tok.detokenize(case["ids"]) == t
        assert tok.detokenize(case["ids_bos"]) == t   # BOS renders as nothing


@pytest.mark.slow   # gguf-py takes ~20 s to read Gemma 3's vocabulary
@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_vocab_matches_gguf_py(name):
    """Tokens, scores, types and merges as gguf-py reads them."""
    gguf = pytest.importorskip("gguf", reason="gguf-py is not installed (optional oracle)")
    from llmlab import models
    path = models.resolve(name)
    r = gguf.GGUFReader(path)
    v = Vocab.from_file(path)

    def field(key):
        f = r.fields[key]
        return [bytes(f.parts[i]).decode() for i in f.data] if f.types[-1] == gguf.GGUFValueType.STRING \
            else np.array([f.parts[i][0] for i in f.data])
    assert v.tokens == field("tokenizer.ggml.tokens")
    assert np.array_equal(v.types, field("tokenizer.ggml.token_type"))
    if "tokenizer.ggml.scores" in r.fields:
        assert np.array_equal(v.scores, field("tokenizer.ggml.scores"))
    if "tokenizer.ggml.merges" in r.fields:
        assert sorted(v.merges, key=v.merges.get) == field("tokenizer.ggml.merges")
    assert v.bos == int(r.fields["tokenizer.ggml.bos_token_id"].parts[-1][0])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=texts)
def test_smollm_fused_split_equals_sequential(text):
    """SmolLM's one-pass regex gives the segments of llama.cpp's two regexes applied in sequence."""
    pre = PRE_TOKENIZERS["smollm"]
    assert pre.split(text) == PreTokenizer.split(pre, text)
    assert "".join(pre.split(text)) == text


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.lists(st.sampled_from(ALPHABET + ["hello", " world", "苹果公司", "▁", "▁▁", "\n\n"]), max_size=30).map("".join))
def test_spm_safe_cuts(text):
    """Cutting where no token holds the pair around the cut changes nothing (the SPM cache's premise)."""
    spm = tokenizer("gemma3").algorithm
    text = text.replace(" ", "▁")
    assert spm.encode(text) == spm.encode_chunk(text)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=texts)
def test_stream_decoder_joins_to_detokenize(text):
    for name in ("smollm2", "gemma3"):
        tok = tokenizer(name)
        ids = tok.tokenize(text, add_bos=True)
        dec = StreamDecoder(tok)
        assert "".join(dec.push(i) for i in ids) + dec.flush() == tok.detokenize(ids)


def test_stream_decoder_holds_back_partial_characters():
    tok = tokenizer("smollm2")
    ids = tok.tokenize("苹果")   # 苹 is three byte tokens in SmolLM2
    pieces = [tok.token_to_piece(i) for i in ids]
    assert len(pieces[0]) == 1 and b"".join(pieces) == "苹果".encode()
    dec = StreamDecoder(tok)
    out = [dec.push(i) for i in ids]
    assert out[0] == "" and dec.pending == b"" and "".join(out) == "苹果"
    dec = StreamDecoder(tok)
    dec.push(ids[0])
    assert dec.pending == pieces[0]
    assert dec.flush() == "\ufffd"


def test_bpe_merge_replay(tok):
    word = "tokenization" if tok.kind == "BPE" else "▁tokenization"
    steps = tok.algorithm.trace(word)
    assert steps, "a word of known pieces must merge"
    final = steps[-1].symbols
    assert "".join(final) == (tok.algorithm.byte_symbols(word) if tok.kind == "BPE" else word)
    ids = tok.tokenize(word.replace("▁", " "))
    assert [tok.vocab.token_to_id[s] for s in final] == ids


def test_special_tokens_only_when_asked():
    tok = tokenizer("smollm2")
    im_start = tok.vocab.token_to_id["<|im_start|>"]
    assert im_start not in tok.tokenize("<|im_start|>user")
    assert tok.tokenize("<|im_start|>user", special=True)[0] == im_start
    assert tok.detokenize([im_start]) == "" and tok.detokenize([im_start], special=True) == "<|im_start|>"


def test_errors(tok):
    with pytest.raises(LLMLabError, match="outside the vocabulary"):
        tok.detokenize([len(tok)])
    with pytest.raises(LLMLabError, match="outside the vocabulary"):
        tok.detokenize([-1])
    with pytest.raises(LLMLabError, match="not valid Unicode"):
        tok.tokenize("a\ud800b")
    assert tok.tokenize("") == []
    assert tok.tokenize("", add_bos=True) == ([tok.vocab.bos] if tok.vocab.add_bos else [])


def test_unsupported_pre_tokenizer(tmp_path):
    from llmlab import models
    from llmlab.ggml.gguf import GGUFFile, GGUFWriter
    with GGUFFile(models.resolve("smollm2")) as f:
        w = GGUFWriter.from_file(f)
    w.tensors.clear()
    w.add("tokenizer.ggml.pre", "no-such-pre")
    w.write(tmp_path / "v.gguf")
    with pytest.raises(LLMLabError, match="unsupported pre-tokenizer 'no-such-pre'"):
        Tokenizer(Vocab.from_file(tmp_path / "v.gguf"))


def _cli(*args, stdin=None):
    return subprocess.run([sys.executable, "-m", "llmlab", *args], capture_output=True, text=True, input=stdin)


def test_cli_tokenize_and_detokenize(tmp_path):
    case = ref_tokens("gemma3")[12]
    r = _cli("tokenize", "-m", "gemma3", "--text", case["text"], "--bos", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"ids": case["ids_bos"]}
    f = tmp_path / "t.txt"
    f.write_text(case["text"], encoding="utf-8")
    r = _cli("tokenize", "-m", "gemma3", "--file", str(f))
    assert r.returncode == 0 and [int(l.split("->")[0]) for l in r.stdout.splitlines()] == case["ids"]
    r = _cli("detokenize", "-m", "gemma3", *map(str, case["ids_bos"]))
    assert r.returncode == 0 and r.stdout == case["text"] + "\n"


def test_cli_errors(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"ok \xff\xfe no")
    r = _cli("tokenize", "--file", str(bad))
    assert r.returncode == 2 and "not valid UTF-8" in r.stderr and "offset 3" in r.stderr and "Traceback" not in r.stderr
    r = _cli("detokenize", "1", "49152")
    assert r.returncode == 2 and "outside the vocabulary" in r.stderr
    r = _cli("detokenize", "one")
    assert r.returncode == 2 and "not a token id" in r.stderr
