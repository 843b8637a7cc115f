"""What the dispatch knows about one call of a cell's fast kernels, and the rules every kernel
family shares around its own choice of path.

:class:`Call` describes a call (device, dtype, the kind of mask, autocast, ...): a pure
description, so that every path choice, the CUDA ones included, is testable on a CPU
machine.  :func:`mask_kind` classifies a call's mask.  Before a family chooses, a call is
:func:`refused` (the reference loop runs it) when it is forced to the reference loop, has a
mask with holes, or a dtype the kernels are not written for; under autocast, the family's
choice is kept only where the path has a low-precision kernel (:func:`runs_low_precision`).
The family contract that applies them is :mod:`lstmablate.cells.kernels.interface`
(``KernelFamily._plan``).

Like the contract, this module imports nothing of the kernels (``switches.py`` only).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import Tensor

#: the dtypes the CPU kernels (native and PyTorch loops) are written for
CPU_DTYPES = (torch.float32, torch.float64)


@dataclass(frozen=True)
class Call:
    """What the dispatch knows about one call: a pure description, so that every path
    choice (the CUDA ones included) is testable on a CPU machine.

    ``mask``: ``"none"``, ``"prefix"`` (variable lengths), ``"prefix0"`` (some length is
    0) or ``"other"`` (holes), as :func:`mask_kind` classifies a mask; ``reference``
    forces (True) or forbids (False) the reference loop, None follows the switches;
    ``native`` / ``triton``: whether the native (C) loops / the Triton kernels run here
    (None: find out); ``batch`` and ``grad`` describe a CPU call for the calibrated
    choice, ``faster`` forces its outcome
    (tests); ``stacked``: the call is a whole encoder's (one cuDNN call).
    """

    device_type: str = "cpu"
    dtype: torch.dtype = torch.float32
    mask: str = "none"
    h_mask: bool = False
    autocast: bool = False
    reference: bool | None = None
    native: bool | None = None
    triton: bool | None = None
    batch: int | None = None
    grad: bool = True
    faster: str | None = None
    stacked: bool = False

    @classmethod
    def of(cls, **call: Any) -> Call:
        known = _field_names(cls)
        unknown = call.keys() - known
        if unknown:
            raise TypeError(f"unknown call description(s) {sorted(unknown)}; "
                            f"known: {sorted(known)}")
        return cls(**call)


@functools.cache
def _field_names(cls: type) -> frozenset[str]:
    """A dataclass's field names, computed once per class (Call.of runs at every call)."""
    return frozenset(f.name for f in fields(cls))


def refused(call: Call) -> bool:
    """True when no fast path may run the call (the reference loop runs it): forced
    (``switches``), a mask with holes, a non-float dtype, and on CPU outside autocast a dtype
    other than float32 / float64 (what the CPU kernels are written for).  Under autocast
    the family's choice is kept only where it has a low-precision kernel
    (:func:`runs_low_precision`)."""
    from .switches import reference_forced

    reference = reference_forced() if call.reference is None else call.reference
    if reference or call.mask == "other" or not call.dtype.is_floating_point:
        return True
    return call.device_type == "cpu" and call.dtype not in CPU_DTYPES and not call.autocast


def runs_low_precision(path: Any, call: Call) -> bool:
    """Does ``path`` run a call under autocast in its low precision: the Triton kernels
    (float32 memory cell), and on CUDA PyTorch's cuDNN kernels (their half-precision
    paths)?  No other path has a low-precision kernel: the reference loop runs the call."""
    if getattr(path, "is_triton", False):
        return True
    return call.device_type == "cuda" and getattr(path, "torch_kind", None) is not None



def mask_kind(mask: Tensor | None) -> tuple[str, Tensor | None]:
    """Classify a (T, B) mask: ("none", None), ("prefix", lengths), ("prefix0", lengths)
    when some length is 0, or ("other", None) for masks with holes / non-0/1 values."""
    if mask is None:
        return "none", None
    T = mask.shape[0]
    if mask.dim() != 2:
        return "other", None
    if not mask.is_floating_point():
        mask = mask.float()
    lengths = mask.sum(0).round().long()
    steps = torch.arange(T, device=mask.device).unsqueeze(1)
    if not torch.equal((steps < lengths.unsqueeze(0)).to(mask.dtype), mask):
        return "other", None
    if mask.shape[1] and bool((lengths == mask.shape[0]).all()):
        return "none", None
    if mask.shape[1] and bool((lengths == 0).any()):
        return "prefix0", lengths
    return "prefix", lengths
