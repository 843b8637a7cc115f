"""Attachment scores (UAS/LAS) under three punctuation conventions.

UAS = % of scored words whose predicted head is the gold head; LAS = % whose head
and relation (the full DEPREL string, subtypes included, as Parser-v1 compares
them) are both right.  Which words are scored:

* ``uas`` / ``las`` — Parser-v1's convention, the primary numbers
  (Parser-v1's ``base_parser.py: evaluate``): every word except those whose
  gold XPOS (CoNLL column 5) is one of `` '' : , . PU PUNCT.  On UD English EWT
  that column holds PTB tags, so -LRB- -RRB- HYPH NFP $ # are still scored;
* ``uas_all`` / ``las_all`` — every word (the CoNLL 2018 shared task's UAS; its LAS
  compares only the universal part of DEPREL, this one the full label);
* ``uas_upos`` / ``las_upos`` — every word whose gold UPOS is not PUNCT.

Scores are percentages over all words of the split (micro-averaged).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from lstmablate.errors import DataError, where

from .conllu import Sentence, read_conllu

#: gold XPOS tags Parser-v1 leaves out of UAS/LAS (``NN.PUNCT``)
PARSER_V1_PUNCT = frozenset({"``", "''", ":", ",", ".", "PU", "PUNCT"})
CONVENTIONS = ("", "_all", "_upos")  # metric-name suffixes


def scored(convention: str, xpos: str, upos: str) -> bool:
    """Is a word with these gold tags scored under ``convention`` ('', '_all', '_upos')?"""
    if convention == "":
        return xpos not in PARSER_V1_PUNCT
    if convention == "_all":
        return True
    if convention == "_upos":
        return upos != "PUNCT"
    raise ValueError(f"unknown convention {convention!r}")


@dataclass
class AttachmentCounter:
    """Counts words, right heads and right (head, relation) pairs per convention."""

    total: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CONVENTIONS, 0))
    heads: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CONVENTIONS, 0))
    labels: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CONVENTIONS, 0))

    def add(self, gold: Sentence, heads: Sequence[int], rels: Sequence[str]) -> None:
        """``heads`` / ``rels``: the predicted head (0 = ROOT) and relation of each word."""
        if len(heads) != len(gold) or len(rels) != len(gold):
            raise ValueError(f"{len(heads)} predicted heads / {len(rels)} relations for a "
                             f"sentence of {len(gold)} words")
        for i in range(len(gold)):
            head_ok = int(heads[i]) == gold.heads[i]
            label_ok = head_ok and rels[i] == gold.deprels[i]
            for c in CONVENTIONS:
                if scored(c, gold.xpos[i], gold.upos[i]):
                    self.total[c] += 1
                    self.heads[c] += head_ok
                    self.labels[c] += label_ok

    def scores(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for c in CONVENTIONS:
            n = self.total[c]
            out[f"uas{c}"] = 100.0 * self.heads[c] / n if n else float("nan")
            out[f"las{c}"] = 100.0 * self.labels[c] / n if n else float("nan")
        out["words"] = float(self.total["_all"])
        out["scored_words"] = float(self.total[""])
        return out


def attachment_scores(gold: Sequence[Sentence], heads: Sequence[Sequence[int]],
                      rels: Sequence[Sequence[str]]) -> dict[str, float]:
    """UAS/LAS of predicted ``heads`` / ``rels`` (one list per sentence, words only)."""
    if not (len(gold) == len(heads) == len(rels)):
        raise ValueError(f"{len(gold)} gold sentences, {len(heads)} predicted trees")
    counter = AttachmentCounter()
    for g, h, r in zip(gold, heads, rels):
        counter.add(g, h, r)
    return counter.scores()


def score_files(gold_path: str | Path, pred_path: str | Path) -> dict[str, float]:
    """UAS/LAS of a predicted CoNLL-U file against the gold file (the words must match,
    sentence by sentence; gold tags decide which words are scored)."""
    gold = read_conllu(gold_path)
    pred = read_conllu(pred_path)
    if len(gold) != len(pred):
        raise DataError(f"{pred_path} has {len(pred)} sentences, the gold file {gold_path} "
                        f"{len(gold)}; a predictions file must hold every sentence of the split.")
    for g, p in zip(gold, pred):
        if g.words != p.words:
            k = next((i for i, (a, b) in enumerate(zip(g.words, p.words)) if a != b),
                     min(len(g), len(p)))
            line = p.word_lines[k] if k < len(p) else p.line
            raise DataError(f"{where(pred_path, line)}: the words of this sentence differ from "
                            f"the gold sentence at {where(gold_path, g.line)} (word {k + 1}); "
                            "predictions must keep the gold tokenisation.")
    return attachment_scores(gold, [p.heads for p in pred], [p.deprels for p in pred])
