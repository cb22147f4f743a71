"""llmlab on linux/arm64: an arm64 Debian root (tools/arm64/make_root.sh) that qemu-user runs through
binfmt, with numpy and numba from aarch64 wheels, where llmlab runs as on an ARM Linux machine
(``--arm64-native``: make test-arm64-native; make test-arm64-native-quick leaves out the tests marked slow).

- Detection starts from the machine. qemu-user 7.2 passes the x86 host's /proc/cpuinfo through, and
  ``auto`` must still take an ARM profile; with a real ARM cpuinfo (tests/data/cpuinfo/, shown as
  /proc/cpuinfo in the command's private mount namespace) it takes that CPU's profile.
- ``python -m llmlab generate``, greedy, with either kernel set, gives the tokens of llama.cpp built for
  that ARM level (llmlab/data/refs/<profile>/), on a prompt whose first tokens tell ARM's arithmetic
  from x86's.
- The fast kernels select and compile none of dot4's byte-dot kernels (x86 AVX512-VNNI/AVX2 intrinsics).

Speeds here are emulated (one x86 core interprets the ARM code, numba compiles under emulation): the
tests print them, marked as such, and never assert them. numba's cache of the root lives beside it
(``<root>/../numba``), so only a first run compiles, once per CPU that /proc/cpuinfo shows: LLVM takes its
aarch64 target from there (``generic`` under the x86 host's, ``neoverse-n1`` under the Graviton2 file).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from llmlab import config, data, models
from llmlab.ggml.cpu import profiles

native = pytest.mark.arm64_native     # every test that runs in the root (the data check below runs anywhere)

REPO = Path(__file__).resolve().parent.parent
TOOLS = REPO / "tools" / "arm64"
CPUINFO = Path(__file__).parent / "data" / "cpuinfo"
CACHE = config.home()          # make arm64-root's ARM64_ROOT_CACHE by default
TIMEOUT = 3600                 # one command under emulation, a cold numba cache included


@pytest.fixture(scope="session")
def arm64_root() -> Path:
    """The cached root (made by make_root.sh, ~15 min the first time; then reused at once)."""
    if os.geteuid() != 0:
        pytest.fail("--arm64-native needs root (chroot, mount namespaces, binfmt)")
    if shutil.which("qemu-aarch64-static") is None:
        pytest.fail("--arm64-native needs qemu-user-static (make arm64-deps)")
    out = subprocess.run(["bash", str(TOOLS / "make_root.sh"), str(CACHE)], capture_output=True, text=True,
                         timeout=2 * TIMEOUT)
    assert out.returncode == 0, f"make_root.sh failed: {out.stderr.strip()[-2000:]}"
    return Path(out.stdout.strip().splitlines()[-1])


def in_root(root: Path, *cmd: str, cpuinfo: str | None = None, timeout: float = TIMEOUT) -> subprocess.CompletedProcess:
    """Run ``cmd`` in the root: this checkout read-only at /src (imported from there), the models
    read-only, numba's cache of the root writable; ``cpuinfo``: a file of tests/data/cpuinfo/ as
    /proc/cpuinfo."""
    models_dir = models.resolve("smollm2").parent
    numba_cache = root.parent / "numba"
    numba_cache.mkdir(exist_ok=True)
    args = [str(TOOLS / "run_in_root.sh"), str(root), "--bind", f"{REPO}:/src", "--bind", f"{models_dir}:/root/.cache/llmlab/models",
            "--bind", f"{numba_cache}:/numba:rw", "--env", "PYTHONPATH=/src", "--env", "NUMBA_CACHE_DIR=/numba",
            "--env", "PYTHONDONTWRITEBYTECODE=1"]
    if cpuinfo is not None:
        args += ["--cpuinfo", str(CPUINFO / cpuinfo)]
    return subprocess.run([*args, "--", *cmd], capture_output=True, text=True, timeout=timeout)


def probe(root: Path, *args: str, cpuinfo: str | None = None) -> dict:
    """tests/arm64_native_probe.py in the root: its JSON, and the seconds the whole command took."""
    t0 = time.perf_counter()
    out = in_root(root, "python", "/src/tests/arm64_native_probe.py", *args, cpuinfo=cpuinfo)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    res["wall_s"] = round(time.perf_counter() - t0, 1)
    res["stderr"] = out.stderr
    return res


def emulated(what: str, seconds: float, cpu_s: float | None = None) -> None:
    cpu = f" ({cpu_s:.1f} s of CPU)" if cpu_s is not None else ""
    print(f"\n[emulated by qemu-user, not an ARM CPU's speed] {what}: {seconds:.1f} s{cpu}", flush=True)


# ---- the root itself: a clean environment, the checkout read-only, no mount left behind -------------

def _mounts_under(path: Path) -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [line for line in f if f" {path}/" in line or f" {path} " in line]


@native
def test_commands_run_isolated_and_leave_no_mount(arm64_root):
    out = in_root(arm64_root, "sh", "-c", "uname -m; env | sort; touch /src/x 2>/dev/null && echo rw-src; "
                                          "touch /numba/.w && rm /numba/.w && echo rw-numba; exit 3", timeout=300)
    assert out.returncode == 3, out.stderr                      # the command's own status comes back
    lines = out.stdout.split()
    assert lines[0] == "aarch64"
    names = {line.split("=", 1)[0] for line in lines if "=" in line}
    assert names <= {"HOME", "PATH", "LANG", "PYTHONPATH", "NUMBA_CACHE_DIR", "PYTHONDONTWRITEBYTECODE", "PWD", "SHLVL", "_"}, names
    assert "rw-src" not in lines and "rw-numba" in lines       # the checkout is read-only, numba's cache is not
    assert _mounts_under(arm64_root) == []                      # proc, dev, sys and the binds died with it
    bad = subprocess.run([str(TOOLS / "run_in_root.sh"), str(arm64_root), "--bind", "/no/such/dir:/x", "--", "true"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and bad.stderr.startswith("error:") and _mounts_under(arm64_root) == []


# ---- detection ---------------------------------------------------------------------------------------

@native
def test_auto_never_takes_an_x86_profile_with_the_hosts_cpuinfo(arm64_root):
    """qemu-user shows the host's /proc/cpuinfo: x86 flags, on an aarch64 machine. auto takes the
    plainest ARM profile, says it is not reproduced, and no byte-dot kernel can be chosen."""
    r = probe(arm64_root, "detect")
    assert r["machine"] == "aarch64" and r["profile_arch"] == "aarch64", r
    assert (r["profile"], r["source"], r["reproduced"]) == (profiles.nearest("aarch64").name, "default", False)
    if profiles.machine() == "x86_64":
        assert {"avx2", "fma"} <= set(r["flags"])                # what qemu passed through from this host
    assert r["dot4_isas"] == [] and r["dot4"] is None
    emulated("python, numba and llmlab's detection start up", r["wall_s"])


# file -> the profile auto must take, and whether that CPU's llama.cpp computes it
ARM_CPUS = {
    "neoverse-n1-graviton2.txt": ("arm_dotprod_fp16", True),
    "cortex-a76-raspberry-pi-5.txt": ("arm_dotprod_fp16", True),
    "neoverse-v1-graviton3.txt": ("arm_i8mm", True),
    "cortex-a72-raspberry-pi-4.txt": (profiles.nearest("aarch64").name, False),    # no dotprod: the nearest ARM one
}


@native
@pytest.mark.parametrize("cpuinfo", sorted(ARM_CPUS))
def test_auto_takes_the_profile_of_a_real_arm_cpuinfo(arm64_root, cpuinfo):
    r = probe(arm64_root, "detect", cpuinfo=cpuinfo)
    want, reproduced = ARM_CPUS[cpuinfo]
    assert r["machine"] == "aarch64" and "asimd" in r["flags"] and "avx2" not in r["flags"]
    assert (r["profile"], r["reproduced"]) == (want, reproduced), r
    assert r["source"] == ("/proc/cpuinfo" if reproduced else "default")


# ---- generation --------------------------------------------------------------------------------------

def ref_case(model: str, cpu: str, i: int = 0) -> tuple[str, list[int], list[int]]:
    """(prompt, its ids, the greedy tokens) of ref prompt ``i`` on profile ``cpu``, cut one token after
    the first where llama.cpp on x86 (avx512) continues otherwise: tokens that tell the two apart."""
    meta, npz = data.ref_logits(model, cpu)
    x86 = data.ref_logits(model, "avx512")[1][f"p{i}_greedy"].tolist()
    want = npz[f"p{i}_greedy"].tolist()
    differ = next((k for k, (a, b) in enumerate(zip(want, x86)) if a != b), None)
    assert differ is not None and differ < 16, f"ref prompt {i} of {model} does not tell {cpu} from avx512 early"
    return meta["prompts"][i]["prompt"], npz[f"p{i}_ids"].tolist(), want[:differ + 1]


# (model, kernels, --cpu, cpuinfo, the profile whose tokens come out); slow: outside the quick subset
GENERATE = [
    pytest.param("smollm2", "reference", "arm_dotprod_fp16", None, "arm_dotprod_fp16", id="smollm2-reference"),
    pytest.param("smollm2", "fast", "arm_dotprod_fp16", None, "arm_dotprod_fp16", id="smollm2-fast", marks=pytest.mark.slow),
    pytest.param("smollm2", "fast", "auto", "neoverse-n1-graviton2.txt", "arm_dotprod_fp16", id="smollm2-fast-auto-n1",
                 marks=pytest.mark.slow),
    pytest.param("smollm2", "reference", "auto", "neoverse-v1-graviton3.txt", "arm_i8mm", id="smollm2-reference-auto-v1",
                 marks=pytest.mark.slow),
    pytest.param("gemma3", "reference", "arm_dotprod_fp16", None, "arm_dotprod_fp16", id="gemma3-reference", marks=pytest.mark.slow),
    pytest.param("gemma3", "fast", "arm_dotprod_fp16", None, "arm_dotprod_fp16", id="gemma3-fast", marks=pytest.mark.slow),
    pytest.param("smollm2", "fast", "arm_i8mm", None, "arm_i8mm", id="smollm2-fast-i8mm", marks=pytest.mark.slow),
    pytest.param("gemma3", "fast", "arm_i8mm", None, "arm_i8mm", id="gemma3-fast-i8mm", marks=pytest.mark.slow),
]


@native
@pytest.mark.parametrize("model, kernels, cpu, cpuinfo, want_cpu", GENERATE)
def test_generate_gives_the_arm_tokens(arm64_root, model, kernels, cpu, cpuinfo, want_cpu):
    prompt, ids, want = ref_case(model, want_cpu)
    r = probe(arm64_root, "generate", "-m", model, "--cpu", cpu, "--kernels", kernels, "-n", str(len(want)),
              "--temp", "0", "--json", "-p", prompt, cpuinfo=cpuinfo)
    assert r["rc"] == 0 and r["machine"] == "aarch64" and r["cpu"] == want_cpu, r["stderr"][-2000:]
    assert r["prompt_ids"] == ids
    assert r["ids"] == want, f"{model} {kernels} on {want_cpu}: {r['ids']} != llama.cpp's {want}"
    # nothing of dot4 (x86 byte-dot intrinsics) is selected or compiled; the fast set did run numba kernels
    assert r["dot4"] is None and not [k for k in r["kernels"] if ".fast.dot4" in k], r["kernels"]
    if kernels == "fast":
        assert r["kernels"] and all(k.startswith("llmlab.ggml.cpu.fast.") for k in r["kernels"]), r["kernels"]
        # the quantized products ran the ARM twins (fast.neon), not the NumPy reference
        assert [k for k in r["kernels"] if k.startswith("llmlab.ggml.cpu.fast.neon.")], r["kernels"]
    ran = ", ".join(k.rsplit(".", 1)[-1] for k in r["kernels"]) or "none"
    # generate's own lines: the fast set's warm-up (a 128-token batch through the model) and the speeds
    said = "; ".join(line for line in r["stderr"].splitlines() if line.startswith(("kernels:", "prompt eval:")))
    emulated(f"{model} --kernels {kernels} --cpu {cpu}: {len(ids)}-token prompt + {len(want)} tokens (numba: "
             f"{r['numba_compiled']} compiled, {r['numba_loaded']} loaded; kernels: {ran}) [{said}]", r["wall_s"], r["cpu_s"])


def test_reference_tokens_differ_from_x86_where_the_suite_looks():
    """What the generation tests lean on, checked on any machine: each ARM reference they use continues
    otherwise than x86's within its first 16 greedy tokens, so a run that took an x86 profile would fail."""
    for model, _kernels, _cpu, _cpuinfo, want_cpu in (p.values for p in GENERATE):
        ref_case(model, want_cpu)


@pytest.mark.parametrize("argv", [["run_in_root.sh", "/no/such/root", "--", "true"], ["run_in_root.sh"],
                                  ["make_root.sh"], ["make_root.sh", "a", "b"]])
def test_root_scripts_say_bad_input_in_one_line(argv):
    """Runs anywhere (no root, no qemu needed): bad arguments are one error line and status 2."""
    out = subprocess.run(["bash", str(TOOLS / argv[0]), *argv[1:]], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stderr.startswith("error:") and len(out.stderr.splitlines()) == 1, out.stderr
