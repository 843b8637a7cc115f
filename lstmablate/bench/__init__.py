"""Benchmarks: the cells' forward+backward speed against ``torch.nn.LSTM`` / ``torch.nn.RNN``.

Library functions (the ``lstmablate bench`` command renders their rows):

* :func:`bench_cells` — forward+backward tokens/s of each cell's encoder at the
  PTB shapes (batch 20, 35 steps, 2 layers, hidden 200 and 650) and a
  parser-like bidirectional shape (batch 32, length <= 50 with variable lengths,
  hidden 400, 3 layers), against ``torch.nn.LSTM`` (and ``torch.nn.RNN``, the
  baseline of ``lstm-gates``) of the same size, timed in the same process and
  interleaved round by round (so a busy machine slows every candidate alike);
  plus memory, achieved GFLOP/s, and for the cells without a ratio target the
  speed-up over their own reference step loop;
* :func:`bench_models` — end-to-end PTB (small/medium/large) training tokens/s per cell
  (embedding -> 2-layer encoder -> softmax, SGD with gradient clipping);
* :func:`machine_gflops` — this machine's large matrix-multiply rate (the floor);
* :func:`render` — a ``rich`` table of the rows; :func:`to_json` — the rows as JSON.

Timing: ``warmup`` untimed iterations, then ``repeats`` timed rounds; each row
reports the median (and the minimum) seconds per iteration.  Tokens per
iteration = real (unpadded) tokens of the batch.  Ratios are median against
median.  Memory: on CUDA the peak allocated bytes of one iteration; on CPU the
bytes an iteration keeps for its backward pass (every tensor saved for
backward, distinct storages counted once), which is what grows with the model
and the sequence; PyTorch offers no per-iteration peak on CPU.

Nothing is imported until it is asked for (``bench.bench_cells`` imports
:mod:`.cells` then): ``python -m lstmablate.bench.gpu_check`` and ``python -m
lstmablate.bench.window`` start with the standard library alone, on a GPU machine where the
project's other dependencies may not be installed yet.
"""

from __future__ import annotations

import importlib
from typing import Any

# (the standard library alone; bound now, since the module's own name is one of them)
from .render import render, to_json, to_markdown  # noqa: F401  (re-exported)

#: each other public name and the submodule that defines it
_HOMES = {
    "DEFAULT_SHAPES": "cells", "GPU_TARGETS": "cells", "Shape": "cells", "bench_cells": "cells",
    "parse_shape": "cells", "environment": "measure", "machine_gflops": "measure",
    "matrix_entries": "measure", "MODEL_SIZES": "models", "bench_models": "models",
}

__all__ = sorted([*_HOMES, "record", "render", "to_json", "to_markdown"])


def __getattr__(name: str) -> Any:
    """The public names, each imported from its submodule at first use (PEP 562)."""
    if name == "record":
        return importlib.import_module(f"{__name__}.record")
    if name in _HOMES:
        return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
