"""Only optional third-party oracles may skip; under ``make test`` (LLMLAB_REQUIRE_ORACLES=1) such a skip fails."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).parent

MISSING_ORACLE = '''
import sys
import pytest

def test_needs_llama_cpp():
    sys.modules["llama_cpp"] = None            # as if llama-cpp-python were not installed
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (optional oracle)")
'''


def _run(tmp_path, require: bool) -> subprocess.CompletedProcess:
    (tmp_path / "test_missing.py").write_text(MISSING_ORACLE)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), str(TESTS.parent)]))
    env.pop("LLMLAB_REQUIRE_ORACLES", None)
    if require:
        env["LLMLAB_REQUIRE_ORACLES"] = "1"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "conftest", "-p", "no:cacheprovider",
                           str(tmp_path / "test_missing.py")], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=120)


def test_a_missing_oracle_skips_with_its_reason(tmp_path):
    r = _run(tmp_path, require=False)
    assert r.returncode == 0 and "1 skipped" in r.stdout
    assert "llama-cpp-python is not installed (optional oracle)" in r.stdout


def test_a_missing_oracle_fails_when_oracles_are_required(tmp_path):
    r = _run(tmp_path, require=True)
    assert r.returncode == 1 and "1 failed" in r.stdout
    assert "oracle missing under LLMLAB_REQUIRE_ORACLES" in r.stdout
