"""``build_encoder``: a registered cell name -> a (stacked, bidirectional, ...) Encoder."""

from __future__ import annotations

from typing import Any

from lstmablate.errors import ConfigError

from .encoder import Encoder
from .registry import get_cell


def build_encoder(name: str, input_size: int, hidden_size: int, *,
                  bidirectional: bool = False, **options: Any) -> Encoder:
    """Build a (stacked, optionally bidirectional) encoder of cell ``name``.

    ``options`` are :class:`lstmablate.cells.encoder.Encoder`'s keyword arguments (layers,
    dropouts, pooling, layer mix) and the cell's own options. The returned module's
    ``forward(x, lengths=None, state=None)`` gives ``(outputs, final_state)``.
    """
    spec = get_cell(name)
    if bidirectional and not spec.bidirectional:
        raise ConfigError(f"cell {spec.name!r} cannot run bidirectionally")
    return Encoder(spec, input_size, hidden_size, bidirectional=bidirectional, **options)
