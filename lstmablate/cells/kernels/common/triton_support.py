"""Triton, where it is installed (an optional dependency: ``pip install triton``; the dev
extra installs it).  Without it — or without CUDA — nothing changes: the dispatch never
asks for a Triton path (``dispatch.triton_runs``) and no module importing ``triton`` is
loaded.

The kernels (each family's ``triton_kernels.py``: ``lstm/``, ``gru/``, ``second_order/``) are
decorated with ``triton.jit`` when their module is first imported, and Triton decides
then whether they are compiled for the GPU or run by its interpreter on CPU tensors
(``TRITON_INTERPRET=1``, read by Triton at that moment).  The interpreter executes every
program of a launch with NumPy, element for element what the GPU runs, which is how the
test suite checks the kernels' arithmetic on a machine without a GPU.

Also here: the dtypes the kernels run in and the launch sizes.
"""

from __future__ import annotations

from functools import lru_cache

import torch

from .. import switches


@lru_cache(maxsize=1)
def _triton():
    try:
        import triton
    except Exception:  # noqa: BLE001  (ImportError, or a broken install: same as none)
        return None
    return triton


def importable() -> bool:
    """Does ``import triton`` work here?"""
    return _triton() is not None


def interpreting() -> bool:
    """Is Triton's interpreter on (``TRITON_INTERPRET=1``)?  Then the kernels run on CPU
    tensors (and only there)."""
    triton = _triton()
    if triton is None:
        return False
    try:
        return bool(triton.knobs.runtime.interpret)
    except AttributeError:  # Triton < 3.3: no knobs
        return switches.read("TRITON_INTERPRET") == "1"


def runs(x: torch.Tensor) -> bool:
    """Can the kernels run on this tensor: a CUDA tensor with compiled kernels, or a CPU
    tensor under the interpreter, of a dtype they are written for?"""
    if not importable():
        return False
    if x.device.type == "cuda":
        return not interpreting() and x.dtype in CUDA_DTYPES
    return x.device.type == "cpu" and interpreting() and x.dtype in CPU_DTYPES


#: the dtypes the kernels run in on CUDA (float16/bfloat16 computed in float32 registers,
#: the memory cell kept in float32; float64 takes the PyTorch loops there) and under the
#: interpreter (float16/bfloat16 there only under autocast: ``call.refused``)
CUDA_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
CPU_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def dtypes(device_type: str) -> tuple[torch.dtype, ...]:
    return CUDA_DTYPES if device_type == "cuda" else CPU_DTYPES if device_type == "cpu" else ()


def block(n: int, cap: int = 256) -> int:
    """Elements per program for ``n`` element-wise items: a power of two, at least 16,
    at most ``cap`` (small: at batch 20 a step has only 20 x H elements, and more programs
    keep more of the GPU's multiprocessors busy; to be tuned on a GPU)."""
    return max(16, min(cap, 1 << max(0, n - 1).bit_length()))


def pow2(n: int) -> int:
    """The smallest power of two >= n (at least 2: a Triton block has two elements or more)."""
    return max(2, 1 << max(0, n - 1).bit_length())
