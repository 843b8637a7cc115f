"""The m-bounded Dyck-k language, Dyck-(k, m): its vocabulary, what makes a string one of
it, and the stack after each token.

Dyck-(k, m) is the set of well-nested strings over k bracket types whose nesting depth never
exceeds m (Hewitt, Hahn, Ganguli, Liang & Manning, EMNLP 2020).  Sampling it is
:mod:`.generator`; its files are :mod:`.files`.

Vocabulary
    Bracket type ``i`` (0-based) is named by the letter ``"abc...z"[i % 26]`` repeated
    ``i // 26 + 1`` times (``a``, ..., ``z``, ``aa``, ..., ``zz``, ``aaa``, ...), as in Hewitt's
    code, so files are interchangeable with his.  Its open bracket is ``(`` + name, its close
    bracket name + ``)``.  Ids: 0 ``<pad>``, 1 ``START``, 2 ``END``, 3..k+2 the opens,
    k+3..2k+2 the closes.  The data holds opens, closes and ``END``; ``START`` is never stored
    (a language model prepends it to its input) and ``<pad>`` only exists inside batches.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from lstmablate.errors import DataError

PAD = "<pad>"
START = "START"
END = "END"
PAD_ID = 0
START_ID = 1
END_ID = 2
_FIRST_OPEN_ID = 3


def bracket_type_name(i: int) -> str:
    """The name of bracket type ``i`` (0-based): ``a``..``z``, then ``aa``..``zz``, ``aaa``..."""
    if i < 0:
        raise ValueError(f"bracket type must be >= 0, got {i}")
    return string.ascii_lowercase[i % 26] * (i // 26 + 1)


class DyckVocab:
    """Token strings and ids of Dyck-(k, ·): ``<pad>``, ``START``, ``END``, k opens, k closes."""

    def __init__(self, k: int):
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"the number of bracket types k must be a positive int, got {k!r}")
        self.k = k
        names = [bracket_type_name(i) for i in range(k)]
        self.tokens: list[str] = (
            [PAD, START, END] + ["(" + n for n in names] + [n + ")" for n in names]
        )
        self._ids = {tok: i for i, tok in enumerate(self.tokens)}

    @property
    def size(self) -> int:
        """Number of ids, ``2k + 3`` (the 2k+2 real symbols plus ``<pad>``)."""
        return len(self.tokens)

    def __len__(self) -> int:
        return self.size

    def __repr__(self) -> str:
        return f"DyckVocab(k={self.k})"

    def open_id(self, bracket_type: int) -> int:
        """Id of the open bracket of ``bracket_type`` (0-based)."""
        self._check_type(bracket_type)
        return _FIRST_OPEN_ID + bracket_type

    def close_id(self, bracket_type: int) -> int:
        """Id of the close bracket of ``bracket_type`` (0-based)."""
        self._check_type(bracket_type)
        return _FIRST_OPEN_ID + self.k + bracket_type

    def is_open(self, token_id: int) -> bool:
        return _FIRST_OPEN_ID <= token_id < _FIRST_OPEN_ID + self.k

    def is_close(self, token_id: int) -> bool:
        return _FIRST_OPEN_ID + self.k <= token_id < _FIRST_OPEN_ID + 2 * self.k

    def bracket_type(self, token_id: int) -> int:
        """The 0-based type of an open or close bracket id; ValueError for any other id."""
        if self.is_open(token_id):
            return token_id - _FIRST_OPEN_ID
        if self.is_close(token_id):
            return token_id - _FIRST_OPEN_ID - self.k
        raise ValueError(f"id {token_id} is not a bracket in {self!r}")

    def token_id(self, token: str) -> int:
        """Id of one token string; KeyError if it is not in the vocabulary."""
        return self._ids[token]

    def encode(self, tokens: Sequence[str]) -> list[int]:
        """Ids of a list of token strings; KeyError names the first unknown token."""
        try:
            return [self._ids[t] for t in tokens]
        except KeyError as err:
            raise KeyError(f"unknown token {err.args[0]!r} for {self!r}") from None

    def decode(self, ids: Sequence[int]) -> list[str]:
        """Token strings of a list of ids."""
        return [self.tokens[int(i)] for i in ids]

    def _check_type(self, bracket_type: int) -> None:
        if not 0 <= bracket_type < self.k:
            raise ValueError(f"bracket type {bracket_type} out of range for {self!r}")


def check_m(m: int) -> None:
    if not isinstance(m, int) or m < 1:
        raise ValueError(f"the depth bound m must be a positive int, got {m!r}")


# ----------------------------------------------------------------------------------------------
# Structure, validation and stack annotations


@dataclass(frozen=True)
class DyckStats:
    """Summary of a valid corpus."""

    num_sequences: int
    num_tokens: int
    max_depth: int
    min_length: int
    max_length: int


class StackState(NamedTuple):
    """The stack after reading one token."""

    depth: int
    #: type of the open bracket on top of the stack, or None when the stack is empty
    top_type: int | None
    #: position in the sequence of that open bracket, or None when the stack is empty
    top_index: int | None


def stack_annotations(seq: Sequence[int], k: int) -> list[StackState]:
    """For each position t, the stack after reading ``seq[t]`` (depth, top type, top position).

    ``seq`` holds ids of a Dyck-k vocabulary (``END`` leaves the stack as it is).  Raises
    ValueError if a close bracket does not match the top of the stack.
    """
    vocab = DyckVocab(k)
    stack: list[tuple[int, int]] = []  # (type, position)
    out = []
    for t, tok in enumerate(seq):
        tok = int(tok)
        if vocab.is_open(tok):
            stack.append((vocab.bracket_type(tok), t))
        elif vocab.is_close(tok):
            typ = vocab.bracket_type(tok)
            if not stack or stack[-1][0] != typ:
                raise ValueError(f"close bracket {vocab.tokens[tok]!r} at position {t} "
                                 f"does not match the stack")
            stack.pop()
        if stack:
            out.append(StackState(len(stack), stack[-1][0], stack[-1][1]))
        else:
            out.append(StackState(0, None, None))
    return out


def structure_problem(seq: Sequence[int], vocab: DyckVocab, m: int) -> str | None:
    """What makes ``seq`` not a Dyck-(k, m) string followed by END, or None if it is one.

    Token positions in the message are 1-based, to match what a user sees in a file.
    """
    if len(seq) == 0:
        return "the string is empty (not even END)"
    stack: list[tuple[int, int]] = []  # (type, 1-based position)
    for pos, tok in enumerate(seq, start=1):
        tok = int(tok)
        if vocab.is_open(tok):
            stack.append((vocab.bracket_type(tok), pos))
            if len(stack) > m:
                return (f"token {pos} {vocab.tokens[tok]!r} opens depth {len(stack)}, "
                        f"over the bound m={m}")
        elif vocab.is_close(tok):
            name = vocab.tokens[tok]
            if not stack:
                return f"token {pos} {name!r} closes a bracket that was never opened"
            typ, opened = stack.pop()
            if typ != vocab.bracket_type(tok):
                return (f"token {pos} {name!r} does not match the open bracket "
                        f"{vocab.tokens[vocab.open_id(typ)]!r} at token {opened}")
        elif tok == END_ID:
            if pos != len(seq):
                return f"{END} at token {pos} is not the last token"
            if stack:
                typ, opened = stack[-1]
                return (f"{END} at token {pos} leaves {len(stack)} bracket(s) unclosed (innermost "
                        f"{vocab.tokens[vocab.open_id(typ)]!r} at token {opened})")
            return None
        elif 0 <= tok < vocab.size:
            return f"token {pos} is the reserved token {vocab.tokens[tok]!r}"
        else:
            return f"token {pos} has id {tok}, outside the Dyck-{vocab.k} vocabulary"
    return f"the string does not end with {END}"


def _max_depth(seq: Sequence[int], vocab: DyckVocab) -> int:
    depth = best = 0
    for tok in seq:
        depth += vocab.is_open(tok) - vocab.is_close(tok)
        best = max(best, depth)
    return best


class StatsCounter:
    def __init__(self) -> None:
        self.n = self.tokens = self.depth = self.max_len = 0
        self.min_len: int | None = None

    def add(self, seq: Sequence[int], vocab: DyckVocab) -> None:
        self.n += 1
        self.tokens += len(seq)
        self.depth = max(self.depth, _max_depth(seq, vocab))
        self.max_len = max(self.max_len, len(seq))
        self.min_len = len(seq) if self.min_len is None else min(self.min_len, len(seq))

    def stats(self) -> DyckStats:
        return DyckStats(self.n, self.tokens, self.depth, self.min_len or 0, self.max_len)


def validate_sequences(seqs: Sequence[Sequence[int]], k: int, m: int) -> DyckStats:
    """Check in-memory strings of ids are Dyck-(k, m) strings each ending with one ``END``.

    Raises :class:`DataError` naming the first bad sequence (0-based index) and the problem.
    """
    vocab = DyckVocab(k)
    check_m(m)
    counter = StatsCounter()
    for i, seq in enumerate(seqs):
        problem = structure_problem(seq, vocab, m)
        if problem:
            raise DataError(f"sequence {i} (0-based) is not a Dyck-({k}, {m}) string: {problem}.")
        counter.add(seq, vocab)
    return counter.stats()
