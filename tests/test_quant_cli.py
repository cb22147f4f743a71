"""``python -m llmlab quantize``: byte-identical to llama.cpp's quantizer where both choose the same
type, a valid file for llama.cpp, and clear errors."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from llmlab.cli import main
from llmlab.cli.quantize import FILE_TYPES
from llmlab.ggml.gguf import GGUFFile


def llama_quantize(src, dst, qtype):
    """llama.cpp's quantizer, through the bridge in the llama.cpp worker."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (optional oracle)")
    from llmlab.llamacpp.session import quantize_model
    from llmlab.llamacpp.worker import isolated
    isolated(quantize_model, str(src), str(dst), FILE_TYPES[qtype])


def compare(mine_path, ref_path):
    """(same, differing, type differs) tensor counts; metadata must agree."""
    same, diff, other = [], [], []
    with GGUFFile(mine_path) as a, GGUFFile(ref_path) as b:
        assert {t.name for t in a.tensors} == {t.name for t in b.tensors}
        for t in a.tensors:
            u = b.tensor(t.name)
            if u.type is not t.type:
                other.append(t.name)
            elif np.array_equal(t.data, u.data):
                same.append(t.name)
            else:
                diff.append(t.name)
        assert a.kv["general.file_type"] == b.kv["general.file_type"]
    return same, diff, other


def run_both(tmp_path, smollm2_path, qtype):
    mine, ref = tmp_path / f"mine-{qtype}.gguf", tmp_path / f"llama-{qtype}.gguf"
    assert main(["quantize", str(smollm2_path), str(mine), qtype, "--allow-requantize", "--quiet"]) == 0
    llama_quantize(smollm2_path, ref, qtype)
    return mine, compare(mine, ref)


@pytest.mark.parametrize("qtype", ["q8_0", "q4_0", "q5_1"])
def test_bytes_identical_to_llama_cpp(tmp_path, smollm2_path, qtype):
    _, (same, diff, other) = run_both(tmp_path, smollm2_path, qtype)
    assert diff == []
    assert len(same) >= 200 and len(other) <= 1          # llama.cpp keeps the tied embedding at q8_0 for q4_0


@pytest.mark.slow
def test_bytes_identical_to_llama_cpp_q4_k(tmp_path, smollm2_path):
    _, (same, diff, other) = run_both(tmp_path, smollm2_path, "q4_k")
    assert diff == []
    with GGUFFile(tmp_path / "mine-q4_k.gguf") as f:
        q4k = [t.name for t in f.tensors if t.type.name == "q4_k"]
    assert len(q4k) >= 20 and set(q4k) - set(other) and len(same) > 200


@pytest.mark.slow
@pytest.mark.parametrize("qtype", ["q6_k"])
def test_bytes_identical_to_llama_cpp_more(tmp_path, smollm2_path, qtype):
    _, (same, diff, other) = run_both(tmp_path, smollm2_path, qtype)
    assert diff == [] and len(same) > 200


@pytest.mark.slow
def test_llama_cpp_loads_and_generates(tmp_path, smollm2_path):
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (optional oracle)")
    out = tmp_path / "q8.gguf"
    assert main(["quantize", str(smollm2_path), str(out), "q8_0", "--allow-requantize", "--quiet"]) == 0
    llm = llama_cpp.Llama(model_path=str(out), n_ctx=128, verbose=False, seed=0)
    res = llm("The capital of France is", max_tokens=8, temperature=0.0)
    text = res["choices"][0]["text"]
    assert res["usage"]["completion_tokens"] > 0 and text.strip()
    assert "Paris" in text


def test_refuses_requantize_without_flag(tmp_path, smollm2_path, capsys):
    assert main(["quantize", str(smollm2_path), str(tmp_path / "x.gguf"), "q8_0"]) == 2
    assert "already quantized" in capsys.readouterr().err
    assert not (tmp_path / "x.gguf").exists()


@pytest.mark.parametrize("bad", ["q9_9", "iq2_xxs", "q8_k"])
def test_unknown_target(tmp_path, smollm2_path, capsys, bad):
    assert main(["quantize", str(smollm2_path), str(tmp_path / "x.gguf"), bad]) == 2
    assert "unsupported target type" in capsys.readouterr().err


def test_missing_input(tmp_path, capsys):
    assert main(["quantize", str(tmp_path / "nope.gguf"), str(tmp_path / "x.gguf"), "q8_0"]) == 2
    assert capsys.readouterr().err.startswith("error:")


def test_small_file_roundtrip(tmp_path):
    """A tiny synthetic model: 2-D weights quantized, norms kept, odd widths fall back like llama.cpp."""
    from llmlab.ggml.gguf import GGUFWriter
    rng = np.random.default_rng(0)
    w = GGUFWriter()
    w.add("general.architecture", "llama")
    w.add_tensor("blk.0.attn_q.weight", rng.standard_normal((8, 512)).astype(np.float32))
    w.add_tensor("blk.0.attn_k.weight", rng.standard_normal((8, 96)).astype(np.float32))
    w.add_tensor("blk.0.attn_norm.weight", np.ones(512, np.float32))
    src = tmp_path / "tiny.gguf"
    w.write(src)
    r = subprocess.run([sys.executable, "-m", "llmlab", "quantize", str(src), str(tmp_path / "o.gguf"), "q4_k"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    with GGUFFile(tmp_path / "o.gguf") as f:
        assert [t.type.name for t in f.tensors] == ["q4_k", "q5_0", "f32"]
        assert f.kv["general.file_type"] == FILE_TYPES["q4_k"]
        assert f.kv["general.architecture"] == "llama"
