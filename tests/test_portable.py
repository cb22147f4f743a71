"""llmlab on an OS without POSIX: every module imports and the first commands run with ``fcntl``,
``resource``, ``os.fork`` and /proc hidden (what Windows lacks), and text goes out as UTF-8 there.
The real Windows interpreter runs in ``make test-windows`` (tools/windows/, under Wine)."""
from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

from llmlab import cli

ROOT = Path(__file__).resolve().parent.parent
PROBE = Path(__file__).with_name("posix_hidden_probe.py")


def test_every_module_imports_and_commands_run_without_posix_only_modules(tmp_path):
    home = tmp_path / "Zoë's models"     # a space, an apostrophe and a non-ASCII letter, as in C:\Users\Zoë
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LLMLAB_HOME": str(home)}
    p = subprocess.run([sys.executable, str(PROBE), "models"], capture_output=True, text=True, env=env, cwd=ROOT,
                       timeout=600)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    assert "FAIL" not in p.stdout
    assert p.stdout.rstrip().splitlines()[-1].startswith("ok ")
    assert "ran models: exit 0" in p.stdout


def test_text_goes_out_as_utf8_on_a_windows_pipe(monkeypatch):
    raw = io.BytesIO()
    pipe = io.TextIOWrapper(raw, encoding="cp1252")          # what a pipe gets on Windows
    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.setattr(sys, "stdout", pipe)
    cli.utf8_output()
    print("Zoë 你好 ▁tok", file=sys.stdout)
    sys.stdout.flush()
    assert raw.getvalue().decode("utf-8").splitlines() == ["Zoë 你好 ▁tok"]


def test_utf8_output_leaves_other_systems_alone(monkeypatch):
    pipe = io.TextIOWrapper(io.BytesIO(), encoding="latin-1")
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(sys, "stdout", pipe)
    cli.utf8_output()
    assert sys.stdout.encoding == "latin-1"
