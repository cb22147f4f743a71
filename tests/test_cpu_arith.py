"""llmlab.viz.cpu_arith: notebook 03's ARM column (x86 and ARM arithmetic side by side)."""
import subprocess
import sys

import numpy as np
import pytest

from llmlab.ggml.cpu import quants as Q
from llmlab.ggml.quant import legacy as L
from llmlab.viz import cpu_arith as ca


def _q4_1_rows(rng, n_rows=32, n=576):
    return L.quantize_q4_1(rng.standard_normal((n_rows * n // 32, 32)).astype(np.float32)).reshape(n_rows, -1)


def test_dot_orders_are_the_kernels_and_differ_in_the_last_bits():
    rng = np.random.default_rng(0)
    W = _q4_1_rows(rng)
    x = rng.standard_normal(576).astype(np.float32)
    differ = 0
    for w in W:
        o = ca.q4_1_dot_orders(w, x)          # asserts each value equals the engine's kernel
        a, b = o["avx2"], o["arm_dotprod_fp16"]
        assert list(a.registers) == ["acc"] and a.registers["acc"].shape == (8,)
        assert [r.shape for r in b.registers.values()] == [(4,), (4,)]
        # the lanes hold the same integer-scaled sum, split differently
        assert np.isclose(a.registers["acc"].astype(float).sum(),
                          sum(r.astype(float).sum() for r in b.registers.values()), rtol=1e-5, atol=1e-5)
        scale = max(abs(float(v)) for _, v in a.steps)       # the terms cancel: a few ulps of the largest
        assert abs(float(a.value) - float(b.value)) <= 4 * np.finfo(np.float32).eps * scale
        differ += a.value != b.value
    assert 0 < differ < len(W)
    _, rows = ca.dot_order_rows(o)
    assert len(rows) == 8 + 8 + 3 + 5 and rows[-1][2].endswith(f"({ca.hex32(b.value)})")


def test_dot_orders_reject_an_odd_block_count():
    rng = np.random.default_rng(1)
    with pytest.raises(ValueError, match="even number of blocks"):
        ca.q4_1_dot_orders(_q4_1_rows(rng, 1, 96)[0], np.ones(96, np.float32))


def test_f16_accumulation_is_far_coarser_than_f32():
    rng = np.random.default_rng(2)
    q = rng.standard_normal((4, 6, 64)).astype(np.float32)
    k = rng.standard_normal((2, 6, 64)).astype(np.float32)
    mask = np.triu(np.full((6, 6), -np.inf, np.float32), 1)
    f = ca.f16_scores(q, k, mask, 0.125)
    assert f.scores["avx2"].shape == (4, 6, 6)
    assert f.max_error("avx2") < 1e-4 < f.max_error("arm_dotprod_fp16")
    assert f.max_diff() > 0 and f.max_diff("probs") > 0
    np.testing.assert_allclose(f.probs["arm_dotprod_fp16"].sum(-1), 1, atol=1e-5)
    assert np.all(f.probs["avx2"][np.isinf(np.broadcast_to(mask, (4, 6, 6)))] == 0)
    run = ca.running_f16_sum(q[0, 0], k[0, 0])
    assert len(run) == 2 and run[-1] == f.scores["arm_dotprod_fp16"][0, 0, 0]


def test_q8_0_tie_rules():
    x = np.zeros(32, np.float32)
    x[:3] = 2.5, -0.5, 127                 # amax 127: d = 1, every product exact, 2.5 and -0.5 are ties
    c = ca.q8_0_codes(x)
    ref, x86, arm = (v[0, :2].tolist() for v in c.values())
    assert ref == [3, -1] and x86 == arm == [2, 0]


def test_q8_0_x86_and_arm_codes_differ_only_at_a_half():
    rng = np.random.default_rng(3)
    X = (rng.standard_normal((4000, 576)) * rng.uniform(0.01, 10, (4000, 1))).astype(np.float32)
    c = list(ca.q8_0_codes(X).values())
    where = np.flatnonzero((c[1] != c[2]).reshape(-1))
    assert len(where) > 0
    sc = ca.q8_0_scaled(X)
    for i in where:
        p, r = float(sc["127/amax"][i]), float(sc["1/d"][i])
        # the two products straddle or touch a half: one is the tie itself, or the half lies between them
        half = np.floor(min(p, r)) + 0.5
        assert min(p, r) <= half <= max(p, r)
    rows = ca.q8_0_difference_rows(X.reshape(-1, 576)[where[0] // 576])
    assert rows and rows[0][5] != rows[0][6]


def test_profile_and_reference_tables():
    rows = ca.profile_rows(["avx2", "arm_dotprod_fp16", "arm_i8mm"])
    assert [r[3] for r in rows] == ["f32", "f16", "f16"] and [r[5] for r in rows] == ["yes", "yes", "no"]
    assert all(len(r) == len(ca.PROFILE_HEADERS) for r in rows)
    refs = ca.ref_logit_rows("smollm2", ["avx2", "avx512", "arm_dotprod_fp16"])
    assert [r[0] for r in refs] == ["avx2 vs avx512", "avx2 vs arm_dotprod_fp16", "avx512 vs arm_dotprod_fp16"]
    assert all(float(r[2]) > 0 for r in refs)


def test_quantized_matmul_inputs(smollm2_path):
    from llmlab.llama import Model
    m = Model(smollm2_path, cpu="avx2")
    acts = ca.quantized_matmul_inputs(m, [1, 504, 3458, 282], cpu="avx2")
    n = m.hparams.n_layer
    assert {"attn_norm", "kqv_out", "ffn_norm", "ffn_swiglu", "result_norm"} <= set(acts)
    assert acts["attn_norm"].shape == (4 * n, 576) and acts["result_norm"].shape == (1, 576)
    rows, _ = ca.q8_0_changes(acts)
    assert [r[1] for r in rows] == [a.size for a in acts.values()]
    assert Q.quantize_activations(acts["kqv_out"][:1], "q8_0").shape == (1, 18)


def test_nb_setup_names_the_arm_profile_on_a_faked_arm_machine():
    code = ("import llmlab.ggml.cpu.profiles as p, platform\n"
            "platform.machine = lambda: 'arm64'\n"
            "p.llama_cpp_system_info = lambda: None\n"
            "p.cpu_flags = lambda: {'fp', 'asimd', 'asimddp', 'asimdhp', 'fphp', 'i8mm'}\n"
            "from llmlab import nb\n"
            "nb.setup(models=())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    line = next(s for s in out.stdout.splitlines() if s.startswith("CPU profile:"))
    assert line.startswith("CPU profile: arm_i8mm (from /proc/cpuinfo)") and line.endswith("llama.cpp: yes")
    assert "asimddp asimdhp" in out.stdout and "avx" not in out.stdout.split("SIMD:")[1].split("\n")[0]
