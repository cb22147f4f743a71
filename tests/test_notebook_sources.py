"""Each committed notebook has the cells of its source, the jupytext percent script paired with it
(notebooks/jupytext.toml: notebooks/src/NN_name.py): same cells, types, text and solution metadata.
Nothing runs here; `make notebooks` takes the cells from the sources and stores fresh outputs."""
from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from llmlab.nb.exercises import SOLUTION_TAG
from llmlab.nb.runner import read_source, source_of, sync_from_source

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


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_equals_its_source(path):
    have, want = _cells(nbformat.read(path, as_version=4)), _cells(read_source(path))
    for i, (a, b) in enumerate(zip(have, want)):
        assert a == b, (f"{path.name} cell {i} differs from {source_of(path).name} (edit the source, then "
                        f"make notebooks):\n{a}\n{b}")
    assert len(have) == len(want), f"{path.name} has {len(have)} cells, its source {len(want)}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_exercises_follow_the_convention(path):
    """A solution cell is collapsed and ends with its checker call; a checker cell never shows a bare
    True/False (the verdict is one line: correct, not yet, no answer yet)."""
    nb = nbformat.read(path, as_version=4)
    for i, c in enumerate(nb.cells):
        if c.cell_type != "code":
            continue
        if SOLUTION_TAG in c.metadata.get("tags", []):
            assert c.metadata.get("jupyter", {}).get("source_hidden"), f"{path.name} cell {i}: a solution opens collapsed"
            last = [line for line in c.source.splitlines() if line.strip() and not line.startswith("#")][-1]
            assert CHECKER_CALL.match(last), f"{path.name} cell {i}: a solution ends by showing its checker's verdict"
        if "check_" in c.source:
            shown = [o.data.get("text/plain") for o in c.get("outputs", []) if o.output_type == "execute_result"]
            assert not {"True", "False"} & set(shown), f"{path.name} cell {i} shows a bare True/False"


def test_sync_keeps_the_outputs_of_unchanged_cells(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "jupytext.toml").write_text((ROOT / "notebooks" / "jupytext.toml").read_text())
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
