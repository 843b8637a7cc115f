"""Which kernel a call takes: the choices the families share beyond ``call.refused``
(the paths are ``interface.KernelPath``'s members).

* :func:`triton_runs`: whether the Triton kernels may run a call: on CUDA wherever Triton
  imports (``LSTMABLATE_TRITON`` not ``0``); on CPU tensors only with
  ``LSTMABLATE_TRITON=1`` and Triton's interpreter on (``TRITON_INTERPRET=1``: how the
  test suite checks their arithmetic without a GPU);
* :func:`torch_or_ours`: for the cells PyTorch has a fused kernel of its own for
  (``lstm``, ``lstm-gates``, ``gru`` with ``reset_after``): on CUDA PyTorch's (cuDNN,
  ``common/delegate.py``) unless ``LSTMABLATE_TRITON=1``; on CPU PyTorch's (oneDNN / ATen) or
  ours by :func:`prefer_torch_on_cpu`;
* :func:`prefer_torch_on_cpu`: ``LSTMABLATE_TORCH_ON_CPU``, no native kernel, or the
  calibrated choice of ``common/calibrate.py``.  A CPU call with variable lengths keeps ours:
  PyTorch runs it as a packed sequence, whose CPU backward is an ATen loop that zero-fills
  and adds a buffer of all the batch's tokens at every time step (measured on BiDAF's
  whole training step took twice as long; docs/results/speed.md);
* :func:`describe`: a path as ``lstmablate bench`` names it.
"""

from __future__ import annotations

from collections.abc import Callable

from ..call import Call
from ..interface import KernelPath
from ..switches import graphs_setting, torch_on_cpu, triton_setting
from . import calibrate, triton_support
from .native import library_for


def triton_runs(call: Call) -> bool:
    """May the Triton kernels run this call (see the module docstring)?  ``call.triton``
    stands for "Triton imports here" (tests); ``LSTMABLATE_TRITON=0`` always wins."""
    setting = triton_setting()
    if setting == "0" or call.dtype not in triton_support.dtypes(call.device_type):
        return False
    if call.device_type == "cpu" and setting != "1":
        return False
    if call.triton is not None:
        return call.triton
    if call.device_type == "cpu":
        return triton_support.interpreting()
    return triton_support.importable() and not triton_support.interpreting()


def prefer_torch_on_cpu(sc: Callable[[], calibrate.ShapeClass] | None, *, native: bool,
                        faster: str | None = None,
                        runners: Callable[[calibrate.ShapeClass], dict] | None = None,
                        mask: str = "none") -> bool:
    """Whether a CPU call that PyTorch's own kernel could run goes to it.

    ``LSTMABLATE_TORCH_ON_CPU=1``, or no native kernel (``native=False``): yes;
    ``LSTMABLATE_TORCH_ON_CPU=0``, or variable lengths (``mask`` "prefix": PyTorch would
    pack the sequence, and its packed CPU backward is far slower than ours): no; otherwise
    ``faster`` ("torch" / "native", given by tests to force an outcome) or, when the
    call's shape class is known (``sc``), the calibrated choice (timed with
    ``runners(shape class)`` on first use); without a shape class, our kernel.
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


def torch_or_ours(kind: str | None, ours: KernelPath, call: Call, native: Callable[[], bool],
                  sc: Callable[[], calibrate.ShapeClass] | None,
                  runners: Callable[[calibrate.ShapeClass], dict]) -> KernelPath:
    """``torch-<kind>`` (PyTorch's fused kernel), ``ours`` on Triton (``triton-<ours>``) or
    ``ours`` (``recurrent``, ``scan``) for a call that PyTorch's kernel ``kind`` could run
    (None: it cannot).  Under autocast off CUDA only the Triton kernels (the interpreter)
    have a low precision: without them, ``reference`` (before any calibration is timed)."""
    triton = triton_runs(call)
    if call.autocast and call.device_type != "cuda" and not triton:
        return KernelPath.REFERENCE  # off CUDA only the Triton kernels have a low precision
    if kind is not None and not (triton and triton_setting() == "1"):
        if call.device_type != "cpu":
            return KernelPath.torch(kind)
        has_native = native() if call.native is None else call.native
        if prefer_torch_on_cpu(sc, native=has_native, faster=call.faster, runners=runners,
                               mask=call.mask):
            return KernelPath.torch(kind)
    return ours.on_triton if triton else ours


def native_loops(family, call: Call) -> bool:
    """Do ``family``'s native (C) loops run this call (built here, CPU, float32/64)?"""
    return family.native is not None and library_for(family.native.library, call.device_type,
                                                      call.dtype) is not None


def graphed(path: KernelPath, call: Call) -> bool:
    """Are the path's time loops captured in CUDA graphs (once a call shape has been seen
    ``graphs.CACHE.capture_after`` times)?  Only ``triton-recurrent``'s, on CUDA, with
    ``LSTMABLATE_CUDA_GRAPHS`` not ``0``: ``triton-scan`` is one launch per direction, with
    nothing to capture."""
    return (path is KernelPath.TRITON_RECURRENT and call.device_type == "cuda"
            and graphs_setting() != "0")


def describe(path: KernelPath, call: Call, native_loops: bool, torch_could: bool = False,
             detail: str = "") -> str:
    """A path as ``lstmablate bench`` shows it: ``torch-lstm (cuDNN)`` /
    ``torch-lstm (calibrated)``, ``triton-recurrent (CUDA graphs)``, ``triton-scan (one
    launch)``, ``recurrent (native)``, ``recurrent (native, calibrated)``, ``scan
    (pytorch)``, ...; ``native_loops``: the native (C) loops run this call; ``torch_could``:
    PyTorch's kernel could run it (so on CPU the calibrated timing chose between the two);
    ``detail``: what a family adds about its layout, last in the brackets
    (``recurrent (native, coupled i = 1 - f)``)."""
    text = _describe(path, call, native_loops, torch_could)
    if not detail:
        return text
    return f"{text[:-1]}, {detail})" if text.endswith(")") else f"{text} ({detail})"


def _describe(path: KernelPath, call: Call, native_loops: bool, torch_could: bool) -> str:
    if path.is_triton:
        if call.device_type == "cpu":
            return f"{path} (interpreter)"
        if path is KernelPath.TRITON_SCAN:
            return f"{path} (one launch)"
        return f"{path} ({'CUDA graphs' if graphed(path, call) else 'eager'})"
    if path.torch_kind and call.device_type == "cuda":
        return f"{path}" + (" (cuDNN, stacked)" if call.stacked else " (cuDNN)")
    calibrated = (call.device_type == "cpu" and call.batch is not None and native_loops
                  and torch_on_cpu() == "auto" and call.mask == "none" and torch_could)
    if path.torch_kind:
        return f"{path}" + (" (calibrated)" if calibrated else "")
    loops = "native" if native_loops else "pytorch"
    return f"{path} ({loops}{', calibrated' if calibrated else ''})"
