"""A damaged numba cache (index or data files cut short or overwritten) is found, removed, said in one
line, and the kernels compiled again: the command still succeeds, and the next run uses the new cache."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# a cached kernel in a module of its own (compiled in a second or two), next to llmlab's fast kernels
KERNEL = textwrap.dedent("""
    import llmlab.ggml.cpu.fast               # the fast kernels install the guard
    from numba import njit

    @njit(cache=True)
    def twice(x):
        return 2 * x

    print(twice(21))
""")


def run(tmp_path):
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}", "NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    return subprocess.run([sys.executable, "-c", "import kernel_mod"], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=120)


@pytest.mark.parametrize("damage", ["truncate_index", "truncate_data", "garbage_data", "empty_index"])
def test_a_damaged_cache_is_rebuilt_with_one_line(tmp_path, damage):
    (tmp_path / "kernel_mod.py").write_text(KERNEL)
    first = run(tmp_path)
    assert first.returncode == 0 and first.stdout.strip() == "42" and first.stderr == "", first.stderr
    files = sorted((tmp_path / "cache").rglob("*.nb*"))
    index = next(p for p in files if p.suffix == ".nbi")
    data = next(p for p in files if p.suffix == ".nbc")
    target = index if "index" in damage else data
    raw = target.read_bytes()
    target.write_bytes({"truncate_index": raw[:len(raw) // 2], "truncate_data": raw[:len(raw) // 2],
                        "garbage_data": b"\x80\x04garbage" * 10, "empty_index": b""}[damage])
    second = run(tmp_path)
    assert second.returncode == 0 and second.stdout.strip() == "42", second.stderr
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("llmlab: numba's cache of compiled kernels is damaged"), second.stderr
    third = run(tmp_path)                       # the cache was written again, and reads
    assert third.returncode == 0 and third.stdout.strip() == "42" and third.stderr == "", third.stderr
