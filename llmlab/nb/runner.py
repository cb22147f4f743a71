"""Run notebooks top to bottom headless (nbclient), as CI and `make notebooks` do; export them.

    python -m llmlab.nb.runner --write [--teacher build/teacher] notebooks/01_gguf_bytes.ipynb ...
    python -m llmlab.nb.runner --teacher build/teacher notebooks/*.ipynb
    python -m llmlab.nb.runner --html build/html notebooks/*.ipynb

Each notebook runs in its own folder with a fresh kernel. A run fails at the first cell that
raises, writes to stderr or shows a warning (a notebook that prints a warning is broken for a
learner too), or at a solution cell whose checker does not say "correct"; the message names the
cell. A cell tagged ``allow-stderr`` may write to stderr.

A notebook's cells come from its source, the jupytext percent script ``notebooks/src/NN_name.py``
(:func:`source_of`): the teacher's edition, solutions included. The source and the notebook are not
paired through jupytext (no ``jupytext.toml``): a learner who saves a notebook in JupyterLab would
otherwise rewrite the source without its solutions, and JupyterLab would show them the source's
cells, solutions included. This runner is the one way from a source to its notebooks.

One run of the source makes two editions (:func:`run_notebook`):

* the learner's, ``notebooks/NN_name.ipynb`` (``--write``): the source's cells and outputs minus
  the cells tagged ``solution``, so Run All never executes a solution and the committed outputs
  under each exercise are the checker's "no answer yet";
* the teacher's, ``DIR/NN_name.ipynb`` (``--teacher DIR``, not committed): every cell, every
  solution executed and accepted by its checker.

``--write`` stores a notebook exactly as JupyterLab saves one after running it: widget state
included (so a reopened notebook shows its widgets' last view), the same JSON layout, the kernel's
``language_info``. The run stops at the first failing notebook unless ``--keep-going``.

``--html DIR`` runs nothing: it exports the (executed) notebooks as static HTML pages that need
no kernel, each live widget replaced by the static copy of its first view, plus an
``index.html`` (``--guide FILE.md`` adds a Markdown page, the teacher's guide, to it). Images are
embedded; only MathJax comes from a CDN (offline, formulas show as TeX source).
"""
from __future__ import annotations

import argparse
import html as _html
import os
import re
import sys
import time
from pathlib import Path

from .exercises.verdict import SOLUTION_TAG, is_correct, is_not_yet

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WARNING_RE = re.compile(r"^\S*(Warning|warning): |^\S+Warning\b", re.M)


class NotebookCellError(RuntimeError):
    """A cell wrote to stderr, showed a warning, or is a solution its checker does not accept."""


def _cell_problem(cell) -> str | None:
    tags = cell.get("metadata", {}).get("tags", [])
    if SOLUTION_TAG in tags:
        lines = [line for out in cell.get("outputs", []) if out.get("output_type") == "stream"
                 for line in "".join(out.get("text", "")).splitlines()]
        if not any(is_correct(line) for line in lines):
            said = next((line for line in lines if is_not_yet(line)), "no verdict")
            return f"is a solution, but its checker does not say correct: {said[:400]}"
    if "allow-stderr" in tags:
        return None
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream" and out.get("name") == "stderr":
            text = out.get("text", "")
            if text.strip():
                return f"wrote to stderr: {text.strip()[:800]}"
        if out.get("output_type") in ("stream", "display_data", "execute_result"):
            text = out.get("text", "") if out.get("output_type") == "stream" else out.get("data", {}).get("text/plain", "")
            if isinstance(text, list):
                text = "".join(text)
            m = WARNING_RE.search(text or "")
            if m:
                line = text[m.start():].splitlines()[0]
                return f"shows a warning: {line[:400]}"
    return None


def _checkout_on_path(path: Path) -> None:
    root = path.resolve().parent.parent
    if (root / "llmlab").is_dir():   # the kernel imports this checkout's llmlab, whatever is installed
        parts = os.environ.get("PYTHONPATH", "").split(os.pathsep)
        if str(root) not in parts:
            os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))


# ---------------------------------------------------------------- the notebooks' sources

SOURCE_DIR = "src"


def source_of(path: str | Path) -> Path | None:
    """The source of the notebook ``path`` (``notebooks/NN_name.ipynb`` -> ``notebooks/src/NN_name.py``),
    or None when there is none."""
    path = Path(path).absolute()
    src = path.parent / SOURCE_DIR / f"{path.stem}.py"
    return src if src.exists() else None


def read_source(path: str | Path):
    """The cells of the notebook ``path``'s source (:func:`source_of`), as a notebook: the teacher's
    edition, solutions included."""
    import jupytext

    return jupytext.read(source_of(path), fmt="py:percent")


def is_solution(cell) -> bool:
    return SOLUTION_TAG in cell.get("metadata", {}).get("tags", [])


def learner_edition(nb):
    """``nb`` without its solution cells, execution counts renumbered 1, 2, ... as a Run All of the
    learner's notebook numbers them. ``nb`` itself is left as it is."""
    import copy
    nb = copy.deepcopy(nb)
    nb.cells = [c for c in nb.cells if not is_solution(c)]
    n = 0
    for cell in nb.cells:
        if cell.cell_type == "code" and cell.get("execution_count") is not None:
            n += 1
            cell.execution_count = n
            for out in cell.get("outputs", []):
                if out.get("output_type") == "execute_result":
                    out["execution_count"] = n
    return nb


def _names(source: str) -> tuple[set[str], set[str]]:
    """The names a cell binds and the names it reads (IPython magics and shell lines are skipped)."""
    import ast
    code = "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())
    bound, read = set(), set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    return bound, read


def solution_dependencies(nb) -> list[tuple[int, str]]:
    """(cell index, name) for each name a cell reads that, at that point of the notebook, only a
    solution cell has bound: the learner's edition (no solutions) would fail or differ there. The
    executed learner's edition is cut from the teacher's run (:func:`run_notebook`), so this is what
    proves it runs on its own."""
    seen, only_solutions, found = set(), set(), []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        bound, read = _names(cell.source)
        if is_solution(cell):
            only_solutions |= bound - seen
            continue
        found += [(i, name) for name in sorted(read & only_solutions - bound)]
        seen |= bound
        only_solutions -= bound
    return found


SOURCE_METADATA = ("jupyter", "tags")     # the cell metadata a source holds: collapsed, and the solution tag


def sync_from_source(path: str | Path):
    """The notebook ``path`` with its cells taken from its source; a cell whose type and text did not
    change keeps its outputs and id, a changed one keeps its id and loses its outputs. Creates the
    notebook (no outputs yet) when only the source exists; without a source returns it unchanged."""
    import nbformat
    from jupytext.combine import map_outputs_to_inputs

    path = Path(path)
    if path.exists():
        nb = nbformat.read(path, as_version=4)
    else:
        nb = nbformat.v4.new_notebook(metadata={
            "kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"},
            "language_info": {"name": "python"}})
    src = source_of(path)
    if src is None or not src.exists():
        if not path.exists():
            raise FileNotFoundError(f"{path}: no such notebook, and no source for it")
        return nb
    new = read_source(path).cells
    old = nb.cells
    cells = []
    for cell, j in zip(new, map_outputs_to_inputs(new, old)):
        meta = {k: v for k, v in cell.metadata.items() if k in SOURCE_METADATA}
        if j is None or old[j].cell_type != cell.cell_type:
            make = {"code": nbformat.v4.new_code_cell, "markdown": nbformat.v4.new_markdown_cell,
                    "raw": nbformat.v4.new_raw_cell}[cell.cell_type]
            cells.append(make(cell.source, metadata=meta))
            continue
        kept = old[j]
        kept.metadata = {**{k: v for k, v in kept.metadata.items() if k not in SOURCE_METADATA}, **meta}
        if kept.source != cell.source:
            kept.source = cell.source
            if kept.cell_type == "code":
                kept.outputs, kept.execution_count = [], None
        cells.append(kept)
    nb.cells = cells
    return nb


# ---------------------------------------------------------------- running

def run_notebook(path: str | Path, timeout: int = 600, write: bool = False, check_stderr: bool = True,
                 from_source: bool = False, teacher: str | Path | None = None):
    """Execute ``path`` in a fresh kernel; raise at the first failing cell. ``from_source``: take
    the cells from the notebook's source first (:func:`sync_from_source`), solutions included.
    ``write``: store the learner's edition of the executed notebook (:func:`learner_edition`) into
    ``path``; ``teacher``: store the whole executed notebook into that folder. Returns the executed
    notebook."""
    import nbformat
    from nbclient import NotebookClient

    path = Path(path)
    _checkout_on_path(path)
    nb = sync_from_source(path) if from_source else nbformat.read(path, as_version=4)
    for cell in nb.cells:        # a clean start: no stale outputs or counts survive a failed run
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", store_widget_state=True,
                            record_timing=False, resources={"metadata": {"path": str(path.parent.resolve())}})

    def on_cell_executed(cell, cell_index, execute_reply=None, **_):
        if check_stderr:
            problem = _cell_problem(cell)
            if problem:
                raise NotebookCellError(f"{path.name}: cell {cell_index} {problem}")

    client.on_cell_executed = on_cell_executed
    client.execute()
    _kernelspec_as_jupyterlab(nb, "python3")
    if teacher is not None:
        Path(teacher).mkdir(parents=True, exist_ok=True)
        save_like_jupyterlab(nb, Path(teacher) / path.name)
    if write:
        save_like_jupyterlab(learner_edition(nb), path)
    return nb


def _kernelspec_as_jupyterlab(nb, kernel_name: str) -> None:
    """JupyterLab rewrites ``metadata.kernelspec`` from the installed kernel when it opens a
    notebook; a different display name (e.g. "Python 3" vs "Python 3 (ipykernel)") marks the
    notebook as modified before any edit. Store what JupyterLab would."""
    try:
        from jupyter_client.kernelspec import KernelSpecManager
        spec = KernelSpecManager().get_kernel_spec(kernel_name)
    except Exception:   # no such kernel installed: leave the notebook's own
        return
    nb.metadata["kernelspec"] = {"display_name": spec.display_name, "language": spec.language, "name": kernel_name}


def save_like_jupyterlab(nb, path: Path) -> None:
    """Write ``nb`` as jupyter_server does when JupyterLab saves (nbformat 4.5, cell ids, 1-space
    indented JSON with sorted keys, a final newline), with no runner-only metadata."""
    import nbformat
    nb.metadata.pop("papermill", None)
    state = nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {})
    if "widgets" in nb.metadata and not state.get("state"):
        del nb.metadata["widgets"]          # no widgets: JupyterLab writes no widget metadata either
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
    nbformat.validate(nb)
    nbformat.write(nb, str(path), version=nbformat.NO_CONVERT)


# ---------------------------------------------------------------- static HTML

def _strip_widgets(nb):
    """Outputs that carry a live widget and a static copy keep only the copy; widget state goes."""
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            data = out.get("data")
            if data and WIDGET_VIEW in data:
                del data[WIDGET_VIEW]
                if set(data) <= {"text/plain"}:
                    data["text/plain"] = "(an interactive widget: open the notebook in JupyterLab to use it)"
    nb.metadata.pop("widgets", None)
    return nb


INDEX_INTRO = {
    "learner": "<p>Static copies of the executed notebooks, the learner's edition (exercises without "
               "their solutions). To run and change them, open the repository in JupyterLab "
               "(<code>make lab</code>).</p>",
    "teacher": "<p>The teacher's edition: each exercise's solution executed, under its checker's "
               "\"correct\". Not for learners (their pages are the learner's edition, "
               "<code>make html</code>'s other folder).</p>",
}


def _page(title: str, body: str) -> str:
    return (f"<!doctype html><meta charset='utf-8'><title>{_html.escape(title)}</title>"
            "<style>body{font-family:sans-serif;max-width:60em;margin:2em auto;line-height:1.45}"
            "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.2em .5em}"
            "code,pre{background:#f4f4f4}</style>" + body)


def export_guide(md: str | Path, outdir: str | Path) -> Path:
    """A Markdown page (the teacher's guide) as HTML, with nbconvert's Markdown renderer."""
    from nbconvert.filters.markdown import markdown2html

    md = Path(md)
    dest = Path(outdir) / (md.stem + ".html")
    dest.write_text(_page(md.stem, markdown2html(md.read_text(encoding="utf-8"))), encoding="utf-8")
    return dest


def export_html(paths, outdir: str | Path, guide: str | Path | None = None) -> list[Path]:
    """The notebooks ``paths`` as static pages in ``outdir`` with an index; with ``guide`` (a
    Markdown file), the teacher's edition's index, which links the guide as a page too."""
    import nbformat
    from nbconvert import HTMLExporter

    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    exporter = HTMLExporter(template_name="lab")
    exporter.embed_images = True
    written, rows = [], []
    for p in paths:
        p = Path(p)
        nb = _strip_widgets(nbformat.read(p, as_version=4))
        body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": p.stem}})
        # widgets are gone, so require.js (fetched from a CDN) is not needed; MathJax stays: hosted
        # online it typesets the formulas, offline they show as TeX source
        body = re.sub(r'<script src="https://cdnjs[^"]*require[^"]*"></script>\s*', "", body)
        dest = outdir / (p.stem + ".html")
        dest.write_text(body, encoding="utf-8")
        written.append(dest)
        title = next((c.source.splitlines()[0].lstrip("# ").strip() for c in nb.cells
                      if c.cell_type == "markdown" and c.source.strip()), p.stem)
        rows.append(f"<li><a href='{_html.escape(dest.name)}'>{_html.escape(title)}</a></li>")
    intro = INDEX_INTRO["teacher" if guide else "learner"]
    if guide:
        page = export_guide(guide, outdir)
        written.append(page)
        intro += f"<p><a href='{_html.escape(page.name)}'>The teacher's guide</a>: agendas, set-up, answers.</p>"
    index = outdir / "index.html"
    index.write_text(_page("llmlab course", "<h1>llmlab: how llama.cpp runs an LLM, layer by layer</h1>"
                           + intro + "<ol>" + "".join(rows) + "</ol>"), encoding="utf-8")
    return written + [index]


# ---------------------------------------------------------------- command line

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("notebooks", nargs="+")
    ap.add_argument("--write", action="store_true",
                    help="take the cells from each notebook's source (notebooks/src/), run, store the learner's edition")
    ap.add_argument("--teacher", metavar="DIR",
                    help="take the cells from each notebook's source, run, store the teacher's edition (solutions) in DIR")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per cell")
    ap.add_argument("--keep-going", action="store_true", help="run every notebook even after a failure")
    ap.add_argument("--html", metavar="DIR", help="export the notebooks as static HTML into DIR (runs nothing)")
    ap.add_argument("--guide", metavar="FILE.md", help="with --html: the teacher's edition's index, with this guide as a page")
    args = ap.parse_args(argv)
    if args.guide and not args.html:
        ap.error("--guide goes with --html")
    if args.html:
        for p in export_html(args.notebooks, args.html, args.guide):
            print(f"wrote {p} ({p.stat().st_size / 1e3:.0f} kB)")
        return 0
    failed = 0
    for p in args.notebooks:
        t0 = time.perf_counter()
        try:
            run_notebook(p, args.timeout, args.write, from_source=args.write or bool(args.teacher), teacher=args.teacher)
            size = f", {Path(p).stat().st_size / 1e3:.0f} kB" if args.write else ""
            print(f"ok     {p} ({time.perf_counter() - t0:.1f} s{size})", flush=True)
        except Exception as e:   # report, then stop (or go on with --keep-going)
            failed += 1
            print(f"FAILED {p} ({time.perf_counter() - t0:.1f} s): {type(e).__name__}: {str(e)[-2000:]}", flush=True)
            if not args.keep_going:
                break
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
