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
# SIMD features worth naming (in Linux's /proc/cpuinfo spelling, which the detector uses on every OS)
FEATURES = ("sse3", "ssse3", "avx", "f16c", "fma", "avx2", "avx_vnni", "avx512f", "avx512bw", "avx512_vnni",
            "avx512_bf16", "amx_int8", "asimd", "asimddp", "asimdhp", "fphp", "sve", "i8mm", "bf16", "sme")

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


def cpu_features() -> tuple[list[str], str]:
    """The SIMD features this CPU reports that matter to ggml, and where they were read: the CPU profiles'
    detector (``llmlab.ggml.cpu.profiles.cpu_features``: /proc/cpuinfo, macOS's sysctls, or CPUID and
    IsProcessorFeaturePresent on Windows); nothing without numpy, which that package needs."""
    if _missing("numpy", "numba"):
        return [], "not read (needs numpy and numba)"
    from .ggml.cpu import profiles
    found = profiles.cpu_features()
    return [f for f in FEATURES if f in found.flags], found.source


def check_cpu() -> list[Check]:
    machine = platform.machine() or "?"
    feats, feats_from = cpu_features()
    if _missing("numpy", "numba"):
        return [Check("cpu", "warn", False, f"{machine}; cannot choose a CPU profile without numpy and numba",
                      data={"machine": machine, "features": feats, "features_source": feats_from})]
    from .ggml.cpu import profiles
    try:
        d = profiles.detect()
        info = profiles.llama_cpp_system_info()
        build = profiles._from_system_info(info) if info else None
    except Exception as e:
        return [Check("cpu", "warn", False, f"{machine}; cannot choose a CPU profile: {type(e).__name__}: {e}",
                      data={"machine": machine, "features": feats, "features_source": feats_from})]
    arm = machine.lower() in ("arm64", "aarch64") or machine.lower().startswith("arm")
    summary = (f"{machine}, {' '.join(feats) or 'no SIMD features read'} (from {feats_from}); profile {d.profile.name} "
               f"(from {d.source}); bit-identical to this machine's llama.cpp: {'yes' if d.reproduced else 'no'}")
    if not d.reproduced and arm:
        summary += " (llmlab computes an x86 profile's arithmetic here; ARM profiles are future work)"
    cpu = Check("cpu", "ok" if d.reproduced else "warn", False, summary,
                data={"machine": machine, "features": feats, "features_source": feats_from,
                      "profile": d.profile.name, "source": d.source,
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
        amx = profiles.uses_amx(info)
        llama = Check("llama_cpp", "ok" if same else "warn", False,
                      f"llama-cpp-python {version}: its build is "
                      + (f"the {build.name} profile" if build else
                         "AVX-512 with AMX (AMX_INT8 = 1), which llmlab does not reproduce (its quantized products "
                         "run on AMX tiles; in some VMs they crash)" if amx else "no profile llmlab has")
                      + (", the one llmlab computes: bit-identical" if same else
                         f"; llmlab computes {d.profile.name}: not bit-identical"),
                      hint("llama_cpp_amx") if amx else None,
                      data={"installed": True, "version": version, "system_info": info.strip(),
                            "profile": build.name if build else None, "reproduces": same, "amx": amx})
    return [cpu, llama]


def check_numba() -> list[Check]:
    if _missing("numba"):
        return [Check("numba_cache", "warn", False, "numba is not installed")]
    import numba

    from .ggml.cpu import numba_cache
    d = numba_cache.diagnose()       # (never raises: a cache it cannot use is its answer)
    where, source, ok, problem = Path(d["dir"] or "?"), d["source"], d["writable"], d["problem"]
    if problem is None:
        summary = f"{where} ({source}): writable"
    elif ok:
        summary = f"{where} ({source}): {problem}"
    else:
        summary = f"{where} ({source}): not usable ({problem}): every run compiles the kernels again (minutes)"
    cache = Check("numba_cache", "ok" if problem is None else "warn", False, summary,
                  None if problem is None else hint("numba_cache"),
                  {"dir": d["dir"], "source": source, "writable": ok, "problem": problem})
    pool = numba.config.NUMBA_NUM_THREADS
    try:
        n, why = config.threads()
        ignored = config.NUMBA_THREADS_IGNORED
        threads = Check("threads", "warn" if ignored else "ok", False,
                        f"{min(n, pool)} ({why}; cores: {os.cpu_count() or '?'}; numba's pool: {pool}; LLMLAB_THREADS "
                        f"or --threads sets it)" + (f"; {ignored}" if ignored else ""),
                        "unset NUMBA_NUM_THREADS or set it to a positive integer" if ignored else None,
                        data={"threads": min(n, pool), "why": why, "cores": os.cpu_count(), "numba_pool": pool,
                              "numba_num_threads_ignored": ignored})
    except ValueError as e:           # a bad LLMLAB_THREADS: every engine command would refuse it
        threads = Check("threads", "missing", True, str(e), "set LLMLAB_THREADS to a positive integer, or unset it",
                        data={"threads": None, "error": str(e), "cores": os.cpu_count(), "numba_pool": pool})
    return [cache, threads, check_threading_layer()]


def check_threading_layer() -> Check:
    """numba's threading layer: omp or tbb run a decode step's few hundred parallel regions cheaply;
    workqueue (the only one a pip-only macOS has) wakes its threads through condition variables, tens to
    hundreds of microseconds a region, so llmlab runs one-thread regions on the calling thread and serves
    the others from its own spinning pool there (``threadpool.install_inline_regions``)."""
    from .ggml.cpu.threadpool import threading_layers
    t = threading_layers()
    good = t["layer"] in ("omp", "tbb")
    better = [n for n in ("omp", "tbb") if n in t["available"]]
    fix = (f"unset NUMBA_THREADING_LAYER ({t['configured']}): {better[0]} loads here" if better
           else hint("threading_layer"))
    why = ("" if good else "; llmlab's spinning pool serves its parallel regions (its own threads are slow to "
                            "wake)" if t["pool"] else "; its threads are slow to wake: decoding runs mostly on one thread")
    return Check("threading", "ok" if good else "warn", False,
                 f"numba's {t['layer']} layer (loads here: {', '.join(t['available']) or 'none'})" + why,
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
                                                                       "features": [], "features_source":
                                                                       "not read (needs numpy)"})]
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


# ---------------------------------------------------------------- the room check: one line per learner machine

ROOM_FIELDS = ("host", "os", "python", "machine", "cpu", "features_from", "profile", "bit_identical", "threading",
               "threads", "kernels", "oracle", "ready")

_ORACLE_PROBE = r"""
import sys
import llama_cpp
info = llama_cpp.llama_print_system_info().decode("utf-8", "replace")
print("info", " ".join(info.split()), flush=True)
if len(sys.argv) > 1:                      # a cached model: one decode, where AMX or a bad build would crash
    llm = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=64, n_threads=1, verbose=False)
    llm.eval([llm.token_bos(), 1, 2])
    print("decoded", flush=True)
"""


def oracle_state(timeout: float = 180.0) -> tuple[str, dict]:
    """Whether the local llama.cpp runs: loaded and, with a cached model, one decode, in a child process (a
    crash of llama.cpp, SIGILL on an AMX guest say, is this answer, not the end of doctor)."""
    if _missing("llama_cpp"):
        return "not installed", {"installed": False}
    args = [sys.executable, "-c", _ORACLE_PROBE]
    from . import models
    try:
        spec = models.spec_for("smollm2")
        if models.is_cached(spec):
            args.append(str(models.model_path(spec)))
    except Exception:          # noqa: BLE001 - no cache folder, a bad LLMLAB_HOME: load only
        pass
    try:
        p = subprocess.run(args, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return f"hangs (no answer in {timeout:g} s)", {"installed": True, "runs": False}
    info = next((ln[5:] for ln in p.stdout.splitlines() if ln.startswith("info ")), "")
    amx = "AMX_INT8 = 1" in info
    if p.returncode < 0:
        import signal
        try:
            sig = signal.Signals(-p.returncode).name
        except ValueError:
            sig = str(-p.returncode)
        return f"crashes ({sig}{', AMX' if amx else ''})", {"installed": True, "runs": False, "signal": sig, "amx": amx}
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or ["?"])[-1][:120]
        return f"fails ({last})", {"installed": True, "runs": False, "amx": amx}
    decoded = "decoded" in p.stdout.split()
    return ("runs" + ("" if decoded else " (loaded; no cached model to decode)") + (", AMX" if amx else ""),
            {"installed": True, "runs": True, "decoded": decoded, "amx": amx})


def _writable(folder: Path) -> bool:
    """What numba asks of a cache folder: it can be created and a file written in it."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()
        return True
    except OSError:
        return False


def kernel_cache_state() -> tuple[str, dict]:
    """How many of llmlab's kernels numba's cache holds for these sources, without compiling any: "warm",
    "cold" (nothing cached: the first run compiles for minutes), "stale" (cached for other sources) or
    "not writable". Where llmlab's shipped kernels fit this CPU, numba and these sources, it is "warm" too: the
    first run unpacks them and compiles nothing."""
    import numba
    from . import config
    from .ggml.cpu import numba_cache as nc
    from .ggml.cpu import shipped_kernels as sk
    t = sk.host_target() if config.kernel_target() == "auto" else None
    if t is not None and sk.mismatch(t, sk.read_manifest(t)) is None:
        return (f"warm (llmlab's shipped kernels for {t.name} fit this machine)",
                {"state": "warm", "entries": None, "writable": None, "dir": str(sk.folder(t)), "shipped": t.name})
    base = Path(numba.config.CACHE_DIR) if numba.config.CACHE_DIR else None
    digest, entries, stale, writable = nc.sources_digest(), 0, False, True
    for src in nc._kernel_folders():
        where = base / nc._user_subpath(src) if base else src / "__pycache__"
        if not where.is_dir():
            continue
        found = sum(1 for f in where.glob("*.nbi"))
        stamp = where / nc.STAMP
        try:
            fresh = stamp.read_text(encoding="utf-8", errors="replace").strip() == digest
        except OSError:
            fresh = False
        if found and not fresh:
            stale = True
        entries += found if fresh else 0
        writable = writable and _writable(where)
    state = "stale" if stale and not entries else "warm" if entries else "cold"
    text = f"{state} ({entries} kernel entries cached)" + ("" if writable else ", cache not writable")
    return text, {"state": state, "entries": entries, "writable": writable,
                  "dir": str(base) if base else "next to the kernels"}


def threading_layer() -> str:
    """The threading layer numba's parallel kernels run on here (tbb, omp or workqueue), found by running a
    tiny parallel function (compiled, not cached: a second or two)."""
    import numba

    @numba.njit(parallel=True, cache=False)
    def _probe(n):
        s = 0
        for i in numba.prange(n):
            s += i
        return s
    try:
        _probe(64)
        return numba.threading_layer()
    except Exception as e:          # noqa: BLE001 - no layer at all: say why
        return f"none ({type(e).__name__}: {e})"


def room(lab: bool = True) -> dict:
    """What a teacher checks on each learner's machine before the day, as one flat record (:data:`ROOM_FIELDS`)."""
    import socket
    rep = report(lab)
    checks = rep["checks"]
    cpu = checks.get("cpu", {}).get("data", {})
    threads = checks.get("threads", {}).get("data", {})
    rec = {"host": socket.gethostname(), "os": f"{platform.system()} {platform.release()}".strip(),
           "python": platform.python_version(), "machine": platform.machine(),
           "cpu": "", "features_from": cpu.get("features_source", "?"), "profile": cpu.get("profile") or "?",
           "bit_identical": cpu.get("reproduced"), "threading": "?", "threads": threads.get("threads"),
           "kernels": "?", "oracle": "?", "ready": rep["ok"]}
    if not _missing("numpy", "numba"):
        from .ggml.cpu import profiles
        rec["cpu"] = profiles.cpu_features().model
        rec["threading"] = threading_layer()
        rec["kernels"] = kernel_cache_state()[0]
    rec["oracle"] = oracle_state()[0]
    if rep["missing"]:
        rec["ready"] = f"no: missing {', '.join(rep['missing'])}"
    return rec


def format_room(rec: dict) -> str:
    """One line: ``llmlab-room host=...; os=...; ...`` (values never hold ';' or a line break)."""
    def clean(v) -> str:
        v = "yes" if v is True else "no" if v is False else "?" if v is None else str(v)
        return " ".join(v.replace(";", ",").split())
    return "llmlab-room " + "; ".join(f"{k}={clean(rec[k])}" for k in ROOM_FIELDS)


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
    p.add_argument("--room", action="store_true",
                   help="one line for a teacher to collect from each learner's machine: OS, CPU profile, numba's "
                        "threading layer, the kernel cache, whether llama.cpp runs, ready or not (--json: an object)")


def run(args) -> int:
    if getattr(args, "room", False):
        rec = room(lab=not args.cli)
        print(json.dumps(rec, allow_nan=False) if args.json else format_room(rec))
        return 0 if rec["ready"] is True else EXIT_MISSING
    rep = report(lab=not args.cli)
    print(json.dumps(rep, indent=2, allow_nan=False) if args.json else format_report(rep))
    return rep["exit_code"]


if __name__ == "__main__":
    sys.exit(main())
