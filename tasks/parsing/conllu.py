"""CoNLL-U reading (strictly validated) and writing (https://universaldependencies.org/format.html).

Each sentence is a block of token lines ended by a blank line; ``#`` lines are
comments.  A token line has exactly 10 tab-separated fields:
ID FORM LEMMA UPOS XPOS FEATS HEAD DEPREL DEPS MISC.  ID is a word index
(1, 2, ...), a multiword-token range (``3-4``) or an empty node (``5.1``).

Reading is two passes over the (plain or ``.gz``) file:

1. :func:`validate_lines` checks every line and names the file, the line and what
   was expected on the first problem: 10 fields, word IDs 1..n without gaps,
   ranges that start at the next word and end within the sentence, HEAD a number
   (ASCII digits) in 0..n and not the word itself, a DEPREL without white space,
   exactly one word attached to 0 and no cycle (a basic UD tree), LF line endings
   (no CRLF), exactly one blank line after each sentence (the last one included);
2. the fields are then read through the ``conllu`` library, keeping only the
   syntactic words: multiword-token ranges and empty nodes are skipped, as the
   CoNLL 2018 UD evaluation (conll18_ud_eval.py) scores the basic tree over words.

:func:`write_conllu` writes predicted trees into a copy of the input file's
lines: HEAD and DEPREL replaced, DEPS set to ``_`` (no enhanced graph is
predicted) and empty nodes dropped (they belong to the enhanced graph); every
other field, comment and multiword-token line is kept byte for byte.  (The
``conllu`` library's own serialiser is not used: it drops comments without
``=`` and rewrites MISC values that contain ``=``.)
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import conllu as conllu_lib

from lstmablate.data import read_text
from lstmablate.errors import DataError, where

FIELDS = ("id", "form", "lemma", "upos", "xpos", "feats", "head", "deprel", "deps", "misc")
_WORD_ID = re.compile(r"[1-9][0-9]*\Z")
_RANGE_ID = re.compile(r"([1-9][0-9]*)-([1-9][0-9]*)\Z")
_EMPTY_ID = re.compile(r"[0-9]+\.[1-9][0-9]*\Z")
_HEAD = re.compile(r"[0-9]+\Z")  # ASCII digits only: str.isdigit() also takes '²' and '٣'


@dataclass
class Sentence:
    """The syntactic words of one sentence (multiword ranges and empty nodes dropped)."""

    words: list[str] = field(default_factory=list)
    upos: list[str] = field(default_factory=list)
    xpos: list[str] = field(default_factory=list)  # "_" where the file has none
    heads: list[int] = field(default_factory=list)  # 0 = root, else 1-based
    deprels: list[str] = field(default_factory=list)
    line: int = 0  # first line of the sentence (its first comment or token) in its file
    word_lines: list[int] = field(default_factory=list, repr=False)  # line of each word
    # the sentence's lines as in the file (kept only with read_conllu(keep_lines=True))
    lines: list[str] = field(default_factory=list, repr=False)

    def __len__(self) -> int:
        return len(self.words)


def _bad(path: Path, lineno: int, what: str) -> DataError:
    return DataError(f"{where(path, lineno)}: malformed CoNLL-U: {what}. Expected 10 "
                     "tab-separated fields ID FORM LEMMA UPOS XPOS FEATS HEAD DEPREL DEPS MISC, "
                     "comments starting with '#', LF line endings and a blank line after "
                     "each sentence (the last one included).")


@dataclass
class _Block:
    """One sentence as seen by the line-level pass."""

    first_line: int = 0
    lines: list[str] = field(default_factory=list)
    heads: list[int] = field(default_factory=list)
    word_lines: list[int] = field(default_factory=list)
    has_tokens: bool = False
    ranges: list[tuple[int, int]] = field(default_factory=list)  # (line, last word) of each range


def _check_tree(path: Path, b: _Block) -> None:
    """Exactly one word attached to the root, every HEAD within the sentence, no cycle."""
    n = len(b.heads)
    if n == 0:
        raise _bad(path, b.first_line, "a sentence with multiword-token or empty-node lines "
                   "but no word lines")
    for lineno, last in b.ranges:
        if last > n:
            raise _bad(path, lineno, f"the multiword token ends at word {last}, but the sentence "
                       f"starting at line {b.first_line} has {n} words")
    for i, h in enumerate(b.heads):
        if h > n:
            raise _bad(path, b.word_lines[i], f"HEAD {h} of word {i + 1} points past the last "
                       f"word ({n}) of the sentence starting at line {b.first_line}")
    roots = [i + 1 for i, h in enumerate(b.heads) if h == 0]
    if len(roots) != 1:
        what = "no word has" if not roots else f"{len(roots)} words (IDs {roots}) have"
        raise _bad(path, b.first_line, f"{what} HEAD 0 in the sentence starting at line "
                   f"{b.first_line}; a basic UD tree has exactly one")
    # every word must reach the root by following heads (no cycle)
    state = [0] * (n + 1)  # 0 unvisited, 1 on the current path, 2 reaches the root
    state[0] = 2
    for start in range(1, n + 1):
        path_nodes, v = [], start
        while state[v] == 0:
            state[v] = 1
            path_nodes.append(v)
            v = b.heads[v - 1]
        if state[v] == 1:
            raise _bad(path, b.word_lines[v - 1], f"word {v} is on a cycle of heads (HEAD "
                       "values of the sentence starting at line "
                       f"{b.first_line} do not form a tree)")
        for u in path_nodes:
            state[u] = 2


def validate_lines(path: Path, text: str) -> list[_Block]:
    """The line-level pass: every sentence block, or a DataError naming the first bad line."""
    blocks: list[_Block] = []
    cur = _Block()
    lines = text.split("\n")
    ends_with_newline = lines[-1] == ""
    if ends_with_newline:
        lines.pop()

    def finish(at: int) -> None:
        nonlocal cur
        if cur.has_tokens:
            _check_tree(path, cur)
            blocks.append(cur)
        elif cur.lines:
            raise _bad(path, at, "comment lines with no token lines after them")
        cur = _Block()

    for lineno, line in enumerate(lines, start=1):
        if line.endswith("\r"):
            raise _bad(path, lineno, "the line ends in CR LF (a Windows line ending); CoNLL-U "
                       "lines end in LF only (convert the file, e.g. with dos2unix)")
        if not line.strip():
            if line:
                raise _bad(path, lineno, "a line of only white space; sentence separators "
                           "must be empty lines")
            if not cur.lines and blocks:
                raise _bad(path, lineno, "a second empty line after a sentence (sentences are "
                           "separated by exactly one empty line)")
            finish(lineno)
            continue
        if not cur.lines:
            cur.first_line = lineno
        if line.startswith("#"):
            if cur.has_tokens:
                raise _bad(path, lineno, "a comment inside a sentence (a blank line must come first)")
            cur.lines.append(line)
            continue
        cur.lines.append(line)
        cur.has_tokens = True
        cols = line.split("\t")
        if len(cols) != 10:
            raise _bad(path, lineno, f"{len(cols)} tab-separated fields instead of 10")
        tid, form, _, upos, _, _, head, deprel, _, _ = cols
        n_words = len(cur.heads)
        rng = _RANGE_ID.match(tid)
        if rng:
            lo, hi = int(rng.group(1)), int(rng.group(2))
            if lo != n_words + 1 or hi < lo:
                raise _bad(path, lineno, f"multiword token {tid} should cover words "
                           f"{n_words + 1}-N with N >= {n_words + 1}")
            cur.ranges.append((lineno, hi))
            continue  # a multiword token: not a node of the basic tree
        if _EMPTY_ID.match(tid):
            continue  # an empty node: enhanced graph only
        if not _WORD_ID.match(tid):
            raise _bad(path, lineno, f"ID {tid!r} is not a word index, a range like 3-4 or a "
                       "decimal like 5.1")
        if int(tid) != n_words + 1:
            raise _bad(path, lineno, f"word ID {tid} should be {n_words + 1} "
                       "(IDs run 1, 2, ... within a sentence)")
        if not form:
            raise _bad(path, lineno, "FORM is empty")
        if not upos:
            raise _bad(path, lineno, "UPOS is empty")
        if not _HEAD.match(head):
            raise _bad(path, lineno, f"HEAD {head!r} is not a number (ASCII digits)")
        if int(head) == int(tid):
            raise _bad(path, lineno, f"word {tid} is its own HEAD")
        if not deprel or deprel == "_":
            raise _bad(path, lineno, "DEPREL is empty")
        if any(c.isspace() for c in deprel):
            raise _bad(path, lineno, f"DEPREL {deprel!r} contains white space (a relation is "
                       "one word, such as nsubj or obl:tmod)")
        cur.heads.append(int(head))
        cur.word_lines.append(lineno)
    if cur.lines:
        last = len(lines)
        if cur.has_tokens:
            raise _bad(path, last, "the last sentence is not followed by a blank line (the file "
                       "must end with an empty line after the last token line)")
        raise _bad(path, last, "comment lines with no token lines after them")
    if not ends_with_newline and lines:
        raise _bad(path, len(lines), "the file does not end with a newline")
    return blocks


def read_conllu(path: str | Path, *, keep_lines: bool = False) -> list[Sentence]:
    """All sentences of a ``.conllu`` (or ``.conllu.gz``) file, validated line by line.

    ``keep_lines`` keeps each sentence's lines (needed by :func:`write_conllu`).
    """
    path = Path(path)
    text = read_text(path)  # UTF-8 checked; gzip decompressed
    blocks = validate_lines(path, text)
    if not blocks:
        raise DataError(f"{path}: no sentences found; expected a CoNLL-U file.")
    # FEATS, DEPS and MISC are not used: left as strings (halves the library's parsing time)
    raw = lambda cols, i: cols[i]  # noqa: E731
    parsed = conllu_lib.parse(text, field_parsers={"feats": raw, "deps": raw, "misc": raw})
    if len(parsed) != len(blocks):  # cannot happen for a file that passed validate_lines
        raise DataError(f"{path}: the conllu library reads {len(parsed)} sentences where the "
                        f"line-level check found {len(blocks)}; the file is not valid CoNLL-U.")
    sentences = []
    for block, tokens in zip(blocks, parsed):
        words = [t for t in tokens if isinstance(t["id"], int)]  # no ranges, no empty nodes
        if len(words) != len(block.heads):
            raise DataError(f"{where(path, block.first_line)}: the conllu library reads "
                            f"{len(words)} words in this sentence, the line-level check "
                            f"{len(block.heads)}.")
        sentences.append(Sentence(
            words=[t["form"] for t in words],
            upos=[t["upos"] for t in words],
            xpos=[t["xpos"] if t["xpos"] is not None else "_" for t in words],
            heads=[int(t["head"]) for t in words],
            deprels=[t["deprel"] for t in words],
            line=block.first_line,
            word_lines=block.word_lines,
            lines=block.lines if keep_lines else [],
        ))
    return sentences


def format_sentence(sentence: Sentence, heads: Sequence[int], deprels: Sequence[str]) -> list[str]:
    """The sentence's own lines with HEAD/DEPREL replaced by ``heads``/``deprels``, DEPS
    set to ``_`` and empty nodes dropped (see the module docstring)."""
    if not sentence.lines:
        raise ValueError("the sentence was read without keep_lines=True; its lines are needed")
    if len(heads) != len(sentence) or len(deprels) != len(sentence):
        raise ValueError(f"{len(heads)} heads / {len(deprels)} relations for a sentence of "
                         f"{len(sentence)} words")
    out = []
    for line in sentence.lines:
        if line.startswith("#"):
            out.append(line)
            continue
        cols = line.split("\t")
        if _EMPTY_ID.match(cols[0]):
            continue
        if _WORD_ID.match(cols[0]):
            i = int(cols[0]) - 1
            rel = deprels[i]
            if not rel or any(c in rel for c in "\t\n ") or rel == "_":
                raise ValueError(f"relation {rel!r} cannot be written to CoNLL-U")
            cols[6], cols[7], cols[8] = str(int(heads[i])), rel, "_"
        out.append("\t".join(cols))
    return out


def conllu_text(sentences: Sequence[Sentence], heads: Sequence[Sequence[int]],
                deprels: Sequence[Sequence[str]]) -> str:
    """The text of a CoNLL-U file holding ``sentences`` with the given trees."""
    parts = []
    for s, h, r in zip(sentences, heads, deprels, strict=True):
        parts.append("\n".join(format_sentence(s, h, r)) + "\n\n")
    return "".join(parts)


def write_conllu(path: str | Path, sentences: Sequence[Sentence], heads: Sequence[Sequence[int]],
                 deprels: Sequence[Sequence[str]]) -> None:
    """Write ``sentences`` with predicted trees to ``path`` (atomically)."""
    from lstmablate.io import atomic_write_text

    atomic_write_text(path, conllu_text(sentences, heads, deprels))
