"""Every notebook runs top to bottom headless (the slow suite), as its teacher's edition: the cells of
its source, solutions included, so each solution's checker must say "correct". The learner's edition
(the committed .ipynb, the same run minus the solutions) is checked without running it again, in
tests/test_notebook_sources.py. Notebooks 00 and 08, copied alone into an empty folder outside the
checkout, run with the installed package: nothing reads a path into a checkout."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
ANYWHERE = ["00_overview", "08_full_generation"]


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_with_its_solutions(path):
    from llmlab.nb.runner import run_notebook
    nb = run_notebook(path, timeout=900, from_source=True)
    assert any("solution" in c.metadata.get("tags", []) for c in nb.cells), f"{path.name}: the teacher's edition has no solution"


@pytest.mark.slow
@pytest.mark.parametrize("name", ANYWHERE)
def test_notebook_runs_outside_the_checkout(name, tmp_path):
    """A learner's notebook alone in an empty folder (Colab, a hub, a USB stick): the set-up cell sees
    llmlab installed and does nothing, the data come through the package."""
    folder = tmp_path / "anywhere"
    folder.mkdir()
    shutil.copy2(ROOT / "notebooks" / f"{name}.ipynb", folder)
    r = subprocess.run([sys.executable, "-m", "llmlab.nb.runner", "--timeout", "900", f"{name}.ipynb"],
                       cwd=folder, capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.startswith(f"ok     {name}.ipynb")
    assert sorted(p.name for p in folder.iterdir()) == [f"{name}.ipynb"], "the run wrote beside the notebook"
