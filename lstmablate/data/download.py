"""``lstmablate data fetch``: a dataset's files downloaded from their canonical URLs, each
verified against the catalogue's checksum before it is written (atomically) into the data
directory; a file served gzip-compressed kept as ``.gz``, one served in a zip archive taken
out of it."""

from __future__ import annotations

import os
import shutil
import urllib.error
import urllib.request
import zipfile
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import BinaryIO

from ..errors import DataError
from ..io import atomic_write
from ..runfolder import check_output
from .catalogue import DataFile, Dataset, get_dataset, select_files
from .checksums import check_file, file_digest
from .location import find_file
from .read import CHUNK


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
    selected = select_files(ds, which)
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
                    shutil.copyfileobj(resp, f, CHUNK)
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
            shutil.copyfileobj(src, out_f, CHUNK)
        shutil.copyfile(member_tmp, archive)
    except (zipfile.BadZipFile, KeyError, OSError, EOFError, zlib.error) as e:
        raise DataError(f"the download of {df.url} is not a zip archive holding "
                        f"{df.url_zip_member} ({type(e).__name__}: {e}); nothing was written to "
                        f"{dest}. Try again, or download and unzip it by hand.") from None
    finally:
        member_tmp.unlink(missing_ok=True)
