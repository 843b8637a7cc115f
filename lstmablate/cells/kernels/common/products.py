"""The large matrix products of a call: the input products of all steps before the loops,
and the input and weight gradients after them (one product each over every real token).

They are most of a call's arithmetic (at ``parser-400`` three quarters of its time), so on
CPU in float32 they run through our packed GEMM (``la_gemm.c``, the ``matmul`` of every
native library, ``la_real.h``) where a per-machine timing found it faster than ``torch.mm``
(``calibrate.choose_call_gemm``): PyTorch's BLAS is MKL, whose code on AMD CPUs runs these
products at about a third of our GEMM's rate there (docs/performance.md); on the Intel
CPUs MKL was written for it stays.  Everywhere else (another device, float64, no native
library) ``torch.mm``.  Both compute the same products; only the order of the sums differs.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..switches import packed_gemm_enabled
from . import calibrate


class Products:
    """``a w^T``, ``a w`` and ``a^T b`` of 2-D tensors, by ``torch.mm`` (``lib`` None) or by
    a native library's ``matmul`` (float32, CPU)."""

    def __init__(self, lib=None):
        self.lib = lib

    def _native(self, ta: int, tb: int, a: Tensor, w: Tensor, M: int, N: int, K: int) -> Tensor:
        out = a.new_empty(M, N)
        self.lib.call("matmul", torch.float32, _choose=False, ta=ta, tb=tb, M=M, N=N, K=K,
                      A=a.contiguous(), W=w.contiguous(), accumulate=0, C=out)
        return out

    def nt(self, a: Tensor, w: Tensor) -> Tensor:
        """a (M, K) times w (N, K) transposed: (M, N)."""
        if self.lib is None:
            return torch.mm(a, w.t())
        return self._native(0, 1, a, w, a.shape[0], w.shape[0], a.shape[1])

    def nn(self, a: Tensor, w: Tensor) -> Tensor:
        """a (M, K) times w (K, N): (M, N)."""
        if self.lib is None:
            return torch.mm(a, w)
        return self._native(0, 0, a, w, a.shape[0], w.shape[1], a.shape[1])

    def tn(self, a: Tensor, b: Tensor) -> Tensor:
        """a (K, M) transposed times b (K, N): (M, N) (a weight's gradient over all rows)."""
        if self.lib is None:
            return torch.mm(a.t(), b)
        return self._native(1, 0, a, b, a.shape[1], b.shape[1], a.shape[0])

    def linear(self, x: Tensor, w: Tensor, bias: Tensor | None, out: Tensor | None = None
               ) -> Tensor:
        """x (M, K) w^T, plus ``bias`` on its first bias.numel() columns (into ``out``, a
        contiguous (M, N) buffer, when given)."""
        if self.lib is None and bias is not None and bias.shape[0] == w.shape[0]:
            return torch.addmm(bias, x, w.t(), out=out)
        z = torch.mm(x, w.t(), out=out) if self.lib is None else self.nt(x, w)
        if bias is not None:
            z[:, :bias.shape[0]] += bias
        if out is not None and z is not out:
            return out.copy_(z)
        return z


#: the products through ``torch.mm``
TORCH = Products()


def for_call(lib, x: Tensor) -> Products:
    """The products of a call of a native library ``lib`` (or None) on ``x``: ours where
    they run this call (float32, CPU, our packed GEMM passed the library's self-test and
    ``LSTMABLATE_PACKED_GEMM`` is not ``0``) and the machine's timing found them faster,
    else :data:`TORCH`."""
    if (lib is None or x.dtype != torch.float32 or x.device.type != "cpu"
            or "own-packed" not in lib.modes or not packed_gemm_enabled()):
        return TORCH
    return Products(lib) if calibrate.choose_call_gemm(lib, torch.get_num_threads()) == "native" \
        else TORCH
