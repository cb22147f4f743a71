"""Build the compiled kernels llmlab ships (``llmlab/data/kernels/``): ``make kernels``.

For every target of ``llmlab.ggml.cpu.shipped_kernels.TARGETS`` this writes ``NAME.tar.xz`` (numba's cache of
llmlab's kernels compiled for that LLVM CPU model) and ``NAME.json`` (what it was built from: numba's,
llvmlite's and Python's versions, the platform triple, the kernel sources' digest, the archive's hash).

What to compile is found by running, not listed: a child process compiles for the best target this machine
runs (each in a fresh LLMLAB_HOME, nothing unpacked) and warms the real models (``llmlab.warm``, which
reaches every kernel a generation takes) under every CPU profile of that machine; its cache is that target's
archive, and it records each llmlab dispatcher's signatures. Every other target is compiled from those
signatures in its own child (``dispatcher.compile``, never run: an AVX-512 target's code may not run here),
the byte-dot kernels (the ``KERNELS`` tables of instruction set -> kernels) swapped for the target's own.

Usage: python tools/ship_kernels.py [--target NAME ...] [-m MODEL ...]   (models: the registry's, fetched)
"""
from __future__ import annotations

import argparse
import hashlib
import importlib
import io
import json
import lzma
import os
import pickle
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
MODELS = ("smollm2", "gemma3")


def _dispatchers():
    """(module name, attribute, dispatcher) of every numba dispatcher in llmlab's loaded modules."""
    from numba.core.dispatcher import Dispatcher
    out, seen = [], set()
    for name, mod in sorted(sys.modules.items()):
        if not name.startswith("llmlab.") or mod is None:
            continue
        for attr, v in sorted(vars(mod).items()):
            if isinstance(v, Dispatcher) and id(v) not in seen and v.py_func.__module__ == name:
                seen.add(id(v))
                out.append((name, attr, v))
    return out


def _byte_dot_tables():
    """id(dispatcher) -> (table, family) over every byte-dot table (a module's dict of instruction set ->
    family -> kernel: ``dot4.KERNELS``, ``dot4.MULTI``, ``dot4_neon.KERNELS``, ...). A table left out here
    would have a wider host's kernels compiled for a narrower target, which LLVM cannot lower."""
    from numba.core.dispatcher import Dispatcher
    from llmlab.ggml.cpu.fast import dot4
    isas = set(dot4.KERNELS)
    out = {}
    for name, mod in list(sys.modules.items()):
        if not name.startswith("llmlab.") or mod is None:
            continue
        for table in vars(mod).values():
            if (isinstance(table, dict) and table and set(table) <= isas
                    and all(isinstance(v, dict) for v in table.values())):
                for per_isa in table.values():
                    for family, k in per_isa.items():
                        if isinstance(k, Dispatcher):
                            out[id(k)] = (table, family)
    return out


def record(paths: list[str], out: str) -> None:
    """Child: warm every model under every CPU profile of this machine, then save each dispatcher's signatures."""
    from llmlab.ggml.cpu import profiles, shipped_kernels
    from llmlab.llama import Model
    from llmlab.warm import warm
    t = shipped_kernels.active()
    arch = t.machine if t else profiles.machine()
    for path in paths:
        for prof in (p for p in profiles.PROFILES.values() if p.arch == arch):
            w = warm(Model(path, cpu=prof), prof)
            print(f"  {Path(path).name} {prof.name}: {w.summary()}", file=sys.stderr, flush=True)
    sigs = [(m, a, list(d.signatures)) for m, a, d in _dispatchers() if d.signatures]
    Path(out).write_bytes(pickle.dumps(sigs))


def compile_from(sigs_file: str) -> None:
    """Child: compile every recorded signature for this process's target (never run), byte-dot kernels
    swapped for the target's best instruction set."""
    from llmlab.ggml.cpu import shipped_kernels
    from llmlab.ggml.cpu.fast import dot4  # noqa: F401 (its tables)
    t = shipped_kernels.active()
    sigs = pickle.loads(Path(sigs_file).read_bytes())
    for m, _, _ in sigs:
        importlib.import_module(m)
    tables = _byte_dot_tables()
    n = 0
    for m, attr, signatures in sigs:
        d = getattr(sys.modules[m], attr)
        if id(d) in tables:             # the target's own byte-dot kernel of that family (none: the one recorded)
            table, family = tables[id(d)]
            isa = next((i for i in t.isas if i in table and family in table[i]), None)
            d = table[isa][family] if isa else d
        for sig in signatures:
            d.compile(sig)
            n += 1
    print(f"  compiled {n} signatures for {t.name}", file=sys.stderr, flush=True)


def pack(name: str, home: Path, out_dir: Path, models: list[str]) -> dict:
    """Archive the target's cache folder in ``home`` and write its manifest; returns the manifest."""
    from llmlab.ggml.cpu import numba_cache, shipped_kernels
    t = shipped_kernels.TARGETS[name]
    env_home = os.environ.get("LLMLAB_HOME")
    os.environ["LLMLAB_HOME"] = str(home)
    try:
        folder = shipped_kernels.folder(t)
    finally:
        if env_home is None:
            os.environ.pop("LLMLAB_HOME")
        else:
            os.environ["LLMLAB_HOME"] = env_home
    files = sorted(f for f in folder.rglob("*") if f.suffix in (".nbi", ".nbc"))
    if not files:
        raise SystemExit(f"error: nothing was compiled for {name} in {folder}")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for f in files:
            info = tarfile.TarInfo(f.relative_to(folder).as_posix())
            info.size, info.mtime, info.mode = f.stat().st_size, 0, 0o644
            tar.addfile(info, io.BytesIO(f.read_bytes()))
    raw = buf.getvalue()
    # xz's strongest preset, its dictionary no larger than the data: preset 9's 64 MiB dictionary would be
    # allocated by every learner's first run to unpack 3 MB
    dict_size = max(1 << 20, 1 << (len(raw) - 1).bit_length())
    data = lzma.compress(raw, format=lzma.FORMAT_XZ, filters=[{"id": lzma.FILTER_LZMA2, "preset": 9, "dict_size": dict_size}])
    manifest = {"target": name, "cpu": t.cpu, "features": shipped_kernels.FEATURES, **shipped_kernels.versions(),
                "sources": numba_cache.sources_digest(), "sha256": hashlib.sha256(data).hexdigest(),
                "bytes": len(data), "unpacked_bytes": sum(f.stat().st_size for f in files),
                "kernels": sum(f.suffix == ".nbc" for f in files), "models": models}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / t.archive().name).write_bytes(data)
    (out_dir / t.manifest().name).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return manifest


def _child(mode: list[str], target: str, home: Path) -> None:
    env = dict(os.environ, LLMLAB_KERNEL_TARGET=target, LLMLAB_HOME=str(home),
               NUMBA_CACHE_DIR=str(home / "numba-other"), PYTHONPATH=str(ROOT))
    env.pop("NUMBA_CPU_NAME", None)
    env.pop("NUMBA_CPU_FEATURES", None)
    subprocess.run([sys.executable, __file__, *mode], env=env, check=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", action="append", help="a target of shipped_kernels.TARGETS (default: all)")
    p.add_argument("-m", "--model", action="append", help=f"models to warm (default: {', '.join(MODELS)})")
    p.add_argument("--out", default=None, help="folder for the archives (default: llmlab/data/kernels)")
    p.add_argument("--child", choices=("record", "compile"), help=argparse.SUPPRESS)
    p.add_argument("rest", nargs="*", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child == "record":
        record(args.rest[:-1], args.rest[-1])
        return 0
    if args.child == "compile":
        compile_from(args.rest[0])
        return 0
    from llmlab import models
    from llmlab.ggml.cpu import shipped_kernels
    names = args.target or list(shipped_kernels.TARGETS)
    bad = [n for n in names if n not in shipped_kernels.TARGETS]
    if bad:
        print(f"error: unknown target {bad[0]!r} (one of {', '.join(shipped_kernels.TARGETS)})", file=sys.stderr)
        return 2
    chosen = args.model or list(MODELS)
    paths = [str(models.resolve(m)) for m in chosen]
    out = Path(args.out) if args.out else shipped_kernels.ARCHIVES
    runs = shipped_kernels.host_target()
    with tempfile.TemporaryDirectory(prefix="llmlab-kernels-") as tmp:
        tmp, t0 = Path(tmp), time.perf_counter()
        first = runs.name if runs is not None else "host"
        print(f"recording what {', '.join(chosen)} reach (compiling for {first}) ...", file=sys.stderr, flush=True)
        _child(["--child", "record", *paths, str(tmp / "sigs.pkl")], first, tmp / first)
        for name in names:
            if name != first:
                print(f"compiling for {name} ...", file=sys.stderr, flush=True)
                _child(["--child", "compile", str(tmp / "sigs.pkl")], name, tmp / name)
            m = pack(name, tmp / name, out, chosen)
            print(f"{name}: {m['kernels']} kernels, {m['bytes'] / 1e6:.2f} MB ({m['unpacked_bytes'] / 1e6:.1f} MB "
                  f"unpacked) -> {out / shipped_kernels.TARGETS[name].archive().name}", file=sys.stderr, flush=True)
        print(f"done in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
