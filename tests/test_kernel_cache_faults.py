"""Faults of numba's kernel cache and of numba's environment never stop a command: a full or read-only cache
folder, a damaged stamp, a NUMBA_NUM_THREADS numba refuses. The command runs (kernels compiled in memory)
and says so in one line; ``--version``, ``doctor`` and ``nb.setup`` run; ``doctor`` names the cause.

The faults are injected into a child process by ``tests/faults/sitecustomize.py`` (no root, no real full
disk needed)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FAULTS = Path(__file__).resolve().parent / "faults"

KERNEL = textwrap.dedent("""
    import llmlab.ggml.cpu.fast               # the fast kernels install the guard
    from numba import njit

    @njit(cache=True)
    def twice(x):
        return 2 * x

    print(twice(21))
""")


def run(tmp_path, *args, fault: str = "", code: str | None = None, **env):
    """``python -m llmlab ARGS`` (or ``python -c CODE``) with the cache in tmp_path/cache and ``fault`` injected."""
    e = {k: v for k, v in os.environ.items() if not k.startswith(("NUMBA_", "FAULT_"))}
    e.update(PYTHONPATH=os.pathsep.join([str(FAULTS), str(ROOT), str(tmp_path)]), FAULT_INJECT=fault,
             NUMBA_CACHE_DIR=str(tmp_path / "cache"), LLMLAB_HOME=str(tmp_path / "home"), **env)
    cmd = [sys.executable, "-c", code] if code is not None else [sys.executable, "-m", "llmlab", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=e, cwd=tmp_path, timeout=300)


def one_note(stderr: str, *words: str) -> None:
    """Exactly one line, llmlab's note about the cache, naming the cause."""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("llmlab: the kernel cache"), stderr
    assert all(w in lines[0] for w in words), stderr
    assert "Traceback" not in stderr


def doctor(tmp_path, **kw) -> dict:
    p = run(tmp_path, "doctor", "--json", "--cli", **kw)
    rep = json.loads(p.stdout)
    assert p.returncode == rep["exit_code"] and "Traceback" not in p.stderr, p.stderr
    return rep


def leftovers(folder: Path) -> list[Path]:
    """Files a fault left half-written: empty stamps, numba's or llmlab's temporary files."""
    return [p for p in folder.rglob("*") if p.is_file() and (".tmp" in p.name or p.stat().st_size == 0)]


def test_a_full_cache_disk_does_not_stop_version_doctor_or_a_kernel(tmp_path):
    full = f"enospc:{tmp_path / 'cache'}"
    p = run(tmp_path, "--version", fault=full)
    assert p.returncode == 0 and p.stdout.strip().startswith("llmlab "), p.stderr
    one_note(p.stderr, "cannot be used", "No space left on device", str(tmp_path / "cache"))
    assert leftovers(tmp_path / "cache") == []          # no empty llmlab-kernel-sources.sha1 behind
    (tmp_path / "kernel_mod.py").write_text(KERNEL)
    k = run(tmp_path, code="import kernel_mod", fault=full)
    assert k.returncode == 0 and k.stdout.strip() == "42", k.stderr
    one_note(k.stderr, "No space left on device")
    assert leftovers(tmp_path / "cache") == []
    rep = doctor(tmp_path, fault=full)
    c = rep["checks"]["numba_cache"]
    assert c["status"] == "warn" and not c["data"]["writable"] and "No space left" in c["data"]["problem"]


def test_a_disk_that_fills_while_caching_names_the_cache(tmp_path):
    """The stamp fits, the kernels' files do not: the kernel runs, one line says the cache could not be written."""
    (tmp_path / "kernel_mod.py").write_text(KERNEL)
    k = run(tmp_path, code="import kernel_mod", fault=f"enospc-data:{tmp_path / 'cache'}")
    assert k.returncode == 0 and k.stdout.strip() == "42", k.stderr
    one_note(k.stderr, "cannot be written", "No space left on device")
    assert [p for p in (tmp_path / "cache").rglob("*") if ".tmp" in p.name] == []
    again = run(tmp_path, code="import kernel_mod")          # space again: cached as usual, silently
    assert again.returncode == 0 and again.stdout.strip() == "42" and again.stderr == "", again.stderr


def test_a_stamp_that_is_not_text_is_replaced(tmp_path):
    first = run(tmp_path, "--version")
    assert first.returncode == 0 and first.stderr == "", first.stderr
    stamps = list((tmp_path / "cache").rglob("llmlab-kernel-sources.sha1"))
    assert stamps
    for s in stamps:
        s.write_bytes(b"\xff\xfe\x00garbage\x80")
    p = run(tmp_path, "--version")
    assert p.returncode == 0 and p.stderr == "", p.stderr
    for s in stamps:
        assert s.read_bytes().strip().isascii() and len(s.read_bytes().strip()) == 40
    assert doctor(tmp_path)["checks"]["numba_cache"]["status"] == "ok"


def test_everything_read_only_compiles_without_a_cache(tmp_path):
    """No folder numba could cache in (the install, HOME, NUMBA_CACHE_DIR, LLMLAB_HOME all read-only): numba's
    ``cache=True`` would raise 'no locator available' while the kernels are defined."""
    p = run(tmp_path, "--version", fault="readonly")
    assert p.returncode == 0 and p.stdout.strip().startswith("llmlab "), p.stderr
    assert p.stderr == "" or len(p.stderr.splitlines()) == 1 and "Read-only file system" in p.stderr, p.stderr
    (tmp_path / "kernel_mod.py").write_text(KERNEL)       # a kernel with no cache anywhere (no warm copy either)
    k = run(tmp_path, code="import kernel_mod", fault="readonly")
    assert k.returncode == 0 and k.stdout.strip() == "42", k.stderr
    one_note(k.stderr, "cannot be used", "no folder numba can cache kernels in", "Read-only file system")
    rep = doctor(tmp_path, fault="readonly")
    c = rep["checks"]["numba_cache"]
    assert c["status"] == "warn" and "Read-only file system" in c["data"]["problem"]


@pytest.mark.parametrize("value", ["0", "-3", "two"])
def test_a_numba_thread_count_numba_refuses_is_set_aside(tmp_path, value):
    p = run(tmp_path, "--version", NUMBA_NUM_THREADS=value)
    assert p.returncode == 0 and p.stdout.strip().startswith("llmlab "), p.stderr
    assert p.stderr.strip().splitlines() == [f"llmlab: NUMBA_NUM_THREADS={value!r} is not a positive integer: "
                                             f"ignored (numba's default thread pool is used)"]
    if value != "0":
        return                                   # doctor is the same for every refused value
    rep = doctor(tmp_path, NUMBA_NUM_THREADS=value)
    t = rep["checks"]["threads"]
    assert t["status"] == "warn" and "NUMBA_NUM_THREADS" in t["summary"] and t["data"]["numba_pool"] >= 1


def test_nb_setup_runs_under_the_faults(tmp_path):
    code = "from llmlab import nb; nb.setup(models=(), quiet=True); print('set up')"
    for fault, env in ((f"enospc:{tmp_path / 'cache'}", {}), ("readonly", {}), ("", {"NUMBA_NUM_THREADS": "0"})):
        p = run(tmp_path, code=code, fault=fault, MPLCONFIGDIR=str(tmp_path / "mpl"), **env)
        assert p.returncode == 0 and p.stdout.strip().endswith("set up"), (fault, env, p.stderr)
        assert "Traceback" not in p.stderr


def test_a_fault_while_the_commands_load_is_one_error_line(monkeypatch, capsys):
    """Whatever breaks while the commands' modules load (before a command runs) is one ``error:`` line, exit 2."""
    from llmlab import cli

    def broken():
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(cli, "build_parser", broken)
    assert cli.main(["--version"]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == ["error: [Errno 28] No space left on device"]


WARM_HERE = textwrap.dedent("""
    import sys
    from pathlib import Path
    from llmlab.ggml.cpu import numba_cache
    folders = numba_cache._kernel_folders() + [Path.cwd().resolve()]   # this folder's kernel: one of llmlab's
    numba_cache._kernel_folders = lambda: folders
    if sys.argv[1:] == ["stamp"]:
        numba_cache.drop_stale()
    import kernel_mod
""")


def test_a_warm_read_only_cache_is_loaded_not_compiled(tmp_path):
    """A read-only machine image whose kernels were warmed (and stamped) when it was built: numba's own locators
    want to write, so llmlab's last one loads from it; nothing compiles, nothing is said."""
    (tmp_path / "kernel_mod.py").write_text(KERNEL)
    warm = run(tmp_path, code=WARM_HERE.replace("sys.argv[1:]", "['stamp']"))
    assert warm.returncode == 0 and warm.stdout.strip() == "42" and warm.stderr == "", warm.stderr
    assert list((tmp_path / "cache").rglob("kernel_mod.twice-*.nbc"))
    p = run(tmp_path, code=WARM_HERE.replace("sys.argv[1:]", "[]") + "\nprint(kernel_mod.twice.stats.cache_hits)",
            fault="readonly")
    assert p.returncode == 0 and p.stderr == "", p.stderr
    out = p.stdout.split()
    assert out[0] == "42" and out[1] != "Counter()", p.stdout          # loaded from the cache
