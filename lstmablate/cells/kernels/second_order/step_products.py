"""The per-step matrix products of the second-order cells' PyTorch loops.

Each step multiplies B rows (the batch) by a whole recurrent weight, so a step streams the
weight from memory for very little arithmetic.  On CPU in float32 a large weight is packed
once per call for MKL's packed GEMM (``torch.ops.mkl._mkl_linear``, what PyTorch's own
frozen linear layers use; the native loops pack theirs the same way in C), which does these
products markedly faster (1.3-1.6x at 650 x 2600 and 650 x 10400, measured on an Intel
Xeon); any other weight is made row-major (in, out) once and each step calls ``mm``.
``LSTMABLATE_PACKED_GEMM=0`` turns packing off.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..switches import packed_gemm_enabled

#: pack a per-step weight for MKL's packed GEMM (float32 CPU) when it has at least this many
#: entries; below it plain ``mm`` is as fast
PACK_MIN = 300_000
#: ... and only for calls of at least this many steps (packing costs about two products)
PACK_MIN_STEPS = 4


def packing_available() -> bool:
    """Does this PyTorch build have MKL's packed linear op?"""
    try:
        return bool(torch.backends.mkl.is_available()) and hasattr(torch.ops.mkl, "_mkl_linear")
    except (AttributeError, RuntimeError):
        return False


class StepProduct:
    """``a @ w`` for the B-row products of every step, ``w`` given as (in, out)."""

    def __init__(self, w: Tensor, rows: int, steps: int):
        self.rows = rows
        self.packed = None
        if (w.device.type == "cpu" and w.dtype == torch.float32 and w.numel() >= PACK_MIN
                and steps >= PACK_MIN_STEPS and packed_gemm_enabled() and packing_available()):
            self.w_out_in = w.t().contiguous()  # (out, in): nn.Linear's layout
            self.packed = torch.ops.mkl._mkl_reorder_linear_weight(self.w_out_in, rows)
        else:
            self.w = w.contiguous()

    def __call__(self, a: Tensor, out: Tensor | None = None) -> Tensor:
        if self.packed is not None and a.shape[0] == self.rows:
            y = torch.ops.mkl._mkl_linear(a, self.packed, self.w_out_in, None, self.rows)
            return y if out is None else out.copy_(y)
        w = self.w if self.packed is None else self.w_out_in.t()
        return torch.mm(a, w) if out is None else torch.mm(a, w, out=out)

    def add_to(self, acc: Tensor, a: Tensor) -> Tensor:
        """acc += a @ w (in place)."""
        if self.packed is not None:
            return acc.add_(self(a))
        return acc.addmm_(a, self.w)
