"""Shared fixtures: the two real models (fetched once into the cache), the llama.cpp references.

References exist per CPU profile (``REF_DIRS``): tests against stored references run for every
profile that has them, on any machine (the emulation is deterministic); tests against the live
llama.cpp use the detected profile (``LIVE``), and the bit-exact ones (marker ``llamacpp_exact``)
are skipped on a machine whose llama.cpp no profile reproduces.

Only optional third-party oracles may skip a test, with a reason that names them (``ORACLES``). ``make
test`` installs all of them and sets ``LLMLAB_REQUIRE_ORACLES=1``: then a missing oracle is a broken
set-up, and the suite fails (at start, and for every test that would have skipped on one).
Besides those, a test skips only where the machine lacks what it tests (x86 instruction sets for the
kernels' machine code, Linux's /proc), the markers above (``slow``, ``llamacpp_exact``, ``browser``),
or a CPU profile without stored references; never for a missing model (``models.resolve`` fetches it)
nor for a parameter that cannot apply (leave it out of the parametrization).
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from llmlab import data, models
from llmlab.ggml.cpu import profiles

DATA = Path(__file__).parent / "data"
REFS = data.ref_dir()                                        # llama.cpp's references ship in the package
REF_STEMS = data.REF_STEMS
REF_DIRS = {cpu: data.ref_dir(cpu) for cpu in data.REF_DIRS}   # the logits of llama.cpp built for each CPU
REF_PROFILES = [p for p, d in REF_DIRS.items() if (d / f"{REF_STEMS['smollm2']}.logits.npz").exists()]
LIVE = profiles.detect()                                     # the profile of this machine's llama.cpp


# module -> what to install; the only imports a test may skip on
ORACLES = {"llama_cpp": "llama-cpp-python", "gguf": "gguf (gguf-py)", "ipywidgets": "ipywidgets (the lab extra)",
           "nbclient": "nbclient (the lab extra)", "nbconvert": "nbconvert (the lab extra)"}
REQUIRE_ORACLES = os.environ.get("LLMLAB_REQUIRE_ORACLES", "") not in ("", "0")


def pytest_sessionstart(session):
    if REQUIRE_ORACLES:
        missing = [pkg for mod, pkg in ORACLES.items() if importlib.util.find_spec(mod) is None]
        if missing:
            raise pytest.UsageError(f"LLMLAB_REQUIRE_ORACLES is set but {', '.join(missing)} is not installed "
                                    "(make setup installs them)")


def _oracle_skip(report) -> bool:
    """A skip caused by a missing oracle (importorskip's reasons name the module or the package)."""
    if not report.skipped:
        return False
    reason = str(report.longrepr[-1] if isinstance(report.longrepr, tuple) else report.longrepr)
    return any(mod in reason or pkg.split()[0] in reason for mod, pkg in ORACLES.items())


def _built_oracle_skip(report, config) -> bool:
    """A skip for a missing rpc-server in the slow suite, whose make target builds it first."""
    reason = str(report.longrepr[-1] if isinstance(report.longrepr, tuple) else report.longrepr)
    return report.skipped and config.getoption("--slow") and "make rpc-server" in reason


def _fail_oracle_skips(report, config) -> None:
    if REQUIRE_ORACLES and (_oracle_skip(report) or _built_oracle_skip(report, config)):
        report.outcome = "failed"
        report.longrepr = f"oracle missing under LLMLAB_REQUIRE_ORACLES: {report.longrepr}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _fail_oracle_skips(outcome.get_result(), item.config)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _fail_oracle_skips(outcome.get_result(), collector.config)


def pytest_addoption(parser):
    parser.addoption("--slow", action="store_true", help="also run the slow suites (notebooks, full-model llama.cpp runs)")
    parser.addoption("--arm64", action="store_true",
                     help="also run the live comparisons with the aarch64 llama.cpp under qemu (make test-arm64)")
    parser.addoption("--arm64-native", action="store_true",
                     help="also run llmlab itself in an arm64 Debian root under qemu (make test-arm64-native)")


def pytest_collection_modifyitems(config, items):
    if not LIVE.reproduced:
        no_exact = pytest.mark.skip(reason=f"this machine's llama.cpp is not reproduced by any llmlab profile "
                                           f"(emulating {LIVE.profile.name}): no bit-exact comparison with it")
        for item in items:
            if "llamacpp_exact" in item.keywords:
                item.add_marker(no_exact)
    if not config.getoption("--arm64"):
        no_qemu = pytest.mark.skip(reason="live aarch64 llama.cpp under qemu: run with --arm64 (make test-arm64)")
        for item in items:
            if "arm64" in item.keywords:
                item.add_marker(no_qemu)
    if not config.getoption("--arm64-native"):
        no_root = pytest.mark.skip(reason="llmlab in an arm64 root under qemu: run with --arm64-native (make test-arm64-native)")
        for item in items:
            if "arm64_native" in item.keywords:
                item.add_marker(no_root)
    if config.getoption("--slow"):
        if not config.getoption("--arm64"):
            # the ARM profiles' whole stored-reference suites (~20 min) belong to make test-arm64; the default
            # suite keeps their first prompt of each model
            arm = {name for name, p in profiles.PROFILES.items() if p.arch != "x86_64"}
            keep, drop = [], []
            for item in items:
                params = getattr(getattr(item, "callspec", None), "params", {})
                on_arm = ("slow" in item.keywords and "arm64_native" not in item.keywords
                          and any(isinstance(v, str) and v in arm for v in params.values()))
                (drop if on_arm else keep).append(item)
            if drop:
                config.hook.pytest_deselected(items=drop)
                items[:] = keep
        return
    skip = pytest.mark.skip(reason="slow suite: run with --slow (make test-slow)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def llama_cpp_src() -> Path:
    """The llama.cpp source that llama-cpp-python 0.3.36 vendors, unpacked from its sdist once
    (tools/llama_cpp_source.sh: a copy already unpacked by the oracle or rpc-server builds, else PyPI)."""
    script = Path(__file__).resolve().parent.parent / "tools" / "llama_cpp_source.sh"
    from llmlab import LLAMA_CPP_PYTHON
    out = subprocess.run(["bash", str(script), str(Path.home() / ".cache" / "llmlab"), LLAMA_CPP_PYTHON],
                         env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True)
    assert out.returncode == 0, f"could not unpack llama-cpp-python {LLAMA_CPP_PYTHON}'s sdist: {out.stderr.strip()[-500:]}"
    return Path(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    return models.resolve("smollm2")


@pytest.fixture(scope="session")
def gemma3_path() -> Path:
    return models.resolve("gemma3")


@pytest.fixture(scope="session", params=["smollm2", "gemma3"])
def real_model(request) -> tuple[str, Path]:
    """(registry name, path) for each real model."""
    return request.param, models.resolve(request.param)


def ref_tokens(name: str) -> list[dict]:
    return json.loads((REFS / f"{REF_STEMS[name]}.tokens.json").read_text())["cases"]


def ref_logits(name: str, cpu: str | None = None) -> tuple[dict, dict]:
    """llama.cpp's logits for the model's prompts, as the build for ``cpu`` computed them (default: the
    profile of this machine's llama.cpp). Prompt ids and greedy tokens' ids are the same in every set."""
    cpu = cpu or LIVE.profile.name
    if cpu not in REF_DIRS:
        pytest.skip(f"no llama.cpp references for the {cpu} profile")
    d, stem = REF_DIRS[cpu], REF_STEMS[name]
    return json.loads((d / f"{stem}.logits.json").read_text()), dict(np.load(d / f"{stem}.logits.npz"))
