"""LLVM libraries compiled outside numba's kernel cache (numba's runtime, the threadpool's region entry) are
kept under LLMLAB_HOME/numba/libraries: a later process loads their machine code instead of running LLVM's
optimizer and code generator, keyed by the IR and by numba's and llvmlite's versions and the target; a
damaged entry is compiled again and replaced."""
from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _module(k: int):
    from llvmlite import ir
    i64 = ir.IntType(64)
    mod = ir.Module(f"llmlab_test_{k}")
    f = ir.Function(mod, ir.FunctionType(i64, [i64]), "llmlab_test_add")
    b = ir.IRBuilder(f.append_basic_block())
    b.ret(b.add(f.args[0], i64(k)))
    return mod


def _call(lib, x: int) -> int:
    return ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)(lib.get_pointer_to_function("llmlab_test_add"))(x)


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("LLMLAB_HOME", str(tmp_path))
    return tmp_path


def _codegen():
    from numba.core.registry import cpu_target
    return cpu_target.target_context.codegen()


def test_a_library_is_compiled_once_then_loaded(home):
    from llmlab.ggml.cpu.numba_cache import cached_library
    first = cached_library(_codegen(), "llmlab_test", _module(5))
    assert _call(first, 37) == 42 and not first._disable_inspection          # compiled
    entries = list((home / "numba" / "libraries").glob("llmlab_test-*.nbl"))
    assert len(entries) == 1
    again = cached_library(_codegen(), "llmlab_test", _module(5))
    assert _call(again, 1) == 6 and again._disable_inspection                # loaded: numba's mark of cached code
    other = cached_library(_codegen(), "llmlab_test", _module(7))             # other IR: another entry
    assert _call(other, 1) == 8 and len(list(entries[0].parent.glob("llmlab_test-*.nbl"))) == 2


def test_the_key_follows_the_versions_and_the_ir(monkeypatch):
    import llvmlite
    import numba
    from llmlab.ggml.cpu.numba_cache import library_key
    cg = _codegen()
    key = library_key(cg, str(_module(5)))
    assert key == library_key(cg, str(_module(5)))
    assert key != library_key(cg, str(_module(6)))
    monkeypatch.setattr(numba, "__version__", numba.__version__ + ".x")
    assert key != library_key(cg, str(_module(5)))
    monkeypatch.undo()
    monkeypatch.setattr(llvmlite, "__version__", llvmlite.__version__ + ".x")
    assert key != library_key(cg, str(_module(5)))


@pytest.mark.parametrize("damage", [b"", b"\x80\x04garbage", None])
def test_a_damaged_entry_is_compiled_again(home, damage):
    from llmlab.ggml.cpu.numba_cache import cached_library
    cached_library(_codegen(), "llmlab_test", _module(9))
    entry, = (home / "numba" / "libraries").glob("llmlab_test-*.nbl")
    raw = entry.read_bytes()
    entry.write_bytes(raw[:len(raw) // 2] if damage is None else damage)
    lib = cached_library(_codegen(), "llmlab_test", _module(9))
    assert _call(lib, 1) == 10 and not lib._disable_inspection               # compiled again ...
    assert entry.read_bytes() == raw                                          # ... and the entry rewritten
    assert _call(cached_library(_codegen(), "llmlab_test", _module(9)), 2) == 11


def test_an_unwritable_home_compiles(home):
    from llmlab.ggml.cpu.numba_cache import cached_library
    (home / "numba").write_text("a file where the folder would be")
    assert _call(cached_library(_codegen(), "llmlab_test", _module(3)), 1) == 4


def test_a_process_loading_cached_kernels_compiles_nothing(tmp_path):
    """numba's runtime is loaded, not compiled, once its entry is there; the kernels' cache is loaded without
    numba's registry refresh. (The threadpool's region entry is compiled once per process too, but only
    when a parallel kernel launches numba's threads.)"""
    (tmp_path / "kernel_mod.py").write_text(textwrap.dedent("""
        import llmlab.ggml.cpu.fast
        import numpy as np
        from numba import njit
        from numba.core import codegen
        compiled = []
        finalize = codegen.CPUCodeLibrary.finalize
        codegen.CPUCodeLibrary.finalize = lambda self: (compiled.append(self.name), finalize(self))[1]

        @njit(cache=True)
        def total(n):
            return np.arange(n).sum()          # an array: the kernel needs numba's runtime

        print(total(10), compiled)
    """))
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}", "NUMBA_CACHE_DIR": str(tmp_path / "cache"),
           "LLMLAB_HOME": str(tmp_path / "home")}

    def run():
        return subprocess.run([sys.executable, "-c", "import kernel_mod"], capture_output=True, text=True, env=env,
                              cwd=tmp_path, timeout=120)
    first = run()
    assert first.returncode == 0 and first.stdout.startswith("45 ") and "'nrt'" in first.stdout, first.stderr
    second = run()
    assert second.returncode == 0 and second.stdout.strip() == "45 []", (second.stdout, second.stderr)


def test_a_loaded_kernel_keeps_bitcode_and_links_into_a_later_compile(tmp_path):
    """A kernel loaded from the cache holds its bitcode's bytes, not a parsed module; a kernel compiled later
    that calls it parses them, links it and gets the same answer."""
    (tmp_path / "kernel_mod.py").write_text(textwrap.dedent("""
        import sys
        import llmlab.ggml.cpu.fast
        from numba import njit

        @njit(cache=True)
        def inner(x):
            return 3 * x + 1

        print(inner(4))
        lib = inner.overloads[inner.signatures[0]].library
        print(lib._shared_module is None, lib._disable_inspection)
        if len(sys.argv) > 1:
            @njit
            def outer(x):
                return inner(x) + inner(x + 1)
            print(outer(4), lib._shared_module is not None)
    """))
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}", "NUMBA_CACHE_DIR": str(tmp_path / "cache"),
           "LLMLAB_HOME": str(tmp_path / "home")}

    def run(*args):
        r = subprocess.run([sys.executable, "-c", "import kernel_mod", *args],
                           capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
        assert r.returncode == 0, r.stderr
        return r.stdout.split()
    assert run() == ["13", "False", "False"]                   # compiled: numba keeps its module
    assert run() == ["13", "True", "True"]                     # loaded: bytes only
    assert run("link") == ["13", "True", "True", "29", "True"]  # parsed again to link into outer


@pytest.mark.parametrize("layer", ["workqueue", "omp"])
def test_the_region_entry_is_compiled_once_and_its_loaded_copy_serves_regions(tmp_path, layer):
    """The threadpool's region entry names this process's addresses by symbols, so its IR (and cache key) is
    the same in every process: a second process loads it, and its regions (the pool's, under workqueue) give
    the same sums as one thread."""
    if layer == "omp":
        pytest.importorskip("numba.np.ufunc.omppool")
    (tmp_path / "kernel_mod.py").write_text(textwrap.dedent("""
        import llmlab.ggml.cpu.fast
        import numpy as np
        from numba import njit, prange
        from numba.core import codegen
        from llmlab.ggml.cpu import threadpool
        from llmlab.ggml.cpu.fast import set_threads
        compiled = []
        finalize = codegen.CPUCodeLibrary.finalize
        codegen.CPUCodeLibrary.finalize = lambda self: (compiled.append(self.name), finalize(self))[1]

        @njit(parallel=True, cache=True)
        def rows(a):
            out = np.empty(a.shape[0])
            for i in prange(a.shape[0]):
                out[i] = a[i].sum()
            return out

        a = np.arange(64 * 33, dtype=np.float64).reshape(64, 33)
        set_threads(1)
        one = rows(a)
        set_threads(2)
        two = [rows(a) for _ in range(20)]
        inline, threaded = threadpool.region_counts()
        print(all((t == one).all() for t in two), (one == a.sum(axis=1)).all(), inline > 0, threaded >= 20,
              threadpool.pooled_regions() >= 20, sorted(set(compiled)))
    """))
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}", "NUMBA_CACHE_DIR": str(tmp_path / "cache"),
           "LLMLAB_HOME": str(tmp_path / "home"), "NUMBA_THREADING_LAYER": layer, "NUMBA_NUM_THREADS": "2"}

    def run():
        r = subprocess.run([sys.executable, "-c", "import kernel_mod"], capture_output=True, text=True, env=env,
                           cwd=tmp_path, timeout=300)
        assert r.returncode == 0, r.stderr
        return r.stdout.strip()
    pooled = "True" if layer == "workqueue" else "False"
    first = run()
    assert first.startswith(f"True True True True {pooled} ") and "'llmlab_regions'" in first, first
    assert run() == f"True True True True {pooled} []"
    assert len(list((tmp_path / "home" / "numba" / "libraries").glob("llmlab_regions-*.nbl"))) == 1


def test_a_load_that_fails_without_the_refresh_is_tried_as_numba_loads(tmp_path):
    """Should loading without numba's registry refresh fail for a cached entry, numba's own load (refresh
    first) is tried before the entry is called damaged: it loads, nothing is compiled or removed."""
    (tmp_path / "kernel_mod.py").write_text(textwrap.dedent("""
        import sys
        import llmlab.ggml.cpu.fast
        from llmlab.ggml.cpu import numba_cache
        from numba import njit
        from numba.core import codegen
        compiled = []
        finalize = codegen.CPUCodeLibrary.finalize
        codegen.CPUCodeLibrary.finalize = lambda self: (compiled.append(self.name), finalize(self))[1]
        if len(sys.argv) > 1:
            def fail(*a):
                raise RuntimeError("not without the registries")
            numba_cache._load_without_refresh = fail

        @njit(cache=True)
        def twice(x):
            return 2 * x

        print(twice(21), [c for c in compiled if c != "nrt"])
    """))
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}", "NUMBA_CACHE_DIR": str(tmp_path / "cache"),
           "LLMLAB_HOME": str(tmp_path / "home")}

    def run(*args):
        r = subprocess.run([sys.executable, "-c", "import kernel_mod", *args], capture_output=True, text=True,
                           env=env, cwd=tmp_path, timeout=120)
        assert r.returncode == 0 and r.stderr == "", r.stderr
        return r.stdout.strip()
    assert run().startswith("42 ['")                   # compiled (and cached)
    assert run("fail") == "42 []"                      # loaded by numba's own path
    assert run() == "42 []"                            # the entry is still there


SMAPS = """\
7f0000000000-7f0000100000 r--p 00000000 08:01 11 /venv/llvmlite/binding/libllvmlite.so
Rss:                 512 kB
Private_Dirty:         0 kB
Shared_Dirty:          0 kB
Anonymous:             0 kB
7f0000100000-7f0000900000 r-xp 00100000 08:01 11 /venv/llvmlite/binding/libllvmlite.so
Rss:                4096 kB
Private_Dirty:         0 kB
Shared_Dirty:          0 kB
Anonymous:             0 kB
7f0000900000-7f0000a00000 r--p 00900000 08:01 11 /venv/llvmlite/binding/libllvmlite.so
Rss:                1024 kB
Private_Dirty:      1024 kB
Shared_Dirty:          0 kB
Anonymous:          1024 kB
7f0000a00000-7f0000a10000 rw-p 00a00000 08:01 11 /venv/llvmlite/binding/libllvmlite.so
Rss:                  64 kB
Private_Dirty:         0 kB
Shared_Dirty:          0 kB
Anonymous:             0 kB
7f0000b00000-7f0000c00000 r-xs 00000000 08:01 11 /venv/llvmlite/binding/libllvmlite.so
Rss:                  64 kB
Private_Dirty:         0 kB
Shared_Dirty:          0 kB
Anonymous:             0 kB
7f0000c00000-7f0000d00000 r-xp 00000000 08:01 12 /usr/lib/libc.so.6
Rss:                 128 kB
Private_Dirty:         0 kB
Shared_Dirty:          0 kB
Anonymous:             0 kB
7f0000d00000-7f0000e00000 r-xp 00000000 08:01 11 /venv/llvmlite/binding/libllvmlite.so
Rss:                   0 kB
Private_Dirty:         0 kB
Shared_Dirty:          0 kB
Anonymous:             0 kB
"""


def test_only_clean_private_read_only_pages_of_llvm_are_chosen():
    """A mapping with a written (anonymous or dirty) page, a writable or shared one, another library's, or
    one with nothing resident is never dropped."""
    from llmlab.ggml.cpu.numba_cache import clean_file_ranges
    assert clean_file_ranges(SMAPS, "llvmlite") == [(0x7f0000000000, 0x7f0000100000),
                                                    (0x7f0000100000, 0x7f0000900000)]
    assert clean_file_ranges("", "llvmlite") == []


def _llvm_rss_kib() -> int:
    rss, on = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            p = line.split()
            if not p[0].endswith(":") and "-" in p[0]:
                on = len(p) > 5 and "llvmlite" in p[5]
            elif on and p[0] == "Rss:":
                rss += int(p[1])
    return rss


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps (elsewhere a no-op)")
def test_llvm_pages_dropped_fault_back_and_it_still_compiles_and_loads(home):
    from numba import njit

    import llmlab.ggml.cpu.fast  # noqa: F401 (installs the guard, which counts what LLVM loads and compiles)

    from llmlab.ggml.cpu.numba_cache import cached_library, drop_llvm_pages
    _call(cached_library(_codegen(), "llmlab_test", _module(2)), 0)
    before = _llvm_rss_kib()
    assert drop_llvm_pages(force=True) > 0
    assert _llvm_rss_kib() < before / 2
    assert drop_llvm_pages() == 0                         # nothing ran LLVM since: not read again
    assert _call(cached_library(_codegen(), "llmlab_test", _module(2)), 40) == 42      # loaded
    assert _call(cached_library(_codegen(), "llmlab_test", _module(11)), 31) == 42     # compiled
    assert njit(lambda x: x * 6)(7) == 42
    assert drop_llvm_pages() > 0                          # LLVM ran: its pages are dropped again
