"""The SRU (Lei et al. 2018, eqs 1-4) and its 2017 form against their equations: the v ∘ c_{t-1}
of the gates, the highway connection (with the authors' projection where the sizes differ), and
which of the two is a linear scan."""

from __future__ import annotations

import math

import pytest
import torch

from cell_checks import assert_step_matches
from lstmablate.cells import build_encoder, get_cell
from lstmablate.errors import ConfigError

F64 = torch.float64
sig, tanh = torch.sigmoid, torch.tanh


def sru_reference(cell, x, state):
    """Eqs 1-4 (2018) or the 2017 form, one matrix per term."""
    H = cell.hidden_size
    W, W_f, W_r = cell.weight_ih[:3 * H].split(H)
    b_f, b_r = cell.bias.split(H)
    c_prev = state[1]
    zf, zr = x @ W_f.T + b_f, x @ W_r.T + b_r
    if cell.weight_c is not None:
        v_f, v_r = cell.weight_c.split(H)
        zf, zr = zf + v_f * c_prev, zr + v_r * c_prev  # eqs 1, 3
    f, r = sig(zf), sig(zr)
    c = f * c_prev + (1 - f) * (x @ W.T)  # eq 2
    skip = x if cell.input_size == H else x @ cell.weight_ih[3 * H:].T
    g = tanh(c) if cell.activation == "tanh" else c
    h = r * g + (1 - r) * skip  # eq 4
    return h, (h, c)


CASES = [("sru", 4, {}), ("sru", 3, {}), ("sru-2017", 4, {}), ("sru-2017", 3, {}),
         ("sru", 4, {"activation": "tanh"}), ("sru-2017", 4, {"activation": "identity"})]


@pytest.mark.parametrize("name,I,opts", CASES,
                         ids=[f"{n}-I{i}-{'-'.join(o.values()) or 'default'}" for n, i, o in CASES])
def test_single_step_matches_the_equations(name, I, opts):
    torch.manual_seed(0)
    assert_step_matches(get_cell(name).build(I, 4, **opts).double(), sru_reference)


def test_sru_by_hand_scalar():
    """H = I = 1: W = 2, W_f = W_r = 0.5, b_f = b_r = 0.1, v_f = 1, v_r = -1, c' = 0.4, x = 1."""
    cell = get_cell("sru").build(1, 1).double()
    with torch.no_grad():
        cell.weight_ih.copy_(torch.tensor([[2.0], [0.5], [0.5]]))
        cell.bias.fill_(0.1)
        cell.weight_c.copy_(torch.tensor([1.0, -1.0]))
    s = lambda v: 1 / (1 + math.exp(-v))  # noqa: E731
    f, r = s(0.5 + 0.4 + 0.1), s(0.5 - 0.4 + 0.1)  # eqs 1, 3
    c = f * 0.4 + (1 - f) * 2.0  # eq 2
    h = r * c + (1 - r) * 1.0  # eq 4
    out, (hn, cn) = cell(torch.tensor([[[1.0]]], dtype=F64),
                         (torch.zeros(1, 1, dtype=F64), torch.tensor([[0.4]], dtype=F64)))
    assert (out.item(), cn.item()) == pytest.approx((h, c), abs=1e-12)


def test_versions_and_parameters():
    H = 5
    for name, I, count in (("sru", H, 3 * H * H + 4 * H), ("sru", 3, 4 * H * 3 + 4 * H),
                           ("sru-2017", H, 3 * H * H + 2 * H)):
        cell = get_cell(name).build(I, H)
        assert sum(p.numel() for p in cell.parameters()) == count, name
    assert get_cell("sru").build(3, 4).activation == "identity"  # eq 4 has no activation
    assert get_cell("sru-2017").build(3, 4).activation == "tanh"  # the 2017 code's use_tanh
    assert get_cell("sru").build(3, 4).linear_scan is False
    assert get_cell("sru-2017").build(3, 4).linear_scan is True
    with pytest.raises(TypeError, match="previous memory"):
        get_cell("sru").build(3, 4).scan_inputs(torch.zeros(2, 1, 3))
    with pytest.raises(ConfigError, match="fixes option"):
        build_encoder("sru", 3, 4, state_in_gates=False)
    with pytest.raises(ConfigError, match="takes one of identity, tanh"):
        get_cell("sru").check_options({"activation": "relu"})


def test_highway_carries_the_input_when_the_reset_gate_closes():
    """Eq 4 with r_t -> 0: h_t = x_t (I = H), or W_s x_t (the projection, I != H)."""
    x = torch.randn(2, 3, 4, dtype=F64)
    for I in (4, 3):
        enc = build_encoder("sru", I, 4, num_layers=1).double()
        H = 4
        with torch.no_grad():
            enc.layers[0][0].bias[H:].fill_(-200.0)  # b_r: r = σ(-200) = 0
        xin = x[..., :I]
        out, _ = enc(xin)
        skip = xin if I == H else xin @ enc.layers[0][0].weight_ih[3 * H:].T
        torch.testing.assert_close(out, skip, atol=1e-12, rtol=0)
