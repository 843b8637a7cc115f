"""The task-plugin contract and the task registry.

A task is a class registered under the ``lstmablate.tasks`` entry-point group
(see ``pyproject.toml``); the built-in tasks live in the top-level ``tasks/``
folder, installed as ``lstmablate_tasks``.  A task

* declares ``DataConfig`` and ``ModelConfig`` dataclasses whose defaults are the
  original system's hyperparameters, and ``train_defaults`` for the trainer;
* declares its metrics and which one is primary (and whether higher is better);
* builds data from the data directory, and its model, asking ``make_encoder``
  (the registry's ``build_encoder`` with the run's ``--cell`` bound) for every
  recurrent encoder — so a task never names a cell;
* yields training batches deterministically given a ``torch.Generator``,
  computes the loss (optionally threading a ``carry``, e.g. the LM's hidden
  state, between consecutive batches), and evaluates a split.

The trainer sees only this interface; a task knows nothing about the CLI.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from .errors import UnknownNameError

ENTRY_POINT_GROUP = "lstmablate.tasks"

MakeEncoder = Callable[..., nn.Module]


@dataclass(frozen=True)
class Metric:
    name: str
    higher_is_better: bool
    label: str = ""
    fmt: str = ".2f"

    def better(self, a: float, b: float | None) -> bool:
        """Is ``a`` strictly better than ``b`` (None: nothing yet)?"""
        if b is None:
            return True
        return a > b if self.higher_is_better else a < b


@dataclass
class StepOutput:
    loss: Tensor  # what is back-propagated
    carry: Any = None  # state handed to the next batch (detached by the task)
    # what ``loss`` is a mean over (e.g. the number of target tokens): lets data-parallel
    # training weigh each process's slice of the batch exactly
    weight: float = 1.0


class Task:
    """Base class of task plugins; subclasses fill in the hooks below."""

    name: ClassVar[str]
    description: ClassVar[str] = ""
    DataConfig: ClassVar[type]
    ModelConfig: ClassVar[type]
    train_defaults: ClassVar[dict[str, Any]] = {}
    metrics: ClassVar[tuple[Metric, ...]]
    primary: ClassVar[Metric]
    #: the split used for model selection and the final report split
    dev_split: ClassVar[str] = "dev"
    test_split: ClassVar[str] = "test"

    def __init__(self, data_cfg: Any, model_cfg: Any, data_dir: Path, seed: int = 1):
        self.data_cfg, self.model_cfg = data_cfg, model_cfg
        self.data_dir = Path(data_dir)
        self.seed = seed

    # -- data ------------------------------------------------------------------------
    def check_data(self) -> list[str]:
        """Verify this task's data files; return human-readable lines. Raise DataError."""
        return ["no external data needed"]

    def setup(self) -> None:
        """Load or generate the data (called once, after the config is validated)."""

    def num_train_batches(self) -> int:
        raise NotImplementedError

    def train_batches(self, epoch: int, generator: torch.Generator) -> Iterable[Any]:
        raise NotImplementedError

    # -- model -----------------------------------------------------------------------
    def build_model(self, make_encoder: MakeEncoder) -> nn.Module:
        raise NotImplementedError

    def init_carry(self, model: nn.Module) -> Any:
        return None

    def loss(self, model: nn.Module, batch: Any, carry: Any) -> StepOutput:
        raise NotImplementedError

    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: str) -> dict[str, float]:
        raise NotImplementedError

    def visualization_inputs(self, model: nn.Module, text: str) -> tuple[nn.Module, Tensor, list[str]]:
        """For ``lstmablate visualize``: (encoder, its input vectors (1, T, I), token labels).

        Tasks with several encoders return the one Appendix A would show.
        """
        raise NotImplementedError(f"task {self.name!r} does not support visualize")

    def shard(self, batch: Any, dist_info: Any) -> Any:
        """This process's part of a global batch under torchrun (default: split dim 0)."""
        from .train.distributed import shard_batch

        return shard_batch(batch, dist_info)

    def batch_to(self, batch: Any, device: torch.device) -> Any:
        """Move a batch to ``device`` (tensors, tuples, lists and dicts of them)."""
        if isinstance(batch, Tensor):
            return batch.to(device)
        if isinstance(batch, (list, tuple)):
            return type(batch)(self.batch_to(b, device) for b in batch)
        if isinstance(batch, dict):
            return {k: self.batch_to(v, device) for k, v in batch.items()}
        return batch


# -- registry ------------------------------------------------------------------------------
def _entry_points() -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def available_tasks() -> list[str]:
    return sorted(_entry_points())


def get_task(name: str) -> type[Task]:
    eps = _entry_points()
    if name not in eps:
        raise UnknownNameError("task", name, eps, hint="Run `lstmablate list tasks`.")
    cls = eps[name].load()
    if not (isinstance(cls, type) and issubclass(cls, Task)):
        raise TypeError(f"entry point {name!r} of {ENTRY_POINT_GROUP} is not a Task subclass: {cls!r}")
    return cls
