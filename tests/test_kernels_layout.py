"""The kernels' folders (``lstmablate/cells/kernels/``, mapped in its ``__init__.py``): one
folder per family, ``common/`` for what several share; a family's folder imports no other
family's (except the LSTM cell's arithmetic that the second-order cells share, and the
LSTM kernels that ``ran`` and ``knn-rnn`` run as the lstm-srnn-out they are), ``common/``
imports no family, the contract (``interface.py``, and ``call.py``, what it knows of a call)
and the environment (``switches.py``) import neither, and every C source of every folder is package data."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

from lstmablate.cells.kernels import interface

from test_import_structure import import_graph

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ROOT / "lstmablate" / "cells" / "kernels"
PACKAGE = "lstmablate.cells.kernels"
#: a family folder's allowed imports of another family's folder (who -> whom)
SHARED_ARITHMETIC = {("second_order", "lstm"), ("additive", "lstm")}


def _folder(module: str) -> str | None:
    """The kernels' sub-folder a module (or the folder's package itself) lies in; None for
    the package's top-level modules and for modules outside it."""
    if not module.startswith(PACKAGE + "."):
        return None
    name = module[len(PACKAGE) + 1:].split(".")[0]
    return name if (KERNELS / name).is_dir() else None


def test_families_import_common_not_each_other():
    folders = {p.name for p in KERNELS.iterdir() if (p / "__init__.py").is_file()}
    assert {"common", "lstm", "gru", "second_order"} <= folders
    bad = []
    for mod, deps in import_graph().items():
        own = _folder(mod)
        if own is None:
            continue
        for dep in deps:
            other = _folder(dep)
            if other is None or other == own or other == "common":
                continue
            if own == "common" or (own, other) not in SHARED_ARITHMETIC:
                bad.append(f"{mod} -> {dep}")
    assert not bad, "a kernels folder imports another family's:\n" + "\n".join(sorted(bad))


def test_the_contract_and_the_switches_sit_below_every_folder():
    graph = import_graph()
    #: each top-level module of the kernels, and the only ones of the kernels it may import
    below = {"switches": set(), "call": {"switches"}, "interface": {"call", "switches"}}
    for top, allowed in below.items():
        inside = {d for d in graph[f"{PACKAGE}.{top}"] if d.startswith(PACKAGE + ".")}
        assert inside <= {f"{PACKAGE}.{a}" for a in allowed}, (top, inside)


def test_every_family_keeps_its_c_source_in_its_folder():
    for fam in interface.families().values():
        module_dir = Path(__import__(type(fam).__module__, fromlist=["_"]).__file__).parent
        if fam.native is not None:
            assert interface.source_path(fam).parent == module_dir, fam.name


def test_every_c_source_is_package_data():
    """pyproject.toml's package data names every .c and .h under the kernels (a new family's
    folder included), so a non-editable install can build them."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    line = next(ln for ln in text.splitlines() if ln.startswith("lstmablate = ["))
    globs = re.findall(r'"([^"]+)"', line)
    sources = [p.relative_to(ROOT / "lstmablate").as_posix()
               for p in KERNELS.rglob("*") if p.suffix in (".c", ".h")]
    assert len(sources) >= 7
    missing = [s for s in sources if not any(fnmatch.fnmatch(s, g) for g in globs)]
    assert not missing, f"not package data (pyproject.toml): {missing}"
