"""The house's structure, from its imports: ``lstmablate/`` and the built-in task plugins
(``tasks/``, installed as ``lstmablate_tasks``) form a directed acyclic graph, and no module
imports from a layer above its own.

Every ``import`` statement of every module counts, at module level, inside functions and
under ``if TYPE_CHECKING:``: a lazy import is still a dependency, and so is one for type
annotations only (it never runs, but the module still reads the other's names: two modules
that import each other, however late and for whatever reason, are one tangled module —
``train/progress.py`` once imported ``Trainer`` for its annotations while the trainer
imported the progress line, and a walker that skipped type-only imports missed it).
Importing ``a.b.c`` runs the ``__init__`` of ``a`` and of ``a.b`` first, so it
is also an edge to those packages (a lazy ``from .train.distributed import x`` in a module
the trainer imports is a cycle through ``train/__init__``); only a module's own enclosing
packages are left out (every ``a.b`` imports ``a`` first; that is how packages work).

The layers, bottom to top (docs/architecture.md draws them):
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "lstmablate"
#: other top-level folders that are packages of the house, and the name they install as
PLUGINS = {"tasks": "lstmablate_tasks"}

#: bottom to top; a module's layer is that of the longest prefix listed
LAYERS: list[tuple[str, ...]] = [
    ("lstmablate", "lstmablate.errors", "lstmablate.limits", "lstmablate.io", "lstmablate.console",
     "lstmablate.batching"),
    ("lstmablate.data", "lstmablate.cells"),
    ("lstmablate.config", "lstmablate.recipes", "lstmablate.task"),
    ("lstmablate.train",),
    ("lstmablate_tasks",),
    ("lstmablate.run", "lstmablate.results", "lstmablate.bench"),
    ("lstmablate.cli", "lstmablate.__main__"),
]


def layer_of(module: str) -> int:
    best, level = "", None
    for i, names in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and len(name) > len(best):
                best, level = name, i
    assert level is not None, f"{module} is in no layer: add it to LAYERS"
    return level


def _module_name(path: Path) -> str:
    root = ROOT if path.is_relative_to(ROOT) else next(
        ROOT.parent / folder for folder in PLUGINS if path.is_relative_to(ROOT.parent / folder))
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    parts[0] = PLUGINS.get(parts[0], parts[0])
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    paths = sorted(ROOT.rglob("*.py"))
    for folder in PLUGINS:
        if (ROOT.parent / folder).is_dir():
            paths += sorted((ROOT.parent / folder).rglob("*.py"))
    return {_module_name(p): p for p in paths}


def _imports(tree: ast.AST):
    """Every Import / ImportFrom node of the module, wherever it stands."""
    return (node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom)))


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
                # the module and every package above it that is not one of mod's own
                parts = dep.split(".")
                for k in range(1, len(parts) + 1):
                    d = ".".join(parts[:k])
                    if d not in modules or d == mod:
                        continue
                    if mod.startswith(d + ".") and d != dep:
                        continue  # the implicit import of an enclosing package
                    if mod.startswith(d + ".") and t != dep:
                        continue
                    graph[mod].add(d)  # (`from lstmablate.cells import Cell` in a submodule counts)
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


def test_the_walker_sees_lazy_and_type_checking_imports(tmp_path, monkeypatch):
    """The graph builder itself: a lazy import is an edge, so is a TYPE_CHECKING one, and a
    cycle is found whether its imports run at import time, late, or never (annotations)."""
    pkg = tmp_path / "lstmablate"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                      "    from . import c\ndef f():\n    from .b import g\n")
    (pkg / "sub" / "b.py").write_text("from lstmablate.sub import a\ndef g(): pass\n")
    (pkg / "sub" / "c.py").write_text("import lstmablate.sub.a\n")
    (pkg / "top.py").write_text("def f():\n    from .sub.c import x\n")
    monkeypatch.setitem(globals(), "ROOT", pkg)
    monkeypatch.setitem(globals(), "PLUGINS", {})
    graph = import_graph()
    assert graph["lstmablate.sub.a"] == {"lstmablate.sub.b", "lstmablate.sub.c"}
    assert graph["lstmablate.sub.b"] == {"lstmablate.sub.a"}
    assert graph["lstmablate.sub.c"] == {"lstmablate.sub.a"}
    # importing a submodule from outside its package runs the package's __init__ too
    assert graph["lstmablate.top"] == {"lstmablate.sub", "lstmablate.sub.c"}
    # a -> c exists for annotations only, and still closes a cycle with c -> a
    assert cycles(graph) == [["lstmablate.sub.a", "lstmablate.sub.b", "lstmablate.sub.c"]]


def test_no_import_cycle_in_the_package():
    graph = import_graph()
    assert len(graph) > 20 and any(m.startswith("lstmablate_tasks.") for m in graph)
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


def test_no_module_imports_from_a_layer_above_its_own():
    """cli -> run / results / bench -> tasks -> train -> config, task -> cells, data -> io,
    errors: every arrow points down or sideways."""
    graph = import_graph()
    up = sorted(f"{m} ({layer_of(m)}) -> {d} ({layer_of(d)})"
                for m, deps in graph.items() for d in deps if layer_of(d) > layer_of(m))
    assert not up, "imports that run up the layers:\n" + "\n".join(up)


def test_the_core_names_no_task():
    """Nothing in lstmablate/ imports a task plugin: tasks come through the registry."""
    graph = import_graph()
    bad = sorted(f"{m} -> {d}" for m, deps in graph.items() if m.startswith("lstmablate")
                 and not m.startswith("lstmablate_tasks")
                 for d in deps if d.startswith("lstmablate_tasks"))
    assert not bad, bad
