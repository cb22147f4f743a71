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


def install() -> None:
    """Guard numba's cache lookup and adopt a read-only shared cache (once per process; before any cached
    kernel is defined)."""
    from numba.core import caching
    if getattr(caching.Cache, "_llmlab_guarded", False):
        return
    adopt_read_only_cache()
    drop_stale()
    load = caching.Cache.load_overload

    def load_overload(self, sig, target_context):
        try:
            return load(self, sig, target_context)
        except Exception as e:   # noqa: BLE001 (whatever a damaged pickle raises: the entry is unusable)
            discard(self, e)
            return None

    caching.Cache.load_overload = load_overload
    caching.Cache._llmlab_guarded = True


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
                    shutil.copy2(f, d)
    numba.config.CACHE_DIR = str(mine)
    return mine


STAMP = "llmlab-kernel-sources.sha1"


def sources_digest() -> str:
    """One hash of every source file in the kernel folders (what any cached kernel may have inlined)."""
    h = hashlib.sha1()
    for folder in _kernel_folders():
        for f in sorted(folder.glob("*.py")):
            h.update(f.relative_to(PACKAGE).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def drop_stale() -> list[Path]:
    """Empty llmlab's kernel caches (the ``__pycache__`` beside the kernels, or NUMBA_CACHE_DIR's folders for
    them) whose stamp is not the current sources' digest, and stamp them. Returns the folders emptied."""
    import numba
    digest, emptied = sources_digest(), []
    base = Path(numba.config.CACHE_DIR) if numba.config.CACHE_DIR else None
    for src in _kernel_folders():
        where = base / _user_subpath(src) if base else src / "__pycache__"
        stamp = where / STAMP
        if (stamp.is_file() and stamp.read_text().strip() == digest) or not _writable(where):   # (made if missing)
            continue
        old = [f for f in where.iterdir() if f.suffix in (".nbi", ".nbc")]
        for f in old:
            f.unlink(missing_ok=True)
        stamp.write_text(digest + "\n")
        if old:
            emptied.append(where)
    return emptied
