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

Adam comes in two implementations: ``torch.optim.Adam`` by default, and :class:`Adam`
below when one of ``train.eps_in_sqrt``, ``train.lazy_embeddings`` or
``train.clip_on=update`` asks for a detail of Dozat & Manning's optimiser
(tdozat/Parser-v1, ``lib/optimizers/base_optimizer.py``, ``radam_optimizer.py``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from lstmablate.config import TrainConfig
from lstmablate.errors import ConfigError


class Adam(torch.optim.Optimizer):
    """Adam (Kingma & Ba) written as Dozat & Manning's code writes it, with its switches.

    Per parameter, with gradient g_t and the step count t (1-based)::

        m_t = b1_t m_{t-1} + (1 - b1_t) g_t,   b1_t = b1 (1 - b1^(t-1)) / (1 - b1^t)
        v_t = b2_t v_{t-1} + (1 - b2_t) g_t²,  b2_t = b2 (1 - b2^(t-1)) / (1 - b2^t)
        s_t = lr m_t / (sqrt(v_t) + eps)         or, eps_in_sqrt, lr m_t / sqrt(v_t + eps)
        x_t = x_{t-1} - s_t

    m_t and v_t so written are the bias-corrected moments m̂_t, v̂_t of the usual form, so
    with every switch off this is ``torch.optim.Adam`` (tested).  Switches:

    * ``eps_in_sqrt``: eps inside the square root (``radam_optimizer.py``: ``sqrt(v + eps)``);
    * ``lazy``: the parameters in ``lazy`` (embedding tables) are updated row by row, as
      TensorFlow applies a gradient of gathered rows: only rows with a nonzero gradient
      move, and their m, v and step count t (one per row) — the other rows keep all three
      (``_sparse_moving_average``); a row the batch looked up whose gradient is exactly
      zero (e.g. every occurrence dropped by dropout) counts as unused here, and with
      ``weight_decay`` every row is used;
    * ``clip_update``: after every step s_t is computed, all of them together are scaled to
      a global norm of at most ``clip_update`` (``base_optimizer.py: _finish``,
      ``tf.clip_by_global_norm``: s * clip / max(|s|, clip)) — the *update* is clipped,
      not the gradient.

    ``weight_decay`` adds wd · x to the gradient, as ``torch.optim.Adam`` does.
    """

    def __init__(self, params: Any, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, *, eps_in_sqrt: bool = False,
                 lazy: Any = (), clip_update: float = 0.0):
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps,
                                      weight_decay=weight_decay))
        self.eps_in_sqrt = eps_in_sqrt
        self.clip_update = clip_update
        self._lazy = {id(p) for p in lazy}

    def is_lazy(self, p: torch.Tensor) -> bool:
        return id(p) in self._lazy and p.dim() >= 2

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = closure() if closure is not None else None
        updates: list[tuple[torch.Tensor, torch.Tensor]] = []  # (parameter, s_t)
        for group in self.param_groups:
            b1, b2 = group["betas"]
            lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                if g.is_sparse:
                    raise RuntimeError("lstmablate's Adam takes dense gradients (lazy rows are "
                                       "found from the gradient's nonzero rows)")
                if wd:
                    g = g.add(p, alpha=wd)
                state = self.state[p]
                lazy = self.is_lazy(p)
                if not state:
                    state["m"] = torch.zeros_like(p)
                    state["v"] = torch.zeros_like(p)
                    # one step count per row for a lazy table, one for the whole tensor else
                    state["t"] = (torch.zeros(p.shape[0], *([1] * (p.dim() - 1)), dtype=p.dtype,
                                              device=p.device) if lazy else torch.zeros((), dtype=p.dtype,
                                                                                       device=p.device))
                m, v, t = state["m"], state["v"], state["t"]
                if lazy:  # the rows with a nonzero gradient (no host read: masks, not indices)
                    used = g.reshape(g.shape[0], -1).ne(0).any(dim=1).reshape(t.shape)
                    t.add_(used.to(t.dtype))
                else:
                    t.add_(1)
                tt = t.clamp(min=1)  # (rows never used keep t = 0 and every value below)
                # b_t = b (1 - b^(t-1)) / (1 - b^t): the bias-corrected moving average
                b1_t = b1 * (1 - b1 ** (tt - 1)) / (1 - b1 ** tt)
                b2_t = b2 * (1 - b2 ** (tt - 1)) / (1 - b2 ** tt)
                if lazy:  # an unused row keeps its moments (b_t = 1, and its gradient is 0)
                    b1_t = torch.where(used, b1_t, torch.ones_like(b1_t))
                    b2_t = torch.where(used, b2_t, torch.ones_like(b2_t))
                m.mul_(b1_t).add_((1 - b1_t) * g)  # m_t
                v.mul_(b2_t).add_((1 - b2_t) * g * g)  # v_t
                denom = (v + eps).sqrt() if self.eps_in_sqrt else v.sqrt() + eps
                s = lr * m / denom  # s_t
                if lazy:
                    s = torch.where(used, s, torch.zeros_like(s))
                updates.append((p, s))
        if self.clip_update > 0 and updates:
            # tf.clip_by_global_norm: every s_t times clip / max(global norm, clip)
            norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(s) for _, s in updates]))
            scale = self.clip_update / torch.clamp(norm, min=self.clip_update)
            for _, s in updates:
                s.mul_(scale)
        for p, s in updates:
            p.sub_(s)  # x_t = x_{t-1} - s_t
        return loss


def embedding_tables(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The weights of the model's ``nn.Embedding`` modules (``train.lazy_embeddings``)."""
    return [m.weight for m in model.modules()
            if isinstance(m, torch.nn.Embedding) and m.weight.requires_grad]


def build_optimizer(cfg: TrainConfig, params: Any) -> torch.optim.Optimizer:
    """The optimiser ``cfg`` names over ``params`` (a model, or an iterable of parameters;
    ``train.lazy_embeddings`` needs the model, to find its embedding tables)."""
    model = params if isinstance(params, torch.nn.Module) else None
    params = [p for p in (model.parameters() if model is not None else params) if p.requires_grad]
    if cfg.optimizer == "adam" and (cfg.eps_in_sqrt or cfg.lazy_embeddings or cfg.clip_on == "update"):
        if cfg.lazy_embeddings and model is None:
            raise ValueError("train.lazy_embeddings: build_optimizer needs the model")
        return Adam(params, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay,
                    eps_in_sqrt=cfg.eps_in_sqrt,
                    lazy=embedding_tables(model) if cfg.lazy_embeddings else (),
                    clip_update=cfg.clip_norm if cfg.clip_on == "update" else 0.0)
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


@dataclass
class ScheduleState:
    """What a schedule learns from the evaluations; saved in every checkpoint."""

    plateau_factor: float = 1.0  # accumulated plateau decays
    bad_evals: int = 0
    last_value: float | None = None  # decay_on_worse: the previous dev value
    worse_epoch: int | None = None  # decay_on_worse: 1-based epoch that got worse
    #: fields added after checkpoints without them were written (they take the defaults)
    ADDED: ClassVar[tuple[str, ...]] = ("last_value", "worse_epoch")
    #: fields NaN is a valid value of (an evaluation whose metric came out NaN)
    NAN_ALLOWED: ClassVar[tuple[str, ...]] = ("last_value",)


class Schedule:
    """Learning-rate schedule with a state that checkpoints can save."""

    def __init__(self, cfg: TrainConfig, optimizer: torch.optim.Optimizer):
        self.cfg, self.optimizer = cfg, optimizer
        self.state = ScheduleState()

    def lr_at(self, epoch: int, step: int) -> float:
        """Learning rate for 0-based ``epoch`` and global optimiser ``step``."""
        c, state = self.cfg, self.state
        lr = c.lr
        if c.schedule == "epoch_decay":
            start = c.decay_start if state.worse_epoch is None else min(c.decay_start,
                                                                        state.worse_epoch)
            lr = c.lr * c.decay ** max(epoch + 1 - start, 0)
        elif c.schedule == "exponential":
            lr = c.lr * c.decay ** (step / c.decay_steps)
        elif c.schedule == "plateau":
            lr = c.lr * state.plateau_factor
        return max(lr, c.min_lr)

    def observe(self, improved: bool, value: float | None = None, epoch: int | None = None,
                higher_is_better: bool = False) -> None:
        """Called after each evaluation of the primary dev metric (``value``, in 1-based
        ``epoch``)."""
        c, state = self.cfg, self.state
        if c.schedule == "epoch_decay" and c.decay_on_worse and value is not None:
            last = state.last_value
            worse = last is not None and (value < last if higher_is_better else value > last)
            if worse and state.worse_epoch is None:
                state.worse_epoch = epoch  # OpenNMT-py: decay from the next epoch on, for good
            state.last_value = value
        if c.schedule != "plateau":
            return
        if improved:
            state.bad_evals = 0
            return
        state.bad_evals += 1
        if state.bad_evals > c.plateau_patience:
            state.plateau_factor *= c.decay
            state.bad_evals = 0

    def state_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self.state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a saved state (checked first: :func:`lstmablate.train.checkpoint.check_record`)."""
        self.state = ScheduleState(**state)
