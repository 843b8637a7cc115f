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

#: why a test that reads the real benchmark data is skipped without it
NO_REAL_DATA = ("needs the real benchmark data: set LSTMABLATE_DATA to its directory "
                "(data/README.md says what goes in it)")


def real_data_root() -> Path | None:
    """The real benchmark data's directory, $LSTMABLATE_DATA (CI sets it); None if unset."""
    value = os.environ.get("LSTMABLATE_DATA", "").strip()
    return Path(value) if value else None


def skip_without_real_data(*relpaths: str) -> Path:
    """$LSTMABLATE_DATA, or the test skipped saying why: unset, or without ``relpaths`` (each
    plain or .gz)."""
    root = real_data_root()
    if root is None:
        pytest.skip(NO_REAL_DATA)
    for rel in relpaths:
        if not (root / rel).exists() and not (root / f"{rel}.gz").exists():
            pytest.skip(f"{rel} is not in $LSTMABLATE_DATA ({root}); data/README.md says how to "
                        "get it")
    if not root.exists():
        pytest.skip(f"$LSTMABLATE_DATA ({root}) does not exist")
    return root


@pytest.fixture
def real_data_dir() -> Path:
    """The real benchmark data ($LSTMABLATE_DATA); the test is skipped, saying why, without."""
    return skip_without_real_data()


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


def record_text(path: Path) -> str:
    """A record's text as lstmablate reads it: a ``scores/<split>.jsonl.gz`` decompressed."""
    from lstmablate.io import read_text

    return read_text(path)


def write_record_text(path: Path, text: str) -> None:
    """``text`` written into a record as lstmablate writes it: gzip-compressed where the name
    ends in ``.gz`` (a test that damages a scores file damages its lines, not its stream)."""
    from lstmablate.io import atomic_write_as_named

    atomic_write_as_named(path, lambda f: f.write(text.encode("utf-8")))
