"""What the hot loops compile to, read from the machine code (numba's inspect_asm): packed integer
multiply-adds and packed float fmas, not their scalar forms. A kernel edit that silently falls back to
scalar code (an index like ``i + j`` in an inner loop, a constant trip count) fails here, not only in
a benchmark.

LLVM chooses instructions per CPU model: for the generic decode kernel it takes 256-bit int16
multiplies on znver4 and 128-bit ones on icelake-server, haswell or znver3 (same bits either way). So
the tests assert the property that matters (packed vectors of any width, nothing widened to 64-bit
lanes), and they compile for several named CPUs, each in a child process (``asm_probe.py``), besides
this host. Nothing compiled for another CPU is run here."""
from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

import pytest

from llmlab.ggml.cpu.fast import dot4

pytestmark = pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"),
                                reason="the instruction names are x86's")
TESTS = Path(__file__).resolve().parent
# CPU model -> the byte-dot instruction sets it has (vnni: AVX512-VNNI with AVX512BW); "host": this machine
CPUS = {"haswell": ("avx2",), "skylake-avx512": ("avx2",), "icelake-server": ("vnni", "avx2"),
        "znver3": ("avx2",), "znver4": ("vnni", "avx2"), "host": dot4.host_isas()}
VECTOR = ("xmm", "ymm", "zmm")


@pytest.fixture(scope="module")
def probes(tmp_path_factory) -> dict[str, dict]:
    """Every CPU's instruction counts, the children run side by side."""
    procs = {}
    for cpu, isas in CPUS.items():
        env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path_factory.mktemp(cpu)))
        for k in ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES"):
            env.pop(k, None)
        if cpu != "host":
            env.update(NUMBA_CPU_NAME=cpu, NUMBA_CPU_FEATURES="+64bit")
        procs[cpu] = subprocess.Popen([sys.executable, str(TESTS / "asm_probe.py"), ",".join(isas)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    got = {}
    for cpu, p in procs.items():
        out, err = p.communicate(timeout=900)
        assert p.returncode == 0, f"{cpu}: {err[-2000:]}"
        got[cpu] = json.loads(out.strip().splitlines()[-1])["kernels"]
    return got


def count(c: dict[str, int], pattern: str, regs=VECTOR) -> int:
    """How many instructions match ``pattern`` with a register of one of the classes ``regs``."""
    return sum(n for key, n in c.items() if re.fullmatch(pattern, key.split()[0]) and key.split()[1] in regs)


@pytest.mark.parametrize("cpu", CPUS)
def test_generic_decode_kernel_multiplies_packed_int16(probes, cpu):
    c = probes[cpu]["generic_decode_q4_1"]
    # 32 codes per block, each across many rows: packed 16/32-bit integer multiplies of any width
    assert count(c, r"vpmullw|vpmulld|vpmaddwd|vpmaddubsw") >= 32, c
    assert count(c, r"vpmovzxbw") >= 16, c              # bytes widened to int16 ...
    assert count(c, r"vpmullq|vpmuludq|vpmuldq|vpmov[sz]x[bwd]q") == 0, c   # ... never to 64-bit lanes


@pytest.mark.parametrize("cpu", CPUS)
def test_softmax_and_swiglu_vectorize_exp(probes, cpu):
    assert count(probes[cpu]["soft_max"], r"vfmadd\d+ps") >= 4      # ggml_v_expf's polynomial, across the row
    c = probes[cpu]["swiglu"]
    assert count(c, r"vfmadd\d+ps") >= 4
    assert count(c, r"vdivps") >= 1


@pytest.mark.parametrize("cpu", CPUS)
def test_fused_attention_vectorizes_exp(probes, cpu):
    """The fused decode attention (softmax between its two products) keeps the softmax's exp loop vector
    code: ggml_v_expf's n = round(x / ln 2) converted to int32 lanes (packed, 256 or 512 bits), and the
    products' packed fmas."""
    c = probes[cpu]["attention"]
    assert count(c, r"vcvttps2dq", ("ymm", "zmm")) >= 1, c
    assert count(c, r"vfmadd\d+ps", ("ymm", "zmm")) >= 8, c


@pytest.mark.parametrize("cpu", CPUS)
def test_tinyblas_twin_is_packed_fma(probes, cpu):
    """fast.sgemm's tiles: the f16 weights widened a register at a time (vcvtph2ps) and one packed fma
    per output a step: 16 for the 4x4 tile of 16 lanes, 8 for the 2x4 tile of 8 (or twice as many
    256-bit ones where LLVM splits 512-bit vectors), and no scalar fma."""
    c = probes[cpu]["sgemm_f16"]
    assert count(c, r"vcvtph2ps", ("ymm", "zmm")) >= 6, c
    assert count(c, r"vfmadd\d+ps", ("ymm", "zmm")) >= 24, c
    assert count(c, r"vfmadd\d+ss", ("xmm", "scalar")) == 0, c


@pytest.mark.parametrize("cpu,isa", [(c, i) for c, isas in CPUS.items() for i in isas])
def test_dot4_kernels_use_byte_dot_products(probes, cpu, isa):
    c = probes[cpu][f"dot4_{isa}_q4_1"]
    op = {"vnni": r"vpdpbusd", "avx2": r"vpmaddubsw"}[isa]
    assert count(c, op, ("ymm", "zmm")) >= 8, c         # the 8 lanes of a block, one instruction (pair) each
    assert count(c, r"vfmadd\d+ps") >= 8, c            # and their float steps, 16 rows at a time


HASWELL = ("+64bit,+avx,+avx2,+bmi,+bmi2,+cmov,+cx16,+f16c,+fma,+fxsr,+lzcnt,+mmx,+movbe,+popcnt,+sse,+sse2,"
           "+sse3,+sse4.1,+sse4.2,+ssse3,+xsave,-avx512f,-avx512bw,-avx512vl,-avx512dq,-avx512cd,-avx512vnni,"
           "-avx512bf16,-avx512vbmi")

_AVX2_ONLY = r"""
import numpy as np, sys
sys.path.insert(0, sys.argv[1])
from llmlab.ggml.cpu.fast import dot4
from test_fast_kernels import raw_rows, acts, same_bits
from llmlab.ggml.cpu.fast.twins import TWINS
from llmlab.ggml.types import ggml_type
assert dot4.ISA is None            # compiling for another CPU: dispatch takes the generic kernels
ok = True
for tname, path, K, Ts in (("q4_1", "vec_dot", 576, (1, 9)), ("q8_0", "vec_dot", 576, (1, 9)),
                           ("q6_k", "vec_dot", 512, (1,)), ("q6_k", "tiled", 512, (9,))):
    tw = TWINS[tname, path]; k = tw.byte_dot["avx2"]
    raw = raw_rows(tname, 40, K); p = k.pack(raw, tname, K)
    for T in Ts:
        x = acts(T, K, seed=T); out = np.empty((T, 40), np.float32)
        k.threaded(*p, x, out, *k.extra, 1)
        ok &= same_bits(out, tw.reference(raw, ggml_type(tname), x))
from asm_probe import instructions     # the kernel's body compiled serially: its loops in one listing
k = TWINS["q4_1", "vec_dot"].byte_dot["avx2"]
raw = raw_rows("q4_1", 40, 576); x = acts(1, 576, seed=1)
c = instructions(k.threaded, *k.pack(raw, "q4_1", 576), x, np.empty((1, 40), np.float32), 1)
print("equal", ok, "zmm", any(key.endswith(" zmm") for key in c),
      "pmaddubsw", sum(n for key, n in c.items() if key.startswith("vpmaddubsw")))
"""


def test_dot4_avx2_kernels_compile_for_an_avx2_only_cpu(tmp_path):
    """Most laptops have AVX2 and no AVX-512: the AVX2 byte-dot kernels, compiled for such a CPU
    (haswell, AVX-512 off), must select no 512-bit instruction and still give the reference's bits.
    Checked in a child process with its own numba cache, on any x86 host that runs AVX2."""
    if "avx2" not in dot4.host_isas():
        pytest.skip("this host does not run AVX2")
    env = dict(os.environ, NUMBA_CPU_NAME="haswell", NUMBA_CPU_FEATURES=HASWELL, NUMBA_CACHE_DIR=str(tmp_path))
    res = subprocess.run([sys.executable, "-c", _AVX2_ONLY, str(TESTS)], capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "equal True zmm False" in res.stdout, res.stdout
    assert "pmaddubsw 0" not in res.stdout
