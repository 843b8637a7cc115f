"""Which kernel a call takes: the rules every kernel family shares.

A cell declares its kernel module (``Cell.fast_kernels``, ``base.py``); that module's
``plan`` names the path of one call (a pure function of the cell and the call's device,
dtype, mask kind, recurrent dropout, autocast and batch, so the CUDA choice is tested
without a GPU), and its ``forward`` runs it.  What every plan starts with is here:

* :func:`refused`: the reference loop runs when it is forced (``switches``), under
  autocast, for a mask with holes, for non-float dtypes, and on CPU for dtypes other than
  float32 / float64 (what the CPU kernels are written for);
* :func:`prefer_torch_on_cpu`: for the cells PyTorch has a kernel of its own for, whether
  a CPU call takes PyTorch's (``LSTMABLATE_TORCH_ON_CPU``, no native kernel, or the
  calibrated choice of ``calibrate.py``) or ours.  A CPU call with variable lengths keeps
  ours: PyTorch runs it as a packed sequence, whose CPU backward is an ATen loop that
  zero-fills and adds a buffer of all the batch's tokens at every time step (measured on
  BiDAF's whole training step took twice as long; docs/performance.md).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from . import calibrate
from .switches import reference_forced, torch_on_cpu

#: the dtypes the CPU kernels (native and PyTorch loops) are written for
CPU_DTYPES = (torch.float32, torch.float64)


def autocast_on(x: Tensor) -> bool:
    """Is autocast active for x's device (any PyTorch 2.x)?"""
    try:
        return bool(torch.is_autocast_enabled(x.device.type))
    except TypeError:  # PyTorch < 2.4: no device argument
        if x.device.type == "cpu":
            return bool(torch.is_autocast_cpu_enabled())
        return bool(torch.is_autocast_enabled())


def refused(*, device_type: str, dtype: torch.dtype, mask: str, autocast: bool,
            reference: bool | None) -> bool:
    """True when no fast path may run the call (the reference loop runs it)."""
    if reference is None:
        reference = reference_forced()
    if reference or autocast or mask == "other" or not dtype.is_floating_point:
        return True
    return device_type == "cpu" and dtype not in CPU_DTYPES


def prefer_torch_on_cpu(sc: Callable[[], calibrate.ShapeClass] | None, *, native: bool,
                        faster: str | None = None,
                        runners: Callable[[calibrate.ShapeClass], dict] | None = None,
                        mask: str = "none") -> bool:
    """Whether a CPU call that PyTorch's own kernel could run goes to it.

    ``LSTMABLATE_TORCH_ON_CPU=1``, or no native kernel (``native=False``): yes;
    ``LSTMABLATE_TORCH_ON_CPU=0``, or variable lengths (``mask`` "prefix": PyTorch would
    pack the sequence, and its packed CPU backward is far slower than ours): no; otherwise
    ``faster`` ("torch" / "native", given by
    tests to force an outcome) or, when the call's shape class is known (``sc``), the
    calibrated choice (timed with ``runners(shape class)`` on first use); without a shape
    class, our kernel.
    """
    setting = torch_on_cpu()
    if setting == "1" or not native:
        return True
    if setting == "0" or mask != "none":
        return False
    if faster is not None:
        return faster == "torch"
    if sc is None or runners is None:
        return False
    shape = sc()
    return calibrate.choose(shape, lambda: runners(shape)).choice == "torch"


def plan_of(cell, **call) -> str:
    """The path a call of ``cell`` takes (``"reference"`` for a cell without a fast path, or
    a subclass that changed the arithmetic); ``call``: the keyword arguments of its kernel
    module's ``plan`` (device_type, dtype, mask, h_mask, autocast, reference, batch, ...)."""
    kernels = cell._kernels()
    return "reference" if kernels is None else kernels.plan(cell, **call)


def kernel_name_of(cell, **call) -> str:
    """The path a call of ``cell`` takes as ``lstmablate bench`` names it, e.g.
    ``"recurrent (native)"``, ``"torch-lstm (calibrated)"`` or ``"reference"``."""
    kernels = cell._kernels()
    return "reference" if kernels is None else kernels.kernel_name(cell, **call)
