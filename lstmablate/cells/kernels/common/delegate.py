"""Delegation to PyTorch's own fused kernels: ``torch._VF.lstm``, ``rnn_tanh`` and ``gru``
(cuDNN on CUDA; oneDNN or ATen on CPU).

``lstm`` (``lstm-gates``, the GRU with ``reset_after``) computes exactly what
``torch.nn.LSTM`` (``RNN``, ``GRU``) computes, up to the parameter layout:

* our LSTM row blocks i, f, o, g are PyTorch's i, f, g, o with the last two swapped, our
  single bias is ``bias_ih`` and ``bias_hh`` is a constant zero;
* the GRU's update gate is ours negated: torch.nn.GRU writes h_t = (1 - z'_t) h~_t +
  z'_t h_{t-1}, i.e. z'_t = 1 - z_t = sigma(-a_z) (Neubig eq 59 vs PyTorch's docs), and
  its ``bias_hh`` is [0; 0; our b_hh];
* variable lengths become a packed sequence (a length of 0 cannot be packed: the dispatch
  sends such calls to our kernels).

**The cells in cuDNN's layout** (``lstm``, ``lstm-gates``: ``LSTMFamilyCell.torch_weights``)
hand their own parameters over: views of one flat buffer in PyTorch's gate order, read in
place, with nothing made, gathered or mapped back per call (a stacked call passes every
cell's buffer; cuDNN gathers them into its workspace itself).  The other cells it runs
(``lstm`` without a content bias, the GRU) are

**kept in PyTorch's layout** (:class:`FusedWeights`): the weights in PyTorch's layout are
made once and kept, per cell (or per encoder for a stacked call), and remade only when a
parameter changed (its version counter or storage: an optimizer step, a ``load_state_dict``).
On CUDA they are one flat buffer in cuDNN's own layout (``torch._cudnn_rnn_flatten_weight``,
as ``nn.LSTM.flatten_parameters``), so cuDNN reads them in place instead of compacting them
at every call.  :class:`ToFused` hands the kept weights to autograd and maps their
gradients back onto our parameters (the inverse permutation), so every gradient lands on
our own parameters.

**A whole encoder in one call** (:class:`CudnnStack`, used by the LSTM family and the
GRU): on CUDA, a stacked (bidirectional) encoder whose per-layer calls would all go to
PyTorch's kernel and whose options add nothing between the layers (no dropout in training,
no recurrent dropout, no residual connections, no length-0 row) is ONE call of the fused
kernel with ``num_layers`` and ``bidirectional``, exactly what ``torch.nn.LSTM`` does.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor

State = tuple[Tensor, ...]


# ---------------------------------------------------------------------------------------
# our parameters in PyTorch's layout
# ---------------------------------------------------------------------------------------

#: (rows, device) -> the row order that swaps the last two of four blocks (an index tensor
#: on that device, made once: one ``index_select`` per weight instead of three slices and a
#: ``cat``, which counts at every backward call, where the gradients go back through it)
_SWAP_INDEX: dict[tuple[int, torch.device], Tensor] = {}


def _swap_last_blocks(w: Tensor) -> Tensor:
    """Swap the last two of four row blocks (ours i, f, o, g <-> PyTorch's i, f, g, o); the
    swap is its own inverse."""
    key = (w.shape[0], w.device)
    index = _SWAP_INDEX.get(key)
    if index is None:
        n = w.shape[0] // 4
        order = torch.arange(4 * n, device=w.device)
        index = torch.cat([order[:2 * n], order[3 * n:], order[2 * n:3 * n]])
        _SWAP_INDEX[key] = index
    return w.index_select(0, index)


@dataclass(frozen=True)
class WeightSlot:
    """One weight of the fused kernel: made from parameter ``param`` (None: a constant
    zero) by ``to_fused``; its gradient goes back through ``to_param``."""

    shape: tuple[int, ...]
    param: int | None
    to_fused: Callable[[Tensor], Tensor] = lambda p: p
    to_param: Callable[[Tensor], Tensor] = lambda g: g


def _lstm_slots(v, first: int) -> list[WeightSlot]:
    """``lstm`` (Levy et al. eqs 2-7, optionally projected): our weight_ih, weight_hh, bias
    (3H without a content bias), weight_hr -> w_ih, w_hh, b_ih, b_hh (zero), w_hr."""
    H = v.hidden_size
    nb = v.bias.shape[0]

    def bias(p: Tensor) -> Tensor:
        return _swap_last_blocks(p if nb == 4 * H else torch.cat([p, p.new_zeros(4 * H - nb)]))

    swap = _swap_last_blocks
    slots = [WeightSlot(tuple(v.weight_ih.shape), first, swap, swap),
             WeightSlot(tuple(v.weight_hh.shape), first + 1, swap, swap),
             WeightSlot((4 * H,), first + 2, bias, lambda g: swap(g)[:nb]),
             WeightSlot((4 * H,), None)]
    if v.weight_hr is not None:
        slots.append(WeightSlot(tuple(v.weight_hr.shape), first + 3))
    return slots


def _rnn_slots(v, first: int) -> list[WeightSlot]:
    """``lstm-gates`` (eq 1): torch.nn.RNN(tanh) with our bias as b_ih (and none without)."""
    slots = [WeightSlot(tuple(v.weight_ih.shape), first),
             WeightSlot(tuple(v.weight_hh.shape), first + 1)]
    if v.bias is not None:
        slots += [WeightSlot(tuple(v.bias.shape), first + 2),
                  WeightSlot(tuple(v.bias.shape), None)]
    return slots


def _gru_slots(v, first: int) -> list[WeightSlot]:
    """The GRU with ``reset_after``: the update gate's rows negated, b_hh = [0; 0; ours]."""
    H = v.hidden_size

    def neg_z(w: Tensor) -> Tensor:  # torch's update gate is 1 - ours: sigma(-a) = 1 - sigma(a)
        return torch.cat([w[:H], -w[H:2 * H], w[2 * H:]])

    return [WeightSlot(tuple(v.weight_ih.shape), first, neg_z, neg_z),
            WeightSlot(tuple(v.weight_hh.shape), first + 1, neg_z, neg_z),
            WeightSlot((3 * H,), first + 2, neg_z, neg_z),
            WeightSlot((3 * H,), first + 3, lambda p: torch.cat([p.new_zeros(2 * H), p]),
                 lambda g: g[2 * H:])]


#: kind -> (the cell's parameters the fused kernel reads, their slots, cuDNN's mode name)
KINDS = {
    "lstm": (lambda v: [v.weight_ih, v.weight_hh, v.bias] + ([v.weight_hr] if v.weight_hr
                                                              is not None else []),
             _lstm_slots, "LSTM"),
    "rnn": (lambda v: [v.weight_ih, v.weight_hh] + ([v.bias] if v.bias is not None else []),
            _rnn_slots, "RNN_TANH"),
    "gru": (lambda v: [v.weight_ih, v.weight_hh, v.bias, v.bias_hh], _gru_slots, "GRU"),
}


class FusedWeights:
    """The weights of one fused call (one cell, or every cell of a stacked encoder) in
    PyTorch's layout, kept between calls and remade when a parameter changed."""

    def __init__(self, slots: list[WeightSlot], flatten: Callable[[list[Tensor]], None] | None):
        self.slots, self.flatten = slots, flatten
        self.n_params = 1 + max(s.param for s in slots if s.param is not None)
        self.weights: list[Tensor] | None = None
        self.stamp: tuple | None = None
        self.remade = 0  # how often the weights were (re)made: tests, diagnostics

    @staticmethod
    def stamp_of(params: list[Tensor]) -> tuple:
        """What identifies the parameters' current values: storage, version, dtype."""
        return tuple((p.data_ptr(), p._version, p.dtype, p.device) for p in params)

    def get(self, params: list[Tensor]) -> list[Tensor]:
        stamp = self.stamp_of(params)
        if stamp != self.stamp:
            like = params[0]
            with torch.no_grad():  # new tensors: a backward still to come keeps the old ones
                ws = [like.new_zeros(s.shape) if s.param is None else
                      s.to_fused(params[s.param]).contiguous().clone() for s in self.slots]
                if self.flatten is not None:
                    self.flatten(ws)  # one flat buffer in cuDNN's layout (in place)
            self.weights, self.stamp = ws, stamp
            self.remade += 1
        return self.weights


class ToFused(torch.autograd.Function):
    """Our parameters -> the kept fused weights (fresh views, so autograd sees new tensors
    every call); backward maps each weight's gradient onto its parameter."""

    @staticmethod
    def forward(ctx, kept: FusedWeights, *params):
        ctx.slots, ctx.n = kept.slots, len(params)
        return tuple(w.view_as(w) for w in kept.get(list(params)))

    @staticmethod
    def backward(ctx, *grads):
        out: list[Tensor | None] = [None] * ctx.n
        for s, g in zip(ctx.slots, grads):
            if s.param is not None and g is not None:
                out[s.param] = s.to_param(g)
        return (None, *out)


#: id(owner) -> (a weak reference to the owner, its kept weights); an entry goes with its owner
_kept: dict[int, tuple[weakref.ref, FusedWeights]] = {}


def kept_for(owner) -> FusedWeights | None:
    """The weights kept for ``owner`` (a cell's weight_ih, or an encoder), if any."""
    entry = _kept.get(id(owner))
    return entry[1] if entry is not None and entry[0]() is owner else None


def _keep(owner, kept: FusedWeights) -> None:
    key = id(owner)
    _kept[key] = (weakref.ref(owner, lambda _ref, key=key: _kept.pop(key, None)), kept)


def _cudnn_flatten(kind: str, input_size: int, hidden: int, proj: int, layers: int,
                   bidirectional: bool, n_per_cell: int):
    """A flatten function for ``FusedWeights`` (cuDNN's own layout), or None off CUDA."""
    def flatten(ws: list[Tensor]) -> None:
        w0 = ws[0]
        if not (w0.is_cuda and torch.backends.cudnn.is_acceptable(w0)
                and torch._use_cudnn_rnn_flatten_weight()):
            return
        from torch.backends.cudnn import rnn

        with torch.cuda.device_of(w0):
            torch._cudnn_rnn_flatten_weight(ws, n_per_cell, input_size,
                                            rnn.get_cudnn_mode(KINDS[kind][2]), hidden, proj,
                                            layers, False, bidirectional)
    return flatten


def fused_weights(kind: str, views: list, owner, input_size: int, bidirectional: bool = False
                  ) -> list[Tensor]:
    """The fused kernel's weights for ``views`` (the cells' views, layer-major), kept per
    ``owner`` (the first cell's weight_ih, or the encoder), through :class:`ToFused`."""
    params_of, slots_of, _ = KINDS[kind]
    per_view = [params_of(v) for v in views]
    params = [p for ps in per_view for p in ps]
    kept = kept_for(owner)
    if kept is None or kept.n_params != len(params):  # the slots are made once per owner
        slots: list[WeightSlot] = []
        first = 0  # the index of the view's first parameter in ``params``
        for v, ps in zip(views, per_view):
            slots += slots_of(v, first)
            first += len(ps)
        n_per_cell = len(slots) // len(views)
        v0 = views[0]
        kept = FusedWeights(slots, _cudnn_flatten(kind, input_size, v0.hidden_size,
                                                  getattr(v0, "proj_size", 0) or 0,
                                                  len(views) // (2 if bidirectional else 1),
                                                  bidirectional, n_per_cell))
        _keep(owner, kept)
    return list(ToFused.apply(kept, *params))


# ---------------------------------------------------------------------------------------
# the calls
# ---------------------------------------------------------------------------------------

@contextmanager
def _quiet(x: Tensor) -> Iterator[None]:
    """Off cuDNN's flat layout (another dtype, cuDNN off) cuDNN warns at every call that
    the weights are not one flat buffer; nothing to act on here."""
    if not x.is_cuda:
        yield
        return
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*contiguous chunk of memory.*")
        yield


_FNS = {"lstm": lambda: torch._VF.lstm, "rnn": lambda: torch._VF.rnn_tanh,
        "gru": lambda: torch._VF.gru}


def _run_vf(kind: str, x: Tensor, hx, weights: list[Tensor], has_biases: bool,
            lengths: Tensor | None, layers: int = 1, bidirectional: bool = False):
    """Call a ``torch._VF`` RNN, padded or packed; returns (outputs, *final states)."""
    fn = _FNS[kind]()
    grad = torch.is_grad_enabled()
    with _quiet(x):
        if lengths is None:
            return fn(x, hx, weights, has_biases, layers, 0.0, grad, bidirectional, False)
        from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

        packed = pack_padded_sequence(x, lengths.cpu(), enforce_sorted=False)
        idx = packed.sorted_indices
        hx_sorted = tuple(h.index_select(1, idx) for h in hx) if isinstance(hx, tuple) \
            else hx.index_select(1, idx)
        res = fn(packed.data, packed.batch_sizes, hx_sorted, weights, has_biases, layers, 0.0,
                 grad, bidirectional)
    out = type(packed)(res[0], packed.batch_sizes, packed.sorted_indices, packed.unsorted_indices)
    out, _ = pad_packed_sequence(out, total_length=x.shape[0])
    inv = packed.unsorted_indices
    return (out,) + tuple(s.index_select(1, inv) for s in res[1:])


def _has_biases(kind: str, v) -> bool:
    return kind != "rnn" or v.bias is not None


def _weights(kind: str, v, owner, input_size: int) -> list[Tensor]:
    """The fused kernel's weights of one cell: its own parameters where they live in cuDNN's
    layout (``torch_weights``: read in place, nothing made per call), else kept re-laid out
    (:func:`fused_weights`)."""
    ws = getattr(v, "torch_weights", None)
    return list(ws) if ws is not None else fused_weights(kind, [v], owner, input_size)


def torch_lstm(v, x: Tensor, state: State, lengths: Tensor | None) -> tuple[Tensor, State]:
    """Levy et al. eqs 2-7 (and a projection) as torch.nn.LSTM computes them."""
    h0, c0 = state
    ws = _weights("lstm", v, v.weight_ih, v.input_size)
    # (under autocast c_0 may come in float32: cuDNN takes h and c in one dtype)
    out, hn, cn = _run_vf("lstm", x, (h0.unsqueeze(0), c0.to(h0.dtype).unsqueeze(0)), ws, True,
                          lengths)
    return out, (hn[0], cn[0])


def torch_rnn(v, x: Tensor, state: State, lengths: Tensor | None) -> tuple[Tensor, State]:
    """Levy et al. eq 1 (the S-RNN, ``lstm-gates``) as torch.nn.RNN(tanh) computes it."""
    ws = _weights("rnn", v, v.weight_ih, v.input_size)
    out, hn = _run_vf("rnn", x, state[0].unsqueeze(0), ws, _has_biases("rnn", v), lengths)
    return out, (hn[0],)


def torch_gru(v, x: Tensor, h0: Tensor, lengths: Tensor | None) -> tuple[Tensor, State]:
    """Neubig eqs 56-59 with ``reset_after`` as torch.nn.GRU computes them."""
    ws = fused_weights("gru", [v], v.weight_ih, v.input_size)
    out, hn = _run_vf("gru", x, h0.unsqueeze(0), ws, True, lengths)
    return out, (hn[0],)


# ---------------------------------------------------------------------------------------
# a whole stacked encoder in one call
# ---------------------------------------------------------------------------------------

def stackable(encoder, masks) -> bool:
    """Do the encoder's options add nothing between its layers (so one fused call of all
    layers and directions computes it)?"""
    if encoder.residual or encoder.num_layers * encoder.num_directions < 2:
        return False
    if encoder.training and (encoder.dropout > 0 or encoder.recurrent_dropout > 0):
        return False
    return masks is None or all(m is None for m in (*masks.recurrent, *masks.between))


def stacked(family, kind: str, encoder, x: Tensor, lengths: Tensor | None,
            state: State | None, low: torch.dtype | None = None) -> tuple[Tensor, State]:
    """The whole encoder as one ``torch._VF`` call (x time-major); ``family``: the cells'
    kernel family (for their views); ``low``: the autocast dtype, which the input, the state
    and the weights are cast to (cuDNN's half-precision kernels; the caller turned autocast
    off)."""
    from ..interface import lowered

    views = [family.view(c) for c in encoder.cells()]
    if low is not None:
        views = [lowered(v, low) for v in views]
        x = x.to(low)
        state = None if state is None else tuple(s.to(low) for s in state)
    v0 = views[0]
    B = x.shape[1]
    n = len(views)
    own = [getattr(v, "torch_weights", None) for v in views]
    if all(w is not None for w in own):  # the cells' own buffers (cuDNN gathers them itself)
        ws = [w for cell_ws in own for w in cell_ws]
    else:
        ws = fused_weights(kind, views, encoder, encoder.input_size, encoder.bidirectional)
    if state is None:
        state = tuple(x.new_zeros(n, B, s) for s in v0.state_sizes)
    hx = state if kind == "lstm" else state[0]
    res = _run_vf(kind, x, hx, ws, _has_biases(kind, v0), lengths, encoder.num_layers,
                  encoder.bidirectional)
    return res[0], tuple(res[1:])


class CudnnStack:
    """A kernel family's whole-encoder call (a mixin for ``interface.KernelFamily``):
    ``torch_kind(v, call)`` says which fused kernel a cell's call maps onto."""

    def torch_kind(self, v, call) -> str | None:
        raise NotImplementedError

    def stack_plan(self, encoder, masks=None, **call):
        """The ``torch-*`` path (a ``KernelPath``) of a whole-encoder call, or None."""
        from ..call import Call

        c = Call.of(**call)
        v = self.view(encoder.layers[0][0])
        path = self._plan(v, c)
        if c.device_type != "cuda" or c.mask == "prefix0" or not stackable(encoder, masks):
            return None
        kind = self.torch_kind(v, c)
        return path if kind is not None and path.torch_kind == kind else None

    def stack(self, encoder, x, lengths, state, masks):
        if x.device.type != "cuda":
            return None
        from ..interface import autocast_dtype, note_path, recoverable, report_failure

        mask = "none" if lengths is None else (
            "prefix0" if bool((lengths == 0).any()) else "prefix")
        low = autocast_dtype(x)
        path = self.stack_plan(encoder, masks, device_type="cuda", dtype=low or x.dtype,
                               mask=mask, autocast=low is not None, batch=x.shape[1])
        if path is None:
            return None
        if low is None:
            result = stacked(self, path.torch_kind, encoder, x, lengths, state)
        else:  # cuDNN's half-precision kernels: a GPU path that may fail (interface.guarded)
            try:
                with torch.autocast("cuda", enabled=False):
                    result = stacked(self, path.torch_kind, encoder, x, lengths, state, low)
            except Exception as err:  # noqa: BLE001  (the layers then run one by one)
                if not recoverable(err):
                    raise
                report_failure(self.name, path, err)
                return None
        for cell in encoder.cells():
            note_path(cell, path)
        return result
