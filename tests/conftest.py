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
from pathlib import Path

import numpy as np
import pytest

from llmlab import models
from llmlab.ggml.cpu import profiles

DATA = Path(__file__).parent / "data"
REFS = DATA / "refs"
REF_STEMS = {"smollm2": "smollm2-135m-instruct-q4_1", "gemma3": "gemma-3-270m-q4_k_m"}
REF_DIRS = {"avx512": REFS, "avx2": REFS / "avx2",          # the logits of llama.cpp built for each CPU
            "arm_dotprod_fp16": REFS / "arm_dotprod_fp16",   # (ARM: the aarch64 build under qemu-user)
            "arm_i8mm": REFS / "arm_i8mm"}
# profiles without references for a model, and why (their suites skip it, saying so)
NO_REFS = {("arm_i8mm", "gemma3"): "arm_i8mm does not reproduce Gemma 3 yet (the q4_K/q6_K 8x8 REPACK kernels "
                                   "of MATMUL_INT8 are not written): no references"}
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


def _fail_oracle_skips(report) -> None:
    if REQUIRE_ORACLES and _oracle_skip(report):
        report.outcome = "failed"
        report.longrepr = f"oracle missing under LLMLAB_REQUIRE_ORACLES: {report.longrepr}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _fail_oracle_skips(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _fail_oracle_skips(outcome.get_result())


def pytest_addoption(parser):
    parser.addoption("--slow", action="store_true", help="also run the slow suites (notebooks, full-model llama.cpp runs)")
    parser.addoption("--arm64", action="store_true",
                     help="also run the live comparisons with the aarch64 llama.cpp under qemu (make test-arm64)")


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
    if config.getoption("--slow"):
        return
    skip = pytest.mark.skip(reason="slow suite: run with --slow (make test-slow)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


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
    if (cpu, name) in NO_REFS:
        pytest.skip(NO_REFS[cpu, name])
    d, stem = REF_DIRS[cpu], REF_STEMS[name]
    return json.loads((d / f"{stem}.logits.json").read_text()), dict(np.load(d / f"{stem}.logits.npz"))
