"""``python -m llmlab doctor`` and the fallbacks it reports on: here, with Graphviz's ``dot`` hidden
from PATH, without CJK/emoji fonts; graphs drawn without ``dot``, figures without CJK fonts."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from llmlab import doctor
from llmlab.cli import main

ROOT = Path(__file__).resolve().parent.parent


def _env(**extra) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def test_doctor_on_this_machine(capsys):
    rc = main(["doctor"])
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("llmlab doctor: ")
    for name in ("python", "numpy", "numba", "matplotlib", "ipywidgets", "jupyterlab", "dot", "fonts_cjk",
                 "fonts_emoji", "cpu", "llama_cpp", "numba_cache", "threads", "threading"):
        assert any(re.match(rf"(ok|warn|missing) +{name} ", line) for line in lines), name
    rc_json = main(["doctor", "--json"])
    rep = json.loads(capsys.readouterr().out)          # strict JSON: one object
    assert rc == rc_json == rep["exit_code"]
    assert rep["ok"] == (not rep["missing"]) and rep["exit_code"] == (doctor.EXIT_MISSING if rep["missing"] else 0)
    checks = rep["checks"]
    assert checks["python"]["status"] == "ok" and checks["numpy"]["status"] == "ok"
    assert checks["cpu"]["data"]["profile"] in ("avx2", "avx512") and checks["cpu"]["data"]["machine"]
    assert isinstance(checks["threads"]["data"]["threads"], int) and checks["threads"]["data"]["threads"] >= 1
    assert "writable" in checks["numba_cache"]["data"]
    layer = checks["threading"]["data"]              # numba's threading layer, and those that load here
    assert layer["layer"] in layer["available"] and "workqueue" in layer["available"]
    assert checks["threading"]["status"] == ("ok" if layer["layer"] in ("omp", "tbb") else "warn")
    if shutil.which("dot"):
        assert checks["dot"]["status"] == "ok" and checks["dot"]["data"]["version"]
    if not rep["missing"]:                              # this project's machines: everything required is here
        assert rc == 0 and lines[-1].startswith("ready")


def test_doctor_without_dot_exits_non_zero_and_names_graphviz():
    dot = shutil.which("dot")
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                           if p and not (dot and Path(p, Path(dot).name).exists()))
    p = subprocess.run([sys.executable, "-m", "llmlab", "doctor", "--json"], capture_output=True, text=True,
                       env=_env(PATH=path), timeout=300)
    rep = json.loads(p.stdout)
    assert p.returncode == doctor.EXIT_MISSING == rep["exit_code"] == 1, p.stderr
    assert "dot" in rep["missing"] and rep["checks"]["dot"]["status"] == "missing"
    assert "graphviz" in rep["checks"]["dot"]["hint"].lower()
    # the command line alone does not need dot: a warning, exit 0 (when nothing else is missing)
    p = subprocess.run([sys.executable, "-m", "llmlab", "doctor", "--cli"], capture_output=True, text=True,
                       env=_env(PATH=path), timeout=300)
    assert re.search(r"^warn +dot ", p.stdout, re.M) and "graphviz" in p.stdout
    assert p.returncode == (1 if re.search(r"^missing ", p.stdout, re.M) else 0)


def test_doctor_without_fonts_warns_and_passes(monkeypatch, capsys):
    from llmlab.viz import fonts
    monkeypatch.setattr(fonts, "matplotlib_families", lambda refresh=True: {"DejaVu Sans"})
    monkeypatch.setattr(fonts, "_system_fonts", lambda: [])
    rep = doctor.report()
    cjk, emoji = rep["checks"]["fonts_cjk"], rep["checks"]["fonts_emoji"]
    assert cjk["status"] == emoji["status"] == "warn" and not cjk["required"]
    assert cjk["hint"] == doctor.hint("fonts-cjk") and emoji["hint"] == doctor.hint("fonts-emoji")
    assert "fonts_cjk" not in rep["missing"] and "fonts_cjk" in rep["warnings"]
    monkeypatch.setattr(doctor, "report", lambda lab=True: rep)
    rc = main(["doctor"])
    out = capsys.readouterr().out
    assert re.search(r"^warn +fonts_cjk .*\n +-> " + re.escape(doctor.hint("fonts-cjk")), out, re.M)
    assert rc == rep["exit_code"]


def test_one_hint_per_os():
    assert doctor.hint("dot", "linux", conda=False) == "sudo apt-get install graphviz"
    assert doctor.hint("dot", "macos", conda=False) == "brew install graphviz"
    assert doctor.hint("dot", "windows", conda=False).startswith("winget install Graphviz.Graphviz")
    assert doctor.hint("dot", "windows", conda=True) == "conda install -c conda-forge graphviz"
    assert "python@3.12" in doctor.hint("python", "macos", conda=False)
    assert "Python.Python.3.12" in doctor.hint("python", "windows", conda=False)
    assert doctor.hint("fonts-cjk", "linux", conda=False) == "sudo apt-get install fonts-noto-cjk"
    assert doctor.hint("numpy", "macos", conda=False).startswith('python -m pip install "numpy>=1.26"')


def test_minimum_versions_match_pyproject():
    text = (ROOT / "pyproject.toml").read_text()
    for dist, minimum, _, _ in doctor.PACKAGES:
        assert f'"{dist}>={minimum}"' in text, dist
    assert f'requires-python = ">={".".join(map(str, doctor.MIN_PYTHON))}"' in text


def test_render_without_dot_is_a_message_and_a_static_drawing(monkeypatch):
    from llmlab.ggml import graphviz as gdot
    from llmlab.ggml import graphviz_fallback
    text = textwrap.dedent("""\
        digraph G { rankdir=TB; node [shape=box, style="rounded,filled"]; // a comment
          a [label="x\\nleaf", fillcolor="#fddbc7", shape=ellipse];
          b [label="silu", fillcolor="#80cdc1"]; c [label="out"];
          subgraph cluster_0 { label="split 0"; b; }
          a -> b -> c; a -> c [style=dashed, constraint=false, label="skip"];
        }""")
    g = graphviz_fallback.parse(text)
    assert list(g.nodes) == ["a", "b", "c"] and g.nodes["a"]["label"] == "x\nleaf"
    assert [(a, b) for a, b, _ in g.edges] == [("a", "b"), ("b", "c"), ("a", "c")] and g.attrs["rankdir"] == "TB"
    assert {n: r for n, (r, _) in graphviz_fallback.layout(g).items()} == {"a": 0, "b": 1, "c": 2}
    monkeypatch.setattr(gdot, "has_dot", lambda: False)
    out = gdot.render(text)
    assert isinstance(out, str) and "\n" not in out             # one line, printable anywhere
    assert "not installed" in out and "3 edges" in out and doctor.hint("dot") in out
    html = out._repr_html_()
    assert html.count("<svg") == 1 and "not installed" in html


def test_notebook_graphs_without_dot(monkeypatch):
    from llmlab import nb
    from llmlab.ggml import graphviz as gdot
    from llmlab.viz import overview
    monkeypatch.setattr(gdot, "has_dot", lambda: False)
    html = nb.graph("digraph { a -> b; b -> c; }", "no-dot-test").data
    assert "not installed" in html and "<svg" in html
    monkeypatch.setattr(overview.shutil, "which", lambda name, *a, **k: None)
    html = overview.pipeline_graph()._repr_html_()
    assert "not installed" in html and "<svg" in html and "digraph pipeline" in html


def test_figures_without_cjk_fonts_have_no_boxes():
    """In a fresh process whose matplotlib has only DejaVu: no "Glyph missing" warning, the
    characters drawn as escapes, one note for the whole process."""
    script = textwrap.dedent("""\
        import io, warnings
        warnings.simplefilter("error")
        import matplotlib
        matplotlib.use("Agg")
        matplotlib.rcParams["font.family"] = ["DejaVu Sans"]
        import matplotlib.pyplot as plt
        from llmlab.viz import fonts
        fonts.guard_missing_glyphs([])
        for k in range(2):
            fig, ax = plt.subplots()
            ax.set_title("苹果 🙂 apple")
            ax.set_xticks([0, 1], ["它", "the"])
            fig.savefig(io.BytesIO(), format="png")
            svg = io.StringIO()
            fig.savefig(svg, format="svg")
            plt.close(fig)
        print("drawn", fonts.drawable("苹果🙂", matplotlib.font_manager.FontProperties(family="DejaVu Sans")))
        """)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=_env(), timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("fonts: no installed font has") == 1 and "`python -m llmlab doctor`" in p.stdout
    assert "drawn ('\\\\u82f9\\\\u679c\\\\U0001f642', '苹果🙂')" in p.stdout
    assert "Glyph" not in p.stderr


def test_missing_required_package_exits_1_with_its_hint(monkeypatch):
    real = doctor._version
    monkeypatch.setattr(doctor, "_version", lambda dist: None if dist == "numba" else real(dist))
    rep = doctor.report()
    assert "numba" in rep["missing"] and rep["exit_code"] == 1 and not rep["ok"]
    assert rep["checks"]["numba"]["hint"] == doctor.hint("numba") and "numba>=0.60" in rep["checks"]["numba"]["hint"]


def test_module_doctor_runs_where_numpy_and_numba_do_not_import():
    """``python -m llmlab.doctor`` still reports (and says what fails) when the heavy packages are broken."""
    script = ("import sys\n"
              "for m in ('numpy', 'numba', 'matplotlib', 'llama_cpp'): sys.modules[m] = None\n"
              "from llmlab import doctor\n"
              "sys.exit(doctor.main(['--json', '--cli']))\n")
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=_env(), timeout=120)
    rep = json.loads(p.stdout)
    assert p.returncode == rep["exit_code"], p.stderr
    assert rep["checks"]["cpu"]["status"] == "warn" and rep["checks"]["numba_cache"]["status"] == "warn"
    assert rep["checks"]["python"]["status"] == "ok"


# ---- the room check: one line per learner machine

def test_room_is_one_line_a_teacher_can_collect():
    r = subprocess.run([sys.executable, "-m", "llmlab", "doctor", "--room", "--cli"], capture_output=True, text=True,
                       timeout=600, cwd=ROOT, env=_env())
    lines = r.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("llmlab-room host="), r.stdout + r.stderr
    fields = dict(kv.split("=", 1) for kv in lines[0][len("llmlab-room "):].split("; "))
    assert list(fields) == list(doctor.ROOM_FIELDS)
    assert fields["profile"] in ("avx2", "avx512") and fields["threading"] in ("tbb", "omp", "workqueue")
    assert fields["kernels"].split()[0] in ("warm", "cold", "stale") and fields["oracle"]
    assert r.returncode == (0 if fields["ready"] == "yes" else doctor.EXIT_MISSING)
    j = subprocess.run([sys.executable, "-m", "llmlab", "doctor", "--room", "--cli", "--json"], capture_output=True,
                       text=True, timeout=600, cwd=ROOT, env=_env())
    rec = json.loads(j.stdout)
    assert list(rec) == list(doctor.ROOM_FIELDS) and rec["profile"] == fields["profile"]


@pytest.mark.parametrize("probe, want", [
    ("import os, signal; os.kill(os.getpid(), signal.SIGILL)", "crashes (SIGILL)"),
    ("print('info AVX2 = 1 | AMX_INT8 = 1 |')\nimport os, signal; os.kill(os.getpid(), signal.SIGILL)",
     "crashes (SIGILL, AMX)"),
    ("raise SystemExit('llama.cpp: bad build')", "fails (llama.cpp: bad build)"),
    ("print('info AVX2 = 1 |')", "runs (loaded; no cached model to decode)"),
])
def test_room_reports_a_crashing_oracle_as_a_state_not_a_crash(monkeypatch, probe, want):
    if not hasattr(__import__("signal"), "SIGILL") or sys.platform == "win32":
        pytest.skip("POSIX signals")
    monkeypatch.setattr(doctor, "_missing", lambda *m: [])
    monkeypatch.setattr(doctor, "_ORACLE_PROBE", probe)
    monkeypatch.setenv("LLMLAB_HOME", "/nonexistent/llmlab-home")      # no cached model: no decode argument
    assert doctor.oracle_state(timeout=60)[0] == want


def test_room_says_what_the_kernel_cache_holds(monkeypatch, tmp_path):
    import numba
    monkeypatch.setenv("LLMLAB_KERNEL_TARGET", "host")         # numba's own cache, not the shipped kernels
    monkeypatch.setattr(numba.config, "CACHE_DIR", str(tmp_path / "empty"))
    text, data = doctor.kernel_cache_state()
    assert text.startswith("cold (0 kernel entries") and data["state"] == "cold"
