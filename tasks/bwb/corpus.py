"""The One Billion Word Benchmark's files (Chelba et al. 2014), read as Józefowicz et al.'s code does.

Layout under the data directory (the benchmark's own tarball, r13output, unpacked into ``bwb/``):

    bwb/1b_word_vocab.txt                                       one "word count" per line
    bwb/training-monolingual.tokenized.shuffled/news.en-000NN-of-00100   NN = 01 .. 99
    bwb/heldout-monolingual.tokenized.shuffled/news.en.heldout-000NN-of-00050

One tokenised sentence per line, tokens separated by spaces; files may be gzipped (``.gz``).
The vocabulary file is the one of rafaljozefowicz/lm (``1b_word_vocab.txt``, 793,470 lines,
sorted by decreasing count, with ``<S>`` and ``<UNK>`` among them): word ids are line numbers,
so id order is frequency order, which the log-uniform sampler relies on.

A sentence is read as ``[<S>] + ids + [<S>]`` (``data_utils.Dataset._parse_sentence``), unknown
words as ``<UNK>``.  Concatenating sentences, the ``<S>`` closing one is the ``<S>`` opening the
next, so a stream of sentences is the token stream ``<S> w_1 .. w_n <S> v_1 .. v_m <S> ...`` and
every token after the first is predicted: a sentence of n words contributes n + 1 predictions.

Training (:class:`ShardWindowPlan`): an epoch visits the training shards in a random order; each
shard's sentences, shuffled (the public code shuffles the lines of every shard it loads), form
one token stream cut into ``batch_size`` contiguous rows walked in windows of ``num_steps``
(truncated BPTT, the state carried from window to window and across shards, never reset, as
Józefowicz et al. do).  Each window is addressed by (shard, window) so the plan is sized and
indexable without reading the shards; only the shard being trained on is held in memory
(its tail that fills no window, fewer than ``batch_size * (num_steps + 1)`` tokens, is skipped).

Evaluation (:func:`deal_windows`): ``data_utils.Dataset._iterate`` exactly — ``batch_size``
rows, each taking the next sentence of the file when its current one is used up, windows of
``num_steps`` with a 0/1 weight, zero-weight padding only at the very end — so every
prediction of the file is scored once.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from lstmablate.data import find_file, open_text
from lstmablate.errors import DataError, where

SENTENCE_BOUNDARY = "<S>"
UNKNOWN = "<UNK>"
TRAIN_DIR = "training-monolingual.tokenized.shuffled"
HELDOUT_DIR = "heldout-monolingual.tokenized.shuffled"
TRAIN_SHARD = re.compile(r"^news\.en-(\d{5})-of-(\d{5})(\.gz)?$")


def train_shard_name(i: int, of: int = 100) -> str:
    return f"news.en-{i:05d}-of-{of:05d}"


def heldout_shard_name(i: int, of: int = 50) -> str:
    return f"news.en.heldout-{i:05d}-of-{of:05d}"


# -- vocabulary ------------------------------------------------------------------------------

@dataclass
class Vocabulary:
    """Words in id order (the file's line order) and the ids of ``<S>`` and ``<UNK>``."""

    words: list[str]

    def __post_init__(self) -> None:
        self.stoi = {w: i for i, w in enumerate(self.words)}
        for special in (SENTENCE_BOUNDARY, UNKNOWN):
            if special not in self.stoi:
                raise DataError(f"the vocabulary has no {special!r}; the Billion Word vocabulary "
                                f"(1b_word_vocab.txt of rafaljozefowicz/lm) lists both "
                                f"{SENTENCE_BOUNDARY!r} and {UNKNOWN!r}.")
        self.s_id = self.stoi[SENTENCE_BOUNDARY]
        self.unk_id = self.stoi[UNKNOWN]

    def __len__(self) -> int:
        return len(self.words)

    def encode(self, words: Iterable[str]) -> list[int]:
        stoi, unk = self.stoi, self.unk_id
        return [stoi.get(w, unk) for w in words]

    def sentence(self, line: str) -> list[int]:
        """``[<S>] + ids + [<S>]`` of one line (``_parse_sentence``)."""
        return [self.s_id, *self.encode(line.split()), self.s_id]


def read_vocab(path: Path) -> Vocabulary:
    """Read a ``word count`` per line file, sorted by non-increasing count (checked: the
    log-uniform sampler assumes id order is frequency order)."""
    words: list[str] = []
    seen: dict[str, int] = {}
    prev = None
    with open_text(path) as f:
        for lineno, line in enumerate(f, 1):
            parts = line.split()
            if len(parts) != 2 or not parts[1].isdigit():
                raise DataError(f"{where(path, lineno)}: expected 'word count' (a word, a space, a "
                                f"non-negative integer), got {line.rstrip()!r}.")
            word, count = parts[0], int(parts[1])
            if word in seen:
                raise DataError(f"{where(path, lineno)}: the word {word!r} is listed again (first "
                                f"on line {seen[word]}); each word must appear once.")
            if prev is not None and count > prev:
                raise DataError(
                    f"{where(path, lineno)}: count {count} is larger than the previous line's "
                    f"{prev}; the vocabulary must be sorted by decreasing count, because word ids "
                    f"are ranks for the log-uniform (Zipfian) sampler.")
            seen[word] = lineno
            words.append(word)
            prev = count
    if not words:
        raise DataError(f"{path}: the vocabulary file is empty.")
    try:
        return Vocabulary(words)
    except DataError as e:
        raise DataError(f"{path}: {e}") from None


# -- shards ----------------------------------------------------------------------------------

def list_train_shards(root: Path) -> list[Path]:
    """The training shards under ``root/training-monolingual.tokenized.shuffled`` in name order."""
    folder = root / TRAIN_DIR
    if not folder.is_dir():
        raise DataError(f"{folder}: no such folder; expected the Billion Word benchmark's "
                        f"{TRAIN_DIR}/news.en-000NN-of-00100 training shards there.")
    shards = sorted(p for p in folder.iterdir() if TRAIN_SHARD.match(p.name))
    if not shards:
        raise DataError(f"{folder}: no training shard (news.en-000NN-of-00100) found.")
    return shards


def heldout_path(data_dir: Path, root: str, index: int) -> Path:
    """Held-out shard ``index`` under ``data_dir/root`` (plain or .gz; DataError with the
    catalogue's download hint if missing)."""
    return find_file(data_dir, f"{root}/{HELDOUT_DIR}/{heldout_shard_name(index)}")


def read_lines(path: Path) -> Iterator[str]:
    """The lines of a shard, streamed (plain or .gz, strict UTF-8 via lstmablate.data).  Every
    line is a sentence, an empty one too (``[<S>, <S>]``: one prediction), as in the public code."""
    with open_text(path) as f:
        yield from f


def shard_stats(path: Path) -> tuple[int, int]:
    """(sentences, tokens of the shard's token stream) — tokens = sum(words + 1) + 1."""
    sentences, tokens = 0, 1
    for line in read_lines(path):
        sentences += 1
        tokens += len(line.split()) + 1
    return sentences, (tokens if sentences else 0)


def shard_stream(path: Path, vocab: Vocabulary, seed: int | None) -> Tensor:
    """The token stream of one shard (int32), its sentences in a random order drawn from
    ``seed`` (None: file order)."""
    sentences = [vocab.encode(line.split()) for line in read_lines(path)]
    if not sentences:
        return torch.zeros(0, dtype=torch.int32)
    order = range(len(sentences)) if seed is None else \
        torch.randperm(len(sentences), generator=torch.Generator().manual_seed(seed)).tolist()
    s = vocab.s_id
    ids: list[int] = []
    for i in order:
        ids.append(s)
        ids.extend(sentences[i])
    ids.append(s)
    return torch.tensor(ids, dtype=torch.int32)


def windows_in(tokens: int, batch_size: int, num_steps: int) -> int:
    """Windows of a ``tokens``-long stream cut into ``batch_size`` rows (PTB's epoch_size)."""
    return max(0, ((tokens // batch_size) - 1) // num_steps)


@dataclass(frozen=True)
class Window:
    """Minibatch ``index`` of the shard at ``shard_pos`` of the epoch's shard order."""

    shard_pos: int
    index: int


class ShardWindowPlan(Sequence):
    """One epoch of training windows: ``plan[i] -> (x, y, w)``, each (batch_size, num_steps).

    ``shards``: (path, tokens) per training shard; ``order``: the epoch's shard order;
    ``seeds``: the sentence-shuffling seed per shard position.  Built without reading any
    shard; ``plan[i]`` loads the shard it needs (one shard in memory at a time).
    """

    def __init__(self, shards: Sequence[tuple[Path, int]], order: Sequence[int],
                 seeds: Sequence[int | None], vocab: Vocabulary, batch_size: int, num_steps: int):
        self.shards, self.order, self.seeds = list(shards), list(order), list(seeds)
        self.vocab, self.batch_size, self.num_steps = vocab, batch_size, num_steps
        self.counts = [windows_in(self.shards[j][1], batch_size, num_steps) for j in self.order]
        self.starts = [0]
        for c in self.counts:
            self.starts.append(self.starts[-1] + c)
        self._loaded: tuple[int, Tensor] | None = None  # (shard position, rows)

    def __len__(self) -> int:
        return self.starts[-1]

    def locate(self, i: int) -> Window:
        if not 0 <= i < len(self):
            raise IndexError(f"window {i} of {len(self)}")
        pos = bisect.bisect_right(self.starts, i) - 1
        return Window(pos, i - self.starts[pos])

    def rows(self, pos: int) -> Tensor:
        """(batch_size, L) contiguous rows of the shard at position ``pos`` (cached)."""
        if self._loaded is None or self._loaded[0] != pos:
            path, tokens = self.shards[self.order[pos]]
            stream = shard_stream(path, self.vocab, self.seeds[pos])
            if stream.numel() != tokens:
                raise DataError(f"{path}: {stream.numel()} tokens now, {tokens} when the run "
                                f"counted them; the training data changed under the run.")
            L = stream.numel() // self.batch_size
            self._loaded = (pos, stream[: self.batch_size * L].view(self.batch_size, L))
        return self._loaded[1]

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor, Tensor]:  # type: ignore[override]
        win = self.locate(i)
        rows = self.rows(win.shard_pos)
        lo = win.index * self.num_steps
        x = rows[:, lo:lo + self.num_steps].long()
        y = rows[:, lo + 1:lo + self.num_steps + 1].long()
        return x, y, torch.ones_like(x, dtype=torch.float32)


# -- evaluation ------------------------------------------------------------------------------

def deal_windows(sentences: Iterable[list[int]], batch_size: int, num_steps: int,
                 s_id: int, positions: bool = False) -> Iterator[tuple[Tensor, ...]]:
    """``data_utils.Dataset._iterate``: ``(x, y, w)`` windows over sentences dealt to rows.

    ``sentences``: word ids of each sentence (without ``<S>``).  Each row holds the rest of its
    current ``[<S>] + ids + [<S>]``; when one token or fewer is left, the row takes the next
    sentence.  Positions left empty once the sentences run out have weight 0.  With
    ``positions``, a fourth tensor (batch_size, num_steps, 2) says which prediction each
    position is: (sentence number, index of the target in its ``[<S>] + ids + [<S>]``), -1
    where the weight is 0.
    """
    it = iter(sentences)
    streams: list[list[int] | None] = [None] * batch_size
    where = [(-1, 0)] * batch_size  # per row: (sentence number, tokens of it consumed)
    count, exhausted = 0, False
    while True:
        x = torch.zeros(batch_size, num_steps, dtype=torch.long)
        y = torch.zeros(batch_size, num_steps, dtype=torch.long)
        w = torch.zeros(batch_size, num_steps, dtype=torch.float32)
        pos = torch.full((batch_size, num_steps, 2), -1, dtype=torch.long)
        for r in range(batch_size):
            filled = 0
            while filled < num_steps:
                cur = streams[r]
                if cur is None or len(cur) <= 1:
                    if exhausted:
                        break
                    nxt = next(it, None)
                    if nxt is None:
                        exhausted = True
                        break
                    cur = streams[r] = [s_id, *nxt, s_id]
                    where[r] = (count, 0)
                    count += 1
                n = min(len(cur) - 1, num_steps - filled)
                x[r, filled:filled + n] = torch.tensor(cur[:n])
                y[r, filled:filled + n] = torch.tensor(cur[1:n + 1])
                w[r, filled:filled + n] = 1.0
                sent, done = where[r]
                pos[r, filled:filled + n, 0] = sent
                pos[r, filled:filled + n, 1] = torch.arange(done + 1, done + n + 1)
                where[r] = (sent, done + n)
                streams[r] = cur[n:]
                filled += n
        if not bool(w.any()):
            return
        yield (x, y, w, pos) if positions else (x, y, w)
