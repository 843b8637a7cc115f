"""OpenNMT-py's default model of early 2018 (OpenNMT-py @ 18d3d2e1).

    source ids -> embedding (500) -> encoder (2 layers x 500, from the registry) -> memory h_s
    target ids -> embedding (500) ─┐
    previous attentional output h̃_{t-1} (input feeding) ─┴─ concat (1000) -> decoder (2 x 500)
        -> h_t -> global attention over h_s -> h̃_t -> dropout -> generator (linear + log-softmax)

* **Encoder** (``RNNEncoder``): ``make_encoder(500, 500, num_layers=2, dropout=0.3)`` — the
  cell under study. ``nn.LSTM``'s dropout sits between the layers only; the encoder's
  outputs are not dropped. With ``encoder_type: brnn`` each direction has ``hidden/2`` units
  and the outputs are the two directions concatenated.
* **Decoder** (``InputFeedRNNDecoder``): a stack of ``nn.LSTMCell`` (``StackedLSTM``) with
  dropout between layers, read one token at a time because its input at step t is
  ``[E y_{t-1}; h̃_{t-1}]`` (input feeding, Luong et al. 2015 §3.3; ``h̃_0 = 0``). With
  ``cell_layers: encoder+decoder`` the decoder is the registry's cell too, driven through the
  encoder step API (``initial_state`` / ``sample_masks`` / ``step`` / ``reorder_state``).
* **Initial decoder state** (``init_decoder_state``): the encoder's final state, layer by
  layer; for a bidirectional encoder the two directions' states are concatenated
  (``_fix_enc_hidden``). A state component the decoder has but the encoder lacks (``c`` of
  an LSTM decoder after an S-RNN or GRU encoder, which has only ``h``) starts at zero.
* **Global attention, Luong "general"** (``GlobalAttention``):
  ``score(h_t, h_s) = (W_a h_t)ᵀ h_s`` (W_a without bias), ``a_t = softmax`` over the real
  source positions (padding masked to -inf), ``c_t = Σ_s a_t(s) h_s``,
  ``h̃_t = tanh(W_c [c_t; h_t])`` (W_c without bias for "general").
* **Dropout** 0.3 on ``h̃_t`` (``InputFeedRNNDecoder``: ``output = self.dropout(attn_output)``);
  the dropped vector is both what the generator reads and what is fed back. No dropout on the
  embeddings (only OpenNMT's positional encoding had one).
* **Generator**: ``Linear(500, |V_tgt|)`` with bias, then log-softmax.
* **Initialisation**: every parameter uniform(±0.1) (``param_init``); the registry's cells
  then apply their own ``reset_parameters(0.1)`` hook (uniform(±0.1) again for the LSTM
  family, a documented special initialisation where a cell has one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["GlobalAttention", "StackedLSTMCells", "DecoderState", "Memory", "NMTModel",
           "bridge_state"]

State = tuple[Tensor, ...]


class GlobalAttention(nn.Module):
    """Luong et al. (2015) global attention with the "general" score (OpenNMT's default)."""

    def __init__(self, dim: int):
        super().__init__()
        self.linear_in = nn.Linear(dim, dim, bias=False)  # W_a
        self.linear_out = nn.Linear(2 * dim, dim, bias=False)  # W_c

    def forward(self, query: Tensor, memory: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """``query`` h_t (B, D), ``memory`` h_s (B, S, D), ``mask`` (B, S) true at real positions
        -> (h̃_t (B, D), a_t (B, S))."""
        score = torch.bmm(memory, self.linear_in(query).unsqueeze(2)).squeeze(2)  # (W_a h_t)ᵀ h_s
        score = score.masked_fill(~mask, float("-inf"))
        align = torch.softmax(score, dim=-1)  # a_t
        context = torch.bmm(align.unsqueeze(1), memory).squeeze(1)  # c_t = Σ_s a_t(s) h_s
        attn_h = torch.tanh(self.linear_out(torch.cat([context, query], dim=-1)))  # tanh(W_c[c;h])
        return attn_h, align


class StackedLSTMCells(nn.Module):
    """OpenNMT's ``StackedLSTM``: ``nn.LSTMCell`` layers, dropout between layers (fresh at
    every step), with the registry encoder's step API so one decoder drives either."""

    state_names = ("h", "c")

    def __init__(self, num_layers: int, input_size: int, hidden_size: int, dropout: float):
        super().__init__()
        self.num_layers, self.hidden_size, self.dropout = num_layers, hidden_size, dropout
        self.output_size = hidden_size
        sizes = [input_size] + [hidden_size] * (num_layers - 1)
        self.layers = nn.ModuleList(nn.LSTMCell(n, hidden_size) for n in sizes)

    def initial_state(self, batch: int, like: Tensor | None = None) -> State:
        like = like if like is not None else next(self.parameters())
        z = like.new_zeros(self.num_layers, batch, self.hidden_size)
        return (z, z.clone())

    def sample_masks(self, batch: int, like: Tensor | None = None) -> None:
        return None  # no per-sequence dropout masks: dropout between layers is per step

    def reorder_state(self, state: State, index: Tensor) -> State:
        return tuple(s.index_select(1, index) for s in state)

    def step(self, x: Tensor, state: State, masks: Any = None) -> tuple[Tensor, State]:
        h0, c0 = state
        hs, cs = [], []
        inp = x
        for i, layer in enumerate(self.layers):
            h, c = layer(inp, (h0[i], c0[i]))
            inp = h
            if i + 1 != self.num_layers:
                inp = nn.functional.dropout(inp, self.dropout, self.training)
            hs.append(h)
            cs.append(c)
        return inp, (torch.stack(hs), torch.stack(cs))


def bridge_state(enc_state: State, enc_names: tuple[str, ...], bidirectional: bool,
                 decoder: nn.Module, batch: int, like: Tensor) -> State:
    """The decoder's initial state from the encoder's final state (``init_decoder_state``).

    ``enc_state``: one (layers * directions, B, size) tensor per component named in
    ``enc_names``. A bidirectional encoder's directions are concatenated per layer
    (``_fix_enc_hidden``: ``cat([h[0::2], h[1::2]], 2)``). Each decoder component takes the
    encoder component of the same name when the shapes agree, else zeros (see module doc).
    """
    fixed = {}
    for name, s in zip(enc_names, enc_state):
        if bidirectional:
            s = torch.cat([s[0::2], s[1::2]], dim=2)
        fixed[name] = s
    zeros = decoder.initial_state(batch, like=like)
    return tuple(fixed[n] if n in fixed and fixed[n].shape == z.shape else z
                 for n, z in zip(decoder.state_names, zeros))


@dataclass
class Memory:
    """The encoded source: ``memory`` h_s (B, S, D), ``mask`` (B, S), the final encoder state."""

    memory: Tensor
    mask: Tensor
    enc_state: State

    def select(self, index: Tensor) -> Memory:
        """Rows ``index`` (beam search: each sentence repeated beam-size times)."""
        return Memory(self.memory.index_select(0, index), self.mask.index_select(0, index),
                      tuple(s.index_select(1, index) for s in self.enc_state))


@dataclass
class DecoderState:
    """What the decoder carries from step to step: the recurrent state, the input feed h̃_{t-1}
    and the recurrent dropout masks of the sequence (None in eval mode / without them)."""

    rnn: State
    input_feed: Tensor
    masks: Any = None

    def reorder(self, index: Tensor, rnn: nn.Module) -> DecoderState:
        masks = self.masks.reorder(index) if self.masks is not None else None
        return DecoderState(rnn.reorder_state(self.rnn, index),
                            self.input_feed.index_select(0, index), masks)


class NMTModel(nn.Module):
    """Embeddings, encoder, input-feeding attentional decoder, generator (module doc)."""

    def __init__(self, src_vocab: int, tgt_vocab: int, word_vec_size: int, hidden_size: int,
                 encoder: nn.Module, decoder_rnn: nn.Module, dropout: float, src_pad: int,
                 tgt_pad: int):
        super().__init__()
        if encoder.output_size != hidden_size:
            raise ValueError(f"the encoder's output size {encoder.output_size} must equal the "
                             f"decoder's hidden size {hidden_size} (attention compares them)")
        self.hidden_size, self.dropout = hidden_size, float(dropout)
        self.src_embedding = nn.Embedding(src_vocab, word_vec_size, padding_idx=src_pad)
        self.tgt_embedding = nn.Embedding(tgt_vocab, word_vec_size, padding_idx=tgt_pad)
        self.encoder = encoder
        self.decoder_rnn = decoder_rnn
        self.attention = GlobalAttention(hidden_size)
        self.generator = nn.Linear(hidden_size, tgt_vocab)

    def init_weights(self, init_scale: float) -> None:
        """uniform(±init_scale) for every parameter, then the registry cells' own hook."""
        with torch.no_grad():
            for p in self.parameters():
                nn.init.uniform_(p, -init_scale, init_scale)
        for rnn in (self.encoder, self.decoder_rnn):
            reset = getattr(rnn, "reset_parameters", None)
            if reset is not None and not isinstance(rnn, StackedLSTMCells):
                reset(init_scale)

    # -- encoder -------------------------------------------------------------------------
    def encode(self, src: Tensor, src_lengths: Tensor) -> Memory:
        """``src`` (B, S) ids, ``src_lengths`` (B,) -> the memory the decoder attends to."""
        emb = self.src_embedding(src)
        out, final = self.encoder(emb, src_lengths)
        steps = torch.arange(src.shape[1], device=src.device)
        mask = steps.unsqueeze(0) < src_lengths.to(src.device).unsqueeze(1)
        return Memory(out, mask, final)

    # -- decoder -------------------------------------------------------------------------
    def init_decoder(self, mem: Memory) -> DecoderState:
        B = mem.memory.shape[0]
        rnn_state = bridge_state(mem.enc_state, tuple(self.encoder.state_names),
                                 bool(getattr(self.encoder, "bidirectional", False)),
                                 self.decoder_rnn, B, mem.memory)
        masks = self.decoder_rnn.sample_masks(B, like=mem.memory)
        return DecoderState(rnn_state, mem.memory.new_zeros(B, self.hidden_size), masks)

    def decode_step(self, y_prev: Tensor, state: DecoderState, mem: Memory
                    ) -> tuple[Tensor, Tensor, DecoderState]:
        """One target position: ``y_prev`` (B,) ids -> (output h̃_t after dropout (B, D),
        attention a_t (B, S), next state). Input feeding: the decoder reads [E y; h̃_{t-1}]."""
        return self.decode_embedded(self.tgt_embedding(y_prev), state, mem)

    def decode_embedded(self, emb_t: Tensor, state: DecoderState, mem: Memory
                        ) -> tuple[Tensor, Tensor, DecoderState]:
        """:meth:`decode_step` from the embedded word ``emb_t`` (B, E) (teacher forcing embeds
        the whole target once: one embedding gradient per batch, not one per position)."""
        x = torch.cat([emb_t, state.input_feed], dim=-1)
        rnn_out, rnn_state = self.decoder_rnn.step(x, state.rnn, state.masks)
        attn_h, align = self.attention(rnn_out, mem.memory, mem.mask)
        out = nn.functional.dropout(attn_h, self.dropout, self.training)
        return out, align, DecoderState(rnn_state, out, state.masks)

    def log_probs(self, out: Tensor) -> Tensor:
        """The generator: log-softmax(W_o h̃ + b_o)."""
        return torch.log_softmax(self.generator(out), dim=-1)

    def forward(self, src: Tensor, src_lengths: Tensor, tgt_in: Tensor) -> tuple[Tensor, Tensor]:
        """Teacher forcing: (log-probabilities (B, T, V), attention (B, T, S)) for every target
        position, the decoder fed ``tgt_in`` = ``<s> y_1 .. y_{n}`` one token at a time."""
        mem = self.encode(src, src_lengths)
        state = self.init_decoder(mem)
        emb = self.tgt_embedding(tgt_in)
        outs, aligns = [], []
        for t in range(tgt_in.shape[1]):
            out, align, state = self.decode_embedded(emb[:, t], state, mem)
            outs.append(out)
            aligns.append(align)
        return self.log_probs(torch.stack(outs, dim=1)), torch.stack(aligns, dim=1)
