"""Where the data directory is: ``--data-dir``, else ``$LSTMABLATE_DATA``, else ``./data``;
how it was chosen (every message about it says so), and a file found in it, plain or
``.gz``."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import DataError
from ..io import check_dir_path
from .catalogue import dataset_of, fetchable, get_advice

#: Data directory used when neither ``--data-dir`` nor ``$LSTMABLATE_DATA`` is
#: given; relative to the current working directory.
DEFAULT_DATA_DIR = "data"
#: Environment variable naming the data directory.
ENV_VAR = "LSTMABLATE_DATA"

# How each directory returned by resolve_data_dir was chosen (for messages).
_DIR_SOURCES: dict[Path, str] = {}


def resolve_data_dir(cli_value: str | os.PathLike[str] | None = None) -> Path:
    """The data directory: ``cli_value`` (``--data-dir``), else ``$LSTMABLATE_DATA``,
    else ``./data`` relative to the current working directory.

    Returns an absolute path; it is not required to exist (the readers say clearly what is
    missing, and ``lstmablate data fetch`` creates it).  A path that cannot be a directory (a
    file, a NUL byte, a name too long for the file system) is a DataError naming where it came
    from, whichever command asked.
    """
    env = os.environ.get(ENV_VAR, "")
    if cli_value is not None and str(cli_value) != "":
        raw, how, option = os.fspath(cli_value), "given with --data-dir", "--data-dir"
    elif env:
        raw, how, option = env, f"set by the environment variable {ENV_VAR}", ENV_VAR
    else:
        raw, option = DEFAULT_DATA_DIR, "the data directory"
        how = (f"the default ./{DEFAULT_DATA_DIR} in the current directory, as neither "
               f"--data-dir nor {ENV_VAR} is given")
    check_dir_path(raw, option, DataError)
    path = Path(os.path.abspath(os.path.expanduser(raw)))
    if os.path.exists(path) and not os.path.isdir(path):
        raise DataError(
            f"{option}: the data directory {path} ({how}) is a file, not a directory. Point "
            f"--data-dir or {ENV_VAR} at the directory that holds the datasets (one folder per "
            "dataset, see data/README.md).")
    _DIR_SOURCES[path] = how
    return path


def require_data_dir(path: Path) -> Path:
    """``path`` (from :func:`resolve_data_dir`) if it is a directory, else a DataError saying
    how it was chosen: for commands that look at the data already there (``lstmablate data
    check``, after listing every file as missing and how to get it)."""
    if not os.path.isdir(path):
        raise DataError(
            f"the data directory {path} ({describe_data_dir(path)}) does not exist, so every "
            "file listed is missing. Point --data-dir or the environment variable "
            f"{ENV_VAR} at the directory that holds the datasets, or get them as said above "
            "(`lstmablate data fetch` creates the directory).")
    return path


def describe_data_dir(data_dir: str | os.PathLike[str]) -> str:
    """Say how ``data_dir`` was chosen, for error messages."""
    path = Path(os.path.abspath(os.path.expanduser(os.fspath(data_dir))))
    if path in _DIR_SOURCES:
        return _DIR_SOURCES[path]
    env = os.environ.get(ENV_VAR, "")
    if env and Path(os.path.abspath(os.path.expanduser(env))) == path:
        return f"set by the environment variable {ENV_VAR}"
    if path == Path(os.path.abspath(DEFAULT_DATA_DIR)):
        return f"the default ./{DEFAULT_DATA_DIR} in the current directory"
    return "given by the caller (--data-dir or a recipe)"


def find_file(data_dir: str | os.PathLike[str], relpath: str) -> Path:
    """``data_dir/relpath`` if it exists, else ``data_dir/relpath.gz``.

    Raises DataError naming both paths, the data directory, how it was chosen
    and how to get the file.
    """
    base = Path(os.path.abspath(os.path.expanduser(os.fspath(data_dir))))
    plain = base / relpath
    gz = plain.with_name(plain.name + ".gz")
    for candidate in (plain, gz):
        if candidate.is_file():
            return candidate
    ds = dataset_of(relpath)
    state = ("" if base.is_dir() else " (that is a file, not a directory)" if base.exists()
             else " (that directory does not exist)")
    raise DataError(
        f"data file {relpath} not found: looked for {plain} and {gz}. The data directory "
        f"{base}{state} is {describe_data_dir(base)}. {get_advice(ds)}, or point {ENV_VAR} "
        f"or --data-dir at a directory that already holds them"
        + ("." if ds is not None and fetchable(ds) else " (data/README.md says what goes where).")
    )
