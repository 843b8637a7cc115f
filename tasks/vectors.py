"""Pretrained word vectors the original systems used, as data the toolkit knows.

Two GloVe releases (Pennington, Socher & Manning 2014; https://nlp.stanford.edu/projects/glove/,
Public Domain Dedication and License v1.0), each a catalogue entry with its file, size and
published checksum:

* ``glove-6b-100d``: ``glove/glove.6B.100d.txt`` (400,000 lower-cased words, 100 numbers
  each; 347,116,733 bytes), member of ``glove.6B.zip`` (862,182,613 bytes).  Parser-v1 adds
  these to its word embeddings (``config/defaults.cfg``); AllenNLP's BiDAF keeps them frozen
  (``training_config/bidaf.json``).
* ``glove-840b-300d``: ``glove/glove.840B.300d.txt`` (2,196,017 cased words, 300 numbers
  each; 5,646,236,541 bytes), the only member of ``glove.840B.300d.zip`` (2,176,768,927
  bytes).  Both DrQA implementations use it (hitvoice/DrQA ``download.sh``,
  facebookresearch/DrQA ``scripts/reader/README.md``).

The checksums are the SHA-1 digests Apache MXNet publishes for these files
(``python/mxnet/contrib/text/_constants.py``, ``GLOVE_PRETRAINED_ARCHIVE_SHA1``); the
GloVe page gives none.  ``lstmablate data fetch glove-6b-100d`` downloads the zip archive,
keeps the one file and verifies it; the files may be stored gzip-compressed (``.gz``).

A task option naming a vectors file (``model.pretrained``) goes through
:func:`pretrained_path`: a path relative to the data directory or absolute; a catalogued
file is verified against its checksum (``verify``); a missing file is one
:class:`~lstmablate.errors.DataError` that says where to get it, how to train without it
(``--set model.pretrained=``) and that ``lstmablate report`` then marks the run.

Every task reads a vectors file through :func:`read_vector_lines` (the parser keeps every
line, SST and SQuAD the lines of their vocabulary's words): GloVe's text format, ``word v1
... vD`` per line separated by single spaces, where the word is everything before the last
``D`` fields (a few words of GloVe 840B contain spaces), streamed (:func:`lstmablate.data.
iter_lines`: plain or ``.gz``, strict UTF-8, no NUL).  A file without a vector, a line
without a word and ``D`` numbers, and a number that is not finite or is larger in magnitude
than :data:`MAX_VECTOR_VALUE` (:meth:`VectorLine.values`) are each one DataError naming the
file and the line (and the column and value), raised before training starts.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lstmablate.data import DataFile, Dataset, check_file, iter_lines
from lstmablate.errors import DataError, where
from lstmablate.io import open_regular

_HOME = "https://nlp.stanford.edu/projects/glove/"
_LICENCE = "Public Domain Dedication and License v1.0 (GloVe pre-trained vectors)."

GLOVE_6B_100D = Dataset(
    name="glove-6b-100d",
    files=(DataFile("glove/glove.6B.100d.txt", None, None,
                    url="https://nlp.stanford.edu/data/glove.6B.zip",
                    url_zip_member="glove.6B.100d.txt", size=347_116_733,
                    sha1="16b1dbfaf35476790bd9df40c83e2dfbd05312f1",
                    note="400,000 words x 100; in glove.6B.zip (862,182,613 bytes)"),),
    url=_HOME,
    licence=_LICENCE,
    fetch_hint=("or download glove.6B.zip from https://nlp.stanford.edu/data/glove.6B.zip "
                "and unzip glove.6B.100d.txt into <data-dir>/glove/"),
)

GLOVE_840B_300D = Dataset(
    name="glove-840b-300d",
    files=(DataFile("glove/glove.840B.300d.txt", None, None,
                    url="https://nlp.stanford.edu/data/glove.840B.300d.zip",
                    url_zip_member="glove.840B.300d.txt", size=5_646_236_541,
                    sha1="294b9f37fa64cce31f9ebb409c266fc379527708",
                    note="2,196,017 words x 300; glove.840B.300d.zip is 2,176,768,927 bytes"),),
    url=_HOME,
    licence=_LICENCE,
    fetch_hint=("or download glove.840B.300d.zip from "
                "https://nlp.stanford.edu/data/glove.840B.300d.zip and unzip "
                "glove.840B.300d.txt into <data-dir>/glove/"),
)

VECTORS = (GLOVE_6B_100D, GLOVE_840B_300D)


def catalogue_entry(value: str) -> tuple[Dataset, DataFile] | None:
    """The catalogue entry ``value`` (a ``model.pretrained`` path) names: the same path
    relative to the data directory, or a path ending in the catalogued file name."""
    name = Path(value).name.removesuffix(".gz")
    for ds in VECTORS:
        for f in ds.files:
            if value.removesuffix(".gz") == f.relpath or name == Path(f.relpath).name:
                return ds, f
    return None


def pretrained_path(data_dir: Path, value: str, *, option: str = "model.pretrained",
                    original: str = "", verify: bool = True) -> Path:
    """The file ``option`` names (absolute, or relative to the data directory; ``.gz``
    accepted), verified against the catalogue when it is a catalogued file.

    ``original`` says which system used these vectors (for the message when the file is
    missing)."""
    p = Path(value).expanduser()
    if not p.is_absolute():
        p = Path(data_dir) / p
    found = next((c for c in (p, p.with_name(p.name + ".gz")) if c.is_file()), None)
    entry = catalogue_entry(value)
    if found is None and os.path.exists(p):  # a FIFO, a device, a directory: named, not read
        os.close(open_regular(p))
    if found is None:
        what = f" ({entry[0].name})" if entry else ""
        get = (f"Get it with `lstmablate data fetch {entry[0].name}` ({entry[0].fetch_hint})"
               if entry else "Give the path of a GloVe-format text file (one word and its "
               "numbers per line), absolute or relative to the data directory")
        used = f" {original.rstrip('.')}." if original else ""
        raise DataError(
            f"{option}: the pretrained word vectors file {p}{what} was not found.{used} {get}. "
            f"To train without pretrained vectors, add `--set {option}=` (empty): the word "
            "embeddings are then trained alone, which is not the original system's setup, and "
            "`lstmablate report` marks every such run.")
    if entry is not None and verify:
        check_file(found, entry[1])
    return found


#: the largest magnitude a number of a pretrained vectors file may have.  Published word
#: vectors (GloVe, word2vec, fastText) hold numbers of a few units; one beyond this is a
#: damaged file or not a vectors file, and it would saturate every gate it reaches, or
#: overflow float32 (3.4e38) once summed or squared: training would only skip steps.
MAX_VECTOR_VALUE = 1e4

_FORMAT = "GloVe format: a word and its numbers per line, separated by single spaces"


@dataclass(frozen=True)
class VectorLine:
    """One line of a vectors file: its word and its numbers as written (converted by
    :meth:`values` only where a task keeps the word: GloVe 840B holds 660 million numbers, of
    which a task keeps a few percent)."""

    path: Path
    lineno: int
    word: str
    numbers: tuple[str, ...]

    def values(self) -> list[float]:
        """The numbers; a DataError naming the file, line, column and value for one that is
        not a finite number of magnitude at most MAX_VECTOR_VALUE."""
        out = []
        column = len(self.word) + 2  # 1-based, in characters
        for j, text in enumerate(self.numbers, start=1):
            try:
                value = float(text)
            except ValueError:
                value = None
            if value is None or not math.isfinite(value) or abs(value) > MAX_VECTOR_VALUE:
                what = ("which is not a number" if value is None else
                        "which is not a finite number" if not math.isfinite(value) else
                        f"larger in magnitude than {MAX_VECTOR_VALUE:g}")
                raise DataError(
                    f"{where(self.path, self.lineno)}, column {column}: the vector of "
                    f"{self.word!r} holds {text[:40]!r} (number {j} of {len(self.numbers)}), "
                    f"{what}. Expected finite numbers between -{MAX_VECTOR_VALUE:g} and "
                    f"{MAX_VECTOR_VALUE:g} ({_FORMAT}); the file is damaged or not a word "
                    "vectors file: replace it with a good copy.")
            out.append(value)
            column += len(text) + 1
        return out


def check_shared(path: Path, found: int, vocabulary: int, option: str = "model.pretrained"
                 ) -> None:
    """A DataError naming ``path`` when not one of the ``vocabulary`` words (specials left out)
    has a vector in it (``found`` is 0): every embedding would start random, as without the
    file, and the run would say it used pretrained vectors -- another language, a casing the
    vocabulary does not use, or not the file meant."""
    if found == 0 and vocabulary > 0:
        raise DataError(f"{path}: none of the vocabulary's {vocabulary:,} words has a vector in "
                        f"this file, so {option} would change nothing (every embedding would "
                        "start random); it is not the vectors file meant (another language or "
                        "casing?). Give the right file, or leave the option out to train "
                        "without pretrained vectors.")


def read_vector_lines(path: Path, dim: int | None = None, *, dim_option: str = "",
                      digest: Any = None) -> Iterator[VectorLine]:
    """Every line of a GloVe-format vectors file but blank ones, streamed.

    ``dim`` is the number of numbers per line (``dim_option`` names the option that sets it,
    for messages); None takes the first line's.  The first line must be exactly a word and
    ``dim`` numbers (its word holds no space), a later line a word and at least ``dim``
    fields (its word is all but the last ``dim``).  ``digest`` (a :mod:`hashlib` object) sees
    every (decompressed) byte.  A line that does not fit, and a file without any vector, are
    a DataError naming the file (and the line); the numbers are checked by
    :meth:`VectorLine.values`."""
    path = Path(path)
    first = True
    for lineno, line in iter_lines(path, digest):
        if not line.strip():
            continue
        parts = line.rstrip(" ").split(" ")
        if dim is None:
            dim = len(parts) - 1
            dim_option = "like the first line"
        if dim < 1 or len(parts) < dim + 1 or (first and len(parts) != dim + 1):
            expected = (f"expected {dim}" + (f" ({dim_option})" if dim_option else "")
                        if dim >= 1 else "expected at least one")
            raise DataError(f"{where(path, lineno)}: {len(parts) - 1} numbers after the word, "
                            f"{expected}; {_FORMAT}.")
        word = " ".join(parts[:-dim])
        if not word.strip():
            raise DataError(f"{where(path, lineno)}: no word before the {dim} numbers; "
                            f"{_FORMAT}.")
        first = False
        yield VectorLine(path, lineno, word, tuple(parts[-dim:]))
    if first:
        raise DataError(f"{path}: the file holds no word vectors, only blank lines; expected "
                        f"a word vectors file ({_FORMAT}).")
