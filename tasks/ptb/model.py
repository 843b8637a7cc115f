"""The PTB language model of Zaremba et al. (2014) / the TensorFlow PTB tutorial.

    x_t (token id) -> embedding (hidden_size) -> dropout
        -> stacked encoder from the registry (dropout between layers, inside it)
        -> dropout -> linear softmax layer (its own weights: no tying)

Dropout sits only on the non-recurrent connections, as in the tutorial: on the
embedding output, between layers (the encoder's ``dropout``) and on the top
layer's output before the softmax (here). The recurrent state is never dropped.

Initialisation: every parameter uniform(±init_scale) — the embedding and the
softmax layer as well as the cells — which is what the tutorial's variable-scope
initialiser (``tf.random_uniform_initializer``) does for the variables that take it.
The cells are then re-initialised through their own ``reset_parameters(init_scale)``
hook, which for the LSTM family is again uniform(±init_scale), the biases included,
and lets a cell with a documented special initialisation (e.g. a ``forget_bias``
cell option) apply it.

**The LSTM biases differ from TensorFlow's.** The tutorial's default ``rnn_mode``
(``BLOCK``: ``tf.contrib.rnn.LSTMBlockCell``) creates the bias with its own
``constant_initializer(0.0)`` (``tensorflow/contrib/rnn/python/ops/lstm_ops.py``), and
``BASIC`` (``BasicLSTMCell``) with a zeros initialiser: both override the scope's
uniform initialiser, so TF's LSTM biases start at exactly 0, and ``forget_bias=0.0``
adds nothing at run time. Only the ``CUDNN`` mode draws its biases uniform(±init_scale),
with every other weight in one parameter blob. Here the cells' biases are drawn
uniform(±init_scale), as that mode does; this is not the default TF arithmetic, and it is
kept (it is what every measured run used); docs/ptb.md lists it among the differences.

Options for the second-order report's protocol (Renganathan & Singh, §5.3):

* ``embedding_size``: an embedding size of its own (R&S: 128 for characters, 64 for
  words) instead of the tutorial's ``hidden_size``; the encoder then reads it;
* ``dropout_scope="softmax"``: dropout only "to the hidden state before passing it
  through the softmax at each timestep" (R&S §5.3), i.e. on the top layer's output:
  not on the embedding, not between layers (the task then builds its encoder with
  ``dropout=0``); ``"all"`` is the tutorial's three places;
* ``init_weights(None)``: each module's PyTorch default (``nn.Embedding`` N(0, 1),
  ``nn.Linear`` U(±1/sqrt(fan_in)), the cells their own default, U(±1/sqrt(H)) as
  ``torch.nn.LSTM``) — the report is silent on initialisation and says its models
  were implemented "from scratch in PyTorch";
* ``lengths`` in :meth:`PTBLanguageModel.forward`: padded sentence batches; padded
  positions never change the state (the encoder's masking) and their outputs are
  the task's to ignore.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

State = tuple[Tensor, ...]

#: where dropout goes: "all" = embedding output, between layers, top output (the tutorial);
#: "softmax" = only the top layer's output, before the softmax (R&S §5.3)
DROPOUT_SCOPES = ("all", "softmax")


class PTBLanguageModel(nn.Module):
    """Embedding -> encoder -> untied softmax layer, with a carried state."""

    def __init__(self, vocab_size: int, hidden_size: int, encoder: nn.Module, dropout: float,
                 embedding_size: int | None = None, dropout_scope: str = "all"):
        super().__init__()
        if dropout_scope not in DROPOUT_SCOPES:
            raise ValueError(f"dropout_scope must be one of {DROPOUT_SCOPES}, got {dropout_scope!r}")
        self.vocab_size, self.hidden_size = vocab_size, hidden_size
        self.embedding_size = hidden_size if embedding_size is None else embedding_size
        self.embedding = nn.Embedding(vocab_size, self.embedding_size)
        self.encoder = encoder
        self.dropout = float(dropout)
        self.dropout_scope = dropout_scope
        self.decoder = nn.Linear(encoder.output_size, vocab_size)

    def init_weights(self, init_scale: float | None) -> None:
        """uniform(±init_scale) for every parameter, then the cells' own hook (see module
        doc); ``None``: every module's PyTorch default."""
        if init_scale is None:
            self.embedding.reset_parameters()
            self.decoder.reset_parameters()
        else:
            with torch.no_grad():
                for p in self.parameters():
                    nn.init.uniform_(p, -init_scale, init_scale)
        reset = getattr(self.encoder, "reset_parameters", None)
        if reset is not None:
            reset(init_scale)

    def forward(self, inputs: Tensor, state: State | None = None, lengths: Tensor | None = None,
                select: Tensor | None = None) -> tuple[Tensor, State]:
        """``inputs`` (B, T) token ids -> logits (B, T, V) and the final state.

        ``state`` is the encoder's state layout: a tuple of (num_layers, B, size)
        tensors (``h`` first, then e.g. ``c``); None starts from zeros. ``lengths``
        (B,): the true lengths of a right-padded batch (the final state is then each
        sequence's state after its last real token); None: no padding. ``select``: a
        (B, T) boolean mask; the logits are then those of the selected positions only,
        (N, V) in row-major order (padded positions never reach the softmax layer).
        """
        emb = self.embedding(inputs)
        if self.dropout_scope == "all":  # the tutorial: dropout on the embedding output too
            emb = nn.functional.dropout(emb, self.dropout, self.training)
        out, final = self.encoder(emb, lengths, state)
        if select is not None:
            out = out[select]
        out = nn.functional.dropout(out, self.dropout, self.training)
        return self.decoder(out), final


def detach_state(state: Any) -> Any:
    """The state cut from the graph (truncated BPTT); tuples are kept as tuples."""
    if state is None:
        return None
    if isinstance(state, Tensor):
        return state.detach()
    return tuple(s.detach() for s in state)


def state_to(state: Any, device: torch.device) -> Any:
    """Move a carried state to ``device`` (a resumed carry is loaded on the CPU)."""
    if state is None:
        return None
    if isinstance(state, Tensor):
        return state.to(device)
    return tuple(s.to(device) for s in state)
