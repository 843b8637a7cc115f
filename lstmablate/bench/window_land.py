"""A GPU window's finished runs landed as records (``window land``, :mod:`.window`): the runs
the archive that came back holds (:data:`.window_archive.ARCHIVE`) written into a records
folder (``experiments/results``) in the layout ``lstmablate train`` writes,
``<experiment>/<cell>/seed-<n>/``: ``config.yaml``, ``env.json``, ``metrics.jsonl``,
``result.json`` and ``scores/`` -- what the result pages and ``lstmablate report`` read.

The archive is read, never extracted: each member is taken only if it is a regular file of
one of those names under ``runs/<experiment>/<cell>/seed-<n>/`` and at most
:data:`.window_archive.MAX_RECORD_BYTES` (a link, a device, a path that climbs out, another
name or a larger file is refused, naming the archive and the member); the logs and
gpu-check's record stay in it.  A run lands only if it finished (its ``result.json``) and
its records read back as a run's do (:class:`lstmablate.run.record.Run`: the config, the
result, each scores file, checked in a scratch folder first); one that did not finish is
named and left out.  A run whose folder is already there is refused -- all before anything
is written -- unless ``--force``, which replaces the records of that run (its files of a
run's names) and nothing else.  Every file is written through :mod:`lstmablate.io`.
"""

from __future__ import annotations

import os
import re
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from lstmablate import io

from .window_archive import ARCHIVE, MAX_RECORD_BYTES, RUNS_PREFIX
from .window_files import WindowError, say

#: a name of the archive's runs (an experiment, a cell): one folder name as ``train`` makes it
_NAME = r"[A-Za-z0-9][A-Za-z0-9._+-]*"
#: a run's record in the archive: ``runs/<experiment>/<cell>/seed-<n>/<file>``
_MEMBER = re.compile(rf"{RUNS_PREFIX}/(?P<experiment>{_NAME})/(?P<cell>{_NAME})/"
                     r"seed-(?P<seed>[0-9]{1,10})/(?P<file>[^/]+|scores/[^/]+)")


@dataclass
class LandedRun:
    """One run of the archive: where it goes and its record files (name -> bytes)."""

    experiment: str
    cell: str
    seed: int
    files: dict[str, bytes] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.experiment}/{self.cell}/seed-{self.seed}"


def _record_names() -> tuple[set[str], tuple[str, ...]]:
    """The file names a landed run may hold: the run's records, and its scores files' endings."""
    from lstmablate.run.runs import RunFiles

    return ({RunFiles.CONFIG, RunFiles.ENV, RunFiles.METRICS, RunFiles.RESULT},
            (RunFiles.SCORES_SUFFIX, RunFiles.SCORES_SUFFIX_BEFORE))


def read_archive(archive: Path) -> dict[str, LandedRun]:
    """The runs of ``archive`` (a window's ``gpu-window.tar.gz``), each with its record files,
    read in memory; a member that is not what a window's archive holds is a WindowError
    naming it.  Other members (the state, the summary, gpu-check's record, the logs) are
    passed over."""
    names, endings = _record_names()
    runs: dict[str, LandedRun] = {}
    fd = io.open_regular(archive, WindowError)  # (a FIFO or a device: refused, never read)
    try:
        with os.fdopen(fd, "rb") as f, tarfile.open(fileobj=f, mode="r:gz") as tar:
            for member in tar:
                climbs = member.name.startswith("/") or ".." in member.name.split("/")
                if not climbs and (not member.name.startswith(f"{RUNS_PREFIX}/")
                                   or member.name.endswith(".log")):
                    continue  # (the state, the summary, gpu-check's record, the runs' logs)
                m = None if climbs else _MEMBER.fullmatch(member.name)
                file = m["file"] if m else ""
                scores = file.startswith("scores/") and file.endswith(endings) \
                    and not file[len("scores/"):].startswith(".")
                if not m or not (file in names or scores):
                    raise WindowError(f"{archive}: the member {member.name[:120]!r} is not a run's "
                                      "record (runs/<experiment>/<cell>/seed-<n>/ and config.yaml, "
                                      "env.json, metrics.jsonl, result.json or scores/<split>.jsonl.gz"
                                      "); the archive is not a window's, or is damaged. Nothing was "
                                      "written.")
                if not member.isreg() or member.size > MAX_RECORD_BYTES:
                    raise WindowError(f"{archive}: the member {member.name[:120]!r} is "
                                      + ("not a regular file" if not member.isreg() else
                                         f"{member.size:,} bytes, more than a record's "
                                         f"{MAX_RECORD_BYTES:,}")
                                      + "; a window's archive holds neither. Nothing was written.")
                found = LandedRun(m["experiment"], m["cell"], int(m["seed"]))
                run = runs.setdefault(found.key, found)
                data = tar.extractfile(member)
                run.files[file] = data.read() if data is not None else b""
    except (tarfile.TarError, EOFError, OSError) as e:
        raise WindowError(f"{archive} is not a gzip-compressed tar archive, or is damaged or cut "
                          f"short ({e}); a window writes {ARCHIVE}. Nothing was written.") from None
    return runs


def _check_run(run: LandedRun, archive: Path) -> str:
    """The run's records written into a scratch folder and read back as a run's (config,
    result, every scores file); the line that says what it is; a WindowError naming the
    archive and the run where they do not read."""
    from lstmablate.errors import UserError
    from lstmablate.run.record import Run
    from lstmablate.run.runs import RunFiles

    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch) / run.experiment / run.cell / f"seed-{run.seed}"
        _write(run, root)
        try:
            landed = Run.open(root)
            result = landed.result
            for path in RunFiles(root).score_files():
                landed.scores(RunFiles.split_of(path))
        except UserError as e:
            raise WindowError(f"{archive}: the run {run.key} does not read as a run's records: "
                              f"{e} Nothing was written.") from None
        if (landed.experiment, landed.cell, landed.seed) != (run.experiment, run.cell, run.seed):
            raise WindowError(f"{archive}: the run under {run.key} names itself "
                              f"{landed.experiment}/{landed.cell}/seed-{landed.seed} in its "
                              "config.yaml; the archive is damaged. Nothing was written.")
    test = ", ".join(f"{k} {v:.4g}" for k, v in (result.test or {}).items()
                     if isinstance(v, float)) if result else ""
    return (f"{result.epochs} epochs" + (", shortened" if result.shortened else "")
            + (f"; test {test}" if test else "")) if result else ""


def _write(run: LandedRun, root: Path) -> None:
    for name, data in sorted(run.files.items()):
        io.atomic_write(root / name, lambda f, data=data: f.write(data))


def land(archive: Path, into: Path, force: bool = False) -> list[Path]:
    """The finished runs of ``archive`` written into ``into`` (module docstring); returns
    their folders.  Every run is read and checked, and every folder it would go to, before the
    first file is written."""
    from lstmablate.run.runs import RunFiles, clear_run_dir

    runs = read_archive(archive)
    finished = {k: r for k, r in runs.items() if RunFiles.RESULT in r.files}
    for key in sorted(set(runs) - set(finished)):
        say(f"not finished in the window (no {RunFiles.RESULT}): {key}; left out")
    if not finished:
        raise WindowError(f"{archive} holds no finished run (no run with a {RunFiles.RESULT}); "
                          "nothing to land.")
    lines = {key: _check_run(run, archive) for key, run in sorted(finished.items())}
    targets = {key: into / run.experiment / run.cell / f"seed-{run.seed}"
               for key, run in finished.items()}
    there = [str(t) for t in targets.values() if t.exists()]
    if there and not force:
        raise WindowError(f"{len(there)} of the runs already have records: {', '.join(there[:4])}"
                          + (f" and {len(there) - 4} more" if len(there) > 4 else "")
                          + ". Nothing was written; add --force to replace their records (their "
                            "files of a run's names; nothing else in the folders).")
    for key, run in sorted(finished.items()):
        root = targets[key]
        if root.exists():
            clear_run_dir(RunFiles(root))
        _write(run, root)
        say(f"landed {root}: {lines[key]}")
    return [targets[k] for k in sorted(finished)]
