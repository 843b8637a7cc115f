"""The Stanford Sentiment Treebank (Socher et al. 2013): files, label settings, examples,
vocabulary and pretrained word vectors.

Files: ``sst/{train,dev,test}.txt`` (``.gz`` accepted) under the data directory — the
``trees/`` folder of Stanford's ``trainDevTestTrees_PTB.zip``, 8,544 / 1,101 / 2,210
sentences, one PTB-format tree per line (:mod:`.trees`), checksums of the decompressed
files in :data:`SST`.

Label settings (``data.classes``):

* **5** — fine-grained (SST-5): the labels 0-4 as they are (very negative .. very positive);
* **2** — binary (SST-2): neutral (2) dropped, 0-1 -> 0 (negative), 3-4 -> 1 (positive);
  6,920 / 872 / 1,821 sentences.

Evaluation is always on sentences (each tree's root label).  Training is on sentences, or
with ``data.train_phrases`` on every phrase of every training tree (each node's words and
label, single words and the root included, repeated phrases kept, binary: neutral phrases
dropped — the phrase-level protocol of Socher et al. 2013 and of most later SST work).

Vocabulary (an artefact of the run): every word of the training sentences, as written
(cased, the treebank's escaping), after ``<pad>`` and ``<unk>``; ``data.lowercase`` folds
case.  A word of dev/test not in it reads ``<unk>``.

Pretrained vectors (``model.pretrained``): a GloVe-format text file (``word v1 ... vd`` per
line; words may contain spaces, as a few lines of glove.840B.300d do, so the last ``d``
fields are the vector).  Only the vocabulary's words are kept; a treebank word is looked up
with the escaping undone (``-LRB-`` -> ``(``, ``-RRB-`` -> ``)``, backslashes removed, as
Tai et al.'s code does), first as written, then lower-cased.
"""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from lstmablate.data import DataFile, Dataset, check_file, find_file
from lstmablate.errors import DataError
from lstmablate.io import open_regular

from ..vectors import check_shared, read_vector_lines
from .trees import Tree, read_trees

SPLITS = ("train", "dev", "test")
CLASSES = (2, 5)
PAD, UNK = 0, 1
SPECIALS = ("<pad>", "<unk>")

_ZIP = "https://nlp.stanford.edu/sentiment/trainDevTestTrees_PTB.zip"
_NOTE = ("trees/{} inside " + _ZIP + " (a zip archive: `lstmablate data fetch` cannot "
         "unpack it; unzip it by hand)")


def _file(split: str, sha256: str, md5: str, size: int) -> DataFile:
    return DataFile(f"sst/{split}.txt", sha256, md5, None, size=size,
                    note=_NOTE.format(f"{split}.txt"))


SST = Dataset(
    name="sst",
    files=(
        _file("train", "e2f3f41b0b1e6d4dddc0effe3bfc2d27ed8928079aa9a03d652311614fc5feb7",
              "b12d531b1b913a3bb49719ba5cc1f67a", 2_160_058),
        _file("dev", "0e9336aed6e4730e19f58d00a77b3f0297efdb755f7b5e598c98a05e3f97ea40",
              "c405f1d724964e6f72314b5a51fea691", 280_825),
        _file("test", "6e54806dee95cf80cd918e7dfb3f6770f6df24bf826f289a4d1f709e1c8f6761",
              "97b75f6ca1ae58b4d52fbf9381dc6f8c", 559_614),
    ),
    url=_ZIP,
    licence=("No licence is stated by Stanford; movie-review sentences from Pang & Lee (2005) "
             "(rottentomatoes.com) with Socher et al. (2013)'s phrase labels, for research use "
             "(cite Socher et al. 2013)."),
    fetch_hint=("download trainDevTestTrees_PTB.zip from https://nlp.stanford.edu/sentiment/ "
                "and copy trees/train.txt, trees/dev.txt and trees/test.txt into <data-dir>/sst/ "
                "(they may be gzip-compressed)"),
)


def split_path(data_dir: Path, split: str, verify: bool = True) -> Path:
    """The file of ``split`` under the data directory, its checksum verified."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; the SST splits are {SPLITS}")
    df = SST.file(f"{split}.txt")
    path = find_file(data_dir, df.relpath)
    if verify:
        check_file(path, df)
    return path


# -- label settings ---------------------------------------------------------------------------
def map_label(label: int, classes: int) -> int | None:
    """A treebank label 0-4 in the setting of ``classes``: itself (5), or SST-2's 0-1 -> 0,
    3-4 -> 1 and neutral -> None (dropped)."""
    if classes == 5:
        return label
    return None if label == 2 else int(label > 2)


@dataclass(frozen=True)
class Example:
    words: tuple[str, ...]
    label: int  # in the setting's label space


def sentence_examples(trees: Sequence[Tree], classes: int) -> list[Example]:
    """One example per sentence (its root label), neutral sentences dropped for SST-2."""
    out = []
    for t in trees:
        y = map_label(t.label, classes)
        if y is not None:
            out.append(Example(t.words, y))
    return out


def phrase_examples(trees: Sequence[Tree], classes: int) -> list[Example]:
    """One example per node of every tree (phrase-level training), neutral phrases dropped
    for SST-2."""
    out = []
    for t in trees:
        for words, label in t.phrases():
            y = map_label(label, classes)
            if y is not None:
                out.append(Example(words, y))
    return out


def no_examples_error(path: Path, split: str, n_trees: int, phrases: bool) -> DataError:
    """The error for a split left without an example by SST-2's dropping of neutral labels
    (a split of none would train on nothing, or report an accuracy over no sentence)."""
    what = "phrase of its" if phrases else "sentence of its"
    return DataError(
        f"{path}: every {what} {n_trees} trees is neutral (label 2), and SST-2 (data.classes=2) "
        f"drops neutral {'phrases' if phrases else 'sentences'}, so the {split} split would hold "
        f"no example. The file is not the treebank's {split}.txt (about a fifth of its "
        "sentences are neutral): replace it with a good copy, or use --set data.classes=5, "
        "which keeps every sentence.")


# -- vocabulary -------------------------------------------------------------------------------
@dataclass
class Vocab:
    itos: list[str]
    lowercase: bool = False

    def __post_init__(self) -> None:
        if tuple(self.itos[:2]) != SPECIALS:
            raise DataError(f"the SST vocabulary must start with {SPECIALS}, got {self.itos[:2]}; "
                            "the run's artefacts folder is damaged or from another task.")
        self.stoi = {w: i for i, w in enumerate(self.itos)}

    def __len__(self) -> int:
        return len(self.itos)

    def key(self, word: str) -> str:
        return word.lower() if self.lowercase else word

    def encode(self, words: Sequence[str]) -> list[int]:
        return [self.stoi.get(self.key(w), UNK) for w in words]


def build_vocab(trees: Sequence[Tree], lowercase: bool) -> Vocab:
    """Every word of the training sentences by descending count (ties alphabetical)."""
    counts = Counter(w.lower() if lowercase else w for t in trees for w in t.words)
    words = sorted(counts, key=lambda w: (-counts[w], w))
    return Vocab(list(SPECIALS) + [w for w in words if w not in SPECIALS], lowercase)


# -- pretrained vectors -----------------------------------------------------------------------
_UNESCAPE = {"-LRB-": "(", "-RRB-": ")", "-LSB-": "[", "-RSB-": "]", "-LCB-": "{", "-RCB-": "}"}


def glove_key(word: str) -> str:
    """A treebank word as GloVe spells it: brackets written out, escaping backslashes gone."""
    return _UNESCAPE.get(word, word.replace("\\", ""))


def resolve_pretrained(data_dir: Path, path: str) -> Path:
    """``model.pretrained``: absolute, or relative to the data directory (``.gz`` accepted)."""
    p = Path(path).expanduser()
    if not p.is_absolute():
        p = Path(data_dir) / p
    for candidate in (p, p.with_name(p.name + ".gz")):
        if candidate.is_file():
            return candidate
    if os.path.exists(p):  # a FIFO, a device, a directory: named, never read
        os.close(open_regular(p))
    raise DataError(f"model.pretrained: {p} does not exist. Give a GloVe-format text file (e.g. "
                    "glove.840B.300d.txt from https://nlp.stanford.edu/projects/glove/), absolute "
                    "or relative to the data directory, or leave model.pretrained empty to train "
                    "randomly initialised word embeddings.")


@dataclass
class Pretrained:
    """The rows of a vector file for one vocabulary (None where a word has no vector)."""

    rows: dict[int, torch.Tensor]
    dim: int
    sha256: str
    path: Path

    def provenance(self, vocab_size: int) -> dict[str, object]:
        return {"file": self.path.name, "sha256": self.sha256, "dim": self.dim,
                "found": len(self.rows), "vocabulary": vocab_size}


def read_pretrained(path: Path, vocab: Vocab, dim: int) -> Pretrained:
    """The vectors of ``vocab``'s words from a GloVe-format file of ``dim``-dimensional vectors
    (streamed: the 5.6 GB glove.840B.300d.txt is never held in memory;
    :func:`lstmablate_tasks.vectors.read_vector_lines` checks the file and every number kept)."""
    wanted: dict[str, list[int]] = {}
    for i, w in enumerate(vocab.itos[len(SPECIALS):], start=len(SPECIALS)):
        for key in dict.fromkeys((glove_key(w), glove_key(w).lower())):
            wanted.setdefault(key, []).append(i)
    rows: dict[int, torch.Tensor] = {}
    exact: set[int] = set()  # rows filled by a case-exact match (a lower-case match never wins)
    h = hashlib.sha256()
    for entry in read_vector_lines(path, dim, dim_option="model.embedding_size", digest=h):
        ids = wanted.get(entry.word)
        if not ids:
            continue
        vec = torch.tensor(entry.values())
        for i in ids:
            is_exact = glove_key(vocab.itos[i]) == entry.word
            if i not in rows or (is_exact and i not in exact):
                rows[i] = vec
                if is_exact:
                    exact.add(i)
    check_shared(path, len(rows), len(vocab.itos) - len(SPECIALS))
    return Pretrained(rows, dim, h.hexdigest(), path)


def load_split(data_dir: Path, split: str, verify: bool) -> list[Tree]:
    return read_trees(split_path(data_dir, split, verify))
