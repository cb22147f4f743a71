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
                        "--gen-tokens", "4", "--load", "1", "--repeat", "2", "--json"], capture_output=True, text=True, timeout=900,
                       cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["load"] == 1 and res["cpu_model"] and res["decode_tokens_per_s"] > 0
    assert res["decode_short_tokens_per_s"] > 0         # both contexts: after the prompt and from 10 tokens
    assert res["threading"] in ("tbb", "omp", "workqueue")
    assert res["repeat"] == 2 and [list(g) for g in res["rounds"]] == [["llmlab"], ["llmlab"]]
    assert res["decode_tokens_per_s"] == sum(g["llmlab"]["decode_tokens_per_s"] for g in res["rounds"]) / 2  # median
    bad = subprocess.run([sys.executable, "-m", "llmlab", "bench", "--load", "1000"], capture_output=True, text=True,
                         timeout=300, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert bad.returncode == 2 and bad.stderr.startswith("error: ") and len(bad.stderr.splitlines()) == 1


def test_bench_table_has_the_short_context_column():
    """The table names both contexts: decoding after the prompt and from a 10-token prompt (llama-bench's tg)."""
    import io

    from llmlab.bench import BenchResult
    from llmlab.cli.bench import _print
    r = BenchResult(model="smollm2", threads=2, cpu="avx2", kernels="fast", cpu_model="x", load=0, prompt_tokens=256,
                    gen_tokens=8, prefill_tokens_per_s=100.0, decode_tokens_per_s=50.0, decode_gb_per_s=1.0,
                    weight_mb=80.0, peak_rss_mb=300.0, decode_short_tokens_per_s=60.0,
                    llama_cpp={"prefill_tokens_per_s": 200.0, "decode_tokens_per_s": 40.0, "decode_gb_per_s": 0.8,
                               "peak_rss_mb": 250.0, "load_s": 0.1, "decode_short_tokens_per_s": 80.0},
                    decode_ratio=1.25, prefill_ratio=0.5, rss_ratio=1.2, same_tokens=8, decode_short_ratio=0.75)
    out = io.StringIO()
    _print(r, out)
    lines = out.getvalue().splitlines()
    assert "tg@pp10" in lines[1] and "from a 10-token prompt" in lines[0]
    assert lines[2].split()[:4] == ["llmlab", "100.0", "50.00", "60.00"]
    assert lines[-1].split()[:4] == ["ratio", "0.50", "1.25", "0.75"]


def test_rounds_give_medians_and_paired_ratios():
    """--repeat: each engine's figures are the medians of its rounds, its peak memory the first round's; a ratio is
    the median of the rounds' own ratios (two runs close in time), None where a round lacks the figure."""
    from llmlab.bench import Side, median_side, round_ratios
    me = [Side(100.0, 50.0, 300.0, 1.0, [1, 2], 60.0), Side(120.0, 40.0, 310.0, 2.0, [1, 2], 70.0),
          Side(90.0, 45.0, 305.0, 3.0, [1, 2], 80.0)]
    ll = [Side(100.0, 40.0, 170.0, 0.1, [1, 2], 60.0), Side(100.0, 50.0, 176.0, 0.1, [1, 2], 35.0),
          Side(100.0, 45.0, 171.0, 0.1, [1, 2], None)]
    m = median_side(me)
    assert (m.prefill_tokens_per_s, m.decode_tokens_per_s, m.peak_rss_mb, m.decode_short_tokens_per_s) == (100.0, 45.0, 300.0, 70.0)
    assert median_side(ll).decode_short_tokens_per_s is None
    r = round_ratios([{"llmlab": a, "llama.cpp": b} for a, b in zip(me, ll)])
    assert r["decode_tokens_per_s"] == 1.0 and r["prefill_tokens_per_s"] == 1.0      # 1.25, 0.8, 1.0; 1.0, 1.2, 0.9
    assert r["decode_short_tokens_per_s"] is None


def test_bench_table_lists_each_rounds_ratio():
    import io

    from llmlab.bench import BenchResult
    from llmlab.cli.bench import _print
    side = {"prefill_tokens_per_s": 1.0, "decode_tokens_per_s": 50.0, "decode_short_tokens_per_s": 60.0}
    other = dict(side, decode_tokens_per_s=40.0, decode_short_tokens_per_s=80.0)
    r = BenchResult(model="smollm2", threads=2, cpu="avx2", kernels="fast", cpu_model="x", load=0, prompt_tokens=256,
                    gen_tokens=8, prefill_tokens_per_s=1.0, decode_tokens_per_s=50.0, decode_gb_per_s=1.0,
                    weight_mb=80.0, peak_rss_mb=300.0, decode_short_tokens_per_s=60.0,
                    llama_cpp={"prefill_tokens_per_s": 1.0, "decode_tokens_per_s": 40.0, "decode_gb_per_s": 0.8,
                               "peak_rss_mb": 250.0, "load_s": 0.1, "decode_short_tokens_per_s": 80.0},
                    decode_ratio=1.25, prefill_ratio=1.0, rss_ratio=1.2, same_tokens=8, decode_short_ratio=0.75,
                    repeat=2, rounds=[{"llmlab": side, "llama.cpp": other}, {"llama.cpp": other, "llmlab": side}])
    out = io.StringIO()
    _print(r, out)
    assert out.getvalue().splitlines()[-1].endswith("1.25/0.75, 1.25/0.75")
