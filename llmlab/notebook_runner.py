"""Run notebooks top to bottom headless (nbclient), as CI and `make notebooks` do.

    python -m llmlab.notebook_runner [--write] [--timeout S] notebooks/01_gguf_bytes.ipynb ...

Each notebook runs in its own folder with a fresh kernel; an error in any cell
fails the run. ``--write`` stores the outputs back into the file.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path


def run_notebook(path: str | Path, timeout: int = 600, write: bool = False):
    import nbformat
    from nbclient import NotebookClient

    path = Path(path)
    root = path.resolve().parent.parent
    if (root / "llmlab").is_dir():   # the kernel imports this checkout's llmlab, whatever is installed
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent.resolve())}})
    client.execute()
    if write:
        nbformat.write(nb, path)
    return nb


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("notebooks", nargs="+")
    ap.add_argument("--write", action="store_true", help="store outputs back into the notebooks")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per cell")
    args = ap.parse_args(argv)
    failed = 0
    for p in args.notebooks:
        t0 = time.perf_counter()
        try:
            run_notebook(p, args.timeout, args.write)
            print(f"ok     {p} ({time.perf_counter() - t0:.1f} s)")
        except Exception as e:   # report every notebook, then fail
            failed += 1
            print(f"FAILED {p} ({time.perf_counter() - t0:.1f} s): {type(e).__name__}: {str(e)[-2000:]}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
