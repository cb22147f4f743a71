"""The llama.cpp oracle's build flags for this CPU, run by `make test`'s set-up (setup-dev), never by `make demo`.

llama-cpp-python builds llama.cpp natively (GGML_NATIVE). That is what llmlab reproduces, except on a CPU
with Intel AMX (Sapphire Rapids and later): the native build then sends q4_1 and q8_0 weights through
ggml's AMX buffer type, whose arithmetic no llmlab profile computes, and which died with SIGILL in a KVM
guest (README, "Intel AMX"). There the oracle is built with the native build's AVX-512 family and without
AMX: llmlab's avx512 profile. The wheel is built without pip's cache (which keys on the version only and
would hand back the native AMX build whatever CMAKE_ARGS say) into a folder named after the flags, reused
by every checkout, and installed over a llama-cpp-python that uses AMX.

Usage: python tools/oracle_build.py [--dry-run] [--flags "avx2 fma ..."]   (prints what it does; "native"
when the ordinary build serves, and then the ordinary `pip install` builds it as always)
"""
from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
AMX = ("amx_tile", "amx_int8", "amx_bf16")
# the AVX-512 family a native build would switch on, CMake option <- the CPU flag (Linux's spelling)
AVX512 = {"GGML_AVX512": "avx512f", "GGML_AVX512_VBMI": "avx512vbmi", "GGML_AVX512_VNNI": "avx512_vnni",
          "GGML_AVX512_BF16": "avx512_bf16", "GGML_AVX_VNNI": "avx_vnni"}


def pinned_version() -> str:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]
    return next(d.split("==", 1)[1] for d in deps if d.startswith("llama-cpp-python=="))


def cmake_args(flags: set[str]) -> str | None:
    """The CMake flags of an AMX-free build of this CPU's native instruction sets; None without AMX."""
    if not any(f in flags for f in AMX):
        return None
    args = ["-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON", "-DGGML_BMI2=ON"]
    args += [f"-D{opt}={'ON' if flag in flags else 'OFF'}" for opt, flag in AVX512.items()]
    args += ["-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"]
    return " ".join(args)


def wheel_dir(version: str, args: str) -> Path:
    key = hashlib.sha256(f"{version} {args}".encode()).hexdigest()[:12]
    return Path.home() / ".cache" / "llmlab" / "wheels-oracle" / f"{version}-{key}"


def installed_info(py: str) -> str | None:
    """The system_info of the llama.cpp installed for ``py``, or None."""
    code = "import llama_cpp; print(llama_cpp.llama_print_system_info().decode())"
    r = subprocess.run([py, "-c", code], capture_output=True, text=True, timeout=300)
    return r.stdout.strip() if r.returncode == 0 else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="say what would be built and installed, do nothing")
    ap.add_argument("--flags", help="CPU flags to plan for instead of this CPU's (Linux spelling, space-separated)")
    ap.add_argument("--python", default=sys.executable, help="the interpreter whose environment gets the oracle")
    a = ap.parse_args()
    if a.flags is not None:
        flags = set(a.flags.split())
    else:
        sys.path.insert(0, str(ROOT))
        from llmlab.ggml.cpu import profiles
        flags = profiles.cpu_flags()
    args = cmake_args(flags)
    if args is None:
        print("oracle: native (no AMX on this CPU)")
        return 0
    version = pinned_version()
    where = wheel_dir(version, args)
    print(f"oracle: this CPU has AMX; llama-cpp-python {version} built with CMAKE_ARGS={args!r}, kept in {where}")
    if a.dry_run:
        return 0
    wheels = sorted(where.glob("llama_cpp_python-*.whl"))
    if not wheels:
        print("oracle: building it (about 10 minutes on 2 cores)")
        env = {**os.environ, "CMAKE_ARGS": args, "CMAKE_BUILD_PARALLEL_LEVEL": os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", "2")}
        subprocess.run([a.python, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "--no-cache-dir", "--no-deps",
                        "-w", str(where), f"llama-cpp-python=={version}"], env=env, check=True)
        wheels = sorted(where.glob("llama_cpp_python-*.whl"))
    info = installed_info(a.python)
    if info is None or "AMX_INT8 = 1" in info or "AVX512 = 1" not in info:
        subprocess.run([a.python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                        "--force-reinstall", str(wheels[-1])], check=True)
        info = installed_info(a.python)
    if info is None or "AMX_INT8 = 1" in info:
        print(f"oracle: the installed llama.cpp still uses AMX or does not load: {info}", file=sys.stderr)
        return 1
    print(f"oracle: {info}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
