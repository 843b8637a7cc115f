"""A run folder read back: :class:`Run` and :func:`find_runs`, the one reader of every command
that reads runs (``eval``, ``report``, ``compare``, ``plot``, ``visualize``, ``sweep``'s plan
and status, the GPU check).

:meth:`Run.open` reads the folder's ``config.yaml`` at once, checked and brought to this
version: what names the run (task, cell, experiment, seed, recipe) well typed
(:func:`~lstmablate.config.check_saved_identity`) and, where the run's task is installed,
every section as the typed :class:`~lstmablate.config.RunConfig` that ``train`` saved,
migrated by :func:`~lstmablate.config.config_from_dict` (keys renamed or added since, legacy
recipe metadata dropped), the code that checks a recipe's values too.  So a task's hooks are
given a typed config and never migrate keys themselves.  The rest is read on demand, each
file by the reader of its format and checked as it is read: :attr:`Run.result`
(``result.json``, :meth:`~lstmablate.run.runs.RunResult.from_json`), :meth:`Run.metrics`
(``metrics.jsonl``, :func:`read_metrics`) and :meth:`Run.scores` (``scores/<split>.jsonl.gz``,
:func:`~lstmablate.run.scores.read_scores`).  A damaged file is a UserError naming it: the
commands that read many runs (``report``, ``plot``) skip such a run and say why, those asked
for one run stop.

A new field of a run's record is declared where its file's format is, and read from there
by every command: a config key in its dataclass (:mod:`lstmablate.config`, a task's
sections), a result key in :class:`~lstmablate.run.runs.RunResult`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lstmablate.config import RunConfig, check_saved_identity, config_from_dict, to_plain
from lstmablate.errors import ConfigError, DataError, RunDirError, UnknownNameError, UserError
from lstmablate.io import load_yaml, parse_json, read_json, read_lines
from lstmablate.limits import is_number
from lstmablate.runfolder import check_run_entries
from lstmablate.task import get_task
from lstmablate.train.checkpoint import START_AGAIN

from .runs import RunFiles, RunResult, has_started
from .scores import Scores, read_scores, scores_command

if TYPE_CHECKING:
    from lstmablate.task import Task


class NotARun(ConfigError):
    """A ``config.yaml`` that names no run, in a folder that holds nothing a run writes:
    another tool's file, which :func:`find_runs` passes over (asked for by itself, it is
    refused as any config that is not a run's)."""


def make_task(cfg: RunConfig, data_dir: Path, run_dir: Path | None) -> Task:
    """The task object of a run (its data is not loaded yet)."""
    return get_task(cfg.task)(cfg.data, cfg.model, data_dir, seed=cfg.seed, eval_cfg=cfg.eval,
                              run_dir=run_dir)


def split_name(task: Task | type[Task], split: str) -> str:
    """The task's name of ``split`` (dev or test, or the task's own names of them); a
    UserError naming --split otherwise."""
    valid = {"dev": task.dev_split, "test": task.test_split,
             task.dev_split: task.dev_split, task.test_split: task.test_split}
    if split not in valid:
        raise UserError(f"--split must be dev or test (this task calls them "
                        f"{task.dev_split!r} and {task.test_split!r}), got {split!r}")
    return valid[split]


class Run:
    """One run folder, ``<runs>/<experiment>/<cell>/seed-<n>/``, read back (:meth:`open`).

    What names the run (:attr:`experiment`, :attr:`cell`, :attr:`seed`, :attr:`task_name`,
    :attr:`recipe`, :attr:`recipe_file`) is known for every run folder; the typed
    :attr:`config` and the :attr:`task` object where the run's task is installed here (else
    they are a ConfigError naming the file: :attr:`installed` says which).  The records are
    read when first asked for, and kept.
    """

    def __init__(self, files: RunFiles, saved: dict[str, Any], config: RunConfig | None,
                 not_installed: str = ""):
        self.files = files
        #: config.yaml as it was saved (keys of older versions included, which the typed
        #: config leaves out: a report finds the recipe metadata old runs kept there)
        self.saved = saved
        self._config = config
        self._not_installed = not_installed  # why there is no typed config
        self._result: RunResult | UserError | None = None
        self._metrics: list[dict[str, Any]] | None = None
        self._scores: dict[Path, Scores] = {}
        self._task: Task | None = None

    @classmethod
    def open(cls, path: str | Path) -> Run:
        """The run folder at ``path``, its config read and checked; a UserError naming the
        file for a folder without a config.yaml, or whose config.yaml is damaged or not a
        run's (:class:`NotARun` for another tool's file in a folder holding nothing else of
        a run's)."""
        files = RunFiles(Path(path))
        if not files.config.exists():
            raise ConfigError(f"{path} is not a run directory (no {RunFiles.CONFIG}).")
        return cls.of_saved(files, load_yaml(files.config, DataError))

    @classmethod
    def of_saved(cls, files: RunFiles, saved: Any) -> Run:
        """The run of ``files`` from ``saved``, its config.yaml as parsed (see :meth:`open`)."""
        where = str(files.config)
        try:
            check_saved_identity(saved, where)
        except ConfigError as e:
            names_a_run = isinstance(saved, dict) and all(
                k in saved for k in ("experiment", "task", "cell"))
            if not names_a_run and not files.looks_like_run():
                raise NotARun(str(e)) from None
            raise
        try:
            task_cls = get_task(saved["task"])
        except UnknownNameError as e:  # a task not installed here (or a damaged name)
            return cls(files, saved, None, f"{where}: {e}")
        return cls(files, saved, config_from_dict(task_cls, saved, where))

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r})"

    # -- what names the run ------------------------------------------------------------------
    @property
    def path(self) -> Path:
        return self.files.root

    @property
    def experiment(self) -> str:
        return self.saved["experiment"]

    @property
    def cell(self) -> str:
        return self.saved["cell"]

    @property
    def seed(self) -> int:
        return self.saved["seed"]

    @property
    def task_name(self) -> str:
        return self.saved["task"]

    @property
    def recipe(self) -> str | None:
        """The recipe the run was trained from, by name (None: trained without one)."""
        return self.saved.get("recipe")

    @property
    def recipe_file(self) -> str | None:
        """The file of that recipe when the run was trained."""
        return self.saved.get("recipe_file")

    # -- its configuration and task ------------------------------------------------------------
    @property
    def installed(self) -> bool:
        """Is the run's task installed here (so that its config is typed and its task made)?"""
        return self._config is not None

    @property
    def config(self) -> RunConfig:
        """The run's config as ``train`` made it (migrated to this version); a ConfigError
        naming the file where the run's task is not installed."""
        if self._config is None:
            raise ConfigError(self._not_installed)
        return self._config

    @property
    def identity(self) -> dict[str, Any]:
        """What makes the run (:meth:`~lstmablate.config.RunConfig.identity`: task, cell,
        seed and the data, model and train sections)."""
        return self.config.identity()

    @property
    def task_class(self) -> type[Task]:
        """The run's task (its class: metrics, splits, deviations; nothing is read)."""
        return get_task(self.config.task)

    @property
    def task(self) -> Task:
        """The run's task object (no data loaded): it knows how its metrics are recomputed
        and what its splits are called."""
        if self._task is None:
            from lstmablate.data import resolve_data_dir

            self._task = make_task(self.config, resolve_data_dir(None), self.path)
        return self._task

    def split_name(self, split: str) -> str:
        """The task's name of ``split`` (dev or test); a UserError naming --split otherwise."""
        return split_name(self.task_class, split)

    # -- its records ---------------------------------------------------------------------------
    @property
    def result(self) -> RunResult | None:
        """result.json (None: the run is not finished); a DataError naming the file when it
        is damaged (:meth:`~lstmablate.run.runs.RunResult.from_json`)."""
        if self._result is None and self.files.is_finished():
            try:
                self._result = RunResult.from_json(read_json(self.files.result),
                                                   self.files.result)
            except UserError as e:  # (kept: asked again, the same answer)
                self._result = e
        if isinstance(self._result, UserError):
            raise self._result
        return self._result

    @property
    def problem(self) -> str:
        """Why the run's result.json cannot be used ("" when it can, or there is none)."""
        try:
            self.result  # noqa: B018 -- reading the property is the check
        except UserError as e:
            return str(e)
        return ""

    @property
    def status(self) -> str:
        """finished | unfinished | damaged (a result.json that cannot be used: :attr:`problem`)."""
        if self.problem:
            return "damaged"
        return "finished" if self.files.is_finished() else "unfinished"

    def reported(self, split: str) -> dict[str, float]:
        """The metrics result.json reports for ``split`` (its final dev evaluation if any)."""
        name = self.split_name(split)
        result = self.result
        if result is None:
            return {}
        if name == self.task_class.test_split:
            return dict(result.test or {})
        return dict(result.dev_final or result.dev or {})

    def metrics(self) -> list[dict[str, Any]]:
        """The evaluations of metrics.jsonl (:func:`read_metrics`; none before the first)."""
        if self._metrics is None:
            self._metrics = read_metrics(self.files.metrics) if self.files.metrics.exists() \
                else []
        return self._metrics

    def scores_path(self, split: str) -> Path:
        return self.files.scores_to_read(self.split_name(split))

    def scores(self, split: str) -> Scores:
        """The run's scores file of ``split``; a UserError naming the command that writes it."""
        path = self.scores_path(split)
        if path in self._scores:
            return self._scores[path]
        if not path.exists():
            raise UserError(f"{self.path} has no per-item scores of its {self.split_name(split)} "
                            f"split ({path} is missing; runs trained before scores existed have "
                            f"none). Write it from the run's checkpoint with `"
                            f"{scores_command(self.path, split)}`; nothing else in the run "
                            "changes.")
        scores = read_scores(path)
        # the file is this run's: a copy of another run's (another cell or seed) or of another
        # split would pair the wrong items and still give a verdict
        mine = {"cell": self.cell, "seed": self.seed, "split": self.split_name(split)}
        mismatched = [k for k in mine if scores.header[k] != mine[k]]
        named = self.files.named()
        if mismatched and all(k in named and scores.header[k] == named[k] for k in mismatched):
            # the scores file agrees with the folder's own path: config.yaml is the odd one
            raise DataError(f"{self.files.config}: names "
                            f"{', '.join(f'{k} {mine[k]!r}' for k in mismatched)}, but the run's "
                            f"folder ({self.path}) and its scores file ({path}) name "
                            f"{', '.join(f'{k} {named[k]!r}' for k in mismatched)}: this "
                            "config.yaml was edited or copied from another run. Put the run's own "
                            "config.yaml back (it is written once, when the run starts).")
        if mismatched:
            wrong = [f"{k} {scores.header[k]!r} (the run folder's: {mine[k]!r})" for k in mismatched]
            raise DataError(f"{path}, line 1: the header names {', '.join(wrong)}: the file is "
                            "another run's or another split's, copied here. Write this run's "
                            f"with `{scores_command(self.path, split)}`.")
        self._scores[path] = scores
        return scores


def find_runs(paths: Iterable[str | Path]) -> tuple[list[Run], list[tuple[Path, str]]]:
    """The runs at or under ``paths`` (run folders, or folders holding runs at any depth), each
    once, in path order, and the damaged ones with why: a folder whose config.yaml
    :meth:`Run.open` refuses (unreadable, or not what a run saves) is named with the message,
    never hiding the others; a damaged result.json or metrics.jsonl is found when it is read
    (:attr:`Run.problem`).  Another tool's config.yaml (:class:`NotARun`) is passed over.  A
    path that does not exist holds no run: each command says what it wants instead."""
    runs: list[Run] = []
    damaged: list[tuple[Path, str]] = []
    seen: set[Path] = set()
    for path in paths:
        for files in RunFiles.under(path):
            if files.root in seen:
                continue
            seen.add(files.root)
            try:
                runs.append(Run.open(files.root))
            except NotARun:
                continue
            except UserError as e:
                damaged.append((files.root, str(e)))
    return runs, damaged


# -- metrics.jsonl ------------------------------------------------------------------------------
#: the keys of a metrics line that are not metrics: when the evaluation was, and of what split
LINE_KEYS = ("step", "epoch", "split")
#: the largest step or epoch a metrics line may give (an integer a float holds exactly)
MAX_STEP = 2**53


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl, each line checked as the trainer writes it: a JSON
    object with an integer ``step`` (and ``epoch``), a ``split`` name, and numbers (or null)
    for everything else.  Anything else is a DataError naming the file and line: a curve is
    never drawn from a damaged record."""
    records = []
    for i, line in enumerate(read_lines(path), 1):
        if not line.strip():
            continue
        where = f"{path}, line {i}"
        try:
            rec = parse_json(line, where, DataError)
        except UserError as e:
            raise DataError(f"{e} Each line of metrics.jsonl is one evaluation as a JSON object."
                            ) from None
        problem = _record_problem(rec)
        if problem:
            raise DataError(f"{where}: {problem}; each line of metrics.jsonl is one evaluation "
                            "as the trainer writes it. The file is damaged: restore it from a copy "
                            "of the run folder, or delete the line (the curves then lack that "
                            "evaluation).")
        records.append(rec)
    return records


def _record_problem(rec: Any) -> str:
    """What is wrong with one parsed line of metrics.jsonl ("" if nothing)."""
    if not isinstance(rec, dict):
        return f"expected a JSON object, got a JSON {type(rec).__name__}"
    for key in ("step", "epoch"):
        value = rec.get(key)
        if (key == "step" or value is not None) and not (
                isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_STEP):
            return f"`{key}` must be an integer between 0 and {MAX_STEP:,}, got {value!r:.40}"
    if not isinstance(rec.get("split", ""), str):
        return f"`split` must be the name of a split, got {rec['split']!r:.40}"
    for key, value in rec.items():
        if key not in LINE_KEYS and value is not None and not is_number(value):
            return f"`{key}` must be a number (or null), got {value!r:.40}"
    return ""


# -- the run a folder holds, against the run a command would start ------------------------------
def saved_config_differences(files: RunFiles, cfg: RunConfig) -> list[str] | None:
    """How the run saved in ``files`` differs from ``cfg`` in what makes a run's identity
    (task, cell, seed, data, model, train): ``section.key (saved -> new)`` items, empty if it is
    the same run; None if its config.yaml cannot be read.  The saved run is read as
    :meth:`Run.open` reads it (brought to this version), so that neither a new toolkit option
    nor an edited recipe makes an existing run "different"; a saved config that cannot be
    typed is compared as it stands."""
    try:
        saved = load_yaml(files.config, DataError)
    except UserError:  # unreadable, too big, nested too deeply, not YAML
        return None
    new = cfg.identity()
    try:
        old = Run.of_saved(files, saved).identity
    except Exception:  # noqa: BLE001 - not comparable: report it as a difference
        old = {k: saved.get(k) for k in new} if isinstance(saved, dict) else saved
    return [] if old == new else config_differences(old if isinstance(old, dict) else {}, new)


def saved_eval_differences(files: RunFiles, cfg: RunConfig) -> list[str]:
    """How the ``eval`` section the run in ``files`` was evaluated with differs from ``cfg``'s:
    not part of a run's identity (``lstmablate eval --set`` re-evaluates a checkpoint), but a
    finished run's final numbers were made with it.  Read as :meth:`Run.open` reads it (keys
    added since read as those runs behaved); empty when unreadable (the identity check says so)."""
    try:
        old = to_plain(Run.of_saved(files, load_yaml(files.config, DataError)).config.eval)
    except Exception:  # noqa: BLE001 - damaged or foreign: saved_config_differences reports it
        return []
    return config_differences(old, to_plain(cfg.eval), "eval.")


def config_differences(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """``key (old -> new)`` for every key, at any depth, whose value differs."""
    out = []
    for k in sorted(set(old) | set(new), key=str):
        a, b = old.get(k), new.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            out += config_differences(a, b, f"{prefix}{k}.")
        elif a != b:
            out.append(f"{prefix}{k} ({a!r} -> {b!r})")
    return out


@dataclass(frozen=True)
class RunStart:
    """What a ``train`` command will do with its run directory (decided before any write)."""

    resume: bool  # continue from last.pt
    replace: bool  # clear what the directory holds first (--force, or a start that never trained)


def inspect_run_dir(files: RunFiles, cfg: RunConfig, *, resume: bool, force: bool) -> RunStart:
    """Check the directory against ``cfg`` without writing anything.

    A directory holding a *different* run (another identity) is refused unless
    ``force``; one holding this same run is refused unless ``resume`` or ``force`` —
    nothing is ever silently overwritten.  A directory whose run never trained (a start
    that failed after writing its config) is simply started again.  An entry of the
    directory that is a symbolic link (or not of its kind) is refused
    (:func:`~lstmablate.runfolder.check_run_entries`).
    """
    if files.root.exists() and not files.root.is_dir():
        raise RunDirError(f"{files.root} is a file, not a run directory. Choose another --out "
                          "(the runs tree is <out>/<experiment>/<cell>/seed-<n>/).")
    check_run_entries(files.root)
    if not files.config.exists():
        if resume and files.root.exists() and any(p.name != RunFiles.LOCK for p in files.root.iterdir()):
            raise RunDirError(f"{files.root} has files but no config.yaml; it is not a lstmablate "
                              "run. Use another --out directory.")
        return RunStart(resume=False, replace=False)
    if force or not has_started(files):
        return RunStart(resume=False, replace=True)
    diff = saved_config_differences(files, cfg)
    if diff is None:
        raise ConfigError(f"{files.config} is not valid YAML; it may be damaged. "
                          "Use --force to start this run again.")
    if diff:
        raise RunDirError(
            f"{files.root} already holds a different run (config differs in: {', '.join(diff)}). "
            "Nothing was changed. Use another --out directory, or --force to replace it.")
    if not files.is_finished() and not files.last.exists():  # nothing to continue from
        raise RunDirError(
            f"{files.root} holds this run, unfinished, but no {RunFiles.LAST} to "
            f"{'resume' if resume else 'continue it'} from (it was deleted, or the run stopped "
            "before its first one was saved, e.g. on a full disk). " + START_AGAIN)
    if not resume:
        state = "finished" if files.is_finished() else "unfinished"
        raise RunDirError(
            f"{files.root} already holds this run ({state}). Use --resume to continue it "
            "(a finished run is only re-evaluated), or --force to start again from scratch.")
    if not files.last.exists():
        raise RunDirError(
            f"{files.root} holds this run but has no {RunFiles.LAST} to resume from (it was "
            "deleted). Use --force to start the run again from scratch.")
    return RunStart(resume=True, replace=False)
