"""The recurrent cells: the registry (``registry.py``), the built-in families
(``builtin.py``), the encoder every cell runs in (``encoder.py``), and their fast
kernels (``kernels/``, imported only when a cell with one first runs)."""

from . import builtin  # noqa: F401  (registers the built-in cell families)
from .base import Cell, FastKernels, NoMemoryCellError, weighted_sum
from .build import build_encoder
from .encoder import Encoder, StepMasks
from .kernels.switches import reference_mode, set_reference_mode
from .registry import CellSpec, available_cells, get_cell, register_cell

__all__ = ["Cell", "CellSpec", "Encoder", "FastKernels", "NoMemoryCellError", "StepMasks",
           "available_cells", "build_encoder", "get_cell", "reference_mode", "register_cell",
           "set_reference_mode", "weighted_sum"]
