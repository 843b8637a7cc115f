"""``train.precision``: the precision a run trains and evaluates in.

* ``fp32`` (the default): every float32 matrix product strict float32 — cuBLAS's (our
  kernels' and the models' other layers') and cuDNN's (``lstm``, ``lstm-gates``, ``gru`` with
  ``reset_after`` on CUDA) alike, so that every cell of an ablation computes in the same
  precision (PyTorch's own defaults would run cuDNN's RNNs, and only those, in TF32:
  ``lstmablate/cells/kernels/common/precision.py``);
* ``tf32``: every float32 product in TF32, cuBLAS's and cuDNN's alike (NVIDIA GPUs from
  Ampere on; on another device it is refused before anything runs);
* ``bf16`` / ``fp16``: the forward passes of training and evaluation under
  ``torch.autocast`` in that dtype (the backward follows what the forward recorded); every
  fast path runs in it with the memory cell and its gradient carried in float32
  (``lstmablate/cells/kernels/interface.py``); ``fp16`` also scales the loss
  (``torch.amp.GradScaler``): a step whose gradients overflowed is skipped and the scale
  lowered, and the scaler's state is part of ``last.pt``.  Products outside autocast stay
  strict float32.

:func:`check_precision` refuses a precision the device or this PyTorch cannot run, before
a run writes anything; :class:`Precision` is what the trainer uses; :func:`in_effect` is
what a run records in its ``env.json``.
"""

from __future__ import annotations

import warnings
from contextlib import nullcontext
from typing import Any

import torch

from lstmablate.cells.kernels.common.precision import products_precision, same_precision
from lstmablate.cells.kernels.interface import autocast_dtype
from lstmablate.config import PRECISIONS
from lstmablate.errors import ConfigError

#: the autocast dtype of each low precision
LOW = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _scaler_class(device: torch.device):
    """``torch.amp.GradScaler`` (PyTorch >= 2.3, any device), else CUDA's; None if there is
    none for ``device``."""
    scaler = getattr(torch.amp, "GradScaler", None)
    if scaler is not None:
        return scaler
    return torch.cuda.amp.GradScaler if device.type == "cuda" else None


def _autocast_runs(device: torch.device, dtype: torch.dtype) -> bool:
    """Does ``torch.autocast(device, dtype)`` really turn on here?  (Older PyTorch warns and
    stays off for a dtype a device does not support.)"""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            with torch.autocast(device.type, dtype=dtype):
                return autocast_dtype(torch.empty(0, device=device)) == dtype
        except (RuntimeError, ValueError):
            return False


def check_precision(precision: str, device: torch.device) -> None:
    """ConfigError unless ``precision`` runs on ``device`` with this PyTorch."""
    if precision not in PRECISIONS:  # (the config validates it; a library caller may not)
        raise ConfigError(f"train.precision must be one of {', '.join(PRECISIONS)}, got "
                          f"{precision!r}")
    if precision == "tf32" and device.type != "cuda":
        raise ConfigError(f"train.precision=tf32 runs float32 products on an NVIDIA GPU's tensor "
                          f"cores; this run is on {device}. Use train.precision=fp32 here "
                          "(or bf16).")
    low = LOW.get(precision)
    if low is None:
        return
    if device.type == "cuda" and low == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        raise ConfigError(f"train.precision=bf16: {torch.cuda.get_device_name(device)} has no "
                          "bfloat16 arithmetic (NVIDIA GPUs have it from Ampere on). Use "
                          "train.precision=fp16 (with its gradient scaler) or fp32.")
    if not _autocast_runs(device, low):
        raise ConfigError(f"train.precision={precision}: PyTorch {torch.__version__} has no "
                          f"{low} autocast on {device.type}. Use train.precision=bf16 or fp32 "
                          "there" + (", or a GPU." if device.type != "cuda" else "."))
    if precision == "fp16" and _scaler_class(device) is None:
        raise ConfigError(f"train.precision=fp16 needs a gradient scaler, which PyTorch "
                          f"{torch.__version__} has only for CUDA; this run is on {device}. Use "
                          "train.precision=bf16 or fp32 here (or PyTorch >= 2.3).")


def path_note(precision: str, device: torch.device) -> str | None:
    """What a run in ``precision`` on ``device`` should be told at its start, or None: bf16 and
    fp16 on a CPU run the cells' own step-by-step PyTorch loops (the native C kernels compute
    in float32 only; the Triton kernels run on a CPU only under their interpreter, for
    tests), not the fast paths fp32 takes there."""
    if precision not in LOW or device.type == "cuda":
        return None
    from lstmablate.cells.kernels.common import triton_support
    from lstmablate.cells.kernels.switches import triton_setting

    low = str(LOW[precision]).replace("torch.", "")
    if triton_setting() == "1" and triton_support.interpreting():
        path = ("the Triton kernels under their interpreter (LSTMABLATE_TRITON=1 with "
                "TRITON_INTERPRET=1: a test of their arithmetic, far slower than any other path)")
    else:
        path = "their step-by-step PyTorch loops (the fast CPU kernels compute in float32 only)"
    return (f"train.precision={precision} on {device.type}: the recurrent cells run in {low} "
            f"(autocast) on {path}. train.precision=fp32 takes the fast kernels here; bf16 and "
            "fp16 are for GPUs (docs/design/precision.md, 'Mixed precision').")


def in_effect(precision: str, device: torch.device) -> dict[str, Any]:
    """What a run records of its precision: ``train.precision``, the autocast dtype, and the
    float32 products' flags as the run sets them."""
    with same_precision(precision == "tf32"):
        flags = products_precision()
    low = LOW.get(precision)
    return {"train": precision, "autocast": str(low).replace("torch.", "") if low else None,
            "device": str(device), **flags}


class Precision:
    """The trainer's side of ``train.precision``: the products' flags for the whole run,
    autocast around every forward, and fp16's gradient scaler."""

    def __init__(self, precision: str, device: torch.device):
        check_precision(precision, device)
        self.name, self.device = precision, device
        self.low = LOW.get(precision)
        self.scaler = _scaler_class(device)(device.type) if precision == "fp16" else None

    def products(self):
        """The flags of the float32 products, for the whole run (restored afterwards)."""
        return same_precision(self.name == "tf32")

    def autocast(self):
        """Around a forward pass (training loss, evaluation): autocast in the low precision."""
        if self.low is None:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.low)

    def backward(self, loss: torch.Tensor) -> None:
        (loss if self.scaler is None else self.scaler.scale(loss)).backward()

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """The true gradients (before clipping, and before they are checked or logged)."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def overflow_skips(self) -> bool:
        """Does a non-finite gradient skip its step by itself (the scaler's overflow), rather
        than being the trainer's ``nonfinite`` business?"""
        return self.scaler is not None

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.scaler is None:
            optimizer.step()
            return
        self.scaler.step(optimizer)  # skipped when the unscaled gradients overflowed
        self.scaler.update()

    def state_dict(self) -> dict[str, Any] | None:
        return self.scaler.state_dict() if self.scaler is not None else None

    def load_state_dict(self, state: Any) -> None:
        """Restore the scaler (a ``last.pt`` without one, or of another precision: it starts
        afresh, recalibrating its scale within a few steps)."""
        if self.scaler is not None and isinstance(state, dict) and "scale" in state:
            self.scaler.load_state_dict(state)

