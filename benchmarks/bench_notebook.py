"""Notebook 00's live generation in JupyterLab (headless chromium, Run All as a learner does) against
the same code in a plain Python process, on the same machine in the same minutes, optionally beside
N busy processes (``--load N``). Prints both speeds and their ratio; asserts nothing about time.

    python benchmarks/bench_notebook.py [--load N] [--rounds R] [--json]

Needs the lab and browser extras (``make browser-deps``). The notebook runs as committed (its
``llmlab.nb`` import sets OpenMP's passive wait policy); the command-line side keeps OpenMP's default,
as ``python -m llmlab generate`` does.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from llmlab.bench import busy, cpu_model  # noqa: E402
from llmlab.nb.browser import Lab, open_notebook, run_all  # noqa: E402

NOTEBOOK = "00_overview"
SUMMARY = re.compile(r"prompt eval: (\d+) tokens in ([\d.]+) s \(([\d.]+) tok/s\); eval: (\d+) runs in ([\d.]+) s "
                     r"\(([\d.]+) tok/s\)")


def demo_code() -> str:
    """The source of notebook 00's generation cell (the one that prints the timings), from its source."""
    src = next((ROOT / "notebooks" / "src").glob(f"{NOTEBOOK}*.py")).read_text()
    cells = src.split("# %%")
    return next(c for c in cells if "run.timings.summary()" in c and not c.lstrip().startswith("[markdown]"))


def parse(text: str) -> dict:
    m = SUMMARY.search(text)
    if not m:
        raise RuntimeError(f"no timing summary in: {text[-500:]}")
    return {"prompt_tokens_per_s": float(m.group(3)), "decode_runs": int(m.group(4)), "decode_tokens_per_s": float(m.group(6))}


def command_line() -> dict:
    """The cell's code in a fresh Python process (paths as nb.setup finds them)."""
    code = "from llmlab import models\npaths = {'smollm2': models.resolve('smollm2')}\n" + demo_code()
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=600)
    if res.returncode:
        raise RuntimeError(res.stderr[-2000:])
    return parse(res.stdout)


def in_jupyterlab(lab: dict) -> dict:
    page = open_notebook(lab, NOTEBOOK)
    try:
        run_all(page, 1200)
        outputs = page.locator(".jp-OutputArea-output").all_inner_texts()
        return parse("\n".join(o for o in outputs if "prompt eval:" in o))
    finally:
        page.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--load", type=int, default=0, help="busy processes beside both runs (default 0)")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as d, Lab(Path(d), ROOT) as lab:
        command_line()                                   # numba's cache filled before anything is timed
        with busy(a.load):
            time.sleep(1 if a.load else 0)
            for _ in range(a.rounds):
                rows.append({"jupyterlab": in_jupyterlab(lab), "command_line": command_line()})
    ratio = [r["jupyterlab"]["decode_tokens_per_s"] / r["command_line"]["decode_tokens_per_s"] for r in rows]
    out = {"cpu_model": cpu_model(), "load": a.load, "rounds": rows, "decode_ratio_median": statistics.median(ratio)}
    if a.json:
        print(json.dumps(out))
        return 0
    print(f"notebook {NOTEBOOK}'s live generation, {cpu_model()}, {a.load} busy process(es) beside it")
    print("round  JupyterLab pp / tg tok/s   command line pp / tg tok/s   tg ratio")
    for i, (r, q) in enumerate(zip(rows, ratio)):
        j, c = r["jupyterlab"], r["command_line"]
        print(f"{i + 1:5d}  {j['prompt_tokens_per_s']:10.1f} / {j['decode_tokens_per_s']:6.1f}   "
              f"{c['prompt_tokens_per_s']:12.1f} / {c['decode_tokens_per_s']:6.1f}   {q:8.2f}")
    print(f"median decode ratio (JupyterLab / command line): {out['decode_ratio_median']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
