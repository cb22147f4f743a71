"""numba's on-disk cache of compiled kernels, made safe to find damaged.

numba keeps each ``cache=True`` function's machine code in ``__pycache__`` (an index ``.nbi`` and data
``.nbc`` files, both pickles). A file cut short or overwritten (a full disk, a killed process, a
careless copy) makes numba raise ``EOFError``, ``UnpicklingError`` or worse on every later run, in
whichever command first calls the kernel. ``install()`` wraps numba's cache lookup: a cache entry that
cannot be read is removed (said once, in one line on stderr), and the function is compiled again (and its
cache written anew), as if it had never been cached.
"""
from __future__ import annotations

import glob
import os
import sys

_SAID: set[str] = set()


def install() -> None:
    """Guard numba's cache lookup (once per process; before any cached kernel is first called)."""
    from numba.core import caching
    if getattr(caching.Cache, "_llmlab_guarded", False):
        return
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
