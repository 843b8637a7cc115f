"""The OpenNMT-py model: Luong "general" attention on a hand example, input feeding, the
encoder-to-decoder state bridge, and the decoder driven through the registry's step API."""

from __future__ import annotations

import math

import pytest
import torch

from tolerance import assert_close
from lstmablate.cells import build_encoder
from lstmablate_tasks.nmt.model import GlobalAttention, NMTModel, StackedLSTMCells, bridge_state


def _model(cell="lstm", cell_layers="encoder", brnn=False, E=6, H=8, Vs=9, Vt=11, layers=2,
           dropout=0.0, seed=0) -> NMTModel:
    torch.manual_seed(seed)
    enc = build_encoder(cell, E, H // 2 if brnn else H, num_layers=layers, bidirectional=brnn,
                        dropout=dropout)
    if cell_layers == "encoder":
        dec = StackedLSTMCells(layers, E + H, H, dropout)
    else:
        dec = build_encoder(cell, E + H, H, num_layers=layers, dropout=dropout)
    m = NMTModel(Vs, Vt, E, H, enc, dec, dropout, src_pad=1, tgt_pad=1)
    m.init_weights(0.5)
    return m


def _batch():
    src = torch.tensor([[4, 5, 6, 7], [8, 4, 1, 1]])
    lengths = torch.tensor([4, 2])
    tgt_in = torch.tensor([[2, 5, 6], [2, 7, 1]])
    return src, lengths, tgt_in


def test_general_attention_on_a_hand_example():
    att = GlobalAttention(2)
    with torch.no_grad():
        att.linear_in.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 2.0]]))  # W_a
        att.linear_out.weight.copy_(torch.tensor([[1.0, 0.0, 0.0, 0.0],  # W_c on [c; h_t]
                                                  [0.0, 0.0, 0.0, 1.0]]))
    h_t = torch.tensor([[1.0, 1.0]])
    h_s = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [5.0, 5.0]]])  # the third position is padding
    mask = torch.tensor([[True, True, False]])
    out, a = att(h_t, h_s, mask)
    # W_a h_t = (1, 2); scores (1, 2, -inf); a = (1, e) / (1 + e), 0
    a1, a2 = 1 / (1 + math.e), math.e / (1 + math.e)
    assert_close(a, [[a1, a2, 0.0]])  # float32 against the exact values
    # c = (a1, a2); W_c [c; h_t] = (c_1, h_t2) = (a1, 1); h~ = tanh of that
    assert_close(out, [[math.tanh(a1), math.tanh(1.0)]])
    assert att.linear_in.bias is None and att.linear_out.bias is None  # "general": no biases


def test_padding_never_reaches_the_attention():
    m = _model().eval()
    src, lengths, tgt_in = _batch()
    logp, attn = m(src, lengths, tgt_in)
    assert torch.all(attn[1, :, 2:] == 0)
    assert torch.allclose(attn.sum(-1), torch.ones(2, 3))
    alone, _ = m(src[1:, :2], lengths[1:], tgt_in[1:])
    assert_close(logp[1:], alone)  # as if the sentence were alone (float32: another batch shape)


@pytest.mark.parametrize("cell_layers", ["encoder", "encoder+decoder"])
def test_input_feeding_feeds_back_the_dropped_attentional_output(cell_layers):
    """The decoder reads [E y_{t-1}; h~_{t-1}] with h~_0 = 0, h~ being the vector after dropout
    (OpenNMT feeds back exactly what the generator read)."""
    m = _model(cell_layers=cell_layers, dropout=0.5).train()
    E = m.tgt_embedding.embedding_dim
    fed, produced = [], []
    step, decode_embedded = m.decoder_rnn.step, m.decode_embedded

    def spy_step(x, state, masks=None):
        fed.append(x.detach().clone())
        return step(x, state, masks)

    def spy_decode(*a, **k):
        out, align, st = decode_embedded(*a, **k)
        produced.append(out.detach().clone())
        return out, align, st

    m.decoder_rnn.step = spy_step
    m.decode_embedded = spy_decode
    src, lengths, tgt_in = _batch()
    m(src, lengths, tgt_in)
    assert len(fed) == 3
    assert torch.all(fed[0][:, E:] == 0)
    for t in (1, 2):
        assert torch.equal(fed[t][:, E:], produced[t - 1])
        assert torch.equal(fed[t][:, :E], m.tgt_embedding(tgt_in[:, t]).detach())
    assert (produced[0] == 0).any()  # dropout did act on what was fed back


def test_decoder_step_api_matches_a_sequence_call():
    """encoder+decoder: stepping the registry decoder with the step API gives what a sequence
    call over the same inputs from the same (bridged) state gives."""
    m = _model(cell="lstm-srnn", cell_layers="encoder+decoder").eval()
    fed, outs = [], []
    step = m.decoder_rnn.step

    def spy(x, state, masks=None):
        fed.append(x)
        out, new = step(x, state, masks)
        outs.append(out)
        return out, new

    m.decoder_rnn.step = spy
    src, lengths, tgt_in = _batch()
    with torch.no_grad():
        m(src, lengths, tgt_in)
        mem = m.encode(src, lengths)
        init = m.init_decoder(mem).rnn
        seq, _ = m.decoder_rnn(torch.stack(fed, dim=1), None, init)
    assert_close(seq, torch.stack(outs, dim=1))  # float32: one call vs one step at a time


def test_bridge_concatenates_directions_and_zero_fills_missing_components():
    dec = StackedLSTMCells(2, 3, 4, 0.0)
    h = torch.arange(2 * 2 * 1 * 2, dtype=torch.float).view(4, 1, 2)  # (layers*dirs, B, H/2)
    c = -h
    s = bridge_state((h, c), ("h", "c"), True, dec, 1, h)
    # layer l = cat(forward_l, backward_l): rows 0,1 -> layer 0; rows 2,3 -> layer 1
    assert s[0].tolist() == [[[0.0, 1.0, 2.0, 3.0]], [[4.0, 5.0, 6.0, 7.0]]]
    assert torch.equal(s[1], -s[0])
    # an S-RNN (-GATES) or GRU encoder has only h: the LSTM decoder's c starts at zero
    h1 = torch.ones(2, 1, 4)
    s = bridge_state((h1,), ("h",), False, dec, 1, h1)
    assert torch.equal(s[0], h1) and torch.equal(s[1], torch.zeros(2, 1, 4))


def test_init_is_uniform_within_the_scale():
    m = _model()
    m.init_weights(0.1)
    for name, p in m.named_parameters():
        assert float(p.detach().abs().max()) <= 0.1 + 1e-7, name
    assert float(m.generator.weight.detach().std()) > 0.04  # uniform(±0.1) has std 0.0577


def test_encoder_output_size_must_match_the_decoder():
    enc = build_encoder("lstm", 4, 6)
    with pytest.raises(ValueError, match="output size 6"):
        NMTModel(5, 5, 4, 8, enc, StackedLSTMCells(1, 12, 8, 0.0), 0.0, 1, 1)
