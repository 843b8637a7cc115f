"""The training loop. It knows nothing about tasks beyond the Task interface.

:meth:`Trainer.fit` runs the epochs; each epoch takes the task's batch plan for its seed
and epoch (``position.data_generator``) and one optimiser step per batch (``step.py``: the
loss, backward, clipping, the NaN/inf guard, the running loss on the device; the forward
passes of training and evaluation in ``train.precision``, the float32 products' flags for
the whole run).  Evaluation of the primary dev metric every epoch (or every ``eval_every``
steps) appends a line to ``metrics.jsonl``, keeps ``best.pt`` and writes ``last.pt`` —
atomically, with every RNG state and the data position, so ``--resume`` continues exactly
where the run stopped (``saving.py``); ``last.pt`` is also saved between evaluations every
``train.save_every_minutes``.  The schedule and early stopping follow the
evaluations.  SIGINT/SIGTERM finish the current step, save ``last.pt`` and return.  At the
end the selected checkpoint is evaluated item by item (``Task.evaluate_items``).
"""

from __future__ import annotations

import math
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from lstmablate.console import escape
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                           TimeElapsedColumn, TimeRemainingColumn)
from torch import nn

from lstmablate.config import TrainConfig
from lstmablate.errors import UserError
from lstmablate.task import Metric

from .capture import StepCapture
from .checkpoint import check_model_state, load_checkpoint
from .distributed import DistInfo, all_reduce_sum, barrier
from .optim import Schedule, build_optimizer, clip_scope_parameters
from .position import Position, data_generator
from .precision import Precision
from .progress import ProgressLine, Running
from .saving import RunPaths, Saving
from .step import Steps


class NothingTrained(UserError):
    """A run that ended without one optimiser step on a finite loss (every batch skipped or
    zeroed as non-finite): it has no result to report."""


@dataclass
class TrainResult:
    best: dict[str, Any]  # {"step", "epoch", "dev": metrics} of the selected checkpoint
    test: dict[str, float] | None
    steps: int
    epochs_completed: int
    train_time_s: float
    train_cpu_s: float | None = None  # CPU seconds of the process over the same spans
    interrupted: bool = False
    skipped_nonfinite: int = 0
    dev_final: dict[str, float] | None = None  # evaluate(dev, final=True) if the task's differs
    # the final evaluations item by item (Task.evaluate_items), by split; for the scores files
    items: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


class Trainer(Saving, Steps):
    """A run's training: the loop is here; its step is :class:`~.step.Steps`, what it saves
    and how it resumes :class:`~.saving.Saving`."""

    def __init__(
        self,
        cfg: TrainConfig,
        task: Any,
        model: nn.Module,
        files: RunPaths,
        *,
        seed: int,
        device: torch.device,
        identity: dict[str, Any],
        console: Console | None = None,
        progress: bool | None = None,
        dist_info: DistInfo | None = None,
        tensorboard: dict[str, Any] | None = None,
        log_interval: float = 30.0,
        defer_host_reads: bool | None = None,
    ):
        self.cfg, self.task, self.model = cfg, task, model
        self.dist = dist_info or DistInfo()
        self.train_model: nn.Module = model  # DDP-wrapped in fit() under torchrun
        self.files = files
        self.run_dir = Path(files.root)
        self.seed, self.device = seed, device
        self.identity = identity
        self.console = console or Console(stderr=True)
        self.show_progress = self.console.is_terminal if progress is None else progress
        self.primary: Metric = task.primary
        self.optimizer = build_optimizer(cfg, model)
        self.precision = Precision(cfg.precision, device)
        self.clipped = clip_scope_parameters(model, cfg.clip_scope)
        self.schedule = Schedule(cfg, self.optimizer)
        self.pos = Position(train_cpu_s=0.0)
        self.carry: Any = None
        self._stop_signal: str | None = None
        self._t_start: float | None = None  # perf_counter at the (virtual) start of training
        self._cpu_start = 0.0  # process_time at the same (virtual) start
        self.tb_config = tensorboard  # the resolved config: log to <run>/tensorboard when given
        self.tb: Any = None
        # seconds between plain progress lines (no terminal) and between host reads of the
        # running loss and the NaN/inf guard (deferred mode, see step.py)
        self.log_interval = log_interval
        # None: defer on CUDA (one process, nonfinite: stop, no TensorBoard); True/False forces
        # it (with nonfinite: stop only: skipping a batch needs its loss on the host at once)
        self.defer_host_reads = defer_host_reads
        self._acc: Running | None = None
        self.capture: StepCapture | None = None  # train.step_capture (made in fit)

    # -- the loop --------------------------------------------------------------------------
    def fit(self, resume: bool = False, checkpoint: dict[str, Any] | None = None) -> TrainResult:
        """Train; with ``resume``, continue from ``last.pt`` (or ``checkpoint``, already loaded).
        The float32 products follow ``train.precision`` throughout (restored afterwards)."""
        with self.precision.products():
            return self._fit(resume, checkpoint)

    def _fit(self, resume: bool, checkpoint: dict[str, Any] | None) -> TrainResult:
        cfg = self.cfg
        self.run_dir.mkdir(parents=True, exist_ok=True)
        old_handlers = self._install_signal_handlers()  # from here on Ctrl-C saves and stops
        try:
            if resume and self.last_path.exists():
                self._resume(checkpoint)
                self.console.print(f"resuming at epoch {self.pos.epoch + 1}, batch {self.pos.batch}, "
                                   f"step {self.pos.step}")
            else:
                self._truncate_metrics(0)
            if self.tb_config is not None and self.dist.is_main:
                from .tensorboard import TensorBoardLogger

                self.tb = TensorBoardLogger(self.files.tensorboard, self.tb_config,
                                            purge_step=self.pos.step + 1 if self.pos.step else None)
            self.model.to(self.device).train()
            if self.dist.enabled:
                from torch.nn.parallel import DistributedDataParallel

                ids = [self.device.index] if self.device.type == "cuda" else None
                self.train_model = DistributedDataParallel(self.model, device_ids=ids)
        except BaseException:
            for sig, handler in old_handlers.items():
                signal.signal(sig, handler)
            raise
        self.prepare_steps()
        self._t_start = time.perf_counter() - self.pos.train_time_s
        self._saved_at = time.perf_counter()  # train.save_every_minutes counts from here
        self._cpu_start = time.process_time() - (self.pos.train_cpu_s or 0.0)
        progress = Progress(
            TextColumn("[bold blue]epoch {task.fields[epoch]}"), BarColumn(),
            MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
            TextColumn("loss {task.fields[loss]}  lr {task.fields[lr]}"),
            console=self.console, disable=not self.show_progress, transient=True)
        try:
            with progress:
                while not self.pos.done and self.pos.epoch < cfg.max_epochs:
                    self._run_epoch(progress)
                    if self._stop_signal:
                        break
        finally:
            for sig, handler in old_handlers.items():
                signal.signal(sig, handler)
        self._clock()
        if self.capture.on:  # what train.step_capture did, in one line
            r = self.capture.record()
            self.console.print(f"step capture ({r['mode']}): {r['captures']} shapes, "
                               f"{r['replays']} replayed steps, {r['eager']} eager"
                               + (f"; fell back: {r['fallback']}" if r["fallback"] else ""),
                               soft_wrap=True, highlight=False)
        if self._stop_signal:
            self._save_last()
            if self.tb is not None:
                self.tb.close()
            return TrainResult(best=self._best_info(), test=None, steps=self.pos.step,
                               epochs_completed=self.pos.epoch, train_time_s=self.pos.train_time_s,
                               train_cpu_s=self.pos.train_cpu_s, interrupted=True,
                               skipped_nonfinite=self.pos.skipped_nonfinite)
        self._check_trained()
        if self.pos.last_eval_step != self.pos.step:  # the final state was never evaluated
            lr = self.pos.lr if self.pos.lr is not None else self.schedule.lr_at(
                min(self.pos.epoch, cfg.max_epochs - 1), self.pos.step)
            self._dev_evaluation(lr)
        self.pos.done = True
        self._save_last()
        test = dev_final = None
        items: dict[str, list[dict[str, Any]]] = {}
        barrier(self.dist)  # rank 0 has written best.pt
        if cfg.test_checkpoint == "best" and (cfg.eval_test or self.task.final_differs):
            best = load_checkpoint(self.best_path, expect=self.identity)
            check_model_state(best.get("model"), self.model, self.best_path)
            self.model.load_state_dict(best["model"])  # else: the model as training left it
        if self.task.final_differs:  # e.g. beam search where selection used perplexity
            dev_final = self._final_evaluation(self.task.dev_split, items)
        if cfg.eval_test and self.task.test_split:
            test = self._final_evaluation(self.task.test_split, items)
        if self.tb is not None:
            if test is not None:
                self.tb.log_metrics(self.pos.step, self.task.test_split, test)
            self.tb.close()
        return TrainResult(best=self._best_info(), test=test, dev_final=dev_final, steps=self.pos.step,
                           epochs_completed=self._epoch_label() if self.pos.step else 0,
                           train_time_s=self.pos.train_time_s, train_cpu_s=self.pos.train_cpu_s,
                           skipped_nonfinite=self.pos.skipped_nonfinite, items=items)

    def _run_epoch(self, progress: Progress) -> None:
        cfg, pos = self.cfg, self.pos
        if pos.batch == 0 or pos.lr is None:  # a new epoch: the schedule decides
            lr = self._set_lr(self.schedule.lr_at(pos.epoch, pos.step))
        else:  # resuming mid-epoch: the rate that was in force
            lr = self._set_lr(pos.lr)
        if pos.batch == 0:
            self.carry = self.task.init_carry(self.model)
        # the epoch's batches, fixed by its generator; resuming starts at the saved position
        plan = self.task.train_plan(pos.epoch, data_generator(self.seed, pos.epoch))
        n_batches = len(plan)
        bar = progress.add_task("train", total=n_batches, completed=pos.batch, epoch=pos.epoch + 1,
                                loss="-", lr=f"{lr:.3g}")
        self._sync()  # the progress line starts from the position's current loss
        line = ProgressLine(pos, self._acc, n_batches, log_interval=self.log_interval,
                            terminal=self.show_progress)
        for i in range(pos.batch, n_batches):
            batch = plan[i]
            if cfg.schedule == "exponential":
                lr = self._set_lr(self.schedule.lr_at(pos.epoch, pos.step))
            loss_value = self._train_step(batch)
            pos.batch = i + 1
            if self.tb is not None and loss_value is not None:
                self.tb.log_train(pos.step, loss_value, lr)
            progress.update(bar, completed=pos.batch)
            if line.due():
                self._sync()
                text = line.text(lr)
                if self.show_progress:
                    progress.update(bar, loss=text["loss"], lr=f"{lr:.3g}")
                else:  # plain log lines (a pipe, a log file, CI): one every log_interval s
                    self.console.print(text["line"], highlight=False, soft_wrap=True)
            if cfg.eval_every and pos.step % cfg.eval_every == 0:
                self._dev_evaluation(lr)
                self._save_last()
                if self._early_stop():
                    break
            if cfg.max_steps and pos.step >= cfg.max_steps:
                pos.done = True
                break
            if pos.batch < n_batches and self._save_due():  # (the epoch's end saves anyway)
                self._save_last()  # between evaluations: a kill outright loses at most this
            if self.dist.enabled:  # every rank stops at the same step
                stop = all_reduce_sum(1.0 if self._stop_signal else 0.0, self.dist, self.device)
                if stop and not self._stop_signal:
                    self._stop_signal = "SIGINT"
            if self._stop_signal:
                progress.remove_task(bar)
                self.console.print(f"[yellow]{self._stop_signal}[/]: stopped at epoch {pos.epoch + 1}, "
                                   f"batch {pos.batch}, step {pos.step}; saving "
                                   f"{escape(str(self.last_path))}.", soft_wrap=True)
                return
        progress.remove_task(bar)
        if pos.done:
            return
        epoch_finished = pos.batch >= n_batches
        if not cfg.eval_every:
            self._dev_evaluation(lr)
        if self._early_stop():
            pos.done = True
        if epoch_finished or pos.done:
            pos.epoch += 1
            pos.batch = 0
        self._save_last()

    def _early_stop(self) -> bool:
        target, best = self.cfg.stop_at, self.pos.best_value
        if target is not None and best is not None and not self.primary.better(target, best):
            self.console.print(f"stopping: dev {self.primary.name} {best:.4g} reached train.stop_at={target}")
            self.pos.done = True
            return True
        if self.cfg.patience and self.pos.evals_since_best >= self.cfg.patience:
            self.console.print(f"early stopping: no improvement of {self.primary.name} in "
                               f"{self.cfg.patience} evaluations")
            self.pos.done = True
            return True
        return False

    # -- evaluation ---------------------------------------------------------------------------
    def _dev_evaluation(self, lr: float) -> None:
        self._sync()
        metrics = self._evaluate(self.task.dev_split)
        value = metrics[self.primary.name]
        improved = math.isfinite(value) and self.primary.better(value, self.pos.best_value)
        train_loss = self.pos.loss_sum / self.pos.loss_n if self.pos.loss_n else None
        record = {"step": self.pos.step, "epoch": self._epoch_label(), "lr": lr,
                  "train_loss": train_loss, "split": self.task.dev_split, **metrics}
        self._append_metrics(record)
        if self.tb is not None:
            self.tb.log_eval(self.pos.step, record)
        self.pos.loss_sum, self.pos.loss_n = 0.0, 0
        self._acc.reset(0.0)
        self.pos.last_eval_step = self.pos.step
        if improved:
            self.pos.best_value, self.pos.best_step = value, self.pos.step
            self.pos.best_epoch = self._epoch_label()
            self.pos.best_dev = dict(metrics)
            self.pos.evals_since_best = 0
            self._save_best(metrics)
        else:
            self.pos.evals_since_best += 1
        self.schedule.observe(improved, value, self._epoch_label(), self.primary.higher_is_better)
        barrier(self.dist)
        shown = "  ".join(f"{self.task.metric_name(k)} {self.task.format_metric(k, v)}"
                          for k, v in metrics.items())
        loss_txt = f"train loss {train_loss:.4f}  " if train_loss is not None else ""
        self.console.print(f"[bold]eval[/] step {self.pos.step} epoch {self._epoch_label()}: "
                           f"{loss_txt}{self.task.dev_split} {escape(shown)}"
                           + ("  [green]best[/]" if improved else ""), soft_wrap=True)

    def _evaluate(self, split: str, final: bool = False) -> dict[str, float]:
        self.model.eval()
        with torch.random.fork_rng(devices=[]), torch.no_grad(), self.precision.autocast():
            metrics = self.task.evaluate(self.model, split, final=final)
        self.model.train()
        return {k: float(v) for k, v in metrics.items()}

    def _final_evaluation(self, split: str, items: dict[str, list[dict[str, Any]]]
                          ) -> dict[str, float]:
        """``evaluate(split, final=True)`` through ``Task.evaluate_items``: its records (if the
        task scores items) go to ``items[split]``."""
        self.model.eval()
        with torch.random.fork_rng(devices=[]), torch.no_grad(), self.precision.autocast():
            metrics, records = self.task.evaluate_items(self.model, split)
        self.model.train()
        if records is not None:
            items[split] = records
        return {k: float(v) for k, v in metrics.items()}

    # -- the loop's bookkeeping -----------------------------------------------------------
    def _check_trained(self) -> None:
        """NothingTrained unless at least one optimiser step was taken on a finite loss: a run
        whose every batch was skipped (``nonfinite: skip``) or had its non-finite gradient
        zeroed (``nonfinite: zero``) is its initialisation, and its numbers are no result.
        The run folder keeps what it wrote (metrics.jsonl, last.pt); no result.json is written."""
        self._sync()
        pos = self.pos
        if pos.step and pos.last_finite_loss is not None:
            return
        if pos.step:
            how = (f"every one of its {pos.step} optimiser steps had a non-finite loss "
                   f"(train.nonfinite={self.cfg.nonfinite} set the gradients' non-finite entries "
                   "to 0)")
        elif pos.skipped_nonfinite:
            how = (f"all {pos.skipped_nonfinite} of its training batches were skipped as "
                   "non-finite (train.nonfinite=skip), so no optimiser step was taken")
        else:
            how = "no optimiser step was taken"
        raise NothingTrained(
            f"the run in {self.run_dir} did not train: {how}. The model is still its "
            "initialisation, so no result.json was written (its dev and test numbers would mean "
            "nothing). A loss that is non-finite from the first batch on comes from the inputs "
            "or the model's numbers (NaN or infinite values in the data or in pretrained "
            "vectors, a huge model.init_scale) rather than from training; fix the cause, then "
            "start the run again with the same command plus --force.")

    def _epoch_label(self) -> int:
        """The 1-based epoch the last step belongs to (at an epoch boundary: the one ended)."""
        pos = self.pos
        return pos.epoch if pos.batch == 0 and pos.epoch > 0 else pos.epoch + 1

    def _set_lr(self, lr: float) -> float:
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.pos.lr = lr
        return lr

    # -- signals ------------------------------------------------------------------------
    def _on_signal(self, signum: int, frame: Any) -> None:
        if self._stop_signal is not None:
            if signum == signal.SIGINT:  # a second Ctrl-C: give up at once
                raise KeyboardInterrupt
            return  # SIGTERM again (Slurm signals every process of a job, srun forwards too)
        self._stop_signal = signal.Signals(signum).name

    def _install_signal_handlers(self) -> dict[int, Any]:
        old = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                old[sig] = signal.signal(sig, self._on_signal)
            except ValueError:  # not in the main thread
                pass
        return old
