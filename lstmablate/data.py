"""Data directory, dataset catalogue and checked reading of data files.

Every task reads its files through this module, so that all of them share one
behaviour (documented for users in ``data/README.md``):

* **Where.** :func:`resolve_data_dir` picks the data directory: the
  ``--data-dir`` value, else the environment variable ``LSTMABLATE_DATA``,
  else ``./data`` relative to the current working directory.  A file there
  is refused; a missing directory is refused only by the commands that look at
  data already there (:func:`require_data_dir`).
* **What.** A :class:`Dataset` lists a dataset's files (paths relative to the
  data directory), their checksums (sha256 and md5 of the *decompressed*
  file), canonical download locations and licence.  The catalogue entries
  belong to the tasks (``Task.datasets``); this module names no dataset.
* **Gzip.** :func:`find_file` accepts ``name`` or ``name.gz``; every reader
  here decompresses ``.gz`` files transparently.
* **Checked.** :func:`read_text` / :func:`read_lines` / :func:`open_text`
  (and :func:`iter_lines`, streamed, for files too big to hold) decode UTF-8
  strictly and turn every problem (missing, not a regular file, empty,
  truncated gzip, non-UTF-8 byte, NUL character) into a
  :class:`~lstmablate.errors.DataError` whose message names the file (and the
  line where relevant).  Every task reads its text through them, so a check
  added here holds for every task. :func:`check_file`
  and :func:`verify` compare checksums; a success is remembered per
  (path, size, mtime) for the rest of the process.
* **Fetch.** :func:`fetch` downloads a dataset from its canonical URLs,
  verifies it and writes each file atomically.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import shutil
import urllib.error
import urllib.request
import zipfile
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TextIO

from .errors import DataError, UnknownNameError, where
from .io import atomic_write, check_dir_path, open_regular
from .limits import MAX_LINE_BYTES
from .runfolder import check_output

__all__ = [
    "DEFAULT_DATA_DIR",
    "ENV_VAR",
    "DataFile",
    "Dataset",
    "CheckResult",
    "register_datasets",
    "known_datasets",
    "verify_datasets",
    "resolve_data_dir",
    "describe_data_dir",
    "require_data_dir",
    "get_dataset",
    "find_file",
    "open_text",
    "read_text",
    "read_lines",
    "iter_lines",
    "file_digest",
    "check_file",
    "verify",
    "fetch",
]

#: Data directory used when neither ``--data-dir`` nor ``$LSTMABLATE_DATA`` is
#: given; relative to the current working directory.
DEFAULT_DATA_DIR = "data"
#: Environment variable naming the data directory.
ENV_VAR = "LSTMABLATE_DATA"

_CHUNK = 1 << 20


# --------------------------------------------------------------------------
# Catalogue
# --------------------------------------------------------------------------


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


def _dataset_of(relpath: str) -> Dataset | None:
    for ds in _KNOWN.values():
        if any(f.relpath == relpath for f in ds.files):
            return ds
    return None


def _fetchable(ds: Dataset) -> bool:
    """Can ``lstmablate data fetch`` download the whole dataset (every file has a URL)?"""
    return all(f.url for f in ds.files)


def _get_advice(ds: Dataset | None, again: bool = False) -> str:
    """How to get a file of ``ds`` (None: a file of the user's own, e.g. under data.files):
    the fetch command only where it works."""
    if ds is None:
        return ("Replace it with a good copy" if again else
                "Put the file there (it is not part of a dataset `lstmablate data fetch` knows)")
    if _fetchable(ds):
        return (f"{'Download it again' if again else 'Get the files'} with "
                f"`lstmablate data fetch {ds.name}` ({ds.fetch_hint}; see data/README.md)")
    return f"Get {'it again' if again else 'the files'} by hand: {ds.fetch_hint}"


def _refetch_hint(path: Path) -> str:
    """How to get ``path`` again: the fetch command if a known dataset has it (and can download
    it)."""
    posix = path.as_posix().removesuffix(".gz")
    for ds in _KNOWN.values():
        if any(posix.endswith("/" + f.relpath) for f in ds.files):
            return _get_advice(ds, again=True)
    return _get_advice(None, again=True)


# --------------------------------------------------------------------------
# Data directory
# --------------------------------------------------------------------------

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
    ds = _dataset_of(relpath)
    state = ("" if base.is_dir() else " (that is a file, not a directory)" if base.exists()
             else " (that directory does not exist)")
    raise DataError(
        f"data file {relpath} not found: looked for {plain} and {gz}. The data directory "
        f"{base}{state} is {describe_data_dir(base)}. {_get_advice(ds)}, or point {ENV_VAR} "
        f"or --data-dir at a directory that already holds them"
        + ("." if ds is not None and _fetchable(ds) else " (data/README.md says what goes where).")
    )


# --------------------------------------------------------------------------
# Checked reading
# --------------------------------------------------------------------------


def _is_gz(path: Path) -> bool:
    return path.suffix == ".gz"


def _gzip_error(path: Path, exc: BaseException) -> DataError:
    return DataError(
        f"{path} is a truncated or corrupt gzip file ({type(exc).__name__}: {exc}). "
        f"{_refetch_hint(path)}, or put the uncompressed file at {path.with_suffix('')} "
        f"instead."
    )


def _iter_chunks(path: Path, gz: bool | None = None) -> Iterator[bytes]:
    """Stream the (decompressed) bytes of ``path``, turning I/O errors into DataError (a FIFO,
    a device or a directory is refused, never waited on)."""
    gz = _is_gz(path) if gz is None else gz
    path = Path(os.path.abspath(path))
    if not os.path.lexists(path):
        raise DataError(f"data file {path} does not exist.")
    with os.fdopen(open_regular(path), "rb") as raw:
        stream: BinaryIO = raw
        if gz:
            stream = gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[assignment]
        while True:
            try:
                chunk = stream.read(_CHUNK)
            except (EOFError, zlib.error, OSError) as e:  # gzip.BadGzipFile is an OSError
                if gz:
                    raise _gzip_error(path, e) from None
                raise DataError(f"cannot read data file {path}: {e}.") from None
            if not chunk:
                return
            yield chunk


def _read_bytes(path: Path) -> bytes:
    return b"".join(_iter_chunks(path))


def _empty_error(path: Path) -> DataError:
    size = "0 bytes after decompression" if _is_gz(path) else "0 bytes"
    return DataError(f"data file {path} is empty ({size}); expected text. {_refetch_hint(path)}.")


def _decode(data: bytes, path: Path, offset: int = 0, first_line: int = 1) -> str:
    """``data`` (bytes ``offset``.. of the decompressed ``path``, starting at line
    ``first_line``) as strict UTF-8 text without NUL characters; a DataError naming the line
    and column otherwise."""
    try:
        text = data.decode("utf-8", errors="strict")
    except UnicodeDecodeError as e:
        if offset == 0 and data[:2] == b"\x1f\x8b":
            raise DataError(
                f"{path} is gzip-compressed but its name does not end in .gz; rename it to "
                f"{path.name}.gz (it is then decompressed when read)."
            ) from None
        line = first_line + data.count(b"\n", 0, e.start)
        col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        bad = " ".join(f"0x{b:02x}" for b in data[e.start:e.end])
        raise DataError(
            f"{where(path, line)}: byte {bad} at byte offset {offset + e.start} of the "
            f"{'decompressed ' if _is_gz(path) else ''}file (column {col} of that line, counted "
            f"in bytes) is not valid UTF-8 ({e.reason}). Expected UTF-8 text; the file is "
            f"corrupt or in another encoding. {_refetch_hint(path)}."
        ) from None
    nul = text.find("\0")
    if nul >= 0:
        line = first_line + text.count("\n", 0, nul)
        col = nul - (text.rfind("\n", 0, nul) + 1) + 1
        raise DataError(
            f"{where(path, line)}: a NUL character (byte 0x00) at column {col}. Expected text, "
            "which never holds one: the file is damaged (an interrupted copy or download, a "
            f"disk error) or not a text file. {_refetch_hint(path)}.")
    return text


def read_text(path: str | os.PathLike[str]) -> str:
    """The whole (decompressed) file decoded as strict UTF-8.

    Raises DataError for a missing or empty file, a truncated or corrupt gzip, a byte
    sequence that is not UTF-8 (naming the 1-based line and the byte offset) and a NUL
    character (naming the line and column: no text file the tasks read holds one).
    """
    path = Path(os.path.abspath(path))
    data = _read_bytes(path)
    if not data:
        raise _empty_error(path)
    return _decode(data, path)


def read_lines(path: str | os.PathLike[str]) -> list[str]:
    """The file's lines, without line terminators (``\\n``; a ``\\r`` before it is dropped).

    A final line without a newline is kept; no empty line is added after a
    final newline. Same checks as :func:`read_text`.
    """
    return _split_lines(read_text(path))


def _split_lines(text: str) -> list[str]:
    """The lines of ``text`` without terminators (no empty line after a final newline)."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [ln[:-1] if ln.endswith("\r") else ln for ln in lines]


def iter_lines(path: str | os.PathLike[str], digest: Any = None) -> Iterator[tuple[int, str]]:
    """(1-based line number, line without its terminator) of every line of the
    (decompressed) file, streamed: for files too big to decode up front (GloVe 840B is 5.6
    GB).  The checks of :func:`read_text`, each raised when its line is reached, and a line
    longer than MAX_LINE_BYTES is refused (a file without newlines is not a text file, and is
    never held whole).  ``digest`` (a :mod:`hashlib` object) is updated with every
    decompressed byte."""
    path = Path(os.path.abspath(path))
    rest, offset, lineno, size = b"", 0, 0, 0
    for chunk in _iter_chunks(path):
        size += len(chunk)
        if digest is not None:
            digest.update(chunk)
        data = rest + chunk
        cut = data.rfind(b"\n") + 1
        rest = data[cut:]
        if len(rest) > MAX_LINE_BYTES:
            raise DataError(f"{where(path, lineno + 1)}: the line is longer than "
                            f"{MAX_LINE_BYTES:,} bytes; expected a text file with one entry per "
                            f"line. The file is damaged or not the file meant. "
                            f"{_refetch_hint(path)}.")
        if cut:
            for line in _split_lines(_decode(data[:cut], path, offset, lineno + 1)):
                lineno += 1
                yield lineno, line
            offset += cut
    if not size:
        raise _empty_error(path)
    if rest:
        yield lineno + 1, _split_lines(_decode(rest, path, offset, lineno + 1))[0]


def open_text(path: str | os.PathLike[str]) -> TextIO:
    """A text stream over the checked content of ``path`` (see :func:`read_text`).

    The whole file is decoded up front, so every error is raised here,
    with its file and line, not half-way through a caller's loop.
    """
    return io.StringIO(read_text(path))


# --------------------------------------------------------------------------
# Checksums
# --------------------------------------------------------------------------


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
    for chunk in _iter_chunks(Path(path), gz):
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
    ds = _dataset_of(datafile.relpath)
    message = (
        f"checksum mismatch for {path}: the {algo} of its "
        f"{'decompressed ' if _is_gz(path) else ''}content is {actual}, expected {expected} "
        f"(catalogue entry {datafile.relpath}). The file is corrupt, truncated or a different "
        f"version of the dataset. Delete it. {_get_advice(ds, again=True)}."
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


def _select(ds: Dataset, which: str | Iterable[str] | None) -> list[DataFile]:
    if which is None:
        return list(ds.files)
    names = [which] if isinstance(which, str) else list(which)
    return [ds.file(n) for n in names]


def verify(data_dir: str | os.PathLike[str], dataset_name: str | Dataset,
           which: str | Iterable[str] | None = None) -> list[CheckResult]:
    """Check the files of a dataset in ``data_dir`` (all, or those named in ``which``,
    by relpath or file name).

    Never raises for a bad file: each problem becomes a result (``missing``,
    ``mismatch``, ``unreadable``) whose ``message`` says what is wrong.
    """
    ds = get_dataset(dataset_name)
    results = []
    for df in _select(ds, which):
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


# --------------------------------------------------------------------------
# Download
# --------------------------------------------------------------------------


def _urlopen(url: str) -> BinaryIO:
    return urllib.request.urlopen(url, timeout=60)  # noqa: S310 - catalogue URLs only


def _download_path(base: Path, df: DataFile) -> Path:
    """Where the download of ``df`` is stored: ``relpath``, or ``relpath.gz`` for a file
    served gzip-compressed."""
    return base / (df.relpath + (".gz" if df.url_gzipped else ""))


def fetch(dataset_name: str | Dataset, data_dir: str | os.PathLike[str], *,
          which: str | Iterable[str] | None = None, force: bool = False,
          opener: Callable[[str], BinaryIO] | None = None,
          log: Callable[[str], None] | None = print) -> list[Path]:
    """Download a dataset's files from their canonical URLs into ``data_dir``.

    Files already present that verify are kept (unless ``force``). Each
    download goes to a temporary file next to its destination, is verified
    against the catalogue checksum (of the decompressed content) and only
    then renamed into place; a failed download leaves nothing behind.
    A file served gzip-compressed is stored as ``relpath.gz``. Returns the
    paths of the dataset's files.
    """
    ds = get_dataset(dataset_name)
    base = Path(os.path.abspath(os.path.expanduser(os.fspath(data_dir))))
    opener = opener or _urlopen
    say = log or (lambda _msg: None)
    out: list[Path] = []
    selected = _select(ds, which)
    # Never into a run folder (a bad copy present is replaced: that is what fetch is for).
    check_output([_download_path(base, df) for df in selected], option="--data-dir", force=True)
    for df in selected:
        if not force:
            try:
                existing = find_file(base, df.relpath)
                check_file(existing, df)
                say(f"{existing}: present and verified")
                out.append(existing)
                continue
            except DataError:
                pass
        if not df.url:
            raise DataError(f"no download location is catalogued for {df.relpath}; "
                            f"get it by hand ({ds.fetch_hint}).")
        dest = _download_path(base, df)
        say(f"downloading {df.url} -> {dest}")

        def download(f: BinaryIO, df: DataFile = df, dest: Path = dest) -> None:
            try:
                with opener(df.url) as resp:
                    shutil.copyfileobj(resp, f, _CHUNK)
            except (urllib.error.URLError, OSError, ValueError) as e:
                raise DataError(
                    f"could not download {df.url} ({e}). Check the network connection, or "
                    f"download the file by hand to {dest} ({ds.fetch_hint})."
                ) from None

        def verified(tmp: Path, df: DataFile = df, dest: Path = dest) -> None:
            if df.url_zip_member:
                _extract_zip_member(tmp, df, dest)
            spec = df.checksum
            if spec is None:
                return
            algo, expected = spec
            actual = file_digest(tmp, algo, gz=df.url_gzipped)
            if actual != expected.lower():
                raise DataError(
                    f"the download of {df.url} has {algo} {actual} (of its "
                    f"{'decompressed ' if df.url_gzipped else ''}content), expected "
                    f"{expected}: the server sent a different version of {df.relpath} or "
                    f"the transfer was damaged. Nothing was written to {dest}; try again, "
                    f"or download it by hand."
                )

        atomic_write(dest, download, check=verified)
        # The other form (plain vs .gz) of an old, bad copy would shadow or confuse.
        other = base / (df.relpath if df.url_gzipped else df.relpath + ".gz")
        if other.exists():
            other.unlink()
        out.append(dest)
    return out


def _extract_zip_member(archive: Path, df: DataFile, dest: Path) -> None:
    """Replace the downloaded zip ``archive`` (the temporary file of the download's atomic
    write: nobody else sees it) by its member ``df.url_zip_member``, in place: the member is
    copied out, then back over the archive's bytes."""
    member_tmp = archive.with_name(archive.name + ".member")
    try:
        with zipfile.ZipFile(archive) as z, z.open(df.url_zip_member) as src, \
                open(member_tmp, "wb") as out_f:
            shutil.copyfileobj(src, out_f, _CHUNK)
        shutil.copyfile(member_tmp, archive)
    except (zipfile.BadZipFile, KeyError, OSError, EOFError, zlib.error) as e:
        raise DataError(f"the download of {df.url} is not a zip archive holding "
                        f"{df.url_zip_member} ({type(e).__name__}: {e}); nothing was written to "
                        f"{dest}. Try again, or download and unzip it by hand.") from None
    finally:
        member_tmp.unlink(missing_ok=True)


def verify_datasets(data_dir: str | os.PathLike[str], datasets: Iterable[Dataset]) -> list[str]:
    """Verify every file of ``datasets``; one line per file, DataError listing every problem."""
    results = [r for ds in datasets for r in verify(data_dir, ds)]
    bad = [r for r in results if r.status not in ("ok", "unchecked")]
    if bad:
        raise DataError("data check failed:\n" + "\n".join(f"- {r.message}" for r in bad))
    return [f"{r.path}: {r.algo} ok" if r.ok else f"{r.path}: {r.message}" for r in results]
