"""What the trainer keeps of a run in its folder, and reads back (:class:`Saving`, part of
:class:`~lstmablate.train.trainer.Trainer`): ``last.pt`` — the model, optimiser, schedule,
position, every RNG state and the task's carry, written atomically after every evaluation
and every ``train.save_every_minutes`` between them, so ``--resume`` continues exactly where
the run stopped; ``best.pt``, the model the primary dev metric selected; ``metrics.jsonl``, a
line per evaluation, cut back on resume to the lines its ``last.pt`` had seen.  The file
names come from the :class:`RunPaths` the trainer is handed; the checkpoints' format and
their checks are ``checkpoint.py``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from lstmablate.config import TrainConfig
from lstmablate.io import RUN_AGAIN, append_json_line, atomic_write

from .checkpoint import (check_carry, check_model_state, check_optimizer_state, check_record,
                         check_rng_state, load_checkpoint, migrate_optimizer_rows, part,
                         rng_state, save_checkpoint, set_rng_state)
from .distributed import DistInfo
from .optim import Schedule, ScheduleState, build_optimizer
from .position import Position
from .precision import Precision


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
    """Every part of a ``last.pt`` that :meth:`Saving._resume` reads, checked against this
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


class Saving:
    """Saving a run and resuming it: a part of :class:`~lstmablate.train.trainer.Trainer`,
    which sets the attributes below.  A save first reads the running loss and the NaN/inf
    guard on the host (``_sync``, the step's: :class:`~lstmablate.train.step.Steps`), so no
    state that a non-finite step produced is ever saved."""

    cfg: TrainConfig
    model: nn.Module
    optimizer: torch.optim.Optimizer
    schedule: Schedule
    precision: Precision
    pos: Position
    carry: Any
    identity: dict[str, Any]  # the run's identity, checked when a checkpoint is loaded back
    files: RunPaths
    dist: DistInfo
    _t_start: float | None  # perf_counter at the (virtual) start of training
    _cpu_start: float  # process_time at the same (virtual) start
    _saved_at: float  # perf_counter at the last save of last.pt (or the start of training)

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

    def _save_due(self) -> bool:
        """Whether ``train.save_every_minutes`` have passed since ``last.pt`` was last saved (or
        training started): the loop then saves it between evaluations, at the position it has
        reached, so a run killed without a chance to save (SIGKILL, a lost machine) resumes
        from there.  Only the process that writes decides (the others' save writes nothing)."""
        minutes = self.cfg.save_every_minutes
        if not minutes or not self.dist.is_main:
            return False
        return time.perf_counter() - self._saved_at >= 60.0 * minutes

    def _save_last(self) -> None:
        self._sync()  # never save a state that a non-finite step produced
        self._saved_at = time.perf_counter()
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
