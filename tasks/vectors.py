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
"""

from __future__ import annotations

from pathlib import Path

from lstmablate.data import DataFile, Dataset, check_file
from lstmablate.errors import DataError

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
