"""The learner's slots (``llmlab.plug``): references bit-identical, typical mistakes diagnosed (the right
first node and hint), untrusted functions turned into verdicts with the engine restored.

The default suite runs on tiny random models (the real models' tokenizers, the same graph builders,
node names and kernels) written once per module; the whole-model checks against llama.cpp's stored
references are ``slow``."""
from __future__ import annotations

import json
import time

import numpy as np
import pytest

from llmlab import models
from llmlab.cli import main
from llmlab.llama.tiny import write_tiny
from llmlab.plug import get_slot, guard, list_slots, runner

PROMPT = "Hello world, this is"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """Tiny models: a llama with SmolLM2's tokenizer (q8_0 and q4_1 weights) and a Gemma 3 with Gemma's
    (a sliding window of 8, so that its window cache recycles cells within a few tokens)."""
    d = tmp_path_factory.mktemp("plug")
    smol, gemma = models.resolve("smollm2"), models.resolve("gemma3")
    return {"llama": str(write_tiny(d / "llama.gguf", "llama", vocab_from=smol, wtype="q8_0")),
            "llama_q4_1": str(write_tiny(d / "llama_q41.gguf", "llama", vocab_from=smol, wtype="q4_1")),
            "gemma": str(write_tiny(d / "gemma.gguf", "gemma3", vocab_from=gemma, wtype="q8_0", head_dim=16))}


TINY_FOR = {"smollm2": "llama", "gemma3": "gemma"}


def _engine_pieces():
    """Every piece a slot may swap, by identity."""
    from llmlab.ggml import alloc
    from llmlab.ggml.cpu import quants
    from llmlab.ggml.cpu.ops import COMPUTE
    from llmlab.ggml.gguf import reader
    from llmlab.llama import kv_cache, sampling
    from llmlab.llama.vocab import bpe
    return (dict(COMPUTE), reader._read_value, bpe.bpe_merge, kv_cache.KVCache.find_slot, alloc.FreeList.alloc,
            sampling.SamplerChain.apply, {k: dict(v) for k, v in quants.QUANT_KERNELS.items()})


def _run(tiny, model, plugs, n=2, **kw):
    return runner.run(tiny[model], PROMPT, n, plugs, oracle=False, **kw)


# ---- the registry --------------------------------------------------------------------------------

def test_plug_list_json_has_12_slots_over_7_notebooks(capsys):
    assert main(["plug", "--list", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["slots"]) >= 12
    assert len({s["notebook"] for s in out["slots"]}) >= 7
    for s in out["slots"]:
        assert s["signature"].startswith(s["function"] + "(") and s["used_for"] and s["models"]
        assert len(s["mistakes"]) >= 3
    assert main(["plug", "--list"]) == 0
    assert "rms_norm" in capsys.readouterr().out


def _applies(slot):
    out = []
    for m in slot.models:
        t = TINY_FOR[m]
        if slot.name in ("vec_dot_q4_1_q8_1", "vec_dot_q4_1_q8_1_impl"):
            t = "llama_q4_1"
        if slot.name == "bpe_merge" and t != "llama":
            continue
        out.append(t)
    return out


@pytest.mark.parametrize("name", [s.name for s in list_slots()])
def test_each_reference_is_bit_identical_on_the_tiny_models(tiny, name):
    slot = get_slot(name)
    before = _engine_pieces()
    for t in _applies(slot):
        r = _run(tiny, t, {name: "reference"}, n=3)
        (res,) = r.slots
        assert res.status == "bit-identical", (t, res.line())
        assert res.calls > 0
        assert r.ids == r.exact_ids and r.first_node is None
    assert _engine_pieces() == before


def test_all_references_together_are_bit_identical(tiny):
    names = [s.name for s in list_slots() if "smollm2" in s.models and not s.name.startswith("vec_dot_q4_1")]
    r = _run(tiny, "llama", {n: "reference" for n in names}, n=3)
    assert [s.status for s in r.slots] == ["bit-identical"] * len(names), r.summary()
    assert r.ids == r.exact_ids


# ---- typical mistakes: the right first node and the right hint ----------------------------------------

# (slot, mistake, tiny model, tokens, the first node's name, the status)
MISTAKES = [
    ("read_value", "big-endian", "llama", 1, "tokenizer.ggml.model", "error"),
    ("read_value", "string length as uint32", "llama", 1, "tokenizer.ggml.model", "error"),
    ("read_value", "position not advanced", "gemma", 1, "tokenizer.ggml.model", "error"),
    ("read_value", "FLOAT32 read as float64", "llama", 1, "llama.attention.layer_norm_rms_epsilon", "error"),
    ("read_value", "bool as int", "gemma", 1, "tokenizer.ggml.add_bos_token", None),
    ("bpe_merge", "leftmost pair first", "llama", 1, "word 'Hello'", "different"),
    ("bpe_merge", "highest rank first", "llama", 1, "word 'Hello'", "different"),
    ("bpe_merge", "one pass", "llama", 1, "word 'Hello'", "different"),
    ("bpe_merge", "first merge only", "llama", 1, "word 'Hello'", "different"),
    ("rms_norm", "subtracts the mean", "llama", 2, "norm-0", None),
    ("rms_norm", "float32 mean", "llama", 2, "norm-0", "close"),
    ("rms_norm", "all in float64", "gemma", 2, "norm-0", "close"),
    ("rms_norm", "eps outside the root", "llama", 2, "norm-0", None),
    ("rms_norm", "sum, not mean", "llama", 2, "norm-0", None),
    ("rope", "wrong pairs", "llama", 2, "Qcur-0", None),
    ("rope", "wrong pairs", "gemma", 2, "Qcur-0", None),
    ("rope", "no fma", "llama", 2, "Qcur-0", "close"),
    ("rope", "rotated backwards", "llama", 2, "Qcur-0", None),
    ("rope", "cos and sin swapped", "gemma", 2, "Qcur-0", None),
    ("softmax", "no max subtracted", "llama", 2, "kq_soft_max-0", None),
    ("softmax", "mask ignored", "llama", 2, "kq_soft_max-0", None),
    ("softmax", "scale ignored", "llama", 2, "kq_soft_max-0", None),
    ("softmax", "numpy's exp", "gemma", 2, "kq_soft_max-0", "close"),
    ("softmax", "divides by the sum", "llama", 2, "kq_soft_max-0", "close"),
    ("swiglu", "gate and up swapped", "llama", 2, "ffn_swiglu-0", None),
    ("swiglu", "sigmoid, not SiLU", "llama", 2, "ffn_swiglu-0", None),
    ("swiglu", "numpy's exp", "llama", 2, "ffn_swiglu-0", "close"),
    ("geglu", "tanh formula, no table", "gemma", 2, "ffn_geglu-0", "close"),
    ("geglu", "erf GELU", "gemma", 2, "ffn_geglu-0", None),
    ("geglu", "gate and up swapped", "gemma", 2, "ffn_geglu-0", None),
    ("attention", "no scale", "llama", 2, "kqv-0", None),
    ("attention", "mask ignored", "gemma", 2, "kqv-0", None),
    ("attention", "softmax over the queries", "llama", 2, "kqv-0", None),
    ("attention", "float32 products", "llama", 2, "kqv-0", "close"),
    ("find_slot", "one past the head", "llama", 2, "cells of 5 tokens", "close"),
    ("find_slot", "cells 0..n-1", "llama", 2, "cells of 1 token", None),
    ("find_slot", "always from cell 0", "gemma", 6, "cells of 1 token", None),
    ("dequantize_q8_0", "codes read unsigned", "llama", 1, "embd", None),
    ("dequantize_q8_0", "scale forgotten", "gemma", 1, "embd", None),
    ("dequantize_q8_0", "scale at the end", "llama", 1, "embd", None),
    ("dequantize_q8_0", "big-endian scale", "llama", 1, "embd", "error"),
    ("vec_dot_q4_1_q8_1", "nibbles interleaved", "llama_q4_1", 1, "Qcur-0", None),
    ("vec_dot_q4_1_q8_1", "min term forgotten", "llama_q4_1", 1, "Qcur-0", None),
    ("vec_dot_q4_1_q8_1", "codes centred", "llama_q4_1", 1, "Qcur-0", None),
    ("vec_dot_q4_1_q8_1", "float64 dot", "llama_q4_1", 1, "Qcur-0", "close"),
    ("vec_dot_q4_1_q8_1_impl", "nibbles not masked", "llama_q4_1", 1, "ffn_gate-1", "different"),
    ("vec_dot_q4_1_q8_1_impl", "low and high swapped", "llama_q4_1", 1, "ffn_gate-1", "different"),
    ("vec_dot_q4_1_q8_1_impl", "whole min term", "llama_q4_1", 1, "ffn_gate-1", "different"),
    ("vec_dot_q4_1_q8_1_impl", "no half products", "llama_q4_1", 1, "ffn_gate-1", "close"),
    ("choose_block", "first fit", "llama", 1, "ffn_inp-1", "close"),
    ("choose_block", "never reuses", "llama", 1, "Qcur-0", "close"),
    ("choose_block", "worst fit", "llama", 1, "kqv-0", "close"),
    ("sample_filter", "temperature first", "llama", 2, "step 0", None),
    ("sample_filter", "temperature multiplied", "llama", 2, "step 0", None),
    ("sample_filter", "min-p forgotten", "llama", 2, "step 0", None),
]


def test_every_slot_has_three_mistakes_under_test():
    per = {}
    for name, mistake, *_ in MISTAKES:
        per.setdefault(name, set()).add(mistake)
        assert mistake in [m.name for m in get_slot(name).mistakes]
    assert {s.name for s in list_slots()} <= set(per)
    assert all(len(v) >= 3 for v in per.values()), per


@pytest.mark.parametrize("name,mistake,model,n,node,status", MISTAKES,
                         ids=[f"{m[0]}-{m[1]}-{m[2]}" for m in MISTAKES])
def test_a_typical_mistake_is_named_at_its_first_node(tiny, name, mistake, model, n, node, status):
    slot = get_slot(name)
    m = next(x for x in slot.mistakes if x.name == mistake)
    before = _engine_pieces()
    r = _run(tiny, model, {name: m.fn}, n=n)
    (res,) = r.slots
    assert res.status != "bit-identical", res.line()
    if status is not None:
        assert res.status == status, res.line()
    assert res.first is not None and res.first.name == node, res.line()
    assert res.hint.startswith(m.hint.split("{")[0]), res.line()
    assert _engine_pieces() == before


def test_a_mistake_the_hints_do_not_know_still_names_its_node(tiny):
    """An unexpected mistake (RMSNorm with its eps 1000 times too large): no typical hint, but the verdict
    still names the node where it departs, and the node diff shows it growing through the layers."""
    ref = get_slot("rms_norm").reference
    r = _run(tiny, "llama", {"rms_norm": lambda x, eps: ref(x, eps * 1000)}, n=2)
    (res,) = r.slots
    assert res.status in ("close", "different") and res.first.name == "norm-0"
    assert res.hint.startswith("the first difference")
    assert r.first_node is not None and r.first_node.name == "norm-0"
    assert [d.layer for d in r.layers] == [0, 1] and all(d.max_abs_diff > 0 for d in r.layers)


# ---- untrusted functions ---------------------------------------------------------------------------

def _raises(x, eps):
    raise ValueError("oops")


def _hangs(x, eps):
    while True:
        pass


@pytest.mark.parametrize("fn,expect", [
    (_raises, "raised ValueError (line"),
    (_hangs, "time limit of 0.5 s"),
    (lambda x, eps: x[:, :-1], "returned shape"),
    (lambda x, eps: x.T.copy(), "the same"),
    (lambda x, eps: x.astype(np.float64), "returned float64"),
    (lambda x, eps: x.tolist(), "returned a list"),
    (lambda x, eps: x * np.float32("nan"), "returned NaN at index (0, 0)"),
    ("skeleton", "NotImplementedError"),
])
def test_a_broken_function_gets_a_verdict_and_the_engine_is_restored(tiny, fn, expect):
    before = _engine_pieces()
    t0 = time.monotonic()
    r = _run(tiny, "llama", {"rms_norm": fn}, n=2, limit=0.5)
    (res,) = r.slots
    assert res.status == "error" and expect in res.error, res.line()
    assert res.first.name == "norm-0"
    assert time.monotonic() - t0 < 60
    assert _engine_pieces() == before
    if fn == "skeleton":
        assert res.hint.startswith("not written yet")


def test_ctrl_c_inside_a_learners_function_restores_the_engine(tiny):
    def interrupted(x, eps):
        raise KeyboardInterrupt
    before = _engine_pieces()
    with pytest.raises(KeyboardInterrupt):
        _run(tiny, "llama", {"rms_norm": interrupted, "bpe_merge": "reference", "find_slot": "reference"})
    assert _engine_pieces() == before


def test_the_time_limit_also_works_off_the_main_thread():
    import threading
    got = {}

    def target():
        try:
            guard.call(lambda: [None for _ in iter(int, 1)], (), 0.3)
        except guard.Fault as f:
            got["fault"] = f
    th = threading.Thread(target=target)
    th.start()
    th.join(20)
    assert got["fault"].kind == "timeout"


def test_a_wrong_cell_or_block_choice_is_refused_before_it_corrupts(tiny):
    r = _run(tiny, "llama", {"find_slot": lambda free, head, used, n: [len(free) + k for k in range(n)]})
    assert r.slots[0].status == "error" and "outside" in r.slots[0].error
    r = _run(tiny, "llama", {"choose_block": lambda holes, size: 0 if holes else None})
    assert r.slots[0].status == "error" and "would overwrite" in r.slots[0].error


# ---- the command line --------------------------------------------------------------------------------

def test_cli_plug_json(tiny, tmp_path, capsys):
    f = tmp_path / "mine.py"
    f.write_text("import numpy as np\n\n\ndef rms_norm(x, eps):\n    mean = np.mean(x * x, axis=-1)\n"
                 "    return x * (np.float32(1.0) / np.sqrt(mean + np.float32(eps)))[:, None]\n")
    assert main(["plug", "-m", tiny["llama"], "-p", PROMPT, "-n", "2", "--slot", f"rms_norm={f}",
                 "--slot", "softmax=reference", "--json", "--no-oracle"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) >= {"text", "ids", "prompt_ids", "llama_cpp", "slots", "first_node", "layers", "ok"}
    assert out["llama_cpp"]["compared_with"].startswith("llmlab's exact path")
    s = {x["slot"]: x for x in out["slots"]}
    assert s["softmax"]["status"] == "bit-identical"
    assert s["rms_norm"]["status"] in ("close", "different")
    assert s["rms_norm"]["first_node"]["name"] == "norm-0" and s["rms_norm"]["hint"].startswith("np.mean")
    assert s["rms_norm"]["source"] == f"rms_norm from {f.name}"


@pytest.mark.parametrize("args,msg", [
    (["--slot", "nope=reference"], "no slot named 'nope'"),
    (["--slot", "rms_norm"], "expected NAME=FILE.py"),
    (["--slot", "rms_norm=/does/not/exist.py"], "no such file"),
    (["--slot", "rms_norm=reference", "--slot", "rms_norm=skeleton"], "given twice"),
])
def test_cli_plug_bad_input_is_one_error_line(tiny, args, msg, capsys):
    assert main(["plug", "-m", tiny["llama"], "-p", PROMPT, *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and msg in err[0]


def test_cli_plug_a_file_that_does_not_load(tiny, tmp_path, capsys):
    f = tmp_path / "broken.py"
    f.write_text("def rms_norm(x, eps)\n    return x\n")
    assert main(["plug", "-m", tiny["llama"], "-p", PROMPT, "--slot", f"rms_norm={f}"]) == 2
    assert "syntax" in capsys.readouterr().err.lower()
    f.write_text("def other(x, eps):\n    return x\n")
    assert main(["plug", "-m", tiny["llama"], "-p", PROMPT, "--slot", f"rms_norm={f}"]) == 2
    assert "no function named 'rms_norm' (it defines other" in capsys.readouterr().err


# ---- the real models, against llama.cpp's stored references ---------------------------------------------

def _ref_prompt(model):
    from llmlab.data import ref_logits
    from llmlab.ggml.cpu import profiles
    meta, _ = ref_logits(model, profiles.resolve(None).name)
    return meta["prompts"][0]["prompt"]


def _slots_of(model):
    return [s.name for s in list_slots() if model in s.models]


@pytest.mark.slow
@pytest.mark.exhaustive
@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_each_reference_alone_keeps_llama_cpps_greedy_tokens(model):
    """Every slot's reference plugged in alone: one run per slot with the reference kernels (about 20 minutes
    for both models on 2 cores, so not in test-slow: make test-plug)."""
    prompt = _ref_prompt(model)
    for name in _slots_of(model):
        r = runner.run(model, prompt, 4, {name: "reference"}, oracle=False)
        assert r.slots[0].status == "bit-identical", r.summary()
        if not get_slot(name).sampling:
            assert r.compared_with.startswith("llama.cpp's stored references")
            assert r.n_equal == r.n_compared == 4


@pytest.mark.slow
@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_all_references_together_keep_llama_cpps_greedy_tokens(model):
    r = runner.run(model, _ref_prompt(model), 4,
                   {n: "reference" for n in _slots_of(model) if not get_slot(n).sampling}, oracle=False)
    assert all(s.status == "bit-identical" for s in r.slots) and r.n_equal == 4, r.summary()
    assert r.compared_with.startswith("llama.cpp's stored references")


@pytest.mark.slow
def test_rms_norm_subtracting_the_mean_on_smollm2():
    slot = get_slot("rms_norm")
    m = next(x for x in slot.mistakes if x.name == "subtracts the mean")
    r = runner.run("smollm2", _ref_prompt("smollm2"), 2, {"rms_norm": m.fn}, oracle=False)
    (res,) = r.slots
    assert res.first.name == "norm-0" and res.hint.startswith("the first difference is at norm-0")


# ---- in a notebook ---------------------------------------------------------------------------------

def test_nb_plug_shows_one_verdict_line_and_restores_the_engine(tiny):
    from llmlab import nb
    kw = dict(model=tiny["llama"], prompt=PROMPT, n=2)
    assert nb.check_plug(rms_norm="reference", **kw).verdict().startswith("correct: rms_norm bit-identical")
    assert nb.plug(rms_norm="skeleton", **kw).verdict().startswith("no answer yet: rms_norm is not written yet")
    mean = next(m for m in get_slot("rms_norm").mistakes if m.name == "subtracts the mean")
    p = nb.plug(rms_norm=mean.fn, **kw)
    v = p.verdict()
    assert v.startswith("not yet: rms_norm") and " at norm-0 (RMS_NORM, layer 0" in v and "subtracts no mean" in v
    assert nb.check_plug(p) is p and p.figure() is not None
    idle = nb.plug(vec_dot_q4_1_q8_1="reference", **kw).verdict()     # q8_0 weights: the slot is never called
    assert idle.startswith("not yet: the engine never called vec_dot_q4_1_q8_1")
    before = _engine_pieces()
    with pytest.raises(RuntimeError, match="inside the block"):
        with nb.plug(rms_norm="reference", softmax="reference") as probes:
            assert set(probes) == {"rms_norm", "softmax"} and _engine_pieces() != before
            raise RuntimeError("an error inside the block")
    assert _engine_pieces() == before
