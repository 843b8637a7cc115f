"""The training loop. It knows nothing about tasks beyond the Task interface.

Per optimiser step: the task's loss (threading its ``carry``), backward,
global-norm clipping, a NaN/inf guard, the optimiser step and the schedule; the forward
passes of training and evaluation in ``train.precision`` (``precision.py``: autocast for
bf16 / fp16, a gradient scaler for fp16, the float32 products' flags for the whole run).
On CUDA (one process, ``nonfinite: stop``, no TensorBoard) a step reads nothing back to
the host: the running loss and the NaN/inf guard live on the device and are read every
``log_interval`` seconds and before every evaluation and checkpoint, so the GPU never
waits for Python; a non-finite step is still named exactly and never saved.
Evaluation of the primary dev metric every epoch (or every ``eval_every``
steps) appends a line to ``metrics.jsonl``, keeps ``best.pt`` and writes
``last.pt`` — atomically, with every RNG state and the data position, so
``--resume`` continues exactly where the run stopped.  SIGINT/SIGTERM finish
the current step, save ``last.pt`` and return.
"""

from __future__ import annotations

import math
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from rich.console import Console
from lstmablate.console import escape
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                           TimeElapsedColumn, TimeRemainingColumn)
from torch import Tensor, nn

from lstmablate.config import TrainConfig
from lstmablate.errors import UserError
from lstmablate.task import Metric

from lstmablate.io import RUN_AGAIN, append_json_line, atomic_write
from .capture import StepCapture
from .checkpoint import (check_carry, check_model_state, check_optimizer_state, check_record,
                         check_rng_state, load_checkpoint, migrate_optimizer_rows, part,
                         rng_state, save_checkpoint, set_rng_state)
from .distributed import DistInfo, all_reduce_sum, barrier
from .optim import Schedule, ScheduleState, build_optimizer, clip_scope_parameters
from .position import Position
from .precision import Precision
from .progress import ProgressLine, Running


class TrainingDiverged(UserError):
    """A non-finite loss or gradient with ``nonfinite: stop``."""


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


class RunPaths(Protocol):
    """Where a run's files go (:class:`lstmablate.run.runs.RunFiles` is one): the trainer is
    handed them and spells no file name itself."""

    root: Path

    @property
    def last(self) -> Path: ...

    @property
    def best(self) -> Path: ...

    @property
    def metrics(self) -> Path: ...

    @property
    def tensorboard(self) -> Path: ...


def check_resume_checkpoint(ckpt: dict[str, Any], path: Path, cfg: TrainConfig,
                            model: nn.Module, hint: str = "") -> None:
    """Every part of a ``last.pt`` that :meth:`Trainer._resume` reads, checked against this
    run's model and optimiser before any of it is used: a damaged part is a CheckpointError
    naming the file and the part (``hint``: what the user can do about it)."""
    check_model_state(part(ckpt, "model", path, "the model's state dict", hint), model, path, hint)
    check_optimizer_state(part(ckpt, "optimizer", path, "the optimiser's state dict", hint),
                          build_optimizer(cfg, model), path, hint)
    check_record(part(ckpt, "schedule", path, "the schedule's state", hint), ScheduleState,
                 "schedule", path, hint)
    check_record(part(ckpt, "position", path, "the trainer's position (epoch, step, ...)", hint),
                 Position, "position", path, hint)
    check_rng_state(part(ckpt, "rng", path, "the RNG states", hint), path, hint)
    check_carry(ckpt.get("carry"), path, hint)


def data_generator(seed: int, epoch: int) -> torch.Generator:
    """The generator that fixes epoch ``epoch``'s data order for run seed ``seed``."""
    return torch.Generator().manual_seed(seed * 1_000_003 + epoch)


class Trainer:
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
        # running loss and the NaN/inf guard (deferred mode, see the module docstring)
        self.log_interval = log_interval
        # None: defer on CUDA (one process, nonfinite: stop, no TensorBoard); True/False forces
        # it (with nonfinite: stop only: skipping a batch needs its loss on the host at once)
        self.defer_host_reads = defer_host_reads
        self._acc: Running | None = None
        self.capture: StepCapture | None = None  # train.step_capture (made in fit)

    # -- paths ----------------------------------------------------------------------
    @property
    def last_path(self) -> Path:
        return self.files.last

    @property
    def best_path(self) -> Path:
        return self.files.best

    @property
    def metrics_path(self) -> Path:
        return self.files.metrics

    # -- checkpoints ------------------------------------------------------------------
    def _again(self) -> str:
        """What to do after a write of the run failed (a full disk): continue from last.pt,
        or, before the first last.pt was saved, start again (there is nothing to continue
        from, and ``--resume`` says so)."""
        if self.last_path.exists():
            return RUN_AGAIN
        return ("start the run again (it had not saved a last.pt to continue from yet): the "
                "same `lstmablate train` command with --force")

    def _clock(self) -> None:
        """The position's training time so far: wall-clock seconds (what a run took, pauses and
        other processes' load included) and the process's CPU seconds (what it computed: on a
        shared or paused machine, the number that compares runs), each summed over resumes."""
        self.pos.train_time_s = time.perf_counter() - self._t_start
        if self.pos.train_cpu_s is not None:
            self.pos.train_cpu_s = time.process_time() - self._cpu_start

    def _save_last(self) -> None:
        self._sync()  # never save a state that a non-finite step produced
        if self._t_start is not None:
            self._clock()
        if not self.dist.is_main:
            return
        state = {
            "run": self.identity,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "schedule": self.schedule.state_dict(),
            "position": vars(self.pos).copy(),
            "rng": rng_state(),
            "carry": self.carry,
        }
        if self.precision.state_dict() is not None:  # fp16's gradient scaler
            state["scaler"] = self.precision.state_dict()
        save_checkpoint(self.last_path, state, again=self._again())

    def _save_best(self, metrics: dict[str, float]) -> None:
        if not self.dist.is_main:
            return
        save_checkpoint(self.best_path, {
            "run": self.identity,
            "model": self.model.state_dict(),
            "step": self.pos.step,
            "epoch": self.pos.epoch,
            "dev": metrics,
        }, again=self._again())

    def _resume(self, ckpt: dict[str, Any] | None = None) -> None:
        """Continue from ``ckpt`` (checked by the caller with :func:`check_resume_checkpoint`),
        or from ``last.pt``, read and checked here."""
        if ckpt is None:
            ckpt = load_checkpoint(self.last_path, expect=self.identity)
            check_resume_checkpoint(ckpt, self.last_path, self.cfg, self.model)
        self.model.load_state_dict(ckpt["model"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
        # parameters whose rows a module reordered as it loaded (an older layout): their
        # optimiser state likewise
        migrate_optimizer_rows(self.model, ckpt["model"], self.optimizer)
        self.schedule.load_state_dict(ckpt["schedule"])
        self.pos = Position(**ckpt["position"])
        self.carry = ckpt.get("carry")
        self.precision.load_state_dict(ckpt.get("scaler"))
        # metrics written after this checkpoint are redone, so the file ends up
        # exactly as an uninterrupted run's
        self._truncate_metrics(self.pos.metrics_lines)
        set_rng_state(ckpt["rng"])

    def _truncate_metrics(self, n_lines: int) -> None:
        if not self.dist.is_main or not self.metrics_path.exists():
            return
        lines = self.metrics_path.read_bytes().splitlines(keepends=True)
        if len(lines) != n_lines:  # atomically: a kill here leaves the old file, not half of it
            atomic_write(self.metrics_path, lambda f: f.write(b"".join(lines[:n_lines])),
                         again=self._again())

    def _append_metrics(self, record: dict[str, Any]) -> None:
        """One line more in metrics.jsonl, never through a symbolic link (the run folder's
        entries are the run's own: :mod:`lstmablate.runfolder`)."""
        self.pos.metrics_lines += 1
        if self.dist.is_main:  # (a full disk: a line cut short is dropped on --resume)
            append_json_line(self.metrics_path, record, nofollow=True, again=self._again())

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

    # -- one evaluation -------------------------------------------------------------------
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

    def _best_info(self) -> dict[str, Any]:
        """The selected checkpoint: its step, (1-based) epoch and dev metrics."""
        pos = self.pos
        if pos.best_dev is None:
            if not self.best_path.exists():
                return {}
            # a run resumed from a checkpoint of an older version, which kept them in best.pt only
            best = load_checkpoint(self.best_path)
            return {"step": best["step"], "epoch": best["epoch"] + 1, "dev": best["dev"]}
        return {"step": pos.best_step, "epoch": pos.best_epoch, "dev": dict(pos.best_dev)}

    def _epoch_label(self) -> int:
        """The 1-based epoch the last step belongs to (at an epoch boundary: the one ended)."""
        pos = self.pos
        return pos.epoch if pos.batch == 0 and pos.epoch > 0 else pos.epoch + 1

    def _set_lr(self, lr: float) -> float:
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.pos.lr = lr
        return lr

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
