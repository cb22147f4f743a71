"""Run notebooks top to bottom headless (nbclient), as CI and `make notebooks` do; export them.

    python -m llmlab.nb.runner [--write] [--timeout S] [--keep-going] notebooks/01_gguf_bytes.ipynb ...
    python -m llmlab.nb.runner --html build/html notebooks/*.ipynb

Each notebook runs in its own folder with a fresh kernel. A run fails at the first cell that
raises, writes to stderr or shows a warning (a notebook that prints a warning is broken for a
learner too), or at a solution cell whose checker says anything but "correct"; the message names
the cell. A cell tagged ``allow-stderr`` may write to stderr.

A notebook's cells come from its source, a jupytext percent script paired with it
(``notebooks/jupytext.toml``: ``notebooks/src/NN_name.py``). ``--write`` first takes the cells from
the source (creating the notebook if it does not exist yet), runs them, and stores the outputs into
the ``.ipynb`` exactly as JupyterLab saves a notebook after running it: widget state included (so a
reopened notebook shows its widgets' last view), the same JSON layout, the kernel's
``language_info``. The run stops at the first failing notebook unless ``--keep-going``.

``--html DIR`` runs nothing: it exports the (executed) notebooks as static HTML pages that need
no kernel, each live widget replaced by the static copy of its first view, plus an
``index.html``. Images are embedded; only MathJax comes from a CDN (offline, formulas show as
TeX source).
"""
from __future__ import annotations

import argparse
import html as _html
import os
import re
import sys
import time
from pathlib import Path

from .exercises.verdict import SOLUTION_TAG, is_not_yet

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WARNING_RE = re.compile(r"^\S*(Warning|warning): |^\S+Warning\b", re.M)


class NotebookCellError(RuntimeError):
    """A cell wrote to stderr, showed a warning, or is a solution its checker does not accept."""


def _cell_problem(cell) -> str | None:
    tags = cell.get("metadata", {}).get("tags", [])
    if SOLUTION_TAG in tags:
        for out in cell.get("outputs", []):
            text = out.get("text", "") if out.get("output_type") == "stream" else ""
            bad = next((line for line in "".join(text).splitlines() if is_not_yet(line)), None)
            if bad:
                return f"is a solution, but its checker says: {bad[:400]}"
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

def source_of(path: str | Path) -> Path | None:
    """The jupytext percent script paired with the notebook ``path`` (by the ``formats`` of the
    jupytext configuration above it, ``notebooks/jupytext.toml``), or None when it has none."""
    from jupytext.config import load_jupytext_config
    from jupytext.paired_paths import InconsistentPath, paired_paths

    path = Path(path).absolute()
    config = load_jupytext_config(str(path.parent))
    formats = config.default_formats(str(path)) if config else None
    if not formats:
        return None
    try:
        pairs = paired_paths(str(path), "ipynb", formats)
    except InconsistentPath:
        return None
    return next((Path(p) for p, fmt in pairs if fmt.get("extension") == ".py"), None)


def read_source(path: str | Path):
    """The cells of the notebook ``path``'s source (:func:`source_of`), as a notebook."""
    import jupytext

    return jupytext.read(source_of(path), fmt="py:percent")


SOURCE_METADATA = ("jupyter", "tags")     # the cell metadata a source holds (notebooks/jupytext.toml)


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
                 from_source: bool = False):
    """Execute ``path`` in a fresh kernel; raise at the first failing cell. ``from_source``: take
    the cells from the notebook's source first (:func:`sync_from_source`). ``write``: store the
    executed notebook into ``path``. Returns the executed notebook."""
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
    if write:
        save_like_jupyterlab(nb, path)
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


def export_html(paths, outdir: str | Path) -> list[Path]:
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
    index = outdir / "index.html"
    index.write_text("<!doctype html><meta charset='utf-8'><title>llmlab course</title>"
                     "<h1>llmlab: how llama.cpp runs an LLM, layer by layer</h1>"
                     "<p>Static copies of the executed notebooks. To run and change them, open the "
                     "repository in JupyterLab (<code>make lab</code>).</p><ol>" + "".join(rows) + "</ol>",
                     encoding="utf-8")
    return written + [index]


# ---------------------------------------------------------------- command line

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("notebooks", nargs="+")
    ap.add_argument("--write", action="store_true",
                    help="take the cells from each notebook's source (notebooks/src/), run, store the outputs")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per cell")
    ap.add_argument("--keep-going", action="store_true", help="run every notebook even after a failure")
    ap.add_argument("--html", metavar="DIR", help="export the notebooks as static HTML into DIR (runs nothing)")
    args = ap.parse_args(argv)
    if args.html:
        for p in export_html(args.notebooks, args.html):
            print(f"wrote {p} ({p.stat().st_size / 1e3:.0f} kB)")
        return 0
    failed = 0
    for p in args.notebooks:
        t0 = time.perf_counter()
        try:
            run_notebook(p, args.timeout, args.write, from_source=args.write)
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
