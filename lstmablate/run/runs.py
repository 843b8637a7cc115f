"""The runs layout: ``runs/<experiment>/<cell>/seed-<n>/``.

Each run directory holds ``config.yaml`` (the fully resolved config),
``env.json`` (versions, git commit, device, threads, command line; on a resume the
earlier segments' under ``"earlier"``),
``metrics.jsonl`` (one line per evaluation), ``result.json`` (best-dev and
test metrics), the checkpoints ``last.pt`` / ``best.pt`` and ``artefacts/``
(one JSON file per thing the task built from the training data, e.g. its
vocabulary, so evaluation never re-reads training data, and ``_manifest.json``
with the size and sha256 of each, checked whenever they are read) and
``scores/<split>.jsonl.gz`` (the final evaluation item by item, for significance
tests, gzip-compressed; the format is :mod:`lstmablate.run.scores`'s; a run written before
scores were compressed has ``scores/<split>.jsonl``, read alike); a run copied from its twin
(``sweep --reuse``, :mod:`lstmablate.run.twins`) also ``twin.json``.  Everything
is written atomically.  The folder protects itself: it is a boundary
(:mod:`lstmablate.runfolder`: an entry that is a symbolic link, or not of its kind, is
refused before anything is written, never followed; no command writes its outputs into a
run folder), ``--force`` removes only the files of the names a run writes, and the
temporary files of writes a kill interrupted are deleted when the run starts again
(:func:`remove_interrupted_writes`).

This module spells the layout and writes the records (and reads back the artefacts, whose
manifest it writes, and ``result.json``'s format, :class:`RunResult`); a run folder is read
as a whole by :class:`lstmablate.run.record.Run`.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar

from lstmablate.config import RunConfig
from lstmablate.errors import DataError, RunDirError
from lstmablate import io
from lstmablate.io import atomic_write, atomic_write_json, atomic_write_yaml, read_json
from lstmablate.limits import MAX_SEED, is_number, is_seed
from lstmablate.runfolder import RunNames, check_run_entries, entry_problem
from lstmablate.train.checkpoint import START_AGAIN
from lstmablate.train.tensorboard import EVENTS_GLOB


def check_out_dir(out: str | Path, option: str = "--out") -> None:
    """UserError for a runs root that cannot hold runs: a file, a NUL byte, a name too long for
    the file system (checked before anything is read or written)."""
    io.check_dir_path(out, option, RunDirError)
    p = Path(out)
    if p.exists() and not p.is_dir():
        raise RunDirError(f"{option} {out}: that is a file, not a directory. Choose another "
                          "--out (the runs tree is <out>/<experiment>/<cell>/seed-<n>/). "
                          "Nothing was written.")


@dataclass(frozen=True)
class RunFiles(RunNames):
    """A run folder, ``<runs>/<experiment>/<cell>/seed-<n>/``: its paths, from the names
    spelled once in :class:`~lstmablate.runfolder.RunNames` (``RunFiles.CONFIG`` ...).  The
    trainer is handed these paths; reports, plots and sweeps ask it."""

    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    @classmethod
    def of(cls, runs_root: str | Path, experiment: str, cell: str, seed: int) -> RunFiles:
        return cls(Path(runs_root) / experiment / cell / f"seed-{seed}")

    def named(self) -> dict[str, Any]:
        """The cell and seed the folder's path names where it has :meth:`of`'s layout
        (``.../CELL/seed-N``); {} where it has not (a run may live in any folder)."""
        prefix, _, number = self.root.name.partition("-")
        if prefix != "seed" or not (number.isascii() and number.isdigit()):
            return {}
        return {"cell": self.root.parent.name, "seed": int(number)}

    @property
    def config(self) -> Path:
        return self.root / self.CONFIG

    @property
    def env(self) -> Path:
        return self.root / self.ENV

    @property
    def result(self) -> Path:
        return self.root / self.RESULT

    @property
    def metrics(self) -> Path:
        return self.root / self.METRICS

    @property
    def twin(self) -> Path:
        return self.root / self.TWIN

    @property
    def last(self) -> Path:
        return self.root / self.LAST

    @property
    def best(self) -> Path:
        return self.root / self.BEST

    def checkpoint(self, which: str) -> Path | None:
        """``best`` or ``last``; None for any other name."""
        return {"best": self.best, "last": self.last}.get(which)

    @property
    def artefacts(self) -> Path:
        return self.root / self.ARTEFACTS

    @property
    def manifest(self) -> Path:
        return self.artefacts / self.MANIFEST

    @property
    def tensorboard(self) -> Path:
        return self.root / self.TENSORBOARD

    @property
    def log(self) -> Path:
        """``<run folder>.log``, beside the folder: the output of a run a sweep started in a
        subprocess (``--jobs``, a Slurm job)."""
        return self.root.with_name(self.root.name + ".log")

    def scores(self, split: str) -> Path:
        """The per-item scores of ``split``'s final evaluation, as they are written."""
        return self.root / self.SCORES / f"{split}{self.SCORES_SUFFIX}"

    def scores_before(self, split: str) -> Path:
        """The scores file of ``split`` as runs wrote it before scores were compressed."""
        return self.root / self.SCORES / f"{split}{self.SCORES_SUFFIX_BEFORE}"

    def scores_to_read(self, split: str) -> Path:
        """The scores file of ``split`` a reader opens: :meth:`scores`, or where only
        :meth:`scores_before` is there, that one."""
        path, before = self.scores(split), self.scores_before(split)
        return before if not path.exists() and before.exists() else path

    def score_files(self) -> list[Path]:
        """Every scores file in the run folder, of either name, sorted."""
        folder = self.root / self.SCORES
        if not folder.is_dir() or folder.is_symlink():
            return []
        return sorted(p for suffix in (self.SCORES_SUFFIX, self.SCORES_SUFFIX_BEFORE)
                      for p in folder.glob(f"*{suffix}") if not p.name.startswith("."))

    def own_folder(self, name: str) -> Path:
        """The run's folder ``name`` (artefacts, scores), created if missing, for a write into
        it; RunDirError if it is a symbolic link or not a folder (checked again just before
        the write: the files go into the run, never through a link out of it)."""
        folder = self.root / name
        problem = entry_problem(folder, folder=True)
        if problem:
            raise RunDirError(f"{problem}. Nothing was written.")
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def is_finished(self) -> bool:
        return self.result.exists()

    def checkpoint_hint(self, damaged: Path) -> str:
        """What to do about a damaged checkpoint: evaluate the run's other one (if it exists),
        or start the run again."""
        other = {self.last: "best", self.best: "last"}.get(Path(damaged))
        text = ""
        if other and self.checkpoint(other).exists():
            text = (f"The run's other checkpoint may still be good: `lstmablate eval {self.root} "
                    f"--checkpoint {other}`. ")
        return text + START_AGAIN

    def looks_like_run(self) -> bool:
        """Anything a training run writes is there (a result, metrics or a checkpoint)."""
        return any(p.exists() for p in (self.result, self.metrics, self.last, self.best))

    @classmethod
    def under(cls, folder: str | Path) -> list[RunFiles]:
        """The run folders (with a config) at or under ``folder``, in path order."""
        folder = Path(folder)
        if (folder / cls.CONFIG).is_file():
            return [cls(folder)]
        return [cls(p.parent) for p in sorted(folder.rglob(cls.CONFIG))]


@dataclass(frozen=True)
class SlurmFiles:
    """``<runs>/_slurm/``: what ``sweep --launcher slurm`` keeps beside the run folders.
    submitit's files (``<job>_submission.sh``, pickles, ``<job>_0_log.out``/``.err``) and ours:
    per array job ``<job>_runs.json`` (its runs in task order, ``{"job", "submitted",
    "runs": [{"run": <folder relative to runs>, "job": <job>_<task>}]}``) and per array task
    ``<job>_<task>_outcome.json`` (how its training process ended)."""

    runs_root: Path

    FOLDER: ClassVar[str] = "_slurm"

    def __post_init__(self) -> None:
        object.__setattr__(self, "runs_root", Path(self.runs_root))

    @property
    def folder(self) -> Path:
        return self.runs_root / self.FOLDER

    def submission(self, job: str) -> Path:
        return self.folder / f"{job}_runs.json"

    def submissions(self) -> list[Path]:
        """Every ``<job>_runs.json``, oldest job first."""
        found = self.folder.glob("*_runs.json") if self.folder.is_dir() else []
        return sorted(found, key=lambda p: (len(p.name), p.name))

    def outcome(self, task_job: str) -> Path:
        return self.folder / f"{task_job}_outcome.json"

    def slurm_log(self, task_job: str) -> Path:
        """submitit's stderr of an array task (``<job>_<task>``), or of a single job."""
        return self.folder / f"{task_job}_0_log.err"


@dataclass
class RunResult:
    """``result.json``: a finished run's numbers and how they were obtained.

    ``best`` is the selected checkpoint (``{"step", "epoch", "dev": metrics}``); ``test`` the
    final evaluation of the test checkpoint (None with ``train.eval_test: false``);
    ``dev_final`` the final evaluation of the dev split, for tasks whose final evaluation
    differs from the selection one.  Keys a newer version wrote are kept in ``extra``.
    """

    task: str
    cell: str
    experiment: str
    seed: int
    recipe: str | None
    primary: str
    higher_is_better: bool
    best: dict[str, Any]
    test: dict[str, float] | None
    test_checkpoint: str
    steps: int
    epochs: int
    train_time_s: float
    wall_time_s: float
    params: int
    skipped_nonfinite: int = 0
    shortened: bool = False
    world_size: int = 1
    dev_final: dict[str, float] | None = None
    #: CPU seconds of the training process over the same spans as ``train_time_s`` (None:
    #: not known — a run begun by a version that did not record it)
    train_cpu_s: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def dev(self) -> dict[str, float] | None:
        """The best checkpoint's dev metrics."""
        return (self.best or {}).get("dev")

    def section(self, name: str) -> dict[str, float] | None:
        """``dev``, ``dev_final`` or ``test`` metrics."""
        return {"dev": self.dev, "dev_final": self.dev_final, "test": self.test}.get(name)

    def to_json(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}
        if d["dev_final"] is None:
            del d["dev_final"]
        return {**self.extra, **d}

    @classmethod
    def from_json(cls, d: Any, where: object = RunFiles.RESULT) -> RunResult:
        """A result.json read back (``d``: the parsed document; ``where``: the file, for
        messages), every key lstmablate writes checked for its type (a seed, metrics that map
        names to numbers, ``best``, counts, times): anything else is one DataError naming the
        file and the key, so no reader downstream meets a string where a number goes.  Files of
        older versions (a duplicate ``dev``, fewer keys) read too; keys of newer ones are kept
        in ``extra``."""
        def damaged(what: str) -> DataError:
            return DataError(f"{where}: {what}. The file is damaged or was not written by "
                             "lstmablate; the run's `lstmablate train` command plus --resume "
                             "evaluates the finished run again and writes it anew.")

        if not isinstance(d, dict):
            raise damaged(f"it holds a JSON {_json_type(d)}, not the object lstmablate writes")
        if not d:
            raise damaged("it is an empty object {}: it holds no metrics")
        if "test" not in d:
            raise damaged("it has no `test` entry (every result.json lstmablate writes has one)")
        for key, value in d.items():
            check = _RESULT_TYPES.get(key)
            if check is not None and not check[0](value):
                shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
                raise damaged(f"`{key}` must be {check[1]}, got {shown}")
        names = {f.name for f in fields(cls)} - {"extra"}
        known = {k: v for k, v in d.items() if k in names}
        extra = {k: v for k, v in d.items() if k not in names and k != "dev"}
        if "best" not in known:  # only the duplicate survived
            known["best"] = {"dev": d.get("dev")}
        for key, default in (("recipe", None), ("primary", ""), ("higher_is_better", True),
                             ("test_checkpoint", "best"), ("steps", 0), ("epochs", 0),
                             ("train_time_s", 0.0), ("wall_time_s", 0.0), ("params", 0),
                             ("experiment", ""), ("cell", ""), ("task", ""), ("seed", 0)):
            known.setdefault(key, default)
        return cls(**known, extra=extra)


def _json_type(value: Any) -> str:
    """What JSON calls the type of a parsed value."""
    return {dict: "object", list: "list", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number")


def _count(value: Any, low: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= 2**53


def _seconds(value: Any) -> bool:
    return is_number(value) and math.isfinite(value) and value >= 0


def _metrics(value: Any) -> bool:
    return value is None or (isinstance(value, dict) and all(
        isinstance(k, str) and is_number(v) for k, v in value.items()))


#: what each key of result.json must hold (a reader's check, with the words a message uses)
_RESULT_TYPES: dict[str, tuple[Any, str]] = {
    **{k: (lambda v: isinstance(v, str), "a string")
       for k in ("task", "cell", "experiment", "primary")},
    "recipe": (lambda v: v is None or isinstance(v, str), "a string or null"),
    "seed": (is_seed, f"a run seed (an integer between 0 and {MAX_SEED:,})"),
    **{k: (lambda v: isinstance(v, bool), "true or false") for k in ("higher_is_better",
                                                                      "shortened")},
    **{k: (_metrics, "null or an object mapping metric names to numbers")
       for k in ("test", "dev_final", "dev")},
    "best": (lambda v: isinstance(v, dict) and _metrics(v.get("dev")) and all(
        v.get(k) is None or _count(v[k]) for k in ("step", "epoch")),
        'an object {"step": N, "epoch": N, "dev": metrics}'),
    "test_checkpoint": (lambda v: v in ("best", "last"), "best or last"),
    **{k: (_count, "a count (an integer of at least 0)")
       for k in ("steps", "epochs", "params", "skipped_nonfinite")},
    "world_size": (lambda v: _count(v, 1), "an integer of at least 1"),
    **{k: (_seconds, "a number of seconds") for k in ("train_time_s", "wall_time_s")},
    "train_cpu_s": (lambda v: v is None or _seconds(v), "a number of seconds or null"),
}


def remove_interrupted_writes(files: RunFiles) -> list[Path]:
    """Delete the temporary files that writes of the run's own files left when a kill
    interrupted them (call it holding the run's lock); returns what was deleted."""
    removed = io.remove_interrupted_writes(files.root, RunFiles.FILE_NAMES)
    for folder in (files.artefacts, files.root / RunFiles.SCORES):
        if folder.is_dir() and not folder.is_symlink():  # the run's alone
            removed += io.remove_interrupted_writes(folder)
    return removed


def has_started(files: RunFiles) -> bool:
    """Did the run train at all: a checkpoint, a result or an evaluation line."""
    return (files.last.exists() or files.best.exists() or files.result.exists()
            or (files.metrics.exists() and files.metrics.stat().st_size > 0))


def clear_run_dir(files: RunFiles) -> None:
    """Remove what a run wrote (for --force): the files of the names a run writes and nothing
    else (a file of the user's own in the folder stays), never through a symbolic link; the
    lock file stays."""
    check_run_entries(files.root)  # (the caller checked them; a link is never followed)
    for p in (files.result, files.metrics, files.last, files.best, files.config, files.env,
              files.twin):
        p.unlink(missing_ok=True)
    found = [p for folder, pattern in ((files.artefacts, "*.json"),  # (the manifest included)
                                       (files.tensorboard, EVENTS_GLOB))  # the replaced run's
             for p in (folder.glob(pattern) if folder.is_dir() else ())]
    for p in found + files.score_files():  # (+ its models' scores, of either name)
        if not p.is_dir() or p.is_symlink():  # (a link is removed, what it points to not)
            p.unlink()


def write_config(files: RunFiles, cfg: RunConfig) -> None:
    atomic_write_yaml(files.config, cfg.to_dict())


def write_env(files: RunFiles, env: dict[str, Any], *, resume: bool = False) -> None:
    """Write ``env.json``.  On a resume the environments of the run's earlier segments are
    kept, oldest first, under ``"earlier"``: a run trained across sessions, commits or
    machines says so instead of showing only the last one."""
    if resume and files.env.exists():
        try:
            old = json.loads(files.env.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            old = {"unreadable": f"the earlier {files.env.name} could not be read ({e})"}
        if isinstance(old, dict):
            earlier = old.pop("earlier", [])
            env["earlier"] = [*(earlier if isinstance(earlier, list) else []), old]
    atomic_write_json(files.env, env)


def write_result(files: RunFiles, result: RunResult) -> None:
    atomic_write_json(files.result, result.to_json())


_ARTEFACT_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def write_artefacts(files: RunFiles, artefacts: dict[str, Any]) -> None:
    """``artefacts/<key>.json`` for every key (JSON values), written atomically, then the
    manifest of their sizes and sha256 (atomically, last: a manifest names only complete
    files)."""
    folder = files.own_folder(RunFiles.ARTEFACTS)
    manifest = {}
    for key, value in artefacts.items():
        if not _ARTEFACT_KEY.match(str(key)):
            raise ValueError(f"artefact key {key!r} is not a plain file name")
        data = (json.dumps(value, indent=2, sort_keys=True) + "\n").encode("utf-8")
        atomic_write(folder / f"{key}.json", lambda f, data=data: f.write(data))
        manifest[f"{key}.json"] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    atomic_write_json(files.manifest, {"format": 1, "files": manifest})


def _damaged_artefacts(files: RunFiles, what: str) -> DataError:
    return DataError(
        f"the run's artefacts are damaged: {what}. The artefacts (what the run built from the "
        f"training data, e.g. its vocabulary) must be exactly as the run wrote them, or the model "
        f"cannot be rebuilt. Copy the run folder {files.root} again from where it came from, or "
        "train the run again with the same `lstmablate train` command plus --force.")


def read_artefacts(files: RunFiles) -> dict[str, Any] | None:
    """The run's saved artefacts, each checked against the manifest written with them; None if
    it has none (a run saved before artefacts existed, or a new run).  A run saved before the
    manifest existed has its artefacts read unchecked."""
    if not files.artefacts.is_dir():
        return None
    if not files.manifest.exists():  # saved before manifests
        return {p.stem: read_json(p) for p in sorted(files.artefacts.glob("*.json"))}
    doc = read_json(files.manifest)
    listed = doc.get("files") if isinstance(doc, dict) else None
    if not isinstance(listed, dict) or not all(
            isinstance(v, dict) and isinstance(v.get("bytes"), int) and isinstance(v.get("sha256"), str)
            and _ARTEFACT_KEY.match(str(k)) and str(k).endswith(".json") for k, v in listed.items()):
        raise _damaged_artefacts(files, f"{files.manifest} is not a manifest of artefacts")
    out = {}
    for name, want in sorted(listed.items()):
        path = files.artefacts / name
        if not path.is_file():
            raise _damaged_artefacts(files, f"{path} is missing")
        data = path.read_bytes()
        if len(data) != want["bytes"] or hashlib.sha256(data).hexdigest() != want["sha256"]:
            raise _damaged_artefacts(files, f"{path} was changed after the run wrote it (its size "
                                     f"or sha256 differs from {files.manifest})")
        out[name[:-len(".json")]] = read_json(path)
    return out


