"""numba's on-disk cache of compiled kernels, made safe to find damaged.

numba keeps each ``cache=True`` function's machine code in ``__pycache__`` (an index ``.nbi`` and data
``.nbc`` files, both pickles). A file cut short or overwritten (a full disk, a killed process, a
careless copy) makes numba raise ``EOFError``, ``UnpicklingError`` or worse on every later run, in
whichever command first calls the kernel. ``install()`` wraps numba's cache lookup: a cache entry that
cannot be read is removed (said once, in one line on stderr), and the function is compiled again (and its
cache written anew), as if it had never been cached.

numba checks a cached kernel against its own source file only, not against the functions it inlined
from other modules: after an update that changed ``quantize.py`` but not ``dot4.py``, dot4's cached
kernels would still carry the old quantizer (seen: a fix for NaN scales that the cached VNNI kernels
did not have). ``drop_stale()`` keeps a hash of all kernel sources beside each cache and empties the
cache when it changes.

numba also passes over a cache folder it cannot write, even for loading. On a shared JupyterHub the
admin warms the kernels once into a cache every user can read but not write (``NUMBA_CACHE_DIR``, or
the ``__pycache__`` folders of a read-only install); without help every user would compile every kernel
again, minutes each. ``adopt_read_only_cache()`` copies what such a cache holds for llmlab's kernels
into the user's own folder (``~/.cache/llmlab/numba``, under ``LLMLAB_HOME``) once and points numba there.

Compiled kernels also ship with llmlab (``shipped_kernels``): where one of its targets fits this CPU and this
numba, their cache is unpacked once and found first, by that module's locator.

The cache is an optimisation, never a reason to stop: a folder numba cannot write (a full disk, a read-only
install and home), a stamp that is not text, or no folder at all for numba's ``cache=True`` (numba raises at
decoration time when none of its locators works) turn caching off for the run, with one line on stderr
(:func:`turn_off`), and the kernels compile in memory. :func:`diagnose` is what ``doctor`` says about it.
"""
from __future__ import annotations

import functools
import glob
import hashlib
import os
import shutil
import sys
from pathlib import Path

from ... import config

PACKAGE = Path(__file__).resolve().parents[2]       # llmlab/

_SAID: set[str] = set()
PROBLEMS: list[str] = []          # why the cache is (partly) off in this process, for doctor; said once on stderr
_WRITE_OFF = False                # set once the cache cannot be written: numba's saves are skipped from then on


def turn_off(cause: str, writing_only: bool = False) -> None:
    """The kernel cache cannot be used (or, ``writing_only``, not written) in this run: remember ``cause`` and say
    it once, in one line for the whole run; the kernels are compiled in memory instead."""
    global _WRITE_OFF
    _WRITE_OFF = True
    PROBLEMS.append(cause)
    if len(PROBLEMS) == 1:
        what = "cannot be written" if writing_only else "cannot be used"
        print(f"llmlab: the kernel cache {what} ({_one_line(cause)}); kernels are compiled for this run only "
              f"(python -m llmlab doctor)", file=sys.stderr, flush=True)


def _one_line(text: str) -> str:
    return " ".join(str(text).split()).encode("ascii", "backslashreplace").decode()


def _why(e: BaseException) -> str:
    """An OSError as its errno text and file (``No space left on device: /x/y``), anything else as itself."""
    if isinstance(e, OSError) and e.strerror:
        return f"{e.strerror}: {e.filename}" if e.filename else e.strerror
    return f"{type(e).__name__}: {e}"


def install(first_locator=None) -> None:
    """Guard numba's cache (lookup, saving, locating a folder) and adopt a read-only shared cache (once per
    process; before any cached kernel is defined). ``first_locator(caching)``: a locator class numba asks before
    its own (``shipped_kernels``'s)."""
    from numba.core import caching, dispatcher
    if getattr(caching.Cache, "_llmlab_guarded", False):
        return
    caching.Cache._llmlab_guarded = True
    if first_locator is not None:
        caching.CacheImpl._locator_classes.insert(0, first_locator(caching))
    for step in (adopt_read_only_cache, drop_stale):
        try:
            step()
        except (OSError, UnicodeError, ValueError) as e:    # a full disk, a cache we cannot list: go on without
            turn_off(_why(e))
            break
    load, save = caching.Cache.load_overload, caching.Cache.save_overload
    enable = dispatcher.Dispatcher.enable_caching

    def load_overload(self, sig, target_context):
        try:
            return _load_without_refresh(self, sig, target_context)
        except Exception:        # noqa: BLE001 (tried again as numba loads, registries refreshed, to tell why)
            pass
        try:
            return load(self, sig, target_context)
        except Exception as e:   # noqa: BLE001 (whatever a damaged pickle raises: the entry is unusable)
            discard(self, e)
            return None

    def save_overload(self, sig, data):
        if _WRITE_OFF:
            return
        try:
            save(self, sig, data)
        except OSError as e:     # a full disk or a folder turned read-only: numba removed its temporary file
            turn_off(_why(e), writing_only=True)

    def enable_caching(self):
        """``cache=True`` without any folder numba can write: the function is compiled per run, not refused."""
        try:
            enable(self)
        except (RuntimeError, OSError) as e:
            self._cache = caching.NullCache()
            try:
                where, _ = _cache_folder()
                why = f"{where}: {_probe(where) or e}"
            except Exception:   # noqa: BLE001 (numba's message is cause enough)
                why = str(e)
            turn_off(f"no folder numba can cache kernels in; {why}")

    caching.Cache.load_overload = load_overload
    _lean_loaded_libraries()
    from numba.core.runtime import nrtdynmod
    nrtdynmod.compile_nrt_functions = _compile_nrt_functions
    caching.Cache.save_overload = save_overload
    dispatcher.Dispatcher.enable_caching = enable_caching
    caching.CacheImpl._locator_classes.append(_read_only_locator(caching))


def discard(cache, error: BaseException) -> None:
    """Remove the index and data files of ``cache`` (a numba ``Cache``) and say so once."""
    f = cache._cache_file
    index = f._index_path
    data = glob.glob(glob.escape(os.path.join(f._cache_path, f._index_name[:-len(".nbi")])) + ".*.nbc")
    for path in [index, *data]:
        try:
            os.unlink(path)
        except OSError:
            pass
    if not _SAID:                 # one line for the whole run, however many kernels were damaged
        _SAID.add(index)
        print(f"llmlab: numba's cache of compiled kernels is damaged ({type(error).__name__} reading "
              f"{os.path.basename(index)}); removing what cannot be read and compiling it again",
              file=sys.stderr, flush=True)


def _writable(folder: Path) -> bool:
    """numba's own test (``_CacheLocator.ensure_cache_path``): the folder can be made and written."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / f".llmlab-write-test-{os.getpid()}", "wb"):
            pass
        os.unlink(folder / f".llmlab-write-test-{os.getpid()}")
        return True
    except OSError:
        return False


@functools.cache
def _kernel_folders() -> list[Path]:
    """llmlab's source folders that hold numba kernels (njit-decorated functions; this module, which
    names the decorator, aside). Read once per process."""
    found = set()
    for f in map(Path, glob.glob(str(PACKAGE / "**" / "*.py"), recursive=True)):
        if f != Path(__file__).resolve() and "@njit" in f.read_text(encoding="utf-8"):
            found.add(f.parent)
    return sorted(found)


def _user_subpath(src_dir: Path) -> str:
    """The folder numba's ``_UserProvidedCacheLocator`` uses for sources in ``src_dir``, under CACHE_DIR."""
    return f"{src_dir.name}_{hashlib.sha1(str(src_dir).encode()).hexdigest()}"


def adopt_read_only_cache() -> Path | None:
    """Where a cache numba could not write holds llmlab's kernels (``NUMBA_CACHE_DIR``, or the
    ``__pycache__`` beside the kernels), copy its entries that the user's folder lacks or has older into
    the user's folder, and make that numba's cache folder. Returns the folder adopted, else None."""
    import numba
    shared = Path(numba.config.CACHE_DIR) if numba.config.CACHE_DIR else None
    sources = []                       # (folder holding .nbi/.nbc files, source folder of the kernels)
    for src in _kernel_folders():
        where = shared / _user_subpath(src) if shared else src / "__pycache__"
        if where.is_dir() and not _writable(where):
            sources.append(where)
    if not sources:
        return None
    mine = config.home() / "numba"
    if not _writable(mine):
        return None
    for where in sources:
        dest = mine / (where.name if shared else _user_subpath(where.parent))
        dest.mkdir(parents=True, exist_ok=True)
        for f in where.iterdir():
            if f.suffix in (".nbi", ".nbc") or f.name == STAMP:
                d = dest / f.name
                if not d.exists() or d.stat().st_mtime < f.stat().st_mtime:
                    _replace(d, lambda tmp, f=f: shutil.copy2(f, tmp))
    numba.config.CACHE_DIR = str(mine)
    return mine


STAMP = "llmlab-kernel-sources.sha1"


def sources_digest() -> str:
    """One hash of every source file in the kernel folders (what any cached kernel may have inlined)."""
    folders = tuple(_kernel_folders())
    if folders not in _DIGESTS:
        h = hashlib.sha1()
        for folder in folders:
            for f in sorted(folder.glob("*.py")):
                name = f.relative_to(PACKAGE).as_posix() if f.is_relative_to(PACKAGE) else f.as_posix()
                h.update(name.encode() + b"\0" + f.read_bytes())
        _DIGESTS[folders] = h.hexdigest()
    return _DIGESTS[folders]


_DIGESTS: dict[tuple, str] = {}


def read_only_cache(src_dir: Path) -> Path | None:
    """A cache folder of the kernels in ``src_dir`` that numba passes over because it cannot write it (a
    read-only machine image whose admin warmed the kernels), and whose stamp says it holds the current
    sources' kernels: numba may load from it. None where there is none, or it may be stale."""
    import numba
    if src_dir not in _kernel_folders():
        return None
    base = Path(numba.config.CACHE_DIR) if numba.config.CACHE_DIR else None
    for where in ([base / _user_subpath(src_dir)] if base else []) + [src_dir / "__pycache__"]:
        try:
            if _stamp_of(where / STAMP) == sources_digest().encode():
                return where
        except OSError:
            continue
    return None


def _read_only_locator(caching):
    """numba's last cache locator: :func:`read_only_cache`'s folder, for loading only (numba's own locators
    all want a folder they can write; saving there fails, and :func:`install`'s guard turns writing off)."""
    class ReadOnlyCacheLocator(caching._SourceFileBackedLocatorMixin, caching._CacheLocator):
        def __init__(self, py_func, py_file, where: Path):
            self._py_file, self._lineno, self._cache_path = py_file, py_func.__code__.co_firstlineno, str(where)

        def get_cache_path(self):
            return self._cache_path

        @classmethod
        def from_function(cls, py_func, py_file):
            try:
                where = read_only_cache(Path(py_file).resolve().parent)
            except (OSError, ValueError):
                return None
            return None if where is None else cls(py_func, py_file, where)
    return ReadOnlyCacheLocator


def _replace(dest: Path, write) -> None:
    """``write(tmp)`` a file beside ``dest`` and rename it into place: a full disk leaves nothing half-written."""
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, dest)
    except BaseException as e:
        if isinstance(e, OSError) and not e.filename:     # a write that failed at close: name the file
            e.filename = str(dest)
        try:
            tmp.unlink()
        except OSError:
            pass
        raise


def _stamp_of(path: Path) -> bytes | None:
    """The digest a cache folder was stamped with, as bytes (a damaged stamp is just not the current one)."""
    try:
        return path.read_bytes().strip()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None


def drop_stale() -> list[Path]:
    """Empty llmlab's kernel caches (the ``__pycache__`` beside the kernels, or NUMBA_CACHE_DIR's folders for
    them) whose stamp is not the current sources' digest, and stamp them. Returns the folders emptied. Where a
    stamp cannot be written, the cache is not written in this run either (its entries could not be told fresh)."""
    import numba
    digest, emptied = sources_digest(), []
    base = Path(numba.config.CACHE_DIR) if numba.config.CACHE_DIR else None
    for src in _kernel_folders():
        where = base / _user_subpath(src) if base else src / "__pycache__"
        stamp = where / STAMP
        if _stamp_of(stamp) == digest.encode() or not _writable(where):   # (made if missing)
            continue
        old = [f for f in where.iterdir() if f.suffix in (".nbi", ".nbc")]
        for f in old:
            f.unlink(missing_ok=True)
        _replace(stamp, lambda tmp: tmp.write_bytes(digest.encode() + b"\n"))
        if old:
            emptied.append(where)
    return emptied


def _cache_folder() -> tuple[Path, str]:
    """The folder numba caches llmlab's kernels in, and why that one (numba's locators, in their order)."""
    import numba
    kernels = PACKAGE / "ggml" / "cpu" / "fast"
    if numba.config.CACHE_DIR:
        return Path(numba.config.CACHE_DIR), "NUMBA_CACHE_DIR"
    where = kernels / "__pycache__"
    if _writable(where):
        return where, "next to the kernels"
    from numba.misc.appdirs import AppDirs
    return Path(AppDirs(appname="numba", appauthor=False).user_cache_dir), "per-user cache"


PROBE = 1 << 20     # bytes written to test a cache folder: about what one model's kernels add to it


def _probe(folder: Path, size: int = 1) -> str | None:
    """Why ``size`` bytes cannot be written to a new file in ``folder`` (made if missing), or None if they can."""
    probe = folder / f".llmlab-probe-{os.getpid()}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with open(probe, "wb") as f:
            f.write(bytes(size))
            f.flush()
            os.fsync(f.fileno())
        return None
    except OSError as e:
        return e.strerror or str(e)
    finally:
        try:
            probe.unlink()
        except OSError:
            pass


def diagnose() -> dict:
    """What ``doctor`` says about the kernel cache: its folder, where that choice came from, whether a file of
    :data:`PROBE` bytes can be written there, and the cause when it cannot (or when this run turned the
    cache off: :data:`PROBLEMS`)."""
    try:
        where, source = _cache_folder()
    except Exception as e:      # noqa: BLE001 (numba's own configuration is broken: say it, do not stop doctor)
        return {"dir": None, "source": None, "writable": False, "problem": _why(e)}
    problem = _probe(where, PROBE)
    writable = problem is None
    if problem is None and PROBLEMS:
        problem = PROBLEMS[0]
    return {"dir": str(where), "source": source, "writable": writable, "problem": problem}


# ---- libraries numba compiles outside any cached kernel ---------------------------------------------------
# A process that only loads cached kernels still compiled two LLVM modules before this: numba's runtime
# (NRT: its atomic reference counts, ``nrtdynmod.compile_nrt_functions``, compiled when the first kernel
# loads) and the threadpool's region entry (``threadpool._build_inline_entry``). Either runs LLVM's
# optimizer and code generator, whose code pages (~27 MB of ``libllvmlite.so``) then stay resident.
# :func:`cached_library` keeps such a library's machine code under ``LLMLAB_HOME/numba``, keyed by its IR
# text and by what numba keys its own cache by (numba's and llvmlite's versions, the target's triple, CPU
# and features), and loads it as numba loads a cached kernel (object code, no LLVM passes).

LIBRARY_CACHE = "libraries"          # the folder under config.home()/"numba"


def library_key(codegen, ir_text: str) -> str:
    """The cache key of a library compiled from ``ir_text`` by ``codegen``: anything that changes its machine
    code changes the key."""
    import llvmlite
    import numba
    h = hashlib.sha256()
    for part in (numba.__version__, llvmlite.__version__, repr(codegen.magic_tuple()), sys.platform, ir_text):
        h.update(str(part).encode() + b"\0")
    return h.hexdigest()[:32]


def cached_library(codegen, name: str, ir_module):
    """A finalized numba code library of ``ir_module`` (an ``llvmlite.ir.Module``): its machine code loaded
    from ``LLMLAB_HOME/numba/libraries`` when an entry with the same key is there, else compiled and the
    entry written. A damaged entry is compiled again and replaced; a folder that cannot be written only means
    compiling in the next process too."""
    from numba.core.compiler_lock import global_compiler_lock
    with global_compiler_lock:
        return _cached_library(codegen, name, ir_module)


def _cached_library(codegen, name: str, ir_module):
    import pickle
    ir_text = str(ir_module)
    try:
        path = config.home() / "numba" / LIBRARY_CACHE / f"{name}-{library_key(codegen, ir_text)}.nbl"
    except (ValueError, OSError):
        path = None
    if path is not None:
        try:
            state = pickle.loads(path.read_bytes())
            if state[0] == name and state[1] == "object":
                return codegen.unserialize_library(state)
        except FileNotFoundError:
            pass
        except Exception:     # noqa: BLE001 (a cut-short or foreign file: compile it and write it again)
            pass
    library = codegen.create_library(name)
    library.enable_object_caching()
    library.add_ir_module(ir_module)
    library.finalize()
    if path is not None:
        try:
            data = pickle.dumps(library.serialize_using_object_code(), protocol=pickle.HIGHEST_PROTOCOL)
            path.parent.mkdir(parents=True, exist_ok=True)
            _replace(path, lambda tmp: tmp.write_bytes(data))
        except (OSError, RuntimeError, ValueError):
            pass
    return library


def _compile_nrt_functions(ctx):
    """numba's ``nrtdynmod.compile_nrt_functions``, through :func:`cached_library`."""
    from numba.core.runtime import nrtdynmod
    ir_mod, library = nrtdynmod.create_nrt_module(ctx)
    return cached_library(ctx.codegen(), library.name, ir_mod)


def _load_without_refresh(cache, sig, target_context):
    """numba's ``Cache.load_overload`` less its ``target_context.refresh()``: that imports and installs every
    typing and lowering registry (~15 MB of Python objects) that only compiling needs (numba's compiler
    refreshes itself); loading needs numba's runtime, whose symbols the machine code links to."""
    from numba.core.runtime import rtsys
    rtsys.initialize(target_context)
    with cache._guard_against_spurious_io_errors():
        return cache._load_overload(sig, target_context)


def _lean_loaded_libraries() -> None:
    """A library numba loads from its cache (a kernel's machine code) kept its bitcode parsed into an LLVM
    module for as long as it lives (``_shared_module``), only in case a kernel compiled later links it in:
    ~0.5 MB of LLVM's heap per library, ~13 MB for SmolLM2's. It keeps the bitcode's bytes instead (a tenth
    of that) and parses them when a compile asks for the module. Loads and compiles are counted for
    :func:`drop_llvm_pages`."""
    import llvmlite.binding as ll
    from numba.core import codegen
    lib = codegen.CPUCodeLibrary
    unserialize, for_linking = lib._unserialize.__func__, lib._get_module_for_linking

    def _unserialize(cls, codegen, state):
        self = unserialize(cls, codegen, state)
        _LLVM_RUNS[0] += 1
        if state[1] == "object":
            self._llmlab_bitcode, self._shared_module = state[2][1], None
        return self

    def _get_module_for_linking(self):
        if self._shared_module is None and getattr(self, "_llmlab_bitcode", None) is not None:
            self._shared_module = ll.parse_bitcode(self._llmlab_bitcode)
        return for_linking(self)

    def finalize(self):
        _LLVM_RUNS[0] += 1
        return compile_(self)

    compile_ = lib.finalize
    lib._unserialize = classmethod(_unserialize)
    lib._get_module_for_linking = _get_module_for_linking
    lib.finalize = finalize


# ---- LLVM's code pages -------------------------------------------------------------------------------------
# ``libllvmlite.so`` is mapped from its file: importing it (its static constructors, and the kernel's read
# fault-around, 64 KiB around each page it runs) and loading kernels make ~47 MB of its text and read-only
# data resident, code that then runs no more while a model decodes. :func:`drop_llvm_pages` unmaps those
# clean file pages from this process (MADV_DONTNEED: what runs again faults back from the page cache, a
# minor fault per page; nothing is lost, as no page of such a mapping was ever written: those with an
# anonymous or dirty page are kept). Linux only (it reads /proc/self/smaps); elsewhere nothing is done.

_LLVM_RUNS = [0, -1]        # libraries loaded or compiled so far; that count at the last drop


def clean_file_ranges(smaps: str, marker: str) -> list[tuple[int, int]]:
    """The (start, end) of each private, non-writable mapping of a file whose path contains ``marker`` in
    ``smaps`` (/proc/self/smaps' text), with resident pages and none of them anonymous or dirty."""
    out, cur, info = [], None, {}

    def close():
        if cur is not None and info.get("Rss", 0) and info.get("Anonymous", 1) == 0 and \
                info.get("Private_Dirty", 1) == 0 and info.get("Shared_Dirty", 1) == 0:
            out.append(cur)
    for line in smaps.splitlines():
        p = line.split()
        if not p:
            continue
        if not p[0].endswith(":") and "-" in p[0] and len(p) >= 5:      # a mapping's header
            close()
            cur, info = None, {}
            if len(p) > 5 and marker in os.path.basename(p[5]) and p[1][1] == "-" and p[1][3] == "p":
                lo, hi = (int(x, 16) for x in p[0].split("-"))
                cur = (lo, hi)
        elif cur is not None and len(p) >= 2 and p[1].isdigit():
            info[p[0].rstrip(":")] = int(p[1])
    close()
    return out


def drop_llvm_pages(force: bool = False) -> int:
    """Unmap the clean file pages of LLVM's library (``libllvmlite``) from this process, when LLVM loaded or
    compiled something since the last time (or ``force``). Returns the KiB that were resident in them."""
    import mmap
    if (_LLVM_RUNS[0] == _LLVM_RUNS[1] and not force) or not sys.platform.startswith("linux") \
            or not hasattr(mmap, "MADV_DONTNEED"):
        return 0
    _LLVM_RUNS[1] = _LLVM_RUNS[0]
    try:
        import ctypes
        with open("/proc/self/smaps", encoding="ascii", errors="replace") as f:
            ranges = clean_file_ranges(f.read(), "llvmlite")
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    except (OSError, ValueError, AttributeError):
        return 0
    dropped = 0
    for lo, hi in ranges:
        if libc.madvise(lo, hi - lo, mmap.MADV_DONTNEED) == 0:
            dropped += (hi - lo) >> 10
    return dropped
