"""The library's errors, each one clear error with nothing left half done: stale temporaries, progress
lines on Ctrl-C, library misuse (detokenize, Context, positions), batches refused before the cache changes,
work and memory bounded before the work, a model file cut short or rewritten in use, poisoned weights."""
from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmlab import LLMLabError, models

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "data" / "malformed"


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_atomic_write_removes_what_a_killed_writer_left_and_nothing_else(tmp_path):
    from llmlab.safeio import atomic_write
    out = tmp_path / "out.gguf"
    stale = tmp_path / f".out.gguf.{dead_pid()}.k2j3.tmp"
    live = tmp_path / ".out.gguf.1.x1.tmp"                   # pid 1 runs: not ours to remove
    other = tmp_path / ".other.gguf.123.tmp"
    for p in (stale, live, other):
        p.write_bytes(b"half")
    with atomic_write(out) as fh:
        fh.write(b"whole")
    assert out.read_bytes() == b"whole" and not stale.exists() and live.exists() and other.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([out.name, live.name, other.name])


def test_progress_bar_ends_its_line_when_interrupted():
    from llmlab.progress import Progress
    stream = io.StringIO()
    with pytest.raises(KeyboardInterrupt):
        with Progress(100, "quantize q8_0", stream=stream) as bar:
            bar.update(100)
            raise KeyboardInterrupt
    assert stream.getvalue().startswith("\rquantize q8_0") and stream.getvalue().endswith("\n")
    quiet = io.StringIO()
    with pytest.raises(KeyboardInterrupt):
        with Progress(100, "x", stream=quiet):
            raise KeyboardInterrupt            # nothing drawn: nothing written
    assert quiet.getvalue() == ""


# ---- a batch that cannot run leaves the KV cache as it was ----------------------------------------------------

@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from llmlab.llama.model import Model
    from llmlab.llama.tiny import write_tiny
    return Model(write_tiny(tmp_path_factory.mktemp("tiny") / "tiny.gguf", n_layer=2, seed=5))


def same(a, b) -> bool:
    import numpy as np
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("kernels", ["fast", "reference"])
def test_a_batch_without_outputs_fills_the_cache_and_returns_no_logits(tiny_model, kernels):
    """``logits="none"`` (and micro-batches of a longer batch that hold no output): the K/V are written
    as with outputs, so the next token's logits are the same bits either way."""
    from llmlab.llama.batch import Batch
    from llmlab.llama.context import Context
    ids = list(range(1, 11))
    a = Context(tiny_model, n_ctx=256, kernels=kernels)
    a.decode(Batch.from_tokens(ids, logits="last"))
    ref = a.decode(Batch.from_tokens([11], pos0=len(ids)))
    c = Context(tiny_model, n_ctx=256, kernels=kernels)
    assert c.decode(Batch.from_tokens(ids, logits="none")).shape == (0, tiny_model.hparams.n_vocab)
    assert c.kv.seq_pos_max(0) == len(ids) - 1
    assert same(c.decode(Batch.from_tokens([11], pos0=len(ids))), ref)
    b = Context(tiny_model, n_ctx=256, kernels=kernels)           # three micro-batches, only the last has an output
    for lo, hi in ((0, 4), (4, 8)):
        b.decode(Batch.from_tokens(ids[lo:hi], pos0=lo, logits="last"))
    ref = b.decode(Batch.from_tokens(ids[8:], pos0=8))
    d = Context(tiny_model, n_ctx=256, n_ubatch=4, kernels=kernels)
    assert same(d.decode(Batch.from_tokens(ids)), ref)


def test_a_decode_that_fails_midway_restores_the_cache(tiny_model, monkeypatch):
    from llmlab.llama.batch import Batch
    from llmlab.llama.context import Context
    ids = list(range(1, 9))
    c = Context(tiny_model, n_ctx=256, n_ubatch=4)
    c.decode(Batch.from_tokens(ids[:4]))
    before = c.kv.state()
    ref = Context(tiny_model, n_ctx=256, n_ubatch=4)
    ref.decode(Batch.from_tokens(ids[:4]))
    want = ref.decode(Batch.from_tokens(ids[4:], pos0=4))
    calls = []
    real = Context._graph

    def failing(self, ub, placement):
        calls.append(ub)
        if len(calls) == 2:
            raise RuntimeError("the second micro-batch fails")
        return real(self, ub, placement)
    monkeypatch.setattr(Context, "_graph", failing)
    with pytest.raises(RuntimeError, match="second micro-batch"):
        c.decode(Batch.from_tokens(ids[4:] + [9, 10], pos0=4))
    monkeypatch.undo()
    after = c.kv.state()
    import numpy as np
    assert all(np.array_equal(x, y) for x, y in zip(before, after))
    assert same(c.decode(Batch.from_tokens(ids[4:], pos0=4)), want)


# ---- library misuse: one clear error ---------------------------------------------------------------------------

def test_library_misuse_ends_in_a_clear_error(tiny_model):
    from llmlab.llama.batch import Batch, BatchError
    from llmlab.llama.context import Context
    from llmlab.llama.vocab import Tokenizer
    tok = Tokenizer.from_model(models.resolve("smollm2"))
    for ids in ([True], [1.0], ["a"]):
        with pytest.raises(LLMLabError, match="is not an integer"):
            tok.detokenize(ids)
    for bad in (1.5, "256", True):
        with pytest.raises(ValueError, match="n_ctx must be an integer"):
            Context(tiny_model, n_ctx=bad)
    c = Context(tiny_model, n_ctx=256)
    for pos, message in ((2 ** 31, "past the largest position"), (2 ** 70, "out of range"), (1.0, "must be an integer")):
        with pytest.raises(BatchError, match=message):
            c.decode(Batch().add(1, pos, logits=True) if not isinstance(pos, float) else Batch([1], [pos], [(0,)], [True]))
    with pytest.raises(BatchError, match="out of range"):
        c.decode(Batch([2 ** 64], [0], [(0,)], [True]))
    assert c.kv.seq_pos_max(0) == -1


# ---- the command line ------------------------------------------------------------------------------------------

def cli(*args, timeout: float = 120, env=None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llmlab", *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "LLMLAB_DEBUG": "", **(env or {})},
                          timeout=timeout, **kw)


CONTROL = [chr(c) for c in range(32) if chr(c) != "\n"] + ["\x7f", "\u202e"]


def test_gguf_dump_escapes_names_that_would_drive_the_terminal():
    path = CORPUS / "names_with_control_characters.gguf"
    r = cli("gguf-dump", path)
    assert r.returncode == 0 and not any(c in r.stdout for c in CONTROL), r.stdout
    assert "general.\\x1b[2J\\x1b[H\\x0dALL CHECKS PASSED\\x07" in r.stdout
    assert "blk.0.\\x1b[2J\\x0dALL CHECKS PASSED\\x07" in r.stdout
    assert not any(line.startswith("ALL CHECKS") for line in r.stdout.splitlines())
    r = cli("logits", "-m", path, "-p", "hello")
    assert r.returncode == 2 and not any(c in r.stderr for c in CONTROL) and len(r.stderr.splitlines()) == 1


def test_diff_llama_cpp_refuses_a_prompt_the_vocabulary_cannot_hold():
    pytest.importorskip("llama_cpp", reason="diff-llama-cpp needs llama-cpp-python")
    r = cli("diff-llama-cpp", "-m", CORPUS / "base.gguf", "-p", "\n")
    assert r.returncode == 2 and r.stderr.splitlines() == [
        "error: cannot tokenize '\\n': the vocabulary has no token for its byte 0x0A (neither '<0x0A>' nor the character itself)"]


# ---- work and memory bounded before the work -------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_chat_path(tmp_path_factory):
    from llmlab import models
    from llmlab.llama.tiny import write_tiny
    return write_tiny(tmp_path_factory.mktemp("tinychat") / "tiny.gguf", n_layer=1, seed=3,
                      vocab_from=models.resolve("smollm2"))


def test_logits_keeps_only_the_top_k_and_gives_the_bits_of_one_batch(tiny_chat_path):
    """``logits`` decodes the prompt one micro-batch at a time and keeps each row's top K (memory bounded
    by n_ubatch rows); the values are those of one batch of the whole prompt, cut by the context."""
    import json
    import numpy as np
    from llmlab.llama import Batch, Context, Model
    from llmlab.llama.vocab import Tokenizer
    prompt = "the quick brown fox jumps over the lazy dog, " * 55           # > 512 tokens: two micro-batches
    ids = Tokenizer.from_model(tiny_chat_path).tokenize(prompt, add_bos=True, special=True)
    assert len(ids) > 512
    r = cli("logits", "-m", tiny_chat_path, "-p", prompt, "--top", "3", "--json", timeout=300)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    ctx = Context(Model(tiny_chat_path), n_ctx=len(ids), n_batch=len(ids), n_ubatch=512)
    logits = ctx.decode(Batch.from_tokens(ids, logits="all"))
    got_ids = np.array(got["top_ids"])
    assert got["ids"] == ids and got_ids.shape == (len(ids), 3)
    assert np.array_equal(np.array(got["top_logits"], np.float32), np.take_along_axis(logits, got_ids, 1))
    rows = [0, 1, 255, 511, 512, 513, len(ids) - 1]         # the whole sort only where it is cheap
    assert got_ids[rows].tolist() == np.argsort(-logits[rows], axis=1, kind="stable")[:, :3].tolist()


def test_top_k_is_the_stable_argsort_ties_included():
    import numpy as np
    from llmlab.cli.logits import top_k
    rng = np.random.default_rng(0)
    x = rng.integers(-3, 4, (64, 50)).astype(np.float32)         # many ties
    x[0] = 0.0
    x[1, ::2] = -0.0
    for k in (1, 3, 7, 50):
        assert np.array_equal(top_k(x, k), np.argsort(-x, axis=1, kind="stable")[:, :k]), k


def test_texts_that_cannot_fit_the_context_are_refused_before_tokenizing(tiny_chat_path):
    import time
    from llmlab.llama.chat import ChatTemplateError, llama_chat_apply_template
    from llmlab.llama.validate import check_text_fits
    from llmlab.llama.vocab import Tokenizer
    tok = Tokenizer.from_model(tiny_chat_path)
    t0 = time.monotonic()
    with pytest.raises(LLMLabError, match="cannot fit in 2,048 tokens"):
        check_text_fits(tok, " " * 10_000_000, 2048)
    check_text_fits(tok, " " * 2048, 2048)
    with pytest.raises(ChatTemplateError, match="larger than"):
        llama_chat_apply_template("gemma", [{"role": "user", "content": "a" * 10_000_000}])
    assert time.monotonic() - t0 < 2
    r = cli("generate", "-m", tiny_chat_path, "-p", " " * 120_000, "--n-ctx", "256", "-n", "1")
    assert r.returncode == 2 and r.stderr.startswith("error: the prompt (120,000 characters) cannot fit in 256 tokens")


def test_bench_refuses_a_prompt_past_the_context_before_building_it(tiny_chat_path):
    r = cli("bench", "-m", tiny_chat_path, "--prompt-tokens", "4294967296", timeout=60)
    assert r.returncode == 2 and "exceed the model's context" in r.stderr and len(r.stderr.splitlines()) == 1


def test_the_vocabulary_size_is_checked_before_its_strings_are_read(monkeypatch):
    from llmlab.ggml.gguf.reader import StringArray
    from llmlab.llama.vocab import Tokenizer

    def refuse(self):
        raise AssertionError("the strings were decoded before the size check")
    monkeypatch.setattr(StringArray, "tolist", refuse)
    with pytest.raises(LLMLabError, match="the tokenizer has 35 tokens but token_embd.weight has 36 rows"):
        Tokenizer.from_model(CORPUS / "vocab_smaller_than_embd.gguf")


# ---- special-token partition: linear, and what splitting every fragment gives ---------------------------------

def _fake_vocab(tokens):
    import numpy as np
    from types import SimpleNamespace
    from llmlab.llama.vocab.vocab import Attr
    return SimpleNamespace(tokens=list(tokens), attrs=np.full(len(tokens), int(Attr.CONTROL), np.int32))


def _split_every_fragment(st, text, parse_special=True):
    """The partition as llama.cpp's tokenizer_st_partition states it: each candidate splits every raw fragment."""
    fragments = [text] if text else []
    for token_text, token_id in st.present(text, parse_special):
        out = []
        for frag in fragments:
            if isinstance(frag, int) or token_text not in frag:
                out.append(frag)
                continue
            for k, piece in enumerate(frag.split(token_text)):
                if k:
                    out.append(token_id)
                if piece:
                    out.append(piece)
        fragments = out
    return fragments


def test_partition_equals_splitting_every_fragment_with_overlapping_candidates():
    import random
    from llmlab.llama.vocab.special import SpecialTokens
    st = SpecialTokens(_fake_vocab(["ab", "ba", "aba", "b", "bab", "aa", "<x>", "x"]))
    rng = random.Random(7)
    for _ in range(3000):
        text = "".join(rng.choice("ab<x> ") for _ in range(rng.randint(0, 24)))
        assert st.partition(text, True) == _split_every_fragment(st, text), text


def test_partition_of_twenty_thousand_distinct_control_tokens_is_fast():
    import time
    from llmlab.llama.vocab.special import SpecialTokens
    st = SpecialTokens(_fake_vocab([f"<c{i}>" for i in range(20000)]))
    text = "".join(f"w<c{i}>" for i in range(20000))
    t0 = time.monotonic()
    got = st.partition(text, True)
    assert time.monotonic() - t0 < 5
    assert got == [x for i in range(20000) for x in ("w", i)]


# ---- a model file cut short or rewritten while in use -----------------------------------------------------------

def test_a_mapped_gguf_notices_it_was_truncated_or_rewritten(tmp_path):
    import shutil
    import time
    from llmlab.ggml.gguf import GGUFFile
    path = tmp_path / "m.gguf"
    shutil.copy(CORPUS / "base.gguf", path)
    f = GGUFFile(path)
    f.check_unchanged()
    time.sleep(0.01)
    with open(path, "r+b") as fh:                       # the same size, other bytes
        fh.seek(-8, 2)
        fh.write(b"\0" * 8)
    with pytest.raises(LLMLabError, match="modified while in use"):
        f.check_unchanged()
    os.truncate(path, 100)
    with pytest.raises(LLMLabError, match="truncated to 100 bytes while in use"):
        f.check_unchanged()
    f.close()


def test_sigbus_on_a_truncated_mapping_is_one_error_line_and_exit_2(tmp_path):
    script = (f"import mmap, os\nfrom llmlab import sigbus\nassert sigbus.install()\n"
              f"p = {str(tmp_path / 'f.bin')!r}\nopen(p, 'wb').write(b'x' * 65536)\n"
              f"m = mmap.mmap(os.open(p, os.O_RDONLY), 0, access=mmap.ACCESS_READ)\nos.truncate(p, 0)\nprint(m[40000])\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.splitlines() == ["error: a model file was truncated or rewritten while in use (SIGBUS reading its memory map)"]


@pytest.mark.parametrize("change", ["truncate", "overwrite"])
def test_generate_stops_with_one_error_line_when_its_model_file_changes(tiny_chat_path, tmp_path, change):
    import shutil
    path = tmp_path / "m.gguf"
    shutil.copy(tiny_chat_path, path)
    p = subprocess.Popen([sys.executable, "-m", "llmlab", "generate", "-m", str(path), "-p", "hello", "-n", "2000",
                          "--n-ctx", "2048", "--temp", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert p.stdout.read(20)                          # it is generating
        if change == "truncate":
            os.truncate(path, path.stat().st_size // 2)
        else:
            with open(path, "r+b") as fh:
                fh.seek(-4096, 2)
                fh.write(b"\0" * 4096)
        err = p.communicate(timeout=120)[1].decode()
    finally:
        p.kill()
    assert p.returncode == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("error: ") and ("while in use" in err), err


# ---- poisoned weights: the fast and the reference kernels give the same error ----------------------------------

@pytest.mark.parametrize("dot4", ["", "0"], ids=["dot4-if-host", "generic"])
@pytest.mark.parametrize("wtype, value", [("q4_1", "-inf"), ("q4_1", "nan"), ("q4_k", "nan")])
def test_a_poisoned_scale_is_the_same_error_on_both_kernel_sets(tmp_path, wtype, value, dot4):
    """One block's float16 ``m`` (q4_1) or ``d`` (q4_K) set to -inf/NaN in an FFN weight: llmlab's fast path
    quantized the poisoned activations of the next layer as zeros (all-zero logits, exit 0) where the
    reference refused them; both kernel sets must give the same result, error or logits."""
    import numpy as np
    from llmlab import models
    from llmlab.ggml.gguf import GGUFFile
    from llmlab.llama.tiny import write_tiny
    n_embd = 256 if wtype == "q4_k" else 64
    path = write_tiny(tmp_path / "tiny.gguf", n_layer=2, n_embd=n_embd, n_ff=2 * n_embd, seed=4, wtype=wtype,
                      vocab_from=models.resolve("smollm2"))
    with GGUFFile(path) as f:
        t = next(x for x in f.tensors if x.name == "blk.0.ffn_up.weight")
        at = f.data_offset + t.offset + (2 if wtype == "q4_1" else 0)         # block 0: m (q4_1) or d (q4_K)
    raw = bytearray(path.read_bytes())
    raw[at:at + 2] = np.float16(float(value)).tobytes()
    path.write_bytes(bytes(raw))
    fast, ref = [cli("logits", "-m", path, "-p", "hello world", "--kernels", k, timeout=300, env={"LLMLAB_DOT4": dot4})
                 for k in ("fast", "reference")]
    assert (fast.returncode, fast.stdout, fast.stderr) == (ref.returncode, ref.stdout, ref.stderr)
    if wtype == "q4_1":     # the NaN reaches the logits
        assert ref.returncode == 2 and ref.stderr.startswith("error: the model produced non-finite logits"), ref.stderr
    else:                   # q8_K's quantizer passes over NaN as ggml's C loop does (code 0): finite, on both paths
        assert ref.returncode == 0, ref.stderr


def test_a_word_too_long_for_memory_is_refused_before_its_merge(monkeypatch):
    from llmlab.llama.vocab import Tokenizer, bpe
    tok = Tokenizer.from_model(models.resolve("smollm2"))
    monkeypatch.setattr(bpe, "MERGE_BYTES_PER_SYMBOL", 1 << 40)     # as if memory were tiny
    assert tok.tokenize("hello world") == [28120, 905]                  # short words: no check at all
    with pytest.raises(LLMLabError, match="run of 300,000 characters .* would need about"):
        tok.tokenize(" " * 300_000)
