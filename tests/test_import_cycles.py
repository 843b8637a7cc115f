"""No import cycle in ``lstmablate/``: the package's modules form a directed acyclic graph.

Every ``import`` statement of every module counts, at module level and inside functions
(a lazy import is still a dependency: two modules that import each other, however late,
are one tangled module); only imports under ``if TYPE_CHECKING:`` are left out (they
never run).  A submodule's implicit import of its parent package is not an edge (every
``a.b`` imports ``a`` first; that is how packages work, not a design choice).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "lstmablate"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST):
    """Every Import / ImportFrom node, except those under ``if TYPE_CHECKING:``."""
    todo = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            todo.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        todo.extend(ast.iter_child_nodes(node))


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The longest prefix of ``name`` that is a module of the package."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def import_graph() -> dict[str, set[str]]:
    """module -> the package's modules it imports."""
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for mod, path in modules.items():
        is_pkg = path.name == "__init__.py"
        package = mod if is_pkg else mod.rpartition(".")[0]
        for node in _imports(ast.parse(path.read_text(), filename=str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                if node.level:
                    base = package.split(".")
                    base = base[:len(base) - (node.level - 1)]
                    prefix = ".".join(base + ([node.module] if node.module else []))
                else:
                    prefix = node.module or ""
                # `from x import y`: the module x.y if there is one, else x itself
                targets = [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in modules else prefix
                           for a in node.names]
            for t in targets:
                dep = _resolve(t, modules)
                if dep is None or dep == mod:
                    continue
                if mod.startswith(dep + ".") and t != dep:
                    continue  # only the implicit import of an enclosing package
                graph[mod].add(dep)  # (`from lstmablate.cells import Cell` in a submodule counts)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _path_in(component: list[str], graph: dict[str, set[str]]) -> list[str]:
    """One closed path through a cycle's modules, for the message."""
    members = set(component)
    start = component[0]
    path, seen = [start], {start}
    while True:
        nxt = sorted(graph[path[-1]] & members)
        back = [n for n in nxt if n == start]
        if back and len(path) > 1:
            return path + [start]
        fresh = [n for n in nxt if n not in seen]
        if not fresh:
            return path + [nxt[0]] if nxt else path
        path.append(fresh[0])
        seen.add(fresh[0])


def test_the_walker_sees_lazy_imports_and_skips_type_checking(tmp_path, monkeypatch):
    """The graph builder itself: a lazy import is an edge, a TYPE_CHECKING one is not,
    and a two-module cycle is found."""
    pkg = tmp_path / "lstmablate"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                      "    from . import c\ndef f():\n    from .b import g\n")
    (pkg / "sub" / "b.py").write_text("from lstmablate.sub import a\ndef g(): pass\n")
    (pkg / "sub" / "c.py").write_text("import lstmablate.sub.a\n")
    monkeypatch.setitem(globals(), "ROOT", pkg)
    graph = import_graph()
    assert graph["lstmablate.sub.a"] == {"lstmablate.sub.b"}
    assert graph["lstmablate.sub.b"] == {"lstmablate.sub.a"}
    assert graph["lstmablate.sub.c"] == {"lstmablate.sub.a"}
    assert cycles(graph) == [["lstmablate.sub.a", "lstmablate.sub.b"]]


def test_no_import_cycle_in_the_package():
    graph = import_graph()
    assert len(graph) > 20  # the walker found the package
    found = cycles(graph)
    msg = "\n".join(" -> ".join(_path_in(c, graph)) + f"   (modules: {', '.join(c)})"
                    for c in found)
    assert not found, f"import cycles in lstmablate/:\n{msg}"


@pytest.mark.parametrize("module", ["lstmablate.cells.registry", "lstmablate.cells.base"])
def test_leaf_modules_import_no_cell(module):
    """The registry and the cell contract are leaves of the cell package: they import no
    cell family, no encoder and no kernel."""
    deps = import_graph()[module]
    assert not {d for d in deps if d.startswith("lstmablate.cells.")
                and d not in ("lstmablate.cells.base",)}, deps
