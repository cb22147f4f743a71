"""``python -m llmlab``: Ctrl-C (and SIGTERM) is handled before anything heavy is imported (exit 130, one line)."""
import os
import signal


def _interrupted(signum, frame):          # until the CLI takes over: nothing to clean up yet
    os.write(2, b"interrupted\n")
    os._exit(130)


for _name in ("SIGINT", "SIGTERM", "SIGBREAK"):    # SIGTERM (and Windows' Ctrl-Break) as Ctrl-C is, where it exists
    if hasattr(signal, _name):
        signal.signal(getattr(signal, _name), _interrupted)

import sys  # noqa: E402

from .cli import main  # noqa: E402

code = main()
# Leave at once, whatever the code: Python's own shutdown restores the default SIGINT action, so a Ctrl-C in
# its last milliseconds would kill the process with no line; nothing of llmlab's runs at exit (no atexit),
# and an interrupted run must not wait for worker threads.
for stream in (sys.stdout, sys.stderr):
    try:
        stream.flush()
    except (OSError, ValueError):
        pass
os._exit(code)
