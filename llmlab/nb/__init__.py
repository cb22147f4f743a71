"""The notebooks' shared set-up: one call at the top of each notebook.

    from llmlab import nb
    nb.setup(models=["smollm2"])          # fonts, figure defaults, threads, models, versions, CPU

``setup`` fetches the models it is given (a progress bar on first use, then the cache), sets the
engine's thread count, optionally warms the compiled kernels with one visible line, sets
matplotlib's defaults (a dpi and text sizes that a projector shows legibly, CJK and emoji
fallback fonts) and prints the versions and the
CPU's SIMD profile. ``has_oracle`` lets a cell that compares with llama.cpp say in one line that it
skips when llama-cpp-python is missing. ``live`` wires widgets to a view that renders once, in
one place, whether a widget front-end is present or not (see its docstring).
"""
from __future__ import annotations

import base64
import importlib.util
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

from .. import config
from ..viz import fonts as _fonts

# A notebook's kernel shares the learner's cores with the browser and everything else. GNU OpenMP (numba's
# "omp" threading layer) spins 300,000 times at the end of each parallel region before it sleeps, and beside
# one busy process a spinning thread burns the time slice of the thread it waits for: notebook 00's decode
# fell to 2 tok/s in a Jupyter kernel (75 with threads that sleep at once; AMD EPYC, 2 cores). So threads
# here wait passively, as llama.cpp's threadpool soon sleeps on a condition variable. It costs about a quarter
# of the quiet decode speed, which the command-line tools keep. libgomp reads this when numba first starts
# its threads, so it is set on importing llmlab.nb, the notebooks' first line; a value the user set wins.
if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
from ..viz.live import figure_png, live  # noqa: F401  (re-exported)

ROOT = Path(__file__).resolve().parent.parent.parent          # the folder llmlab is imported from
# the checkout llmlab runs from, or None where it is installed (site-packages: Colab, a hub, a wheel)
CHECKOUT = ROOT if (ROOT / "pyproject.toml").is_file() and (ROOT / "notebooks").is_dir() else None

# fonts tried after matplotlib's default, so Chinese text and emoji do not print as boxes (Linux, macOS, Windows)
FALLBACK_FONTS = list(_fonts.FALLBACK_FONTS)
# Projector-sized figures: a figure of at most 10 inches is at most 1000 px wide, so a 1024 px projector
# shows it (nearly) 1:1, and text of FIGURE_MIN_FONT points is about 14 px high, whatever a plot asked for.
FIGURE_DPI = 100
FIGURE_FONT = 12            # rcParams["font.size"]: titles, labels, ticks and legends are relative to it
FIGURE_MIN_FONT = 10        # the floor under every text size (llmlab.viz.fonts.set_min_size)

ORACLES = {"llama_cpp": "llama-cpp-python", "gguf": "gguf (gguf-py)"}


# ---------------------------------------------------------------- figures and fonts

def set_matplotlib_defaults(dpi: int = FIGURE_DPI, font_size: float = FIGURE_FONT,
                            min_font_size: float = FIGURE_MIN_FONT) -> list[str]:
    """A dpi and text sizes a projector shows legibly (no text under ``min_font_size`` points,
    whatever a plot asks for), and a fallback list of installed CJK/emoji fonts (only fonts that exist);
    a character none of them has is drawn as its escape, not a box, and said once. Returns the
    fallback fonts found on this machine."""
    import matplotlib
    import matplotlib.pyplot as plt  # noqa: F401  (activates the inline backend first, then our rc wins)

    installed = _fonts.matplotlib_families()     # rebuilt once when fonts came after matplotlib's cache
    found = [name for name in FALLBACK_FONTS if name in installed]
    _fonts.guard_missing_glyphs(found)
    base = matplotlib.rcParamsDefault["font.sans-serif"]
    matplotlib.rcParams["font.sans-serif"] = [base[0]] + found + [f for f in base[1:] if f not in found]
    # a list of families is a per-glyph fallback chain (a generic "sans-serif" would resolve to one font)
    matplotlib.rcParams["font.family"] = [base[0]] + found
    matplotlib.rcParams["figure.dpi"] = dpi
    matplotlib.rcParams["font.size"] = font_size
    _fonts.set_min_size(min_font_size)
    matplotlib.rcParams["savefig.dpi"] = dpi
    matplotlib.rcParams["figure.max_open_warning"] = 0
    compact_inline_figures()
    return found


def compact_inline_figures() -> bool:
    """Show every figure a cell leaves as a palette PNG at display size (``live.compact_png``), not
    matplotlib's RGBA one: the notebook files store each figure, and this keeps each under 1 MB. Set on
    IPython's PNG formatter, after the inline backend registered its own. False outside IPython."""
    try:
        from IPython import get_ipython
        from matplotlib.figure import Figure
    except ImportError:  # pragma: no cover
        return False
    ip = get_ipython()
    if ip is None:
        return False
    import matplotlib
    import matplotlib.pyplot as plt
    # pyplot loads its backend on first use, and the inline backend then registers its own formatter:
    # load it now, so that ours, set after it, stays
    plt.switch_backend(matplotlib.get_backend())

    def png(fig):
        if not fig.axes and not fig.lines and not fig.images:   # as the inline backend: nothing drawn
            return None
        return base64.b64encode(figure_png(fig, close=False)).decode("ascii")    # as the inline one: base64
    ip.display_formatter.formatters["image/png"].for_type(Figure, png)
    return True


# ---------------------------------------------------------------- CPU and threads

def cpu_profile() -> dict:
    """What the CPU offers the kernels: the machine's facts (cores, model, SIMD flags) and the CPU
    profile llmlab reproduces here (``llmlab.ggml.cpu.profiles``), with where that came from."""
    from ..ggml.cpu import profiles
    d = profiles.detect()
    info = {"machine": platform.machine(), "cores": os.cpu_count() or 1, "model": platform.processor() or "?",
            "simd": [], "profile": d.profile.name, "source": d.source, "reproduced": d.reproduced}
    found = profiles.cpu_features()      # the one detector: /proc/cpuinfo, macOS's sysctls, or CPUID on Windows
    if info["model"] == "?" and found.model:
        info["model"] = found.model
    flags = profiles.cpu_flags()
    wanted = ["sse3", "ssse3", "avx", "f16c", "fma", "avx2", "avx_vnni", "avx512f", "avx512bw", "avx512_vnni",
              "avx512_bf16", "amx_int8", "asimd", "asimddp", "asimdhp", "sve", "i8mm"]
    info["simd"] = [f for f in wanted if f in flags]
    return info


def choose_threads(threads: int | None = None) -> tuple[int, str]:
    """The thread count for the engine and why: ``threads``, else ``LLMLAB_THREADS``, else
    llama.cpp's default (the physical cores): ``llmlab.config.threads``, the one policy."""
    return config.threads(threads)


def set_threads(threads: int | None = None) -> int:
    from ..ggml.cpu.fast import set_threads as _set
    n, why = choose_threads(threads)
    n = _set(n)
    print(f"threads: {n} ({why})")
    return n


# ---------------------------------------------------------------- models

def fetch_models(names, quiet: bool = False) -> dict[str, Path]:
    """Each registered model's path, downloading the missing ones with a progress bar. The
    download runs in a child process whose messages are shown as ordinary output."""
    from .. import models
    paths = {}
    for name in names:
        spec = models.spec_for(name)
        if not models.is_cached(spec):
            print(f"{name}: downloading {spec.filename} ({spec.size / 1e6:.0f} MB) once, into {models.home()}", flush=True)
            p = subprocess.Popen([sys.executable, "-m", "llmlab", "fetch", name], stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, cwd=str(ROOT), env=_child_env())
            assert p.stdout is not None
            buf = b""
            while chunk := p.stdout.read1(4096) if hasattr(p.stdout, "read1") else p.stdout.read(4096):
                buf += chunk
                *done, buf = buf.replace(b"\r", b"\n").split(b"\n")
                for line in done:
                    if line.strip() and not quiet:
                        print("\r" + line.decode(errors="replace"), end="", flush=True)
            if p.wait() != 0:
                raise RuntimeError(f"fetching {name} failed; run `python -m llmlab fetch {name}` in a terminal to see why")
            print()
        paths[name] = models.resolve(name)
        if not quiet:
            print(f"{name}: {paths[name]} ({paths[name].stat().st_size / 1e6:.0f} MB)")
    return paths


def _child_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def warm_kernels(model: str = "smollm2") -> float:
    """Compile (the very first time) or load every kernel the model's generation takes, before the
    lesson needs it (``llmlab.warm``). One line of output; returns the seconds it took."""
    from .. import models
    from ..llama import Model
    from ..warm import warm
    w = warm(Model(models.resolve(model)))
    print(w.summary())
    return w.seconds


# ---------------------------------------------------------------- versions and the oracle

def versions() -> dict[str, str | None]:
    from .. import __version__
    from ..doctor import _version          # the environment check's reader of installed versions
    out = {"python": platform.python_version(), "llmlab": __version__}
    for dist in ("numpy", "numba", "matplotlib", "ipywidgets", "llama-cpp-python", "gguf"):
        out[dist] = _version(dist)
    return out


def has_oracle(purpose: str = "the comparison with llama.cpp", module: str = "llama_cpp") -> bool:
    """True when the reference implementation is importable; otherwise prints one line saying that
    ``purpose`` is skipped, and returns False. The oracle comes with ``make test`` (dev extras)."""
    if importlib.util.find_spec(module) is None:
        print(f"skipped: {purpose} needs {ORACLES.get(module, module)}, the test oracle "
              f"(`make test` installs it; everything else in this notebook runs without it)")
        return False
    if module == "llama_cpp":
        from ..llamacpp.worker import last_crash
        crash = last_crash()
        if crash is not None:                    # it will crash again: say so once per comparison, and go on
            print(f"skipped: {purpose}: llama.cpp crashed on this machine earlier ({crash})")
            return False
    return True


def one_line_oracle_crashes() -> bool:
    """In IPython, show a crash of llama.cpp (:class:`~llmlab.llamacpp.worker.LlamaCppCrashed`: its worker
    process died, the kernel did not) as one line instead of a traceback. Returns whether it is installed."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    ip = get_ipython()
    if ip is None:
        return False
    from ..llamacpp.worker import LlamaCppCrashed

    def one_line(shell, etype, value, tb, tb_offset=None):
        print(f"llama.cpp crashed, this comparison stops here: {value}")
        return []
    ip.set_custom_exc((LlamaCppCrashed,), one_line)
    return True


def build_dir(*parts: str) -> Path:
    """A scratch folder for files a notebook writes (``build/notebooks/...`` in the checkout when
    it is writable, else the system's temporary folder), never the working directory."""
    base = CHECKOUT / "build" / "notebooks" if CHECKOUT else Path(tempfile.gettempdir()) / "llmlab-notebooks"
    try:
        base.mkdir(parents=True, exist_ok=True)
        probe = base / ".write-test"
        probe.touch()
        probe.unlink()
    except OSError:
        base = Path(tempfile.gettempdir()) / "llmlab-notebooks"
        base.mkdir(parents=True, exist_ok=True)
    d = base.joinpath(*parts)
    d.mkdir(parents=True, exist_ok=True)
    return d


# ---------------------------------------------------------------- graphs

def graph(dot, name: str, folder: str = "graphs", max_height: int = 640):
    """A Graphviz graph (DOT text or a ``graphviz.Source``) sized to the notebook's width, in a box
    that scrolls when the graph is tall; a click on the line below shows it at its full size. The SVG
    is stored once, in the output itself (so it shows wherever the notebook does: JupyterLab serving
    only ``notebooks/``, the HTML export, a copied notebook), and CSS chooses fitted or full size
    (``graph_html``). It is also written to ``build_dir(folder)/<name>.svg`` for use outside the
    notebook. Returns an HTML object (or a message when Graphviz's ``dot`` program is missing: the
    one-line message and a simplified static drawing)."""
    from IPython.display import HTML
    from ..ggml.graphviz import has_dot
    text = dot if isinstance(dot, str) else getattr(dot, "source", str(dot))
    if not has_dot():
        from ..ggml import graphviz_fallback
        return HTML(graphviz_fallback.html(text, max_height))
    import graphviz
    svg = graphviz.Source(text).pipe(format="svg").decode("utf-8")
    svg = svg[svg.index("<svg"):]                       # drop the XML prolog and doctype
    path = build_dir(folder) / f"{name}.svg"
    path.write_text(svg, encoding="utf-8")
    return HTML(graph_html(svg, name, max_height))


def graph_html(svg: str, name: str, max_height: int = 640) -> str:
    """One SVG, at most the page's width in a box that scrolls when tall; a ``<details>`` line below
    it switches, through a style scoped to this output, to its own size (in a box that scrolls both
    ways). Where a front end drops ``<style>`` (JupyterLab before a notebook is trusted) the fitted
    picture stays."""
    import re
    m = re.search(r'<svg width="([\d.]+)pt" height="([\d.]+)pt"', svg)
    w, h = (float(m.group(1)) * 4 / 3, float(m.group(2)) * 4 / 3) if m else (None, None)
    size = f"{w:.0f} x {h:.0f} px" if m else "full size"
    # its own width at most, never wider than the page (a small graph is not blown up)
    natural = f'<svg width="{w:.0f}px" style="max-width:100%;height:auto"' if m else '<svg width="100%" style="height:auto"'
    fitted = re.sub(r'<svg width="[\d.]+pt" height="[\d.]+pt"', natural, svg, count=1)
    gid = "llmlab-g-" + re.sub(r"[^A-Za-z0-9_-]", "-", name)
    full = "max-width:none !important"
    style = (f"<style>#{gid} details[open] ~ div{{max-height:{2 * max_height}px !important}}"
             f"#{gid} details[open] ~ div svg{{{full}}}</style>")
    box = "max-width:100%;overflow:auto;border:1px solid #ddd"
    # the details come first (CSS selects only later siblings) and are drawn below the picture
    return (f"<div id='{gid}' style='display:flex;flex-direction:column-reverse'>{style}"
            f"<details><summary style='cursor:pointer;font-size:90%'>fitted to the page; click for the full "
            f"picture ({size}), which scrolls</summary></details>"
            f"<div style='{box};max-height:{max_height}px'>{fitted}</div></div>")


# ---------------------------------------------------------------- the one call

def setup(models=("smollm2",), threads: int | None = None, warm: bool = False, quiet: bool = False) -> dict:
    """Prepare a notebook: matplotlib defaults and fonts, threads, models (fetched once), kernels
    warmed when ``warm``, and one line each of versions and CPU profile. Returns the model paths."""
    fonts = set_matplotlib_defaults()
    one_line_oracle_crashes()
    from ..ggml.cpu import profiles
    profiles.warn_if_unreproduced(stream=sys.stdout)   # the engine's one-line note, said here, in the output
    if not quiet:
        v = versions()
        print("versions: " + ", ".join(f"{k} {val}" for k, val in v.items() if val) +
              ("" if v.get("llama-cpp-python") else " (no llama-cpp-python: comparisons with llama.cpp are skipped)"))
        p = cpu_profile()
        print(f"cpu: {p['model']}, {p['cores']} cores, {p['machine']}; SIMD: {' '.join(p['simd']) or 'none found'}")
        print(f"CPU profile: {p['profile']} (from {p['source']}); bit-identical to this machine's llama.cpp: "
              f"{'yes' if p['reproduced'] else 'no'}")
        print(f"figures: {FIGURE_DPI} dpi, text {FIGURE_FONT} pt (never under {FIGURE_MIN_FONT} pt); "
              f"fallback fonts: {', '.join(fonts) or 'none installed (python -m llmlab doctor)'}")
    set_threads(threads)
    paths = fetch_models(models, quiet=quiet)
    if warm:
        warm_kernels(next(iter(models), "smollm2"))
    return paths


def plug(*args, **kw):
    """Your own functions inside the engine on the real model (``llmlab.nb.plug``): ``nb.plug(rms_norm=f)``
    shows one verdict line and where the difference starts; ``with nb.plug(rms_norm=f): ...`` plugs it in."""
    from .plugview import plug as _plug
    return _plug(*args, **kw)


def check_plug(*plugged, **kw):
    """``plug`` named as the exercises' checkers are (a "Build it" cell ends with it): ``nb.check_plug(rms_norm=f)``
    runs and shows the verdict; ``nb.check_plug(p)`` shows an existing ``nb.plug`` run's."""
    from .plugview import Plug, plug as _plug
    if plugged:
        if len(plugged) != 1 or not isinstance(plugged[0], Plug) or kw:
            raise TypeError("check_plug takes slot=function arguments, or one nb.plug(...) result")
        return plugged[0]
    return _plug(**kw)
