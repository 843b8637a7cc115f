"""The catalogue: the datasets the loaded tasks declared (``Task.datasets``), their files,
checksums and download locations, and how to get a file of one (the advice every error of
the data directory ends with). This package names no dataset: the entries belong to the
tasks, registered when a task class is defined."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ..errors import UnknownNameError


@dataclass(frozen=True)
class DataFile:
    """One file of a dataset.

    ``relpath`` is relative to the data directory (e.g. ``corpus/train.txt``);
    the file may also be stored as ``relpath + ".gz"``. ``sha256`` / ``md5``
    (and ``sha1``, where that is what the publisher gives) are digests of the
    decompressed content; any may be None where it is not known (the strongest
    one known is checked). ``url`` is the canonical download location;
    ``url_gzipped`` says the URL serves a gzip of the file (it is then stored as
    ``relpath + ".gz"``); ``url_zip_member`` says it serves a zip archive that
    holds the file under that name (only the file is kept). ``size`` is the
    decompressed size in bytes, where known.
    """

    relpath: str
    sha256: str | None
    md5: str | None
    url: str | None = None
    url_gzipped: bool = False
    size: int | None = None
    note: str = ""
    sha1: str | None = None
    url_zip_member: str = ""

    @property
    def checksum(self) -> tuple[str, str] | None:
        """``(algorithm, expected hex digest)`` to verify: sha256 if known, else sha1, else md5."""
        if self.sha256:
            return "sha256", self.sha256
        if self.sha1:
            return "sha1", self.sha1
        if self.md5:
            return "md5", self.md5
        return None


@dataclass(frozen=True)
class Dataset:
    """A dataset the toolkit knows: its files and where to get them."""

    name: str
    files: tuple[DataFile, ...]
    url: str
    licence: str
    fetch_hint: str

    def file(self, which: str) -> DataFile:
        """The entry whose relpath or file name is ``which``."""
        for f in self.files:
            if which in (f.relpath, Path(f.relpath).name):
                return f
        raise UnknownNameError(f"file of dataset {self.name!r}", which,
                               [f.relpath for f in self.files])


#: every dataset a loaded task declared (``Task.datasets``), by name
_KNOWN: dict[str, Dataset] = {}


def register_datasets(datasets: Iterable[Dataset]) -> None:
    """Make ``datasets`` known by name (done for ``Task.datasets`` when a task class is
    defined), so that ``lstmablate data fetch NAME`` and the error hints find them."""
    for ds in datasets:
        old = _KNOWN.get(ds.name)
        if old is not None and old != ds:
            raise ValueError(f"two different datasets are called {ds.name!r}")
        _KNOWN[ds.name] = ds


def known_datasets() -> dict[str, Dataset]:
    """The datasets registered so far (see :func:`lstmablate.task.available_datasets` for
    those of every installed task)."""
    return dict(sorted(_KNOWN.items()))


def get_dataset(name: str | Dataset) -> Dataset:
    """The registered dataset ``name`` (a :class:`Dataset` is passed through)."""
    if isinstance(name, Dataset):
        return name
    try:
        return _KNOWN[name]
    except KeyError:
        raise UnknownNameError("dataset", name, _KNOWN,
                               "See data/README.md for the datasets the tasks read.") from None


def select_files(ds: Dataset, which: str | Iterable[str] | None) -> list[DataFile]:
    """The files of ``ds`` named in ``which`` (by relpath or file name), or all of them."""
    if which is None:
        return list(ds.files)
    names = [which] if isinstance(which, str) else list(which)
    return [ds.file(n) for n in names]


def dataset_of(relpath: str) -> Dataset | None:
    """The registered dataset that has a file ``relpath``, if one has."""
    for ds in _KNOWN.values():
        if any(f.relpath == relpath for f in ds.files):
            return ds
    return None


def fetchable(ds: Dataset) -> bool:
    """Can ``lstmablate data fetch`` download the whole dataset (every file has a URL)?"""
    return all(f.url for f in ds.files)


def get_advice(ds: Dataset | None, again: bool = False) -> str:
    """How to get a file of ``ds`` (None: a file of the user's own, e.g. under data.files):
    the fetch command only where it works."""
    if ds is None:
        return ("Replace it with a good copy" if again else
                "Put the file there (it is not part of a dataset `lstmablate data fetch` knows)")
    if fetchable(ds):
        return (f"{'Download it again' if again else 'Get the files'} with "
                f"`lstmablate data fetch {ds.name}` ({ds.fetch_hint}; see data/README.md)")
    return f"Get {'it again' if again else 'the files'} by hand: {ds.fetch_hint}"


def refetch_hint(path: Path) -> str:
    """How to get ``path`` again: the fetch command if a known dataset has it (and can download
    it)."""
    posix = path.as_posix().removesuffix(".gz")
    for ds in _KNOWN.values():
        if any(posix.endswith("/" + f.relpath) for f in ds.files):
            return get_advice(ds, again=True)
    return get_advice(None, again=True)
