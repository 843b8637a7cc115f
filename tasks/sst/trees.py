"""The Stanford Sentiment Treebank's PTB-format trees, read strictly.

One tree per line (``trees/{train,dev,test}.txt`` of Stanford's trainDevTestTrees_PTB.zip)::

    (3 (2 It) (4 (4 (2 's) (4 (3 (2 a) (4 (3 lovely) (2 film))) ...)) (2 .)))

A node is ``(LABEL WORD)`` (a leaf) or ``(LABEL NODE NODE ...)``; LABEL is the sentiment of
the phrase the node spans, 0 (very negative) .. 4 (very positive).  The root's label is the
sentence's.  Words are kept exactly as written, in the treebank's escaping (``-LRB-`` /
``-RRB-`` for brackets, ``\\/`` for ``/``, ``\\*`` for ``*``); a word may contain a space
character other than the ASCII space that separates tokens (one training word holds a
non-breaking space).

:func:`parse_tree` turns one line into a :class:`Tree`: its words and the (start, end,
label) span of every node, root first, then in pre-order (every phrase of the treebank,
single words included).  Anything else — an unbalanced bracket, a label outside 0-4, a
node with no word and no subtree, a word beside subtrees, text after the tree — is a
:class:`~lstmablate.errors.DataError` naming the file, the line and the column, with what
was expected there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from lstmablate.data import read_lines
from lstmablate.errors import DataError, where

LABELS = ("0", "1", "2", "3", "4")
# tokens are separated by ASCII spaces (or tabs) only: a word may hold another space character,
# as the non-breaking space in the film title "8 1\/2" of the training file
_TOKEN = re.compile(r"\(|\)|[^ \t()]+")


@dataclass(frozen=True)
class Tree:
    """One sentence: its words and the labelled span of every node (root first)."""

    words: tuple[str, ...]
    spans: tuple[tuple[int, int, int], ...]  # (start, end) word indices (end exclusive), label

    @property
    def label(self) -> int:
        """The sentence's label: the root's."""
        return self.spans[0][2]

    def phrases(self) -> list[tuple[tuple[str, ...], int]]:
        """Every node's words and label, root first (the phrase-level training data)."""
        return [(self.words[a:b], y) for a, b, y in self.spans]


def parse_tree(line: str, path: str | Path = "<text>", lineno: int | None = None) -> Tree:
    """One PTB-format tree; a DataError naming ``path``, ``lineno`` and the column otherwise."""
    def fail(col: int | None, what: str) -> DataError:
        at = f", column {col}" if col is not None else ""
        return DataError(f"{where(path, lineno)}{at}: malformed SST tree: {what}. Expected one "
                         "tree per line in the treebank's PTB format, e.g. "
                         "'(3 (2 It) (4 (2 works) (2 .)))', labels 0-4.")

    tokens = [(m.group(), m.start() + 1) for m in _TOKEN.finditer(line)]
    if not tokens:
        raise fail(None, "the line is empty")
    words: list[str] = []
    spans: list[list[int]] = []  # [start, end, label], filled in pre-order
    # the open nodes: (index into spans, what the node holds so far: "" | "word" | "tree")
    stack: list[tuple[int, str]] = []
    i, n = 0, len(tokens)
    closed_root = False
    while i < n:
        tok, col = tokens[i]
        if closed_root:
            if tok == ")":
                raise fail(col, "')' closes no open bracket")
            raise fail(col, f"{tok!r} after the tree's closing bracket (one tree per line)")
        if tok == "(":
            if stack:
                idx, holds = stack[-1]
                if holds == "word":
                    raise fail(col, "a subtree after a word; a node holds one word or subtrees")
                stack[-1] = (idx, "tree")
            if i + 1 >= n:
                raise fail(None, "the line ends after '('; expected a label 0-4")
            label, lcol = tokens[i + 1]
            if label not in LABELS:
                raise fail(lcol, f"{label!r} is not a sentiment label; expected 0-4 after '('")
            spans.append([len(words), -1, int(label)])
            stack.append((len(spans) - 1, ""))
            i += 2
            continue
        if tok == ")":
            if not stack:
                raise fail(col, "')' closes no open bracket")
            idx, holds = stack.pop()
            if not holds:
                raise fail(col, "a node with a label but no word or subtree")
            spans[idx][1] = len(words)
            closed_root = not stack
            i += 1
            continue
        # a word
        if not stack:
            raise fail(col, f"{tok!r} outside any bracket; expected '('")
        idx, holds = stack[-1]
        if holds:
            raise fail(col, f"the word {tok!r} after a {'word' if holds == 'word' else 'subtree'}; "
                            "a node holds exactly one word or only subtrees")
        words.append(tok)
        stack[-1] = (idx, "word")
        i += 1
    if stack:
        raise fail(None, f"{len(stack)} bracket{'s' if len(stack) > 1 else ''} still open at the "
                         "end of the line")
    return Tree(tuple(words), tuple((a, b, y) for a, b, y in spans))


def read_trees(path: Path) -> list[Tree]:
    """Every tree of a treebank file (``.gz`` read transparently), one per line."""
    return [parse_tree(line, path, k) for k, line in enumerate(read_lines(path), start=1)]
