"""llmlab's checks on Windows, run by Windows CPython itself (under Wine: tools/windows/test.sh).

Each check runs what a learner runs, mostly the command line in a child process (``python -m llmlab ...``, its
output read through a pipe, as a Windows console user's would be), and prints one line: ``ok NAME (seconds)``
or ``FAIL NAME: why``; the exit status is the number of failures (0: all passed). ``--quick`` runs the subset
CI can afford: version, doctor, gguf-dump, models and plug --list, fetch and its lock, a hostile chat template,
the sandbox (no kernel compiling, no decode, fewer interpreters started: each costs seconds under Wine).

Usage (Windows): python checks.py --model C:\\...\\SmolLM2-135M-Instruct.Q4_1.gguf --profile avx2 [--quick]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

HOSTILE = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
TEXT = "Zoë said 你好 — naïve café ▁tokens"
RESULTS: list[tuple[str, bool, str]] = []


def llmlab(*args, stdin: str | None = None, timeout: float = 1800, env: dict | None = None) -> subprocess.CompletedProcess:
    """``python -m llmlab ARGS`` in a child process; its stdout and stderr decoded as UTF-8 (strictly: text that
    is not UTF-8 is a failure, as on a Windows pipe in cp1252 it was)."""
    p = subprocess.run([sys.executable, "-m", "llmlab", *map(str, args)], input=None if stdin is None else stdin.encode(),
                       capture_output=True, timeout=timeout, env={**os.environ, **(env or {})},
                       stdin=subprocess.DEVNULL if stdin is None else None)
    return subprocess.CompletedProcess(p.args, p.returncode, p.stdout.decode("utf-8"), p.stderr.decode("utf-8"))


def check(name: str, full_only: bool = False):
    """Run the decorated function now as the check ``name`` (not at all when ``full_only``: a --quick run)."""
    def run(fn):
        if full_only:
            return fn
        t0 = time.monotonic()
        try:
            fn()
            RESULTS.append((name, True, ""))
            print(f"ok   {name} ({time.monotonic() - t0:.1f} s)", flush=True)
        except Exception as e:      # noqa: BLE001 - every check's failure is one line
            why = f"{type(e).__name__}: {e}" if not isinstance(e, AssertionError) else str(e)
            RESULTS.append((name, False, why))
            print(f"FAIL {name} ({time.monotonic() - t0:.1f} s): {why}", flush=True)
            if os.environ.get("LLMLAB_WINDOWS_DEBUG"):
                traceback.print_exc()
        return fn
    return run


def expect(cond: bool, what: str, p: subprocess.CompletedProcess | None = None) -> None:
    if not cond:
        tail = f" [exit {p.returncode}; stdout {p.stdout[-600:]!r}; stderr {p.stderr[-900:]!r}]" if p else ""
        raise AssertionError(what + tail)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, help="SmolLM2's cached .gguf (a Windows path)")
    ap.add_argument("--profile", required=True, help="the CPU profile expected here (the host's)")
    ap.add_argument("--quick", action="store_true", help="the CI subset: no kernel compiling, no reference decode")
    a = ap.parse_args()
    model = a.model
    work = Path(tempfile.mkdtemp(prefix="llmlab checks Zoë "))     # a space and a non-ASCII letter, as C:\Users\Zoë
    print(f"Windows checks: Python {sys.version.split()[0]} on {sys.platform}, work folder {work}", flush=True)

    @check("version")
    def _():
        p = llmlab("--version")
        expect(p.returncode == 0 and p.stdout.startswith("llmlab "), "--version", p)

    @check("doctor: profile from the CPU's own features (CPUID, IsProcessorFeaturePresent)")
    def _():
        p = llmlab("doctor", "--cli", "--json")
        expect(p.returncode in (0, 1), "doctor --cli --json", p)
        cpu = json.loads(p.stdout)["checks"]["cpu"]["data"]
        expect(cpu["features_source"] == "cpuid+IsProcessorFeaturePresent", f"features from {cpu['features_source']}")
        expect(cpu["profile"] == a.profile and cpu["source"] != "default", f"profile {cpu['profile']} from {cpu['source']}, "
               f"expected {a.profile}")
        if not a.quick:
            p = llmlab("doctor", "--cli")
            expect(p.returncode in (0, 1) and "from cpuid+IsProcessorFeaturePresent" in p.stdout, "doctor --cli", p)

    @check("gguf-dump through a pipe (UTF-8)")
    def _():
        p = llmlab("gguf-dump", model)
        expect(p.returncode == 0 and "general.architecture" in p.stdout and "llama" in p.stdout, "gguf-dump", p)

    @check("models and plug --list (the registries)")
    def _():
        p = llmlab("models", "--json")
        expect(p.returncode == 0 and any(m["name"] == "smollm2" and m["cached"] for m in json.loads(p.stdout)),
               "models --json", p)
        p = llmlab("plug", "--list", "--json")
        expect(p.returncode == 0 and "rms_norm" in {s["name"] for s in json.loads(p.stdout)["slots"]}, "plug --list", p)

    @check("diff-llama-cpp without llama.cpp: one error line, exit 2", full_only=a.quick)
    def _():
        p = llmlab("diff-llama-cpp", "-m", model, "-p", "hi")
        lines = p.stderr.strip().splitlines()
        expect(p.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:") and "llama" in lines[0],
               "diff-llama-cpp", p)

    @check("quantize a tiny model to q8_0", full_only=a.quick)
    def _():
        from llmlab import models
        from llmlab.ggml.gguf import GGUFFile
        from llmlab.llama.tiny import write_tiny
        tiny = write_tiny(work / "tiny-f32.gguf", n_layer=1, seed=5, vocab_from=Path(models.resolve(model)))
        out = work / "tiny q8_0 Zoë.gguf"
        p = llmlab("quantize", tiny, out, "q8_0", "--quiet")
        expect(p.returncode == 0 and out.is_file(), "quantize", p)
        f = GGUFFile(out)
        types = {t.type.name.lower() for t in f.tensors}
        f.close()
        expect("q8_0" in types, f"quantized tensor types {sorted(types)}")

    @check("tokenize and detokenize, non-ASCII text", full_only=a.quick)
    def _():
        p = llmlab("tokenize", "-m", model, "--text", TEXT, "--json")
        expect(p.returncode == 0, "tokenize", p)
        ids = json.loads(p.stdout)["ids"]
        q = llmlab("detokenize", "-m", model, *map(str, ids))
        expect(q.returncode == 0 and q.stdout.rstrip("\r\n") == TEXT, f"detokenize gave {q.stdout!r}", q)

    @check("fetch of the cached model, two at once (the lock)")
    def _():
        cmd = [sys.executable, "-m", "llmlab", "fetch", "smollm2", "--quiet"]
        procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
                 for _ in range(2)]
        outs = [p.communicate(timeout=900) for p in procs]
        for p, (out, err) in zip(procs, outs):
            expect(p.returncode == 0 and out.decode().strip().endswith(".gguf"), f"fetch: exit {p.returncode} {err[-500:]!r}")

    @check("file lock: a second holder waits (msvcrt)")
    def _():
        from llmlab.filelock import exclusive
        lock = work / "x.lock"
        code = ("import sys, time; from llmlab.filelock import exclusive\n"
                "print('trying', flush=True)\nwith exclusive(sys.argv[1]): print(time.time(), flush=True)\n")
        with exclusive(lock):
            child = subprocess.Popen([sys.executable, "-c", code, str(lock)], stdout=subprocess.PIPE,
                                     stdin=subprocess.DEVNULL)
            expect(child.stdout.readline().strip() == b"trying", "the child did not start")
            time.sleep(2)
            expect(child.poll() is None, "the second process got the lock while the first held it")
            released = time.time()
        got = float(child.communicate(timeout=60)[0].decode().strip())
        expect(child.returncode == 0 and got >= released, f"the child had the lock {released - got:.2f} s before it "
               "was released")

    @check("chat: a template and a hostile one killed at its deadline")
    def _():
        from llmlab import models
        from llmlab.ggml.gguf import GGUFFile, GGUFWriter
        from llmlab.llama.tiny import write_tiny
        src = Path(models.resolve(model))
        plain = write_tiny(work / "tiny.gguf", n_layer=2, seed=3, vocab_from=src)
        w = GGUFWriter.from_file(GGUFFile(plain))
        w.add("tokenizer.chat_template", HOSTILE)
        w.write(work / "hostile.gguf")
        if not a.quick:                          # a reply compiles the kernels of a tiny f32 model (minutes)
            p = llmlab("chat", "-m", plain, "-n", "3", "--temp", "0", stdin="héllo 你好\n/exit\n", timeout=1800)
            expect(p.returncode == 0 and "[turn 1:" in p.stderr, "chat with SmolLM2's template", p)
        t0 = time.monotonic()
        p = llmlab("chat", "-m", work / "hostile.gguf", stdin="hi\n", timeout=600)
        took = time.monotonic() - t0
        expect(p.returncode == 2 and p.stderr.strip().splitlines()[-1] == "error: chat template ran longer than 2 s",
               "hostile template", p)
        print(f"     (the hostile chat ended in {took:.1f} s, start-up included)", flush=True)

    @check("template sandbox: a crash and a time limit are errors, the next render is fine")
    def _():
        from llmlab.llama import template_sandbox
        from llmlab.llama.chat import ChatTemplateError, render_jinja
        expect(render_jinja("{{ messages[0].content }}", [{"role": "user", "content": "héllo"}]) == "héllo", "render")
        t0 = time.monotonic()
        try:
            render_jinja(HOSTILE, [], max_seconds=1)
            raise AssertionError("a hostile template finished")
        except ChatTemplateError as e:
            expect("longer than 1 s" in str(e) and time.monotonic() - t0 < 10, str(e))
        pid = None
        render_jinja("{{ 1 }}", [])
        pid = template_sandbox.worker_pid()
        subprocess.run(["taskkill", "/F", "/PID", str(pid)], capture_output=True, stdin=subprocess.DEVNULL)
        time.sleep(1)
        try:
            render_jinja("{{ 2 }}", [])          # the dead worker: one error, then a new one
        except ChatTemplateError as e:
            expect("crashed its sandboxed renderer" in str(e), str(e))
        expect(render_jinja("{{ 3 }}", []) == "3" and template_sandbox.worker_pid() != pid, "a new worker")
        xs = []
        for _ in range(20):
            t0 = time.perf_counter()
            render_jinja("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}",
                         [{"role": "user", "content": "hi"}] * 8)
            xs.append(time.perf_counter() - t0)
        print(f"     (a render costs {sorted(xs)[len(xs) // 2] * 1000:.2f} ms, median of 20)", flush=True)

    @check("notebook 01's library calls (viz.gguf)", full_only=a.quick)
    def _():
        import matplotlib
        matplotlib.use("Agg")
        from llmlab.ggml.gguf import GGUFFile
        from llmlab.viz import gguf as vg
        f = GGUFFile(model)
        for part in (vg.hex_view(f, 0, 224), vg.metadata_table(f), vg.tensor_table(f, limit=5), vg.type_table(f)):
            expect(len(str(getattr(part, "data", part))) > 100, "an empty view")
        expect(sum(n for _, n in vg.kv_size_breakdown(f)) > 0, "kv sizes")
        vg.file_map(f)
        expect(set(vg.time_loading_phases(model, repeat=1)) and True, "loading phases")

    if not a.quick:
        from llmlab import data

        @check(f"generate, fast kernels, equals the stored {a.profile} references")
        def _():
            meta, ref = data.ref_logits("smollm2", a.profile)
            prompt = meta["prompts"][1]["prompt"]
            p = llmlab("generate", "-m", model, "-p", prompt, "-n", "48", "--temp", "0", "--json", "--kernels", "fast")
            expect(p.returncode == 0, "generate --kernels fast", p)
            out = json.loads(p.stdout)
            expect(out["prompt_ids"] == ref["p1_ids"].tolist(), "prompt ids differ")
            expect(out["ids"] == ref["p1_greedy"].tolist() and out["cpu"] == a.profile,
                   f"ids {out['ids']} vs the reference {ref['p1_greedy'].tolist()}")

        @check("warm, then logits: the top token is the reference's first greedy token")
        def _():
            p = llmlab("warm", "-m", model)
            expect(p.returncode == 0 and "kernels:" in (p.stdout + p.stderr), "warm", p)
            meta, ref = data.ref_logits("smollm2", a.profile)
            p = llmlab("logits", "-m", model, "-p", meta["prompts"][0]["prompt"], "--top", "5", "--json")
            expect(p.returncode == 0, "logits", p)
            top = json.loads(p.stdout)["top_ids"][-1]          # the prompt's last position predicts the next token
            expect(top[0] == int(ref["p0_greedy"][0]), f"top ids {top} vs the reference {int(ref['p0_greedy'][0])}")

        @check("plug: a learner's endless loop is stopped at the time limit (no SIGALRM here)")
        def _():
            loop = work / "my rms_norm Zoë.py"
            loop.write_text("def rms_norm(x, eps):\n    while True:\n        pass\n", encoding="utf-8")
            p = llmlab("plug", "-m", model, "-p", "hi", "-n", "1", "--slot", f"rms_norm={loop}", "--json")
            out = json.loads(p.stdout)
            slot = out["slots"][0]
            expect(slot["status"] == "error" and "time limit" in slot["error"], f"plug verdict {slot}", p)

        @check(f"generate, reference kernels, equals the stored {a.profile} references")
        def _():
            meta, ref = data.ref_logits("smollm2", a.profile)
            prompt = meta["prompts"][0]["prompt"]
            p = llmlab("generate", "-m", model, "-p", prompt, "-n", "4", "--temp", "0", "--json", "--kernels", "reference")
            expect(p.returncode == 0, "generate --kernels reference", p)
            out = json.loads(p.stdout)
            expect(out["ids"] == ref["p0_greedy"].tolist()[:4], f"ids {out['ids']} vs {ref['p0_greedy'].tolist()[:4]}")

        @check("bench (peak memory through GetProcessMemoryInfo)")
        def _():
            p = llmlab("bench", "-m", model, "--prompt-tokens", "16", "--gen-tokens", "4", "--json")
            expect(p.returncode == 0, "bench", p)
            out = json.loads(p.stdout)
            flat = json.dumps(out)
            expect("decode_tokens_per_s" in flat and "peak_rss_mb" in flat, "bench's JSON", p)
            expect(_find(out, "peak_rss_mb") > 10, f"peak memory {_find(out, 'peak_rss_mb')} MB")

    failed = [r for r in RESULTS if not r[1]]
    print(f"windows checks: {len(RESULTS) - len(failed)} of {len(RESULTS)} passed", flush=True)
    return len(failed)


def _find(obj, key):
    if isinstance(obj, dict):
        if key in obj:
            return obj[key]
        for v in obj.values():
            r = _find(v, key)
            if r is not None:
                return r
    return None


if __name__ == "__main__":
    sys.exit(main())
