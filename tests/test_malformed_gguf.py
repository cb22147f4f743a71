"""Files that parse but lie, and hostile input: every case loads and computes finite logits or
raises llmlab's error (one ``error:`` line, exit 2 at the CLI), within a time and memory bound.

- the malformed-metadata corpus (tests/data/malformed, written by tools/gen_malformed.py): each
  file gives exactly the error recorded in expected.json, through the library and through the CLI;
- a hypothesis suite mutating metadata values and types and the tensor directory of the same tiny
  model (``--slow`` runs many more examples);
- the typed metadata accessor, the GGUF nested-array budget, strict JSON.
"""
from __future__ import annotations

import importlib.util
import json
import math
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmlab import LLMLabError
from llmlab.ggml.gguf import GGUFError, GGUFFile, GGUFWriter, Metadata, MetadataError, ValueType
from llmlab.ggml.gguf.dump import summary, to_json
from llmlab.ggml.gguf.meta import Spec, check, json_safe

ROOT = Path(__file__).resolve().parent.parent
CORPUS = Path(__file__).parent / "data" / "malformed"
EXPECTED = json.loads((CORPUS / "expected.json").read_text())

_spec = importlib.util.spec_from_file_location("gen_malformed", ROOT / "tools" / "gen_malformed.py")
gen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen)

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")   # poisoned weights overflow, by design

STATS = {"cases": 0, "errors": 0, "finite": 0, "max_seconds": 0.0, "max_peak_bytes": 0}
TIME_LIMIT_S = 20.0            # one load + decode of a 3 KB model, on a loaded 2-core machine
MEMORY_LIMIT = 64 << 20        # Python + numpy allocations while loading and running one case


def _error_text(e: BaseException, path: Path) -> str:
    from llmlab.cli import _one_line      # as the CLI prints it: one line, control characters escaped
    return f"error: {_one_line(e)}".replace(path.name, "FILE")


# ---------------------------------------------------------------------------- the corpus
def test_base_model_runs():
    logits = gen.load_and_run(CORPUS / "base.gguf")
    assert logits.shape[1] == len(gen.TOKENS) and np.isfinite(logits).all()


@pytest.mark.parametrize("name", list(EXPECTED))
def test_corpus_file_gives_its_error(name):
    path = CORPUS / f"{name}.gguf"
    with pytest.raises(LLMLabError) as e:
        gen.load_and_run(path)
    assert _error_text(e.value, path) == EXPECTED[name]["error"]


def test_corpus_is_what_the_generator_writes(tmp_path):
    """tests/data/malformed is reproducible: regenerate it with tools/gen_malformed.py."""
    assert set(EXPECTED) == set(gen.all_cases())
    for name in gen.all_cases():
        assert gen.build(name, tmp_path / f"{name}.gguf").read_bytes() == (CORPUS / f"{name}.gguf").read_bytes(), name


def test_corpus_through_gguf_dump():
    """gguf-dump describes every lying file (it is the tool to inspect them) and lists the lies."""
    for name in EXPECTED:
        with GGUFFile(CORPUS / f"{name}.gguf") as f:
            summary(f)
            json.dumps(json_safe(to_json(f)), allow_nan=False)
    with GGUFFile(CORPUS / "eps_nan.gguf") as f:
        rec = json.loads(json.dumps(to_json(f), allow_nan=False))
        assert rec["kv"]["llama.attention.layer_norm_rms_epsilon"] == "nan"
        assert any("layer_norm_rms_epsilon" in p for p in rec["problems"])
        assert "problems (1)" in summary(f)


# ---------------------------------------------------------------------------- the accessor
def test_accessor_types_and_ranges():
    md = Metadata({"general.architecture": "llama", "llama.block_count": 2, "llama.rope.freq_base": float("nan"),
                   "llama.attention.head_count": np.array([4, 4], np.uint32), "x": "s", "flag": True})
    assert md.int("llama.block_count") == 2 and md["llama.block_count"] == 2
    assert md.per_layer("llama.attention.head_count", 2) == [4, 4]
    assert md.str("x") == "s" and md.bool("flag") is True and md.int("missing", 7) == 7
    with pytest.raises(MetadataError, match=r"'llama.rope.freq_base' is float64 nan; expected a finite number"):
        md["llama.rope.freq_base"]
    with pytest.raises(MetadataError, match=r"'x' is a string 'x'|'x' is a string 's'; expected an integer"):
        md.int("x")
    with pytest.raises(MetadataError, match=r"'flag' is bool True; expected an integer"):
        md.int("flag")
    with pytest.raises(MetadataError, match="has 2 values; expected one per layer"):
        md.per_layer("llama.attention.head_count", 3)
    with pytest.raises(MetadataError, match="is missing"):
        md.float("nope")
    assert md.peek("x", "int") is None and len(md.problems()) == 1


def test_accessor_reads_gguf_types(tmp_path):
    w = gen.base_writer()
    w.add("llama.block_count", -1, ValueType.INT8)
    w.write(tmp_path / "m.gguf")
    with GGUFFile(tmp_path / "m.gguf") as f:
        with pytest.raises(MetadataError, match=r"'llama.block_count' is int8 -1; expected an integer in \[1, 512\]"):
            Metadata.of(f)["llama.block_count"]


@given(st.one_of(st.integers(), st.floats(), st.text(max_size=5), st.booleans(),
                 st.lists(st.integers(-5, 5), max_size=3), st.lists(st.text(max_size=3), max_size=3)))
@settings(max_examples=200, deadline=None)
def test_check_returns_the_kind_or_raises(value):
    from llmlab.ggml.gguf.meta import _infer
    vt, item = _infer(value)
    for kind in ("int", "float", "bool", "str", "int[]", "float[]", "str[]", "int|int[]"):
        try:
            v = check("k", value, vt, item, Spec(kind, 0, 10))
        except MetadataError:
            continue
        if kind == "float":
            assert isinstance(v, float) and math.isfinite(v) and 0 <= v <= 10
        if kind == "int":
            assert isinstance(v, int) and 0 <= v <= 10


def test_json_safe():
    assert json_safe([float("nan"), np.float32("inf"), -math.inf, 1.5, np.array([np.nan])]) == ["nan", "inf", "-inf", 1.5, ["nan"]]


# ---------------------------------------------------------------------------- parser limits
def test_nested_array_budget(tmp_path):
    """An array of 70,000 empty arrays (840 KB) is refused at once, not loaded as 70,000 objects."""
    from llmlab.ggml.gguf.reader import MAX_NESTED_ITEMS
    w = GGUFWriter()
    w.kv["evil"] = ([np.zeros(0, np.uint8)] * (MAX_NESTED_ITEMS + 10), ValueType.ARRAY, ValueType.ARRAY)
    w.write(tmp_path / "nested.gguf")
    t0 = time.perf_counter()
    with pytest.raises(GGUFError, match="nested arrays hold more than 65536 items"):
        GGUFFile(tmp_path / "nested.gguf")
    assert time.perf_counter() - t0 < 5


def test_special_files_are_refused(tmp_path):
    import os
    fifo = tmp_path / "fifo.gguf"
    os.mkfifo(fifo)
    with pytest.raises(LLMLabError, match="is not a regular file \\(a FIFO\\)"):
        GGUFFile(fifo)                       # opened non-blocking: no hang waiting for a writer
    with pytest.raises(LLMLabError, match="is a directory"):
        GGUFFile(tmp_path)


# ---------------------------------------------------------------------------- the hypothesis suite
INT_RANGES = {ValueType.UINT8: (0, 255), ValueType.INT8: (-128, 127), ValueType.UINT16: (0, 65535),
              ValueType.INT16: (-32768, 32767), ValueType.UINT32: (0, 2**32 - 1), ValueType.INT32: (-2**31, 2**31 - 1),
              ValueType.UINT64: (0, 2**64 - 1), ValueType.INT64: (-2**63, 2**63 - 1)}
SPECIAL_INTS = [0, 1, 2, 3, 4, 5, 7, 8, 16, 36, 255, 256, 65535, 2**31 - 1, 2**32 - 1, 2**63 - 1, -1, -2**31]
SPECIAL_FLOATS = [0.0, -0.0, math.nan, math.inf, -math.inf, 1e-38, 1e38, -1.0, 1.0, 0.5, 1e-6, 1e4, 3.0e38]


@st.composite
def int_value(draw):
    vt = draw(st.sampled_from(list(INT_RANGES)))
    lo, hi = INT_RANGES[vt]
    v = draw(st.sampled_from([x for x in SPECIAL_INTS if lo <= x <= hi]) | st.integers(lo, hi))
    return v, vt, None


@st.composite
def float_value(draw):
    vt = draw(st.sampled_from([ValueType.FLOAT32, ValueType.FLOAT64]))
    v = draw(st.sampled_from(SPECIAL_FLOATS) | st.floats(width=32))
    return v, vt, None


@st.composite
def array_value(draw):
    kind = draw(st.sampled_from(["int", "float", "str", "bool", "nested"]))
    n = draw(st.sampled_from([0, 1, 2, 36]) | st.integers(0, 40))
    if kind == "int":
        vt = draw(st.sampled_from(list(INT_RANGES)))
        lo, hi = INT_RANGES[vt]
        vals = draw(st.lists(st.sampled_from([x for x in SPECIAL_INTS if lo <= x <= hi]), min_size=n, max_size=n))
        from llmlab.ggml.gguf.constants import SCALAR_DTYPE
        return np.array(vals, dtype=SCALAR_DTYPE[vt]), ValueType.ARRAY, vt
    if kind == "float":
        vals = draw(st.lists(st.sampled_from(SPECIAL_FLOATS), min_size=n, max_size=n))
        return np.array(vals, np.float32), ValueType.ARRAY, ValueType.FLOAT32
    if kind == "str":
        vals = draw(st.lists(st.text(max_size=4), min_size=n, max_size=n))
        return vals, ValueType.ARRAY, ValueType.STRING
    if kind == "bool":
        return np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n))), ValueType.ARRAY, ValueType.BOOL
    return [np.arange(i % 3, dtype=np.uint8) for i in range(min(n, 5))], ValueType.ARRAY, ValueType.ARRAY


VALUES = st.one_of(int_value(), float_value(), array_value(),
                   st.tuples(st.text(max_size=6), st.just(ValueType.STRING), st.none()),
                   st.tuples(st.booleans(), st.just(ValueType.BOOL), st.none()))

EXTRA_KEYS = ["llama.attention.key_length", "llama.attention.value_length", "llama.rope.scaling.factor",
              "llama.vocab_size", "llama.attention.sliding_window", "tokenizer.ggml.eos_token_id",
              "tokenizer.ggml.add_eos_token", "tokenizer.ggml.add_space_prefix", "tokenizer.ggml.pre",
              "tokenizer.ggml.padding_token_id", "general.alignment", "tokenizer.ggml.merges"]
TENSOR_NAMES = list(gen.base_writer().tensors)


@st.composite
def kv_mutation(draw):
    key = draw(st.sampled_from(list(gen.base_writer().kv) + EXTRA_KEYS))
    if draw(st.integers(0, 9)) == 0:
        return ("kvdel", key)
    if key == "tokenizer.ggml.model" and draw(st.booleans()):     # a BPE vocabulary with arbitrary merges
        merges = draw(st.lists(st.sampled_from(["h e", "l l", "\u2581 h", "o r", "he llo", "x", "", "a b c", " "]) |
                               st.text(max_size=4), max_size=6))
        return ("gpt2", merges, draw(st.sampled_from([None, "default", "smollm", "llama3", "qwen2", "gpt-2"])))
    if key in ("tokenizer.ggml.model", "tokenizer.ggml.pre") and draw(st.booleans()):
        return ("set", key, (draw(st.sampled_from(["gpt2", "llama", "bert", "", "default", "smollm", "llama3", "qwen2"])),
                             ValueType.STRING, None))
    if key in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type") and draw(st.booleans()):
        i = draw(st.integers(0, len(gen.TOKENS) - 1))      # one token's text or type, in a valid array
        if key == "tokenizer.ggml.tokens":
            return ("token", i, draw(st.text(max_size=5)))
        return ("token_type", i, draw(st.integers(-3, 9)))
    return ("set", key, draw(VALUES))


@st.composite
def tensor_mutation(draw):
    name = draw(st.sampled_from(TENSOR_NAMES))
    op = draw(st.sampled_from(["del", "rename", "shape", "type", "poison", "extra"]))
    if op == "rename":
        return (op, name, draw(st.sampled_from(TENSOR_NAMES + ["blk.1.attn_q.weight", "output.weight", "x"])))
    if op == "shape":
        return (op, name, draw(st.sampled_from(["flip", "flat", "lead1", "split"])))
    if op == "type":
        return (op, name, draw(st.sampled_from(["f32", "f16", "bf16", "i16", "i32", "f64", "i8", "q8_0"])))
    if op == "poison":
        return (op, name, draw(st.sampled_from([math.nan, math.inf, -math.inf, 6e4, 0.0, 1e-8])))
    return (op, name, None)


def _retype(t, sh, raw, new: str):
    """Data of the same values in type ``new`` (or the same bytes, when that is not possible)."""
    from llmlab.ggml import quant
    from llmlab.ggml.types import ggml_type
    vals = quant.dequantize(raw, t).astype(np.float32) if t.to_float else raw.view(np.float32)
    nt = ggml_type(new)
    if sh[0] % nt.block_size:
        return None
    return quant.quantize(vals.reshape(-1), nt) if nt.from_float else None


def apply(w: GGUFWriter, m) -> None:
    from llmlab.ggml.types import ggml_type
    if m[0] == "kvdel":
        w.kv.pop(m[1], None)
    elif m[0] == "set":
        value, vt, item = m[2]
        w.kv[m[1]] = (value, vt, item)
    elif m[0] == "gpt2":
        w.kv["tokenizer.ggml.model"] = ("gpt2", ValueType.STRING, None)
        w.kv["tokenizer.ggml.merges"] = (m[1], ValueType.ARRAY, ValueType.STRING)
        if m[2] is not None:
            w.kv["tokenizer.ggml.pre"] = (m[2], ValueType.STRING, None)
    elif m[0] == "token":
        toks = list(gen.TOKENS)
        toks[m[1]] = m[2]
        w.kv["tokenizer.ggml.tokens"] = (toks, ValueType.ARRAY, ValueType.STRING)
    elif m[0] == "token_type":
        types = np.array(gen.TYPES, np.int32)
        types[m[1]] = m[2]
        w.kv["tokenizer.ggml.token_type"] = (types, ValueType.ARRAY, ValueType.INT32)
    elif m[1] in w.tensors:
        op, name, arg = m
        t, sh, raw = w.tensors[name]
        if op == "del":
            del w.tensors[name]
        elif op == "rename" and arg not in w.tensors:
            w.tensors = {(arg if n == name else n): v for n, v in w.tensors.items()}
        elif op == "shape":
            new = {"flip": sh[::-1], "flat": (int(np.prod(sh)),), "lead1": (1,) + sh,
                   "split": (sh[0] // 2, 2) + sh[1:] if sh[0] % 2 == 0 else sh}[arg]
            if len(new) <= 4 and new[0] % t.block_size == 0:
                w.tensors[name] = (t, tuple(new), raw)
        elif op == "type":
            data = _retype(t, sh, raw, arg)
            if data is not None:
                w.tensors[name] = (ggml_type(arg), sh, np.ascontiguousarray(data).reshape(-1).view(np.uint8))
            elif ggml_type(arg).type_size == t.type_size and ggml_type(arg).block_size == t.block_size:
                w.tensors[name] = (ggml_type(arg), sh, raw)      # same bytes, reinterpreted
        elif op == "poison" and t.name in ("f32", "f16"):
            vals = raw.view(np.float32 if t.name == "f32" else np.float16).copy()
            vals[:: max(1, len(vals) // 3)] = arg
            w.tensors[name] = (t, sh, vals.view(np.uint8))
        elif op == "extra":
            w.tensors[name + ".extra"] = (t, sh, raw)


def run_case(path: Path) -> str:
    """Load and run one file, as logits and gguf-dump would; returns 'finite' or 'error'.
    Anything but an LLMLabError propagates (a crash)."""
    from llmlab.cli._common import dumps
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        try:
            with GGUFFile(path) as f:
                summary(f)
                dumps(to_json(f))
        except LLMLabError:
            pass
        try:
            logits = gen.load_and_run(path)
            assert np.isfinite(logits).all()
            outcome = "finite"
        except LLMLabError:
            outcome = "error"
    finally:
        dt = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    STATS["cases"] += 1
    STATS[outcome if outcome == "finite" else "errors"] += 1
    STATS["max_seconds"] = max(STATS["max_seconds"], dt)
    STATS["max_peak_bytes"] = max(STATS["max_peak_bytes"], peak)
    assert dt < TIME_LIMIT_S, f"{dt:.1f} s"
    assert peak < MEMORY_LIMIT, f"{peak / 2**20:.1f} MiB"
    return outcome


MUTATIONS = st.lists(st.one_of(kv_mutation(), tensor_mutation()), min_size=1, max_size=3)
FUZZ = settings(max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck))
FUZZ_SLOW = settings(max_examples=1500, deadline=None, database=None, suppress_health_check=list(HealthCheck))


def _fuzz(tmp_path_factory, muts, arch="llama"):
    w = gen.base_writer(arch)
    for m in muts:
        apply(w, m)
    path = tmp_path_factory.mktemp("fuzz") / "m.gguf"
    try:
        w.write(path)
    except (TypeError, ValueError, OverflowError, struct_error()):
        return          # the writer refuses it (a value its type cannot hold): nothing to load
    run_case(path)


def struct_error():
    import struct
    return struct.error


@FUZZ
@given(muts=MUTATIONS)
def test_mutated_model_runs_or_errors(tmp_path_factory, muts):
    _fuzz(tmp_path_factory, muts)


@FUZZ
@given(muts=st.lists(tensor_mutation(), min_size=1, max_size=2))
def test_mutated_gemma3_runs_or_errors(tmp_path_factory, muts):
    _fuzz(tmp_path_factory, muts, "gemma3")


@pytest.mark.slow
@FUZZ_SLOW
@given(muts=MUTATIONS)
def test_mutated_model_runs_or_errors_long(tmp_path_factory, muts):
    _fuzz(tmp_path_factory, muts)


@pytest.mark.slow
@FUZZ_SLOW
@given(muts=st.lists(st.one_of(kv_mutation(), tensor_mutation()), min_size=1, max_size=3))
def test_mutated_gemma3_runs_or_errors_long(tmp_path_factory, muts):
    _fuzz(tmp_path_factory, [m if m[0] != "set" or not m[1].startswith("llama.") else ("set", "gemma3." + m[1][6:], m[2])
                             for m in muts], "gemma3")


def test_report_fuzz_stats(capsys):
    """Runs last in this module: every case (the fuzz's, plus two known ones: the base file runs, a corrupt
    one is refused) was counted once as finite or error, within the time and memory limits; pytest -s
    prints how many, how long, how much memory."""
    gen.load_and_run(CORPUS / "base.gguf")         # numba compiles on first use: not one of the timed cases
    before = dict(STATS)
    assert run_case(CORPUS / "base.gguf") == "finite"
    assert run_case(CORPUS / "offsets_gap.gguf") == "error"
    assert STATS["cases"] == before["cases"] + 2 and STATS["finite"] > before["finite"] and STATS["errors"] > before["errors"]
    assert STATS["finite"] + STATS["errors"] == STATS["cases"]
    assert STATS["max_seconds"] < TIME_LIMIT_S and STATS["max_peak_bytes"] < MEMORY_LIMIT, STATS
    with capsys.disabled():
        print(f"\nreliability fuzz: {STATS['cases']} cases ({STATS['finite']} finite, {STATS['errors']} errors), "
              f"slowest {STATS['max_seconds']:.2f} s, peak traced memory {STATS['max_peak_bytes'] / 2**20:.1f} MiB")
