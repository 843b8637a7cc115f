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
from collections.abc import Iterable, Iterator
from pathlib import Path

import gzip
import unicodedata

import torch

from lstmablate.errors import DataError, where

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


def _split_vector_line(line: str, dim: int) -> list[str]:
    """``[word, v1, ..., vD]``: the vector is the last ``dim`` fields, the word everything
    before them (GloVe 840B has a few words that contain spaces)."""
    parts = line.rstrip("\n").rstrip(" ").split(" ")
    return [" ".join(parts[:-dim])] + parts[-dim:] if len(parts) > dim else parts


def vector_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, line) of a vector file, plain or .gz, streamed (GloVe 840B is 5.6 GB, so
    it is not decoded up front like the data files)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"pretrained vector file {path} not found (model.pretrained; a relative "
                        "path is read from the data directory). Give the path of a GloVe text "
                        "file, or leave model.pretrained empty for trainable embeddings.")
    opener = gzip.open if path.suffix == ".gz" else open
    lineno = 0
    try:
        with opener(path, "rt", encoding="utf-8", errors="strict") as f:
            for lineno, line in enumerate(f, 1):
                yield lineno, line
    except UnicodeDecodeError:
        raise DataError(f"{where(path, lineno + 1)}: not valid UTF-8; expected a GloVe text "
                        "file.") from None
    except (OSError, EOFError) as e:
        raise DataError(f"{path}: cannot be read ({e}); the file is damaged.") from None


def vector_entries(path: Path, dim: int) -> Iterator[tuple[int, list[str]]]:
    """(line number, [word, v1, ..., vD]) of every line; a line without a word and ``dim``
    fields is a DataError naming the file and line."""
    for lineno, line in vector_lines(path):
        parts = _split_vector_line(line, dim)
        if len(parts) != dim + 1 or not parts[0]:
            raise DataError(f"{where(path, lineno)}: expected a word and {dim} numbers "
                            f"(model.embedding_dim), got {len(line.split())} fields. Is this a "
                            f"GloVe {dim}d text file?")
        yield lineno, parts


def vector_file_words(path: Path, dim: int, normalize: str = "") -> set[str]:
    """The words of a GloVe-format text file (``word v1 ... vD`` per line), in Unicode normal
    form ``normalize`` ("" = as written)."""
    normal = normalizer(normalize)
    return {normal(parts[0]) for _, parts in vector_entries(path, dim)}


def read_vectors(path: Path, dim: int, vocab: Vocab) -> tuple[torch.Tensor, int]:
    """(vocab-size x dim) matrix with the file's vector for every vocabulary word it has
    (zeros elsewhere), and how many were found.

    Without normalisation the first occurrence of a word wins (GloVe 840B repeats a few);
    with ``vocab.normalize`` the file's words are normalised too and the vectors of those
    that become the same word are averaged (hitvoice and facebookresearch DrQA).  A line
    whose vector does not have ``dim`` numbers is a DataError naming the file and line."""
    emb = torch.zeros(len(vocab), dim, dtype=torch.float64)
    counts = torch.zeros(len(vocab), dtype=torch.float64)
    average = bool(vocab.normalize)
    for lineno, parts in vector_entries(path, dim):
        word = vocab.normal(parts[0])
        i = vocab.index.get(word)
        if i is None or (counts[i] > 0 and not average):
            continue
        try:
            emb[i] += torch.tensor([float(v) for v in parts[1:]], dtype=torch.float64)
        except ValueError:
            raise DataError(f"{where(path, lineno)}: the {dim} fields after the word "
                            f"{word!r} are not all numbers.") from None
        counts[i] += 1
    found = counts > 0
    emb[found] /= counts[found].unsqueeze(1)
    return emb.float(), int(found.sum())
