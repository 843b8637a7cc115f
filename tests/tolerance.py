"""Tolerances for comparing two computations of the same quantity, from the dtype and the
magnitudes involved — never from the rounding one CPU happened to make.

Two float32 evaluations of one function that group the work differently (another batch
size, a sequence in one call or in two, a sum in another order, another CPU's BLAS
blocking or vector width) differ by a number of roundings of the size of the values
involved: each rounding is at most ``eps`` (``torch.finfo(dtype).eps``) relative to the
magnitude it rounds.  So a difference is allowed up to

    ROUNDINGS * eps(dtype) * scale

where ``scale`` is the largest magnitude of the quantity compared (of a tensor: its
largest element, as the kernel tests do; of a mean of same-sign terms: the mean itself).
``ROUNDINGS`` = 64 is generous for the shallow computations of these tests and still far
below any real mistake (a token counted twice, a missing term, a wrong block), which is of
the order of the values themselves.  Where exactness is the point, compute in float64.
"""

from __future__ import annotations

import math

import torch

ROUNDINGS = 64


def eps(dtype: torch.dtype = torch.float32) -> float:
    return torch.finfo(dtype).eps


def tolerance(scale: float, dtype: torch.dtype = torch.float32, roundings: int = ROUNDINGS) -> float:
    """The largest difference allowed between two evaluations of a quantity of size ``scale``."""
    return roundings * eps(dtype) * abs(scale)


def rel_tol(dtype: torch.dtype = torch.float32, roundings: int = ROUNDINGS) -> float:
    """The same as a relative tolerance (for ``math.isclose`` / ``pytest.approx(rel=...)``)."""
    return roundings * eps(dtype)


def assert_close(actual, expected, *, dtype: torch.dtype = torch.float32, scale: float | None = None,
                 roundings: int = ROUNDINGS, msg: str = "") -> None:
    """``actual`` equals ``expected`` to ``roundings`` roundings of ``dtype`` at ``scale`` (default:
    the largest magnitude of ``expected``).  Numbers or tensors."""
    a = torch.as_tensor(actual.detach() if isinstance(actual, torch.Tensor) else actual,
                        dtype=torch.float64)
    e = torch.as_tensor(expected.detach() if isinstance(expected, torch.Tensor) else expected,
                        dtype=torch.float64)
    assert a.shape == e.shape, f"{msg} shapes differ: {tuple(a.shape)} vs {tuple(e.shape)}"
    if scale is None:
        scale = float(e.abs().max()) if e.numel() else 0.0
    err = float((a - e).abs().max()) if e.numel() else 0.0
    allowed = tolerance(scale, dtype, roundings)
    assert math.isfinite(err) and err <= allowed, (
        f"{msg} differs by {err:.3g}; {roundings} roundings of {dtype} at scale {scale:.3g} "
        f"allow {allowed:.3g}")


#: the unit roundoff of the low precisions (half their ``eps``): a rounding's relative error
ROUNDOFF = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}


def low_precision_tolerance(dtype: torch.dtype, T: int, scale: float) -> float:
    """What a ``dtype`` (bfloat16, float16) result of a T-step recurrence may differ from the
    exact one: ``u (2 T + 16)`` times its scale — every value kept between operations is
    rounded (at most u relative), an error enters at every step and is carried on (two
    roundings per step), and the products around the loop add a fixed number (sixteen)
    (tests/test_kernels_low_precision.py)."""
    return ROUNDOFF[dtype] * (2 * T + 16) * abs(scale)
