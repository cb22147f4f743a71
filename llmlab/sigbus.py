"""SIGBUS while a model file is mapped: one ``error:`` line and exit status 2, not a silent death.

A model is read through a memory map. If the file is cut short while in use, touching a page past
its new end raises SIGBUS; Python's own handler only sets a flag and returns, so the faulting load
would run again forever, and the default action kills the process without a word. ``install()``
puts a small native handler in place (compiled by numba, async-signal-safe: ``write`` then
``_exit``). ``GGUFFile.check_unchanged`` catches most such changes between steps; this is for a
change in the middle of one.
"""
from __future__ import annotations

import ctypes
import signal

import numpy as np

MESSAGE = np.frombuffer(b"error: a model file was truncated or rewritten while in use "
                        b"(SIGBUS reading its memory map)\n", np.uint8)
EXIT_STATUS = 2
_HANDLER = None


def install() -> bool:
    """Install the handler (once per process); False where there is no SIGBUS or no libc to call."""
    global _HANDLER
    if _HANDLER is not None:
        return True
    if not hasattr(signal, "SIGBUS"):
        return False
    try:
        libc = ctypes.CDLL(None)
        write, exit_, set_handler = libc.write, libc._exit, libc.signal
    except (OSError, AttributeError):
        return False
    write.argtypes, write.restype = (ctypes.c_int, ctypes.c_size_t, ctypes.c_size_t), ctypes.c_ssize_t
    exit_.argtypes, exit_.restype = (ctypes.c_int,), None
    set_handler.argtypes, set_handler.restype = (ctypes.c_int, ctypes.c_void_p), ctypes.c_void_p
    from numba import cfunc, types

    msg, status = MESSAGE, EXIT_STATUS

    @cfunc(types.void(types.intc))
    def on_sigbus(signum):
        write(2, msg.ctypes.data, msg.size)
        exit_(status)

    _HANDLER = on_sigbus            # kept alive: the native code must outlive the process's last fault
    set_handler(signal.SIGBUS, on_sigbus.address)
    return True
