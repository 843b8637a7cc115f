"""minGRU and minLSTM (Feng et al. 2024) against their equations; the positive-output g(x) of
the log-space form, and that a log-space parallel scan computes what the sequential reference
does; the weights of the weighted-sum view as an average."""

from __future__ import annotations

import pytest
import torch

from lstmablate.cells import build_encoder, get_cell
from lstmablate.cells.minrnn import positive
from lstmablate.errors import ConfigError

F64 = torch.float64
sig = torch.sigmoid


def g_reference(v: float) -> float:
    return v + 0.5 if v >= 0 else 1 / (1 + torch.exp(torch.tensor(-v, dtype=F64)).item())


def min_reference(cell, x, h_prev):
    """§3.1 / §3.2 literally, one Linear per term."""
    H = cell.hidden_size
    Ws, bs = cell.weight_ih.split(H), cell.bias.split(H)
    lin = [x @ W.T + b for W, b in zip(Ws, bs)]
    content = positive(lin[-1]) if cell.positive_content else lin[-1]
    if len(lin) == 2:  # minGRU
        z = sig(lin[0])
        return (1 - z) * h_prev + z * content
    f, i = sig(lin[0]), sig(lin[1])  # minLSTM
    return f / (f + i) * h_prev + i / (f + i) * content


@pytest.mark.parametrize("name", ["mingru", "minlstm"])
@pytest.mark.parametrize("positive_content", [False, True])
def test_steps_match_the_equations(name, positive_content):
    torch.manual_seed(0)
    cell = get_cell(name).build(3, 4, positive_content=positive_content).double()
    x = torch.randn(5, 2, 3, dtype=F64)
    h = torch.randn(2, 4, dtype=F64)
    out, (final,) = cell(x, (h,))
    for t in range(5):
        h = min_reference(cell, x[t], h)
        torch.testing.assert_close(out[t], h, atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(final, h, atol=1e-12, rtol=1e-10)


def test_the_positive_activation():
    v = torch.tensor([-30.0, -2.0, -1e-9, 0.0, 1e-9, 0.7, 40.0], dtype=F64)
    got = positive(v)
    assert torch.all(got > 0)
    assert got.tolist() == pytest.approx([g_reference(a) for a in v.tolist()], abs=1e-15)
    assert positive(torch.tensor(0.0)).item() == 0.5 == sig(torch.tensor(0.0)).item()


@pytest.mark.parametrize("name", ["mingru", "minlstm"])
def test_a_log_space_parallel_scan_computes_the_sequential_form(name):
    """With positive contents and h_0 > 0: log h_t = a*_t + logcumsumexp_j(log b_j - a*_j) with
    a*_t = Σ_{k<=t} log keep_k and b_j = write_j ∘ content_j (h_0 as the term j = 0), the log-space
    form the paper trains with; it equals the sequential reference."""
    torch.manual_seed(1)
    cell = get_cell(name).build(3, 4, positive_content=True).double()
    x = torch.randn(9, 2, 3, dtype=F64)
    h0 = torch.rand(2, 4, dtype=F64) + 0.1
    out, _ = cell(x, (h0,))
    terms = cell.scan_inputs(x)
    log_a = torch.cumsum(torch.log(terms["keep"]), 0)
    log_b = torch.log(terms["write"]) + torch.log(terms["content"])
    a_star = torch.cat([torch.zeros(1, 2, 4, dtype=F64), log_a])
    log_terms = torch.cat([torch.log(h0).unsqueeze(0), log_b]) - a_star
    log_h = a_star + torch.logcumsumexp(log_terms, dim=0)
    torch.testing.assert_close(torch.exp(log_h[1:]), out, atol=1e-12, rtol=1e-10)
    assert torch.all(out > 0)


@pytest.mark.parametrize("name", ["mingru", "minlstm"])
def test_weights_are_an_average_and_h_mask_changes_nothing(name):
    """Keep + write = 1 (minGRU) or f' + i' = 1 (minLSTM): each step's weights sum to at most 1;
    no product reads h_{t-1}, so a recurrent-dropout mask has nothing to multiply."""
    torch.manual_seed(2)
    enc = build_encoder(name, 3, 4, num_layers=2, bidirectional=True).double()
    w = enc.weighted_sum(torch.randn(2, 6, 3, dtype=F64))
    for layer in w:
        for view in layer:
            assert torch.all(view["weights"] >= 0)
            assert torch.all(view["weights"].sum(2) <= 1 + 1e-12)
    cell = enc.layers[0][0]
    x, h = torch.randn(1, 2, 3, dtype=F64), torch.randn(2, 4, dtype=F64)
    mask = torch.tensor([[2.0, 0, 2, 0], [0, 2, 2, 0]], dtype=F64)
    torch.testing.assert_close(cell(x, (h,), None, mask)[0], cell(x, (h,))[0], atol=0, rtol=0)


def test_parameters_and_options():
    H, I = 4, 3
    assert sum(p.numel() for p in get_cell("mingru").build(I, H).parameters()) == 2 * H * (I + 1)
    assert sum(p.numel() for p in get_cell("minlstm").build(I, H).parameters()) == 3 * H * (I + 1)
    cell = get_cell("mingru").build(I, H, forget_bias=2.0, init_scale=0.0)
    assert cell.bias[:H].tolist() == [-2.0] * H  # keep = σ(-b_z) = σ(2)
    with pytest.raises(ConfigError, match="forget_bias"):  # minLSTM's keep is f / (f + i)
        build_encoder("minlstm", I, H, forget_bias=1.0)


def test_gates_that_both_underflow_stay_finite():
    """f_t = σ(-1000) and i_t = σ(-1000) are 0 in floating point; their normalised values are
    still 1/2 each (f'_t = i'_t), never 0/0: padding with large values cannot turn into NaN."""
    cell = get_cell("minlstm").build(1, 2, init_scale=0.0)
    with torch.no_grad():
        cell.bias[:4].fill_(-1000.0)  # b_f, b_i
        cell.bias[4:].fill_(3.0)  # the content
    out, _ = cell(torch.zeros(2, 1, 1), (torch.ones(1, 2),))
    torch.testing.assert_close(out[:, 0], torch.tensor([[2.0, 2.0], [2.5, 2.5]]))
