"""The encoder step API (decoders, beam search): stepping T times == one sequence call."""

from __future__ import annotations

import pytest
import torch

from lstmablate.cells import available_cells, build_encoder, get_cell
from lstmablate.errors import ConfigError

F64 = torch.float64


def _encoder(name: str, **opts):
    """A 2-layer unidirectional encoder of ``name`` (1 layer where the cell reads a fixed input
    size, e.g. dyck-rnn), float64."""
    spec = get_cell(name)
    I, H = getattr(spec.cls, "example_sizes", (2, 2))
    if (I, H) == (2, 2):
        I, H = 5, 6
    try:
        enc = build_encoder(name, I, H, num_layers=2, **opts)
    except ConfigError:
        enc = build_encoder(name, I, H, num_layers=1, **opts)
    return enc.to(F64), I


def _step_through(enc, x, state, masks):
    outs = []
    for t in range(x.shape[1]):
        o, state = enc.step(x[:, t], state, masks)
        outs.append(o)
    return torch.stack(outs, dim=1), state


CELLS = available_cells()


@pytest.mark.parametrize("name", CELLS)
@pytest.mark.parametrize("mode", ["eval", "recurrent-dropout", "variational"])
def test_step_equals_sequence(name, mode):
    opts = {}
    if mode == "recurrent-dropout":
        opts = {"recurrent_dropout": 0.4, "dropout": 0.0}
    elif mode == "variational":
        opts = {"recurrent_dropout": 0.3, "dropout": 0.5, "variational_dropout": True}
    torch.manual_seed(0)
    enc, I = _encoder(name, **opts)
    enc.train(mode != "eval")
    B, T = 3, 6
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(B, T, I, generator=gen, dtype=F64)
    state0 = tuple(0.5 * torch.randn(s.shape, generator=gen, dtype=F64)
                   for s in enc.initial_state(B, like=x))
    masks = enc.sample_masks(B, like=x)
    if mode != "eval":
        assert any(m is not None for m in masks.recurrent), "no mask was drawn"
        assert all(m is None or (m == 0).any() for m in masks.recurrent), "masks drop nothing"
    seq_out, seq_state = enc(x, state=state0, masks=masks)
    step_out, step_state = _step_through(enc, x, state0, masks)
    torch.testing.assert_close(step_out, seq_out, atol=1e-12, rtol=1e-12)
    assert len(step_state) == len(seq_state) == len(enc.state_names)
    for a, b in zip(step_state, seq_state):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)
    reads_h = all(getattr(c, "weight_hh", True) is not None for c in enc.cells())
    if mode != "eval" and reads_h:  # the masks mattered: other masks give other outputs
        other, _ = enc(x, state=state0, masks=enc.sample_masks(B, like=x))
        assert not torch.allclose(other, seq_out)


def test_step_gradients_equal_sequence_gradients():
    torch.manual_seed(0)
    enc, I = _encoder("lstm-srnn", recurrent_dropout=0.3)
    enc.train()
    x = torch.randn(2, 5, I, dtype=F64)
    masks = enc.sample_masks(2, like=x)
    grads = []
    for stepped in (False, True):
        enc.zero_grad()
        out, (h, c) = (_step_through(enc, x, None, masks) if stepped else enc(x, masks=masks))
        (out.pow(2).sum() + c.sum()).backward()
        grads.append({n: p.grad.clone() for n, p in enc.named_parameters()})
    for n in grads[0]:
        torch.testing.assert_close(grads[1][n], grads[0][n], atol=1e-10, rtol=1e-10)


def test_initial_state_layout_matches_forward():
    enc = build_encoder("lstm", 4, 7, num_layers=3, proj_size=3)
    st = enc.initial_state(5)
    _, fin = enc(torch.zeros(5, 2, 4))
    assert [s.shape for s in st] == [s.shape for s in fin] == [(3, 5, 3), (3, 5, 7)]
    assert all(not s.any() for s in st)


def test_reorder_state_picks_beam_rows():
    enc = build_encoder("lstm", 3, 4, num_layers=2)
    h = torch.arange(2 * 4 * 4, dtype=torch.float32).view(2, 4, 4)
    c = -h
    index = torch.tensor([2, 2, 0, 3])
    h2, c2 = enc.reorder_state((h, c), index)
    for row, src in enumerate(index.tolist()):
        assert torch.equal(h2[:, row], h[:, src]) and torch.equal(c2[:, row], c[:, src])


def test_beam_reorder_then_step_equals_stepping_the_chosen_rows():
    torch.manual_seed(0)
    enc = build_encoder("gru", 3, 4, num_layers=2).double().eval()
    x = torch.randn(4, 3, dtype=F64)
    _, st = enc.step(x, None)
    index = torch.tensor([1, 1, 3, 0])
    y = torch.randn(4, 3, dtype=F64)
    out, _ = enc.step(y, enc.reorder_state(st, index))
    ref, _ = enc.step(y, tuple(s[:, index] for s in st))
    torch.testing.assert_close(out, ref, atol=0, rtol=0)


def test_masks_reorder_with_the_beam():
    enc = build_encoder("lstm", 3, 4, recurrent_dropout=0.5)
    enc.train()
    masks = enc.sample_masks(4)
    picked = masks.reorder(torch.tensor([3, 0]))
    assert torch.equal(picked.recurrent[0], masks.recurrent[0][[3, 0]])


def test_bidirectional_encoder_refuses_to_step():
    enc = build_encoder("lstm", 3, 4, bidirectional=True)
    with pytest.raises(ConfigError, match="bidirectional"):
        enc.step(torch.zeros(2, 3), None)


def test_training_step_without_masks_is_refused():
    enc = build_encoder("lstm", 3, 4, recurrent_dropout=0.2)
    enc.train()
    with pytest.raises(ValueError, match="sample_masks"):
        enc.step(torch.zeros(2, 3), None)
    enc.eval()  # no dropout in eval mode: masks are not needed
    out, _ = enc.step(torch.zeros(2, 3), None)
    assert out.shape == (2, 4)


def test_eval_masks_are_empty():
    enc = build_encoder("lstm", 3, 4, num_layers=2, recurrent_dropout=0.2, dropout=0.5,
                        variational_dropout=True)
    enc.eval()
    m = enc.sample_masks(2)
    assert all(x is None for x in m.recurrent + m.between)


def test_variational_between_layer_dropout_is_one_mask_per_sequence():
    """With variational_dropout the unit dropped between layers is dropped at every step."""
    torch.manual_seed(3)
    enc = build_encoder("lstm-srnn-hidden", 4, 8, num_layers=2, dropout=0.5,
                        variational_dropout=True).double()
    enc.train()
    masks = enc.sample_masks(1)
    dropped = (masks.between[1][0] == 0).nonzero().flatten()
    assert dropped.numel() > 0
    # the second layer's input weights of dropped units receive no gradient at any step
    x = torch.randn(1, 6, 4, dtype=F64)
    out, _ = enc(x, masks=masks)
    out.sum().backward()
    w = enc.layers[1][0].weight_ih.grad
    assert torch.all(w[:, dropped] == 0)
    kept = (masks.between[1][0] != 0).nonzero().flatten()
    assert torch.any(w[:, kept] != 0)


@pytest.mark.parametrize("name", CELLS)
@pytest.mark.parametrize("bidirectional", [False, True])
def test_default_state_is_initial_state(name, bidirectional):
    """``enc(x)`` (no state) and ``enc(x, state=enc.initial_state(B))`` are the same call, for
    every registered cell: one default initial state (the second-order cells' keys start at
    1/K, not 0), uni- and bidirectional, and stepping from ``initial_state`` agrees too."""
    torch.manual_seed(0)
    try:
        enc, I = _encoder(name, bidirectional=bidirectional)
    except ConfigError:
        pytest.skip(f"{name} cannot be bidirectional")
    enc.eval()
    B, T = 3, 5
    x = torch.randn(B, T, I, generator=torch.Generator().manual_seed(2), dtype=F64)
    out_none, state_none = enc(x)
    out_init, state_init = enc(x, state=enc.initial_state(B))
    torch.testing.assert_close(out_init, out_none, atol=1e-12, rtol=0)
    for a, b in zip(state_init, state_none):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)
    if not bidirectional:
        step_out, _ = _step_through(enc, x, None, None)
        torch.testing.assert_close(step_out, out_none, atol=1e-12, rtol=0)
