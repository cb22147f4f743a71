"""The CLI contract on bad input: exactly one ``error:`` line on stderr, exit status 2, no traceback,
no hang, no huge allocation, no file written; Ctrl-C at any moment: exit 130 and one line.

Each test runs ``python -m llmlab`` in a subprocess (the real process: signals, exit codes, what
is left on disk); the corpus is run through ``cli.main`` in one subprocess for speed.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CORPUS = Path(__file__).parent / "data" / "malformed"
BASE = CORPUS / "base.gguf"
EXPECTED = json.loads((CORPUS / "expected.json").read_text())
ENV = dict(os.environ, PYTHONPATH=str(ROOT), LLMLAB_DEBUG="")


def cli(*args, timeout: float = 120, preexec=None, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llmlab", *map(str, args)], cwd=ROOT, env={**ENV, **(env or {})},
                          capture_output=True, text=True, timeout=timeout, preexec_fn=preexec)


def assert_error(r: subprocess.CompletedProcess, contains: str = "", usage: bool = False) -> str:
    """Exit 2, no traceback, exactly one ``error:`` line (argparse's usage lines may come first)."""
    err = r.stderr.strip().splitlines()
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    errors = [line for line in err if "error:" in line]
    assert len(errors) == 1, r.stderr
    if usage:
        assert err[0].startswith("usage:") and err[-1].startswith("python -m llmlab"), r.stderr
    else:
        assert err == errors and err[0].startswith("error: "), r.stderr
    assert contains in errors[0], (contains, errors[0])
    return errors[0]


# ---------------------------------------------------------------------------- the corpus, end to end
_HARNESS = r"""
import contextlib, io, json, sys
from llmlab.cli import main
out = {}
for name, path in json.loads(sys.argv[1]).items():
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(["logits", "-m", path, "-p", "hello world"])
    out[name] = [rc, err.getvalue()]
print(json.dumps(out))
"""


def test_corpus_through_the_cli():
    files = {n: str(CORPUS / f"{n}.gguf") for n in EXPECTED}
    r = subprocess.run([sys.executable, "-c", _HARNESS, json.dumps(files)], cwd=ROOT, env=ENV, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    for name, (rc, err) in got.items():
        assert rc == 2 and "Traceback" not in err, (name, err)
        assert err.splitlines() == [EXPECTED[name]["error"].replace("FILE", f"{name}.gguf")], name


@pytest.mark.parametrize("cmd, name, contains", [
    (["logits", "-p", "hello"], "arch_is_number", "metadata 'general.architecture' is uint32 7"),
    (["logits", "--json", "-p", "hello"], "weights_nan", "non-finite logits"),
    (["tokenize", "--text", "hello"], "tokens_is_string", "metadata 'tokenizer.ggml.tokens' is a string"),
    (["tokenize", "--text", "hello"], "tokenizer_model_number", "metadata 'tokenizer.ggml.model' is uint32 1"),
    (["generate", "-p", "hello", "-n", "2"], "offsets_gap", "tensor 'output_norm.weight' has offset 608"),
])
def test_corpus_commands(cmd, name, contains):
    r = cli(*cmd, "-m", CORPUS / f"{name}.gguf")
    assert_error(r, contains)
    assert r.stdout.strip() in ("", "hello")


def test_debug_shows_the_traceback():
    r = cli("logits", "-m", CORPUS / "arch_is_number.gguf", "-p", "hi", "--debug")
    assert r.returncode == 2 and "Traceback" in r.stderr and "MetadataError" in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("error: ")


def test_gguf_dump_json_is_strict_and_lists_problems():
    r = cli("gguf-dump", "--json", CORPUS / "freq_base_inf.gguf")
    assert r.returncode == 0, r.stderr

    def refuse(c):
        raise AssertionError(f"non-strict JSON constant {c}")
    rec = json.loads(r.stdout, parse_constant=refuse)
    assert rec["kv"]["llama.rope.freq_base"] == "inf"
    assert rec["problems"] == ["metadata 'llama.rope.freq_base' is float32 inf; expected a finite number in (0, 1000000000000]"]
    r = cli("gguf-dump", CORPUS / "arch_is_number.gguf")      # the summary too: no arch, no crash
    assert r.returncode == 0 and "problems (1)" in r.stdout, r.stderr


# ---------------------------------------------------------------------------- user numbers and files
@pytest.mark.parametrize("args, contains, usage", [
    (["logits", "-p", "hi", "--n-ctx", "0"], "--n-ctx: 0 must be a positive integer", True),
    (["logits", "-p", "hi", "--n-ctx", "-5"], "--n-ctx: -5 must be a positive integer", True),
    (["logits", "-p", "hi", "--top", "x"], "--top: 'x' is not an integer", True),
    (["logits", "-p", "hi", "--n-ctx", "100000000"], "exceeds the model's context length (llama.context_length = 256)", False),
    (["generate", "-p", "hi", "-n", "100000000000"], "", False),      # bounded before the KV cache is allocated
    (["detokenize", "١٢"], "not a token id: '١٢'", False),
    (["detokenize", "1_0"], "not a token id: '1_0'", False),
    (["detokenize", "5", "99999999999999999999"], "outside the vocabulary", False),
    (["logits"], "the following arguments are required: -p/--prompt", True),
])
def test_bad_numbers(args, contains, usage):
    assert_error(cli(*args, "-m", BASE), contains, usage)


@pytest.mark.parametrize("args, contains", [
    (["generate", "-p", "hi", "-n", "١٠"], "argument -n/--n-predict: '١٠' is not an integer"),
    (["generate", "-p", "hi", "--seed", "٣"], "argument -s/--seed: '٣' is not an integer"),
    (["generate", "-p", "hi", "--n-ctx", "1_0"], "argument -c/--ctx-size/--n-ctx: '1_0' is not an integer"),
    (["generate", "-p", "hi", "--temp", "infinity"], "argument --temp: 'infinity' is not a finite decimal number"),
    (["generate", "-p", "hi", "--top-p", "nan"], "argument --top-p: 'nan' is not a finite decimal number"),
    (["generate", "-p", "hi", "--min-p", "1e999"], "argument --min-p: '1e999' is not a finite decimal number"),
    (["generate", "-p", "hi", "--repeat-last-n", "0x40"], "argument --repeat-last-n: '0x40' is not an integer"),
    (["generate", "-p", "hi", "-t", "0"], "argument -t/--threads: 0 must be a positive integer"),
    (["chat", "-n", "٣"], "argument -n/--n-predict: '٣' is not an integer"),
    (["logits", "-p", "hi", "-c", "١٦"], "argument -c/--ctx-size/--n-ctx: '١٦' is not an integer"),
    (["logits", "-p", "hi", "-fa", "maybe"], "argument -fa/--flash-attn: invalid choice: 'maybe'"),
    (["bench", "--prompt-tokens", "1e3"], "argument --prompt-tokens: '1e3' is not an integer"),
    (["bench", "-t", "-1"], "argument -t/--threads: -1 must be a positive integer"),
    (["gguf-dump", "--max-tensors", "²"], "argument --max-tensors: '²' is not an integer"),
])
def test_one_number_parser(args, contains):
    """Every number option goes through one parser: ASCII digits, finite decimals (issue 26 item 14)."""
    cmd, rest = args[0], args[1:]
    assert_error(cli(cmd, *(["-m", BASE] if cmd != "gguf-dump" else [BASE]), *rest), contains, usage=True)


def test_bad_knobs_are_one_error_line():
    """A bad LLMLAB_* value ends the command with one error line naming the variable."""
    assert_error(cli("generate", "-m", BASE, "-p", "hi", "-n", "1", env={"LLMLAB_THREADS": "two"}),
                 "error: LLMLAB_THREADS: 'two' is not an integer")
    assert_error(cli("logits", "-m", BASE, "-p", "hi", env={"LLMLAB_CPU": "sparc"}),
                 "error: LLMLAB_CPU: unknown CPU profile 'sparc'")
    assert_error(cli("logits", "-m", BASE, "-p", "hi", env={"LLMLAB_PARALLEL_MIN_WORK": "lots"}),
                 "error: LLMLAB_PARALLEL_MIN_WORK: 'lots' is not an integer")


def test_short_options_and_version():
    """llama.cpp's -t, -c, -s, -fa mean what the long options mean; --version prints the version, exit 0."""
    from llmlab import __version__
    from llmlab.cli import build_parser
    parse = build_parser().parse_args
    for cmd in ("generate", "chat"):
        short = parse([cmd, *(["-p", "x"] if cmd == "generate" else []), "-t", "2", "-c", "64", "-s", "7", "-fa", "on"])
        long = parse([cmd, *(["-p", "x"] if cmd == "generate" else []), "--threads", "2", "--n-ctx", "64", "--seed", "7",
                      "--flash-attn", "on"])
        assert vars(short) == vars(long) and (short.threads, short.n_ctx, short.seed) == (2, 64, 7)
    assert parse(["logits", "-p", "x", "-c", "9"]).n_ctx == 9 == parse(["logits", "-p", "x", "--ctx-size", "9"]).n_ctx
    assert parse(["bench", "-t", "3"]).threads == 3 and parse(["diff-llama-cpp", "-m", "m", "-p", "x", "-t", "3"]).threads == 3
    # --flash-attn: llama.cpp's on|off|auto everywhere; the bare flag (the old spelling) is on; default off
    for cmd in (["generate", "-p", "x"], ["logits", "-p", "x"], ["diff-llama-cpp", "-m", "m", "-p", "x"]):
        assert parse(cmd).flash_attn == "off" and parse([*cmd, "--flash-attn"]).flash_attn == "on"
        assert [parse([*cmd, "-fa", v]).flash_attn for v in ("on", "off", "auto")] == ["on", "off", "auto"]
    # logits takes the registry default like the other commands
    from llmlab import models
    assert parse(["logits", "-p", "x"]).model == models.DEFAULT_MODEL == parse(["generate", "-p", "x"]).model
    r = cli("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"llmlab {__version__}" and r.stderr == ""


def test_short_options_run(tmp_path):
    """The short spellings give the long ones' output, bit for bit (a tiny model, reference kernels)."""
    a = cli("logits", "-m", BASE, "-p", "hi there", "-c", "16", "-fa", "on", "--json", "--kernels", "reference")
    b = cli("logits", "-m", BASE, "-p", "hi there", "--n-ctx", "16", "--flash-attn", "--json", "--kernels", "reference")
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    assert a.stdout == b.stdout and json.loads(a.stdout)["ids"]


def test_argparse_errors_exit_2():
    assert_error(cli("no-such-command"), "invalid choice", usage=True)
    assert_error(cli(), "required", usage=True)


def test_model_that_is_a_directory_or_fifo(tmp_path):
    d = tmp_path / "model.gguf"
    d.mkdir()
    assert_error(cli("logits", "-m", d, "-p", "hi"), "is a directory")
    fifo = tmp_path / "fifo.gguf"
    os.mkfifo(fifo)
    assert_error(cli("gguf-dump", fifo, timeout=60), "is not a regular file (a FIFO)")
    assert_error(cli("tokenize", "-m", fifo, "--text", "x", timeout=60), "is not a regular file (a FIFO)")


def test_tokenize_file_limits(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert_error(cli("tokenize", "-m", BASE, "--file", fifo, timeout=60), "is not a regular file (a FIFO)")
    assert_error(cli("tokenize", "-m", BASE, "--file", tmp_path), "is a directory")
    big = tmp_path / "big.txt"
    with open(big, "wb") as f:
        f.truncate(1 << 30)                       # sparse: 1 GiB of zeros, no disk used
    assert_error(cli("tokenize", "-m", BASE, "--file", big), "is over the 16,777,216-byte limit")
    assert_error(cli("tokenize", "-m", BASE, "--file", "/dev/zero", timeout=60), "is not a regular file (a character device)")
    ok = tmp_path / "ok.txt"
    ok.write_text("hello")
    r = cli("tokenize", "-m", BASE, "--file", ok, "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["ids"], r.stderr


def test_memory_error_is_one_line():
    code = ("import sys; from llmlab.cli import main; import llmlab.llama.vocab as v\n"
            "def boom(*a, **k): raise MemoryError()\n"
            "v.Tokenizer.from_model = boom\n"
            "sys.exit(main(['tokenize', '--text', 'x']))")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=60)
    assert_error(r, "out of memory")


def _limit_memory():
    import resource
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))


def test_hostile_sizes_under_a_memory_limit(tmp_path):
    """With the address space capped at 3 GiB, hostile sizes still end in one error line."""
    import struct
    n = 8_000_000             # an array of 8M empty uint8 arrays: 96 MB of file (82 s and 3.5 GB before the budget)
    head = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 4) + b"evil" + struct.pack("<IIQ", 9, 9, n)
    (tmp_path / "nested.gguf").write_bytes(head + bytes(12 * n))
    t0 = time.perf_counter()
    assert_error(cli("gguf-dump", tmp_path / "nested.gguf", preexec=_limit_memory), "nested arrays hold more than")
    assert time.perf_counter() - t0 < 60
    assert_error(cli("logits", "-m", BASE, "-p", "hi", "--n-ctx", "2000000000", preexec=_limit_memory), "exceeds")


# ---------------------------------------------------------------------------- quantize: safe writes
def _listing(d: Path) -> set[str]:
    return {p.name for p in d.iterdir()}


def test_quantize_refuses_its_input(tmp_path):
    src = tmp_path / "m.gguf"
    src.write_bytes(BASE.read_bytes())
    before = src.read_bytes()
    assert_error(cli("quantize", src, src, "q8_0"), "output is the input file")
    link = tmp_path / "link.gguf"
    os.link(src, link)                          # another name, same inode
    assert_error(cli("quantize", src, link, "q8_0"), "output is the input file")
    assert src.read_bytes() == before and _listing(tmp_path) == {"m.gguf", "link.gguf"}


def test_quantize_accepts_registry_names_and_refuses_the_cached_file():
    from llmlab import models
    path = models.resolve("smollm2")             # fetched once (make test fetches it first)
    assert path == models.model_path(models.spec_for("smollm2"))
    assert_error(cli("quantize", "smollm2", path, "q8_0"), "output is the input file")


def test_quantize_refuses_special_outputs(tmp_path):
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    assert_error(cli("quantize", BASE, fifo, "q8_0", timeout=60), "output exists and is a FIFO")
    assert_error(cli("quantize", BASE, tmp_path, "q8_0"), "output exists and is a directory")
    assert_error(cli("quantize", BASE, tmp_path / "no" / "dir.gguf", "q8_0"), "does not exist")
    assert_error(cli("quantize", BASE, "/dev/null", "q8_0"), "output exists and is a character device")
    import stat
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and _listing(tmp_path) == {"out.fifo"}


def test_quantize_writes_atomically(tmp_path):
    out = tmp_path / "q.gguf"
    r = cli("quantize", BASE, out, "f16", "--quiet")
    assert r.returncode == 0, r.stderr
    assert _listing(tmp_path) == {"q.gguf"} and oct(out.stat().st_mode & 0o777) != "0o600"
    r = cli("logits", "-m", out, "-p", "hello", "--json")
    assert r.returncode == 0, r.stderr


def test_quantize_failure_leaves_nothing(tmp_path, monkeypatch):
    """A failure (here Ctrl-C) in the middle of writing: no temporary file, the old output intact."""
    from llmlab.cli.quantize import quantize_file
    from llmlab.ggml.gguf import GGUFWriter
    out = tmp_path / "q.gguf"
    out.write_bytes(b"old")

    def interrupted(self, fh, progress=None):
        fh.write(b"partial")
        raise KeyboardInterrupt
    monkeypatch.setattr(GGUFWriter, "write", interrupted)
    with pytest.raises(KeyboardInterrupt):
        quantize_file(BASE, out, "f16", progress=False)
    assert _listing(tmp_path) == {"q.gguf"} and out.read_bytes() == b"old"


# ---------------------------------------------------------------------------- Ctrl-C
def _numpy_loaded(pid: int) -> bool:
    try:
        return "numpy" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


@pytest.mark.parametrize("delay", [0.0, 0.05, 0.15, 0.4, "compute"])
def test_ctrl_c_at_any_moment(delay):
    """From the moment llmlab's code runs (here: as soon as numpy is mapped, early in the imports),
    SIGINT gives exit 130 and the one line ``interrupted``. (Before that, Python's own start-up,
    ``site`` and .pth files, is outside llmlab's reach.) "compute": in the middle of a real model's
    forward pass, timed from an uninterrupted run of the same command on this machine."""
    if delay == "compute":
        from llmlab import models
        models.resolve("smollm2")                # fetched once (make test fetches it first)
        args = ["logits", "-m", "smollm2", "-p", "hello " * 400]
    else:
        args = ["logits", "-m", BASE, "-p", "hello"]

    def start():
        p = subprocess.Popen([sys.executable, "-m", "llmlab", *map(str, args)], cwd=ROOT, env=ENV,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        t0 = time.monotonic()
        while not _numpy_loaded(p.pid) and p.poll() is None and time.monotonic() - t0 < 60:
            time.sleep(0.002)
        return p, time.monotonic()

    waits = [delay]
    if delay == "compute":
        p, t0 = start()
        assert p.wait(timeout=300) == 0, p.stderr.read()
        total = time.monotonic() - t0           # from numpy mapped to the end: load, then the forward pass
        waits = [0.7 * total, 0.5 * total, 0.3 * total]
    for wait in waits:
        p, _ = start()
        time.sleep(wait)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
        if p.returncode != 0:
            break
        # it ended before the signal came: then it ended well
        assert out.strip() and "interrupted" not in err and "Traceback" not in err, err
        if delay != "compute":
            return
    assert p.returncode == 130 and err == "interrupted\n", (p.returncode, err)
