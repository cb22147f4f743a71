"""The compiled kernels llmlab ships (llmlab/data/kernels/, ``make kernels``) are these sources' kernels, for the
pinned numba, and a fresh process on a CPU a target fits loads them: nothing compiled, llama.cpp's tokens."""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ref_logits
from llmlab.ggml.cpu import numba_cache, shipped_kernels
from llmlab.ggml.cpu.shipped_kernels import TARGETS

ROOT = Path(__file__).resolve().parent.parent
MAX_BYTES = 4 << 20         # an archive larger than this does not belong in a git repository


def pinned(dist: str) -> str:
    """The version constraints.txt (the set-ups' pip constraints) pins ``dist`` to."""
    lines = [ln.split("#")[0].strip() for ln in (ROOT / "constraints.txt").read_text().splitlines()]
    found = [m.group(1) for m in (re.fullmatch(rf"{dist}==([0-9.]+)", ln) for ln in lines) if m]
    assert len(found) == 1, f"constraints.txt pins no exact {dist} version"
    return found[0]


def manifests() -> list[tuple[Path, dict]]:
    return [(p, json.loads(p.read_text())) for p in sorted(shipped_kernels.ARCHIVES.glob("*.json"))]


def test_every_target_has_an_archive_of_these_sources_for_the_pinned_numba():
    """Stale archives fail here (make kernels rebuilds them): each manifest names the kernel sources' digest,
    the numba and llvmlite constraints.txt pins, and the hash of the archive beside it."""
    found = manifests()
    assert {m["target"] for _, m in found} == set(TARGETS), "make kernels: a target has no archive"
    digest = numba_cache.sources_digest()
    for path, m in found:
        t = TARGETS[m["target"]]
        archive = path.with_suffix(".tar.xz")
        assert m["sources"] == digest, f"{archive.name} is older than the kernel sources: run make kernels"
        for dist in ("numba", "llvmlite"):
            assert m[dist] == pinned(dist), f"{archive.name} is for {dist} {m[dist]}, constraints.txt pins {pinned(dist)}"
        assert (m["cpu"], m["features"]) == (t.cpu, shipped_kernels.FEATURES)
        data = archive.read_bytes()
        assert hashlib.sha256(data).hexdigest() == m["sha256"] and len(data) == m["bytes"]
        assert len(data) <= MAX_BYTES, f"{archive.name}: {len(data)} bytes"
        assert path.name == f"{m['target']}-py{m['python'].replace('.', '')}.json"


def _fresh_env(tmp_path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NUMBA_", "LLMLAB_KERNEL"))}
    env.update(PYTHONPATH=str(ROOT), LLMLAB_HOME=str(tmp_path / "home"), NUMBA_CACHE_DIR=str(tmp_path / "numba"))
    return env


def test_a_fresh_process_loads_the_shipped_kernels_and_compiles_nothing(tmp_path, smollm2_path):
    """A machine that never ran llmlab (empty LLMLAB_HOME and numba cache): generate's warm-up loads every kernel
    from the shipped archive, compiles none, and the greedy tokens are llama.cpp's."""
    t = shipped_kernels.host_target()
    if t is None:
        pytest.skip("no shipped target fits this CPU")
    why = shipped_kernels.mismatch(t, shipped_kernels.read_manifest(t))
    if why is not None and "older than these kernel sources" not in why:
        pytest.skip(why)        # another numba or Python than the archives' (stale archives fail the first test)
    assert why is None, why
    meta, npz = ref_logits("smollm2")
    r = subprocess.run([sys.executable, "-m", "llmlab", "generate", "-m", str(smollm2_path), "-p",
                        meta["prompts"][1]["prompt"], "-n", "12", "--temp", "0", "--json"],
                       capture_output=True, text=True, env=_fresh_env(tmp_path), cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stderr.splitlines() if x.startswith("kernels:"))
    assert f"loaded from numba's cache (shipped with llmlab for {t.name})" in line and "compiled" not in line, line
    assert json.loads(r.stdout)["ids"] == npz["p1_greedy"].tolist()
    assert list((tmp_path / "home" / "numba" / "shipped").glob(f"{t.name}-*/.unpacked"))


def test_a_stale_or_damaged_archive_is_never_unpacked(tmp_path, monkeypatch):
    """Sources newer than the archive, another numba, a damaged archive: never loaded; the reason is what the
    warm-up line says when numba then compiles."""
    t = shipped_kernels.host_target() or next(iter(TARGETS.values()))
    good = shipped_kernels.read_manifest(t)
    if good is None:
        pytest.skip(f"no archive for {t.name} on this Python")
    here = {**good, **shipped_kernels.versions(), "sources": numba_cache.sources_digest()}
    assert shipped_kernels.mismatch(t, here) is None
    assert "for numba 0.1.0, this is" in shipped_kernels.mismatch(t, {**here, "numba": "0.1.0"})
    assert "older than these kernel sources" in shipped_kernels.mismatch(t, {**here, "sources": "0" * 40})
    monkeypatch.setenv("LLMLAB_HOME", str(tmp_path))
    with pytest.raises(ValueError, match="not the archive its manifest describes"):
        shipped_kernels.unpack(t, {**here, "sha256": "0" * 64})
    assert not any(tmp_path.rglob("*.nbc"))


def test_an_archive_member_outside_its_folder_is_refused(tmp_path):
    """Unpacking writes only regular files under the cache folder (Python 3.11 before 3.11.4 has no
    ``filter="data"``): a name with ``..`` or a link is a damaged archive, nothing is written outside."""
    import io
    import tarfile
    for name, kind in (("../escape.nbc", tarfile.REGTYPE), ("ggml/link.nbc", tarfile.SYMTYPE)):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:xz") as tar:
            info = tarfile.TarInfo(name)
            info.type, info.size = kind, 0
            tar.addfile(info, io.BytesIO(b""))
        with pytest.raises(ValueError, match="unexpected member"):
            shipped_kernels._extract(buf.getvalue(), tmp_path / "into" / name.replace("/", "_"))
    assert not (tmp_path / "escape.nbc").exists()


def test_the_warm_up_line_says_where_the_kernels_came_from(monkeypatch):
    """Loaded from the shipped kernels, compiled because they did not fit (and why), compiled for a target named by
    LLMLAB_KERNEL_TARGET: the line says which happened."""
    from llmlab.warm import Warmup
    t = next(iter(TARGETS.values()))
    for k, v in (("target", t), ("shipped", True), ("note", None)):
        monkeypatch.setitem(shipped_kernels._STATE, k, v)
    assert f"14 loaded from numba's cache (shipped with llmlab for {t.name})" in Warmup(0.4, 0, 14, 0.0).summary()
    assert f"not in the shipped kernels for {t.name}" in Warmup(30.0, 2, 12, 29.0).summary()
    monkeypatch.setitem(shipped_kernels._STATE, "shipped", False)
    assert f"for {t.name}, LLMLAB_KERNEL_TARGET" in Warmup(30.0, 2, 0, 29.0).summary()
    for k, v in (("target", None), ("note", "the shipped kernels are for numba 0.1.0, this is 0.2.0")):
        monkeypatch.setitem(shipped_kernels._STATE, k, v)
    line = Warmup(120.0, 16, 0, 118.0).summary()
    assert line.startswith("kernels: compiled 16") and "(the shipped kernels are for numba 0.1.0, this is 0.2.0; once" in line


_LOAD_ALL = r"""
import pickle, sys
from pathlib import Path
import llmlab.ggml.cpu.fast                     # chooses the target and unpacks its archive
from llmlab.ggml.cpu import shipped_kernels as sk
from llmlab.ggml.cpu.fast import dot4
t = sk.active()
assert t is not None and t.name == sys.argv[1], (t, sk.note())
assert dot4.ISA == t.isas[0], dot4.ISA
import importlib, pkgutil
mods = {i.name: importlib.import_module(f"llmlab.ggml.cpu.fast.{i.name}") for i in pkgutil.iter_modules(llmlab.ggml.cpu.fast.__path__)}
loaded = compiled = 0
for index in sorted(sk.folder(t).rglob("*.nbi")):
    module, qualname = index.name.split("-")[0].split(".", 1)
    with open(index, "rb") as f:
        pickle.load(f)
        _, overloads = pickle.loads(f.read())
    d = getattr(mods[module], qualname)
    for sig, magic, _ in overloads:
        assert magic[1:] == (t.cpu, sk.FEATURES), magic
        d.compile(sig)                          # a cache hit loads it; never run (this CPU may lack the target's)
    loaded += sum(d.stats.cache_hits.values()); compiled += sum(d.stats.cache_misses.values())
print("loaded", loaded, "compiled", compiled)
"""


@pytest.mark.parametrize("name", list(TARGETS))
def test_every_archive_loads_for_its_target_without_compiling(tmp_path, name):
    """Each archive, on a CPU its target fits (this CPU's features stood in by LLMLAB_CPUINFO where it lacks
    them: the machine code is loaded, never run), loads every kernel it holds and compiles none; the byte-dot
    kernels are the target's."""
    t = TARGETS[name]
    why = shipped_kernels.mismatch(t, shipped_kernels.read_manifest(t))
    if why is not None and "older than these kernel sources" not in why:
        pytest.skip(why)
    from llmlab.ggml.cpu import profiles
    if profiles.machine() != t.machine:
        pytest.skip(f"{t.name} is for {t.machine}")
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("model name\t: a CPU the target fits\nflags\t\t: " + " ".join(sorted(t.needs | {"pni"})) + "\n")
    env = _fresh_env(tmp_path)
    env["LLMLAB_CPUINFO"] = str(cpuinfo)
    r = subprocess.run([sys.executable, "-c", _LOAD_ALL, name], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    loaded, compiled = (int(x) for x in r.stdout.split()[1::2])
    assert loaded == shipped_kernels.read_manifest(t)["kernels"] and compiled == 0, r.stdout


def test_the_builder_swaps_every_byte_dot_table_for_the_targets_own():
    """tools/ship_kernels.py compiles a host's recorded signatures for every other target with each byte-dot
    kernel swapped for the target's: every table (dot4's single and multi-weight entries, the ARM twins')
    must be found, or an AVX-512 host hands LLVM a 512-bit vpdpbusd to lower for haswell (it aborts)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    import ship_kernels
    from llmlab.ggml.cpu.fast import dot4, dot4_neon
    found = ship_kernels._byte_dot_tables()
    for table in (dot4.KERNELS, dot4.MULTI, dot4_neon.KERNELS):
        for per_isa in table.values():
            for family, k in per_isa.items():
                assert found.get(id(k)) == (table, family)
