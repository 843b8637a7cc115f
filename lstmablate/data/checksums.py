"""Checksums: a file's digest of its decompressed content against the catalogue's, a success
remembered per (path, size, mtime) for the rest of the process; a dataset's files checked
one by one (``lstmablate data check``, a task's ``check_data``)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ..errors import DataError
from .catalogue import DataFile, Dataset, dataset_of, get_advice, get_dataset, select_files
from .location import find_file
from .read import is_gz, iter_chunks


@dataclass(frozen=True)
class CheckResult:
    """Outcome of checking one catalogue file.

    ``status`` is ``"ok"``, ``"missing"``, ``"mismatch"``, ``"unreadable"``
    or ``"unchecked"`` (no checksum known); ``message`` explains anything but
    ``"ok"``.
    """

    relpath: str
    path: Path | None
    status: str
    algo: str | None = None
    expected: str | None = None
    actual: str | None = None
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


# (absolute path, size, mtime_ns, algo, expected digest) of files that verified.
_VERIFIED: set[tuple[str, int, int, str, str]] = set()


def file_digest(path: str | os.PathLike[str], algo: str = "sha256", *,
                gz: bool | None = None) -> str:
    """Hex digest of the decompressed content of ``path``, streamed.

    ``gz`` forces (or forbids) decompression; by default a ``.gz`` suffix
    means gzip.
    """
    h = hashlib.new(algo)
    for chunk in iter_chunks(Path(path), gz):
        h.update(chunk)
    return h.hexdigest()


def _cache_key(path: Path, algo: str, expected: str) -> tuple[str, int, int, str, str]:
    try:
        st = path.stat()
    except FileNotFoundError:
        raise DataError(f"data file {path} does not exist.") from None
    return (str(path.resolve()), st.st_size, st.st_mtime_ns, algo, expected)


def _check(path: Path, datafile: DataFile) -> CheckResult:
    """Compare checksums; a mismatch is a result, an unreadable file raises DataError."""
    spec = datafile.checksum
    if spec is None:
        return CheckResult(datafile.relpath, path, "unchecked",
                           message=f"no checksum is catalogued for {datafile.relpath}.")
    algo, expected = spec[0], spec[1].lower()
    key = _cache_key(path, algo, expected)
    if key in _VERIFIED:
        return CheckResult(datafile.relpath, path, "ok", algo, expected, expected)
    actual = file_digest(path, algo)
    if actual == expected:
        _VERIFIED.add(key)
        return CheckResult(datafile.relpath, path, "ok", algo, expected, actual)
    ds = dataset_of(datafile.relpath)
    message = (
        f"checksum mismatch for {path}: the {algo} of its "
        f"{'decompressed ' if is_gz(path) else ''}content is {actual}, expected {expected} "
        f"(catalogue entry {datafile.relpath}). The file is corrupt, truncated or a different "
        f"version of the dataset. Delete it. {get_advice(ds, again=True)}."
    )
    return CheckResult(datafile.relpath, path, "mismatch", algo, expected, actual, message)


def check_file(path: str | os.PathLike[str], datafile: DataFile) -> CheckResult:
    """Check that ``path`` holds the content catalogued as ``datafile``.

    Returns an ``"ok"`` result (``"unchecked"`` when the catalogue has no
    checksum); raises DataError on a mismatch or an unreadable file. Successes
    are cached per (path, size, mtime), so repeating the call in the same
    process costs one ``stat``.
    """
    result = _check(Path(os.path.abspath(path)), datafile)
    if result.status == "mismatch":
        raise DataError(result.message)
    return result


def verify(data_dir: str | os.PathLike[str], dataset_name: str | Dataset,
           which: str | Iterable[str] | None = None) -> list[CheckResult]:
    """Check the files of a dataset in ``data_dir`` (all, or those named in ``which``,
    by relpath or file name).

    Never raises for a bad file: each problem becomes a result (``missing``,
    ``mismatch``, ``unreadable``) whose ``message`` says what is wrong.
    """
    ds = get_dataset(dataset_name)
    results = []
    for df in select_files(ds, which):
        try:
            path = find_file(data_dir, df.relpath)
        except DataError as e:
            results.append(CheckResult(df.relpath, None, "missing", message=str(e)))
            continue
        try:
            results.append(_check(path, df))
        except DataError as e:
            results.append(CheckResult(df.relpath, path, "unreadable", message=str(e)))
    return results


def verify_datasets(data_dir: str | os.PathLike[str], datasets: Iterable[Dataset]) -> list[str]:
    """Verify every file of ``datasets``; one line per file, DataError listing every problem."""
    results = [r for ds in datasets for r in verify(data_dir, ds)]
    bad = [r for r in results if r.status not in ("ok", "unchecked")]
    if bad:
        raise DataError("data check failed:\n" + "\n".join(f"- {r.message}" for r in bad))
    return [f"{r.path}: {r.algo} ok" if r.ok else f"{r.path}: {r.message}" for r in results]
