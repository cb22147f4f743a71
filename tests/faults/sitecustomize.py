"""Filesystem faults injected into a child Python process, without root or a real full disk.

A test puts this folder first on the child's PYTHONPATH and names the fault in ``FAULT_INJECT``;
Python imports ``sitecustomize`` at start-up, before anything else runs:

- ``enospc:DIR``: files under DIR open, but writing to them fails with ENOSPC (a full disk: the
  file is created and left empty, as on a real one);
- ``enospc-data:DIR``: the same, only for numba's index and data files (``.nbi``/``.nbc``, and their
  temporary names): a disk that filled up while kernels were being cached;
- ``readonly``: every file or folder created or opened for writing outside /dev fails with EROFS
  (the install, HOME, the caches: a read-only machine image).
"""
from __future__ import annotations

import builtins
import errno
import io
import os

_SPEC = os.environ.get("FAULT_INJECT", "")
_KIND, _, _DIR = _SPEC.partition(":")


def _hit(path) -> bool:
    try:
        p = os.path.abspath(os.fsdecode(path))
    except TypeError:           # a file descriptor
        return False
    if _KIND == "readonly":
        return not p.startswith(("/dev/", "/proc/"))
    if not p.startswith(_DIR.rstrip("/") + "/"):
        return False
    return _KIND == "enospc" or ".nbi" in p or ".nbc" in p


def _writing(mode: str) -> bool:
    return any(c in mode for c in "wax+")


class _FullFile:
    """A file on a full disk: it opened, every write fails."""

    def __init__(self, f):
        self._f = f

    def write(self, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()

    def __getattr__(self, name):
        return getattr(self._f, name)


_open = io.open


def _faulty_open(file, mode="r", *args, **kwargs):
    if _writing(mode) and _hit(file):
        if _KIND == "readonly":
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fsdecode(file))
        return _FullFile(_open(file, mode, *args, **kwargs))
    return _open(file, mode, *args, **kwargs)


_os_open, _mkdir = os.open, os.mkdir


def _faulty_os_open(path, flags, *args, **kwargs):
    if _KIND == "readonly" and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT) and _hit(path):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fsdecode(path))
    return _os_open(path, flags, *args, **kwargs)


def _faulty_mkdir(path, *args, **kwargs):
    if _KIND == "readonly" and _hit(path):
        if os.path.isdir(path):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), os.fsdecode(path))
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fsdecode(path))
    return _mkdir(path, *args, **kwargs)


if _KIND in ("enospc", "enospc-data", "readonly"):
    builtins.open = io.open = _faulty_open
    os.open, os.mkdir = _faulty_os_open, _faulty_mkdir
