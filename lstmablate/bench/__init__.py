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
"""

from __future__ import annotations

from .cells import DEFAULT_SHAPES, GPU_TARGETS, Shape, bench_cells, parse_shape
from .measure import environment, machine_gflops, matrix_entries
from .models import MODEL_SIZES, bench_models
from .render import render, to_json, to_markdown
from . import record

__all__ = ["DEFAULT_SHAPES", "GPU_TARGETS", "MODEL_SIZES", "Shape", "bench_cells", "bench_models",
           "environment", "machine_gflops", "matrix_entries", "parse_shape", "render", "to_json",
           "to_markdown", "record"]
