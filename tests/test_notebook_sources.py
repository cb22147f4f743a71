"""Each committed notebook is the learner's edition of its source, the jupytext percent script
notebooks/src/NN_name.py: the same cells, types, text and metadata minus the solution cells; it
shows no answer, needs nothing only a solution defines, and starts with the set-up cell. Nothing
runs here; `make notebooks` takes the cells from the sources and stores fresh outputs (the slow
tests/test_notebooks.py runs the teacher's edition, solutions included)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import nbformat
import pytest

from llmlab.nb.colab import SETUP_CELL, with_pip
from llmlab.nb.exercises import SOLUTION_TAG, is_correct
from llmlab.nb.runner import learner_edition, read_source, solution_dependencies, source_of, sync_from_source

ROOT = Path(__file__).parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
CHECKER_CALL = re.compile(r"^(\w+\.)?check_\w+\(")


def _cells(nb) -> list[tuple]:
    return [(c.cell_type, c.source, c.metadata.get("jupyter", {}).get("source_hidden", False), c.metadata.get("tags", []))
            for c in nb.cells]


def test_every_notebook_and_every_source_have_their_pair():
    assert NOTEBOOKS
    sources = sorted((ROOT / "notebooks" / "src").glob("*.py"))
    assert [source_of(p) for p in NOTEBOOKS] == [ROOT / "notebooks" / "src" / f"{p.stem}.py" for p in NOTEBOOKS]
    assert sources == [source_of(p) for p in NOTEBOOKS], "a source without its notebook: run make notebooks"


def test_no_jupytext_pairing():
    """A learner who saves a notebook in JupyterLab (jupytext installed) must not rewrite its source,
    nor see the source's solutions: nothing pairs them, the runner is the one sync path."""
    for folder in (ROOT, ROOT / "notebooks", ROOT / "notebooks" / "src"):
        configs = [p.name for p in folder.iterdir() if p.name.startswith(("jupytext.", ".jupytext"))]
        assert not configs, f"{folder}: a jupytext configuration pairs notebooks with their sources: {configs}"
    assert "[tool.jupytext]" not in (ROOT / "pyproject.toml").read_text()
    for path in NOTEBOOKS:
        assert "jupytext" not in nbformat.read(path, as_version=4).metadata, f"{path.name} carries jupytext pairing metadata"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_is_the_learners_edition_of_its_source(path):
    have, want = _cells(nbformat.read(path, as_version=4)), _cells(learner_edition(read_source(path)))
    for i, (a, b) in enumerate(zip(have, want)):
        assert a == b, (f"{path.name} cell {i} differs from {source_of(path).name} (edit the source, then "
                        f"make notebooks):\n{a}\n{b}")
    assert len(have) == len(want), f"{path.name} has {len(have)} cells, its source {len(want)}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_exercises_follow_the_convention(path):
    """In the source a solution cell is collapsed and ends with its checker call; in the notebook a
    checker cell never shows a bare True/False (the verdict is one line: correct, not yet, no answer yet)."""
    for i, c in enumerate(read_source(path).cells):
        if c.cell_type == "code" and SOLUTION_TAG in c.metadata.get("tags", []):
            assert c.metadata.get("jupyter", {}).get("source_hidden"), f"{path.name} cell {i}: a solution opens collapsed"
            # the last statement (a call wrapped over several lines included) starts with the checker
            last = ast.parse(c.source).body[-1]
            text = ast.get_source_segment(c.source, last) or ""
            assert isinstance(last, ast.Expr) and CHECKER_CALL.match(text), \
                f"{path.name} cell {i}: a solution ends by showing its checker's verdict"
    for i, c in enumerate(nbformat.read(path, as_version=4).cells):
        if c.cell_type == "code" and "check_" in c.source:
            shown = [o.data.get("text/plain") for o in c.get("outputs", []) if o.output_type == "execute_result"]
            assert not {"True", "False"} & set(shown), f"{path.name} cell {i} shows a bare True/False"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_committed_notebook_shows_no_answer(path):
    """Run All in the learner's notebook never executes a solution, and its committed outputs show
    no "correct" verdict: the source has solutions, the notebook none, its checkers say "no answer yet"."""
    assert any(SOLUTION_TAG in c.metadata.get("tags", []) for c in read_source(path).cells), \
        f"{source_of(path).name} has no solution cell: this test would prove nothing"
    for i, c in enumerate(nbformat.read(path, as_version=4).cells):
        assert SOLUTION_TAG not in c.metadata.get("tags", []), f"{path.name} cell {i} is a solution cell"
        lines = [line for o in c.get("outputs", []) if o.output_type == "stream" for line in o.text.splitlines()]
        shown = [line for line in lines if is_correct(line)]
        assert not shown, f"{path.name} cell {i} shows an answer's verdict: {shown[0]}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_learner_edition_needs_no_solution(path):
    """No cell reads a name that only a solution cell defines, so the learner's edition runs on its
    own (its committed outputs are cut from the teacher's run, solutions included)."""
    assert solution_dependencies(read_source(path)) == [], f"{path.name}: (cell, name) needing a solution"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_starts_with_the_setup_cell(path):
    """The first code cell installs llmlab where it is missing (Colab): llmlab.nb.colab's text, verbatim."""
    first = next(c for c in read_source(path).cells if c.cell_type == "code")
    assert first.source == SETUP_CELL, f"{source_of(path).name}: the first code cell is not llmlab.nb.colab.SETUP_CELL"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_reads_no_path_into_a_checkout(path):
    """A notebook copied anywhere runs: its code reads data through the package (llmlab.data), never
    a path relative to the checkout (../data, ../tests/data) nor the checkout's root."""
    for i, c in enumerate(read_source(path).cells):
        if c.cell_type == "code":
            found = re.findall(r"""["']\.\./|tests/data|nb\.ROOT|nb\.CHECKOUT""", c.source)
            assert not found, f"{source_of(path).name} cell {i} reads {found[0]!r}: use llmlab.data"


def test_setup_cell(monkeypatch):
    """Where llmlab is importable the set-up cell does nothing; where it is not, it asks for the
    address or installs from it."""
    import importlib.util
    import subprocess
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, check: calls.append(cmd))
    exec(SETUP_CELL, {})
    assert calls == []
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(RuntimeError, match="set LLMLAB_PIP"):
        exec(SETUP_CELL, {})
    exec(with_pip(SETUP_CELL, "git+https://example.org/llmlab.git"), {})
    assert calls and calls[0][-1] == "git+https://example.org/llmlab.git" and calls[0][1:4] == ["-m", "pip", "install"]
    with pytest.raises(ValueError):
        with_pip("x = 1", "y")


def test_learner_edition_and_its_dependencies():
    def code(src, solution=False, n=None):
        c = nbformat.v4.new_code_cell(src, metadata={"tags": [SOLUTION_TAG]} if solution else {})
        c.execution_count = n
        if n:
            c.outputs = [nbformat.v4.new_output("execute_result", data={"text/plain": "1"}, execution_count=n)]
        return c
    nb = nbformat.v4.new_notebook(cells=[code("x = 0\ncheck_x(x)", n=1), code("x = 5\ny = x\ncheck_x(x)", True, 2),
                                         code("print(x)", n=3), code("print(y)", n=4), code("def f(y):\n    return y", n=5)])
    learner = learner_edition(nb)
    assert [c.source for c in learner.cells] == ["x = 0\ncheck_x(x)", "print(x)", "print(y)", "def f(y):\n    return y"]
    assert [c.execution_count for c in learner.cells] == [1, 2, 3, 4]
    assert [c.outputs[0].execution_count for c in learner.cells] == [1, 2, 3, 4]
    assert len(nb.cells) == 5 and nb.cells[2].execution_count == 3          # the teacher's edition is untouched
    assert solution_dependencies(nb) == [(3, "y")]           # x exists without the solution; y does not


def test_sync_keeps_the_outputs_of_unchanged_cells(tmp_path):
    (tmp_path / "src").mkdir()
    src = tmp_path / "src" / "00_x.py"
    src.write_text('# %% [markdown]\n# # Title\n\n# %%\nx = 1\nx\n\n'
                   '# %% jupyter={"source_hidden": true} tags=["solution"]\ny = 2\n')
    path = tmp_path / "00_x.ipynb"
    nb = sync_from_source(path)                       # no notebook yet: made from the source
    assert _cells(nb) == [("markdown", "# Title", False, []), ("code", "x = 1\nx", False, []),
                          ("code", "y = 2", True, ["solution"])]
    nb.cells[1].outputs = [nbformat.v4.new_output("execute_result", data={"text/plain": "1"}, execution_count=1)]
    nb.cells[2].outputs = [nbformat.v4.new_output("stream", text="two\n")]
    nbformat.write(nb, str(path))
    src.write_text(src.read_text().replace("y = 2", "y = 3"))
    synced = sync_from_source(path)
    assert _cells(synced)[2] == ("code", "y = 3", True, ["solution"])
    assert synced.cells[1].outputs == nb.cells[1].outputs and synced.cells[2].outputs == []
    assert [c.id for c in synced.cells] == [c.id for c in nb.cells]
