"""A strict CoNLL-U reader (Universal Dependencies, https://universaldependencies.org/format.html).

Each sentence is a block of token lines ended by a blank line; ``#`` lines are
comments.  A token line has exactly 10 tab-separated fields:
ID FORM LEMMA UPOS XPOS FEATS HEAD DEPREL DEPS MISC.  ID is a word index
(1, 2, ...), a multiword-token range (``3-4``) or an empty node (``5.1``);
multiword ranges and empty nodes carry no HEAD and are kept out of the
parse.  Word IDs must run 1..n without gaps and every HEAD must be 0..n.

Anything else is a :class:`~lstmablate.errors.DataError` naming the file, the
line and what was expected — never a silent skip.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from lstmablate.data import open_text
from lstmablate.errors import DataError, where

FIELDS = ("id", "form", "lemma", "upos", "xpos", "feats", "head", "deprel", "deps", "misc")
_WORD_ID = re.compile(r"[1-9][0-9]*\Z")
_RANGE_ID = re.compile(r"[1-9][0-9]*-[1-9][0-9]*\Z")
_EMPTY_ID = re.compile(r"[0-9]+\.[1-9][0-9]*\Z")


@dataclass
class Sentence:
    """The syntactic words of one sentence (multiword ranges and empty nodes dropped)."""

    words: list[str] = field(default_factory=list)
    upos: list[str] = field(default_factory=list)
    xpos: list[str] = field(default_factory=list)
    heads: list[int] = field(default_factory=list)  # 0 = root, else 1-based
    deprels: list[str] = field(default_factory=list)
    comments: list[str] = field(default_factory=list)
    line: int = 0  # first line of the sentence in its file
    word_lines: list[int] = field(default_factory=list, repr=False)  # line of each word

    def __len__(self) -> int:
        return len(self.words)


def _bad(path: Path, lineno: int, what: str) -> DataError:
    return DataError(f"{where(path, lineno)}: malformed CoNLL-U line: {what}. Expected 10 "
                     "tab-separated fields ID FORM LEMMA UPOS XPOS FEATS HEAD DEPREL DEPS MISC, "
                     "comments starting with '#', and a blank line after each sentence.")


def read_conllu(path: str | Path) -> list[Sentence]:
    """All sentences of a ``.conllu`` (or ``.conllu.gz``) file, validated line by line."""
    path = Path(path)
    sentences: list[Sentence] = []
    current = Sentence()
    lineno = 0

    def finish(at: int) -> None:
        nonlocal current
        if current.words:
            n = len(current.words)
            for i, h in enumerate(current.heads):
                if h > n:
                    raise _bad(path, current.word_lines[i], f"HEAD {h} of word {i + 1} points past the "
                               f"last word ({n}) of the sentence starting at line {current.line}")
            sentences.append(current)
        elif current.comments:
            raise _bad(path, at, "comment lines with no token lines after them")
        current = Sentence()

    with open_text(path) as f:
        for lineno, raw in enumerate(f, start=1):
            line = raw.rstrip("\n").rstrip("\r")
            if not line.strip():
                finish(lineno)
                continue
            if line.startswith("#"):
                if current.words:
                    raise _bad(path, lineno, "a comment inside a sentence (a blank line must come first)")
                current.comments.append(line)
                continue
            cols = line.split("\t")
            if len(cols) != 10:
                raise _bad(path, lineno, f"{len(cols)} tab-separated fields instead of 10")
            tid, form, _, upos, xpos, _, head, deprel, _, _ = cols
            if _RANGE_ID.match(tid) or _EMPTY_ID.match(tid):
                continue  # multiword token range or empty node: not part of the basic tree
            if not _WORD_ID.match(tid):
                raise _bad(path, lineno, f"ID {tid!r} is not a word index, a range like 3-4 or a "
                           "decimal like 5.1")
            if int(tid) != len(current.words) + 1:
                raise _bad(path, lineno, f"word ID {tid} should be {len(current.words) + 1} "
                           "(IDs run 1, 2, ... within a sentence)")
            if not head.isdigit():
                raise _bad(path, lineno, f"HEAD {head!r} is not a number")
            if not deprel or deprel == "_":
                raise _bad(path, lineno, "DEPREL is empty")
            if not current.words:
                current.line = lineno
            current.word_lines.append(lineno)
            current.words.append(form)
            current.upos.append(upos)
            current.xpos.append(xpos)
            current.heads.append(int(head))
            current.deprels.append(deprel)
    finish(lineno + 1)
    if not sentences:
        raise DataError(f"{path}: no sentences found; expected a CoNLL-U file.")
    return sentences
