"""The recurrent additive network (Lee, Levy & Zettlemoyer 2017) against its equations, and
the ablation each reading equals: ``ran`` with g = tanh is ``lstm-srnn-out``, numerically; with
g = identity it is none."""

from __future__ import annotations

import math

import pytest
import torch

from cell_checks import assert_step_matches
from lstmablate.cells import build_encoder, get_cell

F64 = torch.float64
sig, tanh = torch.sigmoid, torch.tanh


def ran_reference(cell, x, state):
    """§2 literally, one matrix per gate: c~ = W_cx x, i, f = σ(W_h h' + W_x x + b),
    c = i ∘ c~ + f ∘ c', h = g(c)."""
    H = cell.hidden_size
    W_ix, W_fx, W_cx = cell.weight_ih.split(H)
    W_ih, W_fh = cell.weight_hh.split(H)
    b_i, b_f = cell.bias.split(H)
    h_prev, c_prev = state
    i = sig(h_prev @ W_ih.T + x @ W_ix.T + b_i)
    f = sig(h_prev @ W_fh.T + x @ W_fx.T + b_f)
    c = i * (x @ W_cx.T) + f * c_prev
    h = tanh(c) if cell.activation == "tanh" else c
    return h, (h, c)


@pytest.mark.parametrize("activation", ["tanh", "identity"])
def test_single_step_matches_the_equations(activation):
    torch.manual_seed(0)
    assert_step_matches(get_cell("ran").build(3, 4, activation=activation).double(), ran_reference)


@pytest.mark.parametrize("activation", ["tanh", "identity"])
def test_two_steps_by_hand(activation):
    """H = I = 1 from h_0 = c_0 = 0: W_ix = 1, W_fx = -1, W_cx = 2, W_ih = 0.5, W_fh = 0.25,
    b_i = 0, b_f = 0.5; x = (1, -1).  Worked out on paper from §2."""
    cell = get_cell("ran").build(1, 1, activation=activation).double()
    with torch.no_grad():
        cell.weight_ih.copy_(torch.tensor([[1.0], [-1.0], [2.0]], dtype=F64))
        cell.weight_hh.copy_(torch.tensor([[0.5], [0.25]], dtype=F64))
        cell.bias.copy_(torch.tensor([0.0, 0.5], dtype=F64))
    s = lambda v: 1 / (1 + math.exp(-v))  # noqa: E731
    g = math.tanh if activation == "tanh" else (lambda v: v)
    c1 = s(1.0) * 2.0  # f_1 ∘ c_0 = 0
    h1 = g(c1)
    c2 = s(0.5 * h1 - 1.0) * -2.0 + s(0.25 * h1 + 1.0 + 0.5) * c1
    out, (h, c) = cell(torch.tensor([[[1.0]], [[-1.0]]], dtype=F64))
    assert out[:, 0, 0].tolist() == pytest.approx([h1, g(c2)], abs=1e-12)
    assert c.item() == pytest.approx(c2, abs=1e-12)


@pytest.mark.parametrize("recurrent_dropout", [0.0, 0.3])
def test_ran_is_lstm_minus_srnn_minus_out(recurrent_dropout):
    """Same parameters, same outputs: two layers, both directions, a padded batch, with and
    without (the same) recurrent-dropout masks, and the same gradients."""
    torch.manual_seed(1)
    opts = dict(num_layers=2, bidirectional=True, recurrent_dropout=recurrent_dropout)
    ran = build_encoder("ran", 3, 4, **opts).double().train()
    ablation = build_encoder("lstm-srnn-out", 3, 4, **opts).double().train()
    assert ({n: p.shape for n, p in ran.named_parameters()}
            == {n: p.shape for n, p in ablation.named_parameters()})
    ablation.load_state_dict(ran.state_dict())
    x = torch.randn(3, 5, 3, dtype=F64)
    lengths = torch.tensor([5, 2, 4])
    masks = ran.sample_masks(3, like=x)
    out_r, st_r = ran(x, lengths, masks=masks)
    out_a, st_a = ablation(x, lengths, masks=masks)
    # (the ablation may run a fast kernel: float64 sums in another order, so 1e-10, not 1e-12)
    torch.testing.assert_close(out_r, out_a, atol=1e-10, rtol=1e-10)
    for a, b in zip(st_r, st_a):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)
    out_r.pow(2).sum().backward()
    out_a.pow(2).sum().backward()
    grads = dict(ablation.named_parameters())
    for n, p in ran.named_parameters():
        torch.testing.assert_close(p.grad, grads[n].grad, atol=1e-10, rtol=1e-10)


def test_the_identity_reading_is_no_ablation():
    """g = identity: h_t = c_t, so it differs from lstm-srnn-out (g = tanh) with the same
    parameters; tanh is the default reading."""
    torch.manual_seed(2)
    ident = build_encoder("ran", 3, 4, activation="identity").double()
    tanh_ = build_encoder("lstm-srnn-out", 3, 4).double()
    tanh_.load_state_dict(ident.state_dict())
    x = torch.randn(2, 4, 3, dtype=F64)
    out_i, (h, c) = ident(x)
    assert not torch.allclose(out_i, tanh_(x)[0])
    torch.testing.assert_close(h, c, atol=0, rtol=0)
    assert get_cell("ran").build(3, 4).activation == "tanh"
