"""The one helper every notebook generator (make_NN.py) uses: collect cells, write the notebook.

    from nbgen import code, md, solution, write
    md("# Title"); code("x = 1"); solution("answer = 42")
    write("NN_name.ipynb")      # then: python -m llmlab.notebook_runner --write notebooks/NN_name.ipynb
"""
from pathlib import Path

import nbformat as nbf

cells: list = []


def md(s: str) -> None:
    cells.append(nbf.v4.new_markdown_cell(s.strip()))


def code(s: str) -> None:
    cells.append(nbf.v4.new_code_cell(s.strip()))


def solution(s: str) -> None:
    """A code cell whose source is collapsed when the notebook opens (click to reveal)."""
    cells.append(nbf.v4.new_code_cell(s.strip(), metadata={"jupyter": {"source_hidden": True}, "tags": ["solution"]}))


def write(name: str) -> Path:
    """The notebook next to this folder, with the kernelspec the runner stores after a run."""
    nb = nbf.v4.new_notebook()
    nb["cells"] = cells
    nb["metadata"] = {"kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"},
                      "language_info": {"name": "python"}}
    out = Path(__file__).resolve().parents[1] / name
    nbf.write(nb, out)
    print("wrote", out)
    return out
