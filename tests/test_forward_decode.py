"""Decoding in pieces: the same tokens fed one at a time, in small batches or as one prefill give
llama.cpp's logits bit for bit, and greedy generation reproduces llama.cpp's continuations.

A one-token micro-batch takes other kernels than a batch of two or more: llamafile's tinyBLAS
refuses a single activation row, so ggml-cpu computes KQ and KQV with ``ggml_vec_dot_f16``,
which adds the products in another order. The first decode step where that order changes a
logit (SmolLM2, prompt 0) comes after an 11-token prefill, hence the chunkings below.
"""
from __future__ import annotations

import numpy as np
import pytest

from conftest import REF_PROFILES, ref_logits
from llmlab.llama import Batch, Context, Model

N_SEQ = 24                     # prompt 0 (8 tokens) and the first 16 tokens of its greedy continuation


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    return Model(smollm2_path)


@pytest.fixture(scope="module")
def llama(smollm2_path):
    """llama.cpp as llama-cpp-python's ``Llama(n_ctx=256, n_threads=2, logits_all=True)`` sets it up (flash
    attention off, f16 KV cache, batches of 256), in the llama.cpp worker."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (optional oracle)")
    from llmlab.llamacpp.session import Session
    from llmlab.llamacpp.worker import open_remote
    sess = open_remote(Session, str(smollm2_path), n_ctx=256, n_batch=256, n_threads=2, flash_attn=False,
                       no_perf=False)
    yield sess
    sess.close()


def sequence(n: int = N_SEQ) -> list[int]:
    npz = ref_logits("smollm2")[1]
    return (npz["p0_ids"].tolist() + npz["p0_greedy"].tolist())[:n]


def llama_cpp_chunks(llm, seq: list[int], chunks: tuple[int, ...]) -> np.ndarray:
    """llama.cpp's logits at every position when ``seq`` is decoded in ``chunks`` (one llama_decode each)."""
    return llm.eval_chunks(seq, list(chunks))


def llmlab_chunks(model, seq: list[int], chunks: tuple[int, ...]) -> np.ndarray:
    ctx = Context(model, n_ctx=256)
    out, i = [], 0
    for c in chunks:
        out.append(ctx.decode(Batch.from_tokens(seq[i:i + c], pos0=i, logits="all")))
        i += c
    return np.concatenate(out)


def assert_same_logits(got: np.ndarray, want: np.ndarray) -> None:
    bad = np.flatnonzero((got != want).any(1))
    assert not bad.size, (f"positions {bad.tolist()} differ from llama.cpp "
                          f"(max |diff| {np.abs(got - want).max():.3g})")


@pytest.mark.llamacpp_exact
def test_one_token_decode_after_prefill_bit_exact(smollm2, llama):
    """The smallest case that tells the two f16 kernels apart: 11 tokens, then one."""
    seq = sequence(12)
    chunks = (11, 1)
    assert_same_logits(llmlab_chunks(smollm2, seq, chunks), llama_cpp_chunks(llama, seq, chunks))


def _mixed(seed: int, n: int, most: int) -> tuple[int, ...]:
    rng = np.random.default_rng(seed)
    out: list[int] = []
    while sum(out) < n:
        out.append(min(int(rng.integers(1, most + 1)), n - sum(out)))
    return tuple(out)


CHUNKINGS = {
    "singles": (1,) * N_SEQ,
    "prefill11+singles": (11,) + (1,) * (N_SEQ - 11),
    "prefill8+singles": (8,) + (1,) * (N_SEQ - 8),
    "pairs": (2,) * (N_SEQ // 2),
    "mixed1-4": _mixed(0, N_SEQ, 4),
    "mixed1-6": _mixed(1, N_SEQ, 6),
}


@pytest.mark.slow
@pytest.mark.llamacpp_exact
@pytest.mark.parametrize("chunks", list(CHUNKINGS.values()), ids=list(CHUNKINGS))
def test_every_chunking_matches_llama_cpp_bit_for_bit(smollm2, llama, chunks):
    """Single tokens and small batches, in any mix, against llama.cpp decoding the same chunks."""
    seq = sequence()
    assert sum(chunks) == len(seq) >= 20
    assert_same_logits(llmlab_chunks(smollm2, seq, chunks), llama_cpp_chunks(llama, seq, chunks))


def greedy_agreement(model, name: str, i: int, n: int, cpu: str) -> tuple[list[int], list[int]]:
    """llmlab's greedy continuation of ref prompt ``i`` (prefill, then one token at a time) emulating
    ``cpu``, stopped at the first token that differs from llama.cpp's on that CPU, and the ref's first
    ``n`` tokens."""
    npz = ref_logits(name, cpu)[1]
    ids, want = npz[f"p{i}_ids"].tolist(), npz[f"p{i}_greedy"].tolist()[:n]
    ctx = Context(model, n_ctx=256, cpu=cpu)
    logits = ctx.decode(Batch.from_tokens(ids, logits="last"))[-1]
    got: list[int] = []
    for k, w in enumerate(want):
        got.append(int(np.argmax(logits)))
        if got[-1] != w or k == len(want) - 1:
            break
        logits = ctx.decode(Batch.from_tokens([got[-1]], pos0=len(ids) + k, logits="last"))[-1]
    return got, want


@pytest.fixture(scope="module")
def models_by_name(smollm2, gemma3_path):
    return {"smollm2": smollm2, "gemma3": Model(gemma3_path)}


# all 48 ref tokens (or up to the ref's EOS) agree for every ref prompt of both models, on each profile
@pytest.mark.slow
@pytest.mark.parametrize("cpu", REF_PROFILES)
@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
@pytest.mark.parametrize("i", [0, 1, 2, 3, 4])
def test_greedy_continuation_equals_llama_cpp(models_by_name, name, i, cpu):
    """Prefill, then one token at a time: llama.cpp's whole greedy continuation (48 tokens or to EOS)."""
    got, want = greedy_agreement(models_by_name[name], name, i, 48, cpu)
    assert got == want
