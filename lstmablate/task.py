"""The task-plugin contract and the task registry.

A task is a class registered under the ``lstmablate.tasks`` entry-point group
(see ``pyproject.toml`` and docs/plugins.md); the built-in tasks live in the
top-level ``tasks/`` folder, installed as ``lstmablate_tasks``.  What a task
must provide (everything else has a default):

* **Configs.** ``DataConfig`` and ``ModelConfig`` dataclasses whose defaults are
  the original system's hyperparameters; with the trainer's ``train`` section
  they are a run's identity (``--resume`` compares them).  ``EvalConfig``
  holds evaluation-only options (batch size, beam size, decoder): saved with
  the run, overridable by ``lstmablate eval --set eval.key=value``, never part
  of the identity.  ``train_defaults`` sets the trainer's options.
* **Metrics.** ``metrics`` and which one is ``primary`` (and whether higher is
  better); the primary metric of ``dev_split`` selects the checkpoint.
* **Data.** ``datasets`` (the files it reads, their checksums, sources and
  licence; ``lstmablate data check|fetch`` use them), ``check_data``;
  ``build_artefacts`` (what is built from the *training* data: vocabularies,
  tokeniser settings; JSON values, kept in the run folder), ``use_artefacts``
  (always called before ``setup``: with the freshly built artefacts, or the
  saved ones on resume / eval, so evaluation never re-reads training data),
  and ``setup(splits)``, which loads only the splits asked for.
* **Batches.** ``train_plan(epoch, generator)``: a sized, indexable plan of the
  epoch's batches (:class:`~lstmablate.batching.BatchPlan`), deterministic
  given the generator, so resume jumps to its position.
* **Model.** ``build_model(make_encoder)``, asking ``make_encoder`` (the
  registry's ``build_encoder`` with the run's ``--cell`` bound) for every
  recurrent layer, so a task never names a cell; ``loss`` (optionally
  threading a ``carry``, e.g. the LM's hidden state, between batches).
* **Length buckets** (optional; ``train.step_capture``): ``batch_length`` and
  ``pad_batch``, so that a variable-length task's batches pad to a few shapes
  chosen from the data (``lstmablate/train/capture.py``) with the same loss and
  gradients.
* **Evaluation.** ``evaluate(model, split, final=...)``: ``final=False`` is the
  cheap evaluation used for model selection during training, ``final=True``
  the final numbers (the end-of-training test evaluation and ``lstmablate
  eval``: beam search, MST decoding, an official scorer); ``final_differs``
  asks the trainer to also run the final evaluation on the dev split.
  ``write_predictions`` writes a split's predictions in the format the
  official scorer reads and returns the metrics computed from that file.
* **Per-item scores** (optional; what ``lstmablate compare`` and ``report
  --significance`` test): ``evaluate_items(model, split)`` is the final evaluation
  item by item — its metrics and one record per test item (a sentence, a question,
  a string) holding the sufficient statistics of the metrics; ``item_metrics``
  says how each metric is recomputed from summed statistics; ``item_key`` what
  identifies an item's gold data.  The runner writes the records to the run
  folder's ``scores/<split>.jsonl.gz`` (:mod:`lstmablate.run.scores`).

A task receives its run directory (``self.run_dir``) and may write files of its
own there.  The trainer sees only this interface; a task knows nothing about
the CLI (task-specific ``lstmablate data`` subcommands are registered by a
separate module of the plugin under the ``lstmablate.commands`` group).
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from .batching import shard_batch
from .errors import UnknownNameError, UserError

from .data import Dataset, register_datasets

if TYPE_CHECKING:
    from .config import RunConfig

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


#: one test item's sufficient statistics (a flat JSON object with an ``id``)
ItemRecord = dict[str, Any]


@dataclass(frozen=True)
class ItemMetric:
    """How corpus metric ``name`` is recomputed from per-item records: ``stats(records)`` is an
    (items, k) array of each item's sufficient statistics, summed over any set of items;
    ``value(sums)`` maps summed statistics — an array whose last axis has the k columns, any
    leading axes (one row per bootstrap resample) — to the metric (vectorised; a ``value``
    that only takes one k-vector is applied row by row)."""

    name: str
    stats: Callable[[Sequence[Mapping[str, Any]]], np.ndarray]
    value: Callable[[np.ndarray], Any]

    def of(self, records: Sequence[Mapping[str, Any]]) -> float:
        """The metric of ``records`` (all items)."""
        return float(np.asarray(self.value(self.stats(records).sum(0)), dtype=np.float64))


def record_fields(*names: str) -> Callable[[Sequence[Mapping[str, Any]]], np.ndarray]:
    """``ItemMetric.stats`` of plain numeric fields: one column per name, one row per record
    (the name ``"items"`` is 1 for every record: summed, the number of items)."""
    def stats(records: Sequence[Mapping[str, Any]]) -> np.ndarray:
        return np.array([[1.0 if n == "items" else np.nan if r[n] is None else float(r[n])
                          for n in names] for r in records],
                        dtype=np.float64).reshape(len(records), len(names))
    return stats


def ratio(scale: float = 1.0) -> Callable[[np.ndarray], np.ndarray]:
    """``value`` = scale * column 0 / column 1 (NaN where column 1 sums to 0)."""
    def value(sums: np.ndarray) -> np.ndarray:
        sums = np.asarray(sums, dtype=np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(sums[..., 1] > 0, scale * sums[..., 0] / sums[..., 1], np.nan)
    return value


@dataclass
class StepOutput:
    loss: Tensor  # what is back-propagated
    carry: Any = None  # state handed to the next batch (detached by the task)
    # what ``loss`` is a mean over (e.g. the number of target tokens; a number or a device
    # tensor): lets data-parallel training weigh each process's slice of the batch exactly
    weight: float | Tensor = 1.0
    # the training loss as shown and logged (``train_loss`` in metrics.jsonl), on the scale
    # of the evaluation's loss, e.g. the mean NLL per token where the optimised loss is summed
    # over time steps (PTB) or sentences (NMT); None: ``loss`` itself.  May stay on the device.
    logged: Tensor | None = None
    # tokens in this batch, for the tokens/s of progress reports (a number or a device
    # tensor); None: ``weight``
    tokens: float | Tensor | None = None


@dataclass
class NoEvalOptions:
    """The ``eval`` section of a task without evaluation-only options."""


class Task:
    """Base class of task plugins; subclasses fill in the hooks below."""

    name: ClassVar[str]
    description: ClassVar[str] = ""
    DataConfig: ClassVar[type]
    ModelConfig: ClassVar[type]
    EvalConfig: ClassVar[type] = NoEvalOptions
    train_defaults: ClassVar[dict[str, Any]] = {}
    metrics: ClassVar[tuple[Metric, ...]]
    primary: ClassVar[Metric]
    #: the split used for model selection and the final report split
    dev_split: ClassVar[str] = "dev"
    test_split: ClassVar[str] = "test"
    #: the datasets this task reads (files, checksums, sources, licence)
    datasets: ClassVar[tuple[Dataset, ...]] = ()
    #: config keys renamed since older run folders were saved: "data.old" -> "eval.new"
    renamed_keys: ClassVar[dict[str, str]] = {}
    #: config keys added since older run folders were saved, with the value those runs
    #: behaved as ("model.new_option" -> "old behaviour"); a saved config.yaml without the
    #: key reads it (the dataclass default may differ: it is the original system's)
    added_keys: ClassVar[dict[str, Any]] = {}
    #: True: evaluate(final=True) differs from the selection evaluation, and the trainer
    #: also reports it on the dev split at the end of training
    final_differs: ClassVar[bool] = False
    #: metrics of that final dev evaluation (``result.json``'s ``dev_final``) that every report
    #: shows beside the test columns (NMT: validation BLEU); never tested for significance
    dev_report_metrics: ClassVar[tuple[str, ...]] = ()
    #: further metrics a run's final evaluation may hold, shown only where a table spec's
    #: ``metrics:`` names them; never tested for significance
    extra_metrics: ClassVar[tuple[Metric, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        register_datasets(cls.__dict__.get("datasets", ()))  # known to `data fetch` and hints

    def __init__(self, data_cfg: Any, model_cfg: Any, data_dir: Path, seed: int = 1,
                 eval_cfg: Any = None, run_dir: Path | None = None):
        self.data_cfg, self.model_cfg = data_cfg, model_cfg
        self.eval_cfg = eval_cfg if eval_cfg is not None else self.EvalConfig()
        self.data_dir = Path(data_dir)
        self.seed = seed
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.artefacts: dict[str, Any] = {}

    # -- how metrics are shown ---------------------------------------------------------
    @classmethod
    def caveats(cls, metrics: dict[str, float]) -> dict[str, str]:
        """Metrics of one evaluation (``result.json``'s ``test``) that rest on too little
        evidence to compare, each with why (``lstmablate report`` footnotes them).
        Default: none."""
        return {}

    def metric_name(self, key: str) -> str:
        """The short name of metric ``key`` in progress lines and tables (default: the key;
        e.g. PTB's ``bpc`` is "bits/word" at word level)."""
        return key

    def metric_description(self, key: str) -> str:
        """What metric ``key`` is, in words (default: the declared :class:`Metric`'s label)."""
        return next((m.label for m in self.metrics if m.name == key), "")

    def format_metric(self, key: str, value: float) -> str:
        """``value`` as a person reads it: a declared metric with its format, a count as an
        integer, anything else to four significant digits."""
        fmt = next((m.fmt for m in self.metrics if m.name == key), None)
        if fmt is not None:
            return f"{value:{fmt}}"
        if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
            return f"{int(value):d}"
        return f"{value:.4g}"

    @classmethod
    def run_deviations(cls, config: RunConfig) -> list[str]:
        """How a run departs from the original system in ways its results should say next
        to the numbers (``lstmablate report`` marks the run's row with them), e.g. "no
        pretrained vectors (Parser-v1 adds GloVe 6B 100d)".  ``config`` is the run's typed
        config, an older run's brought to this version (:attr:`renamed_keys`,
        :attr:`added_keys`: the hook never meets a key missing)."""
        return []

    # -- data ------------------------------------------------------------------------
    def required_files(self) -> list[str]:
        """The catalogued files (paths relative to the data directory) that this
        configuration reads; ``lstmablate data check`` names the recipes a missing file
        blocks from it.  Default: every file of :attr:`datasets`."""
        return [f.relpath for ds in self.datasets for f in ds.files]

    def check_data(self) -> list[str]:
        """Verify this task's data files; return human-readable lines. Raise DataError."""
        from .data import verify_datasets

        return verify_datasets(self.data_dir, self.datasets) if self.datasets else \
            ["no external data needed"]

    def build_artefacts(self) -> dict[str, Any]:
        """What this task builds from the training data (vocabularies, ...), as JSON values.

        Called once for a new run; the result is saved in ``<run>/artefacts/`` and given
        to :meth:`use_artefacts` on every later resume and evaluation."""
        return {}

    def use_artefacts(self, artefacts: dict[str, Any]) -> None:
        """Take the run's artefacts (always called before :meth:`setup`)."""
        self.artefacts = dict(artefacts)

    def setup(self, splits: Sequence[str]) -> None:
        """Load (or generate) the data of ``splits`` only; called after the config is
        validated and the artefacts are in place."""

    def train_plan(self, epoch: int, generator: torch.Generator) -> Sequence[Any]:
        """The training batches of ``epoch`` as a sized, indexable plan (see
        :class:`lstmablate.batching.BatchPlan`), deterministic given ``generator``."""
        raise NotImplementedError

    # -- model -----------------------------------------------------------------------
    def build_model(self, make_encoder: MakeEncoder) -> nn.Module:
        raise NotImplementedError

    def init_carry(self, model: nn.Module) -> Any:
        return None

    def loss(self, model: nn.Module, batch: Any, carry: Any) -> StepOutput:
        raise NotImplementedError

    # -- step capture: length buckets (train.step_capture, lstmablate/train/capture.py) ------
    def batch_length(self, batch: Any) -> int | tuple[int, ...] | None:
        """The lengths a training batch's shape varies with, for ``train.step_capture``'s
        length buckets: an int (one padded dimension, e.g. the tokens of the longest
        sentence) or a tuple of ints (several, e.g. NMT's source and target tokens; always
        the same number for a task).  Default None: the task's batches are not padded to
        buckets (their shape is fixed, or the task has no :meth:`pad_batch`)."""
        return None

    def pad_batch(self, batch: Any, length: int | tuple[int, ...]) -> Any:
        """``batch`` padded to ``length`` (as :meth:`batch_length` gives it; no entry shorter
        than the batch's own), such that :meth:`loss` on it gives the loss, the weight, the
        tokens and the gradients of ``batch`` itself: padded positions are masked in
        everything that reads them (the encoders' lengths, attention, pooling, the losses'
        ignored targets).  Only dropout draws differ: more numbers, for positions nothing
        reads."""
        raise NotImplementedError(f"task {self.name!r} does not pad its batches")

    # -- evaluation -------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: str, *, final: bool = False) -> dict[str, float]:
        raise NotImplementedError

    def evaluate_items(self, model: nn.Module, split: str
                       ) -> tuple[dict[str, float], list[ItemRecord] | None]:
        """The final evaluation of ``split`` (``evaluate(final=True)``'s metrics) and one record
        per item of the split, in the split's order: a flat JSON object with an ``id`` (unique
        in the split) and the sufficient statistics :meth:`item_metrics` sums.  Default: the
        metrics and None (the task scores no items; ``lstmablate compare`` cannot test it)."""
        return self.evaluate(model, split, final=True), None

    def item_metrics(self) -> dict[str, ItemMetric]:
        """The metrics of :meth:`evaluate_items` that its records recompute, by name (the
        task's declared order; the primary one, when it is final, first)."""
        return {}

    def reference_items(self, split: str) -> Sequence[str] | None:
        """The gold side of each item of ``split`` as text (a reference translation, a gold
        tree, a label and its sentence, ...), in the order of :meth:`evaluate_items`' records;
        the scores file records its sha256 so that two runs' scores are known to be of one test
        set.  Default: None (the task does not say; scores are then matched by
        :meth:`item_key` alone)."""
        return None

    def item_key(self, record: Mapping[str, Any]) -> Any:
        """What identifies an item and its gold data (a sentence's id and length, ...): two
        runs whose records differ in it were scored on different test sets.  Default: the id."""
        return record["id"]

    def write_predictions(self, model: nn.Module, split: str, path: Path) -> dict[str, float]:
        """Write ``split``'s predictions to ``path`` in the format of the task's official
        scorer; return the metrics computed from that file."""
        raise UserError(f"task {self.name!r} does not write predictions "
                        "(it has no write_predictions hook).")

    def visualization_inputs(self, model: nn.Module, text: str) -> tuple[nn.Module, Tensor, list[str]]:
        """For ``lstmablate visualize``: (encoder, its input vectors (1, T, I), token labels).

        Tasks with several encoders return the one Appendix A would show.
        """
        raise NotImplementedError(f"task {self.name!r} does not support visualize")

    # -- data-parallel and devices --------------------------------------------------------
    def shard(self, batch: Any, dist_info: Any) -> Any:
        """This process's part of a global batch under torchrun (default: split dim 0)."""
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
    """The installed task plugins' entry points by name.  Reading them scans every installed
    package's metadata (about 10 ms) and a report looks a task up for every run it reads, so
    the last reading is kept while the import path and the modification times of its folders
    stay the same (installing or removing a package changes its folder's)."""
    return dict(_entry_points_of(_import_path_state()))


def _import_path_state() -> tuple[tuple[str, int | None], ...]:
    state = []
    for entry in sys.path:
        try:
            state.append((entry, os.stat(entry or ".").st_mtime_ns))
        except OSError:  # a missing folder: found again if it appears
            state.append((entry, None))
    return tuple(state)


@functools.lru_cache(maxsize=1)
def _entry_points_of(state: tuple[tuple[str, int | None], ...]) -> dict[str, Any]:
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


def available_datasets() -> dict[str, Dataset]:
    """Every dataset an installed task reads, by name (loads every task plugin)."""
    found: dict[str, Dataset] = {}
    for name in available_tasks():
        for ds in get_task(name).datasets:
            found[ds.name] = ds
    return dict(sorted(found.items()))
