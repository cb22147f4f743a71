"""binder/ (what repo2docker builds a Binder or JupyterHub image from) stays in step with the
project: every runtime and lab dependency of pyproject.toml, the system packages `make setup`
installs, and every model a notebook's set-up asks for. Nothing is built here."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).parent.parent
BINDER = ROOT / "binder"
CONDA_NAMES = {"graphviz": "python-graphviz"}        # PyPI name -> conda-forge name, where they differ


def _name(requirement: str) -> str:
    return re.match(r"[A-Za-z0-9_.-]+", requirement).group(0).lower()


def test_binder_environment_has_the_runtime_and_lab_dependencies():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {CONDA_NAMES.get(_name(r), _name(r)) for r in project["dependencies"] + project["optional-dependencies"]["lab"]}
    listed = {_name(line.split("-", 1)[1].strip()) for line in (BINDER / "environment.yml").read_text().splitlines()
              if re.match(r"\s+- [A-Za-z]", line)}
    assert wanted <= listed, f"binder/environment.yml lacks {sorted(wanted - listed)}"
    assert "llama-cpp-python" not in listed, "the oracle builds llama.cpp from source: too long for a hub image"


def test_binder_system_packages_are_make_setups():
    make = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^system-deps:\n(.*?)\n\n", make, re.M | re.S).group(1)
    system = set(re.findall(r'missing="\$\$missing ([a-z0-9-]+)"', recipe))
    assert system and system <= set((BINDER / "apt.txt").read_text().split())


def test_binder_post_build_fetches_and_warms_every_notebook_model():
    post = (BINDER / "postBuild").read_text()
    assert post.startswith("#!/bin/bash") and (BINDER / "postBuild").stat().st_mode & 0o111, "postBuild is an executable script"
    assert "pip install --no-deps -e ." in post
    asked = set()
    for src in (ROOT / "notebooks" / "src").glob("*.py"):
        for models in re.findall(r"nb\.setup\(models=\[([^\]]*)\]", src.read_text()):
            asked |= set(re.findall(r'"(\w+)"', models))
    assert asked, "no notebook calls nb.setup(models=[...])"
    for name in asked:
        assert f"python -m llmlab fetch {name}\n" in post and f"-m {name}" in post, f"postBuild does not fetch and warm {name}"
