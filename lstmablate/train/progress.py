"""What the trainer keeps between host reads, and what it reports: the running training loss
(summed on the device, read every ``log_interval`` seconds and before every evaluation and
checkpoint), the NaN/inf guard of a step that reads nothing back, and the progress line."""

from __future__ import annotations

import math
import time

import torch
from torch import Tensor

from .position import Position


class Running:
    """The running training loss since the last evaluation, summed on the device in float64
    (the same additions, in the same order, as a host-side sum: resume stays exact), the
    tokens seen, and in deferred mode the NaN/inf guard: the first non-finite step and the
    last finite loss, kept on the device until :meth:`read_guard`."""

    def __init__(self, device: torch.device, loss_sum: float, *, deferred: bool):
        self.device, self.deferred = device, deferred
        self.sum = torch.tensor(loss_sum, dtype=torch.float64, device=device)
        self.tokens: float | Tensor = 0.0  # since the start of this process
        if deferred:
            self.first_bad = torch.tensor(-1, dtype=torch.int64, device=device)
            self.last_finite = torch.tensor(math.nan, dtype=torch.float64, device=device)

    def reset(self, loss_sum: float) -> None:
        self.sum.fill_(loss_sum)

    def add(self, loss: float | Tensor, tokens: float | Tensor) -> None:
        self.sum += loss.double() if isinstance(loss, Tensor) else loss
        self.tokens = self.tokens + (tokens.detach() if isinstance(tokens, Tensor) else tokens)

    def watch(self, loss: Tensor, norm: Tensor, step: int) -> None:
        ok = torch.isfinite(loss) & torch.isfinite(norm)
        self.first_bad = torch.where(~ok & (self.first_bad < 0), step, self.first_bad)
        self.last_finite = torch.where(torch.isfinite(loss), loss.double(), self.last_finite)

    def loss_sum(self) -> float:
        return float(self.sum)

    def tokens_seen(self) -> float:
        return float(self.tokens)

    def read_guard(self) -> tuple[int | None, float | None]:
        """(the first non-finite step or None, the last finite loss or None)."""
        bad, last = int(self.first_bad), float(self.last_finite)
        return (bad if bad >= 0 else None), (last if math.isfinite(last) else None)


class ProgressLine:
    """When a progress report is due (every ``log_interval`` seconds; at most once a second on
    a terminal), and its text: steps, tokens/s, the mean training loss since the last
    report, the learning rate and the epoch's ETA.

    It reads the run's :class:`Position` and its :class:`Running` loss, and never the trainer
    itself: the trainer brings both up to date (``Trainer._sync``) before it makes the line
    and before each :meth:`text`."""

    def __init__(self, pos: Position, running: Running, n_batches: int, *,
                 log_interval: float, terminal: bool):
        self.pos, self.running, self.n_batches = pos, running, n_batches
        self.t0 = self.last = time.perf_counter()
        self.batch0 = pos.batch
        self.interval = min(1.0, log_interval) if terminal else log_interval
        self.mark = self._mark(self.t0)

    def _mark(self, now: float) -> tuple[int, int, float, float, float]:
        pos = self.pos
        return pos.last_eval_step, pos.loss_n, pos.loss_sum, self.running.tokens_seen(), now

    def due(self) -> bool:
        return time.perf_counter() - self.last >= self.interval

    def text(self, lr: float) -> dict[str, str]:
        """The report (call after ``Trainer._sync``, so that the position's loss is current)."""
        pos, now = self.pos, time.perf_counter()
        self.last = now
        eval_step, n0, sum0, tok0, t0 = self.mark
        if pos.last_eval_step != eval_step:  # an evaluation restarted the running loss since
            n0, sum0 = 0, 0.0
        loss = (pos.loss_sum - sum0) / (pos.loss_n - n0) if pos.loss_n > n0 else math.nan
        self.mark = self._mark(now)
        rate = (pos.batch - self.batch0) / max(now - self.t0, 1e-9)
        eta = (self.n_batches - pos.batch) / max(rate, 1e-9)
        tok_s = (self.mark[3] - tok0) / max(now - t0, 1e-9)
        line = (f"epoch {pos.epoch + 1} batch {pos.batch}/{self.n_batches} step {pos.step}: "
                f"train loss {loss:.4f}  {tok_s:,.0f} tokens/s  lr {lr:.3g}  "
                f"epoch ETA {_duration(eta)}")
        return {"loss": f"{loss:.4f}", "line": line}


def _duration(seconds: float) -> str:
    """``1h02m``, ``4m05s`` or ``37s``."""
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"
