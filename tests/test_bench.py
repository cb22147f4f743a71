"""bench: its JSON says which CPU and how much added load; --load's busy processes run while both engines
are measured and are gone afterwards."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from llmlab import bench

ROOT = Path(__file__).resolve().parent.parent


def _busy_children() -> set[int]:
    me = str(os.getpid())
    out = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text().split()
                cmd = (d / "cmdline").read_bytes()
            except OSError:
                continue
            if stat[3] == me and b"while True: pass" in cmd:
                out.add(int(d.name))
    return out


def test_busy_starts_and_ends_its_processes():
    with bench.busy(2):
        time.sleep(0.3)
        assert len(_busy_children()) == 2
    assert not _busy_children()


def test_cpu_model_is_named():
    assert bench.cpu_model().strip()


def test_bench_json_with_load(smollm2_path):
    r = subprocess.run([sys.executable, "-m", "llmlab", "bench", "-m", str(smollm2_path), "--prompt-tokens", "16",
                        "--gen-tokens", "4", "--load", "1", "--json"], capture_output=True, text=True, timeout=900,
                       cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["load"] == 1 and res["cpu_model"] and res["decode_tokens_per_s"] > 0
    assert res["threading"] in ("tbb", "omp", "workqueue")
    bad = subprocess.run([sys.executable, "-m", "llmlab", "bench", "--load", "1000"], capture_output=True, text=True,
                         timeout=300, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert bad.returncode == 2 and bad.stderr.startswith("error: ") and len(bad.stderr.splitlines()) == 1
