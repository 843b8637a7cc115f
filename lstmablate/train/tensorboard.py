"""Optional TensorBoard logging of a run (``lstmablate train --tensorboard``).

Writes ``<log_dir>/events.out.tfevents.*`` (a run's ``tensorboard/``) through
``torch.utils.tensorboard.SummaryWriter``, which needs the ``tensorboard``
package (``pip install 'lstmablate[tensorboard]'``); without it the logger
refuses with a UserError saying what to install, and nothing else changes.

What is logged (view with ``tensorboard --logdir runs/``):

* the resolved config, as text (tag ``config``), once;
* per evaluation (:meth:`log_eval`, a metrics.jsonl record): every metric of the
  split as ``<split>/<metric>`` (e.g. ``dev/loss``), ``train/loss`` (the mean
  training loss since the previous evaluation), ``train/lr`` and ``progress/epoch``;
* per training step window (:meth:`log_train`, called every step):
  ``train/loss_window``, the mean loss over the last ``every`` steps, and
  ``train/lr``, written at every ``every``-th step;
* final metrics (:meth:`log_metrics`, e.g. the test split at the end).

A resumed run passes ``purge_step`` = its checkpoint's step + 1: TensorBoard then
drops the events the interrupted session wrote after the checkpoint, so the curves
have no doubled segments (the first loss window after a resume averages only the
steps done since).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import yaml

from lstmablate.errors import UserError

INSTALL_HINT = ("TensorBoard logging needs the `tensorboard` package: pip install "
                "'lstmablate[tensorboard]' (or pip install tensorboard). Without --tensorboard "
                "nothing needs it; metrics.jsonl has the same numbers.")

#: the files SummaryWriter writes in the log folder (all a run's ``tensorboard/`` holds)
EVENTS_GLOB = "events.out.tfevents.*"

#: columns of a metrics.jsonl record that are not metrics of the split
_BOOKKEEPING = ("step", "epoch", "split", "lr", "train_loss")


def require_tensorboard() -> None:
    """UserError unless TensorBoard logging is possible; call it before a run starts."""
    try:
        import torch.utils.tensorboard  # noqa: F401
    except ImportError:
        raise UserError(INSTALL_HINT) from None


def _scalar(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


class TensorBoardLogger:
    """Scalars and the config of one run, for TensorBoard; only the main process logs."""

    def __init__(self, log_dir: Path, config: dict[str, Any], *, every: int = 50,
                 purge_step: int | None = None):
        require_tensorboard()
        from torch.utils.tensorboard import SummaryWriter

        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self.log_dir = Path(log_dir)
        self.every = every
        self._writer = SummaryWriter(log_dir=str(self.log_dir), purge_step=purge_step)
        self._loss_sum, self._loss_n = 0.0, 0
        if purge_step is None:  # the config is logged once, when the run starts
            text = yaml.safe_dump(config, sort_keys=False)
            # four-space indent: a markdown code block in TensorBoard's text tab
            self._writer.add_text("config", "\n".join("    " + line for line in text.splitlines()), 0)

    def log_metrics(self, step: int, split: str, metrics: dict[str, Any]) -> None:
        """``<split>/<metric>`` for every finite number in ``metrics``."""
        for name, value in metrics.items():
            v = _scalar(value)
            if v is not None:
                self._writer.add_scalar(f"{split}/{name}", v, step)

    def log_eval(self, step: int, record: dict[str, Any]) -> None:
        """One evaluation: a metrics.jsonl record (step, epoch, lr, train_loss, split, metrics)."""
        split = str(record.get("split") or "dev")
        self.log_metrics(step, split, {k: v for k, v in record.items() if k not in _BOOKKEEPING})
        for tag, key in (("train/loss", "train_loss"), ("train/lr", "lr"), ("progress/epoch", "epoch")):
            v = _scalar(record.get(key))
            if v is not None:
                self._writer.add_scalar(tag, v, step)
        self._writer.flush()

    def log_train(self, step: int, loss: float, lr: float) -> None:
        """Call after every optimiser step; writes the window's mean loss every ``every`` steps."""
        v = _scalar(loss)
        if v is not None:
            self._loss_sum += v
            self._loss_n += 1
        if step % self.every == 0:
            if self._loss_n:
                self._writer.add_scalar("train/loss_window", self._loss_sum / self._loss_n, step)
            self._writer.add_scalar("train/lr", float(lr), step)
            self._loss_sum, self._loss_n = 0.0, 0

    def close(self) -> None:
        self._writer.flush()
        self._writer.close()

    def __enter__(self) -> TensorBoardLogger:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
