"""The training loop. It knows nothing about tasks beyond the Task interface.

Per optimiser step: the task's loss (threading its ``carry``), backward,
global-norm clipping, a NaN/inf guard, the optimiser step and the schedule.
Evaluation of the primary dev metric every epoch (or every ``eval_every``
steps) appends a line to ``metrics.jsonl``, keeps ``best.pt`` and writes
``last.pt`` — atomically, with every RNG state and the data position, so
``--resume`` continues exactly where the run stopped.  SIGINT/SIGTERM finish
the current step, save ``last.pt`` and return.
"""

from __future__ import annotations

import json
import math
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                           TimeElapsedColumn, TimeRemainingColumn)
from torch import nn

from lstmablate.config import TrainConfig
from lstmablate.errors import UserError
from lstmablate.task import Metric

from .checkpoint import load_checkpoint, rng_state, save_checkpoint, set_rng_state
from .distributed import DistInfo, all_reduce_sum, barrier
from .optim import Schedule, build_optimizer, clip_scope_parameters


class TrainingDiverged(UserError):
    """A non-finite loss or gradient with ``nonfinite: stop``."""


@dataclass
class TrainResult:
    best: dict[str, Any]  # {"step", "epoch", "dev": metrics} of the selected checkpoint
    test: dict[str, float] | None
    steps: int
    epochs_completed: int
    train_time_s: float
    interrupted: bool = False
    skipped_nonfinite: int = 0
    dev_final: dict[str, float] | None = None  # evaluate(dev, final=True) if the task's differs


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
    skipped_nonfinite: int = 0
    last_eval_step: int = -1
    last_finite_loss: float | None = None
    done: bool = False
    loss_sum: float = 0.0  # running train loss since the last evaluation
    loss_n: int = 0
    # the learning rate in force: a schedule change decided by a mid-epoch evaluation (plateau)
    # takes effect at the next epoch, in a resumed run as in an uninterrupted one
    lr: float | None = None


def data_generator(seed: int, epoch: int) -> torch.Generator:
    """The generator that fixes epoch ``epoch``'s data order for run seed ``seed``."""
    return torch.Generator().manual_seed(seed * 1_000_003 + epoch)


class Trainer:
    def __init__(
        self,
        cfg: TrainConfig,
        task: Any,
        model: nn.Module,
        run_dir: Path,
        *,
        seed: int,
        device: torch.device,
        identity: dict[str, Any],
        console: Console | None = None,
        progress: bool | None = None,
        dist_info: DistInfo | None = None,
        tensorboard: dict[str, Any] | None = None,
    ):
        self.cfg, self.task, self.model = cfg, task, model
        self.dist = dist_info or DistInfo()
        self.train_model: nn.Module = model  # DDP-wrapped in fit() under torchrun
        self.run_dir = Path(run_dir)
        self.seed, self.device = seed, device
        self.identity = identity
        self.console = console or Console(stderr=True)
        self.show_progress = self.console.is_terminal if progress is None else progress
        self.primary: Metric = task.primary
        self.optimizer = build_optimizer(cfg, model)
        self.clipped = clip_scope_parameters(model, cfg.clip_scope)
        self.schedule = Schedule(cfg, self.optimizer)
        self.pos = Position()
        self.carry: Any = None
        self._stop_signal: str | None = None
        self._t_start: float | None = None  # perf_counter at the (virtual) start of training
        self.tb_config = tensorboard  # the resolved config: log to <run>/tensorboard when given
        self.tb: Any = None

    # -- paths ----------------------------------------------------------------------
    @property
    def last_path(self) -> Path:
        return self.run_dir / "last.pt"

    @property
    def best_path(self) -> Path:
        return self.run_dir / "best.pt"

    @property
    def metrics_path(self) -> Path:
        return self.run_dir / "metrics.jsonl"

    # -- checkpoints ------------------------------------------------------------------
    def _save_last(self) -> None:
        if self._t_start is not None:
            self.pos.train_time_s = time.perf_counter() - self._t_start
        if not self.dist.is_main:
            return
        save_checkpoint(self.last_path, {
            "run": self.identity,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "schedule": self.schedule.state_dict(),
            "position": vars(self.pos).copy(),
            "rng": rng_state(),
            "carry": self.carry,
        })

    def _save_best(self, metrics: dict[str, float]) -> None:
        if not self.dist.is_main:
            return
        save_checkpoint(self.best_path, {
            "run": self.identity,
            "model": self.model.state_dict(),
            "step": self.pos.step,
            "epoch": self.pos.epoch,
            "dev": metrics,
        })

    def _resume(self, ckpt: dict[str, Any] | None = None) -> None:
        if ckpt is None:
            ckpt = load_checkpoint(self.last_path, expect=self.identity)
        self.model.load_state_dict(ckpt["model"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
        self.schedule.load_state_dict(ckpt["schedule"])
        self.pos = Position(**ckpt["position"])
        self.carry = ckpt.get("carry")
        # metrics written after this checkpoint are redone, so the file ends up
        # exactly as an uninterrupted run's
        self._truncate_metrics(self.pos.metrics_lines)
        set_rng_state(ckpt["rng"])

    def _truncate_metrics(self, n_lines: int) -> None:
        if not self.dist.is_main or not self.metrics_path.exists():
            return
        lines = self.metrics_path.read_text().splitlines(keepends=True)
        if len(lines) != n_lines:
            self.metrics_path.write_text("".join(lines[:n_lines]))

    def _append_metrics(self, record: dict[str, Any]) -> None:
        self.pos.metrics_lines += 1
        if not self.dist.is_main:
            return
        with open(self.metrics_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())

    # -- signals ------------------------------------------------------------------------
    def _on_signal(self, signum: int, frame: Any) -> None:
        if self._stop_signal is not None:  # second Ctrl-C: give up at once
            raise KeyboardInterrupt
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
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            metrics = self.task.evaluate(self.model, split, final=final)
        self.model.train()
        return {k: float(v) for k, v in metrics.items()}

    def _dev_evaluation(self, lr: float) -> None:
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
        self.pos.last_eval_step = self.pos.step
        if improved:
            self.pos.best_value, self.pos.best_step = value, self.pos.step
            self.pos.best_epoch = self._epoch_label()
            self.pos.evals_since_best = 0
            self._save_best(metrics)
        else:
            self.pos.evals_since_best += 1
        self.schedule.observe(improved, value, self._epoch_label(), self.primary.higher_is_better)
        barrier(self.dist)
        fmt = {m.name: m.fmt for m in self.task.metrics}
        shown = "  ".join(f"{k} {v:{fmt.get(k, '.4g')}}" for k, v in metrics.items())
        loss_txt = f"train loss {train_loss:.4f}  " if train_loss is not None else ""
        self.console.print(f"[bold]eval[/] step {self.pos.step} epoch {self._epoch_label()}: "
                           f"{loss_txt}{self.task.dev_split} {shown}" + ("  [green]best[/]" if improved else ""))

    # -- the loop --------------------------------------------------------------------------
    def fit(self, resume: bool = False, checkpoint: dict[str, Any] | None = None) -> TrainResult:
        """Train; with ``resume``, continue from ``last.pt`` (or ``checkpoint``, already loaded)."""
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

                self.tb = TensorBoardLogger(self.run_dir, self.tb_config,
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
        self._t_start = time.perf_counter() - self.pos.train_time_s
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
        self.pos.train_time_s = time.perf_counter() - self._t_start
        if self._stop_signal:
            self._save_last()
            if self.tb is not None:
                self.tb.close()
            return TrainResult(best=self._best_info(), test=None, steps=self.pos.step,
                               epochs_completed=self.pos.epoch, train_time_s=self.pos.train_time_s,
                               interrupted=True, skipped_nonfinite=self.pos.skipped_nonfinite)
        if self.pos.last_eval_step != self.pos.step:  # the final state was never evaluated
            lr = self.pos.lr if self.pos.lr is not None else self.schedule.lr_at(
                min(self.pos.epoch, cfg.max_epochs - 1), self.pos.step)
            self._dev_evaluation(lr)
        self.pos.done = True
        self._save_last()
        test = dev_final = None
        barrier(self.dist)  # rank 0 has written best.pt
        if cfg.test_checkpoint == "best" and (cfg.eval_test or self.task.final_differs):
            best = load_checkpoint(self.best_path, expect=self.identity)
            self.model.load_state_dict(best["model"])  # else: the model as training left it
        if self.task.final_differs:  # e.g. beam search where selection used perplexity
            dev_final = self._evaluate(self.task.dev_split, final=True)
        if cfg.eval_test and self.task.test_split:
            test = self._evaluate(self.task.test_split, final=True)
        if self.tb is not None:
            if test is not None:
                self.tb.log_metrics(self.pos.step, self.task.test_split, test)
            self.tb.close()
        return TrainResult(best=self._best_info(), test=test, dev_final=dev_final, steps=self.pos.step,
                           epochs_completed=self._epoch_label() if self.pos.step else 0,
                           train_time_s=self.pos.train_time_s,
                           skipped_nonfinite=self.pos.skipped_nonfinite)

    def _best_info(self) -> dict[str, Any]:
        if not self.best_path.exists():
            return {}
        best = load_checkpoint(self.best_path)
        return {"step": best["step"], "epoch": best["epoch"] + 1, "dev": best["dev"]}

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
        t0 = last_report = time.perf_counter()
        first = pos.batch
        for i in range(pos.batch, n_batches):
            batch = plan[i]
            if cfg.schedule == "exponential":
                lr = self._set_lr(self.schedule.lr_at(pos.epoch, pos.step))
            loss_value = self._train_step(batch)
            pos.batch = i + 1
            if self.tb is not None and loss_value is not None:
                self.tb.log_train(pos.step, loss_value, lr)
            if loss_value is not None:
                pos.loss_sum += loss_value
                pos.loss_n += 1
            progress.update(bar, completed=pos.batch,
                            loss=f"{loss_value:.4f}" if loss_value is not None else "skip", lr=f"{lr:.3g}")
            now = time.perf_counter()
            if not self.show_progress and now - last_report > 30:  # plain log lines, e.g. in CI
                last_report = now
                rate = (pos.batch - first) / max(now - t0, 1e-9)
                eta = (n_batches - pos.batch) / max(rate, 1e-9)
                self.console.print(f"epoch {pos.epoch + 1} batch {pos.batch}/{n_batches} "
                                   f"loss {loss_value if loss_value is not None else float('nan'):.4f} "
                                   f"lr {lr:.3g} ETA {eta:.0f}s", highlight=False)
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
                                   f"batch {pos.batch}, step {pos.step}; saved {self.last_path}.")
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
        cfg, pos = self.cfg, self.pos
        batch = self.task.batch_to(self.task.shard(batch, self.dist), self.device)
        self.optimizer.zero_grad(set_to_none=True)
        out = self.task.loss(self.train_model, batch, self.carry)
        loss = out.loss
        loss_value = float(loss.detach())
        if self.dist.enabled:
            # the loss is a mean over out.weight units (e.g. tokens): weigh each rank's slice by
            # its share so that DDP's gradient average is the gradient of the global-batch loss
            total = all_reduce_sum(out.weight, self.dist, self.device)
            loss = loss * (out.weight * self.dist.world_size / total)
            loss_value = all_reduce_sum(loss_value * out.weight, self.dist, self.device) / total
        finite = math.isfinite(loss_value)
        if finite or cfg.nonfinite == "zero":
            loss.backward()
            params = [p for p in self.model.parameters() if p.grad is not None]
            if cfg.nonfinite == "zero":  # Dozat & Manning: non-finite gradient entries -> 0
                bad = [p.grad for p in params if not bool(torch.isfinite(p.grad).all())]
                for g in bad:
                    g.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
                if bad or not finite:
                    pos.skipped_nonfinite += 1
                    self.console.print(f"[yellow]non-finite gradient at step {pos.step + 1}: its "
                                       f"non-finite entries set to 0 ({pos.skipped_nonfinite} so far)[/]")
            clip_grads = cfg.clip_norm > 0 and cfg.clip_on == "gradient"  # else: the optimiser's
            clipped = [p for p in self.clipped if p.grad is not None] if cfg.clip_scope else params
            if clip_grads:
                norm = torch.nn.utils.clip_grad_norm_(clipped, cfg.clip_norm)
            if not clip_grads or cfg.clip_scope:
                norm = torch.linalg.vector_norm(
                    torch.stack([p.grad.detach().norm() for p in params])) if params else torch.tensor(0.0)
            finite = bool(torch.isfinite(norm))
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
            raise TrainingDiverged(
                f"training diverged: non-finite {what} at step {pos.step + 1} (epoch {pos.epoch + 1}); "
                f"the last finite loss was {pos.last_finite_loss}. The last good checkpoints "
                f"({self.last_path.name}, {self.best_path.name}) in {self.run_dir} are kept. "
                "Lower train.lr, set train.clip_norm, or set train.nonfinite=skip to skip such batches.")
        self.optimizer.step()
        self.carry = out.carry
        pos.step += 1
        if math.isfinite(loss_value):
            pos.last_finite_loss = loss_value
        return loss_value

