"""Sampling the m-bounded Dyck-k language, Dyck-(k, m), into train/dev/test corpora.

Dyck-(k, m) is the set of well-nested strings over k bracket types whose nesting depth never
exceeds m (Hewitt, Hahn, Ganguli, Liang & Manning, EMNLP 2020).  This module reproduces the
data side of their public code (john-hewitt/dyckkm-learning, ``generate_mbounded_dyck.py``);
the second-order report (Renganathan & Singh, §5.1) uses the same language.

The language itself (vocabulary, structure, stack annotations) is :mod:`.language`; the
corpus files are :mod:`.files`.

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
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from pathlib import Path

from .files import write_split
from .language import END_ID, DyckVocab, check_m

SPLITS = ("train", "dev", "test")
#: Added to ``10_000 * seed`` to get each split's random seed (see :func:`split_seed`).
SPLIT_SEED_OFFSETS = {"train": 1, "dev": 1000, "test": 2000}

#: Hewitt et al.'s dev and test corpus sizes, in tokens.
DEFAULT_DEV_TOKENS = 20_000
DEFAULT_TEST_TOKENS = 300_000


# ----------------------------------------------------------------------------------------------
# Sampling


def default_lengths(m: int) -> dict[str, tuple[int, int]]:
    """Hewitt et al.'s ``(min_length, max_length)`` per split for depth bound ``m``.

    Train and dev: ``(1, 8·m·(m−2) + 60)``; test: ``(train_max + 1, 2·train_max)``, so every
    test string is strictly longer than every training string (m=3: 1–84 and 85–168).
    """
    check_m(m)
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
    check_m(m)
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


def _check_lengths(min_length: int, max_length: int) -> None:
    # The bracket count before END is even and at least min_length (0 allows the bare "END").
    shortest = min_length + (min_length % 2)
    if min_length < 0 or shortest + 1 > max_length:
        raise ValueError(
            f"no Dyck string fits min_length={min_length}, max_length={max_length}: a string "
            f"has an even number >= min_length of brackets plus END, so max_length must be at "
            f"least {shortest + 1}"
        )
