"""Word vocabularies (run artefacts) and pretrained word vectors.

DrQA's vocabulary (hitvoice/DrQA prepro.py): ids 0 = ``<PAD>``, 1 = ``<UNK>``, then the
words of the *questions* by frequency, then the remaining words of the *contexts* by
frequency (ties: alphabetical, so that the order is reproducible), cased.  With a pretrained
vector file both originals count the training and the dev data (hitvoice ``prepro.py``:
``train + dev``; facebookresearch ``scripts/reader/train.py``: ``train_exs + dev_exs``) and
keep only words that have a vector, so a dev word without a training occurrence reads its
fixed pretrained vector instead of ``<UNK>``; without a vector file only training words are
kept here.  Putting question words first is what makes "tune the top-1000 question words"
(``tune_partial``) the first rows.  Both originals compare words in Unicode NFD form
(``normalize_text``, ``Dictionary.normalize``), the vector file's too, and average the
vectors of file words that become equal so (``normalize="NFD"``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import unicodedata

import torch

from lstmablate.errors import DataError

from ..vectors import check_shared, read_vector_lines

PAD, UNK = "<PAD>", "<UNK>"


def frequency_order(counter: Counter) -> list[str]:
    return [w for w, _ in sorted(counter.items(), key=lambda kv: (-kv[1], kv[0]))]


def build_vocab(question_words: Iterable[str], context_words: Iterable[str],
                keep: set[str] | None = None) -> list[str]:
    """``[<PAD>, <UNK>, question words by frequency, other context words by frequency]``,
    restricted to ``keep`` when given."""
    q_counts, c_counts = Counter(question_words), Counter(context_words)
    words = [PAD, UNK]
    seen = set(words)
    for w in frequency_order(q_counts) + frequency_order(c_counts):
        if w not in seen and (keep is None or w in keep):
            words.append(w)
            seen.add(w)
    return words


NORMALIZATIONS = ("", "NFD")


def normalizer(form: str):
    """``str -> str``: Unicode normal form ``form`` ("" = the text as it is)."""
    if form not in NORMALIZATIONS:
        raise DataError(f"unknown word normalisation {form!r} in the run's artefacts; "
                        f"expected one of {NORMALIZATIONS}")
    return (lambda w: w) if not form else (lambda w: unicodedata.normalize(form, w))


class Vocab:
    """Words -> ids; ``normalize`` ("NFD") is applied to every word looked up (the vocabulary's
    words are stored normalised)."""

    def __init__(self, words: list[str], normalize: str = ""):
        if words[:2] != [PAD, UNK]:
            raise DataError(f"a SQuAD vocabulary must start with {PAD}, {UNK}; got {words[:2]} "
                            "(the run's artefacts/words.json is damaged).")
        self.words = list(words)
        self.index = {w: i for i, w in enumerate(self.words)}
        self.normal = normalizer(normalize)
        self.normalize = normalize

    def __len__(self) -> int:
        return len(self.words)

    def ids(self, words: Iterable[str]) -> list[int]:
        get, normal = self.index.get, self.normal
        return [get(normal(w), 1) for w in words]

    def __contains__(self, word: str) -> bool:
        return self.normal(word) in self.index


def vector_file_words(path: Path, dim: int, normalize: str = "",
                      dim_option: str = "model.embedding_dim") -> set[str]:
    """The words of a GloVe-format text file (``word v1 ... vD`` per line, checked by
    :func:`lstmablate_tasks.vectors.read_vector_lines`), in Unicode normal form ``normalize``
    ("" = as written)."""
    normal = normalizer(normalize)
    return {normal(entry.word) for entry in read_vector_lines(path, dim, dim_option=dim_option)}


def read_vectors(path: Path, dim: int, vocab: Vocab, dim_option: str = "model.embedding_dim"
                 ) -> tuple[torch.Tensor, int]:
    """(vocab-size x dim) matrix with the file's vector for every vocabulary word it has
    (zeros elsewhere), and how many were found.

    Without normalisation the first occurrence of a word wins (GloVe 840B repeats a few);
    with ``vocab.normalize`` the file's words are normalised too and the vectors of those
    that become the same word are averaged (hitvoice and facebookresearch DrQA).  A line
    without ``dim`` numbers, or a kept number that is not finite, is a DataError naming the
    file and line (:func:`lstmablate_tasks.vectors.read_vector_lines`)."""
    emb = torch.zeros(len(vocab), dim, dtype=torch.float64)
    counts = torch.zeros(len(vocab), dtype=torch.float64)
    average = bool(vocab.normalize)
    for entry in read_vector_lines(path, dim, dim_option=dim_option):
        i = vocab.index.get(vocab.normal(entry.word))
        if i is None or (counts[i] > 0 and not average):
            continue
        emb[i] += torch.tensor(entry.values(), dtype=torch.float64)
        counts[i] += 1
    found = counts > 0
    check_shared(path, int(found[2:].sum()), max(len(vocab) - 2, 0))  # (rows 0, 1: PAD, UNK)
    emb[found] /= counts[found].unsqueeze(1)
    return emb.float(), int(found.sum())
