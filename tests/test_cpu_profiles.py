"""CPU profiles: the registry, detection and overrides, and the arithmetic that differs between
instruction sets (emulated, so these run on any machine)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from llmlab.ggml.cpu import profiles
from llmlab.ggml.cpu.simd import halves, hadd_tree, reduce_tree, tree_lanes
from llmlab.ggml.cpu.vec import expf_bits, expf_scalef, soft_max_rows, vec_dot_f16

ROOT = Path(__file__).resolve().parent.parent


def test_registry_has_one_file_per_instruction_set():
    assert {"avx2", "avx512"} <= set(profiles.PROFILES)
    for p in profiles.PROFILES.values():
        assert tree_lanes(p.vec_reduce_tree) == p.f32_lanes == tree_lanes(p.hsum_tree)
        assert tree_lanes(p.sgemm_hsum_tree) == p.sgemm_lanes
    assert profiles.resolve("avx2") is profiles.get("AVX2") is profiles.resolve(profiles.get("avx2"))
    with pytest.raises(ValueError, match="unknown CPU profile"):
        profiles.get("neon9000")


def test_reduction_trees():
    assert halves(8) == (((0, 4), (2, 6)), ((1, 5), (3, 7)))               # hsum_float_8
    assert hadd_tree(8) == (((0, 4), (1, 5)), ((2, 6), (3, 7)))            # GGML_F32x8_REDUCE
    x = np.array([1e8, 1, -1e8, 1, 0.5, 0.25, 3, -3], np.float32)
    assert reduce_tree(x, halves(8)) != reduce_tree(x, hadd_tree(8))       # same numbers, other bits


def test_system_info_decides_the_profile():
    avx512 = "CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | AVX512 = 1 | AVX512_VNNI = 1 |"
    avx2 = "CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | LLAMAFILE = 1 |"
    neon = "CPU : NEON = 1 | ARM_FMA = 1 | FP16_VA = 1 | DOTPROD = 1 | LLAMAFILE = 1 | REPACK = 1 |"
    plain_neon = "CPU : NEON = 1 | ARM_FMA = 1 | LLAMAFILE = 1 | REPACK = 1 |"
    assert profiles._from_system_info(avx512).name == "avx512"
    assert profiles._from_system_info(avx2).name == "avx2"            # ggml omits "AVX512 = 0"
    assert profiles._from_system_info(neon).name == "arm_dotprod_fp16"
    assert profiles._from_system_info(plain_neon) is None             # no profile for NEON without DOTPROD/FP16
    x86 = "x86_64"
    assert profiles._from_flags({"avx2", "fma", "f16c"}, x86).name == "avx2"
    assert profiles._from_flags({"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512dq", "avx512vl"}, x86).name == "avx512"
    assert profiles._from_flags({"neon", "asimd"}, "aarch64") is None


def _run(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env})


def test_llmlab_cpu_overrides_detection():
    out = _run("from llmlab.ggml.cpu import profiles as p; d = p.detect(); print(d.profile.name, d.source)",
               LLMLAB_CPU="avx2")
    assert out.stdout.split() == ["avx2", "LLMLAB_CPU"]
    bad = _run("from llmlab.ggml.cpu import profiles as p; p.detect()", LLMLAB_CPU="sparc")
    assert bad.returncode != 0 and "unknown CPU profile" in bad.stderr


def test_unreproduced_cpu_runs_the_nearest_profile_and_says_so_once():
    code = ("import llmlab.ggml.cpu.profiles as p\n"
            "p.llama_cpp_system_info = lambda: None\n"
            "p.cpu_flags = lambda: {'neon', 'asimd'}\n"
            "a = p.resolve('auto'); b = p.resolve(None)\n"
            "print(a.name, b.name, p.detect().reproduced)\n")
    out = _run(code)
    assert out.stdout.split() == ["avx2", "avx2", "False"]
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("llmlab:")]
    assert len(lines) == 1 and "not be bit-identical" in lines[0]


def test_vec_dot_f16_lanes_differ_between_profiles():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((200, 64)).astype(np.float16).astype(np.float32)
    y = rng.standard_normal((200, 64)).astype(np.float16).astype(np.float32)
    a, b = vec_dot_f16(x, y, "avx2"), vec_dot_f16(x, y, "avx512")
    exact = (x.astype(np.float64) * y).sum(-1)
    assert (a != b).any()
    np.testing.assert_allclose(a, exact, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(b, exact, rtol=1e-5, atol=1e-5)


def test_expf_variants_special_cases():
    x = np.array([-np.inf, -200, -110, -100, -87.5, -1, 0, 1e-8, 1, 80, 88.7, 89, 100, np.inf], np.float32)
    want = np.exp(x.astype(np.float64))
    for f in (expf_bits, expf_scalef):
        got = f(x)
        fin = np.isfinite(want) & (want > 1e-37) & (want < 3e38)
        np.testing.assert_allclose(got[fin], want[fin], rtol=4e-7)
        assert got[0] == 0 and got[-1] == np.inf and got[1] == 0
    d = np.linspace(-30, 0, 20001, dtype=np.float32)
    assert (expf_bits(d) != expf_scalef(d)).any()                          # two polynomials' last bits


def test_soft_max_tail_and_masked_rows():
    w = np.random.default_rng(1).standard_normal((3, 21)).astype(np.float32)
    w[1, :7] = -np.inf
    for cpu in ("avx2", "avx512"):
        p = soft_max_rows(w, cpu)
        assert (p[1, :7] == 0).all()
        np.testing.assert_allclose(p.sum(-1), 1, rtol=1e-6)


def test_repack_types_follow_the_instruction_set():
    assert profiles.get("avx512").repacks("q2_k", 640) and not profiles.get("avx2").repacks("q2_k", 640)
    for name in ("avx2", "avx512"):
        p = profiles.get(name)
        assert p.repacks("q4_k", 1024) and not p.repacks("q4_k", 1028) and not p.repacks("q6_k", 1024)
        assert p.repack_layout("q4_k") == "q4_K_8x8" and not p.repacks("q8_0", 1024)
    arm = profiles.get("arm_dotprod_fp16")          # ggml_repack_get_optimal_repack_type with dotprod
    assert arm.repack_layout("q4_k") == "q4_K_8x4" and arm.repacks("q6_k", 640) and not arm.repacks("q4_k", 1028)
    assert arm.repack_layout("q8_0") == "q8_0_4x4" and arm.repacks("q8_0", 1028) and not arm.repacks("q8_0", 1030)
    assert not arm.repacks("q4_1", 1024) and not arm.tiled_types            # tiled/ is x86 only


# ---- detection on ARM machines: the machine first, then its own features (faked here) ----------------

NEOVERSE_N1 = "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp ssbs"
CORTEX_A72 = "fp asimd evtstrm crc32 cpuid"


def test_machine_names_are_normalized():
    assert profiles.machine("AMD64") == profiles.machine("x86_64") == "x86_64"
    assert profiles.machine("arm64") == profiles.machine("aarch64") == "aarch64"


def test_arm_cpuinfo_picks_the_arm_profile_and_never_an_x86_one():
    assert profiles._from_flags(set(NEOVERSE_N1.split()), "aarch64").name == "arm_dotprod_fp16"
    assert profiles._from_flags(set(CORTEX_A72.split()), "aarch64") is None     # no dotprod: no exact profile
    graviton3 = set(NEOVERSE_N1.split()) | {"i8mm", "bf16", "sve"}
    assert profiles._from_flags(graviton3, "aarch64").name == "arm_i8mm"
    assert profiles._from_system_info("NEON = 1 | ARM_FMA = 1 | FP16_VA = 1 | MATMUL_INT8 = 1 | DOTPROD = 1 | "
                                      "REPACK = 1 |").name == "arm_i8mm"
    assert profiles.nearest("aarch64").arch == "aarch64"
    # qemu-user shows the x86 host's /proc/cpuinfo to an aarch64 process: x86 flags on an ARM machine
    x86_flags = {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512dq", "avx512vl"}
    assert profiles._from_flags(x86_flags, "aarch64") is None
    assert profiles._from_flags(set(NEOVERSE_N1.split()), "x86_64") is None


def test_macos_sysctl_features_map_to_linux_names():
    m1 = {"hw.optional.arm.FEAT_DotProd": "1", "hw.optional.arm.FEAT_FP16": "1", "hw.optional.arm.FEAT_I8MM": "0",
          "hw.optional.AdvSIMD": "1"}
    assert profiles.darwin_flags(m1) == {"asimd", "asimddp", "asimdhp"}
    assert profiles._from_flags(profiles.darwin_flags(m1), "aarch64").name == "arm_dotprod_fp16"
    m2 = {**m1, "hw.optional.arm.FEAT_I8MM": "1"}
    assert profiles._from_flags(profiles.darwin_flags(m2), "aarch64").name == "arm_i8mm"


def test_auto_detection_on_a_faked_arm_machine():
    code = ("import llmlab.ggml.cpu.profiles as p, platform\n"
            "platform.machine = lambda: {machine!r}\n"
            "p.llama_cpp_system_info = lambda: None\n"
            "p.cpu_flags = lambda: set({flags!r}.split())\n"
            "d = p.detect(); print(d.profile.name, d.source, d.reproduced)\n")
    out = _run(code.format(machine="aarch64", flags=NEOVERSE_N1))
    assert out.stdout.split() == ["arm_dotprod_fp16", "/proc/cpuinfo", "True"], out.stderr
    out = _run(code.format(machine="aarch64", flags="fpu avx2 fma f16c avx512f avx512bw avx512dq avx512vl"))
    assert out.stdout.split()[0] == "arm_dotprod_fp16" and out.stdout.split()[1:] == ["default", "False"]
    out = _run(code.format(machine="arm64", flags=CORTEX_A72))
    assert out.stdout.split() == ["arm_dotprod_fp16", "default", "False"]


def test_cli_takes_cpu_and_reports_it(smollm2_path):
    outs = {}
    for cpu in ("avx2", "avx512"):
        r = subprocess.run([sys.executable, "-m", "llmlab", "logits", "-m", str(smollm2_path), "-p", "Hello there",
                            "--top", "3", "--json", "--cpu", cpu], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        outs[cpu] = json.loads(r.stdout)
        assert outs[cpu]["cpu"] == cpu
    assert outs["avx2"]["top_ids"][-1][0] == outs["avx512"]["top_ids"][-1][0]
    bad = subprocess.run([sys.executable, "-m", "llmlab", "logits", "-m", str(smollm2_path), "-p", "x", "--cpu", "z80"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "invalid choice" in bad.stderr


# ---- the one CPU detector: a damaged or hostile /proc/cpuinfo, and the readers of the other OSes

def test_cpuinfo_of_random_bytes_or_no_flags_line_is_read_without_a_traceback(tmp_path):
    junk = tmp_path / "cpuinfo"
    junk.write_bytes(bytes(np.random.default_rng(1).integers(0, 256, 200_000, dtype=np.uint8)))
    text, why = profiles.read_cpuinfo(junk)
    assert why == "" and isinstance(text, str)
    flags, _ = profiles.parse_cpuinfo(text)
    assert all(f.isascii() and f.isprintable() for f in flags)
    junk.write_bytes(b"flags\t: avx2 fma \xff\xfe f16c\nmodel name\t: Some CPU \xc3(\n")
    assert profiles.parse_cpuinfo(profiles.read_cpuinfo(junk)[0]) == ({"avx2", "fma", "f16c"}, "Some CPU (")
    big = tmp_path / "big"
    big.write_bytes(b"x" * 5000)
    assert len(profiles.read_cpuinfo(big, max_bytes=1000)[0]) == 1000


def test_cpuinfo_that_is_a_fifo_or_a_directory_is_passed_over_at_once(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    text, why = profiles.read_cpuinfo(fifo)
    assert text == "" and why == f"{fifo}: is not a regular file (a FIFO)"
    assert profiles.read_cpuinfo(tmp_path)[0] == "" and profiles.read_cpuinfo(tmp_path / "none")[1]
    assert time.monotonic() - t0 < 1


@pytest.mark.parametrize("kind", ["fifo", "random"])
def test_commands_and_nb_setup_run_with_a_hostile_cpuinfo(tmp_path, kind):
    """A FIFO made every command and nb.setup hang; random bytes gave a traceback (issue 37). Now the
    features come from CPUID (LLVM) and doctor says so."""
    info = tmp_path / "cpuinfo"
    if kind == "fifo":
        os.mkfifo(info)
    else:
        info.write_bytes(bytes(np.random.default_rng(2).integers(0, 256, 100_000, dtype=np.uint8)))
    env = {"LLMLAB_CPUINFO": str(info), "LLMLAB_CPU": ""}
    r = subprocess.run([sys.executable, "-m", "llmlab", "doctor", "--cli", "--json"], capture_output=True, text=True,
                       timeout=120, env={**os.environ, **env})
    assert r.returncode in (0, 1), r.stderr
    cpu = json.loads(r.stdout)["checks"]["cpu"]["data"]
    assert cpu["features_source"] in ("cpuid", "none")
    if profiles.machine() == "x86_64" and "avx2" in profiles.llvm_flags():
        assert "avx2" in cpu["features"] and cpu["profile"] in ("avx2", "avx512")
    r = _run("from llmlab import nb; nb.setup(models=())", **env)
    assert r.returncode == 0 and "CPU profile:" in r.stdout, r.stderr


def test_cpu_features_say_where_they_came_from():
    found = profiles.cpu_features()
    assert found.source in ("/proc/cpuinfo", "sysctl", "cpuid", "cpuid+IsProcessorFeaturePresent", "none")
    assert profiles.cpu_flags() == set(found.flags)
    if sys.platform.startswith("linux") and os.path.exists("/proc/cpuinfo"):
        assert found.source == "/proc/cpuinfo" and found.model


def test_llvm_host_features_agree_with_cpuinfo_on_the_profile():
    """CPUID through LLVM (Windows' reader, and Linux's fallback) picks the profile /proc/cpuinfo picks."""
    llvm = profiles.llvm_flags()
    if not llvm:
        pytest.skip("llvmlite gives no host features here")
    assert profiles._from_flags(llvm) is profiles._from_flags(profiles.cpu_flags())


def test_windows_drops_what_the_os_does_not_enable():
    import unittest.mock as mock
    x86 = {"avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_vnni", "amx_int8"}
    with mock.patch.object(profiles, "llvm_flags", lambda: set(x86)):
        everything, _ = profiles.windows_flags(present=lambda pf: True)
        assert everything == x86 and profiles._from_flags(everything, "x86_64").name == "avx512"
        no512, _ = profiles.windows_flags(present=lambda pf: pf in (39, 40))         # AVX-512 state not enabled
        assert no512 == {"avx", "avx2", "fma", "f16c"} and profiles._from_flags(no512, "x86_64").name == "avx2"
        unknown, _ = profiles.windows_flags(present=lambda pf: False)               # an OS that knows no PF_AVX*
        assert unknown == x86


def test_intel_mac_sysctls_map_to_linux_names():
    ctl = {"machdep.cpu.features": "FPU SSE3 AVX1.0 F16C", "machdep.cpu.leaf7_features": "AVX2 FMA AVX512F AVX512BW "
           "AVX512DQ AVX512VL AVX512VNNI", "hw.optional.arm.FEAT_DotProd": "0"}
    flags = profiles.darwin_flags(ctl)
    assert {"avx", "pni", "f16c", "avx2", "fma", "avx512_vnni"} <= flags and "asimddp" not in flags
    assert profiles._from_flags(flags, "x86_64").name == "avx512"


# ---- Intel AMX: a llama.cpp that uses it is no profile's arithmetic; the oracle is built without it

SPR = ("AVX = 1 | AVX_VNNI = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | AVX512 = 1 | AVX512_VBMI = 1 | "
       "AVX512_VNNI = 1 | AVX512_BF16 = 1 | AMX_INT8 = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 |")


def test_a_llama_cpp_with_amx_is_not_reproduced_and_doctor_says_so():
    assert profiles.uses_amx(SPR) and not profiles.uses_amx(SPR.replace("AMX_INT8 = 1", ""))
    assert profiles._from_system_info(SPR) is None
    assert profiles._from_system_info(SPR.replace("AMX_INT8 = 1 | ", "")).name == "avx512"
    code = ("import json, llmlab.ggml.cpu.profiles as p\n"
            f"p.llama_cpp_system_info = lambda: {SPR!r}\n"
            "p.cpu_flags = lambda: {'avx2', 'fma', 'f16c', 'avx512f', 'avx512bw', 'avx512dq', 'avx512vl', 'amx_int8'}\n"
            "import platform; platform.machine = lambda: 'x86_64'\n"
            "from llmlab import doctor\n"
            "checks = {c.name: c for c in doctor.check_cpu()}\n"
            "print(json.dumps([checks['cpu'].data['reproduced'], checks['llama_cpp'].data['amx'], "
            "checks['llama_cpp'].summary, checks['llama_cpp'].hint, p.detect().profile.name]))\n")
    out = _run(code)
    reproduced, amx, summary, hint, prof = json.loads(out.stdout)
    assert (reproduced, amx, prof) == (False, True, "avx512"), out.stderr
    assert "AMX_INT8 = 1" in summary and "does not reproduce" in summary and "oracle_build.py" in hint


def test_the_oracle_build_turns_amx_off_only_where_the_cpu_has_it():
    tool = [sys.executable, str(ROOT / "tools" / "oracle_build.py"), "--dry-run", "--flags"]
    r = subprocess.run([*tool, "avx2 fma f16c"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "oracle: native (no AMX on this CPU)"
    spr = "avx2 fma f16c avx512f avx512bw avx512dq avx512vl avx512_vnni avx512_bf16 amx_tile amx_int8"
    r = subprocess.run([*tool, spr], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    for flag in ("-DGGML_NATIVE=OFF", "-DGGML_AVX512=ON", "-DGGML_AVX512_VNNI=ON", "-DGGML_AVX512_VBMI=OFF",
                 "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_TILE=OFF"):
        assert flag in r.stdout
    other = subprocess.run([*tool, spr.replace("avx512_bf16", "")], capture_output=True, text=True, timeout=60)
    assert other.stdout.split("kept in ")[1] != r.stdout.split("kept in ")[1]      # a wheel folder per set of flags


def test_system_info_is_read_from_the_library_without_importing_llama_cpp(tmp_path):
    """The build's flags come from its library through ctypes (the package's import pulls in jinja2,
    diskcache, sqlite3: megabytes of a process that only wants the flags), the same string the package
    gives; a package folder without a loadable library gives None there, and the package is asked."""
    pytest.importorskip("llama_cpp")      # found only, not imported here
    code = ("import sys; from llmlab.ggml.cpu import profiles as p; a = p.llama_cpp_system_info()\n"
            "print('llama_cpp' in sys.modules)\n"
            "import llama_cpp; print(a == llama_cpp.llama_print_system_info().decode('utf-8', 'replace'))\n")
    out = _run(code)
    assert out.returncode == 0 and out.stdout.split() == ["False", "True"], out.stderr[-500:]
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libllama.so").write_bytes(b"not a library")
    assert profiles._library_system_info((str(tmp_path),)) is None
    assert profiles._library_system_info((str(tmp_path / "absent"),)) is None
