"""The kernels' environment switches (``lstmablate/cells/kernels/switches.py``): the one module
of the kernels that reads the environment, every variable declared with its meaning, the
list in docs/performance.md the same as the module's, and each switch read as it always was."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from lstmablate.cells.kernels import switches

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ROOT / "lstmablate" / "cells" / "kernels"
DOC = ROOT / "docs" / "performance.md"
BEGIN = "<!-- switches: written by lstmablate.cells.kernels.switches.markdown() -->"
END = "<!-- end of switches -->"


def _environment_reads(path: Path) -> list[str]:
    """Where a module touches the environment itself: ``os.environ``, ``os.getenv``,
    ``os.putenv`` or a name imported from ``os`` for it."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "putenv"):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
        if isinstance(node, ast.ImportFrom) and node.module == "os" and any(
                a.name in ("environ", "getenv", "putenv") for a in node.names):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_only_the_switches_module_reads_the_environment():
    reads = [r for path in sorted(KERNELS.rglob("*.py")) if path.name != "switches.py"
             for r in _environment_reads(path)]
    assert not reads, f"read the environment through switches.read(): {reads}"
    assert _environment_reads(KERNELS / "switches.py")  # (the check sees a read where one is)


def test_an_undeclared_variable_is_not_read():
    with pytest.raises(KeyError, match="HOME is not declared"):
        switches.read("HOME")


def test_the_docs_list_every_switch_as_the_module_declares_it():
    text = DOC.read_text(encoding="utf-8")
    assert BEGIN in text and END in text, f"{DOC.name} has no switches table between {BEGIN}"
    shown = text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n") + "\n"
    assert shown == switches.markdown(), (
        "docs/performance.md's switches table differs from the module's: paste "
        "lstmablate.cells.kernels.switches.markdown() between its markers")
    assert len({s.name for s in switches.SWITCHES}) == len(switches.SWITCHES)


@pytest.mark.parametrize("env, read, expected", [
    ({}, switches.reference_forced, False),
    ({"LSTMABLATE_REFERENCE": "1"}, switches.reference_forced, True),
    ({"LSTMABLATE_REFERENCE": "Off"}, switches.reference_forced, False),
    ({"LSTMABLATE_NATIVE": ""}, switches.native_enabled, True),
    ({"LSTMABLATE_NATIVE": "no"}, switches.native_enabled, False),
    ({"LSTMABLATE_PACKED_GEMM": "0", "LSTMABLATE_STEP_GEMM": "own-packed"},
     switches.step_gemm_setting, "blas"),
    ({"LSTMABLATE_STEP_GEMM": " OWN-packed "}, switches.step_gemm_setting, "own-packed"),
    ({"LSTMABLATE_STEP_GEMM": "fastest"}, switches.step_gemm_setting, "auto"),
    ({"LSTMABLATE_TORCH_ON_CPU": "native"}, switches.torch_on_cpu, "0"),
    ({"LSTMABLATE_TORCH_ON_CPU": "torch"}, switches.torch_on_cpu, "1"),
    ({"LSTMABLATE_TORCH_ON_CPU": "maybe"}, switches.torch_on_cpu, "auto"),
    ({"LSTMABLATE_TRITON": "yes"}, switches.triton_setting, "1"),
    ({"LSTMABLATE_TRITON": ""}, switches.triton_setting, "auto"),
    ({"LSTMABLATE_CUDA_GRAPHS": "1"}, switches.graphs_setting, "auto"),
    ({"LSTMABLATE_CUDA_GRAPHS": "false"}, switches.graphs_setting, "0"),
    ({"LSTMABLATE_NATIVE_RETRY": "1"}, switches.native_retry, True),
    ({"LSTMABLATE_NATIVE_RETRY": "off"}, switches.native_retry, False),
])
def test_each_switch_reads_as_documented(monkeypatch, env, read, expected):
    for s in switches.SWITCHES:
        if s.name.startswith("LSTMABLATE_"):
            monkeypatch.delenv(s.name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert read() == expected
