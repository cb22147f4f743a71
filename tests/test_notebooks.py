"""Every notebook runs top to bottom headless (the slow suite)."""
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path):
    from llmlab.nb.runner import run_notebook
    run_notebook(path, timeout=900)
