"""Penn Treebank data, exactly as the TensorFlow PTB tutorial's ``reader.py``.

Files: Mikolov's LM version of PTB, ``ptb/ptb.{train,valid,test}.txt`` under
the data directory (``.gz`` accepted; see ``data/README.md``).

Word level (``level="word"``)
    Every line becomes its whitespace-separated words followed by ``<eos>``
    (the tutorial replaces each newline by ``<eos>`` and splits on
    whitespace, which is the same thing on these files: every line begins
    and ends with a space and ends with a newline). The vocabulary is built
    from the *training* file only, sorted by decreasing frequency, ties
    broken alphabetically (code-point order), so id 0 is the most frequent
    token. Real PTB has exactly 10,000 types; ``<unk>`` is already a word in
    the files and nothing is added. The tutorial silently drops words of
    valid/test missing from the vocabulary; real PTB has none, so here such
    a word is an error (DataError naming file and line) rather than a silent
    change of the evaluation data.

Character level (``level="char"``)
    Derived from the word files exactly as Mikolov's ``ptb.char.*.txt``:
    the characters of a line, separated by spaces, with ``_`` where the word
    file has a word boundary. Facts established from public copies (a
    quoted excerpt of ptb.char.train.txt, and its size of 9.57 MiB, which
    equals ``" " + " ".join(chars) + " " + "\\n"`` summed over the lines of
    ptb.train.txt, 10,034,964 bytes):

    * no ``_`` at the start or end of a line (only between words), and the
      file line, like the word file's, starts and ends with a space;
    * ``<unk>`` is spelt out as the five characters ``< u n k >``;
    * ``N`` (the number token) stays the single character ``N``.

    We then add one ``<eos>`` token per line, as for words (Mikolov's file
    has only the newline). This gives 49 characters + ``<eos>`` = 50
    symbols and 5,017,482 training tokens (4,975,414 characters + 42,068
    ``<eos>``). Metric: bits per character, :func:`bits_per_char`, which
    counts the ``<eos>`` predictions like any other symbol.

Batching
    :func:`stream_batches` is the tutorial's ``ptb_producer``: the 1-D token
    stream is cut into ``batch_size`` contiguous rows (the remainder is
    dropped), ``epoch_size = ((len // batch_size) - 1) // num_steps``, and
    minibatch ``i`` is ``rows[:, i*num_steps:(i+1)*num_steps]`` with the
    target shifted one to the right. Consecutive minibatches continue each
    row, so a model can carry its state across them (truncated BPTT).
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from lstmablate.data import DATASETS, check_file, find_file, read_lines, resolve_data_dir
from lstmablate.errors import ConfigError, DataError, UnknownNameError, where

__all__ = [
    "EOS",
    "WORD_BOUNDARY",
    "LEVELS",
    "SPLITS",
    "FILES",
    "PTBCorpus",
    "line_tokens",
    "char_line",
    "build_vocab",
    "load_corpus",
    "num_batches",
    "stream_batches",
    "perplexity",
    "bits_per_char",
]

#: End-of-line token, one per line at both levels.
EOS = "<eos>"
#: Character that stands for a word boundary at character level (Mikolov's ptb.char.*).
WORD_BOUNDARY = "_"
LEVELS = ("word", "char")
SPLITS = ("train", "valid", "test")
#: Path of each split's word file, relative to the data directory.
FILES = {split: f"ptb/ptb.{split}.txt" for split in SPLITS}


def _check_level(level: str) -> None:
    if level not in LEVELS:
        raise UnknownNameError("PTB level", level, LEVELS)


def line_tokens(line: str, level: str = "word") -> list[str]:
    """The tokens one line of a PTB word file contributes, ``<eos>`` included.

    >>> line_tokens(" the <unk> rose N % \\n")
    ['the', '<unk>', 'rose', 'N', '%', '<eos>']
    >>> line_tokens(" a <unk> \\n", "char")
    ['a', '_', '<', 'u', 'n', 'k', '>', '<eos>']
    """
    words = line.split()
    if level == "word":
        return words + [EOS]
    _check_level(level)
    return list(WORD_BOUNDARY.join(words)) + [EOS]


def char_line(line: str) -> str:
    """The line of Mikolov's ``ptb.char.*.txt`` that corresponds to ``line`` of the word
    file, without the newline: ``" aer banknote "`` -> ``" a e r _ b a n k n o t e "``.
    """
    return " " + " ".join(WORD_BOUNDARY.join(line.split())) + " "


def build_vocab(tokens: Iterable[str]) -> list[str]:
    """Token types sorted by decreasing count, ties alphabetically (the tutorial's order).

    The position in the list is the token id.
    """
    counts = Counter(tokens)
    return [tok for tok, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]


@dataclass
class PTBCorpus:
    """PTB as three 1-D ``torch.long`` token-id streams and their vocabulary.

    ``vocab[i]`` is the token with id ``i``; ``stoi`` is the inverse mapping.
    ``files`` records the file each split was read from.
    """

    level: str
    vocab: list[str]
    stoi: dict[str, int]
    train: torch.Tensor
    valid: torch.Tensor
    test: torch.Tensor
    files: dict[str, Path] = field(default_factory=dict)

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    @property
    def eos_id(self) -> int:
        return self.stoi[EOS]

    def split(self, name: str) -> torch.Tensor:
        """The stream of split ``name`` (``train``, ``valid`` or ``test``)."""
        if name not in SPLITS:
            raise UnknownNameError("PTB split", name, SPLITS)
        return getattr(self, name)

    def decode(self, ids: Iterable[int] | torch.Tensor) -> list[str]:
        """Token strings of ``ids``."""
        if isinstance(ids, torch.Tensor):
            ids = ids.reshape(-1).tolist()
        return [self.vocab[i] for i in ids]


def _encode(lines: Sequence[str], stoi: dict[str, int], level: str, path: Path,
            train_path: Path) -> torch.Tensor:
    ids: list[int] = []
    for lineno, line in enumerate(lines, 1):
        toks = line_tokens(line, level)
        try:
            ids.extend([stoi[t] for t in toks])
        except KeyError:
            bad = next(t for t in toks if t not in stoi)
            unit = "word" if level == "word" else "character"
            raise DataError(
                f"{where(path, lineno)}: the {unit} {bad!r} does not occur in the training "
                f"file {train_path}, so it has no id. Mikolov's PTB has no such {unit}s "
                f"(rare words are already <unk>); expected the files of one PTB distribution "
                f"(see data/README.md), not files from different sources."
            ) from None
    return torch.tensor(ids, dtype=torch.long)


def load_corpus(data_dir: str | os.PathLike[str] | None = None, level: str = "word",
                verify: bool = True) -> PTBCorpus:
    """Read ``ptb/ptb.{train,valid,test}.txt`` (or ``.gz``) from ``data_dir``.

    ``data_dir`` None means the usual resolution (``$LSTMABLATE_DATA``, then
    ``./data``). With ``verify`` (the default) each file's checksum must match
    the catalogue in :mod:`lstmablate.data`; pass ``verify=False`` for other
    text in the same format (test fixtures). ``level`` is ``"word"`` or
    ``"char"`` (see the module docstring).
    """
    _check_level(level)
    # An explicit directory is used as given (already resolved by the CLI, which
    # recorded how it was chosen); None means the usual resolution.
    base = resolve_data_dir() if data_dir is None else Path(data_dir)
    catalogue = DATASETS["ptb"]
    paths = {split: find_file(base, FILES[split]) for split in SPLITS}
    if verify:
        for split in SPLITS:
            check_file(paths[split], catalogue.file(FILES[split]))
    lines = {split: read_lines(paths[split]) for split in SPLITS}
    train_tokens = [tok for line in lines["train"] for tok in line_tokens(line, level)]
    vocab = build_vocab(train_tokens)
    stoi = {tok: i for i, tok in enumerate(vocab)}
    streams = {
        split: _encode(lines[split], stoi, level, paths[split], paths["train"])
        for split in SPLITS
    }
    return PTBCorpus(level, vocab, stoi, streams["train"], streams["valid"], streams["test"],
                     files=paths)


def num_batches(length: int, batch_size: int, num_steps: int) -> int:
    """Minibatches per epoch for a stream of ``length`` tokens: the tutorial's
    ``epoch_size = ((length // batch_size) - 1) // num_steps`` (0 if negative)."""
    if batch_size < 1 or num_steps < 1:
        raise ConfigError(f"batch_size and num_steps must be at least 1, got "
                          f"batch_size={batch_size}, num_steps={num_steps}.")
    return max(0, ((length // batch_size) - 1) // num_steps)


def stream_batches(data: torch.Tensor, batch_size: int, num_steps: int,
                   start: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Yield ``(x, y)`` minibatches, each ``(batch_size, num_steps)``, of a 1-D stream.

    The tutorial's ``ptb_producer`` (see the module docstring); ``y`` is ``x``
    shifted by one token. ``start=i`` resumes at minibatch ``i`` (the same as
    skipping the first ``i``); ``start == num_batches(...)`` yields nothing.
    """
    if data.dim() != 1:
        raise ValueError(f"stream_batches expects a 1-D token stream, got shape "
                         f"{tuple(data.shape)}.")
    epoch_size = num_batches(data.numel(), batch_size, num_steps)
    if epoch_size == 0:
        raise ConfigError(
            f"a stream of {data.numel()} tokens gives no minibatch of batch_size={batch_size} "
            f"x num_steps={num_steps} (it needs at least batch_size * (num_steps + 1) = "
            f"{batch_size * (num_steps + 1)} tokens); decrease batch_size or num_steps."
        )
    if not 0 <= start <= epoch_size:
        raise ValueError(f"start={start} is outside 0..{epoch_size}, the number of minibatches "
                         f"of this stream with batch_size={batch_size}, num_steps={num_steps}.")
    batch_len = data.numel() // batch_size
    rows = data[: batch_size * batch_len].view(batch_size, batch_len)
    for i in range(start, epoch_size):
        lo = i * num_steps
        x = rows[:, lo: lo + num_steps].contiguous()
        y = rows[:, lo + 1: lo + num_steps + 1].contiguous()
        yield x, y


def perplexity(mean_nll_nats: float) -> float:
    """Word-level metric: ``exp`` of the mean per-token negative log-likelihood (nats)."""
    try:
        return math.exp(float(mean_nll_nats))
    except OverflowError:
        return math.inf


def bits_per_char(mean_nll_nats: float) -> float:
    """Character-level metric: the mean per-character NLL converted from nats to bits."""
    return float(mean_nll_nats) / math.log(2)
