"""``build_encoder``: a registered cell name -> a (stacked, bidirectional, ...) Encoder."""

from __future__ import annotations

from typing import Any

from lstmablate.errors import ConfigError

from .encoder import Encoder
from .registry import get_cell


def build_encoder(
    name: str,
    input_size: int,
    hidden_size: int,
    num_layers: int = 1,
    bidirectional: bool = False,
    dropout: float = 0.0,
    recurrent_dropout: float = 0.0,
    residual: bool = False,
    batch_first: bool = True,
    variational_dropout: bool = False,
    pooling: str = "none",
    layer_mix: str = "none",
    layer_mix_input: bool = False,
    **cell_options: Any,
) -> Encoder:
    """Build a (stacked, optionally bidirectional) encoder of cell ``name``.

    The returned module's ``forward(x, lengths=None, state=None)`` gives
    ``(outputs, final_state)``; see :class:`lstmablate.cells.encoder.Encoder`.
    ``pooling`` (none | max | mean | last) is what ``enc.encode(x, lengths)`` /
    ``enc.pool(outputs, lengths)`` return; ``layer_mix`` (none | scalar) makes the outputs
    ELMo's mix of the layers (see :mod:`lstmablate.cells.pooling`).
    """
    spec = get_cell(name)
    if bidirectional and not spec.bidirectional:
        raise ConfigError(f"cell {spec.name!r} cannot run bidirectionally")
    return Encoder(spec, input_size, hidden_size, num_layers=num_layers,
                   bidirectional=bidirectional, dropout=dropout,
                   recurrent_dropout=recurrent_dropout, residual=residual,
                   batch_first=batch_first, variational_dropout=variational_dropout,
                   pooling=pooling, layer_mix=layer_mix, layer_mix_input=layer_mix_input,
                   **cell_options)
