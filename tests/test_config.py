"""llmlab/config.py is the one home of the LLMLAB_* knobs: read nowhere else, read lazily, parsed strictly."""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmlab import config

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "llmlab"


def _env_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, source) of every read of the process environment: os.environ[...], os.environ.get/pop/
    setdefault/copy/items, os.getenv, ``in os.environ``, iteration over it, dict(os.environ)."""
    out = []
    for node in ast.walk(tree):
        text = None
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "environb", "getenv", "getenvb"):
            text = ast.unparse(node)
        elif isinstance(node, ast.Name) and node.id in ("environ", "getenv"):
            text = node.id
        if text is not None:
            out.append((node.lineno, text))
    return out


def _llmlab_names(tree: ast.AST) -> set[str]:
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and n.value.startswith("LLMLAB_") and n.value.rstrip("_").isidentifier()}


def test_llmlab_variables_are_read_only_in_config():
    """No module but config.py names an LLMLAB_* variable where it touches the environment (a module may
    read others, e.g. PYTHONPATH for a child process)."""
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "config.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if not _env_reads(tree):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Subscript, ast.Call, ast.Compare)):
                src = ast.unparse(node)
                if ("environ" in src or "getenv" in src) and "LLMLAB_" in src:
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}: {src[:100]}")
    assert not offenders, "LLMLAB_* read outside llmlab/config.py:\n" + "\n".join(offenders)
    # and config.py reads each knob the README lists
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    knobs = _llmlab_names(ast.parse((PACKAGE / "config.py").read_text(encoding="utf-8")))
    assert {"LLMLAB_HOME", "LLMLAB_CPU", "LLMLAB_THREADS", "LLMLAB_PARALLEL_MIN_WORK", "LLMLAB_DOT4",
            "LLMLAB_DEBUG"} <= knobs
    assert [k for k in sorted(knobs) if f"`{k}`" not in readme] == []


def test_importing_reads_no_knob():
    """Bad values everywhere: every module still imports (nothing is read at import time)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), LLMLAB_THREADS="x", LLMLAB_DOT4="sse", LLMLAB_CPU="sparc",
               LLMLAB_PARALLEL_MIN_WORK="1e3", LLMLAB_HOME="")
    code = ("import llmlab.cli, llmlab.nb, llmlab.models, llmlab.llama, llmlab.bench, llmlab.ggml.cpu.cplan\n"
            "import llmlab.ggml.cpu.fast.dispatch, llmlab.ggml.cpu.fast.dot4\n"
            "llmlab.cli.build_parser(); print('imported')")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "imported", r.stderr


@pytest.mark.parametrize("name, value, message", [
    ("LLMLAB_THREADS", "x", "LLMLAB_THREADS: 'x' is not an integer"),
    ("LLMLAB_THREADS", "٣", "LLMLAB_THREADS: '٣' is not an integer"),
    ("LLMLAB_THREADS", "0", "LLMLAB_THREADS: 0 must be >= 1"),
    ("LLMLAB_PARALLEL_MIN_WORK", "1_000", "LLMLAB_PARALLEL_MIN_WORK: '1_000' is not an integer"),
    ("LLMLAB_PARALLEL_MIN_WORK", "-1", "LLMLAB_PARALLEL_MIN_WORK: -1 must be >= 0"),
    ("LLMLAB_DOT4", "sse", "LLMLAB_DOT4: 'sse' is not one of 0, vnni, avx2"),
])
def test_bad_values_are_clear_errors(monkeypatch, name, value, message):
    monkeypatch.setenv(name, value)
    read = {"LLMLAB_THREADS": config.threads, "LLMLAB_PARALLEL_MIN_WORK": config.parallel_min_work,
            "LLMLAB_DOT4": config.dot4}[name]
    with pytest.raises(ValueError) as e:
        read()
    assert str(e.value).startswith(message), str(e.value)


def test_values(monkeypatch, tmp_path):
    for name in ("LLMLAB_THREADS", "LLMLAB_PARALLEL_MIN_WORK", "LLMLAB_DOT4", "LLMLAB_CPU", "LLMLAB_DEBUG"):
        monkeypatch.delenv(name, raising=False)
    assert config.parallel_min_work() == 1 << 18 and config.dot4() is None and config.cpu() is None
    assert config.debug() is False
    assert config.threads() == (config.default_threads(), "physical cores")
    assert config.threads(3) == (3, "as asked")
    for bad in (0, -1, True, 1.5, "2"):
        with pytest.raises(ValueError, match="threads must be a positive integer"):
            config.threads(bad)
    monkeypatch.setenv("LLMLAB_THREADS", " 3 ")
    monkeypatch.setenv("LLMLAB_PARALLEL_MIN_WORK", "2097152")
    monkeypatch.setenv("LLMLAB_DOT4", "AVX2")
    monkeypatch.setenv("LLMLAB_CPU", "Auto")
    monkeypatch.setenv("LLMLAB_DEBUG", "1")
    assert config.threads() == (3, "LLMLAB_THREADS") and config.parallel_min_work() == 2097152
    assert config.dot4() == "avx2" and config.cpu() is None and config.debug() is True
    monkeypatch.setenv("LLMLAB_CPU", "AVX512")
    assert config.cpu() == "avx512"


def test_home_expands_the_tilde(monkeypatch, tmp_path):
    """LLMLAB_HOME='~/x' is the x in the home folder, not a folder named '~' under the current one."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("LLMLAB_HOME", "~/x")
    assert config.home() == tmp_path / "x"
    from llmlab import models
    assert models.home() == tmp_path / "x"
    monkeypatch.delenv("LLMLAB_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert config.home() == tmp_path / "cache" / "llmlab"


def test_default_threads_counts_physical_cores(monkeypatch, tmp_path):
    """llama.cpp's cpu_get_num_math: hardware threads of one core count once; on a hybrid CPU only the
    performance cores count; capped by numba's pool."""
    import numba
    root = tmp_path / "cpu"
    for c, siblings in enumerate(["3", "3", "c", "c", "30", "c0"]):        # 2 cores x 2 threads, 2 x 1
        (root / f"cpu{c}" / "topology").mkdir(parents=True)
        (root / f"cpu{c}" / "topology" / "thread_siblings").write_text(siblings + "\n")
    real = config.Path

    def fake(p="", *a):
        p = str(p)
        if p == "/sys/devices/system/cpu":
            return real(root)
        if p == "/sys/devices/cpu_core/cpus":
            return real(tmp_path / "cpu_core")
        return real(p, *a)
    monkeypatch.setattr(config, "Path", fake)
    monkeypatch.setattr(numba.config, "NUMBA_NUM_THREADS", 64)
    assert config.default_threads() == 4
    (tmp_path / "cpu_core").write_text("0-3\n")                           # P-cores: cpus 0-3 (2 cores)
    assert config.default_threads() == 2
    monkeypatch.setattr(numba.config, "NUMBA_NUM_THREADS", 1)
    assert config.default_threads() == 1


@pytest.mark.parametrize("text, value", [("0", 0), ("-12", -12), ("+7", 7), (" 42 ", 42)])
def test_parse_int(text, value):
    assert config.parse_int(text) == value


@pytest.mark.parametrize("text", ["", "١٠", "1_0", "0x10", "1e3", "1.0", "٣", "inf", "--1", "1 2"])
def test_parse_int_refuses(text):
    with pytest.raises(ValueError, match="is not an integer"):
        config.parse_int(text)


@pytest.mark.parametrize("text, value", [("0", 0.0), ("0.8", 0.8), ("-1.5", -1.5), (".5", 0.5), ("1e-3", 1e-3),
                                         ("2.", 2.0), ("1E2", 100.0)])
def test_parse_float(text, value):
    assert config.parse_float(text) == value


@pytest.mark.parametrize("text", ["", "inf", "-infinity", "nan", "NaN", "1e999", "١.٥", "1_0.5", "0x1p3", "1,5", "."])
def test_parse_float_refuses(text):
    with pytest.raises(ValueError, match="is not a finite decimal number"):
        config.parse_float(text)
