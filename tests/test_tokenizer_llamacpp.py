"""Live comparison with llama.cpp (llama-cpp-python, vocab only, in the llama.cpp worker) on generated text."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from llmlab import models
from llmlab.llama.vocab import Tokenizer, Vocab

llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (optional oracle)")

from test_tokenizer import ALPHABET, texts, tokenizer  # noqa: E402
from llmlab.llamacpp import session  # noqa: E402
from llmlab.llamacpp.worker import isolated  # noqa: E402

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                          HealthCheck.function_scoped_fixture])
def llama(path) -> str:
    """The model whose vocabulary the worker loads (once per file)."""
    return str(path)


def llama_tokenize(llm: str, raw: bytes, add_bos: bool, special: bool) -> list[int]:
    return isolated(session.tokenize, llm, raw, add_bos, special)


def llama_detokenize(llm: str, ids: list[int], special: bool) -> bytes:
    """``llama_detokenize`` itself (``Llama.detokenize`` goes piece by piece through a 32-byte buffer)."""
    return isolated(session.detokenize, llm, ids, special)


def check(tok: Tokenizer, llm: str, text: str) -> None:
    raw = text.encode()
    for add_bos in (False, True):
        for special in (False, True):
            want = llama_tokenize(llm, raw, add_bos=add_bos, special=special)
            assert tok.tokenize(text, add_bos=add_bos, special=special) == want, (text, add_bos, special)
    for special in (False, True):
        assert tok.detokenize_bytes(want, special) == llama_detokenize(llm, want, special)
    plain = llama_tokenize(llm, raw, add_bos=False, special=False)
    if llama_detokenize(llm, plain, False) == raw:   # round trip wherever llama.cpp's does
        assert tok.detokenize(tok.tokenize(text)) == text


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_every_token_piece(name):
    """``token_to_piece`` of every id, with and without special, equals ``llama_token_to_piece``."""
    tok, llm = tokenizer(name), llama(models.resolve(name))
    for special in (False, True):
        pieces = isolated(session.token_pieces, llm, special)
        assert len(pieces) == len(tok)
        for i in range(len(tok)):
            assert tok.token_to_piece(i, special) == pieces[i], (i, special)


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_live_against_llama_cpp(name):
    tok, llm = tokenizer(name), llama(models.resolve(name))

    @SETTINGS
    @given(text=texts)
    def run(text):
        check(tok, llm, text)
    run()


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_live_long_mixed_text(name):
    """Longer text mixing scripts, code and whitespace, where caches and cuts come into play."""
    tok, llm = tokenizer(name), llama(models.resolve(name))

    @settings(max_examples=25, deadline=None)
    @given(text=st.lists(st.sampled_from(ALPHABET + ["hello", " world", "The", " quick", "苹果公司发布了",
                                                     "def f(x):\n    return x", "    ", "1,000,000"]),
                         min_size=50, max_size=300).map("".join))
    def run(text):
        check(tok, llm, text)
    run()


@pytest.fixture(scope="module")
def smollm2_vocab_only(tmp_path_factory):
    from llmlab.ggml.gguf import GGUFFile, GGUFWriter
    with GGUFFile(models.resolve("smollm2")) as f:
        w = GGUFWriter.from_file(f)
    w.tensors.clear()
    return w, tmp_path_factory.mktemp("pre")


@pytest.mark.parametrize("pre", ["gpt-2", "default", "llama-bpe", "qwen2", "starcoder", "stablelm2", "dbrx"])
def test_live_pre_tokenizer_families(pre, smollm2_vocab_only):
    """SmolLM2's vocabulary relabelled with other pre-tokenizers: each regex family against llama.cpp."""
    w, tmp = smollm2_vocab_only
    w.add("tokenizer.ggml.pre", pre)
    path = tmp / f"{pre}.gguf"
    w.write(path)
    tok, llm = Tokenizer(Vocab.from_file(path)), llama(path)
    for text in ["I ' m here . ' ' x 's 're 've 'll 't 'd ,!?", " ' ' ' a", "a ' ' b ' c", "x 'r 'v 'l ' 'm"]:
        check(tok, llm, text)   # the clean_spaces passes of the BPE detokenizer

    @settings(max_examples=60, deadline=None)
    @given(text=texts)
    def run(text):
        check(tok, llm, text)
    run()
