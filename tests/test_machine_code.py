"""What the hot loops compile to, read from the machine code (numba's inspect_asm): packed integer
multiply-adds and packed float fmas, not their scalar forms. A kernel edit that silently falls back to
scalar code (an index like ``i + j`` in an inner loop, a constant trip count) fails here, not only in
a benchmark.

Each kernel is compiled afresh (its Python function under a non-caching njit: a kernel loaded from
numba's cache has no assembly to show)."""
from __future__ import annotations

import platform
import re
from collections import Counter

import numpy as np
import pytest
from numba import njit

from llmlab.ggml.cpu.fast import dot4, q32, vec as fvec
from llmlab.ggml.cpu.fast._common import NOPYTHON

pytestmark = pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"),
                                reason="the instruction names are x86's")
OPTS = {k: v for k, v in NOPYTHON.items() if k != "cache"}


def instructions(fn, *args) -> Counter:
    """Mnemonic -> count over the whole function, each with its widest register class."""
    jit = njit(**OPTS, error_model=fn.targetoptions.get("error_model", "python"))(fn.py_func)
    jit(*args)
    c: Counter = Counter()
    for line in jit.inspect_asm(jit.signatures[0]).splitlines():
        m = re.match(r"\s+([a-z][a-z0-9]+)\s+(.*)", line)
        if m and not line.lstrip().startswith("."):
            reg = "zmm" if "zmm" in line else "ymm" if "ymm" in line else "xmm" if "xmm" in line else ""
            c[(m.group(1), reg)] += 1
    return c


def vector_count(c: Counter, pattern: str) -> int:
    return sum(n for (op, reg), n in c.items() if re.fullmatch(pattern, op) and reg in ("ymm", "zmm"))


@pytest.mark.parametrize("isa,op", [("vnni", r"vpdpbusd"), ("avx2", r"vpmaddubsw")])
def test_dot4_kernels_use_byte_dot_products(isa, op):
    if isa not in dot4.host_isas():
        pytest.skip(f"this host does not run {isa}")
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 256, (32, 2 * 20), dtype=np.uint8)
    p = dot4.pack(raw, "q4_1", 64)
    c = instructions(dot4.kernels("q4_1", isa)[1], *p, rng.standard_normal((1, 64)).astype(np.float32),
                     np.empty((1, 32), np.float32))
    assert vector_count(c, op) >= 8                     # the 8 lanes of a block, one instruction (pair) each
    assert vector_count(c, r"vfmadd\d+ps") >= 8         # and their float steps, 16 rows at a time


def test_generic_decode_kernel_multiplies_packed_int16():
    from llmlab.ggml.cpu.fast.quantize import quantize_q8_1
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 256, (32, 2 * 20), dtype=np.uint8)
    raw.view(np.uint16)[:, ::10] = 0x3C00
    p = q32.pack_q32(raw, "q4_1", 64)
    c = instructions(q32.mv_q4_1_serial, *p, *quantize_q8_1(rng.standard_normal((1, 64)).astype(np.float32)))
    assert vector_count(c, r"vpmullw") >= 32            # 32 codes per block, each across many rows
    assert vector_count(c, r"vpmovzxbw") >= 16          # bytes widened to int16, never to int64
    assert vector_count(c, r"vpmullq|vpmuludq") == 0


def test_softmax_and_swiglu_vectorize_exp():
    from llmlab.ggml.cpu import profiles
    v = fvec.params(profiles.get("avx512"))
    x = np.ones((2, 1, 64), np.float32)
    c = instructions(fvec.soft_max, x, np.zeros((0, 64), np.float32), np.float32(1), x.copy(), v.lanes, v.hsum_prog, v.expf)
    assert vector_count(c, r"vfmadd\d+ps") >= 4         # ggml_v_expf's polynomial, across the row
    g = np.ones((1, 64), np.float32)
    c = instructions(fvec.swiglu, g, g, g.copy(), v.expf)
    assert vector_count(c, r"vfmadd\d+ps") >= 4
    assert vector_count(c, r"vdivps") >= 1


HASWELL = ("+64bit,+avx,+avx2,+bmi,+bmi2,+cmov,+cx16,+f16c,+fma,+fxsr,+lzcnt,+mmx,+movbe,+popcnt,+sse,+sse2,"
           "+sse3,+sse4.1,+sse4.2,+ssse3,+xsave,-avx512f,-avx512bw,-avx512vl,-avx512dq,-avx512cd,-avx512vnni,"
           "-avx512bf16,-avx512vbmi")

_AVX2_ONLY = r"""
import numpy as np, sys
sys.path.insert(0, sys.argv[1])
from llmlab.ggml.cpu.fast import dot4
from test_fast_kernels import raw_rows, acts, same_bits, vec_dot_mul_mat, mul_mat_k_tiled, mul_mat_q4_k_repacked
from llmlab.ggml.types import ggml_type
assert dot4.ISA is None            # compiling for another CPU: dispatch takes the generic kernels
ok = True
for tname in ("q4_1", "q8_0"):
    raw = raw_rows(tname, 40, 576); p = dot4.pack(raw, tname, 576)
    for T in (1, 9):
        x = acts(T, 576, seed=T); out = np.empty((T, 40), np.float32)
        dot4.mul_mat_avx2_serial(*p, x, out)
        ok &= same_bits(out, vec_dot_mul_mat(raw, ggml_type(tname), x))
raw = raw_rows("q6_k", 40, 512); p = dot4.pack_q6_k(raw, "q6_k", 512)
for T in (1, 9):
    x = acts(T, 512, seed=T); out = np.empty((T, 40), np.float32)
    dot4.mul_mat_q6_k_avx2_serial(*p, x, out, T >= 8)
    ok &= same_bits(out, (mul_mat_k_tiled if T >= 8 else vec_dot_mul_mat)(raw, ggml_type("q6_k"), x))
asm = dot4.mul_mat_avx2_serial.inspect_asm(dot4.mul_mat_avx2_serial.signatures[0])
print("equal", ok, "zmm", "zmm" in asm, "pmaddubsw", asm.count("vpmaddubsw"))
"""


def test_dot4_avx2_kernels_compile_for_an_avx2_only_cpu(tmp_path):
    """Most laptops have AVX2 and no AVX-512: the AVX2 byte-dot kernels, compiled for such a CPU
    (haswell, AVX-512 off), must select no 512-bit instruction and still give the reference's bits.
    Checked in a child process with its own numba cache, on any x86 host that runs AVX2."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    if "avx2" not in dot4.host_isas():
        pytest.skip("this host does not run AVX2")
    env = dict(os.environ, NUMBA_CPU_NAME="haswell", NUMBA_CPU_FEATURES=HASWELL, NUMBA_CACHE_DIR=str(tmp_path))
    tests = str(Path(__file__).resolve().parent)
    res = subprocess.run([sys.executable, "-c", _AVX2_ONLY, tests], capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "equal True zmm False" in res.stdout, res.stdout
    assert "pmaddubsw 0" not in res.stdout
