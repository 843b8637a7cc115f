"""`lstm` (and `gru` with reset_after) against PyTorch's own cells, in float64.

Weights are copied from ``torch.nn.LSTM`` / ``torch.nn.GRU`` into our encoder;
outputs, final states and every gradient (inputs, initial states, weights)
must agree to 1e-6, uni- and bidirectional, 2 layers, with variable lengths
(``pack_padded_sequence`` on the PyTorch side).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from lstmablate.cells import build_encoder

TOL = dict(atol=1e-6, rtol=1e-6)
I, H, T = 3, 4, 6
LENGTHS = [6, 2, 4]


def _lstm_rows(Hs: int, blocks=("i", "f", "g", "o")) -> torch.Tensor:
    """Row order i, f, g, o (torch) -> the cell's ``blocks`` (``lstm`` lives in cuDNN's
    layout, PyTorch's own order: the identity; the order before it was i, f, o, g)."""
    return torch.cat([torch.arange(Hs) + "ifgo".index(b) * Hs for b in blocks])


def _suffix(layer: int, d: int) -> str:
    return f"_l{layer}" + ("_reverse" if d else "")


def _copy_lstm(ref: nn.LSTM, enc) -> None:
    rows = _lstm_rows(H, enc.layers[0][0].blocks)
    with torch.no_grad():
        for layer in range(ref.num_layers):
            for d, cell in enumerate(enc.layers[layer]):
                sfx = _suffix(layer, d)
                cell.weight_ih.copy_(getattr(ref, "weight_ih" + sfx)[rows])
                cell.weight_hh.copy_(getattr(ref, "weight_hh" + sfx)[rows])
                cell.bias.copy_((getattr(ref, "bias_ih" + sfx) + getattr(ref, "bias_hh" + sfx))[rows])
                if ref.proj_size:
                    cell.weight_hr.copy_(getattr(ref, "weight_hr" + sfx))


def _run_both(ref, enc, x, lengths, state):
    """Forward both with the same data; return outputs, final states and a scalar loss each."""
    xr = x.clone().requires_grad_(True)
    xo = x.clone().requires_grad_(True)
    sr = tuple(s.clone().requires_grad_(True) for s in state)
    so = tuple(s.clone().requires_grad_(True) for s in state)
    packed = pack_padded_sequence(xr, torch.tensor(lengths), batch_first=True, enforce_sorted=False)
    out_r, st_r = ref(packed, sr if len(sr) > 1 else sr[0])
    out_r, _ = pad_packed_sequence(out_r, batch_first=True, total_length=x.shape[1])
    st_r = st_r if isinstance(st_r, tuple) else (st_r,)
    out_o, st_o = enc(xo, lengths=torch.tensor(lengths), state=so)
    g = torch.Generator().manual_seed(7)
    w_out = torch.randn(out_r.shape, generator=g, dtype=x.dtype)
    w_st = [torch.randn(s.shape, generator=g, dtype=x.dtype) for s in st_r]

    def loss(out, st):
        return (out * w_out).sum() + sum((s * w).sum() for s, w in zip(st, w_st))

    loss(out_r, st_r).backward()
    loss(out_o, st_o).backward()
    return (out_r, st_r, xr, sr), (out_o, st_o, xo, so)


@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("proj_size", [0, 3], ids=["noproj", "proj3"])
@pytest.mark.parametrize("lengths", [LENGTHS, [T, T, T]], ids=["varlen", "full"])
def test_lstm_matches_torch_lstm(bidirectional, proj_size, lengths):
    torch.manual_seed(0)
    ref = nn.LSTM(I, H, num_layers=2, bidirectional=bidirectional, batch_first=True,
                  proj_size=proj_size).double()
    enc = build_encoder("lstm", I, H, num_layers=2, bidirectional=bidirectional,
                        proj_size=proj_size).double()
    _copy_lstm(ref, enc)
    D = 2 if bidirectional else 1
    B = len(lengths)
    x = torch.randn(B, T, I, dtype=torch.float64)
    state = (torch.randn(2 * D, B, proj_size or H, dtype=torch.float64),
             torch.randn(2 * D, B, H, dtype=torch.float64))
    (out_r, st_r, xr, sr), (out_o, st_o, xo, so) = _run_both(ref, enc, x, lengths, state)

    torch.testing.assert_close(out_o, out_r, **TOL)
    for a, b in zip(st_o, st_r):
        torch.testing.assert_close(a, b, **TOL)
    torch.testing.assert_close(xo.grad, xr.grad, **TOL)
    for a, b in zip(so, sr):
        torch.testing.assert_close(a.grad, b.grad, **TOL)
    rows = _lstm_rows(H, enc.layers[0][0].blocks)
    for layer in range(2):
        for d, cell in enumerate(enc.layers[layer]):
            sfx = _suffix(layer, d)
            torch.testing.assert_close(cell.weight_ih.grad, getattr(ref, "weight_ih" + sfx).grad[rows], **TOL)
            torch.testing.assert_close(cell.weight_hh.grad, getattr(ref, "weight_hh" + sfx).grad[rows], **TOL)
            # b = b_ih + b_hh, so both torch biases get the gradient of ours
            torch.testing.assert_close(cell.bias.grad, getattr(ref, "bias_ih" + sfx).grad[rows], **TOL)
            torch.testing.assert_close(cell.bias.grad, getattr(ref, "bias_hh" + sfx).grad[rows], **TOL)
            if proj_size:
                torch.testing.assert_close(cell.weight_hr.grad, getattr(ref, "weight_hr" + sfx).grad, **TOL)


def test_lstm_parameter_count_matches_torch_up_to_the_second_bias():
    ref = nn.LSTM(650, 650)
    enc = build_encoder("lstm", 650, 650)
    n_ref = sum(p.numel() for p in ref.parameters())
    n_ours = sum(p.numel() for p in enc.parameters())
    assert n_ref - n_ours == 4 * 650  # torch keeps b_ih and b_hh; eq 2-6 have one bias


@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
def test_gru_reset_after_matches_torch_gru(bidirectional):
    """torch.nn.GRU: r, z', n with h = (1 - z') n + z' h_prev, i.e. our z = 1 - z'."""
    torch.manual_seed(1)
    ref = nn.GRU(I, H, num_layers=2, bidirectional=bidirectional, batch_first=True).double()
    enc = build_encoder("gru", I, H, num_layers=2, bidirectional=bidirectional,
                        reset_after=True).double()
    z = slice(H, 2 * H)
    with torch.no_grad():
        for layer in range(2):
            for d, cell in enumerate(enc.layers[layer]):
                sfx = _suffix(layer, d)
                w_ih, w_hh = getattr(ref, "weight_ih" + sfx).clone(), getattr(ref, "weight_hh" + sfx).clone()
                b_ih, b_hh = getattr(ref, "bias_ih" + sfx), getattr(ref, "bias_hh" + sfx)
                w_ih[z], w_hh[z] = -w_ih[z], -w_hh[z]  # sigma(-a) = 1 - sigma(a)
                cell.weight_ih.copy_(w_ih)
                cell.weight_hh.copy_(w_hh)
                b = torch.cat([b_ih[:H] + b_hh[:H], -(b_ih[z] + b_hh[z]), b_ih[2 * H:]])
                cell.bias.copy_(b)
                cell.bias_hh.copy_(b_hh[2 * H:])
    D = 2 if bidirectional else 1
    x = torch.randn(len(LENGTHS), T, I, dtype=torch.float64)
    state = (torch.randn(2 * D, len(LENGTHS), H, dtype=torch.float64),)
    (out_r, st_r, xr, sr), (out_o, st_o, xo, so) = _run_both(ref, enc, x, LENGTHS, state)
    torch.testing.assert_close(out_o, out_r, **TOL)
    torch.testing.assert_close(st_o[0], st_r[0], **TOL)
    torch.testing.assert_close(xo.grad, xr.grad, **TOL)
    torch.testing.assert_close(so[0].grad, sr[0].grad, **TOL)
    for layer in range(2):
        for d, cell in enumerate(enc.layers[layer]):
            sfx = _suffix(layer, d)
            sign = torch.ones(3 * H, 1, dtype=torch.float64)
            sign[z] = -1
            for w in ("weight_ih", "weight_hh"):
                torch.testing.assert_close(getattr(cell, w).grad, sign * getattr(ref, w + sfx).grad, **TOL)
            torch.testing.assert_close(cell.bias.grad, sign[:, 0] * getattr(ref, "bias_ih" + sfx).grad, **TOL)
            torch.testing.assert_close(cell.bias_hh.grad, getattr(ref, "bias_hh" + sfx).grad[2 * H:], **TOL)
