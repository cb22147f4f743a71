"""One exclusive lock on a file, on every OS: ``fcntl.flock`` on POSIX, ``msvcrt.locking`` on Windows.

Both are released by the OS when the process ends, however it ends (a killed ``fetch`` leaves no lock
behind), so no stale-lock cleanup is needed. Used by ``fetch`` (two downloads of one model wait for
each other) and anything else that must not run twice at once on one file.
"""
from __future__ import annotations

import contextlib
import os
import time
from typing import Iterator


@contextlib.contextmanager
def exclusive(lock_path, poll: float = 0.1) -> Iterator[None]:
    """Hold an exclusive lock on ``lock_path`` (created if missing) for the block; waits while
    another process holds it."""
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOINHERIT", 0),
                 0o644)
    try:
        _acquire(fd, poll)
        yield
    finally:
        os.close(fd)             # closing the descriptor releases the lock (both OSes)


def _acquire(fd: int, poll: float) -> None:
    try:
        import fcntl
    except ModuleNotFoundError:          # Windows
        import msvcrt
        # msvcrt.LK_LOCK gives up after 10 s; a fetch can hold the lock for minutes: poll without a limit.
        # The lock is one byte at offset 0 (past the end of an empty file is allowed on Windows).
        os.lseek(fd, 0, os.SEEK_SET)
        while True:
            try:
                msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
                return
            except OSError:
                time.sleep(poll)
    fcntl.flock(fd, fcntl.LOCK_EX)
