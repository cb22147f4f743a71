"""The generation loop: stops (end of generation, budget, stop strings), UTF-8 safe streaming,
timings, a clean cache after an interrupt, and greedy continuations equal to llama.cpp's."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from itertools import islice
from pathlib import Path

import numpy as np
import pytest

from conftest import ref_logits
from llmlab import LLMLabError, models
from llmlab.generate import Generation, generate, greedy, prefill_decode_run
from llmlab.llama.sampling import SamplingParams, common_sampler_init
from llmlab.llama import Batch, Context, Model
from llmlab.llama.tiny import write_tiny
from llmlab.llama.vocab import Tokenizer

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny random llama with SmolLM2's tokenizer: the loop's mechanics in milliseconds."""
    src = models.resolve("smollm2")
    path = write_tiny(tmp_path_factory.mktemp("gen") / "tiny.gguf", n_layer=2, seed=1, vocab_from=src)
    return Model(path), Tokenizer.from_model(src)


def scripted(tokens):
    """A 'sampler' that ignores the logits and plays back ``tokens``."""
    it = iter(tokens)
    return lambda logits: next(it)


def run(tiny, script, prompt="Hi", n_predict=-1, stop=(), ctx=None):
    model, tok = tiny
    ctx = ctx or Context(model, n_ctx=256)
    out = Generation()
    items = list(generate(ctx, tok, tok.tokenize(prompt), n_predict, scripted(script), stop, result=out))
    return items, out, ctx


def test_greedy_is_the_hand_written_loop_bit_for_bit(tiny):
    """bench, the RPC lab, notebooks 03 and 04 take their greedy tokens from generate.greedy: the tokens,
    logits and positions of prefill then one-token decodes with argmax, and generate's default sampler agrees."""
    model, tok = tiny
    ids = tok.tokenize("The capital of France is", add_bos=True)
    ctx = Context(model, n_ctx=64)
    logits = ctx.decode(Batch.from_tokens(ids, logits="last"))[-1]
    want, want_logits = [], []
    for i in range(6):
        want.append(int(np.argmax(logits)))
        want_logits.append(logits)
        logits = ctx.decode(Batch.from_tokens([want[-1]], pos0=len(ids) + i, logits="last"))[-1]
    steps = list(islice(greedy(Context(model, n_ctx=64), ids), 7))
    assert [s.token for s in steps[:6]] == want and steps[0].tokens == ids
    assert all(np.array_equal(s.logits, lg) for s, lg in zip(steps, want_logits + [logits]))
    assert [s.pos0 for s in steps] == [0] + [len(ids) + i for i in range(6)] and all(s.decode_s > 0 for s in steps)
    got = [t for t, _ in generate(Context(model, n_ctx=64), tok, ids, 6)]
    assert got == want[:len(got)] and (len(got) == 6 or got[-1] in tok.vocab.eog)
    run = prefill_decode_run(model.path, ids, n_decode=4, n_ctx=64)
    assert run["generated"] == want[:4] and np.array_equal(run["last_logits"], want_logits[4])
    assert run["n_prompt"] == len(ids) and len(run["decode_s"]) == 4
    fresh = Context(model, n_ctx=64).decode(Batch.from_tokens(ids + want[:4], logits="last"))[-1]
    assert np.array_equal(run["fresh_logits"], fresh)


def test_stops_at_an_end_of_generation_token(tiny):
    _, tok = tiny
    eog = tok.tokenize("<|im_end|>", special=True)[0]
    assert eog in tok.vocab.eog
    body = tok.tokenize(" Paris.")
    items, out, ctx = run(tiny, body + [eog, 7, 7])
    assert [t for t, _ in items] == body + [eog] and out.ids == body and out.eog == eog
    assert out.text == " Paris." and out.stop_reason == "eog" and out.pending == [eog]
    assert out.n_past == len(tok.tokenize("Hi")) + len(body) == ctx.kv.seq_pos_max(0) + 1


def test_stops_at_n_predict_without_decoding_the_last_token(tiny):
    items, out, ctx = run(tiny, [100, 101, 102, 103], n_predict=3)
    assert out.ids == [100, 101, 102] and out.stop_reason == "length" and out.pending == [102]
    assert out.n_decoded == 1 + 2 and ctx.kv.seq_pos_max(0) + 1 == out.n_past == 3
    t = out.timings
    assert (t.n_prompt, t.n_eval, t.n_sample) == (1, 2, 3) and t.t_first >= t.t_prompt > 0
    assert t.prompt_tokens_per_s > 0 and t.decode_tokens_per_s > 0


def test_stop_strings_cut_the_text_and_hold_back_what_may_start_one(tiny):
    _, tok = tiny
    ids = tok.tokenize("Hello world. The end")
    items, out, _ = run(tiny, ids, stop=["The end"])
    assert out.text == "Hello world. " and out.stop_reason == "stop"
    assert "".join(t for _, t in items) == out.text
    items, out, _ = run(tiny, ids, n_predict=len(ids), stop=["world!", "The beginning"])
    assert out.text == "Hello world. The end" and out.stop_reason == "length"
    assert [tok.detokenize([i]) for i in ids[:3]] == ["Hello", " world", "."]
    assert [t for _, t in items][:3] == ["Hello", " ", "world."]   # "world" waited: it might become "world!"


def test_text_streams_whole_characters_only(tiny):
    _, tok = tiny
    text = "苹果公司发布了一款新的手机，🙂"
    ids = tok.tokenize(text)
    assert len(ids) > len(text) // 2    # byte-level pieces that end inside characters
    items, out, _ = run(tiny, ids, n_predict=len(ids))
    pieces = [t for _, t in items]
    assert "".join(pieces) == text == out.text and all("\ufffd" not in p for p in pieces)
    assert "" in pieces                 # some tokens completed no character


def test_context_limits_are_checked_before_decoding(tiny):
    model, tok = tiny
    ctx = Context(model, n_ctx=256)
    with pytest.raises(LLMLabError, match="need a context of"):
        next(generate(ctx, tok, [1] * 10, 300))
    with pytest.raises(LLMLabError, match="empty"):
        next(generate(ctx, tok, [], 3))
    assert ctx.kv.seq_pos_max(0) == -1


def test_an_interrupted_decode_leaves_the_cache_as_it_was(tiny):
    model, tok = tiny

    class Interrupting(Context):
        calls = 0

        def decode(self, batch, **kw):
            out = super().decode(batch, **kw)
            Interrupting.calls += 1
            if Interrupting.calls == 3:
                raise KeyboardInterrupt
            return out

    ctx = Interrupting(model, n_ctx=256)
    out = Generation()
    with pytest.raises(KeyboardInterrupt):
        for _ in generate(ctx, tok, [1, 2, 3], 10, scripted([5, 6, 7, 8]), result=out):
            pass
    assert out.ids == [5, 6] and out.n_past == 4 and ctx.kv.seq_pos_max(0) == 3   # token 6 never entered


def test_seeded_sampling_through_the_loop_is_reproducible(tiny):
    model, tok = tiny
    runs = []
    for seed in (5, 5, 6):
        sampler = common_sampler_init(SamplingParams(seed=seed, temp=1.5, top_k=0, min_p=0.0))
        runs.append([t for t, _ in generate(Context(model, n_ctx=256), tok, [1, 2], 12, sampler)])
    assert runs[0] == runs[1] != runs[2]


# ---- llama.cpp's greedy continuations --------------------------------------------------------------------

def cli(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "llmlab", *args], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=timeout)


def test_cli_greedy_equals_llama_cpp_and_json_is_strict():
    """SmolLM2, prompt 1: all 7 greedy tokens of llama.cpp's continuation, then its end of turn."""
    meta, npz = ref_logits("smollm2")
    r = cli("generate", "-m", "smollm2", "-p", meta["prompts"][1]["prompt"], "-n", "12", "--temp", "0", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout, parse_constant=lambda c: pytest.fail(f"not strict JSON: {c}"))
    assert set(out) == {"prompt_ids", "ids", "text", "cpu", "prompt_tokens_per_s", "decode_tokens_per_s"}
    assert out["prompt_ids"] == npz["p1_ids"].tolist()
    assert out["ids"] == npz["p1_greedy"].tolist() and out["text"] == meta["prompts"][1]["greedy_text"]
    assert out["cpu"] in ("avx2", "avx512") and out["decode_tokens_per_s"] > 0
    assert "stop: eog" in r.stderr


def test_cli_streams_text_and_reports_user_errors(capsys):
    from llmlab.cli import main
    assert main(["generate", "-m", "smollm2", "-p", "The capital of France is", "-n", "2", "--temp", "0"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("The capital of France is Paris") and "tok/s" in err
    for bad in (["--repeat-penalty", "0"], ["-n", "-5"], ["--seed", "-3"], ["-n", "100000"], ["--n-ctx", "0"]):
        assert main(["generate", "-m", "smollm2", "-p", "x", *bad]) == 2
        assert capsys.readouterr().err.strip().splitlines()[-1].startswith("error:")
    for bad in (["--top-p", "nan"], ["--threads", "0"], ["-t", "0"], ["-n", "١٠"], ["--temp", "inf"]):   # argparse's
        assert main(["generate", "-m", "smollm2", "-p", "x", *bad]) == 2                       # usage error
        err = capsys.readouterr().err.strip().splitlines()
        assert err[0].startswith("usage:") and err[-1].startswith("python -m llmlab generate: error: argument ")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_greedy_continuations_equal_llama_cpp_all_48(name):
    meta, npz = ref_logits(name)
    model, tok = Model(models.resolve(name)), Tokenizer.from_model(models.resolve(name))
    for i in range(len(meta["prompts"])):
        ids, want = npz[f"p{i}_ids"].tolist(), npz[f"p{i}_greedy"].tolist()
        assert tok.tokenize(meta["prompts"][i]["prompt"], add_bos=True, special=True) == ids
        out = Generation()
        for _ in generate(Context(model, n_ctx=256), tok, ids, 48, result=out):
            pass
        assert out.ids == want, f"prompt {i}"
        assert out.stop_reason == ("length" if len(want) == 48 else "eog")
