"""ruff over the code cells of the notebooks' sources (notebooks/src/NN_*.py), at 88 columns.

JupyterLab cuts a code line wider than its cell (no soft wrap in code cells), and a projector shows about
90 columns, so code in the notebooks stays within 88. Markdown cells are prose that JupyterLab wraps, so
they are left out: each source is checked as a copy with its markdown cells blanked (line numbers kept).

    python tools/lint_notebooks.py [FILES...]      # exit 0 when clean, 1 with ruff's report
"""
from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINE_LENGTH = 88
CELL = re.compile(r"^# %%")
# pycodestyle's line length, and syntax errors; the rest of the code style is the notebook's
SELECT = "E501,E9,F63,F7"


def code_only(text: str) -> str:
    """``text`` with every markdown cell's lines blanked, so that line numbers stay those of the source."""
    out, markdown = [], False
    for line in text.splitlines():
        if CELL.match(line):
            markdown = "[markdown]" in line
            out.append(line)
        else:
            out.append("" if markdown else line)
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    files = [Path(a) for a in (argv if argv is not None else sys.argv[1:])] or \
        sorted((ROOT / "notebooks" / "src").glob("[0-9][0-9]_*.py"))
    with tempfile.TemporaryDirectory() as tmp:
        for f in files:
            (Path(tmp) / f.name).write_text(code_only(f.read_text(encoding="utf-8")), encoding="utf-8")
        r = subprocess.run([sys.executable, "-m", "ruff", "check", "--isolated", "--no-cache",
                            f"--line-length={LINE_LENGTH}", f"--select={SELECT}", "--output-format=concise", "."],
                           cwd=tmp, capture_output=True, text=True)
    report = (r.stdout + r.stderr).strip()
    for f in files:                       # name the sources, not the copies
        report = report.replace(f"{f.name}:", f"{f.relative_to(ROOT) if f.is_absolute() else f}:")
    if r.returncode != 0:
        print(report)
    return 0 if r.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
