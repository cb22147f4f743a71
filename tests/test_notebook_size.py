"""Every committed notebook stays under 1 MB: learners open them on GitHub and in the handout, where a
bigger file loads slowly or not at all. Figures are palette PNGs at display size, each graph one SVG
(``llmlab.nb.compact_inline_figures``, ``llmlab.nb.live``, ``llmlab.nb.graph_html``)."""
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
