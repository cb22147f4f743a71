"""llmlab.cuda_sim: dp4a, q8_1, the vec_dot kernels and whole simulated MMVQ launches, each against an
independent computation (integers exactly, floats within float32 rounding)."""
from __future__ import annotations

import numpy as np
import pytest

import llmlab.cuda_sim as cs
import llmlab.ggml.quant as Q
from llmlab.cuda_sim.dp4a import Memory, pack_s8
from llmlab.ggml.gguf import GGUFFile
from llmlab.ggml.quant.core import nibbles, random_blocks
from llmlab.ggml.quant.k_quants import q4k_codes, q6k_codes
from llmlab.ggml.quant.legacy import q5_codes
from llmlab.ggml.types import ggml_type

TYPES = ["q4_0", "q4_1", "q5_0", "q8_0", "q4_K", "q6_K"]
EPS32 = 2.0 ** -24


def wrap32(v):
    return (np.asarray(v, np.int64) + 2**31) % 2**32 - 2**31


def int8_lanes(a):
    return np.ascontiguousarray(np.asarray(a, np.int64).astype(np.uint32)).view(np.int8).reshape(-1, 4).astype(np.int64)


# ---------------------------------------------------------------- dp4a and registers


def test_dp4a_matches_bytewise_int_arithmetic():
    rng = np.random.default_rng(0)
    a, b = rng.integers(-2**31, 2**31, 10_000), rng.integers(-2**31, 2**31, 10_000)
    c = rng.integers(-2**31, 2**31, 10_000)
    want = wrap32((int8_lanes(a) * int8_lanes(b)).sum(1) + c)
    got = cs.dp4a(a.astype(np.int32), b.astype(np.int32), c.astype(np.int32))
    assert got.dtype == np.int32 and np.array_equal(got, want)


def test_dp4a_wraps_like_int32_and_reads_hex_constants():
    big = 2**31 - 1
    assert cs.dp4a(0x7F7F7F7F, 0x7F7F7F7F, big) == wrap32(big + 4 * 127 * 127) < 0
    assert cs.dp4a(0x80808080, 0x80808080, 0) == 4 * 128 * 128            # -128 * -128, four times
    assert cs.dp4a(0xE0E0E0E0, 0x01020304, 0) == -32 * (1 + 2 + 3 + 4)   # 0xE0 is -32 as a signed byte
    assert isinstance(cs.dp4a(1, 1, 0), np.int32)


def test_q6_minus_32_two_ways():
    """llama.cpp's __vsub4(v, 0x20202020) and the seed's dp4a(0xE0E0E0E0, u) give the same integer."""
    rng = np.random.default_rng(1)
    v = pack_s8(rng.integers(0, 64, (5000, 4)))
    u = rng.integers(-2**31, 2**31, 5000).astype(np.int32)
    assert np.array_equal(cs.dp4a(cs.vsub4(v, 0x20202020), u, 0), cs.dp4a(0xE0E0E0E0, u, cs.dp4a(v, u, 0)))


def test_aligned_loads():
    raw = np.arange(40, dtype=np.uint8)
    mem = Memory(raw)
    want = raw[6:10].view("<i4")[0]
    assert cs.get_int_b2(mem, 2, 1) == want                          # 2-byte aligned pointer: two 16-bit halves
    assert cs.get_int_b4(mem, 4, 1) == raw[8:12].view("<i4")[0]
    with pytest.raises(ValueError, match="misaligned"):
        cs.get_int_b4(mem, 2, 1)                                     # q4_0's qs start at byte 2 of 18: only b2 works
    with pytest.raises(ValueError, match="misaligned"):
        cs.get_int_b2(mem, 1, 0)


# ---------------------------------------------------------------- q8_1


def tree_sum(v):
    """The butterfly's sum, written as a recursion: pairs (i, i + n/2), then again on the first half."""
    v = [np.float32(t) for t in v]
    while len(v) > 1:
        h = len(v) // 2
        v = [np.float32(v[i] + v[i + h]) for i in range(h)]
    return v[0]


def test_quantize_q8_1_bytes():
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((3, 576)) * rng.uniform(0.1, 10, (3, 1))).astype(np.float32)
    x[0, :32] = 0                                                    # an all-zero block: d = 0, q = 0
    raw = cs.quantize_q8_1(x)
    assert raw.shape == (3, 1024 // 32 * 36)                         # padded to 512 * 2
    b = raw.reshape(-1).view(ggml_type("q8_1").layout).reshape(3, -1)
    assert not b[:, 18:]["qs"].any() and not b[:, 18:]["d"].any()
    assert not b[0, 0]["qs"].any() and b[0, 0]["d"] == 0
    xb = x.reshape(3, 18, 32)
    amax = np.abs(xb).max(-1)
    assert np.array_equal(b[:, :18]["d"], (amax / np.float32(127)).astype(np.float16))
    q = b[:, :18]["qs"].astype(np.float64)
    d = (amax / np.float32(127)).astype(np.float64)[..., None]
    err = np.abs(q * d - xb)
    assert np.all(err <= d / 2 * (1 + 1e-6))                         # nearest code
    assert np.all(np.abs(q[1:]).max(-1) == 127)
    for c, blk in [(1, 3), (2, 17)]:
        assert b[c, blk]["s"] == np.float16(tree_sum(xb[c, blk]))


def test_quantize_q8_1_rounds_halves_away_from_zero():
    v = np.zeros(32, np.float32)
    v[:4] = [127, 2.5, -2.5, 0.5]                                    # d = 1 exactly
    q = cs.quantize_q8_1(v).reshape(-1).view(ggml_type("q8_1").layout)[0]["qs"]
    assert q[:4].tolist() == [127, 3, -3, 1]


# ---------------------------------------------------------------- vec_dot, block by block


def _codes_dot(name, blocks, yb):
    """sum of weight code * activation code over each weight block, codes as the kernels keep them."""
    layout = ggml_type(name).layout
    b = blocks.view(layout)
    codes = {"q4_0": lambda: nibbles(b["qs"]), "q4_1": lambda: nibbles(b["qs"]), "q5_0": lambda: q5_codes(b),
             "q8_0": lambda: b["qs"], "q4_K": lambda: q4k_codes(b["qs"]), "q6_K": lambda: q6k_codes(b)}[name]()
    qy = yb["qs"].reshape(len(b), -1).astype(np.int64)
    return (codes.astype(np.int64) * qy).sum(-1), qy.sum(-1)


def _block_dots(name, raw, x, fast_fp16):
    """Every thread of every weight block: (float sums over the block's threads, code dot, activation-code sum)."""
    t = cs.cuda_type(name)
    n = raw.size // t.bs
    yq = cs.quantize_q8_1(x)
    yb = yq.reshape(-1).view(ggml_type("q8_1").layout)[: n * t.qk // 32]
    kbx = np.arange(n)[:, None]
    ints = []
    v = t.vec_dot(Memory(raw, "w"), Memory(yq, "y"), kbx, kbx * (t.qk // 32), t.vdr * np.arange(t.threads_per_block),
                  fast_fp16=fast_fp16, ints=ints)
    return v.astype(np.float64).sum(1), np.stack([np.broadcast_to(i, v.shape) for i in ints], -1).sum(1), yb


def _check_block_dots(name, raw, x, fast_fp16=False):
    t = cs.cuda_type(name)
    got, ints, yb = _block_dots(name, raw, x, fast_fp16)
    code_dot, sum_qy = _codes_dot(name, raw, yb)
    if name == "q4_K":                                               # ints: dot1, dot2 per sub-block pair
        assert np.array_equal(ints[:, 0] + ints[:, 2], code_dot)
        assert np.array_equal(ints[:, 1] + ints[:, 3], sum_qy)
    else:
        assert np.array_equal(ints.sum(1), code_dot)
    w = Q.dequantize(raw, name).reshape(-1, t.qk).astype(np.float64)
    y = Q.dequantize(yb.view(np.uint8), "q8_1").reshape(len(w), -1).astype(np.float64)
    want = (w * y).sum(1)
    scale = np.abs(w * y).sum(1) + np.abs(w).max(1) * np.abs(y).sum(1)
    if name in cs.mmvq.USES_S:                                       # the offset term goes through s = sum of float x
        off = cs.mmvq.zero_code_values(raw.reshape(len(w), -1), name)[:, 0].astype(np.float64)
        s = yb["s"].astype(np.float64).reshape(len(w), -1).sum(1)
        dq = (yb["d"].astype(np.float64) * yb["qs"].sum(-1)).reshape(len(w), -1).sum(1)
        want += off * (s - dq)
        scale += np.abs(off * s)
    assert np.all(np.abs(got - want) <= 32 * EPS32 * scale + 1e-30), name


@pytest.mark.parametrize("name", TYPES)
def test_vec_dot_random_blocks(name):
    t = cs.cuda_type(name)
    n = 64
    raw = random_blocks(name.lower(), n, seed=3, scale=0.05)
    x = np.random.default_rng(4).standard_normal(n * t.qk).astype(np.float32)
    _check_block_dots(name, raw, x)


@pytest.mark.parametrize("name", TYPES)
def test_vec_dot_quantized_floats(name):
    t = cs.cuda_type(name)
    rng = np.random.default_rng(5)
    raw = Q.quantize(rng.standard_normal(32 * t.qk).astype(np.float32), name.lower())
    _check_block_dots(name, raw, rng.standard_normal(32 * t.qk).astype(np.float32))


def test_q4_1_half_products():
    """Fast-fp16 GPUs round d_w*d_x and m_w*s to half: the block result moves by at most that rounding."""
    raw = random_blocks("q4_1", 64, seed=6, scale=1.0)
    x = np.random.default_rng(7).standard_normal(64 * 32).astype(np.float32)
    exact, ints, yb = _block_dots("q4_1", raw, x, fast_fp16=False)
    half, _, _ = _block_dots("q4_1", raw, x, fast_fp16=True)
    b = raw.view(ggml_type("q4_1").layout)
    dd = np.abs(b["d"].astype(np.float64) * yb["d"]) * np.abs(ints[:, 0])
    ms = np.abs(b["m"].astype(np.float64) * yb["s"])
    bound = 2.0 ** -11 * (dd + ms) + 2.0 ** -24 * (np.abs(ints[:, 0]) + 1) + 64 * EPS32 * (dd + ms)
    assert np.all(np.abs(half - exact) <= bound)
    assert np.any(half != exact)


REAL = [("smollm2", "blk.0.ffn_up.weight", "q4_1"), ("gemma3", "blk.0.attn_q.weight", "q5_0"),
        ("gemma3", "blk.0.attn_output.weight", "q4_K"), ("gemma3", "blk.0.ffn_down.weight", "q6_K"),
        ("gemma3", "blk.0.attn_v.weight", "q8_0")]


@pytest.fixture(scope="module")
def real_files():
    from llmlab import models
    files = {m: GGUFFile(models.resolve(m)) for m in ("smollm2", "gemma3")}
    yield files
    for f in files.values():
        f.close()


def _real_rows(files, model, tensor):
    t = files[model].tensor(tensor)
    nrows = t.shape[1]
    return np.asarray(t.data).reshape(nrows, -1), t.shape[0]


@pytest.mark.parametrize("model,tensor,name", REAL)
def test_vec_dot_real_blocks(real_files, model, tensor, name):
    rows, k = _real_rows(real_files, model, tensor)
    raw = rows[:4].reshape(-1)
    x = np.random.default_rng(8).standard_normal(raw.size // cs.cuda_type(name).bs * cs.cuda_type(name).qk)
    _check_block_dots(name, raw, x.astype(np.float32))


# ---------------------------------------------------------------- whole launches


def _independent_ints(name, w_rows, yq, k):
    """(ncols, nrows) integer dot of codes, the sum a launch's dp4a accumulators must add up to."""
    t = cs.cuda_type(name)
    yb = yq.reshape(-1).view(ggml_type("q8_1").layout).reshape(len(yq), -1)[:, : k // 32]
    out = np.zeros((len(yq), len(w_rows)), np.int64)
    for j in range(len(yq)):
        tiled = np.broadcast_to(yb[j], (len(w_rows), k // 32)).reshape(-1, t.qk // 32)
        out[j] = _codes_dot(name, np.ascontiguousarray(w_rows).reshape(-1), tiled)[0].reshape(len(w_rows), -1).sum(1)
    return out


def _check_launch(name, w_rows, x, ncols_dst, arch):
    t = cs.cuda_type(name)
    launch = cs.simulate(w_rows, name, x, ncols_dst, arch)
    p = launch.params
    nrows, k = len(w_rows), np.shape(x)[-1]
    # every weight block of a row is visited by exactly qi/vdr threads, each starting at a different word
    visits = np.zeros((p["blocks_per_row"], t.qi), int)
    for it in range(p["iters"]):
        on = launch.active[it]
        np.add.at(visits, (launch.kbx[it][on], launch.kqs[on]), 1)
    assert np.all(visits[:, :: t.vdr] == 1) and visits.sum() == p["blocks_per_row"] * t.threads_per_block
    # integers: all dp4a accumulators of a row (over trips, warps, lanes) = the code dot product
    code_idx = [0, 2] if name == "q4_K" else slice(None)
    ints = launch.ints[..., code_idx].astype(np.int64).sum((0, 4, 5, 6))     # (blocks, cols, rows)
    ints = np.moveaxis(ints, 1, 0).reshape(ncols_dst, -1)[:, :nrows]
    assert np.array_equal(ints, _independent_ints(name, w_rows, cs.quantize_q8_1(x), k))
    # floats: the reference within float32 rounding of the kernel's path
    ref = cs.reference(w_rows, name, x)
    w = Q.dequantize(w_rows.reshape(-1), name).reshape(nrows, k).astype(np.float64)
    off = np.abs(cs.mmvq.zero_code_values(w_rows, name).astype(np.float64))
    yq = cs.quantize_q8_1(x).reshape(-1).view(ggml_type("q8_1").layout).reshape(ncols_dst, -1)[:, : k // 32]
    y = np.abs(Q.dequantize(yq.view(np.uint8), "q8_1").reshape(ncols_dst, k).astype(np.float64))
    s = np.repeat(np.abs(yq["s"].astype(np.float64)), 32, axis=1)
    scale = y @ (np.abs(w) + off).T + s @ off.T
    depth = 16 + p["iters"] + p["nwarps"]
    assert launch.dst.dtype == np.float32 and launch.dst.shape == (ncols_dst, nrows)
    assert np.all(np.abs(launch.dst - ref) <= depth * EPS32 * scale), (name, ncols_dst, arch)
    return launch


SHAPES = {"q4_0": (40, 576), "q4_1": (33, 1536), "q5_0": (48, 640), "q8_0": (37, 2048), "q4_K": (35, 1024), "q6_K": (24, 2304)}


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("ncols_dst", range(1, 9))
def test_launch_against_reference(name, ncols_dst):
    nrows, k = SHAPES[name]
    rng = np.random.default_rng(ncols_dst)
    w = Q.quantize(rng.standard_normal(nrows * k).astype(np.float32), name.lower()).reshape(nrows, -1)
    x = rng.standard_normal((ncols_dst, k)).astype(np.float32)
    _check_launch(name, w, x, ncols_dst, "sm_61")                  # plain float32 scale products
    if name != "q4_1":                                               # the only type using half products (tested above)
        _check_launch(name, w, x, ncols_dst, "generic")


@pytest.mark.parametrize("model,tensor,name", [("smollm2", "blk.0.ffn_up.weight", "q4_1"),
                                               ("gemma3", "blk.0.ffn_up.weight", "q5_0"),
                                               ("gemma3", "blk.0.ffn_down.weight", "q6_K"),
                                               ("gemma3", "blk.0.attn_output.weight", "q4_K")])
def test_launch_real_layers(real_files, model, tensor, name):
    import time
    rows, k = _real_rows(real_files, model, tensor)
    x = np.random.default_rng(9).standard_normal(k).astype(np.float32)
    t0 = time.perf_counter()
    launch = _check_launch(name, rows, x[None], 1, "sm_61")
    assert time.perf_counter() - t0 < 20
    assert np.array_equal(cs.mul_mat_vec_q(rows, name, x, arch="sm_61"), launch.dst[0])
    # generic: same integers; q4_1's half products move the floats by about 1e-3 of the output scale at most
    fast = cs.mul_mat_vec_q(rows, name.lower(), x)
    assert np.abs(fast - launch.dst[0]).max() <= 2e-3 * np.abs(launch.dst).max()


def test_fused_swiglu_smollm2(real_files):
    up, k = _real_rows(real_files, "smollm2", "blk.0.ffn_up.weight")
    gate, _ = _real_rows(real_files, "smollm2", "blk.0.ffn_gate.weight")
    x = np.random.default_rng(10).standard_normal(k).astype(np.float32)
    fused = cs.simulate(up, "q4_1", x, gate_rows=gate, glu="swiglu")
    u, g = cs.mul_mat_vec_q(up, "q4_1", x), cs.mul_mat_vec_q(gate, "q4_1", x)
    assert np.array_equal(fused.gate.dst[0], g)
    want = u.astype(np.float64) * g / (1 + np.exp(-g.astype(np.float64)))
    assert np.allclose(fused.dst[0], want, rtol=1e-5, atol=1e-6 * np.abs(want).max())
    with pytest.raises(ValueError, match="single column"):
        cs.simulate(up, "q4_1", np.stack([x, x]), 2, gate_rows=gate)


def test_reduction_steps():
    rng = np.random.default_rng(11)
    w = Q.quantize(rng.standard_normal(8 * 4096).astype(np.float32), "q4_k").reshape(8, -1)
    launch = cs.simulate(w, "q4_K", rng.standard_normal(4096).astype(np.float32))
    p = launch.params
    assert launch.shared.shape == (8, p["nwarps"] - 1, 1, 1, 32)       # nwarps-1 slots: warp 0 stays in registers
    for slot in range(p["nwarps"] - 1):                                  # slot l holds warp l + 1's registers
        assert np.array_equal(launch.shared[:, slot], launch.partial[:, :, :, slot + 1])
    mag = np.abs(launch.partial.astype(np.float64)).sum(3)
    want = launch.partial.astype(np.float64).sum(3)
    assert np.all(np.abs(launch.warp0 - want) <= 4 * EPS32 * mag)
    final = launch.shuffle[-1][1]
    assert [o for o, _ in launch.shuffle] == [16, 8, 4, 2, 1]
    assert np.all(final == final[..., :1])                             # the butterfly leaves the sum in every lane
    assert np.all(np.abs(final[..., 0] - want.sum(-1)) <= 16 * EPS32 * mag.sum(-1))


def test_which_lane_reads_which_bytes():
    """One warp over two q4_K super-blocks: 16 lanes each, 8 bytes of qs per lane, the 128 qs bytes of each block."""
    rng = np.random.default_rng(12)
    w = Q.quantize(rng.standard_normal(2 * 4096).astype(np.float32), "q4_k").reshape(2, -1)
    launch = cs.simulate(w, "q4_K", rng.standard_normal(4096).astype(np.float32), keep_reads=True)
    qs = {}
    for lane in range(32):
        reads = [(a, n) for it, mem, a, n in launch.thread_reads(0, 0, lane) if mem == "weights" and it == 0 and n == 4]
        qs[lane] = sorted(a + i for a, n in reads for i in range(n))
        assert len(qs[lane]) == 8
    for half, kbx in ((range(16), 0), (range(16, 32), 1)):
        covered = sorted(b for lane in half for b in qs[lane])
        assert covered == list(range(kbx * 144 + 16, kbx * 144 + 144))


# ---------------------------------------------------------------- launch parameters


def test_seed_launch_arithmetic_4096_q4_K():
    p = cs.launch_params("q4_K", 4096, 4096)
    assert (p["blocks_per_row"], p["blocks_per_iter"], p["iters"], p["nwarps"], p["rows_per_block"]) == (16, 8, 2, 4, 1)
    assert p["grid"] == (4096, 1, 1) and p["block"] == (32, 4, 1)
    assert p["threads"] == 524_288 and p["weights_per_thread"] == 32
    assert p["threads"] * p["weights_per_thread"] == 4096 * 4096
    assert cs.cuda_type("q4_0").threads_per_block == 2 and cs.cuda_type("q4_k").threads_per_block == 16


def test_nwarps_and_rows_per_block_tables():
    assert [cs.calc_nwarps("q4_0", n) for n in range(1, 9)] == [4, 4, 4, 4, 2, 2, 2, 2]
    assert [cs.calc_rows_per_block(n) for n in range(1, 9)] == [1, 2, 2, 2, 2, 2, 2, 2]
    assert cs.calc_nwarps("q4_K", 1, "turing") == 2 and cs.calc_nwarps("q4_0", 1, "turing") == 4
    # small_k: 4 super-blocks per row would leave warps idle, so each warp takes a row
    assert cs.launch_params("q4_K", 640, 1024)["rows_per_block"] == 4
    assert cs.launch_params("q4_K", 640, 2048)["rows_per_block"] == 1
    assert cs.launch_params("q4_K", 640, 1024, ncols_dst=2)["rows_per_block"] == 2
    p = cs.launch_params("q4_K", 4096, 4096, ncols_dst=6)
    assert (p["nwarps"], p["rows_per_block"], p["blocks_per_iter"], p["grid"]) == (2, 2, 4, (2048, 1, 1))
    with pytest.raises(ValueError):
        cs.launch_params("q4_K", 16, 4096, ncols_dst=9)


def test_dispatch_thresholds():
    def limit(t, arch):
        return max(n for n in range(1, 17) if cs.should_use_mmvq(t, n, arch))
    assert limit("q2_K", "ada") == 4 and limit("q3_K", "ada") == 6 and limit("q4_K", "ada") == 8
    assert [limit(t, "blackwell") for t in ("q4_K", "q5_K", "q6_K", "q4_0")] == [5, 6, 7, 8]
    assert all(limit(t, "generic") == 8 for t in cs.CUDA_TYPES)
    assert limit("q6_K", "orin") == 1 and limit("q8_0", "orin") == 8


# ---------------------------------------------------------------- appendix: dispatch, MoE, bounds, fastdiv, loading


def test_vsub4_and_vsubss4_agree_on_q6_codes_only():
    codes = np.arange(64, dtype=np.int32) * 0x01010101
    assert np.array_equal(cs.vsub4(codes, 0x20202020), cs.vsubss4(codes, 0x20202020))
    from llmlab.cuda_sim.dp4a import bytes_s8
    assert bytes_s8(cs.vsub4(0x7F, 0xE0)).tolist()[0] == -97          # 127 - (-32) wraps
    assert bytes_s8(cs.vsubss4(0x7F, 0xE0)).tolist()[0] == 127        # ... or saturates


def test_arch_names_follow_compute_capability():
    assert not cs.ARCHS["sm_60"].dp4a and cs.ARCHS["sm_60"].fast_fp16      # P100: half math, no dp4a
    assert cs.ARCHS["sm_61"].dp4a and not cs.ARCHS["sm_61"].fast_fp16      # GTX 10x0: dp4a, slow half math
    assert "pascal" not in cs.ARCHS


def test_mul_mat_kernel_chain():
    k = cs.mul_mat_kernel
    assert [k("q4_K", n, "ada") for n in (1, 8, 9, 512)] == ["MMVQ", "MMVQ", "MMQ", "MMQ"]
    assert [k("q4_K", n, "blackwell") for n in (5, 6)] == ["MMVQ", "MMQ"]
    assert [k("q4_0", n, "volta") for n in (8, 9, 63, 64)] == ["MMVQ", "MMQ", "MMQ", "cuBLAS"]
    assert [k("q4_0", n, "sm_61") for n in (8, 64, 4096)] == ["MMVQ", "MMQ", "MMQ"]   # no FP16 tensor cores
    assert k("q4_0", 9, "sm_60") == "cuBLAS"                      # no dp4a: no MMQ for dense products
    assert cs.should_use_mmq("q4_0", 9, "sm_60", n_experts=8)       # ... but yes for MoE
    assert [k("f16", n, "ampere") for n in (1, 2, 16, 17)] == ["MMVF", "MMF", "MMF", "cuBLAS"]
    assert [k("f16", n, "ampere", nrows=4096) for n in (1,)] == ["MMVF"]
    assert [k("f16", n, "volta") for n in (3, 4)] == ["MMVF", "MMF"]
    assert [k("f16", n, "sm_61") for n in (8, 9)] == ["MMVF", "cuBLAS"]
    assert k("f32", 1, "ampere") == "MMVF" and k("f32", 4, "ampere") == "MMF"
    assert k("q4_K", 1, "ampere") == "MMVQ"


def test_mmid_limits_and_moe_launch():
    assert [cs.mmid_max_batch(t, "sm_61") for t in ("q4_0", "q4_K", "q6_K", "q8_0")] == [6, 5, 4, 4]
    assert [cs.mmid_max_batch(t, "turing") for t in ("q2_K", "q3_K", "q4_K", "q6_K")] == [7, 5, 8, 8]
    assert cs.mmid_max_batch("q2_K", "volta") == cs.mmid_max_batch("q2_K", "ada") == 8
    one = cs.moe_launch_params("q4_K", 768, 2048, 1, 8)
    assert one["kernel"] == "mul_mat_vec_q" and one["grid"] == (768, 8, 1) and one["block"] == (32, 4, 1)
    four = cs.moe_launch_params("q4_K", 768, 2048, 4, 8)
    assert four["kernel"] == "mul_mat_vec_q_moe" and four["grid"] == (384, 8, 1) and four["block"] == (32, 4, 1)
    assert four["blocks_per_iter"] == 2 and four["shared_floats"] == 0
    assert four["weight_decodes"] == 4 * one["weight_decodes"]
    with pytest.raises(ValueError):
        cs.moe_launch_params("q6_K", 768, 2048, 5, 8, "sm_61")


def test_launch_bounds_follow_calc_nwarps():
    assert cs.launch_bounds("q4_K", 1)["max_threads"] == 128
    assert cs.launch_bounds("q4_K", 6)["max_threads"] == 64
    assert cs.launch_bounds("q4_K", 1, "gb10", halve_iters=True)["max_threads"] == 256
    assert cs.launch_bounds("q2_K", 4, "turing", moe=True)["max_threads"] == 7 * 32
    b = cs.launch_bounds("q4_K", 1, regs_per_sm=16384)
    assert b["regs_per_thread"] == 128 and b["min_blocks"] == 1


def test_fastdiv_equals_integer_division():
    from llmlab.cuda_sim import fastdiv as fd
    rng = np.random.default_rng(5)
    n = np.concatenate([np.arange(5000, dtype=np.uint64), rng.integers(0, 2**31, 200_000, dtype=np.uint64),
                        np.array([2**31 - 1], np.uint64)])
    for d in [1, 2, 3, 5, 7, 12, 31, 640, 65_537, 2**31 - 1] + rng.integers(1, 2**31, 20).tolist():
        v = fd.init_fastdiv_values(int(d))
        assert np.array_equal(fd.fastdiv(n, v), n // np.uint64(d)), d
        assert np.array_equal(fd.fastmodulo(n, v), n % np.uint64(d)), d
    assert fd.init_fastdiv_values(3) == (0x55555556, 2, 3)
    with pytest.raises(ValueError):
        fd.init_fastdiv_values(0)


def test_upload_chunks_cover_every_byte_once():
    from llmlab.cuda_sim import load
    tensors = [("a", 100, 3_000_000), ("b", 3_000_100, 10), ("c", 3_000_200, 2_500_000)]
    for alignment in (1, 4096):
        chunks = load.upload_chunks(tensors, alignment=alignment, buffer_size=1 << 20 if alignment == 1 else None)
        for name, _, n in tensors:
            mine = [c for c in chunks if c.tensor == name]
            assert sum(c.copy_bytes for c in mine) == n
            assert [c.offset for c in mine] == list(np.cumsum([0] + [c.copy_bytes for c in mine[:-1]]))
        assert [c.buffer for c in chunks] == [i % 4 for i in range(len(chunks))]
    assert len(load.upload_chunks(tensors)) == 3 + 1 + 3
    t = load.upload_timeline(load.upload_chunks(tensors), read_bytes_per_s=2e9, upload_bytes_per_s=20e9)
    assert np.all(t[:, 1] <= t[:, 2]) and np.all(np.diff(t[:, 3]) > 0)
    assert t[-1, 3] < sum(c.read_bytes / 2e9 + c.copy_bytes / 20e9 for c in load.upload_chunks(tensors))


def test_cuda_padding_and_bad_padding_clear():
    from llmlab.cuda_sim import load
    assert load.cuda_alloc_size("q4_1", (576, 1536)) == 576 * 1536 // 32 * 20 + (512 - 64) // 32 * 20
    assert load.cuda_alloc_size("q4_K", (2048, 640)) == 2048 * 640 // 256 * 144        # a multiple of 512: none
    assert load.cuda_alloc_size("f16", (576, 10)) == 576 * 10 * 2                        # not quantized: none
    assert load.bad_padding_clear(True, 10, 20, True)
    assert not load.bad_padding_clear(True, 10, 20, False) and not load.bad_padding_clear(False, 10, 20, True)
    assert not load.bad_padding_clear(True, 20, 20, True)


def test_spacemit_requantization(real_files):
    from llmlab.cuda_sim import load
    t = real_files["gemma3"].tensor("blk.0.attn_output.weight")            # q4_K
    raw = np.asarray(t.data)
    q41 = load.repack_q4_k_to_q4_1(raw)
    assert q41.size == raw.size // 144 * 8 * 20
    a, b = Q.dequantize(raw, "q4_k"), Q.dequantize(q41, "q4_1")
    assert np.abs(a - b).max() <= 2.0 ** -10 * np.abs(a).max()             # only the f16 rounding of d*sc and dmin*m
    t = real_files["gemma3"].tensor("blk.0.ffn_down.weight")               # q6_K
    raw = np.asarray(t.data)
    q80 = load.repack_q6_k_to_q8_0(raw).reshape(-1).view(ggml_type("q8_0").layout)
    assert q80.size == raw.size // 210 * 8
    a, b = Q.dequantize(raw, "q6_k").reshape(-1, 32), Q.dequantize(q80.view(np.uint8), "q8_0").reshape(-1, 32)
    # per group of 32: the largest magnitude keeps code +-127, every value moves by at most half a new step (+ f16 of d)
    step = q80["d"].astype(np.float32)[:, None]
    assert np.all(np.abs(a - b) <= 0.5 * step + 2.0 ** -10 * np.abs(a).max(1, keepdims=True) + 1e-12)
    assert np.array_equal(np.abs(q80["qs"]).max(1)[np.abs(a).max(1) > 0], np.full((np.abs(a).max(1) > 0).sum(), 127))
    zero = raw[:210].copy()
    zero[:] = 0
    assert not load.repack_q6_k_to_q8_0(zero).view(np.int8)[2:34].any()   # all-zero group: zeros, no NaN


def test_tables_match_the_vendored_source(llama_cpp_src):
    import re
    src = llama_cpp_src
    cuda = src / "ggml/src/ggml-cuda"
    mmvq = (cuda / "mmvq.cu").read_text()
    for table_name, table in cs.launch.MMID_MAX_BATCH.items():
        body = re.search(rf"get_mmvq_mmid_max_batch_{table_name}\(ggml_type type\) \{{(.*?)\n\}}", mmvq, re.S).group(1)
        got = {m[0].lower().replace("_k", "_K"): int(m[1]) for m in re.findall(r"GGML_TYPE_(\w+):\s+return (\d+);", body)}
        assert got == table, table_name
    assert re.search(r"#define GGML_CUDA_CC_DP4A\s+610", (cuda / "common.cuh").read_text())
    assert re.search(r"#define MMQ_DP4A_MAX_BATCH_SIZE (\d+)", (cuda / "mmq.cuh").read_text())[1] == \
        str(cs.launch.MMQ_DP4A_MAX_BATCH_SIZE)
    assert re.search(r"#define MMF_ROWS_PER_BLOCK (\d+)", (cuda / "mmf.cuh").read_text())[1] == str(cs.launch.MMF_ROWS_PER_BLOCK)
    assert "__vsub4((vil | vih), 0x20202020)" in (cuda / "vecdotq.cuh").read_text()
    assert "init_fastdiv_values" in (cuda / "common.cuh").read_text()
    loader = (src / "src/llama-model-loader.cpp").read_text()
    assert "constexpr size_t n_buffers = 4;" in loader and "64 * 1024 * 1024 + 2 * alignment : 1 * 1024 * 1024" in loader


def test_coalescing_counts():
    """MMVQ's pattern is the simulator's first qs load of each lane (vec_dot_q4_K_q8_1's q4[0]): one
    warp-wide instruction moves 8 sectors of 3 lines and uses half of their bytes."""
    from llmlab.viz import mmvq as vm
    pats = vm.coalescing_patterns()
    lines = {k: len(np.unique(np.concatenate([(a + i) // 128 for i in range(4)]))) for k, a in pats.items()}
    assert list(lines.values()) == [1, 3, 32]
    html = str(vm.coalescing_table())
    assert "100%" in html and "50%" in html and "12%" in html and ">8<" in html
    rng = np.random.default_rng(12)
    w = Q.quantize(rng.standard_normal(2 * 4096).astype(np.float32), "q4_k").reshape(2, -1)
    launch = cs.simulate(w, "q4_K", rng.standard_normal(4096).astype(np.float32), keep_reads=True)
    first = [min(a for it, mem, a, n in launch.thread_reads(0, 0, lane) if mem == "weights" and it == 0 and n == 4)
             for lane in range(32)]
    mmvq = next(a for k, a in pats.items() if "MMVQ" in k)
    assert first == mmvq.tolist()
