"""Shared fixtures: the two real models (fetched once into the cache), the llama.cpp references."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from llmlab import models

DATA = Path(__file__).parent / "data"
REFS = DATA / "refs"
REF_STEMS = {"smollm2": "smollm2-135m-instruct-q4_1", "gemma3": "gemma-3-270m-q4_k_m"}


def pytest_addoption(parser):
    parser.addoption("--slow", action="store_true", help="also run the slow suites (notebooks, full-model llama.cpp runs)")


def pytest_collection_modifyitems(config, items):
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


def ref_logits(name: str) -> tuple[dict, dict]:
    stem = REF_STEMS[name]
    return json.loads((REFS / f"{stem}.logits.json").read_text()), dict(np.load(REFS / f"{stem}.logits.npz"))
