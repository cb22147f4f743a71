"""The fast (numba) kernels equal their NumPy references bit for bit: activation quantizers, every
quantized product per type and path (vec_dot, tiled, REPACK), the dispatch, any thread count."""
from __future__ import annotations

import numpy as np
import pytest

from llmlab.ggml.cpu import fast
from llmlab.ggml.cpu.fast import dot4
from llmlab.ggml.cpu.fast.twins import TWINS
from llmlab.ggml.cpu.fast._common import round_to_f16
from llmlab.ggml.cpu.fast.quantize import quantize_q8_0, quantize_q8_1, quantize_q8_k
from llmlab.ggml.types import ggml_type

from kernel_data import acts, raw_rows, same_bits

# ---- the NumPy references: imported here only, so a rename upstream is a one-place fix ----------
from llmlab.ggml.cpu.quants import mul_mat as vec_dot_mul_mat
from llmlab.ggml.cpu.ops import mul_mat_quantized as ref_mul_mat_quantized
from llmlab.ggml.cpu.quants import quantize_activations

TS = (1, 3, 7, 8, 9, 17)


# ---- float16 and activation quantizers -----------------------------------------------------------

def test_f16_rounding_matches_numpy():
    rng = np.random.default_rng(0)
    u = np.concatenate([rng.integers(0, 2**32, 2_000_000, dtype=np.uint64).astype(np.uint32),
                        np.arange(0x33000000, 0x48000000, 997, dtype=np.uint32)])
    x = u.view(np.float32)
    x = x[~np.isnan(x)]
    with np.errstate(over="ignore"):
        ref = x.astype(np.float16).astype(np.float32)
    assert same_bits(round_to_f16(x), ref)


@pytest.mark.parametrize("T,K", [(1, 576), (7, 2048), (17, 640)])
def test_quantizers(T, K):
    x = acts(T, K)
    a = quantize_activations(x, "q8_0")
    qs, d = quantize_q8_0(x)
    assert np.array_equal(qs, a["qs"].reshape(T, K)) and same_bits(d, a["d"].astype(np.float32))
    a = quantize_activations(x, "q8_1")
    qs, d, s = quantize_q8_1(x)
    assert np.array_equal(qs, a["qs"].reshape(T, K)) and same_bits(d, a["d"].astype(np.float32))
    assert same_bits(s, a["s"].astype(np.float32))
    if K % 256 == 0:
        x[0, :256] = 0
        a = quantize_activations(x, "q8_K")
        qs, d, bs = quantize_q8_k(x)
        assert np.array_equal(qs, a["qs"].reshape(T, K)) and same_bits(d, a["d"])
        assert np.array_equal(bs, a["bsums"].reshape(T, -1))


# ---- kernels per type and path, random blocks --------------------------------------------------

def generic(raw, tname, x, path):
    """The generic twin of (tname, path) from the table, threaded and serial alike."""
    k = TWINS[tname, path].generic
    p = k.pack(raw, tname, x.shape[1])
    return [fn(*p, *k.quantize(x))[:, :raw.shape[0]] for fn in (k.threaded, k.serial) if fn is not None]


CASES = [(t, path, R, K) for (t, path) in TWINS
         for R, K in ([(40, 576), (70, 640)] if not t.endswith("_k") else [(40, 512), (33, 1024)])]


@pytest.mark.parametrize("tname,path,R,K", CASES, ids=[f"{t}-{p}-{R}x{K}" for t, p, R, K in CASES])
def test_generic_kernels(tname, path, R, K):
    """Every generic twin in the table equals its reference, for T from 1 to a prefill block."""
    raw = raw_rows(tname, R, K, seed=R + K)
    t = ggml_type(tname)
    ref = TWINS[tname, path].reference
    for T in TS:
        x = acts(T, K, seed=T)
        for got in generic(raw, tname, x, path):
            assert same_bits(got, ref(raw, t, x)), (tname, path, R, K, T)


# ---- the dispatch takes the reference's path ------------------------------------------------------

ISAS = dot4.host_isas()


# (type, path, R, K, seed offset): R not a multiple of 16 (a partial row group) in every pair
DOT4_CASES = [(t, path, R, K, o) for o, ((t, path), tw) in enumerate(TWINS.items()) if tw.byte_dot
              for R, K in ([(40, 576), (70, 640)] if not t.endswith("_k") else [(40, 512), (33, 1024)])]


@pytest.mark.skipif(not ISAS, reason="this host has neither AVX512-VNNI nor AVX2")
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("tname,path,R,K,seed", DOT4_CASES, ids=[f"{t}-{p}-{R}x{K}" for t, p, R, K, _ in DOT4_CASES])
def test_dot4_kernels(tname, path, R, K, seed, isa):
    """dot4's kernels (lane sums by vpdpbusd, or pmaddubsw + pmaddwd), threaded and limited to one
    thread, equal the reference path they reproduce (q4_K's gemm rows in groups of 4 and gemv rows
    alike, q6_K's vec_dot and tiled), for T from 1 to a prefill block, at 1 and 2 threads, on every
    instruction set this host runs (a VNNI host checks the AVX2 kernels too); the thread limit is
    undone when the kernel returns."""
    import numba
    raw = raw_rows(tname, R, K, seed=R + K + seed)
    tw = TWINS[tname, path]
    k = tw.byte_dot[isa]
    p = k.pack(raw, tname, K)
    n0 = numba.get_num_threads()
    try:
        for T in TS + (64,):
            x = acts(T, K, seed=T + 100 * seed)
            ref = tw.reference(raw, ggml_type(tname), x)
            for n in (1, 2):
                n = min(n, numba.config.NUMBA_NUM_THREADS)
                numba.set_num_threads(n)
                for limit in (0, 1):
                    out = np.full((T, R), np.nan, np.float32)
                    k.threaded(*p, x, out, *k.extra, limit)
                    assert same_bits(out, ref), (tname, R, K, T, n, limit)
                    assert numba.get_num_threads() == n
    finally:
        numba.set_num_threads(n0)


@pytest.mark.parametrize("cpu", [None, "avx2"], ids=["detected", "avx2"])
@pytest.mark.parametrize("with_dot4", [True, False], ids=["dot4-if-host", "generic"])
@pytest.mark.parametrize("tname,K", [("q4_0", 256), ("q4_1", 256), ("q5_0", 256), ("q8_0", 256), ("q4_k", 512), ("q6_k", 512)])
def test_dispatch_matches_reference(tname, K, with_dot4, cpu, monkeypatch):
    """Both kernel families for q4_0 / q4_1 / q5_0 / q8_0: byte dot products where the host has them,
    and the generic kernels (every other host, or LLMLAB_DOT4=0); the path is the profile's."""
    if not with_dot4:
        monkeypatch.setattr(dot4, "AVAILABLE", False)
    t = ggml_type(tname)
    raw = raw_rows(tname, 48, K)
    for T in (1, 7, 8, 9):
        for repacked in (False, True):
            x = acts(T, K, seed=10 + T)
            assert same_bits(fast.mul_mat_quantized(raw, t, x, repacked, cpu),
                             ref_mul_mat_quantized(raw, t, x, repacked, cpu)), (tname, T, repacked)


@pytest.mark.parametrize("cpu", ["avx512", "avx2"])
def test_dispatch_paths(cpu):
    from llmlab.ggml.cpu import profiles
    from llmlab.ggml.cpu.ops import quantized_path
    c = profiles.get(cpu)
    q4k, q6k, q41 = ggml_type("q4_k"), ggml_type("q6_k"), ggml_type("q4_1")
    assert quantized_path(q4k, 1, True, c) == "repack" and quantized_path(q4k, 64, True, c) == "repack"
    assert quantized_path(q4k, 7, False, c) == "vec_dot" and quantized_path(q4k, 8, False, c) == "tiled"
    assert quantized_path(q6k, 7, True, c) == "vec_dot" and quantized_path(q6k, 8, True, c) == "tiled"
    assert quantized_path(q41, 64, False, c) == "vec_dot"


# ---- the real models' tensors (a few rows each) ---------------------------------------------------

REAL = [("smollm2", "blk.0.ffn_up.weight"), ("smollm2", "blk.0.ffn_down.weight"), ("smollm2", "token_embd.weight"),
        ("gemma3", "blk.0.attn_q.weight"), ("gemma3", "blk.0.attn_output.weight"), ("gemma3", "blk.0.ffn_down.weight"),
        ("gemma3", "blk.1.ffn_down.weight"), ("gemma3", "blk.3.attn_v.weight"), ("gemma3", "token_embd.weight")]


@pytest.fixture(scope="module")
def ggufs():
    from llmlab import models
    from llmlab.ggml.gguf import GGUFFile
    out = {}
    for m in ("smollm2", "gemma3"):
        out[m] = GGUFFile(models.resolve(m))                     # fetched once (make test fetches them first)
    return out


@pytest.mark.parametrize("model,name", REAL, ids=[f"{m}:{n}" for m, n in REAL])
def test_real_tensors(ggufs, model, name):
    t = ggufs[model].tensor(name)
    K = t.shape[0]
    qt = t.type
    row_bytes = K // qt.block_size * qt.type_size
    R = 64
    raw = np.asarray(t.data)[:R * row_bytes].reshape(R, row_bytes)
    for T in (1, 8, 17):
        x = acts(T, K, seed=T)
        for repacked in ((False, True) if qt.name == "q4_k" else (False,)):
            assert same_bits(fast.mul_mat_quantized(raw, qt, x, repacked), ref_mul_mat_quantized(raw, qt, x, repacked)), (name, T, repacked)


# ---- thread count does not change a bit ----------------------------------------------------------

def test_thread_count_independence():
    import numba
    n0 = numba.get_num_threads()
    try:
        for tname, K, R, T, rp in [("q4_1", 576, 1536, 1, False), ("q8_0", 640, 999, 3, False),
                                   ("q4_k", 1024, 640, 1, True), ("q4_k", 1024, 640, 9, True),
                                   ("q6_k", 2048, 640, 1, False), ("q6_k", 2048, 640, 9, False)]:
            t = ggml_type(tname)
            raw = raw_rows(tname, R, K, seed=3)
            x = acts(T, K, seed=5)
            outs = []
            for n in (1, 2):
                fast.set_threads(n)
                outs.append(fast.mul_mat_quantized(raw, t, x, rp))
            fast.clear_cache()
            assert same_bits(outs[0], outs[1]), (tname, T)
    finally:
        fast.set_threads(n0)


# ---- decode kernels, serial twins, the parallel threshold, dropped file pages ---------------------

@pytest.mark.parametrize("tname", ["q4_0", "q4_1", "q5_0", "q8_0"])
@pytest.mark.parametrize("R,K", [(40, 576), (70, 640)])
def test_legacy_kernels_at_1_and_2_threads(tname, R, K):
    """The legacy quants' vec_dot twin (codes straight into registers, fused exact fma) and its serial
    twin equal the reference for T in {1, 3, 8, 17}, at 1 and 2 threads."""
    import numba
    raw = raw_rows(tname, R, K, seed=R + K + 1)
    t = ggml_type(tname)
    k = TWINS[tname, "vec_dot"].generic
    p = k.pack(raw, tname, K)
    n0 = numba.get_num_threads()
    try:
        for T in (1, 3, 8, 17):
            x = acts(T, K, seed=T + 100)
            a = k.quantize(x)
            ref = vec_dot_mul_mat(raw, t, x)
            for n in (1, 2):
                numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
                for fn in (k.threaded, k.serial):
                    got = fn(*p, *a)[:, :R]
                    assert same_bits(got, ref), (tname, fn, R, K, T, n)
    finally:
        numba.set_num_threads(n0)


def test_dispatch_parallel_and_serial_agree(monkeypatch):
    """Forcing every call parallel (threshold 0) or serial (threshold huge) gives the same bits."""
    for tname, K, rp in [("q4_1", 576, False), ("q5_0", 640, False), ("q8_0", 640, False), ("q4_k", 512, True), ("q6_k", 512, False)]:
        t = ggml_type(tname)
        raw = raw_rows(tname, 72, K, seed=11)
        for T in (1, 3, 8, 17):
            x = acts(T, K, seed=T + 7)
            ref = ref_mul_mat_quantized(raw, t, x, rp)
            for thr in (0, 1 << 60):
                monkeypatch.setenv("LLMLAB_PARALLEL_MIN_WORK", str(thr))
                assert same_bits(fast.mul_mat_quantized(raw, t, x, rp), ref), (tname, T, thr)
        fast.clear_cache()


def test_packing_drops_file_pages_and_keeps_bytes(tmp_path, monkeypatch):
    """A weight viewed from a read-only mmap: chunked packing (small chunks here) gives the bits of a
    one-piece pack; the file pages are dropped (madvise) and the bytes still read back unchanged."""
    import mmap
    from llmlab.ggml.cpu.fast import dispatch
    monkeypatch.setattr(dispatch, "PACK_CHUNK_ROWS", 64)
    raw = raw_rows("q8_0", 200, 640, seed=2)
    f = tmp_path / "w.bin"
    f.write_bytes(b"\0" * 100 + raw.tobytes())
    with open(f, "rb") as fh:
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        view = np.frombuffer(mm, np.uint8, count=raw.nbytes, offset=100).reshape(raw.shape)
        t = ggml_type("q8_0")
        x = acts(3, 640, seed=1)
        fast.clear_cache()
        got = fast.mul_mat_quantized(view, t, x)
        assert same_bits(got, ref_mul_mat_quantized(raw, t, x))
        assert np.array_equal(view, raw)                       # dropped pages read back from the file
        assert dispatch.drop_file_pages(view)
        assert not dispatch.drop_file_pages(raw)               # not an mmap: nothing done
        anon = mmap.mmap(-1, 4096)
        assert not dispatch.drop_file_pages(np.frombuffer(anon, np.uint8))   # writable: never dropped
        fast.clear_cache()
        del view, got


def test_bound_call_across_row_counts_and_threads():
    """fast.bind: one prepared call, alternating row counts (decode kernels and full kernels) and
    thread counts, always the reference's bits."""
    import numba
    n0 = numba.get_num_threads()
    try:
        for tname, K, rp in [("q4_1", 576, False), ("q8_0", 640, False), ("q4_k", 512, True), ("q6_k", 512, False)]:
            t = ggml_type(tname)
            raw = raw_rows(tname, 64, K, seed=21)
            run = fast.bind(raw, t, rp)
            for T, n in [(1, 2), (17, 2), (1, 1), (3, 2), (8, 1), (1, 2)]:
                numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
                x = acts(T, K, seed=T + n)
                assert same_bits(run(x), ref_mul_mat_quantized(raw, t, x, rp)), (tname, T, n)
            fast.clear_cache()
    finally:
        numba.set_num_threads(n0)


def test_fma_is_the_instruction_in_both_paths_double_rounding_cases_included():
    """(1 + 2^-12)^2 + c lands on a float32 midpoint in float64 for tiny c: a float64 sum rounded to
    float32 rounds twice there. Both the reference's fma and the kernels' equal the C library's fmaf."""
    import ctypes
    import ctypes.util
    from numba import njit
    from llmlab.ggml.cpu.fast._common import fma as fast_fma
    from llmlab.ggml.cpu.simd import fma as ref_fma
    libm = ctypes.CDLL(ctypes.util.find_library("m"))
    libm.fmaf.restype, libm.fmaf.argtypes = ctypes.c_float, [ctypes.c_float] * 3
    a = np.float32(1 + 2 ** -12)
    cases = [(s * a, a, np.float32(c)) for s in (1, -1) for c in (2.0 ** -80, -2.0 ** -80, 2.0 ** -60, 0.0, 3.0)]
    A, B, C = (np.array(x, np.float32) for x in zip(*cases))
    want = np.array([libm.fmaf(*c) for c in cases], np.float32)

    @njit
    def run(A, B, C):
        out = np.empty_like(A)
        for i in range(A.size):
            out[i] = fast_fma(A[i], B[i], C[i])
        return out
    assert same_bits(ref_fma(A, B, C), want)
    assert same_bits(run(A, B, C), want)
    naive = (A.astype(np.float64) * B + C).astype(np.float32)
    assert not same_bits(naive, want)                        # the cases do catch double rounding


# ---- non-finite weights and activations: the same bits, or non-finite in the same places -------------

# where a block keeps its float16 scales: (block bytes, offsets of d and of m/dmin where the type has one)
SCALE_AT = {"q4_0": (18, (0,)), "q4_1": (20, (0, 2)), "q5_0": (22, (0,)), "q8_0": (34, (0,)),
            "q4_k": (144, (0, 2)), "q6_k": (210, (208,))}
F16 = {"nan": 0x7E00, "inf": 0x7C00, "-inf": 0xFC00}


def agree(a, b) -> bool:
    """Equal where finite (bit for bit) and of one kind where not: NaN, +inf or -inf alike."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    if a.shape != b.shape:
        return False
    fa, fb = np.isfinite(a), np.isfinite(b)
    same_kind = (np.isnan(a) == np.isnan(b)) & (np.isposinf(a) == np.isposinf(b)) & (np.isneginf(a) == np.isneginf(b))
    return bool(np.array_equal(fa, fb) and same_kind.all() and np.array_equal(a[fa].view(np.uint32), b[fb].view(np.uint32)))


def poisoned_acts(T, K, seed, value):
    x = acts(T, K, seed)
    x[0, 5] = value                              # one value in a block of row 0
    x[-1, K - 1] = value                         # and the last value of the last row
    return x


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_quantizers_on_non_finite_activations(value):
    T, K = 3, 512
    x = poisoned_acts(T, K, 5, value)
    a, (qs, d) = quantize_activations(x, "q8_0"), quantize_q8_0(x)
    assert np.array_equal(qs, a["qs"].reshape(T, K)) and agree(d, a["d"].astype(np.float32))
    a, (qs, d, s) = quantize_activations(x, "q8_1"), quantize_q8_1(x)
    assert np.array_equal(qs, a["qs"].reshape(T, K)) and agree(d, a["d"].astype(np.float32))
    assert agree(s, a["s"].astype(np.float32))
    a, (qs, d, bs) = quantize_activations(x, "q8_K"), quantize_q8_k(x)
    assert np.array_equal(qs, a["qs"].reshape(T, K)) and agree(d, a["d"])
    assert np.array_equal(bs, a["bsums"].reshape(T, -1))


@pytest.mark.parametrize("poison", ["weights", "activations"])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
@pytest.mark.parametrize("tname,K", [("q4_0", 256), ("q4_1", 256), ("q5_0", 256), ("q8_0", 256), ("q4_k", 512), ("q6_k", 512)])
def test_fast_and_reference_agree_on_non_finite_inputs(tname, K, value, poison):
    """A NaN or infinite float16 scale in one weight block (as a corrupt file can hold), or a NaN/inf
    activation: the fast path gives the reference's bits where they are finite and the same kind of
    non-finite value elsewhere, so a poisoned model is refused on both paths, never silently zero on one."""
    t = ggml_type(tname)
    raw = raw_rows(tname, 24, K).copy()
    if poison == "weights":
        size, offsets = SCALE_AT[tname]
        for o in offsets:                        # block 1 of row 3
            raw[3, size + o:size + o + 2] = np.frombuffer(np.uint16(F16[value]).tobytes(), np.uint8)
    for T in (1, 8, 9):
        x = acts(T, K, seed=20 + T) if poison == "weights" else poisoned_acts(T, K, 20 + T, float(value))
        for repacked in (False, True):
            fast_out = fast.mul_mat_quantized(raw, t, x, repacked)
            ref_out = ref_mul_mat_quantized(raw, t, x, repacked)
            assert agree(fast_out, ref_out), (tname, value, poison, T, repacked)
            assert not np.isfinite(ref_out).all() or poison == "activations", "the poison reaches the output"


@pytest.mark.skipif(not ISAS, reason="this host has neither AVX512-VNNI nor AVX2")
@pytest.mark.parametrize("tname", ["q4_0", "q4_1", "q5_0", "q8_0"])
def test_multi_weight_kernel_equals_one_weight_at_a_time(tname):
    """dot4.MULTI (several weights against one activation matrix, one region: the plan's K+V and
    gate+up) gives each weight the bits of its own product, for row counts that split the row groups
    of one weight across the threads' tasks, at 1 and 2 threads."""
    import numba
    K = 640
    Rs = (48, 40, 200)                                     # 40: a partial row group
    raws = [raw_rows(tname, R, K, seed=7 + i) for i, R in enumerate(Rs)]
    t = ggml_type(tname)
    n0 = numba.get_num_threads()
    try:
        for isa in ISAS:
            k = TWINS[tname, "vec_dot"].byte_dot[isa]
            packs = [k.pack(raw, tname, K) for raw in raws]
            multi = dot4.MULTI[isa]["legacy"]
            for T in (1, 3):
                x = acts(T, K, seed=T)
                refs = [vec_dot_mul_mat(raw, t, x) for raw in raws]
                for n in (1, 2):
                    numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
                    for limit in (0, 1):
                        outs = tuple(np.full((T, R), np.nan, np.float32) for R in Rs)
                        multi(*(tuple(p[j] for p in packs) for j in range(4)), x, outs, limit)
                        assert all(same_bits(o, r) for o, r in zip(outs, refs)), (isa, T, n, limit)
    finally:
        numba.set_num_threads(n0)
