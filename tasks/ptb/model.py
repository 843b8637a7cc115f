"""The PTB language model of Zaremba et al. (2014) / the TensorFlow PTB tutorial.

    x_t (token id) -> embedding (hidden_size) -> dropout
        -> stacked encoder from the registry (dropout between layers, inside it)
        -> dropout -> linear softmax layer (its own weights: no tying)

Dropout sits only on the non-recurrent connections, as in the tutorial: on the
embedding output, between layers (the encoder's ``dropout``) and on the top
layer's output before the softmax (here). The recurrent state is never dropped.

Initialisation: every parameter uniform(±init_scale) — the embedding and the
softmax layer as well as the cells — which is what the tutorial's variable-scope
initialiser does. The cells are then re-initialised through their own
``reset_parameters(init_scale)`` hook, which for the LSTM family is again
uniform(±init_scale) (so b_f is uniform too: TF's ``forget_bias=0.0`` is added at
run time to a uniformly initialised bias, i.e. it adds nothing), and lets a cell
with a documented special initialisation (e.g. a ``forget_bias`` cell option)
apply it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

State = tuple[Tensor, ...]


class PTBLanguageModel(nn.Module):
    """Embedding -> encoder -> untied softmax layer, with a carried state."""

    def __init__(self, vocab_size: int, hidden_size: int, encoder: nn.Module, dropout: float):
        super().__init__()
        self.vocab_size, self.hidden_size = vocab_size, hidden_size
        self.embedding = nn.Embedding(vocab_size, hidden_size)
        self.encoder = encoder
        self.dropout = float(dropout)
        self.decoder = nn.Linear(encoder.output_size, vocab_size)

    def init_weights(self, init_scale: float) -> None:
        """uniform(±init_scale) for every parameter, then the cells' own hook (see module doc)."""
        with torch.no_grad():
            for p in self.parameters():
                nn.init.uniform_(p, -init_scale, init_scale)
        reset = getattr(self.encoder, "reset_parameters", None)
        if reset is not None:
            reset(init_scale)

    def forward(self, inputs: Tensor, state: State | None = None) -> tuple[Tensor, State]:
        """``inputs`` (B, T) token ids -> logits (B, T, V) and the final state.

        ``state`` is the encoder's state layout: a tuple of (num_layers, B, size)
        tensors (``h`` first, then e.g. ``c``); None starts from zeros.
        """
        emb = nn.functional.dropout(self.embedding(inputs), self.dropout, self.training)
        out, final = self.encoder(emb, None, state)
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
