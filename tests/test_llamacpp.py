"""llama.cpp in the loop: the captured graph of both real models, flash attention on and off."""
from __future__ import annotations

import numpy as np
import pytest

llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (optional oracle)")

from conftest import ref_logits  # noqa: E402

from llmlab.ggml.gguf import GGUFFile  # noqa: E402
from llmlab.llamacpp import capture, diff, run_logits, tokenize  # noqa: E402
from llmlab.llamacpp import ggml_tensor as gt  # noqa: E402

ISSUE_NAMES = {   # in execution order (K and V may come in either order)
    "llama": ["embd", "attn_norm-0", "Qcur-0", "Kcur-0", "Vcur-0", "kqv_out-0", "attn_out-0", "ffn_inp-0",
              "ffn_norm-0", "ffn_out-7", "l_out-7", "result_norm", "result_output"],
    "gemma3": ["embd", "inp_scaled", "attn_norm-0", "Qcur-0", "Kcur-0", "Vcur-0", "kqv_out-0", "attn_post_norm-0",
               "sa_out-0", "ffn_norm-0", "ffn_out-7", "ffn_post_norm-7", "l_out-7", "result_norm", "result_output"],
}


@pytest.fixture(scope="module", params=[(m, fa) for m in ("smollm2", "gemma3") for fa in (False, True)],
                ids=lambda p: f"{p[0]}-fa_{'on' if p[1] else 'off'}")
def captured(request):
    name, fa = request.param
    path = request.getfixturevalue(f"{name}_path")
    _, arrs = ref_logits(name)
    ids = arrs["p0_ids"].tolist()
    return name, path, arrs, capture(path, ids, flash_attn=fa)


def hparams(path):
    kv = GGUFFile(path).kv
    arch = kv["general.architecture"]
    n_head = kv[f"{arch}.attention.head_count"]
    n_embd = kv[f"{arch}.embedding_length"]
    head_dim = kv.get(f"{arch}.attention.key_length", n_embd // n_head)
    return dict(arch=arch, n_embd=n_embd, n_head=n_head, n_head_kv=kv[f"{arch}.attention.head_count_kv"],
                head_dim=head_dim, n_layer=kv[f"{arch}.block_count"], eps=kv[f"{arch}.attention.layer_norm_rms_epsilon"])


def test_ggml_tensor_layout_matches_the_library():
    gt.check_layout()      # sizeof + a probe tensor read back field by field
    assert gt.op_name(0) == "NONE" and gt.type_name(8) == "q8_0"


def test_capture_has_the_named_nodes_in_graph_order(captured):
    name, path, arrs, cap = captured
    hp = hparams(path)
    n = len(cap.tokens)
    for nm in ISSUE_NAMES[hp["arch"]]:
        assert nm in cap, nm
    order = [nm for nm in ISSUE_NAMES[hp["arch"]] if nm not in ("Kcur-0", "Vcur-0")]   # K and V: either comes first
    idx = {nm: min(i for i, x in enumerate(cap.nodes) if x.label == nm) for nm in order}
    assert [idx[nm] for nm in order] == sorted(idx.values())                # execution order
    assert cap["attn_norm-0"].ne == (hp["n_embd"], n, 1, 1) and cap["attn_norm-0"].op == "MUL"
    assert cap["Qcur-0"].op == "ROPE" and cap["Qcur-0"].ne == (hp["head_dim"], hp["n_head"], n, 1)
    assert cap["result_output"].ne == (cap.logits.shape[1], n, 1, 1) and cap["result_output"].op == "MUL_MAT"
    assert all(cap.layer(il) for il in range(hp["n_layer"]))
    ops = {x.op_desc for x in cap.compute_nodes()}
    assert {"GET_ROWS", "RMS_NORM", "MUL", "MUL_MAT", "ROPE", "ADD"} <= ops
    assert ("SWIGLU" if hp["arch"] == "llama" else "GEGLU") in ops
    if cap.flash_attn:
        fa = cap["flash_attn_ext-0"]
        assert fa.op == "FLASH_ATTN_EXT" and not fa.named and fa.ne == (hp["head_dim"], hp["n_head"], n, 1)
        assert "kq_soft_max-0" not in cap
    else:
        sm = cap["kq_soft_max-0"]
        assert sm.op == "SOFT_MAX" and sm.ne == (256, n, hp["n_head"], 1)     # n_kv: the cache padded to 256
        assert "FLASH_ATTN_EXT" not in ops


def test_result_output_is_the_logits_and_the_shared_references(captured):
    name, path, arrs, cap = captured
    out = cap["result_output"].values.reshape(len(cap.tokens), -1)
    assert np.array_equal(out, cap.logits)
    top = np.argsort(-cap.logits, axis=1, kind="stable")[:, :8]
    if not cap.flash_attn:           # the refs were made with flash attention off: bit for bit the same run
        assert np.array_equal(cap.logits[-1], arrs["p0_last_logits"])
        assert np.array_equal(top[:, 0], arrs["p0_top_ids"][:, 0])
    else:   # the flash kernel accumulates V in f16: close (cosine measured 0.9986 / SmolLM2), same argmax
        cos = cap.logits[-1] @ arrs["p0_last_logits"] / np.linalg.norm(cap.logits[-1]) / np.linalg.norm(arrs["p0_last_logits"])
        assert cos > 0.995
        assert np.array_equal(top[:, 0], arrs["p0_top_ids"][:, 0])


def test_values_read_back_correctly(captured):
    """Recompute a few nodes from their captured inputs: an RMS norm, a norm-weight product, a permuted view."""
    name, path, arrs, cap = captured
    hp = hparams(path)
    f = GGUFFile(path)
    first = {}
    for x in cap.nodes:                      # the first RMS norm of layer 0 normalizes the layer's input
        first.setdefault(x.label, x)
    x_in = cap["inp_scaled" if hp["arch"] == "gemma3" else "embd"].values.astype(np.float64)
    rms = x_in / np.sqrt((x_in ** 2).mean(-1, keepdims=True) + hp["eps"])
    assert np.allclose(first["norm-0"].values, rms, rtol=1e-5, atol=1e-6)
    w = f.tensor("blk.0.attn_norm.weight").array.astype(np.float32)
    assert np.allclose(cap["attn_norm-0"].values, first["norm-0"].values * w, rtol=1e-6, atol=0)
    if not cap.flash_attn:
        kqv = next(x for x in cap.nodes if x.label == "kqv-0").values            # (n_head, n_tokens, head_dim)
        perm = next(x for x in cap.nodes if x.name == "kqv-0 (permuted)").values  # strided read of a permute
        assert np.array_equal(perm[0], kqv[0].transpose(1, 0, 2))


def test_fused_run_agrees_with_the_node_by_node_run(smollm2_path):
    """The callback makes ggml compute node by node (no fusion); the logits stay the same up to f32 noise."""
    _, arrs = ref_logits("smollm2")
    ids = arrs["p1_ids"].tolist()
    a = capture(smollm2_path, ids, values=False).logits
    b = run_logits(smollm2_path, ids)
    assert np.abs(a - b).max() <= 1e-4 * np.abs(b).max()
    assert np.array_equal(b[-1], arrs["p1_last_logits"])


def test_self_diff_is_exact_and_finds_an_injected_error(smollm2_path):
    ids = tokenize(smollm2_path, "Hello")
    cap = capture(smollm2_path, ids)
    mine = [(x.label, x.op_desc, x.ne, x.values) for x in cap.compute_nodes()]
    rep = diff(mine, cap)
    assert rep.matched == rep.total == len(cap.compute_nodes()) and rep.first_divergence is None
    assert all(d.max_abs_err == 0 for d in rep.nodes if d.max_abs_err is not None)
    bad = [(lab, op, ne, v * 1.1 if lab == "ffn_out-3" else v) for lab, op, ne, v in mine]
    assert diff(bad, cap).first_divergence == "ffn_out-3"


def test_tokenize_matches_the_references(real_model):
    name, path = real_model
    from conftest import ref_tokens
    cases = ref_tokens(name)
    texts = [c["text"] for c in cases]
    assert tokenize(path, texts, add_special=False, parse_special=False) == [c["ids"] for c in cases]
    assert tokenize(path, texts, add_special=False, parse_special=True) == [c["ids_special"] for c in cases]
    assert tokenize(path, texts, add_special=True, parse_special=False) == [c["ids_bos"] for c in cases]


def test_decode_after_prefill_reuses_the_cache(smollm2_path):
    """One token after a 10-token prefill: its graph attends over the cached cells; logits as a full run's."""
    ids = tokenize(smollm2_path, "The history of the printing press begins in the")
    step = capture(smollm2_path, ids[-1:], prefix=ids[:-1], values=["kq_soft_max-0"])
    full = capture(smollm2_path, ids, values=False)
    assert step["kq-0"].ne[:2] == (256, 1)
    probs = step["kq_soft_max-0"].values[0, :, 0]                   # (n_head, n_kv)
    assert (probs[:, len(ids):] == 0).all() and np.allclose(probs.sum(-1), 1, atol=1e-5)
    assert (probs[:, :len(ids)] > 0).all()                          # the prefix's cells are seen
    assert np.abs(step.logits[-1] - full.logits[-1]).max() <= 1e-4 * np.abs(full.logits[-1]).max()


def test_micro_batches_each_get_a_graph(smollm2_path):
    cap = capture(smollm2_path, list(range(100, 110)), values=False, n_ubatch=4)
    kq = [(n.ubatch, n.ne[:2]) for n in cap.nodes if n.label == "kq-0"]
    assert kq == [(0, (256, 4)), (1, (256, 4)), (2, (256, 2))]
    assert cap.logits.shape[0] == 10


def test_compute_buffer_grows_with_the_micro_batch(smollm2_path):
    from llmlab.llamacpp.eval_callback import context_report
    mib = [context_report(smollm2_path, 1024, n_ubatch=u, n_batch=512)["compute_mib"]["CPU"] for u in (64, 128, 256)]
    assert mib[0] < mib[1] < mib[2] and abs(mib[2] / mib[1] - 2) < 0.1


def test_bad_input_gives_clear_errors(smollm2_path, tmp_path):
    from llmlab import LLMLabError
    with pytest.raises(ValueError, match="at least one token"):
        capture(smollm2_path, [])
    with pytest.raises(LLMLabError, match="not found"):
        capture(tmp_path / "nope.gguf", [1])
    with pytest.raises(LLMLabError, match="llama_decode failed"):
        capture(smollm2_path, [1, 10**7], values=False)          # token id beyond the vocabulary
    with pytest.raises(ValueError, match="flash_attn"):
        capture(smollm2_path, [1], flash_attn="maybe")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 60)
    with pytest.raises(LLMLabError, match="could not load"):
        capture(bad, [1])


def test_cli_reports_user_errors(capsys):
    from llmlab.cli import main
    assert main(["diff-llama-cpp", "-m", "/nonexistent/model.gguf", "-p", "hi"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["diff-llama-cpp", "-m", "smollm2", "-p", "hi", "--layers", "5:2"]) == 2
    assert "--layers" in capsys.readouterr().err
