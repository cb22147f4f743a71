"""llmlab's import graph: no cycle, and no arrow upward through the layers, counting the imports inside
functions and under ``if TYPE_CHECKING:``.

A function-local import hides a cycle from Python but not from a reader, and a ``TYPE_CHECKING`` import
is a dependency a type checker follows: each module should depend only on the layers below it (ggml
below llama, as in llama.cpp, where ggml never includes a llama header; the model library below what
draws, fetches and runs it). Every ``import``/``from ... import`` of an llmlab module is an edge.
``from pkg import name`` is an edge to ``pkg.name`` when that is a module, else to the package (its
``__init__``); importing ``a.b.c`` is also an edge to the packages ``a`` and ``a.b`` that Python runs
first, unless they enclose the importer (already running).
"""
from __future__ import annotations

import ast
from pathlib import Path

import llmlab

ROOT = Path(llmlab.__file__).resolve().parent


def _modules(root: Path = ROOT) -> dict[str, Path]:
    mods = {}
    for p in sorted(root.rglob("*.py")):
        parts = ("llmlab",) + p.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = p
    return mods


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _walk(node: ast.AST, type_checking: bool = True):
    """Every node under ``node``; without ``type_checking``, not the bodies of ``if TYPE_CHECKING:`` (their
    ``else`` counts): what Python itself runs."""
    for child in ast.iter_child_nodes(node):
        if not type_checking and isinstance(child, ast.If) and _is_type_checking(child.test):
            for sub in child.orelse:
                yield sub
                yield from _walk(sub, type_checking)
            continue
        yield child
        yield from _walk(child, type_checking)


def _imports(name: str, path: Path, mods: dict[str, Path], type_checking: bool = True) -> dict[str, int]:
    """The llmlab modules ``name`` imports -> the line of the first import that reaches each."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: dict[str, int] = {}
    for node in _walk(ast.parse(path.read_text(), str(path)), type_checking):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in mods:
                    out.setdefault(a.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target not in mods:
                continue
            for a in node.names:
                sub = f"{target}.{a.name}"
                out.setdefault(sub if sub in mods else target, node.lineno)
    for target, line in list(out.items()):       # importing a.b.c runs a and a.b first (not the importer's own)
        parts = target.split(".")
        for k in range(1, len(parts)):
            pkg = ".".join(parts[:k])
            if pkg in mods and not (name == pkg or name.startswith(pkg + ".")):
                out.setdefault(pkg, line)
    out.pop(name, None)
    return out


def _edges(name: str, path: Path, mods: dict[str, Path], type_checking: bool = True) -> set[str]:
    return set(_imports(name, path, mods, type_checking))


def import_graph(type_checking: bool = True) -> dict[str, set[str]]:
    """Module -> the llmlab modules it imports; ``type_checking=False``: only what Python runs."""
    mods = _modules()
    return {name: _edges(name, path, mods, type_checking) for name, path in mods.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle (its modules, the first repeated at the end), or None: an iterative depth-first search."""
    state: dict[str, int] = {}           # 1: on the current path, 2: done
    for start in sorted(graph):
        if start in state:
            continue
        path, stack = [start], [iter(sorted(graph[start]))]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph[nxt])))
    return None


def test_the_graph_sees_local_and_relative_imports(tmp_path):
    src = tmp_path / "fake.py"
    src.write_text("""
from typing import TYPE_CHECKING
from . import ops
from .. import tensor
if TYPE_CHECKING:
    from llmlab.llama import context
else:
    from ..quant import core
def f():
    import llmlab.llama.model
    from ...llama.kv_cache import KVCache
""")
    runs = {"llmlab.ggml.cpu.ops", "llmlab.ggml.tensor", "llmlab.ggml.quant.core", "llmlab.ggml.quant",
            "llmlab.llama.model", "llmlab.llama.kv_cache", "llmlab.llama"}
    assert _edges("llmlab.ggml.cpu.fake", src, _modules(), type_checking=False) == runs
    assert _edges("llmlab.ggml.cpu.fake", src, _modules()) == runs | {"llmlab.llama.context"}
    assert "llmlab.ggml.cgraph" in import_graph()["llmlab.ggml"]    # a package's own submodules


def test_no_import_cycle():
    """Not even through a ``TYPE_CHECKING`` import (hparams <-> arch hid one there)."""
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


# ---- the layers ------------------------------------------------------------------------------------------------

# llmlab's layers, bottom up, by the package or module under llmlab/: a module never imports one of a higher
# rank. ggml is the tensor library, llama the model library on it (neither fetches a model nor draws);
# then what runs and teaches with them (generation, the speed bench, the downloader, the teaching views,
# llama.cpp in the loop); viz draws all of those; the notebooks' set-up and the command line come last.
# Modules not named here (config, safeio, hints, doctor, cuda_sim, data, ...) are not ranked.
RANK = {"ggml": 0, "llama": 1,
        "models": 2, "generate": 2, "bench": 2, "warm": 2, "block": 2, "attention": 2, "llamacpp": 2,
        "viz": 3, "nb": 4, "cli": 4}


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def upward_imports(root: Path = ROOT) -> list[str]:
    """``file:line: importer -> imported`` for every import of a module of a higher rank (see ``RANK``),
    function-local and ``TYPE_CHECKING`` imports included."""
    mods = _modules(root)
    found = []
    for name, path in sorted(mods.items()):
        rank = RANK.get(_layer(name))
        if rank is None:
            continue
        for target, line in sorted(_imports(name, path, mods).items()):
            if RANK.get(_layer(target), -1) > rank:
                found.append(f"{path.relative_to(root.parent)}:{line}: {name} -> {target}")
    return found


def test_no_import_runs_up_the_layers():
    """ggml imports nothing of llama, viz, nb, cli or models; llama nothing of viz, nb, cli or the downloader;
    viz nothing of nb."""
    assert upward_imports() == []


def test_upward_imports_are_found(tmp_path):
    """The check itself: an upward import in ggml, one hidden under TYPE_CHECKING in llama and one inside a
    function in viz are each reported, with their line."""
    import shutil
    root = tmp_path / "llmlab"
    shutil.copytree(ROOT, root, ignore=lambda d, names: [n for n in names if not n.endswith(".py")
                                                         and not (Path(d) / n).is_dir() or n == "__pycache__"])
    with open(root / "ggml" / "tensor.py", "a") as f:
        f.write("\nfrom ..llama import batch  # noqa\n")
    with open(root / "llama" / "sampling.py", "a") as f:
        f.write("\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..viz import html\n")
    with open(root / "viz" / "html.py", "a") as f:
        f.write("\ndef _f():\n    from ..nb import exercises\n")
    got = upward_imports(root)
    assert {g.split(": ", 1)[1] for g in got} == {          # each module, and the package Python runs first
        "llmlab.ggml.tensor -> llmlab.llama", "llmlab.ggml.tensor -> llmlab.llama.batch",
        "llmlab.llama.sampling -> llmlab.viz", "llmlab.llama.sampling -> llmlab.viz.html",
        "llmlab.viz.html -> llmlab.nb", "llmlab.viz.html -> llmlab.nb.exercises"}
    for g in got:                                          # at the line of its import
        file, line = g.split(": ", 1)[0].rsplit(":", 1)
        assert " import " in (tmp_path / file).read_text().splitlines()[int(line) - 1]


def test_find_cycle_reports_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def guarded_imports() -> list[str]:
    """``file:line`` of every import of llmlab's own code inside a ``try`` body: such a guard hides a
    broken module behind a fallback. Optional third-party packages are checked with find_spec instead."""
    found = []
    for path in _modules().values():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Try):
                continue
            for sub in (s for st in node.body for s in ast.walk(st)):
                own = (isinstance(sub, ast.ImportFrom) and (sub.level > 0 or (sub.module or "").split(".")[0] == "llmlab")
                       or isinstance(sub, ast.Import) and any(a.name.split(".")[0] == "llmlab" for a in sub.names))
                if own:
                    found.append(f"{path.relative_to(ROOT.parent)}:{sub.lineno}")
    return found


def test_no_import_of_llmlab_is_guarded():
    assert guarded_imports() == []
