"""One optimiser step of the training loop (:class:`Steps`, part of
:class:`~lstmablate.train.trainer.Trainer`), and what the steps need before the first one.

Per step: the task's loss (threading its ``carry``), backward, global-norm clipping, a
NaN/inf guard, the optimiser step; the forward pass in ``train.precision``
(``precision.py``: autocast for bf16 / fp16, a gradient scaler for fp16).  On CUDA (one
process, ``nonfinite: stop``, no TensorBoard) a step reads nothing back to the host: the
running loss and the NaN/inf guard live on the device (``progress.Running``) and are read
by :meth:`Steps._sync`, every ``log_interval`` seconds and before every evaluation and
checkpoint, so the GPU never waits for Python; a non-finite step is still named exactly and
never saved.  With ``train.step_capture`` the step is compiled or recorded as a CUDA graph
per static shape (``capture.py``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from torch import Tensor, nn

from lstmablate.config import TrainConfig
from lstmablate.errors import UserError

from .capture import StepCapture
from .distributed import DistInfo, all_reduce_sum
from .position import Position, data_generator
from .precision import Precision
from .progress import Running


class TrainingDiverged(UserError):
    """A non-finite loss or gradient with ``nonfinite: stop``."""


class Steps:
    """The trainer's optimiser step: :meth:`prepare_steps` once, then :meth:`train_step` per
    batch (the loop calls :meth:`_train_step`), :meth:`_sync` to read the running loss and
    the NaN/inf guard on the host.  A part of :class:`~lstmablate.train.trainer.Trainer`,
    which sets the attributes below."""

    cfg: TrainConfig
    task: Any
    model: nn.Module
    train_model: nn.Module  # the model, DDP-wrapped under torchrun
    optimizer: torch.optim.Optimizer
    precision: Precision
    clipped: list[nn.Parameter]  # the parameters train.clip_scope names
    dist: DistInfo
    device: torch.device
    seed: int
    console: Console
    pos: Position
    carry: Any
    tb_config: dict[str, Any] | None
    defer_host_reads: bool | None
    last_path: Path
    best_path: Path
    run_dir: Path
    _acc: Running | None
    capture: StepCapture | None

    def prepare_steps(self) -> None:
        """What the steps need before the first one (``fit`` does it; a benchmark of
        :meth:`train_step` too): the running loss, read back per step or deferred, and the
        step capture (``train.step_capture``), its shapes chosen from the first epoch's
        batches (as on resume)."""
        defer = self.defer_host_reads
        if defer is None:
            defer = self.device.type == "cuda" and not self.dist.enabled and self.tb_config is None
        self._acc = Running(self.device, self.pos.loss_sum,
                             deferred=defer and self.cfg.nonfinite == "stop")
        self.capture = StepCapture(self.cfg.step_capture, self.task, self.device, self.optimizer,
                                   slots=self.cfg.capture_slots, why_not=self._why_not_graphs())
        if self.capture.on:
            self.capture.prepare(self.task.train_plan(0, data_generator(self.seed, 0)))

    def train_step(self, batch: Any) -> float | None:
        """One optimiser step on ``batch``, as ``fit`` takes it (after :meth:`prepare_steps`)."""
        return self._train_step(batch)

    def _train_step(self, batch: Any) -> float | None:
        """One optimiser step.  Returns the step's logged loss as a float, or None when the
        step was skipped (``nonfinite: skip``) or when nothing is read back per step
        (deferred mode: the loss stays on the device until :meth:`_sync`)."""
        cfg, pos, acc = self.cfg, self.pos, self._acc
        batch = self.task.batch_to(self.task.shard(batch, self.dist), self.device)
        cap = self.capture
        if cap is not None and cap.on:
            batch = cap.pad(batch)  # to its length bucket (where the task pads)
        amp = self.precision
        if acc.deferred:
            # nothing is read on the host: a non-finite loss or norm is remembered on the
            # device (its step, the last finite loss) and raised at the next _sync, before
            # anything is evaluated or saved (fp16: an overflowed gradient is the scaler's,
            # which skips that step; only the loss is watched); with step_capture=graphs the
            # whole step is one replay of a CUDA graph
            done = cap.step(self._step_body, batch, self.carry) if cap is not None else None
            logged, norm, carry, count = done or self._step_body(batch, self.carry)
            acc.watch(logged, logged if amp.overflow_skips() else norm, pos.step + 1)
            self.carry = carry
            pos.step += 1
            acc.add(logged, count)
            pos.loss_n += 1
            return None
        self.optimizer.zero_grad(set_to_none=True)
        with self.precision.autocast():
            out = self._loss(batch, self.carry)
        loss = out.loss
        logged = (out.logged if out.logged is not None else loss).detach()
        loss_value = float(logged)
        if self.dist.enabled:
            # the loss is a mean over out.weight units (e.g. tokens): weigh each rank's slice by
            # its share so that DDP's gradient average is the gradient of the global-batch loss
            weight = float(out.weight)
            total = all_reduce_sum(weight, self.dist, self.device)
            loss = loss * (weight * self.dist.world_size / total)
            loss_value = all_reduce_sum(loss_value * weight, self.dist, self.device) / total
        finite = math.isfinite(loss_value) and math.isfinite(float(loss.detach()))
        if finite or cfg.nonfinite == "zero":
            amp.backward(loss)
            amp.unscale(self.optimizer)
            if cfg.nonfinite == "zero":  # counted here; _clip_and_norm sets the entries to 0
                bad = any(not bool(torch.isfinite(p.grad).all())
                          for p in self.model.parameters() if p.grad is not None)
                if bad or not finite:
                    pos.skipped_nonfinite += 1
                    self.console.print(f"[yellow]non-finite gradient at step {pos.step + 1}: its "
                                       f"non-finite entries set to 0 ({pos.skipped_nonfinite} so far)[/]")
            norm = self._clip_and_norm()
            # fp16: an overflowed gradient skips its step in the scaler (which lowers its scale)
            finite = bool(torch.isfinite(norm)) or (finite and amp.overflow_skips())
            what = "gradient norm"
        else:
            what = "loss"
        if not finite:
            if cfg.nonfinite == "skip":
                pos.skipped_nonfinite += 1
                self.optimizer.zero_grad(set_to_none=True)
                self.carry = out.carry
                self.console.print(f"[yellow]non-finite {what} at step {pos.step + 1}: batch skipped "
                                   f"({pos.skipped_nonfinite} so far)[/]")
                return None
            raise self._diverged(what, pos.step + 1)
        amp.step(self.optimizer)
        self.carry = out.carry
        pos.step += 1
        if math.isfinite(loss_value):  # (nonfinite: zero takes the step of a non-finite loss)
            pos.last_finite_loss = loss_value
            acc.add(loss_value, out.tokens if out.tokens is not None else out.weight)
            pos.loss_n += 1
        return loss_value

    def _loss(self, batch: Any, carry: Any) -> Any:
        """The task's loss: compiled with step_capture=compile (a shape seen before)."""
        if self.capture is not None:
            return self.capture.loss(self.train_model, batch, carry)
        return self.task.loss(self.train_model, batch, carry)

    def _step_body(self, batch: Any, carry: Any) -> tuple[Tensor, Tensor, Any, Any]:
        """One step that reads nothing back to the host (deferred mode), as a function of its
        batch and carry alone: what step_capture=graphs records.  Returns the logged loss,
        the gradient norm, the carry and the tokens (or weight) of the step."""
        amp = self.precision
        self.optimizer.zero_grad(set_to_none=True)
        with amp.autocast():
            out = self._loss(batch, carry)
        logged = (out.logged if out.logged is not None else out.loss).detach()
        amp.backward(out.loss)
        amp.unscale(self.optimizer)
        norm = self._clip_and_norm()
        amp.step(self.optimizer)
        return logged, norm, out.carry, out.tokens if out.tokens is not None else out.weight

    def _why_not_graphs(self) -> str | None:
        """Why step_capture=graphs cannot record this run's steps (None: it can)."""
        if self.dist.enabled:
            return "data-parallel training"
        if self.precision.state_dict() is not None or self.cfg.precision == "fp16":
            return "fp16's gradient scaler reads the host at every step"
        if not (self._acc is not None and self._acc.deferred):
            return ("a step that reads its loss back to the host (nonfinite: skip or zero, "
                    "TensorBoard, or a CPU device)")
        return None

    def _clip_and_norm(self) -> Tensor:
        """Clip (``clip_norm``, ``clip_scope``) and return the global gradient norm, as a
        tensor (nothing is read on the host).  ``nonfinite: zero`` first sets non-finite
        gradient entries to 0 (Dozat & Manning's optimiser); ``clip_on: update`` leaves the
        clipping to the optimiser, which bounds its update steps instead."""
        cfg = self.cfg
        params = [p for p in self.model.parameters() if p.grad is not None]
        if cfg.nonfinite == "zero":
            for p in params:
                p.grad.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
        clipped = [p for p in self.clipped if p.grad is not None] if cfg.clip_scope else params
        clip_grads = cfg.clip_norm > 0 and cfg.clip_on == "gradient"
        if clip_grads:
            norm = torch.nn.utils.clip_grad_norm_(clipped, cfg.clip_norm)
        if not clip_grads or cfg.clip_scope:
            norm = torch.linalg.vector_norm(
                torch.stack([p.grad.detach().norm() for p in params])) if params else torch.tensor(0.0)
        return norm

    def _diverged(self, what: str, step: int) -> TrainingDiverged:
        return TrainingDiverged(
            f"training diverged: non-finite {what} at step {step} (epoch {self.pos.epoch + 1}); "
            f"the last finite loss was {self.pos.last_finite_loss}. The last good checkpoints "
            f"({self.last_path.name}, {self.best_path.name}) in {self.run_dir} are kept. "
            "Lower train.lr, set train.clip_norm, or set train.nonfinite=skip to skip such batches.")

    def _sync(self) -> None:
        """Read the device-side running loss (and, deferred, the NaN/inf guard) on the host."""
        acc = self._acc
        if acc is None:
            return
        self.pos.loss_sum = acc.loss_sum()
        if acc.deferred:
            bad, last_finite = acc.read_guard()
            if last_finite is not None:
                self.pos.last_finite_loss = last_finite
            if bad is not None:
                raise self._diverged("loss or gradient norm", bad)
