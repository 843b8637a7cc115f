"""The parser's data: the UD English EWT catalogue entry, split files, pretrained vectors.

UD English EWT release r2.16 (UD 2.16, May 2025), ``ud-ewt/en_ewt-ud-{train,dev,test}.conllu``
(``.gz`` accepted) under the data directory, checksums of the decompressed files
verified.  Levy et al. (2018) used UD EWT **v1.3**: same documents, revised
annotation, so numbers differ from the paper's Table 3 for that reason alone.

``data.files`` may instead name a directory under the data directory holding
``train.conllu``, ``dev.conllu`` and ``test.conllu`` (any treebank; not checksummed).

Pretrained vectors (``model.pretrained``): a GloVe-format text file, one word and
its vector per line, separated by spaces (Parser-v1 uses GloVe 6B 100d,
``glove/glove.6B.100d.txt``, catalogued in :mod:`lstmablate_tasks.vectors`).  As in
Parser-v1 (``vocab.py: load_embed_file``) every line
is kept — not only the training words — after three zero rows for PAD, ROOT and
UNK; a word not in the file reads the UNK row (zeros).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from lstmablate.data import DataFile, Dataset, find_file

from ..vectors import pretrained_path, read_vector_lines

SPLITS = ("train", "dev", "test")
_EWT_RAW = "https://raw.githubusercontent.com/UniversalDependencies/UD_English-EWT/r2.16/"


def _ewt(split: str, sha256: str, md5: str, size: int) -> DataFile:
    name = f"en_ewt-ud-{split}.conllu"
    return DataFile(f"ud-ewt/{name}", sha256, md5, _EWT_RAW + name, size=size)


UD_EWT = Dataset(
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
)


def split_file(data_dir: Path, split: str, files: str = "") -> Path:
    """The file of ``split``: the UD EWT catalogue file, or ``<files>/<split>.conllu``."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; the parser's splits are {SPLITS}")
    if files:
        return find_file(data_dir, f"{files}/{split}.conllu")
    return find_file(data_dir, UD_EWT.file(f"en_ewt-ud-{split}.conllu").relpath)


def resolve_pretrained(data_dir: Path, path: str, verify: bool = True) -> Path:
    """``model.pretrained``: an absolute path, or one relative to the data directory; the
    catalogued GloVe 6B 100d file is verified (see :mod:`lstmablate_tasks.vectors`)."""
    return pretrained_path(data_dir, path, verify=verify,
                           original="Parser-v1 adds GloVe 6B 100d to its word embeddings.")


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_pretrained(path: Path) -> tuple[dict[str, int], torch.Tensor]:
    """(word -> row, table) of a GloVe-format file (:func:`lstmablate_tasks.vectors.
    read_vector_lines`: every number checked); rows 0-2 are zeros (PAD, ROOT, UNK), line k of
    the file is row k + 2 (a word listed twice keeps its last row, as in Parser-v1)."""
    index: dict[str, int] = {}
    rows: list[list[float]] = []
    for entry in read_vector_lines(path):
        rows.append(entry.values())
        index[entry.word] = len(rows) + 2
    table = torch.zeros(len(rows) + 3, len(rows[0]))
    table[3:] = torch.tensor(rows)
    return index, table
