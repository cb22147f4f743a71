"""Every committed notebook stays under 1 MB, and its source's code within 88 columns. Under 1 MB:
learners open the notebooks on GitHub and in the handout, where a bigger file loads slowly or not at
all. Figures are palette PNGs at display size, each graph one SVG (``llmlab.nb.compact_inline_figures``,
``llmlab.nb.live``, ``llmlab.nb.graph_html``)."""
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("[0-9][0-9]_*.ipynb"))
LIMIT = 1_000_000


def test_the_notebooks_are_there():
    assert len(NOTEBOOKS) >= 9


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_under_one_megabyte(path):
    size = path.stat().st_size
    assert size < LIMIT, f"{path.name} is {size:,} bytes (limit {LIMIT:,}): re-run it with `make notebooks`"


def test_notebook_code_within_88_columns():
    """JupyterLab cuts a code line wider than its cell: the sources' code cells stay within 88 columns
    (ruff's E501 over the code cells, markdown left out: tools/lint_notebooks.py, also run by make lint)."""
    import importlib.util
    import sys
    if importlib.util.find_spec("ruff") is None:
        pytest.skip("ruff is not installed (the dev extras)")
    root = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(root / "tools"))
    try:
        import lint_notebooks
    finally:
        sys.path.remove(str(root / "tools"))
    assert lint_notebooks.main([]) == 0, "run: python tools/wrap_notebook_code.py notebooks/src/*.py"
