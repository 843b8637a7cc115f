"""The run folder as a boundary, on the bottom floor, so that every command can respect it
(the task plugins' own ``lstmablate data`` commands too).

* **Its entries' names** (:class:`RunNames`): ``runs/<experiment>/<cell>/seed-<n>/`` holds
  these files and folders; :class:`lstmablate.run.runs.RunFiles` is built on them.
* **Its entries are the run's own** (:func:`check_run_entries`): before anything writes,
  truncates, appends to or deletes an entry of a run folder, every entry is checked to be
  what the toolkit makes there (a regular file, or a real folder).  A symbolic link is refused,
  never followed: through ``<run>/.lock`` or ``<run>/artefacts`` a write or a ``--force``
  would reach files outside the run.  The runs folder, or a run folder itself, reached
  through a link (``runs -> /scratch/runs``) is a normal choice and not an entry.
* **The output guard** (:func:`check_output`): the one check of every command that writes a
  file of the user's (``report --out``, ``eval --write-predictions``, ``data fetch`` ...):
  never into a run folder, never a directory, never over an existing file without
  ``--force``.
"""

from __future__ import annotations

import os
import shlex
import stat
from collections.abc import Iterable
from pathlib import Path

from .errors import RunDirError, UserError
from .io import check_can_write, is_stream


class RunNames:
    """The entries of a run folder, spelled once (the meaning of each:
    :mod:`lstmablate.run.runs`)."""

    CONFIG = "config.yaml"
    ENV = "env.json"
    METRICS = "metrics.jsonl"
    RESULT = "result.json"
    LAST = "last.pt"
    BEST = "best.pt"
    #: the file the run's writer locks (:mod:`lstmablate.run.runlock`)
    LOCK = ".lock"
    ARTEFACTS = "artefacts"
    TENSORBOARD = "tensorboard"
    SCORES = "scores"
    #: a scores file's name, ``<split>`` and this (gzip: a record's per-item lines are most of
    #: the records' bytes); and that of one written before scores were compressed, still read
    SCORES_SUFFIX = ".jsonl.gz"
    SCORES_SUFFIX_BEFORE = ".jsonl"
    #: sizes and sha256 of the artefacts, written after them (not a valid artefact key)
    MANIFEST = "_manifest.json"
    #: a run copied from its twin, trained for another experiment: which run that was
    #: (:mod:`lstmablate.run.twins`)
    TWIN = "twin.json"
    #: the files a run folder owns, and its folders
    FILE_NAMES = (CONFIG, ENV, METRICS, RESULT, LAST, BEST, LOCK, TWIN)
    FOLDERS = (ARTEFACTS, TENSORBOARD, SCORES)

    @classmethod
    def split_of(cls, path: str | os.PathLike) -> str:
        """The split a scores file's name names (``test.jsonl.gz``, ``test.jsonl`` -> ``test``)."""
        name = Path(path).name
        for suffix in (cls.SCORES_SUFFIX, cls.SCORES_SUFFIX_BEFORE):
            if name.endswith(suffix):
                return name[:-len(suffix)]
        return Path(name).stem


def is_run_folder(folder: str | os.PathLike) -> bool:
    """``folder`` holds a run: its ``config.yaml`` and at least one other entry a run writes
    (a folder with only a config.yaml is some other tool's)."""
    folder = Path(folder)
    if not (folder / RunNames.CONFIG).is_file():
        return False
    return any(os.path.lexists(folder / name) for name in RunNames.FILE_NAMES + RunNames.FOLDERS
               if name != RunNames.CONFIG)


def run_folder_of(path: str | os.PathLike) -> tuple[Path, tuple[str, ...]] | None:
    """The run folder ``path`` lies in (resolved: a link into a run folder counts) and the
    path's parts inside it, else None."""
    try:
        resolved = Path(path).resolve()
    except (OSError, RuntimeError) as e:  # (RuntimeError: a loop of links, Python < 3.13)
        raise UserError(f"{path}: the path cannot be resolved ({e}); is there a loop of "
                        "symbolic links? Give another path. Nothing was written.") from None
    for folder in resolved.parents:
        if is_run_folder(folder):
            return folder, resolved.relative_to(folder).parts
    return None


def _kind(mode: int) -> str:
    return ("a directory" if stat.S_ISDIR(mode) else "a regular file" if stat.S_ISREG(mode)
            else "a named pipe (FIFO)" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a file")


def entry_problem(path: str | os.PathLike, folder: bool = False) -> str | None:
    """Why the run folder's entry ``path`` may not be written, truncated or deleted (a
    symbolic link; anything but a regular file, or for a ``folder`` a directory); None if it
    is missing or what the toolkit makes there."""
    path = Path(path)
    try:
        mode = os.lstat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):  # (not there: a folder above is missing)
        return None
    except OSError as e:
        return f"{path} cannot be examined ({e.strerror or e})"
    if stat.S_ISLNK(mode):
        link, real = shlex.quote(str(path)), shlex.quote(os.path.realpath(path))
        if folder and path.is_dir():
            instead = (f"Replace it by a copy of what it points to (`rm {link} && cp -r {real} "
                       f"{link}`) or remove it")
        elif path.name != RunNames.LOCK and path.is_file():
            instead = (f"Replace it by a copy of what it points to (`cp --remove-destination "
                       f"{real} {link}`) or remove it")
        else:
            instead = f"Remove it (`rm {link}`; what it points to is not touched)"
        return (f"{path} is a symbolic link (to {os.readlink(path)}). The entries of a run "
                "folder are the run's own: lstmablate never writes, truncates or deletes "
                f"through a link, which could reach files outside the run. {instead}, then run "
                "the same command again (a runs folder, or a run folder, that is itself a link "
                "is fine)")
    want = stat.S_ISDIR(mode) if folder else stat.S_ISREG(mode)
    if not want:
        return (f"{path} is {_kind(mode)}, where the run keeps {'a folder' if folder else 'a file'}"
                f" of its own. Move it away (`mv {shlex.quote(str(path))} "
                f"{shlex.quote(str(path) + '.moved')}`), then run the same command again")
    return None


def check_run_entries(root: str | os.PathLike) -> None:
    """RunDirError unless every entry of the run folder ``root`` is the run's own (no
    symbolic link, nothing of another kind): call it before the run's files are written."""
    root = Path(root)
    for name in RunNames.FILE_NAMES + RunNames.FOLDERS:
        problem = entry_problem(root / name, folder=name in RunNames.FOLDERS)
        if problem:
            raise RunDirError(f"{problem}. Nothing was written.")


def check_output(paths: Iterable[str | os.PathLike], *, option: str = "--out",
                 force: bool = False) -> None:
    """The check of the files a command writes for the user, before the first is written
    (and before anything is computed): UserError if one is in a run folder (its own files, or
    a new file beside them: a run folder is the run's), if the output rule refuses it
    (:func:`lstmablate.io.output_kind`: a directory, a socket, a file where a folder should
    be), or, unless ``force``, if one exists.  A character device or a FIFO (``/dev/null``, a
    shell's ``>(...)``) is written into, never replaced: it needs no ``force``.
    A command whose outputs are replaced by design (a predictions file, a data download)
    passes ``force=True``."""
    paths = [Path(p) for p in paths]
    for path in paths:
        found = run_folder_of(path)
        if found is not None:
            owner, inside = found
            what = ("a file of the run folder" if inside[0] in RunNames.FILE_NAMES +
                    RunNames.FOLDERS else "inside the run folder")
            raise UserError(f"{option}: {path} is {what} {owner}, which only the run itself "
                            "writes. Give a file name outside the run folder (e.g. one beside "
                            "it). Nothing was written.")
    check_can_write(*paths)
    if not force:
        existing = [str(p) for p in paths if os.path.lexists(p) and not is_stream(p)]
        if existing:
            one = len(existing) == 1
            raise UserError(f"{', '.join(existing)} already exist{'s' if one else ''}; add "
                            f"--force to replace {'it' if one else 'them'}, or choose another "
                            f"{option}. Nothing was written.")
