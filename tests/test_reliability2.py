"""The second round of reliability fixes (issue 26), library side: stale temporaries, progress lines on
Ctrl-C, library misuse (detokenize, Context, positions), batches refused before the cache changes."""
from __future__ import annotations

import io
import subprocess
import sys

import pytest

from llmlab import LLMLabError


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_atomic_write_removes_what_a_killed_writer_left_and_nothing_else(tmp_path):
    from llmlab.safeio import atomic_write
    out = tmp_path / "out.gguf"
    stale = tmp_path / f".out.gguf.{dead_pid()}.k2j3.tmp"
    live = tmp_path / f".out.gguf.1.x1.tmp"                   # pid 1 runs: not ours to remove
    other = tmp_path / ".other.gguf.123.tmp"
    for p in (stale, live, other):
        p.write_bytes(b"half")
    with atomic_write(out) as fh:
        fh.write(b"whole")
    assert out.read_bytes() == b"whole" and not stale.exists() and live.exists() and other.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([out.name, live.name, other.name])


def test_progress_bar_ends_its_line_when_interrupted():
    from llmlab.progress import Progress
    stream = io.StringIO()
    with pytest.raises(KeyboardInterrupt):
        with Progress(100, "quantize q8_0", stream=stream) as bar:
            bar.update(100)
            raise KeyboardInterrupt
    assert stream.getvalue().startswith("\rquantize q8_0") and stream.getvalue().endswith("\n")
    quiet = io.StringIO()
    with pytest.raises(KeyboardInterrupt):
        with Progress(100, "x", stream=quiet):
            raise KeyboardInterrupt            # nothing drawn: nothing written
    assert quiet.getvalue() == ""
