"""Encoder read-outs for every cell: pooling over real positions (max | mean | last) and ELMo's
scalar mix of the layers (γ · Σ_j softmax(s)_j h_j), against hand computations in float64."""

from __future__ import annotations

import pytest
import torch

from lstmablate.cells import available_cells, build_encoder, get_cell
from lstmablate.cells.pooling import ScalarMix, pool
from lstmablate.errors import ConfigError

F64 = torch.float64
CELLS = available_cells()


def _sizes(name: str) -> tuple[int, int]:
    I, H = getattr(get_cell(name).cls, "example_sizes", (2, 2))
    return (5, 6) if (I, H) == (2, 2) else (I, H)


def _encoder(name: str, bidirectional: bool, **opts):
    """A 2-layer encoder of ``name`` (1 layer where the cell reads a fixed input size), float64,
    eval mode; skips where the cell cannot run right to left."""
    if bidirectional and not get_cell(name).bidirectional:
        pytest.skip(f"{name} cannot run right to left")
    I, H = _sizes(name)
    torch.manual_seed(0)
    try:
        enc = build_encoder(name, I, H, num_layers=2, bidirectional=bidirectional, **opts)
    except ConfigError:
        enc = build_encoder(name, I, H, num_layers=1, bidirectional=bidirectional, **opts)
    return enc.to(F64).eval(), I


def _padded_batch(I: int, lengths=(6, 3, 1, 4)):
    gen = torch.Generator().manual_seed(1)
    L = torch.tensor(lengths)
    x = torch.randn(len(lengths), max(lengths), I, generator=gen, dtype=F64)
    for b, n in enumerate(lengths):
        x[b, n:] = 1e3  # garbage at padding: it must never reach a pooled vector
    return x, L


@pytest.mark.parametrize("name", CELLS)
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("how", ["max", "mean", "last"])
def test_pooled_padded_batch_equals_each_sequence_alone(name, bidirectional, how):
    """Every cell, every pooling: a sequence's vector from a padded batch is the hand-computed
    pooling of its outputs when run alone (no padding at all)."""
    enc, I = _encoder(name, bidirectional, pooling=how)
    x, L = _padded_batch(I)
    got = enc.encode(x, L)
    assert got.shape == (len(L), enc.output_size)
    for b, n in enumerate(L.tolist()):
        alone, _ = enc(x[b:b + 1, :n])  # (1, n, D)
        h = alone[0]
        if how == "max":
            want = h.max(dim=0).values
        elif how == "mean":
            want = h.sum(dim=0) / n
        else:
            half = enc.output_size // enc.num_directions
            want = h[n - 1] if not bidirectional else torch.cat([h[n - 1, :half], h[0, half:]])
        torch.testing.assert_close(got[b], want, atol=1e-12, rtol=1e-12)
    if how == "last":  # one layer: the final h of every direction, as torch.nn.LSTM's h_n
        one = build_encoder(name, I, enc.hidden_size, bidirectional=bidirectional,
                            pooling="last").to(F64).eval()
        _, (h_n, *_) = one(x, L)
        torch.testing.assert_close(one.encode(x, L), torch.cat(list(h_n), dim=-1), atol=1e-12,
                                   rtol=1e-12)


def test_max_never_selects_padding_even_when_every_real_value_is_negative():
    T, B, D = 5, 3, 4
    out = -torch.rand(T, B, D, dtype=F64) - 1.0  # real values in [-2, -1)
    L = torch.tensor([5, 2, 1])
    for b, n in enumerate(L.tolist()):
        out[n:, b] = 0.0  # what an encoder emits at padding: 0 > every real value
    u = pool(out, L, "max", bidirectional=False)
    for b, n in enumerate(L.tolist()):
        torch.testing.assert_close(u[b], out[:n, b].max(0).values, atol=0, rtol=0)
    assert (u < -0.99).all()  # a zero would mean padding won
    # gradient of the max reaches only real positions
    out.requires_grad_(True)
    pool(out, L, "max", bidirectional=False).sum().backward()
    for b, n in enumerate(L.tolist()):
        assert out.grad[n:, b].abs().sum() == 0 and out.grad[:n, b].sum() == D


def test_empty_sequences_pool_to_zeros_and_no_lengths_means_all_positions():
    out = torch.randn(4, 2, 6, dtype=F64)
    for how in ("max", "mean", "last"):
        u = pool(out, torch.tensor([0, 4]), how, bidirectional=True)
        assert torch.equal(u[0], torch.zeros(6, dtype=F64))
        torch.testing.assert_close(u[1], pool(out, None, how, True)[1], atol=0, rtol=0)
    torch.testing.assert_close(pool(out, None, "mean", False), out.mean(0), atol=1e-15, rtol=0)


def test_time_first_encoder_pools_the_same():
    enc, I = _encoder("lstm", True, pooling="max")
    tf = build_encoder("lstm", I, 6, num_layers=2, bidirectional=True, pooling="max",
                       batch_first=False).to(F64).eval()
    tf.load_state_dict(enc.state_dict())
    x, L = _padded_batch(I)
    torch.testing.assert_close(tf.encode(x.transpose(0, 1), L), enc.encode(x, L), atol=0, rtol=0)


def _layer_outputs(enc_plain, x, L):
    """The outputs h_1..h_L of each layer of a mix-free encoder, computed one layer at a time
    by 1-layer encoders holding the same cells."""
    outs, inp = [], x
    for layer in enc_plain.layers:
        one = build_encoder(enc_plain.cell_name, layer[0].input_size, enc_plain.hidden_size,
                            bidirectional=enc_plain.bidirectional).to(F64).eval()
        for d, cell in enumerate(layer):
            one.layers[0][d].load_state_dict(cell.state_dict())
        inp, _ = one(inp, L)
        outs.append(inp)
    return outs


@pytest.mark.parametrize("with_input", [False, True])
def test_scalar_mix_equals_a_hand_computation(with_input):
    """γ · Σ_j softmax(s)_j h_j with chosen s and γ; the input layer, where mixed, is ELMo's
    [x; x] (a bidirectional encoder's output is twice its input here)."""
    I = H = 4
    torch.manual_seed(0)
    plain = build_encoder("lstm-srnn", I, H, num_layers=3, bidirectional=True).to(F64).eval()
    mixed = build_encoder("lstm-srnn", I, H, num_layers=3, bidirectional=True,
                          layer_mix="scalar", layer_mix_input=with_input).to(F64).eval()
    missing = mixed.load_state_dict(plain.state_dict(), strict=False).missing_keys
    assert sorted(missing) == ["mix.gamma", "mix.s"]
    s = [0.3, -1.2, 0.5, 2.0][: 3 + with_input]
    with torch.no_grad():
        mixed.mix.s.copy_(torch.tensor(s, dtype=F64))
        mixed.mix.gamma.fill_(1.7)
    x, L = _padded_batch(I)
    layers = _layer_outputs(plain, x, L)
    if with_input:
        valid = (torch.arange(x.shape[1]).unsqueeze(0) < L.unsqueeze(1)).unsqueeze(-1)
        layers.insert(0, torch.cat([x, x], dim=-1) * valid)
    e = [torch.exp(torch.tensor(v, dtype=F64)) for v in s]
    want = 1.7 * sum((e[j] / sum(e)) * layers[j] for j in range(len(s)))
    got, _ = mixed(x, L)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)
    for b, n in enumerate(L.tolist()):
        assert not got[b, n:].any()  # padding stays zero
    # the last layer alone is the plain encoder's output
    torch.testing.assert_close(layers[-1], plain(x, L)[0], atol=1e-12, rtol=1e-12)


def test_gradients_reach_the_mixing_weights_and_gamma():
    torch.manual_seed(0)
    enc = build_encoder("lstm", 3, 4, num_layers=2, bidirectional=True, layer_mix="scalar",
                        pooling="max").to(F64)
    x, L = _padded_batch(3)
    (enc.encode(x, L) ** 2).sum().backward()
    assert enc.mix.s.grad is not None and enc.mix.s.grad.abs().sum() > 0
    assert enc.mix.gamma.grad is not None and enc.mix.gamma.grad.abs() > 0

    mix = ScalarMix(3).to(F64)
    h = [torch.randn(2, 5, 4, dtype=F64, requires_grad=True) for _ in range(3)]

    def f(s, gamma, *layers):
        return torch.func.functional_call(mix, {"s": s, "gamma": gamma}, (list(layers),))

    s = torch.tensor([0.1, -0.4, 0.7], dtype=F64, requires_grad=True)
    gamma = torch.tensor(1.3, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(f, (s, gamma, *h))


@pytest.mark.parametrize("name", CELLS)
def test_layer_mix_with_every_cell_and_the_step_api(name):
    """Every cell with a scalar mix: sequence and step APIs agree; the mix is what comes out."""
    enc, I = _encoder(name, False, layer_mix="scalar", pooling="mean")
    x, _ = _padded_batch(I, (5, 5))
    with torch.no_grad():
        enc.mix.s.copy_(torch.linspace(-1, 1, enc.mix.n, dtype=F64))
    seq, _ = enc(x)
    state, outs = None, []
    for t in range(x.shape[1]):
        o, state = enc.step(x[:, t], state)
        outs.append(o)
    torch.testing.assert_close(torch.stack(outs, 1), seq, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(enc.pool(seq), seq.mean(1), atol=1e-12, rtol=1e-12)
    if get_cell(name).bidirectional:
        bi, I = _encoder(name, True, layer_mix="scalar", pooling="max")
        xb, L = _padded_batch(I)
        assert bi.encode(xb, L).shape == (len(L), bi.output_size)


def test_defaults_leave_the_encoder_as_it_was():
    enc = build_encoder("lstm", 3, 4, num_layers=2, bidirectional=True)
    assert enc.pooling == "none" and enc.layer_mix == "none" and enc.mix is None
    assert not any(k.startswith("mix.") for k in enc.state_dict())  # old checkpoints load
    with pytest.raises(ConfigError, match="pooling='none'"):
        enc.encode(torch.zeros(1, 2, 3))


def test_bad_options_are_config_errors():
    with pytest.raises(ConfigError, match="pooling must be one of none, max, mean, last"):
        build_encoder("lstm", 3, 4, pooling="min")
    with pytest.raises(ConfigError, match="layer_mix must be one of none, scalar"):
        build_encoder("lstm", 3, 4, layer_mix="attention")
    with pytest.raises(ConfigError, match="input size must equal the output size 8"):
        build_encoder("lstm", 3, 4, bidirectional=True, layer_mix="scalar", layer_mix_input=True)
    with pytest.raises(ConfigError, match="needs layer_mix='scalar'"):
        build_encoder("lstm", 4, 4, layer_mix_input=True)
