"""Files from anywhere: read only regular files (never block on a FIFO), write atomically.

- ``open_regular(path)`` opens read-only and non-blocking (where the OS has FIFOs), then checks with ``fstat`` that what it
  opened is a regular file: a FIFO, a device or a directory is refused with a precise message
  instead of hanging or being misreported as missing.
- ``read_regular(path, max_bytes)`` reads a whole (capped) regular file.
- ``atomic_write(path, inputs)`` writes through a temporary file in the target directory and
  renames it over ``path`` only when everything was written; on any failure (an exception,
  Ctrl-C) the temporary file is removed and ``path`` is left as it was. It refuses an output that
  is one of its inputs (same inode) or an existing file that is not a regular file. Its temporary
  name holds the writer's pid, so a later write removes what a killed one left (``remove_stale``).
"""
from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path
from typing import BinaryIO, Iterator

from . import LLMLabError


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def not_regular(path, st: os.stat_result) -> LLMLabError:
    if stat.S_ISDIR(st.st_mode):
        return LLMLabError(f"{path}: is a directory, not a file")
    return LLMLabError(f"{path}: is not a regular file ({_kind(st.st_mode)})")


def open_regular(path) -> BinaryIO:
    """A read-only binary file object for ``path``, which must be a regular file."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0) \
        | getattr(os, "O_BINARY", 0)          # Windows: without it the C runtime turns CR LF into LF
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise LLMLabError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise LLMLabError(f"{path}: is a directory, not a file") from None
    except OSError as e:
        raise LLMLabError(f"{path}: cannot open: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise not_regular(path, st)
        if hasattr(os, "O_NONBLOCK"):              # opened non-blocking (a FIFO must not hang the open)
            os.set_blocking(fd, True)              # reads of the regular file then block as usual
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path, max_bytes: int) -> bytes:
    """The bytes of a regular file of at most ``max_bytes`` (checked before and while reading)."""
    with open_regular(path) as fh:
        size = os.fstat(fh.fileno()).st_size
        if size > max_bytes:
            raise LLMLabError(f"{path}: {size:,} bytes is over the {max_bytes:,}-byte limit")
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:    # grew while we read
        raise LLMLabError(f"{path}: over the {max_bytes:,}-byte limit")
    return data


def check_output(path, inputs=()) -> None:
    """Refuse to write ``path`` over one of ``inputs`` or over something that is not a regular file."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        parent = Path(path).resolve().parent
        if not parent.is_dir():
            raise LLMLabError(f"{path}: directory {str(parent)!r} does not exist") from None
        return
    except OSError as e:
        raise LLMLabError(f"{path}: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise LLMLabError(f"{path}: output exists and is {_kind(st.st_mode)}; refusing to replace it")
    for src in inputs:
        try:
            s = os.stat(src)
        except OSError:
            continue
        if (s.st_dev, s.st_ino) == (st.st_dev, st.st_ino):
            raise LLMLabError(f"{path}: output is the input file {str(src)!r}; write to another path")


@contextlib.contextmanager
def atomic_write(path, inputs=()) -> Iterator[BinaryIO]:
    """Write ``path`` through a temporary file beside it, renamed over ``path`` at the end."""
    path = Path(path)
    if path.is_symlink() and Path(os.path.realpath(path)).exists():
        path = Path(os.path.realpath(path))           # write where the link points, keep the link
    check_output(path, inputs)
    remove_stale(path.resolve().parent, f".{path.name}.", ".tmp")
    fd, tmp = tempfile.mkstemp(dir=path.resolve().parent, prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp")
    try:
        umask = os.umask(0)
        os.umask(umask)
        if hasattr(os, "fchmod"):                      # the mode a plain open() would give (POSIX;
            os.fchmod(fd, 0o666 & ~umask)              # Windows has no such modes before 3.13)
        with os.fdopen(fd, "wb") as fh:
            fd = -1
            yield fh
        check_output(path, inputs)                     # still nothing in the way
        os.replace(tmp, path)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale(directory, prefix: str, suffix: str = "", sep: str = ".") -> None:
    """Remove what killed processes left in ``directory``: entries named ``prefix + PID + sep + ... + suffix``
    whose PID no longer runs (a file, or a folder with what it holds)."""
    import glob
    import shutil
    for p in Path(directory).glob(glob.escape(prefix) + "*" + glob.escape(suffix)):
        pid = p.name[len(prefix):].split(sep, 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    p.unlink()


def printable(text) -> str:
    """``text`` with what a terminal would act on escaped (control and format characters, line and
    paragraph separators: ESC, BEL, CR, U+202E ...) as ``\\xNN`` / ``\\uNNNN``: for strings from a file
    (tensor and key names, template messages) printed as text, so a file cannot rewrite the screen."""
    s = str(text)
    if s.isprintable():
        return s
    return "".join(c if c.isprintable() or c == " " else _escape(c) for c in s)


def _escape(c: str) -> str:
    o = ord(c)
    return f"\\x{o:02x}" if o < 0x100 else (f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}")
