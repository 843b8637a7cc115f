"""The parser's vocabularies, built from the training file (Dozat's Parser-v1).

Parser-v1 (``vocab.py``):

* **words**: column 2 (FORM) lowercased (``cased = False``), kept if they occur at
  least ``min_occur_count = 2`` times in training; ids 0, 1, 2 are the special
  tokens PAD, ROOT and UNK, then the words by descending count, ties in
  alphabetical order (``Vocab.sorted_vocab``);
* **tags**: the model reads column 4 (UPOS in CoNLL-U); PAD, ROOT, UNK, then the tags;
* **relations**: column 8 (DEPREL), the classes of the label classifier.

Two simplifications, both without effect on UD English EWT v2.16: Parser-v1 applies
the count threshold to tags and relations too (every UPOS tag and relation of EWT's
training file occurs at least twice), and keeps PAD/ROOT/UNK as relation classes
that are never a target; here the relation classes are exactly the training
relations.  A relation of the dev/test file never seen in training is kept in the
gold data and simply cannot be predicted (it counts as wrong for LAS).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from lstmablate.errors import DataError

from .conllu import Sentence

PAD, ROOT, UNK = 0, 1, 2
SPECIALS = ("<pad>", "<root>", "<unk>")


def sorted_by_count(counts: Counter) -> list[str]:
    """Descending count, ties alphabetical (Parser-v1's ``Vocab.sorted_vocab``)."""
    return [w for w, _ in sorted(counts.items(), key=lambda wc: (-wc[1], wc[0]))]


@dataclass
class Vocab:
    """String <-> id; ``specials`` vocabularies map unknown strings to UNK."""

    itos: list[str]
    lowercase: bool = False
    specials: bool = True

    def __post_init__(self) -> None:
        self.stoi = {s: i for i, s in enumerate(self.itos)}
        if len(self.stoi) != len(self.itos):
            raise DataError(f"a vocabulary lists the same string twice: {self.itos[:10]}...")
        if self.specials and tuple(self.itos[:3]) != SPECIALS:
            raise DataError(f"a vocabulary with special tokens must start with {SPECIALS}, "
                            f"got {self.itos[:3]}")

    def __len__(self) -> int:
        return len(self.itos)

    def __contains__(self, s: str) -> bool:
        return (s.lower() if self.lowercase else s) in self.stoi

    def index(self, s: str) -> int:
        key = s.lower() if self.lowercase else s
        i = self.stoi.get(key)
        if i is None:
            if not self.specials:
                raise KeyError(s)
            return UNK
        return i

    def encode(self, items: Iterable[str]) -> list[int]:
        return [self.index(s) for s in items]


@dataclass
class Vocabs:
    words: Vocab
    tags: Vocab
    rels: Vocab

    def to_artefacts(self) -> dict[str, Any]:
        return {"words": list(self.words.itos), "tags": list(self.tags.itos),
                "rels": list(self.rels.itos)}

    @classmethod
    def from_artefacts(cls, artefacts: dict[str, Any]) -> Vocabs:
        try:
            words, tags, rels = artefacts["words"], artefacts["tags"], artefacts["rels"]
        except KeyError as e:
            raise DataError(f"the run's saved vocabularies lack {e.args[0]!r}; the artefacts "
                            "folder of the run is damaged or from another task.") from None
        return cls(Vocab(list(words), lowercase=True), Vocab(list(tags)),
                   Vocab(list(rels), specials=False))


def build_vocabs(train: Sequence[Sentence], min_word_count: int = 2) -> Vocabs:
    """Words (lowercased, count >= ``min_word_count``), UPOS tags and relations of ``train``."""
    words = Counter(w.lower() for s in train for w in s.words)
    tags = Counter(t for s in train for t in s.upos)
    rels = Counter(r for s in train for r in s.deprels)
    kept = [w for w in sorted_by_count(words) if words[w] >= min_word_count and w not in SPECIALS]
    return Vocabs(
        words=Vocab(list(SPECIALS) + kept, lowercase=True),
        tags=Vocab(list(SPECIALS) + [t for t in sorted_by_count(tags) if t not in SPECIALS]),
        rels=Vocab(sorted_by_count(rels), specials=False),
    )
