"""Twins: a run that another experiment already trained with the same config.

A rate grid trains each cell at a few learning rates, seed 1; the main table then asks for
the cell at its chosen rate, seed 1, in the table's own experiment — the same training,
filed elsewhere.  Two runs are *twins* when they differ only in where they are filed
(``experiment``, ``recipe``, ``recipe_file``): the same task, cell and seed, the same
``data``, ``model`` and ``train`` sections (:meth:`~lstmablate.config.RunConfig.identity`, read
as :meth:`~lstmablate.run.record.Run.open` reads an older run: a toolkit option added since
counts at its default) and the same ``eval`` options, so the same numbers (bit for bit on the
machine that trained it, whose arithmetic is deterministic at a fixed thread count).

``lstmablate sweep RECIPE --reuse DIR`` copies the finished twin found under DIR into each
run folder of the sweep that holds nothing yet, instead of training it again
(:func:`find_twin`, :func:`copy_twin`): every file of the run as it is (its records,
checkpoints, artefacts and scores; not its lock or TensorBoard events), its ``config.yaml``
written as the sweep resolves it (its own experiment and recipe), and ``twin.json`` naming
the run that was trained (:class:`TwinRecord`).  ``result.json`` is copied last, so a copy
cut short is an unfinished run that the sweep trains.  Every report names the copied runs in
its notes; ``env.json`` stays the trained run's (its machine, commit and command).
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from lstmablate import io
from lstmablate.config import RunConfig
from lstmablate.errors import DataError
from lstmablate.limits import is_seed
from lstmablate.runfolder import check_run_entries
from .record import Run, saved_config_differences, saved_eval_differences
from .runlock import RunLock
from .runs import RunFiles, write_config


@dataclass(frozen=True)
class TwinRecord:
    """``twin.json``: the run that was trained, where it was filed (its runs tree's
    ``<experiment>/<cell>/seed-<n>`` and the recipe it was trained from), and when the copy
    was made.  A copy of a copy names the run that was trained, never the copy between."""

    experiment: str
    cell: str
    seed: int
    recipe: str | None
    copied: str

    @property
    def run(self) -> str:
        """The trained run as a report names it: ``<experiment>/<cell>/seed-<n>``."""
        return f"{self.experiment}/{self.cell}/seed-{self.seed}"

    def to_dict(self) -> dict[str, Any]:
        return {"of": {"experiment": self.experiment, "cell": self.cell, "seed": self.seed,
                       "recipe": self.recipe}, "copied": self.copied}

    @classmethod
    def read(cls, files: RunFiles) -> TwinRecord | None:
        """The run's ``twin.json``; None where it has none (a run trained in its folder); a
        DataError naming the file and what was expected where it is not one."""
        if not files.twin.exists():
            return None
        d = io.read_json(files.twin, DataError)
        of = d.get("of") if isinstance(d, dict) else None
        ok = (isinstance(of, dict) and all(isinstance(of.get(k), str) and of.get(k)
                                           for k in ("experiment", "cell"))
              and is_seed(of.get("seed")) and isinstance(of.get("recipe"), (str, type(None)))
              and isinstance(d.get("copied"), str))
        if not ok:
            raise DataError(
                f"{files.twin}: expected {{\"of\": {{\"experiment\": NAME, \"cell\": NAME, "
                "\"seed\": N, \"recipe\": NAME or null}, \"copied\": TIME}} (the run this one "
                "is a copy of, as `lstmablate sweep --reuse` writes it); got something else. "
                "Remove the run folder and train it again, or copy it again with --reuse.")
        assert isinstance(of, dict)
        return cls(of["experiment"], of["cell"], int(of["seed"]), of["recipe"], d["copied"])


def checkpoint_key(files: RunFiles, cfg: RunConfig) -> dict[str, Any]:
    """What the checkpoints of the run ``cfg`` in ``files`` must record to be loaded
    (:meth:`~lstmablate.config.RunConfig.checkpoint_key`): a copied run's are its trained
    twin's, which name the experiment it was trained for."""
    key = cfg.checkpoint_key()
    twin = TwinRecord.read(files)
    return {**key, "experiment": twin.experiment} if twin is not None else key


def find_twin(cfg: RunConfig, target: RunFiles, roots: list[Path]) -> RunFiles | None:
    """The first finished run under ``roots`` (each a runs tree, ``<experiment>/<cell>/
    seed-<n>/``; the run's own experiment first, then the others in name order) that is
    ``cfg``'s twin and is not ``target`` itself; None where there is none.  A run whose config
    cannot be read is passed over."""
    for root in roots:
        root = Path(root)
        if not root.is_dir():
            continue
        for folder in sorted((p for p in root.iterdir() if p.is_dir()),
                             key=lambda p: (p.name != cfg.experiment, p.name)):
            files = RunFiles.of(root, folder.name, cfg.cell, cfg.seed)
            if files.root.resolve() == target.root.resolve() or not files.is_finished():
                continue
            if saved_config_differences(files, cfg) == [] and \
                    not saved_eval_differences(files, cfg):
                return files
    return None


def _copy_file(source: Path, target: Path) -> None:
    """One file of the run, as it is (read without following a link)."""
    with os.fdopen(io.open_regular(source, DataError), "rb") as f:
        io.atomic_write(target, lambda out: shutil.copyfileobj(f, out, 1 << 20))


def copy_twin(source: RunFiles, target: RunFiles, cfg: RunConfig) -> TwinRecord:
    """Copy the finished run ``source`` into the empty run folder ``target`` as the run
    ``cfg`` (its twin), holding ``target``'s lock; ``result.json`` last.  Returns the run that
    was trained; ``twin.json`` says so where that run was trained for another experiment (a
    run copied from another runs tree into its own experiment is the run itself)."""
    check_run_entries(source.root)  # (a link in the run copied is refused, never followed)
    now = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    earlier = TwinRecord.read(source)
    if earlier is not None:  # a copy itself: the run trained is the one it names
        record = replace(earlier, copied=now)
    else:
        trained = Run.open(source.root)
        record = TwinRecord(trained.experiment, trained.cell, trained.seed, trained.recipe, now)
    with RunLock(target.root):
        write_config(target, cfg)
        if record.experiment != cfg.experiment:
            io.atomic_write_json(target.twin, record.to_dict())
        for name in (RunFiles.ENV, RunFiles.METRICS, RunFiles.LAST, RunFiles.BEST):
            if (source.root / name).is_file():
                _copy_file(source.root / name, target.root / name)
        for folder in (RunFiles.ARTEFACTS, RunFiles.SCORES):
            if (source.root / folder).is_dir():
                own = target.own_folder(folder)
                for path in sorted((source.root / folder).iterdir()):
                    if path.is_file() and not path.is_symlink() and not path.name.startswith("."):
                        _copy_file(path, own / path.name)
        _copy_file(source.result, target.result)
    return record
