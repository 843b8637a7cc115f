"""The command line of the GPU tools (``python -m lstmablate.bench.gpu_check`` and the GPU
window, ``python -m lstmablate.bench.window``), held to the contract of ``lstmablate``'s:
a mistake is a :class:`~lstmablate.errors.UserError` (one paragraph, exit 2, through
:func:`lstmablate.errors.exit_status`), every number is checked for its range (finite), a
device is one these tools run on, a path the caller gives is resolved against the caller's
directory (the tools' stages and runs are processes of their own), and an output folder is
never a file, a device or a folder inside a run folder.

Like the tools themselves, this module imports only the standard library and the package's
bottom floor at start-up: they start on a bare GPU machine.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import stat
from pathlib import Path

from lstmablate import io
from lstmablate.errors import UserError
from lstmablate.runfolder import run_folder_of

#: the checkout (what a process started by the tools imports)
ROOT = Path(__file__).resolve().parents[2]
#: the most seconds a budget of the tools may be: a day
MAX_BUDGET = 86_400.0


class Parser(argparse.ArgumentParser):
    """argparse whose mistakes are a UserError (one paragraph and exit 2 through
    :func:`lstmablate.errors.exit_status`), not a usage block."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UserError(f"{message} (see --help)")


#: the devices gpu-check and the window run on (``cpu``: a dry run of what needs no GPU)
DEVICE = re.compile(r"cpu|cuda(?::\d{1,3})?")
#: the most timed rounds or steps a benchmark option takes
MAX_REPEATS = 10_000


def check_device(device: str, option: str = "--device") -> str:
    """``device`` unless it is not one of cuda, cuda:N or cpu (a UserError naming
    ``option``): ``meta``, ``mps`` or a typo would fail in every stage instead."""
    if not DEVICE.fullmatch(device):
        raise UserError(f"{option} {device[:40]!r}: expected cuda, cuda:N (a GPU's index) or cpu "
                        "(a dry run of the stages that need no GPU).")
    return device


def check_seconds(value: float, option: str, low: float = 0.0, high: float = MAX_BUDGET,
                  low_open: bool = True) -> float:
    """``value`` unless it is not a finite number of seconds (or minutes) in its range."""
    ok = math.isfinite(value) and (low < value if low_open else low <= value) and value <= high
    if not ok:
        raise UserError(f"{option} {value:g}: expected a number in {'(' if low_open else '['}"
                        f"{low:g}, {high:g}].")
    return value


def caller_path(text: str, option: str) -> Path:
    """A path the caller gave, made absolute against the directory this command runs in (its
    stages and runs are processes of their own, which must find the same file)."""
    io.check_dir_path(text, option)
    return Path(os.path.abspath(text))


def output_folder(text: str, option: str = "--out") -> Path:
    """The folder ``option`` names for the files a command writes (made if missing): a
    UserError for a path that is a file, a device or a pipe, or under one, and for a folder
    inside a run folder (a run folder is the run's own)."""
    path = caller_path(text, option)
    for folder in (path, *path.parents):
        try:
            mode = os.stat(folder).st_mode
        except FileNotFoundError:
            continue
        except OSError as e:
            raise UserError(f"{option} {text}: {e.strerror or e}. Nothing was written.") from None
        if not os.path.isdir(folder):
            what = "it is" if folder == path else f"{folder} is"
            raise UserError(f"{option} {text}: {what} not a folder ({_kind(mode)}); give a folder "
                            "for the files (made if missing). Nothing was written.")
        break
    found = run_folder_of(path / "_")  # (the folder itself, or one above it)
    if found is not None:
        raise UserError(f"{option} {text}: it is inside the run folder {found[0]}, which only "
                        "the run itself writes. Give a folder outside it. Nothing was written.")
    return path


def _kind(mode: int) -> str:
    return ("a regular file" if stat.S_ISREG(mode) else "a named pipe" if stat.S_ISFIFO(mode)
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket"
            if stat.S_ISSOCK(mode) else "not a folder")


def child_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a process this command starts (a stage, a run) in the caller's
    directory: the checkout on its PYTHONPATH, so ``python -m lstmablate...`` finds the code
    even where the checkout is not installed."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env
