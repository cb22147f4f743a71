"""No import cycle among llmlab's modules, counting the imports inside functions.

A function-local import hides a cycle from Python but not from a reader: each module should
depend only on the layers below it (ggml below llama, a backend's kernels below the backend).
Every ``import``/``from ... import`` of an llmlab module is an edge, at module level or inside
a function; only ``if TYPE_CHECKING:`` blocks are left out. ``from pkg import name`` is an edge
to ``pkg.name`` when that is a module, else to the package (its ``__init__``); importing ``a.b.c``
is also an edge to the packages ``a`` and ``a.b`` that Python runs first, unless they enclose the
importer (already running).
"""
from __future__ import annotations

import ast
from pathlib import Path

import llmlab

ROOT = Path(llmlab.__file__).resolve().parent


def _modules() -> dict[str, Path]:
    mods = {}
    for p in sorted(ROOT.rglob("*.py")):
        parts = ("llmlab",) + p.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = p
    return mods


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _walk(node: ast.AST):
    """Every node under ``node`` except the bodies of ``if TYPE_CHECKING:`` (their ``else`` counts)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for sub in child.orelse:
                yield sub
                yield from _walk(sub)
            continue
        yield child
        yield from _walk(child)


def _edges(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in _walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in mods)
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
                out.add(sub if sub in mods else target)
    for target in list(out):                     # importing a.b.c runs a and a.b first (not the importer's own)
        parts = target.split(".")
        for k in range(1, len(parts)):
            pkg = ".".join(parts[:k])
            if pkg in mods and not (name == pkg or name.startswith(pkg + ".")):
                out.add(pkg)
    out.discard(name)
    return out


def import_graph() -> dict[str, set[str]]:
    mods = _modules()
    return {name: _edges(name, path, mods) for name, path in mods.items()}


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
    got = _edges("llmlab.ggml.cpu.fake", src, _modules())
    assert got == {"llmlab.ggml.cpu.ops", "llmlab.ggml.tensor", "llmlab.ggml.quant.core", "llmlab.ggml.quant",
                   "llmlab.llama.model", "llmlab.llama.kv_cache", "llmlab.llama"}
    assert "llmlab.ggml.cgraph" in import_graph()["llmlab.ggml"]    # a package's own submodules


def test_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


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
