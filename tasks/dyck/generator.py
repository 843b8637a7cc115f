"""Sampling, storing and checking the m-bounded Dyck-k language, Dyck-(k, m).

Dyck-(k, m) is the set of well-nested strings over k bracket types whose nesting depth never
exceeds m (Hewitt, Hahn, Ganguli, Liang & Manning, EMNLP 2020).  This module reproduces the
data side of their public code (john-hewitt/dyckkm-learning, ``generate_mbounded_dyck.py``);
the second-order report (Renganathan & Singh, §5.1) uses the same language.

Vocabulary
    Bracket type ``i`` (0-based) is named by the letter ``"abc...z"[i % 26]`` repeated
    ``i // 26 + 1`` times (``a``, ..., ``z``, ``aa``, ..., ``zz``, ``aaa``, ...), as in Hewitt's
    code, so files are interchangeable with his.  Its open bracket is ``(`` + name, its close
    bracket name + ``)``.  Ids: 0 ``<pad>``, 1 ``START``, 2 ``END``, 3..k+2 the opens,
    k+3..2k+2 the closes.  The data holds opens, closes and ``END``; ``START`` is never stored
    (a language model prepends it to its input) and ``<pad>`` only exists inside batches.

Sampling automaton (a probabilistic pushdown automaton whose stack is bounded by m)
    * empty stack: ``END`` with probability 1/2, each open bracket 1/(2k);
    * full stack (depth m): the close bracket of the top type, with probability 1;
    * otherwise: the close bracket of the top type 1/2, each open bracket 1/(2k).

    ``END`` is part of the string and counts toward its length.  Length limits are imposed by
    rejection, as in Hewitt's code: an ``END`` drawn while fewer than ``min_length`` tokens have
    been written is rejected and that token is drawn again (so every string holds at least
    ``min_length`` brackets, i.e. ``min_length + 1`` tokens with ``END``), and a string longer
    than ``max_length`` tokens (``END`` included) is thrown away and a new one is sampled.  A
    string is abandoned as soon as it cannot end within ``max_length``; this changes which random
    numbers are used, not the distribution of the accepted strings.

Randomness
    All draws come from :class:`random.Random` seeded with an ``int``, using ``randrange`` on
    integer weights only (no floats, no hashing, no set ordering), so a seed gives the same
    corpus byte for byte on every run and platform.  The corpora are NOT the ones Hewitt's code
    writes: it samples with torch's generator.  Split seeds: see :func:`split_seed`.

File format
    One string per line, tokens separated by single spaces, ending with ``END``, e.g.
    ``(a (b b) a) END``.  Files may be gzip-compressed (name ending in ``.gz``).
"""

from __future__ import annotations

import gzip
import os
import random
import string
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from lstmablate.errors import DataError, where
from lstmablate.io import atomic_write, open_regular

PAD = "<pad>"
START = "START"
END = "END"
PAD_ID = 0
START_ID = 1
END_ID = 2
_FIRST_OPEN_ID = 3

SPLITS = ("train", "dev", "test")
#: Added to ``10_000 * seed`` to get each split's random seed (see :func:`split_seed`).
SPLIT_SEED_OFFSETS = {"train": 1, "dev": 1000, "test": 2000}

#: Hewitt et al.'s dev and test corpus sizes, in tokens.
DEFAULT_DEV_TOKENS = 20_000
DEFAULT_TEST_TOKENS = 300_000


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


# ----------------------------------------------------------------------------------------------
# Sampling


def default_lengths(m: int) -> dict[str, tuple[int, int]]:
    """Hewitt et al.'s ``(min_length, max_length)`` per split for depth bound ``m``.

    Train and dev: ``(1, 8·m·(m−2) + 60)``; test: ``(train_max + 1, 2·train_max)``, so every
    test string is strictly longer than every training string (m=3: 1–84 and 85–168).
    """
    _check_m(m)
    train_max = 8 * m * (m - 2) + 60
    return {
        "train": (1, train_max),
        "dev": (1, train_max),
        "test": (train_max + 1, 2 * train_max),
    }


def split_seed(seed: int, split: str) -> int:
    """The seed of one split: ``10_000 * seed + offset``, offsets train 1, dev 1000, test 2000.

    Seed 0 therefore uses 1 / 1000 / 2000, the torch seeds of Hewitt's script (the samples still
    differ: his come from torch's generator).  Different ``(seed, split)`` pairs never collide.
    """
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    if split not in SPLIT_SEED_OFFSETS:
        raise ValueError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")
    return 10_000 * seed + SPLIT_SEED_OFFSETS[split]


def generate(
    k: int,
    m: int,
    *,
    seed: int,
    min_length: int,
    max_length: int,
    num_tokens: int | None = None,
    num_sequences: int | None = None,
) -> list[list[int]]:
    """Sample a Dyck-(k, m) corpus; each string is a list of ids ending with ``END``.

    Give exactly one size: ``num_sequences`` strings, or enough strings for the token total
    (``END`` included) to reach ``num_tokens`` (Hewitt's corpora are sized in tokens; the last
    string may overshoot).  Length limits and rejection are described in the module docstring.
    """
    vocab = DyckVocab(k)
    _check_m(m)
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        # random.Random(None) would be unseeded and Random(-s) equals Random(s).
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    if (num_tokens is None) == (num_sequences is None):
        raise ValueError("give exactly one of num_tokens and num_sequences")
    size = num_tokens if num_tokens is not None else num_sequences
    if not isinstance(size, int) or size < 1:
        raise ValueError(f"corpus size must be a positive int, got {size!r}")
    _check_lengths(min_length, max_length)

    rng = random.Random(seed)
    corpus: list[list[int]] = []
    total_tokens = 0
    while (num_tokens is not None and total_tokens < num_tokens) or (
        num_sequences is not None and len(corpus) < num_sequences
    ):
        seq = None
        while seq is None:
            seq = _sample_string(rng, vocab, m, min_length, max_length)
        corpus.append(seq)
        total_tokens += len(seq)
    return corpus


def _sample_string(
    rng: random.Random, vocab: DyckVocab, m: int, min_length: int, max_length: int
) -> list[int] | None:
    """One run of the automaton; None if the string would exceed ``max_length`` tokens."""
    k = vocab.k
    stack: list[int] = []
    seq: list[int] = []
    while True:
        if len(seq) >= max_length:  # even an END now would make the string too long
            return None
        if len(stack) == m:
            seq.append(vocab.close_id(stack.pop()))
            continue
        # Weights: each open 1 (draws 0..k-1), END or close-the-top k (draws k..2k-1).
        draw = rng.randrange(2 * k)
        if draw < k:
            stack.append(draw)
            seq.append(vocab.open_id(draw))
        elif stack:
            seq.append(vocab.close_id(stack.pop()))
        elif len(seq) >= min_length:
            seq.append(END_ID)
            return seq
        # else: END drawn too early; draw this token again.


@dataclass
class DyckSplits:
    """Train/dev/test corpora of one Dyck-(k, m) setting, with how they were made."""

    k: int
    m: int
    seed: int
    lengths: dict[str, tuple[int, int]]
    split_seeds: dict[str, int]
    train: list[list[int]] = field(repr=False)
    dev: list[list[int]] = field(repr=False)
    test: list[list[int]] = field(repr=False)

    @property
    def vocab(self) -> DyckVocab:
        return DyckVocab(self.k)

    def split(self, name: str) -> list[list[int]]:
        if name not in SPLITS:
            raise ValueError(f"unknown split {name!r}; expected one of {', '.join(SPLITS)}")
        return getattr(self, name)

    def write(self, directory: str | os.PathLike[str], suffix: str = ".txt") -> dict[str, Path]:
        """Write ``train``/``dev``/``test`` + ``suffix`` into ``directory``; returns the paths."""
        paths = split_paths(directory, suffix)
        Path(directory).mkdir(parents=True, exist_ok=True)
        vocab = self.vocab
        for name, path in paths.items():
            write_split(path, self.split(name), vocab)
        return paths


def split_paths(directory: str | os.PathLike[str], suffix: str = ".txt") -> dict[str, Path]:
    """The files :meth:`DyckSplits.write` writes into ``directory``, by split."""
    return {name: Path(directory) / f"{name}{suffix}" for name in SPLITS}


def make_splits(
    k: int,
    m: int,
    *,
    seed: int = 0,
    train_tokens: int | None = None,
    train_sequences: int | None = None,
    dev_tokens: int | None = None,
    test_tokens: int | None = None,
    dev_sequences: int | None = None,
    test_sequences: int | None = None,
    lengths: dict[str, tuple[int, int]] | None = None,
) -> DyckSplits:
    """Sample train, dev and test corpora for Dyck-(k, m).

    Give exactly one of ``train_tokens`` / ``train_sequences``.  Dev and test take at most one
    size each; with neither they default to Hewitt's 20,000 (dev) and 300,000 (test) tokens.
    ``lengths`` maps split names to ``(min_length, max_length)``; missing splits use
    :func:`default_lengths`, under which test strings are longer than any training string.
    Each split has its own seed, :func:`split_seed` ``(seed, split)``.
    """
    if (train_tokens is None) == (train_sequences is None):
        raise ValueError("give exactly one of train_tokens and train_sequences")
    if dev_tokens is not None and dev_sequences is not None:
        raise ValueError("give at most one of dev_tokens and dev_sequences")
    if test_tokens is not None and test_sequences is not None:
        raise ValueError("give at most one of test_tokens and test_sequences")
    if dev_tokens is None and dev_sequences is None:
        dev_tokens = DEFAULT_DEV_TOKENS
    if test_tokens is None and test_sequences is None:
        test_tokens = DEFAULT_TEST_TOKENS
    unknown = set(lengths or {}) - set(SPLITS)
    if unknown:
        raise ValueError(f"lengths has unknown split(s) {sorted(unknown)}; expected {SPLITS}")
    all_lengths = {**default_lengths(m), **(lengths or {})}
    sizes = {
        "train": (train_tokens, train_sequences),
        "dev": (dev_tokens, dev_sequences),
        "test": (test_tokens, test_sequences),
    }
    seeds = {name: split_seed(seed, name) for name in SPLITS}
    corpora = {
        name: generate(
            k,
            m,
            seed=seeds[name],
            min_length=all_lengths[name][0],
            max_length=all_lengths[name][1],
            num_tokens=sizes[name][0],
            num_sequences=sizes[name][1],
        )
        for name in SPLITS
    }
    return DyckSplits(k=k, m=m, seed=seed, lengths=all_lengths, split_seeds=seeds, **corpora)


@dataclass(frozen=True)
class DyckPreset:
    """A named Dyck setting from the literature (sizes in sequences per depth bound m)."""

    name: str
    k: int
    m_values: tuple[int, ...]
    train_sequences: int
    dev_sequences: int
    test_sequences: int
    description: str


#: Renganathan & Singh, "Second-order RNNs: Resurgence of Recurrence" (CS224N report): data
#: made by John Hewitt for m ∈ {4, 6, 8}, k = 2, "24,000 complete input sequences" per m, each
#: "of the order of 100's" of tokens.  The report says neither how the 24,000 are divided into
#: train/dev/test nor which length limits were used.  We choose 20,000 / 2,000 / 2,000 and
#: Hewitt's :func:`default_lengths` (whose train maximum is 124 / 252 / 444 for m = 4 / 6 / 8,
#: and whose test strings are longer than training strings).  Both choices are ours.  Under these
#: limits training strings average about 17 / 25 / 33 tokens and test strings 145 / 290 / 506
#: (m = 4 / 6 / 8, seed 0), so the report's "order of 100's" matches our test split only.
SECOND_ORDER = DyckPreset(
    name="second-order",
    k=2,
    m_values=(4, 6, 8),
    train_sequences=20_000,
    dev_sequences=2_000,
    test_sequences=2_000,
    description="Dyck-(2, m), m in {4, 6, 8}, 24,000 strings per m split 20,000/2,000/2,000 "
    "(the split and the length limits are not stated in the report).",
)

PRESETS: dict[str, DyckPreset] = {SECOND_ORDER.name: SECOND_ORDER}


def make_preset_splits(name: str, m: int, *, seed: int = 0) -> DyckSplits:
    """The splits of the named preset (see :data:`PRESETS`) for one of its depth bounds ``m``."""
    if name not in PRESETS:
        raise ValueError(f"unknown Dyck preset {name!r}; known presets: {', '.join(PRESETS)}")
    preset = PRESETS[name]
    if m not in preset.m_values:
        raise ValueError(f"preset {name!r} is defined for m in {preset.m_values}, not m={m}")
    return make_splits(
        preset.k,
        m,
        seed=seed,
        train_sequences=preset.train_sequences,
        dev_sequences=preset.dev_sequences,
        test_sequences=preset.test_sequences,
    )


def _check_m(m: int) -> None:
    if not isinstance(m, int) or m < 1:
        raise ValueError(f"the depth bound m must be a positive int, got {m!r}")


def _check_lengths(min_length: int, max_length: int) -> None:
    # The bracket count before END is even and at least min_length (0 allows the bare "END").
    shortest = min_length + (min_length % 2)
    if min_length < 0 or shortest + 1 > max_length:
        raise ValueError(
            f"no Dyck string fits min_length={min_length}, max_length={max_length}: a string "
            f"has an even number >= min_length of brackets plus END, so max_length must be at "
            f"least {shortest + 1}"
        )


# ----------------------------------------------------------------------------------------------
# Files


def write_split(
    path: str | os.PathLike[str], seqs: Sequence[Sequence[int]], vocab: DyckVocab
) -> None:
    """Write one string per line, atomically (:func:`lstmablate.io.atomic_write`); gzip if ``.gz``.

    The bytes depend only on ``seqs``: newlines are ``\\n`` and gzip headers carry no name or time.
    """
    path = Path(path)
    text = "".join(" ".join(vocab.decode(seq)) + "\n" for seq in seqs).encode("utf-8")
    if path.suffix == ".gz":
        text = gzip.compress(text, mtime=0)
    atomic_write(path, lambda f: f.write(text))


def read_split(path: str | os.PathLike[str], vocab: DyckVocab, m: int | None = None
               ) -> list[list[int]]:
    """Read a file written by :func:`write_split` (``.gz`` too) into lists of ids.

    Raises :class:`DataError` naming the file and line for an unreadable file, a blank line, an
    unknown or reserved token, or a line that does not end with (exactly one) ``END``.  With
    ``m``, every line must also be well-nested and at most ``m`` deep (as :func:`validate_file`
    checks), in the same single pass.
    """
    lines = _parse_lines(path, vocab) if m is None else _checked_lines(path, vocab, m)
    return [ids for _, ids in lines]


def _checked_lines(path: str | os.PathLike[str], vocab: DyckVocab, m: int
                   ) -> Iterator[tuple[int, list[int]]]:
    """:func:`_parse_lines`, raising DataError at the first line that is not Dyck-(k, m)."""
    _check_m(m)
    for lineno, ids in _parse_lines(path, vocab):
        problem = _structure_problem(ids, vocab, m)
        if problem:
            raise DataError(
                f"{where(path, lineno)}: not a Dyck-({vocab.k}, {m}) string: {problem}. Every line "
                f"must be well-nested, at most {m} deep, and end with {END} on an empty stack."
            )
        yield lineno, ids


def _iter_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(1-based line number, text without the newline) for each line of a text or .gz file."""
    lineno = 0
    if not os.path.lexists(path):
        raise DataError(f"{where(path)}: Dyck data file not found.")
    try:
        # a FIFO or a device is refused (open_regular), never waited on
        with os.fdopen(open_regular(path), "rb") as raw, \
                (gzip.GzipFile(fileobj=raw, mode="rb") if path.suffix == ".gz" else raw) as f:
            for lineno, raw_line in enumerate(f, start=1):
                try:
                    text = raw_line.decode("utf-8")
                except UnicodeDecodeError:
                    raise DataError(
                        f"{where(path, lineno)}: not UTF-8 text. Expected a Dyck data file with "
                        f"one space-separated bracket string per line, ending with {END}."
                    ) from None
                yield lineno, text.rstrip("\r\n")
    except (OSError, EOFError, zlib.error) as err:  # gzip.BadGzipFile is an OSError
        hint = ""
        if path.suffix == ".gz":
            hint = " It may be truncated or not really gzip-compressed; regenerate it."
        raise DataError(
            f"{where(path, lineno + 1 if lineno else None)}: cannot read the Dyck data file "
            f"({err}).{hint}"
        ) from None


def _parse_lines(
    path: str | os.PathLike[str], vocab: DyckVocab
) -> Iterator[tuple[int, list[int]]]:
    """(line number, ids) for each line, raising DataError at the first malformed line."""
    path = Path(path)
    n = 0
    for lineno, text in _iter_lines(path):
        n += 1
        problem, ids = _parse_line(text, vocab)
        if problem:
            raise DataError(
                f"{where(path, lineno)}: {problem}. Expected one Dyck-{vocab.k} string per line: "
                f"space-separated brackets such as '(a (b b) a)' followed by a single {END}."
            )
        yield lineno, ids
    if n == 0:
        raise DataError(f"{where(path)}: the file is empty; expected one Dyck string per line.")


def _parse_line(text: str, vocab: DyckVocab) -> tuple[str | None, list[int]]:
    """Token ids of one line, or a description of what is wrong with it."""
    tokens = text.split()
    if not tokens:
        return "blank line", []
    ids = []
    for pos, tok in enumerate(tokens, start=1):
        if tok in (PAD, START):
            return f"token {pos} is {tok!r}, which is reserved and never stored in data files", []
        try:
            ids.append(vocab.token_id(tok))
        except KeyError:
            return f"token {pos} {tok!r} is not in the Dyck-{vocab.k} vocabulary", []
    if ids[-1] != END_ID:
        return f"the line does not end with {END} (last token {tokens[-1]!r})", []
    if END_ID in ids[:-1]:
        return f"{END} appears before the end of the line (token {ids.index(END_ID) + 1})", []
    return None, ids


# ----------------------------------------------------------------------------------------------
# Validation and stack annotations


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


def _structure_problem(seq: Sequence[int], vocab: DyckVocab, m: int) -> str | None:
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


class _StatsCounter:
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
    _check_m(m)
    counter = _StatsCounter()
    for i, seq in enumerate(seqs):
        problem = _structure_problem(seq, vocab, m)
        if problem:
            raise DataError(f"sequence {i} (0-based) is not a Dyck-({k}, {m}) string: {problem}.")
        counter.add(seq, vocab)
    return counter.stats()


def validate_file(path: str | os.PathLike[str], k: int, m: int) -> DyckStats:
    """Check every line of a data file is a Dyck-(k, m) string ending with one ``END``.

    Lines are checked in order and the first offending one (1-based) is reported in a
    :class:`DataError`, whether the problem is a token (unknown, reserved, blank line, missing
    ``END``) or the nesting (unbalanced, mismatched, deeper than m).
    """
    vocab = DyckVocab(k)
    counter = _StatsCounter()
    for _, ids in _checked_lines(path, vocab, m):
        counter.add(ids, vocab)
    return counter.stats()
