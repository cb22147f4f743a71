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
  aarch64): /proc/cpuinfo on Linux, the sysctls on macOS, CPUID (LLVM's host features) checked with
  ``IsProcessorFeaturePresent`` on Windows (:func:`cpu_features`, the one place features are read).

On a CPU no profile reproduces (x86 without AVX2, ARM without DOTPROD/FP16), the nearest profile of
its own architecture runs and llmlab says so once.
"""
from __future__ import annotations

import importlib
import os
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
    # ggml_vec_dot_f32's leftover loop (``sumf += x[i]*y[i]``, n % GGML_F32_STEP elements) as GCC vectorizes it
    # in order: products in vectors of these widths (each rounded), added one by one; what is left is fused
    # (vfmadd231ss). () : all fused
    f32_tail_vectors: tuple = ()
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
    source: str            # "LLMLAB_CPU", "llama.cpp", where the CPU's features came from (CPUFeatures.source) or "default"
    reproduced: bool       # this machine's llama.cpp computes exactly what the profile does
    detail: str = ""


def llama_cpp_system_info() -> str | None:
    """The local llama.cpp build's system info ("AVX = 1 | AVX2 = 1 | ... | AVX512 = 0 | ..."), or None.
    Read from its library alone where it loads (``_library_system_info``), else through the package."""
    import importlib.util
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None:
        return None
    info = _library_system_info(tuple(spec.submodule_search_locations or ()))
    if info is None:
        try:
            import llama_cpp
            info = llama_cpp.llama_print_system_info()
        except Exception:      # a broken install: fall back to the CPU flags
            return None
    return info.decode("utf-8", "replace") if isinstance(info, bytes) else str(info)


_LIB_NAMES = {"linux": ("libllama.so",), "darwin": ("libllama.so", "libllama.dylib"),
              "win32": ("llama.dll", "libllama.dll")}      # as llama_cpp's load_shared_library names them


@lru_cache(maxsize=4)
def _library_system_info(package_dirs: tuple[str, ...]) -> bytes | None:
    """``llama_print_system_info()`` from the package's ``lib/`` folder through ctypes, without importing
    ``llama_cpp`` (its chat formats pull in jinja2, diskcache and sqlite3: 6 MB of this process's memory and
    0.13 s, in a process that only wants these flags). None where the library is not found or not loaded."""
    import ctypes
    names = _LIB_NAMES.get("linux" if sys.platform.startswith(("linux", "freebsd")) else sys.platform, ())
    for folder in package_dirs:
        lib_dir = os.path.join(folder, "lib")
        for name in names:
            path = os.path.join(lib_dir, name)
            if not os.path.isfile(path):
                continue
            try:
                if sys.platform == "win32":      # its ggml DLLs sit beside it
                    with os.add_dll_directory(lib_dir):
                        lib = ctypes.CDLL(path)
                else:
                    lib = ctypes.CDLL(path)
                fn = lib.llama_print_system_info
                fn.restype, fn.argtypes = ctypes.c_char_p, []
                return fn()
            except (OSError, AttributeError):
                return None
    return None


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


# ---------------------------------------------------------------- the CPU's features: read here and only here
# (doctor, nb.setup, bench and the kernels' instruction-set choice read them from this module)

@dataclass(frozen=True)
class CPUFeatures:
    """What the CPU offers, in Linux's /proc/cpuinfo spelling whatever the OS, and where that was read."""
    flags: frozenset       # "avx2", "avx512_vnni", "asimddp", ...
    source: str            # "/proc/cpuinfo", "sysctl" (macOS), "cpuid" (LLVM's host features),
                           # "cpuid+IsProcessorFeaturePresent" (Windows) or "none"
    model: str = ""        # the CPU's name ("AMD EPYC 7B13"), "" when the OS does not say
    detail: str = ""       # why a reader was passed over ("/proc/cpuinfo: is a FIFO")


MAX_CPUINFO = 8 << 20      # bytes of /proc/cpuinfo read at most (a 512-CPU machine writes about 1 MiB)

# macOS names its features in sysctls: hw.optional.arm.FEAT_* (Apple silicon), machdep.cpu.features (Intel)
_DARWIN_FEATURES = {"FEAT_DotProd": "asimddp", "FEAT_FP16": "asimdhp", "FEAT_I8MM": "i8mm", "AdvSIMD": "asimd",
                    "FEAT_BF16": "bf16", "FEAT_SME": "sme"}
_DARWIN_X86 = {"avx1.0": "avx", "sse3": "pni", "sse4.1": "sse4_1", "sse4.2": "sse4_2", "avx512vnni": "avx512_vnni",
               "avx512bf16": "avx512_bf16", "avx512fp16": "avx512_fp16", "avxvnni": "avx_vnni", "amx_int8": "amx_int8"}
# LLVM's names of the host CPU's features (llvmlite.binding.get_host_cpu_features) in Linux's spelling
_LLVM_FEATURES = {"sse3": "pni", "sse4.1": "sse4_1", "sse4.2": "sse4_2", "avx512vnni": "avx512_vnni",
                  "avx512bf16": "avx512_bf16", "avx512fp16": "avx512_fp16", "avxvnni": "avx_vnni",
                  "amx-int8": "amx_int8", "amx-tile": "amx_tile", "amx-bf16": "amx_bf16",
                  "neon": "asimd", "dotprod": "asimddp", "fullfp16": "asimdhp", "i8mm": "i8mm", "sve": "sve"}
# IsProcessorFeaturePresent (winnt.h PF_*): what Windows says its threads may use (the OS saves those registers)
_WINDOWS_PF = {"avx": 39, "avx2": 40, "avx512f": 41}


def darwin_flags(sysctl: dict[str, str]) -> set[str]:
    """Linux-style flags from macOS sysctl values: ``hw.optional.arm.*`` / ``hw.optional.*`` ({name: "1"}),
    and Intel Macs' ``machdep.cpu.features`` / ``machdep.cpu.leaf7_features`` (space-separated names)."""
    flags = set()
    for key, value in sysctl.items():
        if key.startswith("machdep.cpu."):
            for f in str(value).lower().split():
                flags.add(_DARWIN_X86.get(f, f))
            continue
        feat = key.rsplit(".", 1)[-1]
        if feat in _DARWIN_FEATURES and str(value).strip() == "1":
            flags.add(_DARWIN_FEATURES[feat])
    return flags


def _sysctl() -> dict[str, str]:
    import subprocess
    keys = ["hw.optional.arm.FEAT_DotProd", "hw.optional.arm.FEAT_FP16", "hw.optional.arm.FEAT_I8MM",
            "hw.optional.arm.FEAT_BF16", "hw.optional.arm.FEAT_SME", "hw.optional.AdvSIMD",
            "machdep.cpu.features", "machdep.cpu.leaf7_features", "machdep.cpu.brand_string"]
    out = {}
    for k in keys:
        try:
            res = subprocess.run(["sysctl", "-n", k], capture_output=True, text=True, timeout=5,
                                 stdin=subprocess.DEVNULL)
        except (OSError, subprocess.SubprocessError):
            continue
        if res.returncode == 0:
            out[k] = res.stdout.strip()
    return out


def read_cpuinfo(path=None, max_bytes: int = MAX_CPUINFO) -> tuple[str, str]:
    """The text of /proc/cpuinfo (``path``: default ``config.cpuinfo()``) and "" or why it was not read.
    Never blocks and never fails: only a regular file is read (``safeio.open_regular``: a FIFO or a device
    is refused at once), at most ``max_bytes``; bytes that are not UTF-8 are dropped (a damaged or hostile
    file gives fewer flags, not a traceback)."""
    from .... import LLMLabError
    from ....safeio import open_regular
    path = config.cpuinfo() if path is None else path
    try:
        with open_regular(path) as fh:
            data = fh.read(max_bytes)
    except LLMLabError as e:
        return "", str(e)
    except OSError as e:
        return "", f"{path}: {e.strerror or e}"
    return data.decode("utf-8", "ignore"), ""


def parse_cpuinfo(text: str) -> tuple[set[str], str]:
    """(flags, model) from /proc/cpuinfo's text: the first ``flags`` (x86) or ``Features`` (ARM) line and
    the first ``model name``; lines that are not ``key : value`` are skipped."""
    flags, model = None, ""
    for line in text.splitlines():
        key, sep, val = line.partition(":")
        if not sep:
            continue
        key = key.strip()
        if flags is None and key in ("flags", "Features"):
            flags = {f for f in val.split() if f.isascii() and f.isprintable()}
        elif not model and key == "model name":
            model = val.strip()
        if flags is not None and model:
            break
    flags = flags or set()
    if "pni" in flags:
        flags.add("sse3")              # Linux calls SSE3 "pni" (Prescott New Instructions)
    return flags, model


def llvm_flags() -> set[str]:
    """The host CPU's features as LLVM reads them (CPUID and XGETBV on x86, so only what the OS enables),
    in Linux's spelling; empty where llvmlite cannot say. The same on every OS."""
    try:
        import llvmlite.binding as ll
        feats = ll.get_host_cpu_features()
    except Exception:              # noqa: BLE001 - no feature list: no flags
        return set()
    flags = {_LLVM_FEATURES.get(k, k) for k, on in feats.items() if on}
    if "pni" in flags:
        flags.add("sse3")
    return flags


def windows_flags(present=None) -> tuple[set[str], str]:
    """Windows: LLVM's CPUID flags, less AVX-512 (and AMX) where IsProcessorFeaturePresent says the OS does
    not let threads use it; and the CPU's name."""
    flags = llvm_flags()
    if present is None:
        try:
            import ctypes
            k32 = ctypes.WinDLL("kernel32")
            present = lambda pf: bool(k32.IsProcessorFeaturePresent(pf))     # noqa: E731
        except (OSError, AttributeError):
            present = None
    # Windows before 10 2004 knows no PF_AVX* and answers "no" to all three: only a "no" to AVX-512 from an OS
    # that says "yes" to AVX2 is believed (LLVM's XGETBV already checks which registers the OS saves)
    if present is not None and present(_WINDOWS_PF["avx2"]) and not present(_WINDOWS_PF["avx512f"]):
        flags = {f for f in flags if not f.startswith(("avx512", "amx"))}
    import platform
    return flags, platform.processor() or ""


@lru_cache(maxsize=1)
def cpu_features() -> CPUFeatures:
    """The CPU's features, read once per process: /proc/cpuinfo on Linux (LLVM's CPUID where it is missing,
    unreadable or has no flags line), the sysctls on macOS, CPUID and IsProcessorFeaturePresent on Windows."""
    if sys.platform == "darwin":
        ctl = _sysctl()
        return CPUFeatures(frozenset(darwin_flags(ctl)), "sysctl", ctl.get("machdep.cpu.brand_string", ""))
    if sys.platform == "win32":
        flags, model = windows_flags()
        return CPUFeatures(frozenset(flags), "cpuid+IsProcessorFeaturePresent" if flags else "none", model)
    text, why = read_cpuinfo()
    flags, model = parse_cpuinfo(text)
    if flags:
        return CPUFeatures(frozenset(flags), "/proc/cpuinfo", model)
    why = why or f"{config.cpuinfo()}: no flags line"
    flags = llvm_flags()
    return CPUFeatures(frozenset(flags), "cpuid" if flags else "none", model, why)


def cpu_flags() -> set[str]:
    """The CPU's features in Linux's spelling (:func:`cpu_features`)."""
    return set(cpu_features().flags)


def uses_amx(info: str | None) -> bool:
    """Does this llama.cpp build send weights through ggml's AMX buffer type (``AMX_INT8 = 1``)? Its q4_1 and
    q8_0 products then run on AMX tiles, whose arithmetic no profile computes (README, "Intel AMX")."""
    return bool(info) and parse_system_info(info).get("AMX_INT8") == "1"


def _from_system_info(info: str) -> CPUProfile | None:
    keys = parse_system_info(info)
    if uses_amx(info):
        return None
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
    if prof is not None and uses_amx(info):
        return Detection(prof, cpu_features().source, False, "this machine's llama.cpp uses AMX (AMX_INT8 = 1), "
                         "whose arithmetic no profile computes; `make test` builds an oracle without it")
    if prof is not None:
        return Detection(prof, cpu_features().source, True)
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
