"""The switches a user has over the fast paths: force the reference loop, turn the native
(C) kernels off, choose PyTorch's own kernels on CPU.

Forcing every cell's plain reference loop (the one the fast paths are tested against):

* ``with lstmablate.cells.reference_mode(): ...`` (a context manager;
  ``reference_mode(False)`` forces the fast paths back on inside it);
* ``set_reference_mode(True)`` (module-wide; ``None`` follows the environment again);
* ``LSTMABLATE_REFERENCE=1`` (read at every call).

Environment variables read at every call (so a test or a user may change them at run time):

* ``LSTMABLATE_NATIVE=0``: never use the native (C) kernels; the PyTorch loops run instead;
* ``LSTMABLATE_PACKED_GEMM=0``: no packed GEMM (the per-step products call sgemm);
* ``LSTMABLATE_STEP_GEMM``: ``blas``, ``mkl-packed`` or ``own-packed`` fixes how the native
  kernels' float32 per-step products run; ``auto`` (default): the fastest here, by a short
  timing (``native.py``);
* ``LSTMABLATE_TORCH_ON_CPU``: on CPU, for the cells PyTorch has a kernel of its own for
  (``lstm``, ``lstm-gates``, ``gru`` with ``reset_after``): ``1`` always PyTorch's
  (oneDNN / ATen), ``0`` always ours, ``auto`` (default) whichever a short timing on first
  use found faster for the call's shape class on this machine (``calibrate.py``);
* ``LSTMABLATE_TRITON``: ``auto`` (default) the Triton kernels on CUDA for the cells
  without a cuDNN kernel; ``1`` the Triton kernels for every call they can run (on CUDA
  the cuDNN cells too; CPU tensors as well when Triton's interpreter is on,
  ``TRITON_INTERPRET=1``: how the test suite checks them); ``0`` never (the PyTorch loops);
* ``LSTMABLATE_CUDA_GRAPHS``: ``auto`` (default) the Triton kernels' time loops are
  captured in CUDA graphs for a call shape seen twice (``graphs.py``); ``0`` never
  (eager launches).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

_reference_forced: bool | None = None  # None: follow LSTMABLATE_REFERENCE


def _env_flag(name: str, default: bool) -> bool:
    value = os.environ.get(name, "").strip().lower()
    if not value:
        return default
    return value not in ("0", "false", "no", "off")


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
    return _env_flag("LSTMABLATE_REFERENCE", False)


def native_enabled() -> bool:
    """Whether the native kernels may be used (``LSTMABLATE_NATIVE=0`` turns them off)."""
    return _env_flag("LSTMABLATE_NATIVE", True)


def packed_gemm_enabled() -> bool:
    """Whether MKL's packed GEMM may be used (``LSTMABLATE_PACKED_GEMM=0`` turns it off)."""
    return _env_flag("LSTMABLATE_PACKED_GEMM", True)


def step_gemm_setting() -> str:
    """``"blas"``, ``"mkl-packed"``, ``"own-packed"`` or ``"auto"`` (from
    ``LSTMABLATE_STEP_GEMM``; ``blas`` with ``LSTMABLATE_PACKED_GEMM=0``)."""
    if not packed_gemm_enabled():
        return "blas"
    value = os.environ.get("LSTMABLATE_STEP_GEMM", "auto").strip().lower()
    return value if value in ("blas", "mkl-packed", "own-packed") else "auto"


def torch_on_cpu() -> str:
    """``"1"`` (PyTorch's own kernels on CPU where a cell has one), ``"0"`` (ours), or
    ``"auto"`` (the calibrated choice); from ``LSTMABLATE_TORCH_ON_CPU``."""
    value = os.environ.get("LSTMABLATE_TORCH_ON_CPU", "auto").strip().lower()
    if value in ("1", "true", "yes", "on", "torch"):
        return "1"
    if value in ("0", "false", "no", "off", "native"):
        return "0"
    return "auto"


def _choice(name: str) -> str:
    value = os.environ.get(name, "auto").strip().lower()
    if value in ("1", "true", "yes", "on"):
        return "1"
    if value in ("0", "false", "no", "off"):
        return "0"
    return "auto"


def triton_setting() -> str:
    """``"1"``, ``"0"`` or ``"auto"``, from ``LSTMABLATE_TRITON`` (see the module doc)."""
    return _choice("LSTMABLATE_TRITON")


def graphs_setting() -> str:
    """``"0"`` or ``"auto"`` (``"1"`` reads as ``"auto"``), from ``LSTMABLATE_CUDA_GRAPHS``."""
    return "0" if _choice("LSTMABLATE_CUDA_GRAPHS") == "0" else "auto"
