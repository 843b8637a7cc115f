"""The switches a user has over the fast paths, and the one place the kernels read the
environment.

Forcing every cell's plain reference loop (the one the fast paths are tested against):

* ``with lstmablate.cells.reference_mode(): ...`` (a context manager;
  ``reference_mode(False)`` forces the fast paths back on inside it);
* ``set_reference_mode(True)`` (module-wide; ``None`` follows the environment again);
* ``LSTMABLATE_REFERENCE=1`` (read at every call).

Every environment variable the kernels read is declared in :data:`SWITCHES` (its values,
default and meaning) and read through :func:`read`, which refuses an undeclared name, so
the table is complete by construction; docs/performance.md ("Switches") shows it as
:func:`markdown` writes it, and ``tests/test_kernels_switches.py`` holds the two together.
Each variable is read at every call, so a test or a user may change it at run time; the
functions below turn the text into the setting (an unknown value reads as the default, as
it always has).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class Switch:
    """One environment variable the kernels read: its name, the values it takes, its
    default (what unset or an unknown value means) and what it does."""

    name: str
    values: str
    default: str
    meaning: str


#: every environment variable the kernels read (docs/performance.md lists them from here)
SWITCHES: tuple[Switch, ...] = (
    Switch("LSTMABLATE_REFERENCE", "`1` / `0`", "`0`",
           "`1`: every cell runs its plain reference loop (as `reference_mode()`)"),
    Switch("LSTMABLATE_NATIVE", "`1` / `0`", "`1`",
           "`0`: never the native (C) kernels; the PyTorch loops run instead"),
    Switch("LSTMABLATE_PACKED_GEMM", "`1` / `0`", "`1`",
           "`0`: no packed GEMM (the per-step products call sgemm; `LSTMABLATE_STEP_GEMM` "
           "reads as `blas`; our packed GEMM is no candidate for a call's large products, "
           "`LSTMABLATE_CPU_GEMM`)"),
    Switch("LSTMABLATE_STEP_GEMM", "`auto`, `blas`, `mkl-packed`, `own-packed`", "`auto`",
           "how the native kernels' float32 per-step products run; `auto`: the fastest here, "
           "by a short timing (`common/native.py`)"),
    Switch("LSTMABLATE_CPU_GEMM", "`auto`, `mkl`, `onednn`, `own`", "`auto`",
           "on CPU, the GEMM of a call's large float32 products (the input products of all "
           "steps, and in the backward the input and weight gradients): `mkl` PyTorch's own "
           "(MKL's sgemm), `onednn` oneDNN's GEMM, `own` our packed GEMM (where a native "
           "kernel runs the call; else PyTorch's own), `auto` whichever a short timing on "
           "first use found fastest for the product's shape class (`common/gemm.py`)"),
    Switch("LSTMABLATE_TORCH_ON_CPU", "`auto`, `1`, `0`", "`auto`",
           "on CPU, for `lstm`, `lstm-gates` and `gru` with `reset_after`: `1` always "
           "PyTorch's kernel (oneDNN / ATen), `0` always ours, `auto` whichever a short timing "
           "on first use found faster for the call's shape class (`common/calibrate.py`)"),
    Switch("LSTMABLATE_TRITON", "`auto`, `1`, `0`", "`auto`",
           "`auto`: the Triton kernels on CUDA for the cells without a cuDNN kernel; `1`: for "
           "every call they can run (on CUDA the cuDNN cells too; CPU tensors as well under "
           "`TRITON_INTERPRET=1`); `0`: never (a Triton kernel that fails to build or launch "
           "falls back by itself, with a warning)"),
    Switch("LSTMABLATE_CUDA_GRAPHS", "`auto`, `0`", "`auto`",
           "`auto`: the Triton kernels' recurrent time loops are captured in CUDA graphs for a "
           "call shape seen three times, within a bound on the slots and their memory "
           "(`common/graphs.py`); `0`: eager launches"),
    Switch("LSTMABLATE_KERNEL_CACHE", "a directory", "`$XDG_CACHE_HOME/lstmablate/kernels`",
           "where the native libraries and the calibrated choices are cached (used only if "
           "private to this user; `common/native_build.py`)"),
    Switch("LSTMABLATE_NATIVE_RETRY", "`1` / `0`", "`0`",
           "`1`: build a native library again although its build failed before"),
    Switch("CC", "a command (shell-split)", "`cc`, `gcc` or `clang` on the `PATH`",
           "the C compiler of the native kernels"),
    Switch("CFLAGS", "flags (shell-split)", "none",
           "added after the native build's own flags (part of the cache key)"),
    Switch("PATH", "directories", "the system's",
           "where the C compiler is looked for (part of the cache key)"),
    Switch("XDG_CACHE_HOME", "a directory", "`~/.cache`",
           "the kernel cache is `lstmablate/kernels` under it"),
    Switch("TRITON_INTERPRET", "`1` / `0`", "`0`",
           "Triton's interpreter: the Triton kernels run on CPU tensors (how the test suite "
           "checks them); read by Triton itself, here only where Triton has no `knobs`"),
)

_DECLARED = {s.name for s in SWITCHES}
_OFF = ("0", "false", "no", "off")
_ON = ("1", "true", "yes", "on")


def read(name: str) -> str:
    """The text of the environment variable ``name`` ("" when unset); ``name`` must be
    declared in :data:`SWITCHES` (a KeyError otherwise: declare it, with its meaning)."""
    if name not in _DECLARED:
        raise KeyError(f"{name} is not declared in lstmablate.cells.kernels.switches.SWITCHES")
    return os.environ.get(name, "")


def _flag(name: str, default: bool) -> bool:
    """A yes/no switch: unset or empty is ``default``; ``0``, ``false``, ``no``, ``off`` are
    no; anything else is yes."""
    value = read(name).strip().lower()
    if not value:
        return default
    return value not in _OFF


def _choice(name: str) -> str:
    """``"1"``, ``"0"`` or ``"auto"`` (unset, or any other value)."""
    value = read(name).strip().lower() or "auto"
    if value in _ON:
        return "1"
    if value in _OFF:
        return "0"
    return "auto"


# ---------------------------------------------------------------------------------
# the reference loop
# ---------------------------------------------------------------------------------

_reference_forced: bool | None = None  # None: follow LSTMABLATE_REFERENCE


def set_reference_mode(enabled: bool | None) -> None:
    """Force the reference loop (True), the fast paths (False), or follow the env var (None)."""
    global _reference_forced
    _reference_forced = enabled


@contextmanager
def reference_mode(enabled: bool = True) -> Iterator[None]:
    """Run every cell's plain reference loop inside the block (``enabled=False``: the fast paths)."""
    global _reference_forced
    old = _reference_forced
    _reference_forced = enabled
    try:
        yield
    finally:
        _reference_forced = old


def reference_forced() -> bool:
    """True if the reference loop is forced (switch, context manager or LSTMABLATE_REFERENCE=1)."""
    if _reference_forced is not None:
        return _reference_forced
    return _flag("LSTMABLATE_REFERENCE", False)


# ---------------------------------------------------------------------------------
# the native kernels
# ---------------------------------------------------------------------------------

def native_enabled() -> bool:
    """Whether the native kernels may be used (``LSTMABLATE_NATIVE=0`` turns them off)."""
    return _flag("LSTMABLATE_NATIVE", True)


def packed_gemm_enabled() -> bool:
    """Whether a packed GEMM (MKL's, or ours for the per-step and a call's large products)
    may be used (``LSTMABLATE_PACKED_GEMM=0`` turns them off)."""
    return _flag("LSTMABLATE_PACKED_GEMM", True)


def step_gemm_setting() -> str:
    """``"blas"``, ``"mkl-packed"``, ``"own-packed"`` or ``"auto"`` (from
    ``LSTMABLATE_STEP_GEMM``; ``blas`` with ``LSTMABLATE_PACKED_GEMM=0``)."""
    if not packed_gemm_enabled():
        return "blas"
    value = read("LSTMABLATE_STEP_GEMM").strip().lower()
    return value if value in ("blas", "mkl-packed", "own-packed") else "auto"


def native_retry() -> bool:
    """Whether a remembered build failure is tried again (``LSTMABLATE_NATIVE_RETRY=1``)."""
    return _flag("LSTMABLATE_NATIVE_RETRY", False)


# ---------------------------------------------------------------------------------
# which kernel a call takes
# ---------------------------------------------------------------------------------

def torch_on_cpu() -> str:
    """``"1"`` (PyTorch's own kernels on CPU where a cell has one), ``"0"`` (ours), or
    ``"auto"`` (the calibrated choice); from ``LSTMABLATE_TORCH_ON_CPU``, which also takes
    ``torch`` and ``native``."""
    value = read("LSTMABLATE_TORCH_ON_CPU").strip().lower()
    if value in (*_ON, "torch"):
        return "1"
    if value in (*_OFF, "native"):
        return "0"
    return "auto"


def cpu_gemm_setting() -> str:
    """``"mkl"``, ``"onednn"``, ``"own"`` or ``"auto"``, from ``LSTMABLATE_CPU_GEMM``."""
    value = read("LSTMABLATE_CPU_GEMM").strip().lower()
    return value if value in ("mkl", "onednn", "own") else "auto"


def triton_setting() -> str:
    """``"1"``, ``"0"`` or ``"auto"``, from ``LSTMABLATE_TRITON`` (see :data:`SWITCHES`)."""
    return _choice("LSTMABLATE_TRITON")


def graphs_setting() -> str:
    """``"0"`` or ``"auto"`` (``"1"`` reads as ``"auto"``), from ``LSTMABLATE_CUDA_GRAPHS``."""
    return "0" if _choice("LSTMABLATE_CUDA_GRAPHS") == "0" else "auto"


# ---------------------------------------------------------------------------------
# the list, for the docs
# ---------------------------------------------------------------------------------

def markdown() -> str:
    """:data:`SWITCHES` as the Markdown table docs/performance.md shows."""
    rows = ["| variable | values | default | what it does |", "|---|---|---|---|"]
    rows += [f"| `{s.name}` | {s.values} | {s.default} | {s.meaning} |" for s in SWITCHES]
    return "\n".join(rows) + "\n"
