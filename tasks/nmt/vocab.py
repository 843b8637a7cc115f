"""Word vocabularies built the way OpenNMT-py's preprocess.py (torchtext 0.2 ``Vocab``) built them.

* Built from the *training* pairs that survive the length filter, one vocabulary per side.
* Specials first: source ``<unk> <blank>`` (ids 0, 1), target ``<unk> <blank> <s> </s>``
  (ids 0-3) — ``<blank>`` is OpenNMT's padding word, ``<s>``/``</s>`` begin and end every
  target sentence (onmt/io/TextDataset.py, IO.py ``_build_field_vocab``).
* Then the words by decreasing training frequency, ties in code-point order (torchtext sorts
  alphabetically, then stably by frequency), at most ``max_size`` of them (the special words
  do not count: torchtext's ``max_size + len(specials)``) and only those seen at least
  ``min_freq`` times (default 1, torchtext's ``max(min_freq, 1)``). OpenNMT's
  ``src_vocab_size`` / ``tgt_vocab_size`` default to 50,000; Multi30k's training side has
  fewer words than that, so nothing is cut at the paper's size.
* A word not in the vocabulary reads as ``<unk>``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from lstmablate.errors import DataError

__all__ = ["UNK", "PAD", "BOS", "EOS", "SRC_SPECIALS", "TGT_SPECIALS", "Vocab"]

UNK, PAD, BOS, EOS = "<unk>", "<blank>", "<s>", "</s>"
SRC_SPECIALS = (UNK, PAD)
TGT_SPECIALS = (UNK, PAD, BOS, EOS)


class Vocab:
    """id <-> word, with the ids of the special words as attributes (``unk``, ``pad``, ...)."""

    def __init__(self, itos: Sequence[str], specials: Sequence[str]):
        self.itos = list(itos)
        if list(self.itos[:len(specials)]) != list(specials):
            raise DataError(f"a vocabulary must start with its special words {list(specials)}, "
                            f"got {self.itos[:len(specials)]}")
        self.stoi = {w: i for i, w in enumerate(self.itos)}
        if len(self.stoi) != len(self.itos):
            dup = next(w for w, c in Counter(self.itos).items() if c > 1)
            raise DataError(f"a vocabulary lists the word {dup!r} twice")
        self.specials = tuple(specials)
        self.unk = self.stoi[UNK]
        self.pad = self.stoi[PAD]
        self.bos = self.stoi.get(BOS)
        self.eos = self.stoi.get(EOS)

    @classmethod
    def build(cls, sentences: Iterable[Sequence[str]], specials: Sequence[str],
              max_size: int, min_freq: int = 1) -> Vocab:
        """torchtext 0.2's ``Vocab(counter, specials=..., max_size=..., min_freq=...)``."""
        counts = Counter(w for s in sentences for w in s)
        for w in specials:
            counts.pop(w, None)  # a special word is never counted as a word
        ordered = sorted(counts.items(), key=lambda kv: kv[0])  # ties: code-point order
        ordered.sort(key=lambda kv: kv[1], reverse=True)  # stable: by decreasing frequency
        words = [w for w, c in ordered if c >= max(min_freq, 1)][:max_size]
        return cls(list(specials) + words, specials)

    def __len__(self) -> int:
        return len(self.itos)

    def encode(self, words: Sequence[str]) -> list[int]:
        return [self.stoi.get(w, self.unk) for w in words]

    def decode(self, ids: Iterable[int]) -> list[str]:
        return [self.itos[i] for i in ids]
