"""``python -m llmlab doctor``: is this machine ready for llmlab and its notebooks, and if not, what to install.

One :class:`Check` per piece: Python and the packages (versions from ``importlib.metadata``), Graphviz's
``dot`` program, CJK and emoji fonts for matplotlib, the CPU (architecture, SIMD features, the CPU profile
llmlab computes and whether the local llama.cpp reproduces it), numba's cache folder and thread count.
Each is ``ok``, ``warn`` (optional, or works with a caveat) or ``missing``; a missing piece comes with one
install hint for this operating system (:func:`hint`). A *required* piece missing (Python >= 3.11, numpy,
numba, matplotlib; for the lab also JupyterLab, ipywidgets, the graphviz package and ``dot``) makes the
command exit with status 1 (:data:`EXIT_MISSING`): a check that failed, not bad input (status 2).

This module imports nothing of llmlab's engine at the top, so ``python -m llmlab.doctor`` still runs
(and says what is missing) where numpy or numba is not installed at all.
"""
from __future__ import annotations

import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from . import config
from .hints import PACKAGES, hint, in_conda, system

EXIT_MISSING = 1          # a required piece is missing (usage errors and bad input stay 2, as everywhere)
MIN_PYTHON = (3, 11)
# SIMD features worth naming (Linux /proc/cpuinfo and macOS sysctl spellings, lower case)
FEATURES = ("sse3", "ssse3", "avx", "f16c", "fma", "avx2", "avx_vnni", "avx512f", "avx512bw", "avx512_vnni",
            "avx512vnni", "avx512_bf16", "amx_int8", "asimd", "asimddp", "asimdhp", "fphp", "sve", "i8mm",
            "feat_dotprod", "feat_fp16", "feat_i8mm", "feat_bf16", "feat_sme")

@dataclass
class Check:
    name: str
    status: str                 # "ok", "warn" or "missing"
    required: bool
    summary: str                # one line for humans
    hint: str | None = None     # how to install what is missing
    data: dict = field(default_factory=dict)


def _version(dist: str) -> str | None:
    from importlib import metadata
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _vtuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v.split("+")[0])[:3])


def check_python() -> Check:
    v = platform.python_version()
    good = sys.version_info[:2] >= MIN_PYTHON
    need = ".".join(map(str, MIN_PYTHON))
    return Check("python", "ok" if good else "missing", True,
                 f"{v} ({sys.executable})" if good else f"{v} is too old: llmlab needs Python >= {need}",
                 None if good else hint("python"), {"version": v, "minimum": need, "executable": sys.executable})


def check_package(dist: str, minimum: str, needed_by: str, lab: bool) -> Check:
    required = needed_by == "core" or lab
    v = _version(dist)
    if v is not None and _vtuple(v) >= _vtuple(minimum):
        return Check(dist, "ok", required, v, data={"version": v, "minimum": minimum})
    why = "not installed" if v is None else f"{v} is too old (llmlab needs >= {minimum})"
    if not required:
        why += " (optional for the command line; the notebooks need it)"
    return Check(dist, "missing" if required else "warn", required, why, hint(dist),
                 {"version": v, "minimum": minimum})


def check_dot(lab: bool) -> Check:
    path = shutil.which("dot")
    status_if_missing = "missing" if lab else "warn"
    if path is None:
        return Check("dot", status_if_missing, lab, "Graphviz's `dot` program is not on PATH: graphs are drawn "
                     "without it, in a simplified static form", hint("dot"), {"path": None, "version": None})
    try:
        p = subprocess.run([path, "-V"], capture_output=True, text=True, timeout=20)
        out = (p.stderr or p.stdout).strip()
        ok = p.returncode == 0
    except (OSError, subprocess.SubprocessError) as e:
        out, ok = str(e), False
    if not ok:
        return Check("dot", status_if_missing, lab, f"{path} does not run: {out.splitlines()[0] if out else '?'}",
                     hint("dot"), {"path": path, "version": None})
    m = re.search(r"version\s+(\S+)", out)
    version = m.group(1) if m else out
    return Check("dot", "ok", lab, f"Graphviz {version} ({path})", data={"path": path, "version": version})


def _missing(*modules: str) -> list[str]:
    """The modules of ``modules`` that are not installed: a check that needs them is left out (the
    package checks above already report them), instead of importing llmlab code that would fail."""
    return [m for m in modules if importlib.util.find_spec(m) is None]


def check_fonts() -> list[Check]:
    if _missing("matplotlib"):
        return [Check("fonts", "warn", False, "cannot list fonts without matplotlib")]
    from .viz import fonts
    try:
        found = fonts.report()
    except Exception as e:        # a broken font cache or fontconfig
        return [Check("fonts", "warn", False, f"cannot list fonts: {type(e).__name__}: {e}")]
    cjk = found["cjk"]
    c1 = (Check("fonts_cjk", "ok", False, f"matplotlib draws Chinese with {', '.join(cjk)}", data={"families": cjk})
          if cjk else
          Check("fonts_cjk", "warn", False, "no CJK font for matplotlib: figures write Chinese characters as "
                "\\u escapes (no boxes)", hint("fonts-cjk"), {"families": []}))
    fig, browser = found["emoji_figures"], found["emoji_browser"]
    where = (f"figures: {', '.join(fig)}" if fig else "figures write emoji as \\U escapes (matplotlib cannot draw "
             f"colour emoji; for outline emoji: {hint('fonts-emoji-figures')})")
    c2 = (Check("fonts_emoji", "ok", False, f"browser: {', '.join(browser)}; {where}",
                data={"browser": browser, "figures": fig})
          if browser or fig else
          Check("fonts_emoji", "warn", False, f"no emoji font: JupyterLab may show emoji as boxes; {where}",
                hint("fonts-emoji"), {"browser": [], "figures": []}))
    return [c1, c2]


def cpu_features() -> list[str]:
    """The SIMD features this CPU reports that matter to ggml (Linux: /proc/cpuinfo; macOS: sysctl)."""
    flags: set[str] = set()
    if system() == "macos":
        for key in ("machdep.cpu.features", "machdep.cpu.leaf7_features"):
            try:
                out = subprocess.run(["sysctl", "-n", key], capture_output=True, text=True, timeout=10).stdout
            except (OSError, subprocess.SubprocessError):
                out = ""
            flags |= {f.lower().replace("avx1.0", "avx") for f in out.split()}
        try:
            out = subprocess.run(["sysctl", "hw.optional"], capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            out = ""
        for line in out.splitlines():      # hw.optional.arm.FEAT_DotProd: 1
            k, _, v = line.partition(":")
            if v.strip() == "1":
                flags.add(k.strip().rsplit(".", 1)[-1].lower())
    else:
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    if line.startswith(("flags", "Features")):
                        flags = set(line.split(":", 1)[1].split())
                        flags |= {"sse3"} if "pni" in flags else set()     # Linux calls SSE3 "pni"
                        break
        except OSError:
            pass
    return [f for f in FEATURES if f in flags]


def check_cpu() -> list[Check]:
    machine = platform.machine() or "?"
    feats = cpu_features()
    if _missing("numpy", "numba"):
        return [Check("cpu", "warn", False, f"{machine}; cannot choose a CPU profile without numpy and numba",
                      data={"machine": machine, "features": feats})]
    from .ggml.cpu import profiles
    try:
        d = profiles.detect()
        info = profiles.llama_cpp_system_info()
        build = profiles._from_system_info(info) if info else None
    except Exception as e:
        return [Check("cpu", "warn", False, f"{machine}; cannot choose a CPU profile: {type(e).__name__}: {e}",
                      data={"machine": machine, "features": feats})]
    arm = machine.lower() in ("arm64", "aarch64") or machine.lower().startswith("arm")
    summary = (f"{machine}, {' '.join(feats) or 'no SIMD features read'}; profile {d.profile.name} "
               f"(from {d.source}); bit-identical to this machine's llama.cpp: {'yes' if d.reproduced else 'no'}")
    if not d.reproduced and arm:
        summary += " (llmlab computes an x86 profile's arithmetic here; ARM profiles are future work)"
    cpu = Check("cpu", "ok" if d.reproduced else "warn", False, summary,
                data={"machine": machine, "features": feats, "profile": d.profile.name, "source": d.source,
                      "reproduced": d.reproduced, "detail": d.detail})
    version = _version("llama-cpp-python")
    if info is None:
        llama = Check("llama_cpp", "warn", False, "llama-cpp-python is not installed (optional: comparisons with "
                      "llama.cpp are skipped)" if importlib.util.find_spec("llama_cpp") is None else
                      "llama_cpp is installed but does not load", hint("llama_cpp"),
                      {"installed": importlib.util.find_spec("llama_cpp") is not None, "version": version,
                       "system_info": None, "profile": None, "reproduces": None})
    else:
        same = build is d.profile
        llama = Check("llama_cpp", "ok" if same else "warn", False,
                      f"llama-cpp-python {version}: its build is "
                      + (f"the {build.name} profile" if build else "no profile llmlab has")
                      + (", the one llmlab computes: bit-identical" if same else
                         f"; llmlab computes {d.profile.name}: not bit-identical"),
                      data={"installed": True, "version": version, "system_info": info.strip(),
                            "profile": build.name if build else None, "reproduces": same})
    return [cpu, llama]


def _writable(folder: Path) -> bool:
    """What numba asks of a cache folder: it can be created and a file written in it."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()
        return True
    except OSError:
        return False


def check_numba() -> list[Check]:
    if _missing("numba"):
        return [Check("numba_cache", "warn", False, "numba is not installed")]
    import numba
    kernels = Path(__file__).resolve().parent / "ggml" / "cpu" / "fast"
    if numba.config.CACHE_DIR:
        where, source = Path(numba.config.CACHE_DIR), "NUMBA_CACHE_DIR"
    else:
        where, source = kernels / "__pycache__", "next to the kernels"
        if not _writable(where):     # numba then falls back to a per-user folder
            from numba.misc.appdirs import AppDirs
            where, source = Path(AppDirs(appname="numba", appauthor=False).user_cache_dir), "per-user cache"
    ok = _writable(where)
    cache = Check("numba_cache", "ok" if ok else "warn", False,
                  f"{where} ({source}): " + ("writable" if ok else "not writable: every run compiles the kernels "
                                             "again (minutes)"),
                  None if ok else hint("numba_cache"), {"dir": str(where), "source": source, "writable": ok})
    pool = numba.config.NUMBA_NUM_THREADS
    try:
        n, why = config.threads()
        threads = Check("threads", "ok", False, f"{min(n, pool)} ({why}; cores: {os.cpu_count() or '?'}; "
                        f"numba's pool: {pool}; LLMLAB_THREADS or --threads sets it)",
                        data={"threads": min(n, pool), "why": why, "cores": os.cpu_count(), "numba_pool": pool})
    except ValueError as e:           # a bad LLMLAB_THREADS: every engine command would refuse it
        threads = Check("threads", "missing", True, str(e), "set LLMLAB_THREADS to a positive integer, or unset it",
                        data={"threads": None, "error": str(e), "cores": os.cpu_count(), "numba_pool": pool})
    return [cache, threads, check_threading_layer()]


def check_threading_layer() -> Check:
    """numba's threading layer: omp or tbb run a decode step's few hundred parallel regions cheaply;
    workqueue (the only one a pip-only macOS has) wakes a thread for each, even a one-thread one."""
    from .ggml.cpu.threadpool import threading_layers
    t = threading_layers()
    good = t["layer"] in ("omp", "tbb")
    better = [n for n in ("omp", "tbb") if n in t["available"]]
    fix = (f"unset NUMBA_THREADING_LAYER ({t['configured']}): {better[0]} loads here" if better
           else hint("threading_layer"))
    return Check("threading", "ok" if good else "warn", False,
                 f"numba's {t['layer']} layer (loads here: {', '.join(t['available']) or 'none'})" + (
                     "" if good else "; each parallel region wakes a thread: slower decoding"),
                 None if good else fix, t)


def run_checks(lab: bool = True) -> list[Check]:
    """Every check, in the order ``doctor`` prints them. ``lab``: the notebooks' pieces are required."""
    checks = [check_python()]
    checks += [check_package(d, m, by, lab) for d, m, _, by in PACKAGES]
    checks.append(check_dot(lab))
    checks += check_fonts()
    numpy_ok = _version("numpy") is not None
    checks += check_cpu() if numpy_ok else [Check("cpu", "warn", False, f"{platform.machine()}; the CPU profile "
                                                  "needs numpy", data={"machine": platform.machine(),
                                                                       "features": cpu_features()})]
    checks += check_numba()
    return checks


def report(lab: bool = True) -> dict:
    """The whole result as one JSON-ready object."""
    checks = run_checks(lab)
    missing = [c.name for c in checks if c.status == "missing"]
    return {"ok": not missing, "exit_code": EXIT_MISSING if missing else 0, "missing": missing,
            "warnings": [c.name for c in checks if c.status == "warn"],
            "purpose": "lab" if lab else "cli",
            "platform": {"system": system(), "release": platform.release(), "machine": platform.machine(),
                         "conda": in_conda(), "python": platform.python_version()},
            "checks": {c.name: {k: v for k, v in asdict(c).items() if k != "name"} for c in checks}}


def format_report(rep: dict) -> str:
    """The human form: one line per check, and an install hint under each piece that is missing."""
    p = rep["platform"]
    need = ("the notebooks: JupyterLab and Graphviz required" if rep["purpose"] == "lab" else
            "the command line: JupyterLab and Graphviz optional")
    lines = [f"llmlab doctor: {p['system']} {p['machine']}, Python {p['python']}"
             f"{' (conda)' if p['conda'] else ''}; checking for {need}"]
    for name, c in rep["checks"].items():
        lines.append(f"{c['status']:<8} {name:<12} {c['summary']}")
        if c["hint"] and c["status"] != "ok":
            lines.append(f"{'':<8} {'':<12} -> {c['hint']}")
    if rep["missing"]:
        lines.append(f"missing: {', '.join(rep['missing'])} (exit status {rep['exit_code']})")
    else:
        lines.append("ready: every required piece is here" + (f" ({len(rep['warnings'])} warnings above)"
                                                             if rep["warnings"] else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m llmlab.doctor [--json] [--cli]``: the same as ``python -m llmlab doctor``, for a
    machine where the rest of llmlab cannot even be imported (numpy missing)."""
    import argparse
    ap = argparse.ArgumentParser(prog="python -m llmlab.doctor", description=__doc__.split("\n")[0])
    add_arguments(ap)
    args = ap.parse_args(argv)
    return run(args)


def add_arguments(p) -> None:
    p.add_argument("--json", action="store_true", help="one strict JSON object instead of lines")
    p.add_argument("--cli", action="store_true",
                   help="check for the command line only: JupyterLab, ipywidgets and Graphviz become optional")


def run(args) -> int:
    rep = report(lab=not args.cli)
    print(json.dumps(rep, indent=2, allow_nan=False) if args.json else format_report(rep))
    return rep["exit_code"]


if __name__ == "__main__":
    sys.exit(main())
