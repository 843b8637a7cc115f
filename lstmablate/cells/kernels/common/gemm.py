"""Which GEMM runs a call's large products on CPU: the products of all steps at once (x W^T
over every row of a call) and, in the backward, the input and weight gradients (dZ W, dZ^T x).

These products are most of a call's arithmetic (at ``parser-400`` about three quarters of an
``lstm`` call's time), and on CPU three float32 GEMMs can run them:

* ``mkl``: PyTorch's own ``torch.mm`` / ``a @ w`` (MKL's sgemm), which does not run its best
  code on AMD CPUs: on the AMD EPYC of docs/results/speed.md it ran a PTB-650 layer's input
  products at about half the rate of oneDNN's;
* ``onednn``: oneDNN's GEMM, the one behind ``torch.nn.LSTM``'s CPU kernel, which PyTorch does
  not use for a float32 ``matmul`` (``torch.ops.mkldnn._linear_pointwise`` reaches it);
* ``own``: our packed GEMM (``la_gemm.c``, the ``matmul`` of a native library, ``la_real.h``:
  the weight packed once, the micro-kernel over all rows), for the kernel families whose
  native loops run the call (it passed the library's self-test; not with
  ``LSTMABLATE_PACKED_GEMM=0``).

This module owns the choice (:func:`choose`): the GEMM that ``LSTMABLATE_CPU_GEMM`` names,
where it can run the call (else PyTorch's own), or, with ``auto`` (the default), the one a
short timing on first use found fastest for the product's shape class (rows rounded up to a
power of two, inner size, columns, thread count, with or without the backward's two products;
``calibrate.choose_among``, cached with the other dispatch decisions).  Its two users:

* the kernel families with hand-written backward passes (``lstm/``, ``gru/``,
  ``second_order/``) take a :class:`Products` for the call (:func:`for_call`) and compute
  their products through it;
* :func:`faster_products`: a context in which every float32 CPU product ``a @ w`` /
  ``torch.matmul(a, w)`` with a 2-D ``w`` runs on oneDNN where the choice (between ``mkl``
  and ``onednn``: such a product has no native library) says so.  The linear-scan family
  runs a cell's own ``project_inputs`` inside it (``linear_scan/family.py``): the cell's
  arithmetic stays the cell's, only the library that multiplies changes.

Everything else (float64, CUDA, autocast, a PyTorch without oneDNN) runs on ``torch.mm``.
Every GEMM computes the same products, rounded differently (float32 results agree to float32
rounding: ``tests/test_kernels_gemm.py``, ``tests/test_kernels_native.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable
from torch.overrides import TorchFunctionMode

from ..interface import autocast_on
from ..switches import cpu_gemm_setting, packed_gemm_enabled
from . import calibrate

#: the GEMMs, in the order they are preferred when the timing cannot tell them apart
GEMMS = ("mkl", "onednn", "own")


def onednn_available() -> bool:
    """Does this PyTorch have oneDNN with the linear operation the products use?"""
    return (torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


def _linear(a: Tensor, w: Tensor) -> Tensor:
    """a (M, K) w^T, w (N, K), on oneDNN (either may be a transposed view)."""
    return torch.ops.mkldnn._linear_pointwise(a, w, None, "none", [], "")


class Products:
    """``a w^T``, ``a w`` and ``a^T b`` of 2-D float tensors on one GEMM (:data:`GEMMS`;
    ``own`` needs the native library ``lib``).  A product with an empty side runs on
    ``torch.mm``, which defines it (zeros)."""

    def __init__(self, gemm: str = "mkl", lib=None):
        self.gemm, self.lib = gemm, lib

    def _own(self, ta: int, tb: int, a: Tensor, w: Tensor, M: int, N: int, K: int) -> Tensor:
        out = a.new_empty(M, N)
        self.lib.call("matmul", torch.float32, _choose=False, ta=ta, tb=tb, M=M, N=N, K=K,
                      A=a.contiguous(), W=w.contiguous(), accumulate=0, C=out)
        return out

    def _torch(self, *shape: int) -> bool:
        return self.gemm == "mkl" or 0 in shape

    def nt(self, a: Tensor, w: Tensor) -> Tensor:
        """a (M, K) times w (N, K) transposed: (M, N)."""
        M, K, N = a.shape[0], a.shape[1], w.shape[0]
        if self._torch(M, K, N):
            return torch.mm(a, w.t())
        return _linear(a, w) if self.gemm == "onednn" else self._own(0, 1, a, w, M, N, K)

    def nn(self, a: Tensor, w: Tensor) -> Tensor:
        """a (M, K) times w (K, N): (M, N)."""
        M, K, N = a.shape[0], a.shape[1], w.shape[1]
        if self._torch(M, K, N):
            return torch.mm(a, w)
        return _linear(a, w.t()) if self.gemm == "onednn" else self._own(0, 0, a, w, M, N, K)

    def tn(self, a: Tensor, b: Tensor) -> Tensor:
        """a (K, M) transposed times b (K, N): (M, N) (a weight's gradient over all rows)."""
        K, M, N = a.shape[0], a.shape[1], b.shape[1]
        if self._torch(M, K, N):
            return torch.mm(a.t(), b)
        return _linear(a.t(), b.t()) if self.gemm == "onednn" else self._own(1, 0, a, b, M, N, K)

    def linear(self, x: Tensor, w: Tensor, bias: Tensor | None, out: Tensor | None = None
               ) -> Tensor:
        """x (M, K) w^T, plus ``bias`` on its first bias.numel() columns (into ``out``, a
        contiguous (M, N) buffer, when given)."""
        if self.gemm == "mkl" and bias is not None and bias.shape[0] == w.shape[0]:
            return torch.addmm(bias, x, w.t(), out=out)
        z = torch.mm(x, w.t(), out=out) if self.gemm == "mkl" else self.nt(x, w)
        if bias is not None:
            z[:, :bias.shape[0]] += bias
        if out is not None and z is not out:
            return out.copy_(z)
        return z


#: the products through ``torch.mm`` (every device and dtype)
TORCH = Products()


def candidates(lib=None) -> tuple[str, ...]:
    """The GEMMs that can run a float32 CPU product here (``own`` with a native library
    ``lib`` whose packed GEMM passed its self-test, and packing allowed)."""
    own = (lib is not None and "own-packed" in getattr(lib, "modes", ())
           and packed_gemm_enabled())
    return tuple(g for g in GEMMS if g == "mkl" or (g == "onednn" and onednn_available())
                 or (g == "own" and own))


def _runs(M: int, K: int, N: int, grad: bool, names: tuple[str, ...], lib) -> dict:
    """Each GEMM on random operands of the shape: x W^T, and with ``grad`` the backward's
    dZ W and dZ^T x too."""
    gen = torch.Generator().manual_seed(0)
    x, w, dz = (torch.randn(M, K, generator=gen), torch.randn(N, K, generator=gen),
                torch.randn(M, N, generator=gen))

    def run(P: Products):
        def go() -> None:
            P.nt(x, w)
            if grad:
                P.nn(dz, w)
                P.tn(dz, x)
        return go
    return {name: run(Products(name, lib)) for name in names}


def choose(M: int, K: int, N: int, grad: bool, lib=None) -> str:
    """The GEMM (:data:`GEMMS`) for float32 CPU products of ``M`` rows, inner size ``K`` and
    ``N`` columns (with the backward's two when ``grad``): see the module docstring."""
    names = candidates(lib)
    setting = cpu_gemm_setting()
    if setting != "auto":
        return setting if setting in names else "mkl"
    if len(names) == 1:
        return names[0]
    # the key of the two-way choice kept its form when ``own`` joined (a third candidate is
    # named in the key, so a choice made without it is not reused with it, nor the reverse)
    key = (f"gemm|float32|M{calibrate.bucket(M)}|K{K}|N{N}|t{torch.get_num_threads()}|"
           f"{'grad' if grad else 'nograd'}" + ("|own" if "own" in names else ""))
    return calibrate.choose_among(key, lambda: _runs(calibrate.bucket(M), K, N, grad, names, lib))


def for_call(lib, x: Tensor, w: Tensor, grad: bool) -> Products:
    """The products of one kernel call of a native library ``lib`` on the (rows, K) input ``x``
    and the (N, K) weight ``w`` of its input products (``grad``: the backward will run):
    :data:`TORCH` unless the call is float32 on CPU, else on the GEMM :func:`choose` gives."""
    if lib is None or x.dtype != torch.float32 or x.device.type != "cpu":
        return TORCH
    gemm = choose(x.shape[0], w.shape[1], w.shape[0], grad, lib)
    return TORCH if gemm == "mkl" else Products(gemm, lib)


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


def use_onednn(a, b) -> bool:
    """Does ``a @ b`` run on oneDNN here (see the module docstring)?"""
    if not (isinstance(a, Tensor) and isinstance(b, Tensor) and a.dim() >= 2 and b.dim() == 2
            and a.device.type == "cpu" and b.device.type == "cpu"
            and a.dtype == b.dtype == torch.float32 and a.shape[-1] == b.shape[0]
            and a.numel() and b.numel()) or autocast_on(a):
        return False
    grad = torch.is_grad_enabled() and (a.requires_grad or b.requires_grad)
    return choose(a.numel() // a.shape[-1], b.shape[0], b.shape[1], grad) == "onednn"


_MATMUL = (torch.matmul, Tensor.matmul, Tensor.__matmul__)  # `a @ b` arrives as Tensor.matmul


class _FasterProducts(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in _MATMUL and not kwargs and len(args) == 2 and use_onednn(*args):
            return onednn_matmul(*args)
        return func(*args, **(kwargs or {}))


@contextmanager
def faster_products() -> Iterator[None]:
    """Every float32 CPU product ``a @ w`` inside the block on oneDNN where :func:`choose`
    says so (module docstring)."""
    with _FasterProducts():
        yield
