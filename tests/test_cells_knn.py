"""The recurrent kernel network (Lei et al. 2017a, adaptive decay, the authors' n = 1 form)
against its equations, its highway connection, and what it equals: ``ran`` with the input gate
tied to 1 - λ."""

from __future__ import annotations

import pytest
import torch

from cell_checks import assert_step_matches
from lstmablate.cells import build_encoder, get_cell
from lstmablate.errors import ConfigError

F64 = torch.float64
sig, tanh = torch.sigmoid, torch.tanh


def knn_reference(cell, x, state):
    H = cell.hidden_size
    W_lx, W_c = cell.weight_ih[:2 * H].split(H)
    h_prev, c_prev = state
    lam = sig(x @ W_lx.T + h_prev @ cell.weight_hh.T + cell.bias[:H])  # adaptive decay
    c = lam * c_prev + (1 - lam) * (x @ W_c.T)
    h = tanh(c) if cell.activation == "tanh" else c
    if cell.highway:
        t = sig(x @ cell.weight_ih[2 * H:].T + cell.bias[H:])
        h = t * h + (1 - t) * x
    return h, (h, c)


CASES = [{}, {"activation": "identity"}, {"highway": True},
         {"highway": True, "activation": "identity"}]


@pytest.mark.parametrize("opts", CASES, ids=["default", "identity", "highway", "highway-identity"])
def test_single_step_matches_the_equations(opts):
    torch.manual_seed(0)
    assert_step_matches(get_cell("knn-rnn").build(4, 4, **opts).double(), knn_reference)


@pytest.mark.parametrize("activation", ["tanh", "identity"])
def test_is_ran_with_the_input_gate_tied(activation):
    """σ(-a) = 1 - σ(a): a ran whose input gate has the negated decay parameters computes
    c_t = λ_t ∘ c_{t-1} + (1 - λ_t) ∘ W_c x_t, the kernel network's memory."""
    torch.manual_seed(1)
    opts = dict(num_layers=2, bidirectional=True, activation=activation)
    knn = build_encoder("knn-rnn", 3, 4, **opts).double()
    ran = build_encoder("ran", 3, 4, **opts).double()
    H = 4
    with torch.no_grad():
        for k, r in zip(knn.cells(), ran.cells()):
            W_l, W_c = k.weight_ih.split(H)
            r.weight_ih.copy_(torch.cat([-W_l, W_l, W_c]))  # i: -λ's, f: λ's, content
            r.weight_hh.copy_(torch.cat([-k.weight_hh, k.weight_hh]))
            r.bias.copy_(torch.cat([-k.bias, k.bias]))
    x = torch.randn(3, 5, 3, dtype=F64)
    lengths = torch.tensor([5, 3, 1])
    out_k, st_k = knn(x, lengths)
    out_r, st_r = ran(x, lengths)
    torch.testing.assert_close(out_k, out_r, atol=1e-12, rtol=1e-10)
    for a, b in zip(st_k, st_r):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)


def test_highway_needs_equal_sizes_and_options_are_counted():
    with pytest.raises(ConfigError, match="input 3 and hidden 4.*highway: false"):
        build_encoder("knn-rnn", 3, 4, highway=True)
    build_encoder("knn-rnn", 4, 4, num_layers=2, highway=True)  # every layer reads 4
    H, I = 4, 3
    assert sum(p.numel() for p in get_cell("knn-rnn").build(I, H).parameters()) \
        == 2 * H * I + H * H + H
    assert sum(p.numel() for p in get_cell("knn-rnn").build(H, H, highway=True).parameters()) \
        == 3 * H * H + H * H + 2 * H
