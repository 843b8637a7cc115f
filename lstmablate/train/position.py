"""Where a run is: the trainer's position (epoch, batch, step, the best checkpoint so far, the
running training loss), saved in every ``last.pt`` and restored by ``--resume``.

Where a run is in its data follows from it: epoch ``e``'s batches come in the order that
:func:`data_generator` fixes for the run's seed and ``e``, so a resumed run rebuilds the
epoch's plan and starts at the saved batch.

It has a module of its own because several parts of the training package read it: the
trainer, which moves it on, its step (:mod:`.step`) and what it saves (:mod:`.saving`), and
the progress line (:mod:`.progress`), which reports it. None of those needs another to know
where the run is."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch


@dataclass
class Position:
    """Where the run is; saved in every checkpoint."""

    epoch: int = 0  # 0-based epoch in progress
    batch: int = 0  # next batch index within that epoch
    step: int = 0  # optimiser steps done
    best_value: float | None = None
    best_step: int = -1
    best_epoch: int = -1
    evals_since_best: int = 0
    metrics_lines: int = 0
    train_time_s: float = 0.0
    # CPU seconds of the training process (time.process_time); None: not known (a run begun
    # by a version that did not count them, resumed by this one)
    train_cpu_s: float | None = None
    skipped_nonfinite: int = 0
    last_eval_step: int = -1
    last_finite_loss: float | None = None
    done: bool = False
    loss_sum: float = 0.0  # running train loss since the last evaluation
    loss_n: int = 0
    # the learning rate in force: a schedule change decided by a mid-epoch evaluation (plateau)
    # takes effect at the next epoch, in a resumed run as in an uninterrupted one
    lr: float | None = None
    best_dev: dict[str, float] | None = None  # the dev metrics of best.pt
    #: fields added after checkpoints without them were written (they take the defaults)
    ADDED: ClassVar[tuple[str, ...]] = ("lr", "best_dev", "train_cpu_s")
    #: fields NaN is a valid value in (a secondary dev metric may come out NaN)
    NAN_ALLOWED: ClassVar[tuple[str, ...]] = ("best_dev",)


def data_generator(seed: int, epoch: int) -> torch.Generator:
    """The generator that fixes epoch ``epoch``'s data order for run seed ``seed``."""
    return torch.Generator().manual_seed(seed * 1_000_003 + epoch)
