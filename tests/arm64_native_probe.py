"""Run inside the arm64 Debian root by test_arm64_native.py (through run_in_root.sh): what llmlab sees
and does on that machine, printed as one JSON object on the last line of stdout.

Usage: python arm64_native_probe.py detect
       python arm64_native_probe.py generate ARG...   (``python -m llmlab generate``'s arguments, with --json)

``detect``: the machine, the CPU features read, the profile ``--cpu auto`` takes and why, and the byte-dot
instruction sets (dot4: x86 only) this host offers. ``generate``: runs the CLI in this process, then adds
to its JSON which numba kernels of llmlab hold machine code (compiled now or loaded from the cache: the
kernels it ran), and the numba cache's loads and compilations.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import platform
import sys
import time


def detect() -> dict:
    from llmlab.ggml.cpu import profiles
    from llmlab.ggml.cpu.fast import dot4
    d = profiles.detect()
    return {"machine": platform.machine(), "profile": d.profile.name, "profile_arch": d.profile.arch,
            "source": d.source, "reproduced": d.reproduced, "flags": sorted(profiles.cpu_flags()),
            "dot4_isas": list(dot4.host_isas()), "dot4": dot4.ISA}


def generate(args: list[str]) -> dict:
    from llmlab import warm
    from llmlab.cli import main
    buf = io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(buf):
        rc = main(["generate", *args])
    seconds = time.perf_counter() - t0
    lines = buf.getvalue().strip().splitlines()
    out = json.loads(lines[-1]) if rc == 0 and lines else {}
    kernels = sorted(f"{d.py_func.__module__}.{d.py_func.__qualname__}" for d in warm._dispatchers() if d.signatures)
    loaded, compiled = warm.cache_counts()
    # CPU seconds of this process (qemu's, all threads): unlike the wall clock, not stretched by a busy host
    cpu_s = sum(os.times()[:2])
    return {"rc": rc, **out, "seconds": round(seconds, 1), "cpu_s": round(cpu_s, 1), "kernels": kernels, "numba_loaded": loaded,
            "numba_compiled": compiled, **detect()}


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in ("detect", "generate"):
        print("error: usage: arm64_native_probe.py detect | generate ARG...", file=sys.stderr)
        sys.exit(2)
    result = detect() if sys.argv[1] == "detect" else generate(sys.argv[2:])
    print(json.dumps(result))
