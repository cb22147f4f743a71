"""CPU profiles: what one instruction set makes ggml-cpu compute, bit for bit.

llama.cpp compiles ggml-cpu for the machine it is built on (``GGML_NATIVE``), and the same C source
then adds its floats in different orders: an AVX-512 build keeps 16 float lanes per register, an AVX2
build 8, with other reduction trees, another ``expf`` polynomial, other tinyBLAS lanes, other
weights in the REPACK buffer. "Bit-identical to llama.cpp" therefore always means *on one CPU*.

A :class:`CPUProfile` is that difference as data. Each profile is one file in this package that
defines ``PROFILE``; the registry finds them, so a third one (scalar, NEON) is a new file. The
engine takes a profile explicitly (``Model(..., cpu=)``, ``Context(..., cpu=)``,
``CPUBackend(cpu=)``, ``executor.compute(..., cpu=)``); ``cpu`` may be a profile, its name, or ``"auto"``/``None``:

- ``LLMLAB_CPU=avx2|avx512`` when set;
- else the local llama.cpp build (``llama_cpp.llama_print_system_info()``: ``AVX512 = 1`` or not);
- else the CPU's own flags, among the profiles of this machine (``platform.machine()``: x86_64 or
  aarch64): /proc/cpuinfo on Linux, the ``hw.optional.arm.FEAT_*`` sysctls on macOS.

On a CPU no profile reproduces (x86 without AVX2, ARM without DOTPROD/FP16), the nearest profile of
its own architecture runs and llmlab says so once.
"""
from __future__ import annotations

import importlib
import pkgutil
import re
import sys
from dataclasses import dataclass, field
from functools import lru_cache

from .... import config
from ..simd import Tree


@dataclass(frozen=True)
class CPUProfile:
    """The arithmetic of one ggml-cpu build (one instruction set)."""

    name: str                          # "avx512", "avx2": what --cpu and LLMLAB_CPU take
    title: str                         # one line for humans
    requires: frozenset                # CPU flags (/proc/cpuinfo spelling) a machine needs to run this build
    system_info: dict                  # llama_print_system_info() keys that identify the build: {"AVX512": "1"}
    # vec.cpp / simd-mappings.h: GGML_F32_EPR lanes per register, GGML_F32_ARR registers per step
    f32_lanes: int
    f32_arr: int
    vec_reduce_tree: Tree              # GGML_F32_VEC_REDUCE's last step: one register's lanes to a scalar
    hsum_tree: Tree                    # a single register's horizontal sum (softmax's per-block sum)
    expf: str                          # which ggml_v_expf: "scalef" (AVX-512) or "bits" (AVX2, SSE2, NEON)
    # llamafile/sgemm.cpp: tinyBLAS for f16 x f16 (the KV cache with a batch)
    sgemm_lanes: int                   # KN: elements per fused multiply-add step (the register width)
    sgemm_hsum_tree: Tree              # hsum() of one accumulator register
    sgemm_min_batch: int               # "only enable sgemm for prompt processing": n >= 2
    sgemm_row_multiple: int            # tinyBLAS tiles need m % 4 == 0
    sgemm_tiles: tuple                 # (RM, RN) register tile (VECTOR_REGISTERS 32 or 16): speed only
    # arch/x86/quants.c: quantized vec_dot (both x86 builds run the AVX2 kernels: 8 lanes, 4 products each)
    quant_hsum_tree: Tree              # hsum_float_8
    # tiled/tiled.cpp: K-quant weights times a batch
    tiled_min_batch: int               # ggml_tiled_min_batch: from 8 activation rows
    tiled_types: frozenset
    # repack.cpp: ggml_repack_get_optimal_repack_type on this CPU (weights whose row count is a multiple)
    repack_types: frozenset
    repack_row_multiple: int
    notes: tuple = field(default=())   # what is special about this profile, for the notebooks
    # where the ARM builds differ (the defaults are the x86 builds')
    f16_lanes: int = 0                 # GGML_F16_EPR for ggml_vec_dot_f16 (0: f32_lanes)
    f16_arr: int = 0                   # GGML_F16_ARR (0: f32_arr)
    f16_acc: str = "f32"               # its accumulators: "f32" (F16C, plain NEON) or "f16" (FP16 vector arithmetic)
    f16_reduce_tree: Tree = None       # the lanes' sum after the registers fold (None: vec_reduce_tree)
    sgemm_acc: str = "f32"             # tinyBLAS f16 accumulators: "f32" or "f16" (float16x8_t with FP16_VA)
    rope_vec_pairs: int = 0            # rotate_pairs (NORM) auto-vectorized: pairs a step, x1*sin fused (0: scalar)
    rope_vec_min_pairs: int = 0        # below this many pairs the compiled loop stays scalar
    arch: str = "x86_64"               # the machine (platform.machine(), normalized) whose builds these are
    build: str = ""                    # GGML_CPU_ARM_ARCH of the llama.cpp build it is (the arm64 oracle's level)
    llamafile: bool = True             # GGML_USE_LLAMAFILE: tinyBLAS offered first (the i8mm ARM build turns it off)
    vec_dot_nrows: frozenset = frozenset()  # types whose vec_dot takes 2x2 outputs (.nrows = 2: MATMUL_INT8)
    quant_kernels: str = "x86"         # which arch/<isa>/quants.c (and activation quantizers): "x86" or "neon"
    repack_layouts: dict = field(default_factory=dict)  # repack.cpp: type -> layout ("q8_0_4x4"); rows % its column count

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"CPUProfile({self.name!r}: {self.title})"

    @property
    def f16_step(self) -> int:
        """GGML_F16_STEP: elements per iteration of ggml_vec_dot_f16 (ARR registers of EPR lanes)."""
        return (self.f16_lanes or self.f32_lanes) * (self.f16_arr or self.f32_arr)

    def repack_layout(self, type_name: str) -> str | None:
        """The REPACK layout of a type on this build ("q4_K_8x8": 8 interleaved rows of 8-byte groups)."""
        return self.repack_layouts.get(type_name) if type_name in self.repack_types else None

    def repacks(self, type_name: str, n_rows: int) -> bool:
        """Would llama.cpp's CPU_REPACK buffer take a weight of this type and row count?"""
        layout = self.repack_layout(type_name)
        cols = re.search(r"_(\d+)x\d+", layout) if layout else None          # "q4_K_8x4": 8 interleaved rows
        multiple = int(cols.group(1)) if cols else self.repack_row_multiple
        return type_name in self.repack_types and n_rows % multiple == 0

    def summary(self) -> dict:
        return {"name": self.name, "title": self.title, "f32_lanes": self.f32_lanes, "f16_step": self.f16_step,
                "f16_acc": self.f16_acc, "sgemm_lanes": self.sgemm_lanes, "expf": self.expf,
                "quant_kernels": self.quant_kernels, "repack_types": sorted(self.repack_types)}


def _load() -> dict[str, CPUProfile]:
    found = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_"):
            continue
        mod = importlib.import_module(f"{__name__}.{info.name}")
        prof = getattr(mod, "PROFILE", None)
        if isinstance(prof, CPUProfile):
            found[prof.name] = prof
    return found


PROFILES: dict[str, CPUProfile] = _load()
CHOICES = ("auto", *sorted(PROFILES))


def get(name: str) -> CPUProfile:
    try:
        return PROFILES[name.lower()]
    except KeyError:
        raise ValueError(f"unknown CPU profile {name!r} (known: {', '.join(sorted(PROFILES))}, or auto)") from None


def resolve(cpu: "CPUProfile | str | None" = None) -> CPUProfile:
    """A profile from a profile, a name, or ``None``/``"auto"`` (detected)."""
    if isinstance(cpu, CPUProfile):
        return cpu
    if cpu is None or cpu == "auto":
        return warn_if_unreproduced().profile
    return get(cpu)


@dataclass(frozen=True)
class Detection:
    profile: CPUProfile
    source: str            # "LLMLAB_CPU", "llama.cpp", "/proc/cpuinfo" or "default"
    reproduced: bool       # this machine's llama.cpp computes exactly what the profile does
    detail: str = ""


def llama_cpp_system_info() -> str | None:
    """The local llama.cpp build's system info ("AVX = 1 | AVX2 = 1 | ... | AVX512 = 0 | ..."), or None."""
    import importlib.util
    if importlib.util.find_spec("llama_cpp") is None:
        return None
    try:
        import llama_cpp
        info = llama_cpp.llama_print_system_info()
    except Exception:      # a broken install: fall back to the CPU flags
        return None
    return info.decode("utf-8", "replace") if isinstance(info, bytes) else str(info)


def parse_system_info(info: str) -> dict[str, str]:
    out = {}
    for part in info.replace("\n", "|").split("|"):
        k, sep, v = part.partition("=")
        if sep:
            out[k.strip().split(":")[-1].strip()] = v.strip()
    return out


_MACHINES = {"x86_64": "x86_64", "amd64": "x86_64", "x64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64",
             "armv8l": "aarch64", "armv8b": "aarch64"}


def machine(raw: str | None = None) -> str:
    """The machine as the profiles name it: "x86_64" or "aarch64" (``platform.machine()``: "AMD64" on
    Windows, "arm64" on macOS), else the lower-cased name itself."""
    import platform
    m = (platform.machine() if raw is None else raw).lower()
    return _MACHINES.get(m, m)


# macOS (Apple silicon) names its features in sysctl hw.optional.arm.FEAT_*; the profiles use Linux's
_DARWIN_FEATURES = {"FEAT_DotProd": "asimddp", "FEAT_FP16": "asimdhp", "FEAT_I8MM": "i8mm", "AdvSIMD": "asimd"}


def darwin_flags(sysctl: dict[str, str]) -> set[str]:
    """Linux-style flags from ``hw.optional.arm.*`` / ``hw.optional.*`` sysctl values ({name: "1"})."""
    flags = set()
    for key, value in sysctl.items():
        feat = key.rsplit(".", 1)[-1]
        if feat in _DARWIN_FEATURES and str(value).strip() == "1":
            flags.add(_DARWIN_FEATURES[feat])
    return flags


def _sysctl() -> dict[str, str]:
    import subprocess
    keys = ["hw.optional.arm.FEAT_DotProd", "hw.optional.arm.FEAT_FP16", "hw.optional.arm.FEAT_I8MM",
            "hw.optional.AdvSIMD"]
    out = {}
    for k in keys:
        try:
            res = subprocess.run(["sysctl", "-n", k], capture_output=True, text=True, timeout=5)
        except (OSError, subprocess.SubprocessError):
            continue
        if res.returncode == 0:
            out[k] = res.stdout.strip()
    return out


def cpu_flags() -> set[str]:
    """The CPU's features: /proc/cpuinfo's ``flags`` (x86) or ``Features`` (ARM) line; on macOS the
    hw.optional sysctls, in Linux's spelling."""
    if sys.platform == "darwin":
        return darwin_flags(_sysctl())
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _from_system_info(info: str) -> CPUProfile | None:
    keys = parse_system_info(info)
    best = None
    for prof in PROFILES.values():          # the most specific profile whose keys all match
        # ggml lists only the features it was built with: a missing key means "= 0"
        if all(keys.get(k, "0") == v for k, v in prof.system_info.items()):
            if best is None or len(prof.system_info) > len(best.system_info):
                best = prof
    return best


def _from_flags(flags: set[str], arch: str | None = None) -> CPUProfile | None:
    """The most specific profile of this machine (``arch``, default: this one) whose flags the CPU has.
    The machine comes first: under qemu-user an aarch64 process reads the x86 host's /proc/cpuinfo."""
    arch = machine() if arch is None else arch
    fits = [p for p in PROFILES.values() if p.arch == arch and p.requires <= flags]
    return max(fits, key=lambda p: len(p.requires)) if fits else None


def nearest(arch: str | None = None) -> CPUProfile:
    """The profile to emulate on a machine none reproduces: the plainest one of its own architecture
    (never an x86 profile on ARM), avx2 elsewhere."""
    arch = machine() if arch is None else arch
    own = [p for p in PROFILES.values() if p.arch == arch]
    if own:
        return min(own, key=lambda p: len(p.requires))
    return PROFILES["avx2"] if "avx2" in PROFILES else next(iter(PROFILES.values()))


@lru_cache(maxsize=1)
def detect() -> Detection:
    env = config.cpu()
    if env is not None:
        try:
            prof = get(env)
        except ValueError as e:
            raise ValueError(f"LLMLAB_CPU: {e}") from None
        return Detection(prof, "LLMLAB_CPU", _machine_runs(prof))
    info = llama_cpp_system_info()
    if info:
        prof = _from_system_info(info)
        if prof is not None:
            return Detection(prof, "llama.cpp", True, info.strip())
    flags = cpu_flags()
    prof = _from_flags(flags)
    if prof is not None:
        return Detection(prof, "/proc/cpuinfo", True)
    return Detection(nearest(), "default", False, "no profile reproduces this CPU")


def _machine_runs(prof: CPUProfile) -> bool:
    """Does this machine's llama.cpp (or, without one, its CPU) compute what ``prof`` does?"""
    info = llama_cpp_system_info()
    if info:
        return _from_system_info(info) is prof
    return _from_flags(cpu_flags()) is prof


_WARNED = set()


def warn_if_unreproduced(stream=None) -> Detection:
    """Say once, in one line, when llmlab's results will not be bit-identical to this machine's llama.cpp."""
    d = detect()
    if not d.reproduced and "warned" not in _WARNED:
        _WARNED.add("warned")
        why = (f"LLMLAB_CPU={d.profile.name}: emulating {d.profile.name}" if d.source == "LLMLAB_CPU" else
               f"this CPU is not one llmlab reproduces; emulating the nearest profile, {d.profile.name}")
        print(f"llmlab: {why} ({d.profile.title}), so results will not be bit-identical to this machine's "
              f"llama.cpp", file=stream or sys.stderr)
    return d


def bit_identical_here(cpu: "CPUProfile | str | None" = None) -> bool:
    """Is the profile ``cpu`` the arithmetic of this machine's llama.cpp?"""
    return _machine_runs(resolve(cpu))
