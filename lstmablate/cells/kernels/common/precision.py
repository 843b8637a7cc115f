"""The precision of the float32 matrix products, as PyTorch's flags set it, for both sides of a
comparison.

On CUDA PyTorch has two switches for TF32 (float32 products on the tensor cores, with a
10-bit mantissa): ``torch.backends.cuda.matmul.allow_tf32`` (also set by
``torch.set_float32_matmul_precision``: ``"highest"`` off, ``"high"`` / ``"medium"`` on) for
cuBLAS, which runs every product of our kernels (the Triton kernels compute no product
themselves) and of the models' other layers; and ``torch.backends.cudnn.allow_tf32`` for
cuDNN, which runs ``torch.nn.LSTM`` / ``RNN`` / ``GRU`` and so our ``lstm``, ``lstm-gates``
and ``gru`` (``reset_after``) cells.  Their defaults differ — cuBLAS off, cuDNN on — so by
default a cuDNN cell would run TF32 products and every other cell strict float32: a
comparison of the two would mix precision with design.  This module reads the two flags
(:func:`products_precision`) and sets them alike (:func:`same_precision`); the trainer runs
every run with them alike (``train.precision``: ``fp32`` strict, ``tf32`` both on), and a
benchmark that compares our cells with ``nn.LSTM`` should time both sides inside one
:func:`same_precision` and report :func:`products_label` with its rows.  On CPU the flags
change nothing here.  Imports only PyTorch (``make gpu-check`` runs on a bare machine).

Also here: the dtype a kernel carries a memory cell in (:func:`memory_dtype`), whatever the
dtype of its products.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


def products_precision() -> dict[str, object]:
    """The flags in effect: cuBLAS's and cuDNN's TF32 switches and
    ``torch.get_float32_matmul_precision()``."""
    return {"cublas_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
            "cudnn_tf32": bool(torch.backends.cudnn.allow_tf32),
            "float32_matmul_precision": torch.get_float32_matmul_precision()}


def products_label() -> str:
    """``"fp32"`` (both strict), ``"tf32"`` (both TF32), or the mix
    (``"cublas fp32, cudnn tf32"``: PyTorch's defaults) — for a benchmark's rows."""
    flags = products_precision()
    cublas, cudnn = ("tf32" if flags[k] else "fp32" for k in ("cublas_tf32", "cudnn_tf32"))
    return cublas if cublas == cudnn else f"cublas {cublas}, cudnn {cudnn}"


@contextmanager
def same_precision(tf32: bool) -> Iterator[None]:
    """cuBLAS and cuDNN both at TF32 (``tf32``) or both at strict float32, inside the block;
    the flags as they were afterwards."""
    old = (torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32)
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    torch.backends.cudnn.allow_tf32 = tf32
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(old[0])
        torch.backends.cudnn.allow_tf32 = old[1]


def memory_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the memory cell and its carried gradient are kept in: float64 for float64,
    else float32 (in float16 / bfloat16 a cell summed over hundreds of steps would drift by
    a rounding of its own size at every step)."""
    return torch.float64 if dtype == torch.float64 else torch.float32
