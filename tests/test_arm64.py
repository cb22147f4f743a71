"""The ARM profiles (arm_dotprod_fp16, arm_i8mm): the NEON orders they reproduce, checked here on any
machine, and live comparisons with llama.cpp built for aarch64 running under qemu-user (``--arm64``,
make test-arm64).

The stored references (llmlab/data/refs/<arm profile>/, made by tools/arm64/make_refs.py from the
same oracle) feed the generic suites of test_forward.py and test_forward_decode.py, which run every
profile that has references."""
from __future__ import annotations

import json
from fractions import Fraction

import numpy as np
import pytest

from conftest import REF_DIRS, REF_STEMS
from llmlab.ggml.cpu import profiles
from llmlab.ggml.cpu import quants as Q
from llmlab.ggml.cpu.simd import fma, fma_f16
from llmlab.ggml.cpu.vec import vec_dot_f16
from llmlab.ggml.quant import quantize
from llmlab.ggml.types import ggml_type
from llmlab.llama import Batch, Context, Model

ARM = "arm_dotprod_fp16"


def test_fma_f16_rounds_once():
    rng = np.random.default_rng(3)
    a, b, c = (rng.standard_normal(3000).astype(np.float16) * np.float16(s) for s in (1, 4, 64))
    got = fma_f16(a, b, c)
    for i in range(0, 3000, 7):
        exact = Fraction(float(a[i])) * Fraction(float(b[i])) + Fraction(float(c[i]))
        near = np.float16(float(exact))
        cands = [np.nextafter(near, np.float16(-np.inf)), near, np.nextafter(near, np.float16(np.inf))]
        best = min(cands, key=lambda v: (abs(Fraction(float(v)) - exact), int(v.view(np.uint16)) & 1))
        assert got[i] == best, (a[i], b[i], c[i])


def test_vec_dot_f16_accumulates_in_half_precision_on_fp16_va():
    """32 lanes of float16 (4 registers x 8) each count 2049 ones: a half stops at 2048 (2049 is not a
    float16), so FP16_VA's ggml_vec_dot_f16 says 65536 where the float32 lanes of x86 say 65568."""
    x = np.ones(32 * 2049, np.float32)
    assert vec_dot_f16(x, x, ARM) == 32 * 2048
    assert vec_dot_f16(x, x, "avx2") == vec_dot_f16(x, x, "avx512") == 32 * 2049


def test_neon_q8_activations_round_half_to_even_with_one_over_d():
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((4000, 32)) * rng.uniform(0.01, 10, (4000, 1))).astype(np.float32)
    arm = Q.quantize_activations(x, "q8_0", ARM)
    d = (np.abs(x).max(-1) / np.float32(127)).astype(np.float32)
    inv = (np.float32(1) / d).astype(np.float32)
    want = np.rint((x * inv[:, None]).astype(np.float32))                 # vcvtnq_s32_f32(x * id)
    np.testing.assert_array_equal(arm["qs"].reshape(4000, 32), want)
    x86 = Q.quantize_activations(x, "q8_0", "avx2")
    assert (arm["qs"] != x86["qs"]).any() and (arm["d"] == x86["d"]).all()   # same scale, other codes


def _neon_q4_1_scalar(w, a) -> float:
    """ggml_vec_dot_q4_1_q8_1 on NEON, one output, written out: pairs of blocks, vdotq_s32 lanes, two
    accumulators (mul then add), summs += fma(m0, s0, m1*s1), vaddvq_f32 (faddp pairs)."""
    f32 = np.float32
    acc = [np.zeros(4, f32), np.zeros(4, f32)]
    summs = f32(0)
    for b in range(0, len(w) - len(w) % 2, 2):
        summs = f32(summs + fma(f32(w["m"][b]), f32(a["s"][b]), f32(f32(w["m"][b + 1]) * f32(a["s"][b + 1]))))
        for k in (0, 1):
            q = np.concatenate([w["qs"][b + k] & 15, w["qs"][b + k] >> 4]).astype(np.int64)
            p = a["qs"][b + k].astype(np.int64) * q
            lanes = np.array([p[4 * j:4 * j + 4].sum() + p[16 + 4 * j:20 + 4 * j].sum() for j in range(4)], f32)
            dd = f32(f32(w["d"][b + k]) * f32(a["d"][b + k]))
            acc[k] = (acc[k] + (lanes * dd).astype(f32)).astype(f32)
    vaddv = [f32(f32(r[0] + r[1]) + f32(r[2] + r[3])) for r in acc]
    return f32(f32(vaddv[0] + vaddv[1]) + summs)


def test_neon_q4_1_dot_product_order():
    rng = np.random.default_rng(7)
    W = rng.standard_normal((6, 256)).astype(np.float32)
    x = rng.standard_normal((2, 256)).astype(np.float32)
    w = Q.weight_blocks(quantize(W.reshape(-1), "q4_1"), ggml_type("q4_1"), 256)
    a = Q.quantize_activations(x, "q8_1", ARM)
    got = Q.vec_dot_q4_1_q8_1_neon(w, a, ARM)
    want = np.array([[_neon_q4_1_scalar(w[r], a[t]) for r in range(6)] for t in range(2)], np.float32)
    np.testing.assert_array_equal(got, want)
    x86 = Q.vec_dot_q4_1_q8_1(w, Q.quantize_activations(x, "q8_1", "avx2"), "avx2")
    np.testing.assert_allclose(got, x86, rtol=1e-2, atol=1e-2)


def test_arm_profile_routes_the_fast_kernels_to_its_own_bits(smollm2_path):
    """The fast kernel set on the ARM profile: the ARM twins (``fast.neon``: NEON's orders of the quantized
    products; ``fast.vec_f16``: the half-precision f16 products), and the vectorizable ones (ROPE,
    softmax, SwiGLU) with the profile's lanes; prompt and decode steps give the reference kernels' bits."""
    model = Model(smollm2_path, cpu=ARM)
    ids = [1, 504, 3458, 282, 260, 1345, 28, 253, 1115]
    out = {}
    for kernels in ("fast", "reference"):
        ctx = Context(model, n_ctx=64, cpu=ARM, kernels=kernels)
        lg = [ctx.decode(Batch.from_tokens(ids, logits="all"))]
        lg.append(ctx.decode(Batch.from_tokens([int(lg[0][-1].argmax())], pos0=len(ids), logits="last")))
        out[kernels] = np.concatenate(lg)
    np.testing.assert_array_equal(out["fast"], out["reference"])


@pytest.mark.parametrize("cpu, name", [(ARM, "smollm2"), (ARM, "gemma3"), ("arm_i8mm", "smollm2"),
                                       ("arm_i8mm", "gemma3")])
def test_references_record_the_build(cpu, name):
    meta = json.loads((REF_DIRS[cpu] / f"{REF_STEMS[name]}.logits.json").read_text())
    assert profiles._from_system_info(meta["system_info"]) is profiles.get(cpu)
    assert meta["build"] == profiles.get(cpu).build and meta["flash_attn"] is False


def test_i8mm_takes_2x2_mmla_steps_only_for_even_row_counts():
    """MATMUL_INT8's q4_1 kernel for 2x2 outputs: one accumulator per output (no even/odd blocks), the
    min terms fused into their own lanes; ggml uses it only where both row counts are even."""
    i8 = profiles.get("arm_i8mm")
    assert (Q.vec_dot_rows(i8, "q4_1", 576, 16) == 2).all() and Q.vec_dot_rows(i8, "q4_1", 576, 17) == 1
    assert (Q.vec_dot_rows(i8, "q4_1", 576, 18) == 1).all()            # two chunks of 9 tokens
    assert (Q.vec_dot_rows(i8, "q4_1", 576, 24) == 2).all()            # two chunks of 12
    assert Q.vec_dot_rows(ARM, "q4_1", 576, 16) == 1 and Q.vec_dot_rows(i8, "q5_0", 576, 16) == 1
    rng = np.random.default_rng(11)
    w = Q.weight_blocks(quantize(rng.standard_normal(4 * 160).astype(np.float32), "q4_1"), ggml_type("q4_1"), 160)
    x = rng.standard_normal((2, 160)).astype(np.float32)
    a = Q.quantize_activations(x, "q8_1", i8)
    got = Q.vec_dot_q4_1_q8_1_mmla(w, a, i8)
    f32 = np.float32
    for t in range(2):
        for r in range(4):
            acc, summs = f32(0), f32(0)
            for b in range(5):
                q = np.concatenate([w["qs"][r, b] & 15, w["qs"][r, b] >> 4]).astype(np.int64)
                isum = f32(int(a["qs"][t, b].astype(np.int64) @ q))
                acc = f32(acc + f32(isum * f32(f32(w["d"][r, b]) * f32(a["d"][t, b]))))
                summs = fma(f32(w["m"][r, b]), f32(a["s"][t, b]), summs)
            assert got[t, r] == f32(acc + summs)
    assert not profiles.get("arm_i8mm").llamafile and profiles.get(ARM).llamafile


# ---- the i8mm build's K-quant REPACK kernels (q4_K and q6_K as 8x8) --------------------------------

def _k_rows(tname: str, R: int, K: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    W = (rng.standard_normal((R, K)) * rng.uniform(0.2, 3, (R, 1))).astype(np.float32)
    return quantize(W.reshape(-1), tname).reshape(R, -1)


def _read_q4_Kx8(p) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """block_q4_Kx8 read back at the addresses ggml_gemv/gemm_q4_K_8x8_q8_K load: per column (weight row
    of the group) its 256 codes, 8 scales and 8 mins, from the 16-byte loads at qs + 256 sb + 16 cp +
    64 j (8 bytes of columns 2cp and 2cp+1) and decode_q_Kx8_6bit_scales on 12-byte group k."""
    from llmlab.ggml.quant.k_quants import scale_min_k4
    codes = np.zeros((8, 256), np.int64)
    for sb in range(4):
        for cp in range(4):
            for j in range(4):
                v = p["qs"][256 * sb + 16 * cp + 64 * j:][:16].reshape(2, 8)
                for h in range(2):
                    codes[2 * cp + h, 64 * sb + 8 * j:][:8] = v[h] & 15
                    codes[2 * cp + h, 64 * sb + 32 + 8 * j:][:8] = v[h] >> 4
    sc, mn = scale_min_k4(p["scales"].reshape(8, 12))          # (sub-block, column)
    return codes, sc.T.astype(np.int64), mn.T.astype(np.int64)


def _read_q6_Kx8(p) -> tuple[np.ndarray, np.ndarray]:
    """block_q6_Kx8 read back as ggml_gemv/gemm_q6_K_8x8_q8_K load it: per column its 256 codes (minus
    32) and 16 scales; ql from ql + 512 half + 128 sb (+64), qh from qh + 256 half + (128 sb & 255)
    (+64), shifted right by 2 for sb > 1; low nibbles are values 16 sb.., high ones 64 + 16 sb.."""
    codes = np.zeros((8, 256), np.int64)
    for half in range(2):
        for sb in range(4):
            for cp in range(4):
                for j in range(2):
                    ql = p["ql"][512 * half + 128 * sb + 64 * j + 16 * cp:][:16].reshape(2, 8).astype(np.int64)
                    qh = p["qh"][256 * half + (128 * sb & 255) + 64 * j + 16 * cp:][:16].reshape(2, 8).astype(np.int64)
                    qh = qh >> 2 if sb > 1 else qh
                    for h in range(2):
                        at = 128 * half + 16 * sb + 8 * j
                        codes[2 * cp + h, at:at + 8] = ((ql[h] & 15) | ((qh[h] & 3) << 4)) - 32
                        codes[2 * cp + h, at + 64:at + 72] = ((ql[h] >> 4) | (qh[h] & 0x30)) - 32
    return codes, p["scales"].reshape(16, 8).T.astype(np.int64)


def test_k_quant_8x8_layouts_read_back_as_the_kernels_read_them():
    from llmlab.ggml.cpu.repack import make_block_q4_Kx8, make_block_q6_Kx8
    from llmlab.ggml.quant import k_quants as KQ
    w = Q.weight_blocks(_k_rows("q4_k", 16, 512, 1), ggml_type("q4_k"), 512)
    packed = make_block_q4_Kx8(w)
    assert packed.shape == (2, 2) and packed.itemsize == 2 * 16 + 96 + 1024        # sizeof(block_q4_Kx8)
    for g in range(2):
        for b in range(2):
            rows = w[8 * g:8 * g + 8, b]
            codes, sc, mn = _read_q4_Kx8(packed[g, b])
            want_sc, want_mn = KQ.scale_min_k4(rows["scales"])
            np.testing.assert_array_equal(codes, KQ.q4k_codes(rows["qs"]))
            np.testing.assert_array_equal(sc, want_sc)
            np.testing.assert_array_equal(mn, want_mn)
            assert (packed[g, b]["d"] == rows["d"]).all() and (packed[g, b]["dmin"] == rows["dmin"]).all()
    w6 = Q.weight_blocks(_k_rows("q6_k", 16, 512, 2), ggml_type("q6_k"), 512)
    packed6 = make_block_q6_Kx8(w6)
    assert packed6.itemsize == 2 * 8 + 128 + 1024 + 512                                # sizeof(block_q6_Kx8)
    for g in range(2):
        for b in range(2):
            rows = w6[8 * g:8 * g + 8, b]
            codes, sc = _read_q6_Kx8(packed6[g, b])
            np.testing.assert_array_equal(codes, KQ.q6k_codes(rows))
            np.testing.assert_array_equal(sc, rows["scales"])
            assert (packed6[g, b]["d"] == rows["d"]).all()


def test_i8mm_q4_k_and_q6_k_8x8_float_steps():
    """Each output written out from the interleaved blocks: 5 activation rows, so rows 0-3 take the gemm
    kernel (whole super-block sums, mins first, nothing fused) and row 4 the gemv kernel (q4_K: one fma
    per 32 values; q6_K: multiply, then add)."""
    from llmlab.ggml.cpu import repack_gemm as RG
    from llmlab.ggml.cpu.repack import make_block_q4_Kx8, make_block_q6_Kx8
    f32, i8 = np.float32, profiles.get("arm_i8mm")
    x = np.random.default_rng(4).standard_normal((5, 512)).astype(np.float32)
    a = Q.quantize_activations(x, "q8_K", i8)
    qa = a["qs"].astype(np.int64)
    bs32 = a["bsums"].astype(np.int64).reshape(5, 2, 8, 2).sum(-1)
    raw = _k_rows("q4_k", 8, 512, 3)
    p = make_block_q4_Kx8(Q.weight_blocks(raw, ggml_type("q4_k"), 512))[0]
    got = RG.mul_mat_q4_k_8x8_i8mm(raw, ggml_type("q4_k"), x, cpu=i8)
    for c in range(8):
        for t in range(5):
            acc = f32(0)
            for b in range(2):
                codes, sc, mn = _read_q4_Kx8(p[b])
                dots = (codes[c].reshape(8, 32) * qa[t, b].reshape(8, 32)).sum(-1) * sc[c]
                d = f32(f32(p[b]["d"][c]) * a["d"][t, b])
                dm = f32(f32(p[b]["dmin"][c]) * a["d"][t, b])
                mins = f32(f32(int(bs32[t, b] @ mn[c])) * dm)
                if t < 4:
                    acc = f32(f32(acc - mins) + f32(f32(int(dots.sum())) * d))
                else:
                    for j in range(8):
                        acc = fma(d, f32(int(dots[j])), acc)
                    acc = f32(acc - mins)
            assert got[t, c] == acc, (t, c)
    raw6 = _k_rows("q6_k", 8, 512, 5)
    p6 = make_block_q6_Kx8(Q.weight_blocks(raw6, ggml_type("q6_k"), 512))[0]
    got6 = RG.mul_mat_q6_k_8x8_i8mm(raw6, ggml_type("q6_k"), x, cpu=i8)
    for c in range(8):
        for t in range(5):
            acc = f32(0)
            for b in range(2):
                codes, sc = _read_q6_Kx8(p6[b])
                isum = int(((codes[c] * qa[t, b]).reshape(16, 16).sum(-1) * sc[c]).sum())
                acc = f32(acc + f32(f32(isum) * f32(f32(p6[b]["d"][c]) * a["d"][t, b])))
            assert got6[t, c] == acc, (t, c)


def test_i8mm_repacks_the_k_quants_8x8_with_their_own_order():
    """The i8mm build takes 8x8 for q4_K and q6_K (dotprod alone: 8x4) and rounds elsewhere: the same
    weights and activations give other bits, here and there."""
    from llmlab.ggml.cpu.ops import mul_mat_quantized, quantized_path
    i8, arm = profiles.get("arm_i8mm"), profiles.get(ARM)
    x = np.random.default_rng(6).standard_normal((9, 2048)).astype(np.float32)
    for tname, layout in (("q4_k", "q4_K_8x8_i8mm"), ("q6_k", "q6_K_8x8_i8mm")):
        t = ggml_type(tname)
        assert i8.repack_layout(tname) == layout and quantized_path(t, 9, True, i8) == "repack"
        assert i8.repacks(tname, 640) and not i8.repacks(tname, 644)
        raw = _k_rows(tname, 64, 2048, 7)
        got, dotprod = mul_mat_quantized(raw, t, x, True, i8), mul_mat_quantized(raw, t, x, True, arm)
        assert (got != dotprod).any()
        np.testing.assert_allclose(got, dotprod, rtol=1e-4, atol=1e-3)


# ---- live: the aarch64 llama.cpp under qemu-user (make test-arm64) -----------------------------------

FRESH = {"smollm2": "A lighthouse keeper counted the ships that passed in the night, and each one",
         "gemma3": "Die Katze sitzt auf dem Dach und schaut den Vögeln zu, während"}


def _oracle(cpu=ARM):
    from llmlab.llamacpp import arm64
    why = arm64.available(cpu)
    if why:
        pytest.fail(f"--arm64 needs the oracle: {why}")
    return arm64


@pytest.mark.arm64
@pytest.mark.parametrize("flash_attn", [False, True], ids=["fa_off", "fa_on"])
@pytest.mark.parametrize("cpu, name, cut", [(ARM, "smollm2", 0), (ARM, "gemma3", 0),
                                            ("arm_i8mm", "smollm2", 0), ("arm_i8mm", "smollm2", 1),
                                            ("arm_i8mm", "gemma3", 0), ("arm_i8mm", "gemma3", 1)])
def test_live_logits_and_greedy_equal_arm64_llama_cpp(request, cpu, name, cut, flash_attn):
    """Fresh prompts (``cut`` drops tokens: the i8mm build takes other kernels for even and odd counts)."""
    arm64 = _oracle(cpu)
    from llmlab.llama.vocab.tokenizer import Tokenizer
    path = request.getfixturevalue(f"{name}_path")
    ids = Tokenizer.from_model(path).tokenize(FRESH[name], add_bos=True, special=True)
    ids = ids[:len(ids) - cut]
    want = arm64.run(path, ids, cpu, flash_attn=flash_attn, n_predict=6)
    got = arm64.llmlab_run(path, ids, cpu, flash_attn=flash_attn, n_predict=6)
    assert profiles._from_system_info(want.system_info) is profiles.get(cpu)
    assert got.greedy == want.greedy
    np.testing.assert_array_equal(got.prompt_logits, want.prompt_logits)
    np.testing.assert_array_equal(got.gen_logits, want.gen_logits)


NODE_IDS = {"smollm2": [1, 504, 3458, 282, 260, 1345, 28, 253, 1115, 2632, 314],
            "gemma3": [2, 818, 5866, 2838, 580, 506, 1756, 532, 506, 4799, 691]}   # 8 gemm rows, 3 gemv


@pytest.mark.arm64
@pytest.mark.parametrize("flash_attn", [False, True], ids=["fa_off", "fa_on"])
@pytest.mark.parametrize("cpu, name", [(ARM, "smollm2"), ("arm_i8mm", "gemma3")])
def test_live_nodes_equal_arm64_llama_cpp(request, cpu, name, flash_attn):
    """Every node llama.cpp names and llmlab computes too (same name and size) holds the same bits; a
    node llama.cpp dumps twice under one name (a contiguous reshape) must equal one of llmlab's."""
    arm64 = _oracle(cpu)
    from llmlab.llamacpp import llmlab_nodes
    path, ids = request.getfixturevalue(f"{name}_path"), NODE_IDS[name]
    want = arm64.run(path, ids, cpu, flash_attn=flash_attn, dump_nodes=True)
    mine: dict[tuple, list] = {}
    for label, _op, _ne, vals in llmlab_nodes(path, ids, flash_attn=flash_attn, cpu=cpu, n_ctx=512):
        if vals is not None:
            v = np.asarray(vals, np.float32).reshape(-1)
            mine.setdefault((label, v.size), []).append(v)
    checked = 0
    for name, _ne, vals in want.nodes:
        cands = mine.get((name, vals.size))
        if not cands:
            continue
        assert any(np.array_equal(c, vals, equal_nan=True) for c in cands), f"{name} differs"
        checked += 1
    assert checked > 300


@pytest.mark.parametrize("cpu", [ARM, "arm_i8mm"])
def test_dispatch_paths_and_fast_entry_point_on_arm(cpu):
    """ARM's kernel choice (q8_0 and the K-quants in the REPACK buffer, no tiled matmul) and the fast set's
    entry point: the ARM twins (no x86 one) answer for a NEON profile, with the reference kernels' bits."""
    from llmlab.ggml.cpu import fast
    from llmlab.ggml.cpu.ops import mul_mat_quantized, quantized_path
    c = profiles.get(cpu)
    q4k, q80, q41 = ggml_type("q4_k"), ggml_type("q8_0"), ggml_type("q4_1")
    assert quantized_path(q80, 1, True, c) == "repack" and quantized_path(q41, 64, False, c) == "vec_dot"
    assert quantized_path(q4k, 64, True, c) == "repack" and quantized_path(q4k, 64, False, c) is None
    rng = np.random.default_rng(2)
    for tname in ("q4_1", "q5_0", "q8_0", "q4_k", "q6_k"):
        raw = quantize(rng.standard_normal(8 * 256).astype(np.float32), tname).reshape(8, -1)
        for T in (1, 7, 8, 16):
            x = rng.standard_normal((T, 256)).astype(np.float32)
            for repacked in (False, True):
                want = mul_mat_quantized(raw, ggml_type(tname), x, repacked, c)
                np.testing.assert_array_equal(fast.mul_mat_quantized(raw, ggml_type(tname), x, repacked, c), want)
