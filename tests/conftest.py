"""Shared fixtures: a tiny Dyck recipe and a runs directory per test."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)

# Without a GPU the Triton kernels run on CPU tensors under Triton's interpreter, which Triton
# reads when it is imported (tests/test_kernels_triton.py; tests/gpu/ runs them compiled).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.fixture
def real_data_dir() -> Path:
    """The real benchmark data: $LSTMABLATE_DATA, else ../shared/data; skip if absent."""
    d = Path(os.environ.get("LSTMABLATE_DATA") or SHARED_DATA)
    if not d.exists():
        pytest.skip(f"real data not found at {d} (set LSTMABLATE_DATA)")
    return d


TINY_DYCK = """\
task: dyck
experiment: tiny
data:
  k: 2
  m: 3
  train_tokens: 0
  train_sequences: 64
  dev_sequences: 16
  test_sequences: 16
  train_max_length: 16
  batch_size: 16
model:
  embedding_dim: 8
  hidden_size: 8
train:
  optimizer: adam
  lr: 0.02
  max_epochs: 2
  schedule: constant
  patience: 0
cells: [lstm, lstm-srnn]
seeds: [1, 2]
reference:
  lstm: {accuracy: 99.0}
reference_source: "made up for the test"
"""


@pytest.fixture
def tiny_recipe(tmp_path: Path) -> Path:
    p = tmp_path / "tiny.yaml"
    p.write_text(TINY_DYCK)
    return p
