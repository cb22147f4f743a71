"""Every ``LLMLAB_*`` environment variable, read here and only here (``tests/test_config.py`` checks).

Each knob is one function that reads the environment when called, never at import, so the order
in which modules are imported does not matter and a test may set a variable before the first use.
A value that does not parse is a ``ValueError`` naming the variable (the CLI prints it as one
``error:`` line). Numbers are ASCII digits only, parsed by :func:`parse_int` and :func:`parse_float`,
the same parsers the CLI's number options use.

=========================  ===========================================================  ==============
variable                   meaning                                                      default
=========================  ===========================================================  ==============
LLMLAB_HOME                the cache folder for models (``~`` expanded)                 $XDG_CACHE_HOME/llmlab,
                                                                                        else ~/.cache/llmlab
LLMLAB_CPU                 the CPU profile to reproduce: ``auto``, ``avx2``, ``avx512``  auto (detected)
LLMLAB_THREADS             threads of the fast kernels (a positive integer)             :func:`default_threads`
LLMLAB_PARALLEL_MIN_WORK   multiply-adds of a quantized product from which it runs       from the threading
                           threaded (read when a plan binds its kernels)                layer's wake cost,
                                                                                        >= 262144
LLMLAB_DOT4                dot4's byte-dot kernels: unset (the best the host runs),     unset
                           ``0`` (off: the generic kernels), ``vnni`` or ``avx2``
LLMLAB_KERNEL_TARGET       the machine code numba compiles the fast kernels for:        auto
                           ``auto`` (the best shipped target this CPU runs, its
                           archive unpacked, else this CPU), ``host`` (this CPU), or a
                           target of ``shipped_kernels.TARGETS`` (compiled, never
                           unpacked: ``make kernels`` builds the archives so)
LLMLAB_DEBUG               any non-empty value: the CLI prints tracebacks (``--debug``)  off
LLMLAB_RPC_TIMEOUT         seconds an rpc-server may take to answer (0 < s <= 86400)      120
LLMLAB_CPUINFO             the file Linux's CPU features are read from (tests stand a     /proc/cpuinfo
                           damaged file or a FIFO in for it)
LLMLAB_ARM64_ORACLE        where ``make oracle-arm64`` keeps the aarch64 llama.cpp        ~/.cache/llmlab/
                           builds (the ARM profiles' oracle, run under qemu-user)       oracle-arm64
=========================  ===========================================================  ==============

The test suite has knobs of its own (``LLMLAB_REQUIRE_ORACLES`` and the browser test's); they
belong to ``tests/`` and are listed in the README.
"""
from __future__ import annotations

import math
import operator
import os
import re
from pathlib import Path

_INT = re.compile(r"[+-]?[0-9]+")                                    # ASCII digits only: int() would also
_FLOAT = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")   # take '١٢', '1_0' and 'infinity'


def parse_int(text: str) -> int:
    """An integer written in ASCII digits with an optional sign (not '١٠', '1_0', '0x10', '1e3')."""
    if not isinstance(text, str) or not _INT.fullmatch(text.strip()):
        raise ValueError(f"{text!r} is not an integer")
    return int(text)


def parse_float(text: str) -> float:
    """A finite decimal number in ASCII (not 'inf', 'nan', '١.٥', '1_0.5')."""
    if not isinstance(text, str) or not _FLOAT.fullmatch(text.strip()):
        raise ValueError(f"{text!r} is not a finite decimal number")
    v = float(text)
    if not math.isfinite(v):            # 1e999
        raise ValueError(f"{text!r} is not a finite decimal number")
    return v


def _env(name: str) -> str:
    return os.environ.get(name, "").strip()


def _env_int(name: str, default: int, minimum: int) -> int:
    text = _env(name)
    if not text:
        return default
    try:
        v = parse_int(text)
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None
    if v < minimum:
        raise ValueError(f"{name}: {v} must be >= {minimum}")
    return v


def home() -> Path:
    """Where llmlab caches models: $LLMLAB_HOME (``~`` expanded), else $XDG_CACHE_HOME/llmlab, else
    ~/.cache/llmlab."""
    text = _env("LLMLAB_HOME")
    try:
        if text:
            return Path(text).expanduser()
        return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "llmlab"
    except RuntimeError as e:     # '~nosuchuser/x', or no HOME and no passwd entry: expanduser cannot say where
        what = f"LLMLAB_HOME={text!r}" if text else "the cache folder (set LLMLAB_HOME)"
        raise ValueError(f"{what}: {e} (a '~' needs a user this machine knows)") from None


def arm64_oracle() -> Path:
    """LLMLAB_ARM64_ORACLE: the folder of the aarch64 llama.cpp builds (``~`` expanded), else
    ~/.cache/llmlab/oracle-arm64 (where ``make oracle-arm64`` puts them)."""
    text = _env("LLMLAB_ARM64_ORACLE")
    return Path(text).expanduser() if text else Path.home() / ".cache" / "llmlab" / "oracle-arm64"


def cpuinfo() -> Path:
    """LLMLAB_CPUINFO: the file read for the CPU's features on Linux, else /proc/cpuinfo."""
    text = _env("LLMLAB_CPUINFO")
    return Path(text) if text else Path("/proc/cpuinfo")


def cpu() -> str | None:
    """LLMLAB_CPU lower-cased, or None when unset or ``auto`` (the profiles module checks the name)."""
    v = _env("LLMLAB_CPU").lower()
    return None if v in ("", "auto") else v


DOT4_CHOICES = ("0", "vnni", "avx2")


def dot4() -> str | None:
    """LLMLAB_DOT4: None (unset: the best the host runs), "0" (the generic kernels) or an instruction set."""
    v = _env("LLMLAB_DOT4").lower()
    if not v:
        return None
    if v not in DOT4_CHOICES:
        raise ValueError(f"LLMLAB_DOT4: {v!r} is not one of {', '.join(DOT4_CHOICES)} (or unset)")
    return v


def kernel_target() -> str:
    """LLMLAB_KERNEL_TARGET lower-cased: "auto" (unset), "host" or a target's name (checked by
    ``llmlab.ggml.cpu.shipped_kernels``)."""
    return _env("LLMLAB_KERNEL_TARGET").lower() or "auto"


def debug() -> bool:
    """LLMLAB_DEBUG: any non-empty value shows tracebacks on CLI errors."""
    return bool(_env("LLMLAB_DEBUG"))


def rpc_timeout() -> float:
    """LLMLAB_RPC_TIMEOUT: seconds the RPC client waits for an rpc-server's reply (a prompt's graph included)
    before it gives up with one error line."""
    text = _env("LLMLAB_RPC_TIMEOUT")
    if not text:
        return 120.0
    try:
        v = parse_float(text)
    except ValueError as e:
        raise ValueError(f"LLMLAB_RPC_TIMEOUT: {e}") from None
    if not 0 < v <= RPC_TIMEOUT_MAX:
        raise ValueError(f"LLMLAB_RPC_TIMEOUT: {text} must be > 0 and at most {RPC_TIMEOUT_MAX} (one day)")
    return v


RPC_TIMEOUT_MAX = 86400      # a day: longer is no timeout at all (and past ~1e9 s the socket cannot be given it)


def parallel_min_work(default=1 << 18) -> int:
    """LLMLAB_PARALLEL_MIN_WORK: R * K * T multiply-adds of a quantized product below which it runs on one
    thread (cplan scales it for other ops). Threads pay only when a product's work covers waking and joining
    them: the default, 2^18, threads the per-token matvecs of the small models but their K/V projections.
    Where other processes hold the cores, a threaded call waits for a thread the OS has not scheduled: a
    larger value (2097152) keeps every layer serial. Read when a kernel is bound (a plan build), never per
    call. ``default``: the value where unset, or a function giving it (the fast kernels derive it from the
    threading layer's measured wake-up cost: ``fast._common.parallel_min_work``)."""
    if not _env("LLMLAB_PARALLEL_MIN_WORK"):
        return default() if callable(default) else default
    return _env_int("LLMLAB_PARALLEL_MIN_WORK", 0, 0)


# ---------------------------------------------------------------- threads: one policy

NUMBA_THREADS_IGNORED: str | None = None     # why NUMBA_NUM_THREADS was set aside in this process (doctor says it)


def guard_numba_threads() -> str | None:
    """numba refuses a NUMBA_NUM_THREADS of 0 or less with a ValueError while it loads, before any command (or
    ``doctor``) could say why. Run once when llmlab is imported, before numba loads: a value that is not a
    positive integer is removed from this process's environment (the kernels run on numba's default pool),
    said in one line, and kept for ``doctor``. Returns the cause, else None."""
    global NUMBA_THREADS_IGNORED
    text = os.environ.get("NUMBA_NUM_THREADS")
    if text is None or NUMBA_THREADS_IGNORED is not None:
        return NUMBA_THREADS_IGNORED
    try:
        ok = parse_int(text) >= 1
    except ValueError:
        ok = False
    if ok:
        return None
    import sys
    if "numba" in sys.modules:        # too late to help: numba read it already
        return None
    del os.environ["NUMBA_NUM_THREADS"]
    NUMBA_THREADS_IGNORED = (f"NUMBA_NUM_THREADS={text.encode('ascii', 'backslashreplace').decode()!r} is not a "
                             f"positive integer: ignored (numba's default thread pool is used)")
    print(f"llmlab: {NUMBA_THREADS_IGNORED}", file=sys.stderr, flush=True)
    return NUMBA_THREADS_IGNORED


def _physical_cores(cpus: list[int] | None = None) -> int | None:
    """Cores, not hardware threads: the distinct ``thread_siblings`` masks of the (given) online CPUs, as
    llama.cpp's ``cpu_get_num_physical_cores`` counts them on Linux; None where sysfs does not say."""
    root = Path("/sys/devices/system/cpu")
    if cpus is None:
        cpus = sorted(int(p.name[3:]) for p in root.glob("cpu[0-9]*"))
    seen = set()
    for c in cpus:
        try:
            seen.add((root / f"cpu{c}" / "topology" / "thread_siblings").read_text().strip())
        except OSError:
            continue
    return len(seen) or None


def _cpu_list(text: str) -> list[int]:
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11] (the kernel's cpulist format)."""
    out = []
    for part in text.strip().split(","):
        if part:
            lo, _, hi = part.partition("-")
            out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def _performance_cpus() -> list[int] | None:
    """On a hybrid x86 CPU (Intel's P- and E-cores), the CPUs of the performance cores; else None. Linux
    lists them in /sys/devices/cpu_core/cpus (and the efficiency cores in cpu_atom) only on hybrid parts."""
    try:
        return _cpu_list(Path("/sys/devices/cpu_core/cpus").read_text()) or None
    except (OSError, ValueError):
        return None


def default_threads() -> int:
    """llama.cpp's default thread count, ``cpu_get_num_math()``: the physical cores (hardware threads do not
    help linear algebra), and on a hybrid x86 CPU only the performance cores (efficiency cores hold back
    threads that meet at every barrier). Without sysfs, llama.cpp's fallback: the logical CPUs, halved
    above 4. Capped by numba's thread pool (NUMBA_NUM_THREADS), which llmlab's kernels run on."""
    import numba
    n = None
    perf = _performance_cpus()
    if perf:
        n = _physical_cores(perf)
    if n is None:
        n = _physical_cores()
    if n is None:
        logical = os.cpu_count() or 4
        n = logical if logical <= 4 else logical // 2
    return max(1, min(n, numba.config.NUMBA_NUM_THREADS))


def threads(asked: int | None = None) -> tuple[int, str]:
    """The thread count wanted for the fast kernels and why: ``asked`` (a positive integer), else
    LLMLAB_THREADS, else :func:`default_threads`. ``fast.set_threads`` caps it by numba's pool."""
    if asked is not None:
        try:
            n = operator.index(asked)
        except TypeError:
            n = 0
        if n < 1 or isinstance(asked, bool):
            raise ValueError(f"threads must be a positive integer, not {asked!r}")
        return n, "as asked"
    n = _env_int("LLMLAB_THREADS", 0, 1)
    if n:
        return n, "LLMLAB_THREADS"
    return default_threads(), "physical cores"
