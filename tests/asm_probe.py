"""Compile the hot loops for one CPU and print their instruction counts as JSON (run by
test_machine_code.py in a child process, one per CPU model).

The CPU is numba's target: ``NUMBA_CPU_NAME`` (with ``NUMBA_CPU_FEATURES=+64bit``, so that LLVM takes
that model's own features and tuning, not the host's), or the host when unset. Each kernel is compiled
afresh under a non-caching njit (a cached kernel has no assembly to show) and never run: the machine
code of a CPU this host is not may hold instructions this host lacks.

Usage: python asm_probe.py ISA[,ISA...]   (the byte-dot instruction sets this CPU model has: vnni, avx2)
"""
from __future__ import annotations

import json
import re
import sys
from collections import Counter

import numba
import numpy as np
from numba import njit

from llmlab.ggml.cpu import profiles
from llmlab.ggml.cpu.fast import sgemm as fsgemm, vec as fvec
from llmlab.ggml.cpu.fast.twins import TWINS
from llmlab.ggml.cpu.fast._common import NOPYTHON

OPTS = {k: v for k, v in NOPYTHON.items() if k != "cache"}


def instructions(fn, *args) -> dict[str, int]:
    """'mnemonic register-class' -> count over the whole function (class: zmm, ymm, xmm or scalar)."""
    jit = njit(**OPTS, error_model=fn.targetoptions.get("error_model", "python"))(fn.py_func)
    jit.compile(tuple(numba.typeof(a) for a in args))
    c: Counter = Counter()
    for line in jit.inspect_asm(jit.signatures[0]).splitlines():
        m = re.match(r"\s+([a-z][a-z0-9]+)\s+(.*)", line)
        if m and not line.lstrip().startswith("."):
            reg = next((r for r in ("zmm", "ymm", "xmm") if r in line), "scalar")
            c[f"{m.group(1)} {reg}"] += 1
    return dict(c)


def outputs_of(fn, *args) -> tuple:
    """Arrays of the types a jitted ``fn`` returns for ``args``, made without running it: its machine code
    for this CPU model may not run on this host (an AVX-512 target on an AVX2 machine dies with SIGILL)."""
    fn.compile(tuple(numba.typeof(a) for a in args))
    ret = fn.overloads[fn.signatures[-1]].signature.return_type
    kinds = ret.types if isinstance(ret, numba.types.BaseTuple) else (ret,)
    return tuple(np.zeros((1,) * t.ndim, numba.np.numpy_support.as_dtype(t.dtype)) for t in kinds)


def main(isas: list[str]) -> dict:
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 256, (32, 2 * 20), dtype=np.uint8)
    raw.view(np.uint16)[:, ::10] = 0x3C00
    x = rng.standard_normal((1, 64)).astype(np.float32)
    out: dict[str, dict[str, int]] = {}
    q41 = TWINS["q4_1", "vec_dot"]
    k = q41.generic
    out["generic_decode_q4_1"] = instructions(k.serial, *k.pack(raw, "q4_1", 64), *outputs_of(k.quantize, x))
    v = fvec.params(profiles.get("avx512"))
    s = np.ones((2, 1, 64), np.float32)
    out["soft_max"] = instructions(fvec.soft_max, s, np.zeros((0, 64), np.float32), np.float32(1), s.copy(),
                                   v.lanes, v.hsum_prog, v.expf)
    g = np.ones((1, 64), np.float32)
    out["swiglu"] = instructions(fvec.swiglu, g, g, g.copy(), v.expf)
    H, R, D = 2, 64, 32                         # a decode step's fused attention (one kv head)
    K, V, TW = np.zeros((1, R, D), np.uint16), np.zeros((R, 1, D), np.uint16), fvec.TW
    out["attention"] = instructions(
        fvec.attention_f16_tiles, K, np.zeros((H, 1, D), np.float32), np.zeros((1, R), np.float32), np.float32(1), V,
        np.zeros((H, 1, D), np.float32), v.arr, v.lanes, v.vec_prog, v.hsum_prog, v.expf, True, np.ones(R, np.uint8),
        np.ones(R, np.uint8), np.zeros((1, R // TW, D, TW), np.uint16), np.zeros((1, D // TW, R, TW), np.uint16),
        np.zeros((2, R), np.uint8), np.zeros((H, 1, R), np.float32), np.zeros((H, 1, R), np.float32), 1)
    A, B = np.zeros((1, 8, 64), np.uint16), np.zeros((2, 4, 64), np.float32)    # a prompt's kq (tinyBLAS)
    out["sgemm_f16"] = instructions(fsgemm.mul_mat_f16, A, B, np.zeros((2, 4, 8), np.float32), 16, 1)
    for isa in isas:
        k = q41.byte_dot[isa]
        out[f"dot4_{isa}_q4_1"] = instructions(k.threaded, *k.pack(raw, "q4_1", 64), x, np.empty((1, 32), np.float32), 1)
    return {"cpu": numba.config.CPU_NAME or "host", "kernels": out}


if __name__ == "__main__":
    print(json.dumps(main([i for i in sys.argv[1].split(",") if i] if len(sys.argv) > 1 else [])))
