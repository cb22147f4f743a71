"""The ARM profiles' fast kernels (``fast.neon``, ``fast.vec_f16``, the NEON activation quantizers) equal
the ARM reference kernels bit for bit, on this (x86 or ARM) host: the float order is data. Every layout
both models reach on arm_dotprod_fp16 and arm_i8mm, odd shapes, 1 and 2 threads."""
from __future__ import annotations

import numba
import numpy as np
import pytest

from llmlab.ggml.cpu import fast, profiles
from llmlab.ggml.cpu.fast import dot4, vec_f16
from llmlab.ggml.cpu.fast.quantize import quantize_q8_0_neon, quantize_q8_1_neon, quantize_q8_k_neon
from llmlab.ggml.cpu.fast.twins import FAMILIES
from llmlab.ggml.types import ggml_type

from kernel_data import acts, raw_rows, same_bits

# ---- the NumPy references ----------------------------------------------------------------------
from llmlab.ggml.cpu.ops import mul_mat_quantized as ref_mul_mat_quantized, quantized_path
from llmlab.ggml.cpu.quants import quantize_activations
from llmlab.ggml.cpu.sgemm import mul_mat_f16_op

ARM = {"neon": "arm_dotprod_fp16", "neon_i8mm": "arm_i8mm"}
TS = (1, 2, 3, 4, 7, 8, 9, 16, 17)


@pytest.fixture
def threads():
    """Run a block at n threads (at most numba's pool), restoring the count after."""
    n0 = numba.get_num_threads()
    yield lambda n: numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
    numba.set_num_threads(n0)


@pytest.mark.parametrize("T,K", [(1, 576), (3, 1024), (17, 640)])
def test_neon_quantizers(T, K):
    """q8_0 / q8_1 by 1/d with ties to even, q8_K with the fused product, as arch/arm/quants.c."""
    x = acts(T, K)
    cpu = profiles.get("arm_dotprod_fp16")
    a = quantize_activations(x, "q8_1", cpu)
    qs, d, s = quantize_q8_1_neon(x)
    assert np.array_equal(qs, a["qs"].reshape(T, K)) and same_bits(d, a["d"].astype(np.float32))
    assert same_bits(s, a["s"].astype(np.float32))
    qs0, d0 = quantize_q8_0_neon(x)
    a = quantize_activations(x, "q8_0", cpu)
    assert np.array_equal(qs0, a["qs"].reshape(T, K)) and same_bits(d0, a["d"].astype(np.float32))
    if K % 256 == 0:
        a = quantize_activations(x, "q8_K", cpu)
        qs, d, bs = quantize_q8_k_neon(x)
        assert np.array_equal(qs, a["qs"].reshape(T, K)) and same_bits(d, a["d"])
        assert np.array_equal(bs, a["bsums"].reshape(T, -1))


def _shapes(tname: str, path: str):
    if tname.endswith("_k"):
        return [(40, 512), (24, 768)]
    # odd block counts (the NEON tail), rows not a multiple of the 32-row groups; for i8mm's 2x2 chunking
    # rows whose chunks are odd (50: 13-row chunks) and even (34, 40)
    return [(40, 576), (50, 96), (36, 160)] if path == "repack" else [(40, 576), (50, 96), (34, 160)]


CASES = [(fam, t, path, R, K) for fam, table in FAMILIES.items() if fam in ARM for (t, path) in table
         for R, K in _shapes(t, path)]


def _cases(fam, tname, path, R, K, kernels):
    """(T, the packed weight, x, the ARM reference's product) for each activation count T: R random rows
    of K values packed by ``kernels``' packer."""
    cpu, tw = profiles.get(ARM[fam]), FAMILIES[fam][tname, path]
    raw = raw_rows(tname, R, K, seed=R + K)
    p = kernels.pack(raw, tname, K)
    for T in TS:
        x = acts(T, K, seed=T)
        yield T, p, x, tw.reference(raw, ggml_type(tname), x, cpu=cpu)


@pytest.mark.parametrize("fam,tname,path,R,K", CASES, ids=[f"{f}-{t}-{p}-{R}x{K}" for f, t, p, R, K in CASES])
def test_arm_twins(fam, tname, path, R, K, threads):
    """Every ARM twin equals its reference (vec_dot with the NEON tail and i8mm's 2x2 steps; the REPACK
    gemv rows and gemm groups of 4), threaded and serial, at 1 and 2 threads."""
    k = FAMILIES[fam][tname, path].generic
    for T, p, x, ref in _cases(fam, tname, path, R, K, k):
        for n in (1, 2):
            threads(n)
            for fn in (k.threaded, k.serial):
                if fn is not None:
                    assert same_bits(fn(*p, *k.quantize(x))[:, :R], ref), (fam, tname, path, R, K, T, n)


BYTE_DOT = [c for c in CASES if FAMILIES[c[0]][c[1], c[2]].byte_dot]


@pytest.mark.skipif(not dot4.host_isas(), reason="this host has neither AVX512-VNNI nor AVX2")
@pytest.mark.parametrize("isa", dot4.host_isas())
@pytest.mark.parametrize("fam,tname,path,R,K", BYTE_DOT, ids=[f"{f}-{t}-{p}-{R}x{K}" for f, t, p, R, K in BYTE_DOT])
def test_arm_byte_dot_kernels(fam, tname, path, R, K, isa, threads):
    """The ARM twins' byte-dot kernels (dot4_neon: x86 hosts) equal the ARM references, threaded and
    limited to one thread, at 1 and 2 threads."""
    k = FAMILIES[fam][tname, path].byte_dot[isa]
    for T, p, x, ref in _cases(fam, tname, path, R, K, k):
        for n in (1, 2):
            threads(n)
            for limit in (0, 1):
                out = np.full((T, R), np.nan, np.float32)
                k.threaded(*p, x, out, *k.extra, limit)
                assert same_bits(out, ref), (fam, tname, path, R, K, T, n, limit)


@pytest.mark.parametrize("cpu", list(ARM.values()))
@pytest.mark.parametrize("tname,K", [("q4_0", 96), ("q4_1", 160), ("q5_0", 96), ("q8_0", 96), ("q4_k", 512), ("q6_k", 512)])
def test_arm_dispatch_matches_reference(cpu, tname, K):
    """The fast set takes the profile's path (REPACK or vec_dot; a type the profile has no exact kernel
    for keeps the reference's float stand-in) and gives the reference's bits."""
    t = ggml_type(tname)
    raw = raw_rows(tname, 48, K)
    for T in (1, 2, 7, 8, 9):
        for repacked in (False, True):
            x = acts(T, K, seed=10 + T)
            assert same_bits(fast.mul_mat_quantized(raw, t, x, repacked, cpu),
                             ref_mul_mat_quantized(raw, t, x, repacked, cpu)), (cpu, tname, T, repacked)


def test_arm_paths_have_twins():
    """The paths the two models reach on the ARM profiles (q4_1, q5_0 vec_dot; q8_0, q4_K, q6_K REPACK)
    have a twin: none of them runs the NumPy reference in the fast set."""
    for fam, name in ARM.items():
        cpu = profiles.get(name)
        for tname, rows, repacked in (("q4_1", 1, False), ("q4_1", 64, False), ("q5_0", 1, False),
                                      ("q8_0", 1, True), ("q8_0", 64, True), ("q4_k", 1, True), ("q6_k", 9, True)):
            path = quantized_path(ggml_type(tname), rows, repacked, cpu)
            assert (tname, path) in FAMILIES[fam], (name, tname, path)


@pytest.mark.parametrize("cpu", list(ARM.values()))
@pytest.mark.parametrize("Hk,H,R,T,K", [(1, 3, 20, 1, 64), (3, 9, 33, 1, 64), (1, 4, 40, 9, 256),
                                        (2, 4, 12, 8, 40), (1, 2, 8, 16, 64), (1, 1, 7, 3, 100),
                                        (3, 9, 64, 1, 200)])
def test_half_accumulators(cpu, Hk, H, R, T, K, threads):
    """f16 products with float16 accumulators (vec_dot_f16 on FP16_VA, tinyBLAS's float16x8_t where it
    takes the shape), leftovers in double, at 1 and 2 threads; large values reach half's overflow."""
    c = profiles.get(cpu)
    rng = np.random.default_rng(Hk + R + T + K)
    A = (rng.standard_normal((Hk, R, K)) * rng.uniform(0.1, 30)).astype(np.float16)
    B = (rng.standard_normal((H, T, K)) * rng.uniform(0.1, 30)).astype(np.float32)
    B[0, 0, :8] = 300.0                                    # products past 65504: inf accumulators
    order = vec_f16.half_order(c, R, T, K)
    g = H // Hk
    with np.errstate(over="ignore", invalid="ignore"):
        ref = np.stack([mul_mat_f16_op(A[h // g], B[h].astype(np.float16), c) for h in range(H)])
    for n in (1, 2):
        threads(n)
        for f16h in dict.fromkeys((vec_f16.mul_mat_f16h, vec_f16.kernel(R))):   # the narrow block where it fits
            out = np.empty((H, T, R), np.float32)
            f16h(A.view(np.uint16), B, out, *order, 0)         # 0: no limit below the count threads(n) set
            assert same_bits(out, ref), (cpu, Hk, H, R, T, K, n, f16h.__name__)


@pytest.mark.parametrize("cpu", list(ARM.values()))
@pytest.mark.parametrize("Hk,H,KV,T,D", [(3, 9, 256, 1, 64), (1, 4, 70, 1, 256), (2, 4, 45, 2, 40),
                                         (1, 3, 33, 1, 100), (2, 2, 130, 1, 128)])
def test_half_accumulators_cache_rows(cpu, Hk, H, KV, T, D, threads):
    """A decode step's kq (``mul_mat_f16h_rows``) and fused kqv (``mul_mat_f16h_vt``) on the cache rows
    in place, skipping the products that are exact no-ops: unused cells (rows of +0 and of -0), zero
    probabilities; and not skipping them where an inf or a NaN makes them count (in a cache row, in the
    activations). The rows' classes are kept between calls and redone where ``written`` says a row
    changed. Bits of the reference, at 1 and 2 threads."""
    c = profiles.get(cpu)
    rng = np.random.default_rng(Hk + KV + T + D)
    live = KV * 2 // 3
    Kc = np.zeros((KV, Hk, D), np.float16)
    Vc = np.zeros((KV, Hk, D), np.float16)
    Kc[:live] = rng.standard_normal((live, Hk, D)) * 3
    Vc[:live] = rng.standard_normal((live, Hk, D))
    Kc[live - 1] = -0.0                                    # a row of -0: skipped like +0
    Vc[live - 2] = 0.0
    Kc[1, 0, 3] = np.inf                                   # specials in the rows: never skipped
    Vc[2, 0, 1], Vc[live + 1, Hk - 1, 0] = np.nan, np.inf  # (the inf in an unused cell, probability 0)
    q = (rng.standard_normal((H, T, D)) * 4).astype(np.float32)
    p = rng.random((H, T, KV)).astype(np.float32)
    p[:, :, live:] = 0
    p[0, 0, 3] = 0
    p[H - 1, 0, 5] = 1e-9                                  # rounds to 0 in f16
    if H > 2:
        q[2, 0, 7] = 1e6                                   # inf once rounded: zero rows count (NaN)

    def refs():
        with np.errstate(over="ignore", invalid="ignore"):
            kq = np.stack([mul_mat_f16_op(Kc[:, h // (H // Hk)], q[h].astype(np.float16), c) for h in range(H)])
            kqv = np.stack([mul_mat_f16_op(np.ascontiguousarray(Vc[:, h // (H // Hk)].T), p[h].astype(np.float16), c)
                            for h in range(H)])
        return kq, kqv

    for n in (1, 2):
        threads(n)
        wk, wv = np.ones(KV, np.uint8), np.ones(KV, np.uint8)
        ck = np.zeros((KV, Hk, 1), np.int32)
        cv = np.zeros((KV, Hk, D // vec_f16.vt_chunk(D)), np.int32)
        for step in range(3):
            if step == 1:                                  # a writer changes rows and flags them
                Kc[live + 2] = 1.5
                Vc[live + 2] = -2.0
                p[:, :, live + 2] = 0.25
                wk[live + 2] = wv[live + 2] = 1
            kq_ref, kqv_ref = refs()
            for always in (False, True):
                kq = np.empty((H, T, KV), np.float32)
                kqv = np.empty((H, T, D), np.float32)
                with np.errstate(over="ignore", invalid="ignore"):
                    vec_f16.mul_mat_f16h_rows(Kc.view(np.uint16), q, kq, *vec_f16.half_order(c, KV, T, D), wk, ck, always, 0)
                    vec_f16.mul_mat_f16h_vt(Vc.view(np.uint16), p, kqv, *vec_f16.half_order(c, D, T, KV), wv, cv, always, 0)
                assert same_bits(kq, kq_ref), (cpu, Hk, H, KV, T, D, n, step, always)
                assert same_bits(kqv, kqv_ref), (cpu, Hk, H, KV, T, D, n, step, always)
            assert not wk.any() and not wv.any()


def test_half_order_is_for_half_accumulators_only():
    for name in ("avx2", "avx512"):
        assert vec_f16.half_order(profiles.get(name), 64, 1, 64) is None
    assert vec_f16.half_order(profiles.get("arm_dotprod_fp16"), 64, 8, 64)[0] == 1      # tinyBLAS
    assert vec_f16.half_order(profiles.get("arm_i8mm"), 64, 8, 64)[0] == 4              # no tinyBLAS
