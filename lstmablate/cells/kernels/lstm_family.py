"""The fast paths of the LSTM family (``lstmablate/cells/lstm.py``): which one a call takes
(:func:`plan`) and running it (:func:`forward`).

Paths:

* ``torch-lstm`` / ``torch-rnn``: ``lstm`` (``lstm-gates``) is exactly what
  ``torch.nn.LSTM`` (``RNN``) computes, so PyTorch's fused kernel runs it
  (``delegate.py``): always on CUDA (cuDNN); on CPU (oneDNN / ATen) when the native kernel
  is unavailable, when ``LSTMABLATE_TORCH_ON_CPU=1``, or when the calibrated timing found
  it faster for the call's shape class on this machine (``calibrate.py``; fixed-length
  calls only: with variable lengths PyTorch packs the sequence, and its packed CPU
  backward is far slower than ours, see ``dispatch.prefer_torch_on_cpu``).  Not with
  recurrent dropout or a length-0 sequence (neither maps onto PyTorch's kernels), nor,
  on CPU, with a projection (oneDNN has none);
* ``recurrent``: the hand-written recurrence (``lstm_recurrent.py``; native on CPU);
* ``scan``: nothing reads h_{t-1} (``lstm_scan.py``);
* ``reference``: the cell's own step loop (forced, autocast, a mask with holes, another
  dtype; ``dispatch.refused``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import calibrate, delegate
from .dispatch import autocast_on, prefer_torch_on_cpu, refused
from .lstm_recurrent import recurrent
from .native import library_for
from .lstm_scan import scan
from .sequences import mask_kind
from .switches import reference_forced, torch_on_cpu

State = tuple[Tensor, ...]
FAMILY = "lstm_family"


def _is_plain_lstm(cell) -> bool:
    return (cell.memory_cell and cell.content == "srnn" and cell.use_forget_gate
            and cell.use_output_gate and cell.gates_see_hidden)


def torch_kind(cell, device_type: str = "cpu", h_mask: bool = False, mask: str = "none") -> str | None:
    """"lstm" / "rnn" when PyTorch's own LSTM / RNN could run this call, else None."""
    if h_mask or mask == "prefix0":
        return None
    if not cell.memory_cell:  # eq 1, the S-RNN: exactly torch.nn.RNN(tanh)
        return "rnn"
    if _is_plain_lstm(cell) and (not cell.proj_size or device_type == "cuda"):
        return "lstm"
    return None


def _runners(cell, kind: str, batch: int | None):
    """The two paths of a calibration, on random data of the shape class."""
    def make(sc: calibrate.ShapeClass) -> dict:
        x, state = calibrate.random_call(sc, cell.state_sizes, batch)
        theirs = delegate.torch_lstm if kind == "lstm" else delegate.torch_rnn
        return {"native": calibrate.runner(lambda: recurrent(cell, x, state, None, None), cell, x,
                                           sc.grad),
                "torch": calibrate.runner(lambda: theirs(cell, x, state, None), cell, x, sc.grad)}
    return make


def plan(cell, *, device_type: str = "cpu", dtype: torch.dtype = torch.float32,
         mask: str = "none", h_mask: bool = False, autocast: bool = False,
         reference: bool | None = None, native: bool | None = None, batch: int | None = None,
         grad: bool = True, faster: str | None = None) -> str:
    """Which path an LSTM-family call runs: ``torch-lstm``, ``torch-rnn``, ``recurrent``,
    ``scan`` or ``reference``.

    ``mask`` is the call's :func:`~lstmablate.cells.kernels.sequences.mask_kind`;
    ``reference`` (default: the switches) forces the reference loop; ``native`` (default:
    whether the native kernel builds here) and, for a calibrated CPU choice, ``batch`` (and
    ``grad``: training or not) describe the call; ``faster`` ("native" / "torch") forces
    the calibration's outcome (tests).
    """
    if refused(device_type=device_type, dtype=dtype, mask=mask, autocast=autocast,
               reference=reference):
        return "reference"
    kind = torch_kind(cell, device_type, h_mask, mask)
    if kind is not None:
        if device_type != "cpu":
            return f"torch-{kind}"
        if native is None:
            native = library_for(FAMILY, device_type, dtype) is not None
        sc = None if batch is None else (lambda: calibrate.shape_class(
            kind, FAMILY, cell.input_size, cell.hidden_size, batch, dtype, grad))
        if prefer_torch_on_cpu(sc, native=native, faster=faster, runners=_runners(cell, kind, batch),
                               mask=mask):
            return f"torch-{kind}"
    if cell.weight_hh is None:  # nothing reads h_{t-1}: a linear scan
        return "scan"
    return "recurrent"


def available(cell) -> bool:
    """Does this cell have a fast path for a plain float32 CPU call?"""
    return plan(cell, reference=False, native=False) != "reference"


def kernel_name(cell, *, device_type: str = "cpu", dtype: torch.dtype = torch.float32,
                mask: str = "none", h_mask: bool = False, autocast: bool = False,
                reference: bool | None = None, batch: int | None = None,
                grad: bool = True) -> str:
    """The path a call takes, as ``lstmablate bench`` shows it: e.g. ``"recurrent (native)"``,
    ``"scan (pytorch)"``, ``"torch-lstm"``; ``", calibrated"`` is added on CPU where the
    timing of ``calibrate.py`` chose between our native kernel and PyTorch's."""
    p = plan(cell, device_type=device_type, dtype=dtype, mask=mask, h_mask=h_mask,
             autocast=autocast, reference=reference, batch=batch, grad=grad)
    if p == "reference":
        return p
    lib = library_for(FAMILY, device_type, dtype)
    calibrated = (device_type == "cpu" and batch is not None and lib is not None
                  and torch_on_cpu() == "auto" and mask == "none"
                  and torch_kind(cell, device_type, h_mask, mask))
    if p.startswith("torch-"):
        return p + (" (calibrated)" if calibrated else "")
    loops = "native" if lib is not None else "pytorch"
    return f"{p} ({loops}{', calibrated' if calibrated else ''})"


def forward(cell, x: Tensor, state: State | None, mask: Tensor | None,
            h_mask: Tensor | None) -> tuple[Tensor, State] | None:
    """The fast path of an LSTM-family call, or None (the caller runs the reference loop)."""
    if reference_forced() or x.dim() != 3:
        return None
    kind, lengths = mask_kind(mask)
    path = plan(cell, device_type=x.device.type, dtype=x.dtype, mask=kind,
                h_mask=h_mask is not None, autocast=autocast_on(x), batch=x.shape[1],
                grad=torch.is_grad_enabled())
    if path == "reference":
        return None
    T, B = x.shape[0], x.shape[1]
    if state is None:
        state = cell.initial_state(B, x)
    if T == 0:
        return x.new_zeros(0, B, cell.output_size), tuple(state)
    if path == "torch-lstm":
        return delegate.torch_lstm(cell, x, state, lengths)
    if path == "torch-rnn":
        return delegate.torch_rnn(cell, x, state, lengths)
    if path == "scan":
        return scan(cell, x, state, lengths)
    return recurrent(cell, x, state, lengths, h_mask)
