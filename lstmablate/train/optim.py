"""Optimisers and learning-rate schedules, configured by :class:`TrainConfig`.

Schedules (all set the learning rate of every parameter group):

* ``constant``;
* ``epoch_decay``: lr * decay ** max(epoch - decay_start, 0) with 1-based
  epochs — the TensorFlow PTB tutorial's "decay by r each epoch after epoch k"
  (Zaremba et al. 2014: epochs 1..k at full rate, first decay in epoch k+1);
  with ``decay_on_worse`` decay also starts after the first epoch whose dev metric
  got worse (OpenNMT-py's ``start_decay_at`` / worse-perplexity rule);
* ``plateau``: multiply by ``decay`` when the primary dev metric has not
  improved for more than ``plateau_patience`` evaluations (like
  ReduceLROnPlateau);
* ``exponential``: lr * decay ** (step / decay_steps) per optimiser step
  (Dozat & Manning: 0.75 every 5000 steps).

``min_lr`` bounds every schedule from below.
"""

from __future__ import annotations

from typing import Any

import torch

from lstmablate.config import TrainConfig
from lstmablate.errors import ConfigError


def build_optimizer(cfg: TrainConfig, params: Any) -> torch.optim.Optimizer:
    params = [p for p in params if p.requires_grad]
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum,
                               weight_decay=cfg.weight_decay)
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps,
                                weight_decay=cfg.weight_decay)
    if cfg.optimizer == "adamax":
        return torch.optim.Adamax(params, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps,
                                  weight_decay=cfg.weight_decay)
    if cfg.optimizer == "adadelta":
        return torch.optim.Adadelta(params, lr=cfg.lr, rho=cfg.rho, eps=cfg.eps,
                                    weight_decay=cfg.weight_decay)
    if cfg.optimizer == "adagrad":
        return torch.optim.Adagrad(params, lr=cfg.lr, eps=cfg.eps, weight_decay=cfg.weight_decay,
                                   initial_accumulator_value=cfg.initial_accumulator)
    raise ValueError(cfg.optimizer)  # TrainConfig.validate() rejects this earlier


def clip_scope_parameters(model: torch.nn.Module, scope: str) -> list[torch.nn.Parameter]:
    """The parameters ``train.clip_scope`` names: those of the submodule at that dotted path
    (``encoder`` -> ``encoder.*``); every parameter when the scope is empty."""
    if not scope:
        return [p for p in model.parameters() if p.requires_grad]
    chosen = [p for name, p in model.named_parameters()
              if p.requires_grad and (name == scope or name.startswith(scope + "."))]
    if not chosen:
        tops = sorted({name.split(".")[0] for name, _ in model.named_parameters()})
        raise ConfigError(f"train.clip_scope {scope!r} names no parameter of this model; its "
                          f"top-level modules are {', '.join(tops)} (or leave it empty to clip "
                          "every gradient)")
    return chosen


class Schedule:
    """Learning-rate schedule with a state that checkpoints can save."""

    def __init__(self, cfg: TrainConfig, optimizer: torch.optim.Optimizer):
        self.cfg, self.optimizer = cfg, optimizer
        self.plateau_factor = 1.0  # accumulated plateau decays
        self.bad_evals = 0
        self.last_value: float | None = None  # decay_on_worse: the previous dev value
        self.worse_epoch: int | None = None  # decay_on_worse: 1-based epoch that got worse

    def lr_at(self, epoch: int, step: int) -> float:
        """Learning rate for 0-based ``epoch`` and global optimiser ``step``."""
        c = self.cfg
        lr = c.lr
        if c.schedule == "epoch_decay":
            start = c.decay_start if self.worse_epoch is None else min(c.decay_start, self.worse_epoch)
            lr = c.lr * c.decay ** max(epoch + 1 - start, 0)
        elif c.schedule == "exponential":
            lr = c.lr * c.decay ** (step / c.decay_steps)
        elif c.schedule == "plateau":
            lr = c.lr * self.plateau_factor
        return max(lr, c.min_lr)

    def observe(self, improved: bool, value: float | None = None, epoch: int | None = None,
                higher_is_better: bool = False) -> None:
        """Called after each evaluation of the primary dev metric (``value``, in 1-based
        ``epoch``)."""
        c = self.cfg
        if c.schedule == "epoch_decay" and c.decay_on_worse and value is not None:
            last = self.last_value
            worse = last is not None and (value < last if higher_is_better else value > last)
            if worse and self.worse_epoch is None:
                self.worse_epoch = epoch  # OpenNMT-py: decay from the next epoch on, for good
            self.last_value = value
        if c.schedule != "plateau":
            return
        if improved:
            self.bad_evals = 0
            return
        self.bad_evals += 1
        if self.bad_evals > c.plateau_patience:
            self.plateau_factor *= c.decay
            self.bad_evals = 0

    def state_dict(self) -> dict[str, Any]:
        return {"plateau_factor": self.plateau_factor, "bad_evals": self.bad_evals,
                "last_value": self.last_value, "worse_epoch": self.worse_epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.plateau_factor = state["plateau_factor"]
        self.bad_evals = state["bad_evals"]
        self.last_value = state.get("last_value")
        self.worse_epoch = state.get("worse_epoch")
