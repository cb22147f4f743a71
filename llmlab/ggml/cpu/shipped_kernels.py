"""Compiled kernels that ship with llmlab, so that a learner's first run loads them instead of compiling.

numba compiles every fast kernel on first use (two minutes for one model on two cores) and keys what it
caches by the machine code's target: ``(triple, CPU model, CPU features)``. Compiled for the host, that key
differs on every machine; compiled for a named LLVM CPU model with that model's own features
(``NUMBA_CPU_NAME=haswell``, ``NUMBA_CPU_FEATURES=+64bit``) it is the same on every machine, so a cache built
once runs on any CPU that has the model's features. :data:`TARGETS` are such models, best first; each has
an archive per Python version of the kernels the two real models reach, built by ``make kernels``
(``tools/ship_kernels.py``) from these sources, in ``llmlab/data/kernels/`` (so a clone and the wheel both
carry it).

On first use (:func:`install`, when the kernels are imported, before numba's code generator exists) the best
target whose features this CPU has is chosen, its archive checked against this process (numba's, llvmlite's
and Python's versions, the platform triple, the kernel sources' digest, the archive's own hash) and unpacked
once into ``~/.cache/llmlab/numba/shipped/`` (under ``LLMLAB_HOME``); then numba compiles everything in this
process for that target, and :func:`locator` points llmlab's kernels at the unpacked cache. When any check
fails numba compiles for this CPU, as without an archive, and :func:`note` says why in the warm-up line.

The float order of every kernel is fixed in its source (no fast-math: LLVM contracts nothing), so the target
changes speed at most, never bits; the byte-dot instruction set (``dot4``) is the target's, within what the
host runs. ``LLMLAB_KERNEL_TARGET=host`` turns the archives off; a target's name compiles for it without
unpacking anything (the build tool's mode).
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from ... import config

PACKAGE = Path(__file__).resolve().parents[2]       # llmlab/
ARCHIVES = PACKAGE / "data" / "kernels"
FEATURES = "+64bit"         # LLVM then takes the CPU model's own features and tuning, not the host's
_X86 = frozenset({"avx", "avx2", "fma", "f16c", "bmi1", "bmi2", "abm", "movbe", "popcnt", "sse4_1", "sse4_2",
                  "ssse3"})


@dataclass(frozen=True)
class Target:
    name: str
    machine: str                # profiles.machine() of the hosts that run it
    cpu: str                    # LLVM's CPU model (NUMBA_CPU_NAME)
    needs: frozenset            # the CPU features (Linux's names) its machine code may use
    isas: tuple                 # dot4's byte-dot instruction sets in it, best first

    def archive(self) -> Path:
        """Its archive for this Python (numba's cache files are pickles named for the Python version)."""
        return ARCHIVES / f"{self.name}-{_py()}.tar.xz"

    def manifest(self) -> Path:
        return ARCHIVES / f"{self.name}-{_py()}.json"


def _py() -> str:
    return f"py{sys.version_info[0]}{sys.version_info[1]}{getattr(sys, 'abiflags', '')}"


# best first: a host takes the first whose features it has (a registry: a new target is a line here)
TARGETS = {t.name: t for t in (
    Target("x86_64-avx512vnni", "x86_64", "cascadelake",
           _X86 | {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl", "avx512_vnni"}, ("vnni", "avx2")),
    Target("x86_64-avx2", "x86_64", "haswell", _X86, ("avx2",)),
)}

_STATE: dict = {"target": None, "folder": None, "note": None, "done": False, "shipped": False}


def active() -> Target | None:
    """The shipped target numba compiles llmlab's kernels for in this process (None: the host)."""
    return _STATE["target"]


def shipped() -> bool:
    """Is :func:`active`'s cache seeded by a shipped archive (False: a target named by LLMLAB_KERNEL_TARGET, compiled
    here)?"""
    return _STATE["shipped"]


def note() -> str | None:
    """Why the shipped kernels are not in use in this process (None where they are, or were never tried)."""
    return _STATE["note"]


def host_target() -> Target | None:
    """The best target whose features this CPU has."""
    from .profiles import cpu_flags, machine
    m = machine()
    flags = cpu_flags() if m == "x86_64" else set()
    return next((t for t in TARGETS.values() if t.machine == m and t.needs <= flags), None)


def versions() -> dict:
    """What a compiled kernel cache depends on besides the sources and the target."""
    import llvmlite
    import numba
    from llvmlite import binding as ll
    return {"numba": numba.__version__, "llvmlite": llvmlite.__version__,
            "python": f"{sys.version_info[0]}.{sys.version_info[1]}{getattr(sys, 'abiflags', '')}",
            "triple": ll.get_process_triple()}


def read_manifest(t: Target) -> dict | None:
    try:
        return json.loads(t.manifest().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def mismatch(t: Target, m: dict | None) -> str | None:
    """Why the archive described by manifest ``m`` cannot serve this process (None: it can)."""
    from .numba_cache import sources_digest
    if m is None or not t.archive().is_file():
        return f"no shipped kernels for {t.name} on Python {sys.version_info[0]}.{sys.version_info[1]}"
    have = versions()
    for key in ("numba", "llvmlite", "python", "triple"):
        if m.get(key) != have[key]:
            return f"the shipped kernels are for {key} {m.get(key)}, this is {have[key]}"
    if m.get("sources") != sources_digest():
        return "the shipped kernels are older than these kernel sources (make kernels)"
    if (m.get("cpu"), m.get("features")) != (t.cpu, FEATURES):
        return f"the shipped kernels for {t.name} were built for another CPU model"
    return None


def _codegen_exists() -> bool:
    """Has numba made its code generator in this process (then its CPU model cannot change)?"""
    reg = sys.modules.get("numba.core.registry")
    return reg is not None and "_toplevel_target_context" in vars(reg.cpu_target)


def _numba_told_cpu() -> tuple[str | None, str | None]:
    return os.environ.get("NUMBA_CPU_NAME") or None, os.environ.get("NUMBA_CPU_FEATURES") or None


def activate() -> Target | None:
    """Choose the target for this process, unpack its archive where ``auto`` finds one that fits, and tell numba
    (its environment variables, so that numba's config reloads and child processes agree). Once per process;
    returns the target (None: numba compiles for the host)."""
    if _STATE["done"]:
        return _STATE["target"]
    _STATE["done"] = True
    want = config.kernel_target()
    told = _numba_told_cpu()
    if want == "host":
        if told in {(t.cpu, FEATURES) for t in TARGETS.values()} and not _codegen_exists():
            import numba          # a parent process's shipped target, inherited: this process compiles for the host
            del os.environ["NUMBA_CPU_NAME"], os.environ["NUMBA_CPU_FEATURES"]
            numba.config.reload_config()
        return _host("LLMLAB_KERNEL_TARGET=host")
    if want != "auto":
        t = TARGETS.get(want)
        if t is None:
            raise ValueError(f"LLMLAB_KERNEL_TARGET: {want!r} is not one of auto, host, {', '.join(TARGETS)}")
        if _codegen_exists() and told != (t.cpu, FEATURES):
            raise ValueError(f"LLMLAB_KERNEL_TARGET={want}: numba compiled code before llmlab's kernels were imported")
        return _use(t, folder(t))
    t = host_target()
    if t is None:
        return _host(None)
    if told != (None, None) and told != (t.cpu, FEATURES):
        return _host("NUMBA_CPU_NAME/NUMBA_CPU_FEATURES are set")
    if told == (None, None) and _codegen_exists():
        return _host("numba compiled code before llmlab's kernels were imported")
    m = read_manifest(t)
    why = mismatch(t, m)
    if why is not None:
        return _host(why)
    try:
        where = unpack(t, m)
    except Exception as e:    # noqa: BLE001 (OSError, tarfile's, lzma's: a damaged archive is only a reason to compile)
        return _host(f"the shipped kernels cannot be unpacked ({type(e).__name__}: {e})")
    _STATE["shipped"] = True
    return _use(t, where)


def install() -> None:
    """Before any cached kernel is defined: choose the target (:func:`activate`), then guard numba's cache with
    :func:`locator` asked first (``numba_cache.install``)."""
    from .numba_cache import install as guard
    activate()
    guard(first_locator=locator)


def _host(why: str | None) -> None:
    _STATE.update(target=None, folder=None, note=why)
    return None


def _use(t: Target, where: Path) -> Target:
    import numba
    os.environ["NUMBA_CPU_NAME"], os.environ["NUMBA_CPU_FEATURES"] = t.cpu, FEATURES
    numba.config.reload_config()
    _STATE.update(target=t, folder=where, note=None)
    return t


def folder(t: Target) -> Path:
    """Where this process's kernels for ``t`` are cached: keyed by the sources and numba's version, so a cache
    there never holds another source's code."""
    from .numba_cache import sources_digest
    v = versions()
    key = f"{t.name}-{sources_digest()[:12]}-numba{v['numba']}-py{v['python']}"
    return config.home() / "numba" / "shipped" / key


def unpack(t: Target, m: dict) -> Path:
    """The archive of ``t`` unpacked into :func:`folder` once (checked against its manifest's hash first; written
    beside and renamed into place, so a killed or concurrent unpack leaves nothing half-made)."""
    dest = folder(t)
    done = dest / ".unpacked"
    if done.is_file() and done.read_text(encoding="ascii", errors="replace").strip() == m["sha256"]:
        return dest
    data = t.archive().read_bytes()
    if hashlib.sha256(data).hexdigest() != m["sha256"]:
        raise ValueError(f"{t.archive().name} is not the archive its manifest describes (damaged or replaced)")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        _extract(data, tmp)
        (tmp / ".unpacked").write_text(m["sha256"] + "\n", encoding="ascii")
        if dest.exists():                       # an older or partial unpack of the same key
            shutil.rmtree(dest, ignore_errors=True)
        try:
            os.replace(tmp, dest)
        except OSError:
            if not done.is_file():              # not another process that won the race
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest     # (other keys' folders stay: another clone or version of llmlab may still use them)


def _extract(data: bytes, into: Path) -> None:
    """The archive's regular files under ``into``, each name checked (relative, no ``..``): tarfile's own
    ``filter="data"`` is missing from Python 3.11 before 3.11.4 (Debian 12's)."""
    import io
    into.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:xz") as tar:
        for member in tar:
            parts = Path(member.name).parts
            if not member.isfile() or not parts or Path(member.name).is_absolute() or ".." in parts:
                raise ValueError(f"unexpected member {member.name!r} in the archive")
            dest = into.joinpath(*parts)
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(tar.extractfile(member).read())


@functools.cache
def _content_stamp(path: str, mtime: float, size: int) -> bytes:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).digest()


def locator(caching):
    """numba's first cache locator while a target is active: llmlab's kernels in :func:`folder`, stamped by
    their source's content (a clone's files have new mtimes; numba before 0.62 stamped by mtime and size)."""
    from .numba_cache import _kernel_folders

    class ShippedKernelLocator(caching._CacheLocator):
        def __init__(self, py_func, py_file, where: Path):
            self._py_file, self._lineno, self._cache_path = py_file, py_func.__code__.co_firstlineno, str(where)

        def get_cache_path(self):
            return self._cache_path

        def get_source_stamp(self):
            st = os.stat(self._py_file)
            return _content_stamp(self._py_file, st.st_mtime, st.st_size)

        def get_disambiguator(self):
            return str(self._lineno)

        @classmethod
        def from_function(cls, py_func, py_file):
            where = _STATE["folder"]
            if where is None:
                return None
            try:
                src = Path(py_file).resolve().parent
                if src not in _kernel_folders():
                    return None
                self = cls(py_func, py_file, where / src.relative_to(PACKAGE).as_posix())
                self.ensure_cache_path()
            except (OSError, ValueError):
                return None
            return self
    return ShippedKernelLocator
