"""The central cell registry (see ``registry.py``) and the cell families."""

from .base import Cell, NoMemoryCellError, weighted_sum
from .encoder import Encoder, StepMasks
from .registry import (CellSpec, available_cells, build_encoder, get_cell,
                       register_cell)

__all__ = ["Cell", "CellSpec", "Encoder", "NoMemoryCellError", "StepMasks", "available_cells", "build_encoder",
           "get_cell", "register_cell", "weighted_sum"]
