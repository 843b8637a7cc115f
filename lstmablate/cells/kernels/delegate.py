"""Delegation to PyTorch's own fused kernels: ``torch._VF.lstm``, ``rnn_tanh`` and ``gru``
(cuDNN on CUDA; oneDNN or ATen on CPU).

``lstm`` (``lstm-gates``, the GRU with ``reset_after``) computes exactly what
``torch.nn.LSTM`` (``RNN``, ``GRU``) computes, up to the parameter layout:

* our LSTM row blocks i, f, o, g are swapped to PyTorch's i, f, g, o by a small autograd
  function (one concatenation each way: :class:`PermuteBlocks`), our single bias becomes
  ``bias_ih`` and ``bias_hh`` is a constant zero, so every gradient lands on our own
  parameters;
* the GRU's update gate is ours negated: torch.nn.GRU writes h_t = (1 - z'_t) h~_t +
  z'_t h_{t-1}, i.e. z'_t = 1 - z_t = sigma(-a_z) (Neubig eq 59 vs PyTorch's docs);
* variable lengths become a packed sequence (a length of 0 cannot be packed: the dispatch
  sends such calls to our kernels).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor

State = tuple[Tensor, ...]


class PermuteBlocks(torch.autograd.Function):
    """Swap the last two H-row blocks of a 4-block weight or bias (ours i, f, o, g <->
    PyTorch's i, f, g, o): one concatenation forward, the same one backward."""

    @staticmethod
    def _swap(w: Tensor) -> Tensor:
        n = w.shape[0] // 4
        return torch.cat([w[:2 * n], w[3 * n:], w[2 * n:3 * n]])

    @staticmethod
    def forward(ctx, w: Tensor) -> Tensor:
        return PermuteBlocks._swap(w)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        return PermuteBlocks._swap(grad)


def _lstm_weights(cell) -> list[Tensor]:
    H = cell.hidden_size
    w_ih = PermuteBlocks.apply(cell.weight_ih)
    w_hh = PermuteBlocks.apply(cell.weight_hh)
    b = cell.bias
    if b.shape[0] == 3 * H:  # content_bias=False: b_i, b_f, b_o and no b_g
        b = torch.cat([b, b.new_zeros(H)])
    b_ih = PermuteBlocks.apply(b)
    ws = [w_ih, w_hh, b_ih, b_ih.new_zeros(4 * H).detach()]
    if cell.weight_hr is not None:
        ws.append(cell.weight_hr)
    return ws


@contextmanager
def _quiet(x: Tensor) -> Iterator[None]:
    """cuDNN warns that our (freshly permuted) weights are not one flat buffer; they never are."""
    if not x.is_cuda:
        yield
        return
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*contiguous chunk of memory.*")
        yield


def _run_vf(fn, x: Tensor, hx, weights: list[Tensor], has_biases: bool,
            lengths: Tensor | None):
    """Call a ``torch._VF`` RNN (one layer, one direction), padded or packed."""
    with _quiet(x):
        if lengths is None:
            return fn(x, hx, weights, has_biases, 1, 0.0, torch.is_grad_enabled(), False, False)
        from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

        packed = pack_padded_sequence(x, lengths.cpu(), enforce_sorted=False)
        idx = packed.sorted_indices
        hx_sorted = tuple(h.index_select(1, idx) for h in hx) if isinstance(hx, tuple) \
            else hx.index_select(1, idx)
        res = fn(packed.data, packed.batch_sizes, hx_sorted, weights, has_biases, 1, 0.0,
                 torch.is_grad_enabled(), False)
    out = type(packed)(res[0], packed.batch_sizes, packed.sorted_indices, packed.unsorted_indices)
    out, _ = pad_packed_sequence(out, total_length=x.shape[0])
    inv = packed.unsorted_indices
    return (out,) + tuple(s.index_select(1, inv) for s in res[1:])


def torch_lstm(cell, x: Tensor, state: State, lengths: Tensor | None) -> tuple[Tensor, State]:
    """Levy et al. eqs 2-7 (and a projection) as torch.nn.LSTM computes them."""
    h0, c0 = state
    out, hn, cn = _run_vf(torch._VF.lstm, x, (h0.unsqueeze(0), c0.unsqueeze(0)),
                          _lstm_weights(cell), True, lengths)
    return out, (hn[0], cn[0])


def torch_rnn(cell, x: Tensor, state: State, lengths: Tensor | None) -> tuple[Tensor, State]:
    """Levy et al. eq 1 (the S-RNN, ``lstm-gates``) as torch.nn.RNN(tanh) computes it."""
    weights = [cell.weight_ih, cell.weight_hh]
    if cell.bias is not None:
        weights += [cell.bias, cell.bias.new_zeros(cell.bias.shape).detach()]
    out, hn = _run_vf(torch._VF.rnn_tanh, x, state[0].unsqueeze(0), weights,
                      cell.bias is not None, lengths)
    return out, (hn[0],)


def torch_gru(cell, x: Tensor, h0: Tensor, lengths: Tensor | None) -> tuple[Tensor, State]:
    """Neubig eqs 56-59 with ``reset_after`` as torch.nn.GRU computes them."""
    H = cell.hidden_size

    def neg_z(w: Tensor) -> Tensor:  # torch's update gate is 1 - ours: sigma(-a) = 1 - sigma(a)
        return torch.cat([w[:H], -w[H:2 * H], w[2 * H:]])

    b_hh = torch.cat([cell.bias_hh.new_zeros(2 * H), cell.bias_hh])
    weights = [neg_z(cell.weight_ih), neg_z(cell.weight_hh), neg_z(cell.bias), b_hh]
    out, hn = _run_vf(torch._VF.gru, x, h0.unsqueeze(0), weights, True, lengths)
    return out, (hn[0],)
