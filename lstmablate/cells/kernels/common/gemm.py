"""The products of all steps at once (x W^T over the T x B rows of a call) on the faster of the
two float32 GEMMs PyTorch ships for the CPU.

PyTorch computes a float32 ``a @ w`` on CPU with MKL's sgemm, which does not run its best
code on AMD CPUs: on the AMD EPYC of docs/performance.md (AVX-512) it ran a PTB-650 layer's
input products (700 x 650 by 650 x 1950, and the two products of their backward) at about
half the rate of oneDNN's GEMM, the one behind ``torch.nn.LSTM``'s CPU kernel, which PyTorch
does not use for a float32 ``matmul`` (``torch.ops.mkldnn._linear_pointwise`` reaches it).
A cell with few matrices and no per-step product spends most of its time in these products,
so on such a CPU its speed against ``nn.LSTM`` is set by the GEMM as much as by its FLOPs.

* :class:`OneDNNLinear`: x W^T on oneDNN, forward and backward (dx = dZ W, dW = dZ^T x:
  three oneDNN products, as ``matmul``'s backward does three MKL ones);
* :func:`faster_products`: a context in which every float32 CPU product ``a @ w`` /
  ``torch.matmul(a, w)`` with a 2-D ``w`` runs on the GEMM that a short timing on first use
  found faster for its shape class (rows rounded up to a power of two, columns, inner size,
  thread count, with or without gradients; ``calibrate.choose_among``, cached with the other
  dispatch decisions), or the one ``LSTMABLATE_CPU_GEMM`` names.  Everything else (float64,
  CUDA, autocast, a PyTorch without oneDNN) runs as PyTorch would.  A kernel family runs a
  cell's own ``project_inputs`` inside it (``linear_scan/family.py``): the cell's arithmetic
  stays the cell's, only the library that multiplies changes (the same products, rounded
  differently: float32 results agree to float32 rounding, ``tests/test_kernels_gemm.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable
from torch.overrides import TorchFunctionMode

from ..interface import autocast_on
from ..switches import cpu_gemm_setting
from . import calibrate


def onednn_available() -> bool:
    """Does this PyTorch have oneDNN with the linear operation the products use?"""
    return (torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


def _linear(a: Tensor, w: Tensor) -> Tensor:
    """a (M, K) w^T, w (N, K), on oneDNN (either may be a transposed view)."""
    return torch.ops.mkldnn._linear_pointwise(a, w, None, "none", [], "")


class OneDNNLinear(torch.autograd.Function):
    """``OneDNNLinear.apply(x, w)`` = x (M, K) w^T, w (N, K), and its gradients, on oneDNN."""

    @staticmethod
    def forward(ctx, x: Tensor, w: Tensor) -> Tensor:
        ctx.save_for_backward(x, w)
        return _linear(x, w)

    @staticmethod
    @once_differentiable
    def backward(ctx, dz: Tensor):
        x, w = ctx.saved_tensors
        dz = dz.contiguous()
        dx = _linear(dz, w.t()) if ctx.needs_input_grad[0] else None  # dZ W
        dw = _linear(dz.t(), x.t()) if ctx.needs_input_grad[1] else None  # dZ^T x
        return dx, dw


def onednn_matmul(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b`` (a (..., K), b (K, N)) on oneDNN."""
    out = OneDNNLinear.apply(a.reshape(-1, a.shape[-1]), b.t())
    return out.reshape(*a.shape[:-1], b.shape[1])


def _bucket(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def _runs(M: int, K: int, N: int, grad: bool) -> dict:
    """Both GEMMs on random operands of the shape (forward, and backward with ``grad``)."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(M, K, generator=gen).requires_grad_(grad)
    b = torch.randn(K, N, generator=gen).requires_grad_(grad)

    def run(matmul):
        def go() -> None:
            out = matmul(a, b)
            if grad:
                torch.autograd.grad(out.sum(), (a, b))
        return go
    return {"mkl": run(torch.matmul), "onednn": run(onednn_matmul)}


def use_onednn(a, b) -> bool:
    """Does ``a @ b`` run on oneDNN here (see the module docstring)?"""
    if not (isinstance(a, Tensor) and isinstance(b, Tensor) and a.dim() >= 2 and b.dim() == 2
            and a.device.type == "cpu" and b.device.type == "cpu"
            and a.dtype == b.dtype == torch.float32 and a.shape[-1] == b.shape[0]
            and a.numel() and b.numel()):
        return False
    setting = cpu_gemm_setting()
    if setting == "mkl" or autocast_on(a) or not onednn_available():
        return False
    if setting == "onednn":
        return True
    M, (K, N) = _bucket(a.numel() // a.shape[-1]), b.shape
    grad = torch.is_grad_enabled() and (a.requires_grad or b.requires_grad)
    key = (f"gemm|float32|M{M}|K{K}|N{N}|t{torch.get_num_threads()}|"
           f"{'grad' if grad else 'nograd'}")
    with torch.enable_grad() if grad else torch.no_grad():
        return calibrate.choose_among(key, lambda: _runs(M, K, N, grad)) == "onednn"


_MATMUL = (torch.matmul, Tensor.matmul, Tensor.__matmul__)  # `a @ b` arrives as Tensor.matmul


class _FasterProducts(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in _MATMUL and not kwargs and len(args) == 2 and use_onednn(*args):
            return onednn_matmul(*args)
        return func(*args, **(kwargs or {}))


@contextmanager
def faster_products() -> Iterator[None]:
    """Every float32 CPU product ``a @ w`` inside the block on the faster GEMM (module doc)."""
    with _FasterProducts():
        yield
