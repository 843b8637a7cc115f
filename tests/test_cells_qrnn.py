"""The QRNN cell (Bradbury et al. 2017) against its equations: the three poolings, the masked
convolution of width 2 (no look-ahead, no leak across padding in either direction, continued
across chunks and through the step API), zoneout, and the options' checks."""

from __future__ import annotations

import math

import pytest
import torch

from cell_checks import assert_runs_alone
from cli_in_process import expect_error, run_cli
from lstmablate.cells import build_encoder, get_cell
from lstmablate.errors import ConfigError

F64 = torch.float64
sig, tanh = torch.sigmoid, torch.tanh
OPTIONS = [dict(gates=p, window=w) for p in ("f", "fo", "ifo") for w in (1, 2)]
IDS = [f"{o['gates']}-k{o['window']}" for o in OPTIONS]


def qrnn_reference(cell, x, c0):
    """Eqs 1-5 literally, one filter matrix per block and tap, x_{-1} = 0: (outputs, c_T)."""
    H = cell.hidden_size
    n = len(cell.blocks) * H
    W2 = dict(zip(cell.blocks, cell.weight_ih[:n].split(H)))  # taps on x_t
    W1 = dict(zip(cell.blocks, cell.weight_ih[n:].split(H))) if cell.window == 2 else {}
    b = dict(zip(cell.blocks, cell.bias.split(H)))

    def conv(g, t):  # (W_g ∗ X)_t: the masked convolution, no look-ahead
        out = x[t] @ W2[g].T + b[g]
        if cell.window == 2 and t > 0:
            out = out + x[t - 1] @ W1[g].T
        return out

    c, hs = c0, []
    for t in range(x.shape[0]):
        z, f = tanh(conv("z", t)), sig(conv("f", t))  # eq 1
        if cell.gates == "ifo":
            c = f * c + sig(conv("i", t)) * z  # eq 5
        else:
            c = f * c + (1 - f) * z  # eqs 3, 4
        hs.append(sig(conv("o", t)) * c if "o" in cell.blocks else c)  # eqs 4, 5 / eq 3
    return torch.stack(hs), c


def _cell(I=3, H=4, **opts):
    torch.manual_seed(0)
    return get_cell("qrnn").build(I, H, **opts).double()


@pytest.mark.parametrize("opts", OPTIONS, ids=IDS)
def test_a_sequence_matches_the_equations(opts):
    cell = _cell(**opts)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 2, 3, dtype=F64, generator=g)
    c0 = torch.randn(2, 4, dtype=F64, generator=g)
    state = (torch.zeros(2, 4, dtype=F64), c0) + cell.initial_state(2, x)[2:]
    out, final = cell(x, state)
    ref, c_ref = qrnn_reference(cell, x, c0)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(final[1], c_ref, atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(final[0], ref[-1], atol=1e-12, rtol=1e-10)
    assert cell.state_names == (("h", "c", "conv") if opts["window"] == 2 else ("h", "c"))


def test_fo_pooling_width_two_by_hand():
    """H = I = 1, numbers worked out on paper from eqs 2 and 4."""
    cell = get_cell("qrnn").build(1, 1, gates="fo", window=2).double()
    with torch.no_grad():  # rows: z, f, o on x_t, then z, f, o on x_{t-1}
        cell.weight_ih.copy_(torch.tensor([[0.5], [1.0], [-1.0], [2.0], [0.0], [0.5]]))
        cell.bias.copy_(torch.tensor([0.1, -0.2, 0.3], dtype=F64))
    s = lambda v: 1 / (1 + math.exp(-v))  # noqa: E731
    c1 = (1 - s(0.8)) * math.tanh(0.6)  # x_0 = 1, x_{-1} = 0
    h1 = s(-0.7) * c1
    c2 = s(-2.2) * c1 + (1 - s(-2.2)) * math.tanh(1.1)  # x_1 = -2, x_0 = 1
    h2 = s(2.8) * c2
    out, (h, c, conv) = cell(torch.tensor([[[1.0]], [[-2.0]]], dtype=F64))
    assert out[:, 0, 0].tolist() == pytest.approx([h1, h2], abs=1e-12)
    assert c.item() == pytest.approx(c2, abs=1e-12)
    assert conv[0].tolist() == pytest.approx([2.0 * -2.0, 0.0, 0.5 * -2.0])  # W^1 x_1


@pytest.mark.parametrize("window", [1, 2])
def test_no_look_ahead(window):
    """The masked convolution: changing later inputs never changes an earlier output."""
    torch.manual_seed(2)
    enc = build_encoder("qrnn", 3, 4, num_layers=2, window=window).double()
    x = torch.randn(1, 6, 3, dtype=F64)
    out, _ = enc(x)
    y = x.clone()
    y[:, 3:] = torch.randn(1, 3, 3, dtype=F64)
    out2, _ = enc(y)
    torch.testing.assert_close(out2[:, :3], out[:, :3], atol=0, rtol=0)
    assert not torch.allclose(out2[:, 3], out[:, 3])
    if window == 2:  # ... while the previous input does reach the next step
        z = x.clone()
        z[:, 2] += 1.0
        assert not torch.allclose(enc(z)[0][:, 3], out[:, 3])


@pytest.mark.parametrize("opts", OPTIONS, ids=IDS)
def test_padding_never_leaks_in_either_direction(opts):
    """A padded batch, both directions, two layers: each sequence's outputs and final states are
    those of running it alone, its padding gets no gradient, and the backward direction starts
    at each sequence's own last token with a zero previous input."""
    torch.manual_seed(3)
    enc = build_encoder("qrnn", 3, 4, num_layers=2, bidirectional=True, **opts).double()
    lengths = [5, 2, 1, 4]
    x = (torch.randn(4, 5, 3, dtype=F64) * 3).requires_grad_(True)
    assert_runs_alone(enc, x, lengths)
    one = build_encoder("qrnn", 3, 4, bidirectional=True, **opts).double()
    out1, _ = one(x.detach(), lengths=torch.tensor(lengths))
    for b, L in enumerate(lengths):  # the backward half, from the equations on x_L-1 .. x_0
        ref, _ = qrnn_reference(one.layers[0][1], x[b, :L].detach().flip(0).unsqueeze(1),
                                torch.zeros(1, 4, dtype=F64))
        torch.testing.assert_close(out1[b, :L, 4:], ref[:, 0].flip(0), atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("opts", OPTIONS, ids=IDS)
def test_chunks_and_steps_continue_the_convolution(opts):
    """Running in two chunks (TBPTT) and stepping one token at a time (decoders) both equal one
    call: the state carries W^1 x_{t-1} across the boundary."""
    torch.manual_seed(4)
    enc = build_encoder("qrnn", 3, 4, num_layers=2, **opts).double().eval()
    x = torch.randn(2, 7, 3, dtype=F64)
    out, fin = enc(x)
    out1, st = enc(x[:, :3])
    out2, fin2 = enc(x[:, 3:], state=st)
    torch.testing.assert_close(torch.cat([out1, out2], 1), out, atol=1e-12, rtol=1e-10)
    state, steps = None, []
    for t in range(7):
        o, state = enc.step(x[:, t], state)
        steps.append(o)
    torch.testing.assert_close(torch.stack(steps, 1), out, atol=1e-12, rtol=1e-10)
    for a, b, c in zip(fin, fin2, state):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)
        torch.testing.assert_close(a, c, atol=1e-12, rtol=1e-10)


def test_zoneout_keeps_memory_in_training_and_is_an_expectation_in_eval():
    """Eq 6: in training each unit at each step keeps its memory with probability p (f = 1);
    in evaluation the write weight 1 - f is scaled by 1 - p."""
    p = 0.4
    cell = _cell(zoneout=p)
    x = torch.randn(6, 3, 3, dtype=F64)
    plain = _cell()
    plain.load_state_dict(cell.state_dict())
    n = cell.bias.shape[0]
    pre = (x @ cell.weight_ih.t() + cell.bias)[..., :n].split(4, dim=-1)
    z, f, o = tanh(pre[0]), sig(pre[1]), sig(pre[2])

    def run(keep_factor):
        c, hs = torch.zeros(3, 4, dtype=F64), []
        for t in range(6):
            ft = 1 - keep_factor[t] * (1 - f[t])
            c = ft * c + (1 - ft) * z[t]
            hs.append(o[t] * c)
        return torch.stack(hs)

    cell.eval()
    torch.testing.assert_close(cell(x)[0], run(torch.full((6, 3, 4), 1 - p, dtype=F64)))
    cell.train()
    torch.manual_seed(7)
    out, _ = cell(x)
    torch.manual_seed(7)
    masks = torch.stack([torch.bernoulli(torch.full((3, 4), 1 - p, dtype=F64)) for _ in range(6)])
    assert 0 < masks.mean() < 1
    torch.testing.assert_close(out, run(masks))
    plain.train()  # without zoneout, training draws nothing
    torch.testing.assert_close(plain(x)[0], run(torch.ones(6, 3, 4, dtype=F64)))


def test_options_are_checked_and_counted():
    spec = get_cell("qrnn")
    for bad, fragment in (({"gates": "if"}, "takes one of f, fo, ifo, got 'if'"),
                          ({"window": 3}, "takes one of 1, 2, got 3"),
                          ({"zoneout": 1.5}, "in [0, 1]")):
        with pytest.raises(ConfigError, match=None) as err:
            spec.check_options(bad, where="model.cell_options")
        assert fragment in str(err.value) and "model.cell_options." in str(err.value)
    with pytest.raises(ConfigError, match=r"zoneout must be in \[0, 1\)"):
        build_encoder("qrnn", 3, 4, zoneout=1.0)
    with pytest.raises(ConfigError, match="window"):
        get_cell("qrnn").cls(3, 4, window=3)
    H, I = 4, 3
    for gates, blocks in (("f", 2), ("fo", 3), ("ifo", 4)):
        for window in (1, 2):
            cell = spec.build(I, H, gates=gates, window=window)
            assert sum(p.numel() for p in cell.parameters()) == blocks * H * (window * I + 1)
    cell = spec.build(I, H, forget_bias=2.0, init_scale=0.0)
    assert cell.bias.tolist() == [0.0] * H + [2.0] * H + [0.0] * H


def test_a_bad_option_is_refused_by_the_cli(tiny_recipe, tmp_path):
    r = run_cli("train", "--task", "dyck", "--recipe", str(tiny_recipe), "--cell", "qrnn",
                "--set", "model.cell_options={window: 3}", "--out", "runs", cwd=tmp_path)
    expect_error(r, "model.cell_options.window: cell 'qrnn' takes one of 1, 2, got 3")
    assert not (tmp_path / "runs").exists()
