"""The ``bwb`` task plugin: the One Billion Word Benchmark (Chelba et al. 2014) as Józefowicz et
al. (2016) train it, with any registered cell — the Billion Word row of Levy et al.'s earlier
draft (Levy et al., the earlier version of the ACL 2018 paper, Table 1: LSTM-2048-512, 5 epochs).

Data (:mod:`lstmablate_tasks.bwb.corpus`): the benchmark's training shards, held-out shard 0 as
the test set (as the public code's ``eval_test`` mode), held-out shard 1 as our development set
(model selection; the public code has none), and the 793,470-word vocabulary file.

Artefacts (built from the training data, kept with the run): the vocabulary in id order and the
size of every training shard's token stream (one counting pass over the shards), so that every
epoch's plan of windows is known without reading the shards again.

Model (:mod:`lstmablate_tasks.bwb.model`): embedding 512 -> cell (2048 units, ``proj_size`` 512)
-> softmax over the vocabulary: sampled softmax (8,192 log-uniform candidates, logQ-corrected,
accidental hits removed) while training, full softmax in evaluation.

Loss: ``num_steps`` x the mean NLL over the batch's positions (``_backward``: ``loss * num_steps``),
i.e. the sum over the window's time steps of the batch-mean NLL, as the PTB tutorial's cost.

Metrics: ``ppl`` = exp(total NLL / predictions) over every prediction of the split (``<S>`` closing
each sentence included), ``nll`` (nats/token), ``tokens``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from lstmablate.config import MAX_BATCH, MAX_BATCH_TOKENS, MAX_LAYERS, MAX_WIDTH
from lstmablate.data import DataFile, Dataset, find_file
from lstmablate.errors import ConfigError, DataError
from lstmablate.task import ItemMetric, Metric, StepOutput, Task
from ..lm_scores import lm_item_metrics, sentence_records

from . import corpus
from .model import BWBLanguageModel, detach_state, state_to

#: The vocabulary of rafaljozefowicz/lm (1b_word_vocab.txt) has 793,470 words.
BWB_VOCAB_SIZE = 793_470
BWB_TARBALL = ("http://www.statmt.org/lm-benchmark/"
               "1-billion-word-language-modeling-benchmark-r13output.tar.gz")
BWB_VOCAB_URL = "https://raw.githubusercontent.com/rafaljozefowicz/lm/master/1b_word_vocab.txt"

# Checksums of these files were not available here (the data could not be downloaded); the
# catalogue lists the files without them, and `lstmablate data check bwb` reports them unchecked.
BWB_DATASET = Dataset(
    name="bwb",
    files=(
        DataFile("bwb/1b_word_vocab.txt", None, None, url=BWB_VOCAB_URL,
                 note="793,470 'word count' lines (rafaljozefowicz/lm)"),
        *(DataFile(f"bwb/{corpus.TRAIN_DIR}/{corpus.train_shard_name(i)}", None, None,
                   note="training shard") for i in range(1, 100)),
        DataFile(f"bwb/{corpus.HELDOUT_DIR}/{corpus.heldout_shard_name(0)}", None, None,
                 note="test set"),
        DataFile(f"bwb/{corpus.HELDOUT_DIR}/{corpus.heldout_shard_name(1)}", None, None,
                 note="development set (model selection)"),
    ),
    url=BWB_TARBALL,
    licence="Apache 2.0 (the benchmark's scripts); the text is from the WMT11 news crawl",
    fetch_hint=(f"download and unpack {BWB_TARBALL} (about 1.7 GB, 4 GB unpacked) so that its "
                "training-monolingual.tokenized.shuffled/ and heldout-monolingual.tokenized."
                f"shuffled/ folders are under <data dir>/bwb/, and save {BWB_VOCAB_URL} as "
                "<data dir>/bwb/1b_word_vocab.txt"),
)


def _plain_name(path: Path) -> str:
    return path.name[:-3] if path.name.endswith(".gz") else path.name


@dataclass
class BWBData:
    root: str = "bwb"  # folder under the data directory holding the benchmark
    vocab_file: str = "1b_word_vocab.txt"
    vocab_size: int = BWB_VOCAB_SIZE  # expected number of words; 0 = do not check
    # rafaljozefowicz/lm README: batch_size=128, num_steps=20 (Józefowicz et al. 2016, §5.1: 128,
    # unrolled 20 steps).  The GLOBAL batch: each of N processes trains on batch_size / N rows;
    # "128 per GPU" on N GPUs is batch_size = 128 * N.
    batch_size: int = 128
    num_steps: int = 20
    train_shards: int = 0  # use only the first n training shards (0 = all 99)
    dev_shard: int = 1     # held-out shard for model selection
    test_shard: int = 0    # held-out shard 0 is the benchmark's test set

    #: the largest values that size memory (checked with the other values)
    upper_bounds: ClassVar[dict[str, int]] = {
        "batch_size": MAX_BATCH, "num_steps": MAX_BATCH_TOKENS}

    def validate(self) -> None:
        for name in ("batch_size", "num_steps"):
            if getattr(self, name) < 1:
                raise ConfigError(f"data.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("vocab_size", "train_shards"):
            if getattr(self, name) < 0:
                raise ConfigError(f"data.{name} must be >= 0, got {getattr(self, name)}")
        for name in ("dev_shard", "test_shard"):
            if not 0 <= getattr(self, name) < 50:
                raise ConfigError(f"data.{name} must be a held-out shard number 0..49, "
                                  f"got {getattr(self, name)}")


@dataclass
class BWBModel:
    emb_size: int = 512       # rafaljozefowicz/lm: emb_size=512
    hidden_size: int = 2048   # state_size=2048
    proj_size: int = 512      # projected_size=512 ("LSTM-2048-512")
    num_layers: int = 1       # num_layers=1
    dropout: float = 0.1      # 1 - keep_prob (keep_prob=0.9), before and after every layer
    num_sampled: int = 8192   # num_sampled=8192 (0: full softmax in training too)
    unique_samples: bool = True  # tf.nn.sampled_softmax_loss's sampler default
    emb_grad_scale: float = 128.0  # _backward: embedding gradient x per-GPU batch size (128)
    softmax_shards: int = 8   # num_shards=8: sets the initialisation scale
    # sparse gradients for the embedding and softmax matrices (sgd/adagrad, one process or gloo;
    # NCCL data-parallel training needs them dense)
    sparse_grads: bool = False
    cell_options: dict[str, Any] = field(default_factory=lambda: {"forget_bias": 1.0})

    #: the largest values that size memory (checked with the other values)
    upper_bounds: ClassVar[dict[str, int]] = {
        "emb_size": MAX_WIDTH, "hidden_size": MAX_WIDTH, "proj_size": MAX_WIDTH,
        "num_layers": MAX_LAYERS, "num_sampled": 100_000, "softmax_shards": 1024}

    def validate(self) -> None:
        for name in ("emb_size", "hidden_size", "num_layers", "softmax_shards"):
            if getattr(self, name) < 1:
                raise ConfigError(f"model.{name} must be >= 1, got {getattr(self, name)}")
        if self.proj_size < 0 or (self.proj_size and self.proj_size >= self.hidden_size):
            raise ConfigError(f"model.proj_size must be 0 (none) or in [1, hidden_size), "
                              f"got {self.proj_size}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.dropout must be in [0, 1), got {self.dropout}")
        if self.num_sampled < 0:
            raise ConfigError(f"model.num_sampled must be >= 0, got {self.num_sampled}")
        if not math.isfinite(self.emb_grad_scale) or self.emb_grad_scale <= 0:
            raise ConfigError(f"model.emb_grad_scale must be > 0, got {self.emb_grad_scale}")


@dataclass
class BWBEval:
    batch_size: int = 128  # the public code evaluates with the default batch (128 x 20)
    num_steps: int = 20
    softmax_chunk: int = 256  # positions per full-softmax product (chunk x V logits in memory)
    max_sentences: int = 0    # score only the first n sentences of a split (0 = all)

    #: the largest values that size memory (checked with the other values)
    upper_bounds: ClassVar[dict[str, int]] = {
        "batch_size": MAX_BATCH, "num_steps": MAX_BATCH_TOKENS, "softmax_chunk": 4096}

    def validate(self) -> None:
        for name in ("batch_size", "num_steps", "softmax_chunk"):
            if getattr(self, name) < 1:
                raise ConfigError(f"eval.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_sentences < 0:
            raise ConfigError(f"eval.max_sentences must be >= 0, got {self.max_sentences}")


class BillionWordTask(Task):
    name = "bwb"
    description = ("One Billion Word Benchmark LM (Józefowicz et al. 2016, LSTM-2048-512): "
                   "perplexity on held-out shard 0, sampled softmax in training")
    DataConfig = BWBData
    ModelConfig = BWBModel
    EvalConfig = BWBEval
    datasets = (BWB_DATASET,)
    # Józefowicz et al. 2016 §5.1 and rafaljozefowicz/lm: Adagrad, lr 0.2 (initial accumulator
    # 1.0 in the code); 5 epochs in Levy et al.'s draft.  See recipes/bwb-lstm-2048-512.yaml.
    train_defaults = {"optimizer": "adagrad", "lr": 0.2, "schedule": "constant", "clip_norm": 0.0,
                      "max_epochs": 5}
    metrics = (
        Metric("ppl", False, "perplexity", ".2f"),
        Metric("nll", False, "NLL (nats/token)", ".4f"),
    )
    primary = metrics[0]
    dev_split = "dev"
    test_split = "test"

    # -- data ----------------------------------------------------------------------------
    @property
    def root(self) -> Path:
        return self.data_dir / self.data_cfg.root

    def _needed(self) -> list[str]:
        """The files this config reads, relative to ``data.root``: the vocabulary, the
        training shards used, the dev and test shards."""
        d = self.data_cfg
        n = d.train_shards or 99
        return [d.vocab_file,
                *(f"{corpus.TRAIN_DIR}/{corpus.train_shard_name(i)}" for i in range(1, n + 1)),
                f"{corpus.HELDOUT_DIR}/{corpus.heldout_shard_name(d.dev_shard)}",
                f"{corpus.HELDOUT_DIR}/{corpus.heldout_shard_name(d.test_shard)}"]

    def required_files(self) -> list[str]:
        return [f"{self.data_cfg.root}/{rel}" for rel in self._needed()]

    def check_data(self) -> list[str]:
        """The files this config reads are present; no checksums are known for them."""
        d = self.data_cfg
        needed = self._needed()
        found, missing = [], []
        for rel in needed:
            try:
                found.append(f"{find_file(self.data_dir, f'{d.root}/{rel}')}: present "
                             "(no checksum known)")
            except DataError:
                missing.append(rel)
        if missing:
            shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4
                                              else "")
            raise DataError(f"the Billion Word data under {self.root} is incomplete: {len(missing)} "
                            f"of {len(needed)} files missing ({shown}). To get it: "
                            f"{BWB_DATASET.fetch_hint}.")
        return found

    def _vocab_path(self) -> Path:
        return find_file(self.data_dir, f"{self.data_cfg.root}/{self.data_cfg.vocab_file}")

    def _train_shards(self) -> list[Path]:
        shards = corpus.list_train_shards(self.root)
        n = self.data_cfg.train_shards
        if n:
            if n > len(shards):
                raise ConfigError(f"data.train_shards={n}, but {self.root / corpus.TRAIN_DIR} has "
                                  f"only {len(shards)} training shards.")
            shards = shards[:n]
        return shards

    def build_artefacts(self) -> dict[str, Any]:
        """The vocabulary (id order) and every training shard's token count (one pass)."""
        vocab = corpus.read_vocab(self._vocab_path())
        shards = []
        for path in self._train_shards():
            sentences, tokens = corpus.shard_stats(path)
            if tokens - sentences - 1 <= 0:  # (tokens: the words, an <S> per sentence and one)
                raise DataError(f"{path}: the training shard holds no word ({sentences:,} lines, "
                                "all blank); a Billion Word shard holds one sentence per line. "
                                "The file is damaged or not the benchmark's: fetch it again, "
                                "or move it out of the training folder.")
            shards.append({"file": _plain_name(path), "sentences": sentences, "tokens": tokens})
        return {"vocab": vocab.words, "shards": shards}

    def use_artefacts(self, artefacts: dict[str, Any]) -> None:
        super().use_artefacts(artefacts)
        self.vocab = corpus.Vocabulary(list(artefacts["vocab"]))
        self.shard_tokens = {s["file"]: int(s["tokens"]) for s in artefacts.get("shards", [])}
        expected = self.data_cfg.vocab_size
        if expected and len(self.vocab) != expected:
            raise DataError(f"the vocabulary {self.data_cfg.root}/{self.data_cfg.vocab_file} under "
                            f"{self.data_dir} has {len(self.vocab)} words, but data.vocab_size="
                            f"{expected} (the Billion Word vocabulary has {BWB_VOCAB_SIZE}; set "
                            "data.vocab_size=0 to not check).")

    def setup(self, splits: Sequence[str] = ("train", "dev", "test")) -> None:
        d = self.data_cfg
        self.paths: dict[str, Any] = {}
        if "train" in splits:
            shards = []
            for path in self._train_shards():
                key = _plain_name(path)  # the same shard, plain or gzipped
                if key not in self.shard_tokens:
                    raise DataError(f"{path}: this training shard was not counted when the run "
                                    "started (artefacts/); the training data changed under the run.")
                shards.append((path, self.shard_tokens[key]))
            self.train_shards = shards
            if sum(corpus.windows_in(t, d.batch_size, d.num_steps) for _, t in shards) == 0:
                raise ConfigError(f"the training shards give no window of batch_size="
                                  f"{d.batch_size} x num_steps={d.num_steps}; decrease them.")
        for split, index in (("dev", d.dev_shard), ("test", d.test_shard)):
            if split in splits:
                path = self.paths[split] = corpus.heldout_path(self.data_dir, d.root, index)
                # read through once (UTF-8 checked) before training, not after it: an empty or
                # damaged held-out shard would otherwise end a finished run without a result
                if sum(bool(line.strip()) for line in corpus.read_lines(path)) == 0:
                    raise DataError(f"{path} (the {split} split, data.{split}_shard={index}) is "
                                    "empty or blank (no word on any line); a held-out shard "
                                    "holds one sentence per line.")

    def train_plan(self, epoch: int, generator: torch.Generator) -> Sequence[Any]:
        """The epoch's windows: shards in a random order, each shard's sentences shuffled."""
        d = self.data_cfg
        order = torch.randperm(len(self.train_shards), generator=generator).tolist()
        seeds = torch.randint(0, 2**62, (len(order),), generator=generator).tolist()
        return corpus.ShardWindowPlan(self.train_shards, order, seeds, self.vocab,
                                      d.batch_size, d.num_steps)

    # -- model ---------------------------------------------------------------------------------
    def build_model(self, make_encoder) -> nn.Module:
        m = self.model_cfg
        options = dict(m.cell_options)
        if m.proj_size:
            options["proj_size"] = m.proj_size
        enc = make_encoder(m.emb_size, m.hidden_size, num_layers=m.num_layers,
                           dropout=m.dropout, **options)
        model = BWBLanguageModel(len(self.vocab), m.emb_size, enc, m.dropout, m.num_sampled,
                                 emb_grad_scale=m.emb_grad_scale, softmax_shards=m.softmax_shards,
                                 unique_samples=m.unique_samples, sparse_grads=m.sparse_grads)
        model.init_weights()
        return model

    def init_carry(self, model: nn.Module) -> Any:
        return None  # zeros

    def loss(self, model: nn.Module, batch: Any, carry: Any) -> StepOutput:
        x, y, w = batch
        nll, final = model(x, y, state_to(carry, x.device))
        # _forward/_backward: mean over the batch's positions of nll * w, times num_steps (the
        # training windows have no padding, w = 1); a mean over w.numel() positions, which is
        # the weight data-parallel training needs
        per_token = (nll * w).sum() / w.numel()
        return StepOutput(per_token * x.shape[1], detach_state(final), float(w.numel()),
                          logged=per_token)

    # -- evaluation --------------------------------------------------------------------------
    def _sentences(self, split: str):
        e = self.eval_cfg
        path = self.paths[split]
        for i, line in enumerate(corpus.read_lines(path)):
            if e.max_sentences and i >= e.max_sentences:
                return
            yield self.vocab.encode(line.split())

    def _logprobs(self, model: nn.Module, split: str) -> tuple[list[float], list[tuple[int, int, int]]]:
        """Full-softmax log p of every prediction of ``split`` and (sentence, index, target id)."""
        e = self.eval_cfg
        device = next(model.parameters()).device
        was_training = model.training
        model.eval()
        lps: list[float] = []
        where: list[tuple[int, int, int]] = []
        state = None
        try:
            for x, y, w, pos in corpus.deal_windows(self._sentences(split), e.batch_size,
                                                    e.num_steps, self.vocab.s_id, positions=True):
                nll, state = model(x.to(device), y.to(device), state, chunk=e.softmax_chunk)
                keep = w.bool()
                lps += (-nll.double().cpu()[keep]).tolist()
                where += [(int(a), int(b), int(t)) for (a, b), t in zip(pos[keep].tolist(),
                                                                        y[keep].tolist())]
        finally:
            model.train(was_training)
        return lps, where

    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: str, *, final: bool = False) -> dict[str, float]:
        """Full softmax over every prediction of the split (``run_eval`` with the dealt rows)."""
        lps, _ = self._logprobs(model, split)
        return perplexity_metrics(-math.fsum(lps), len(lps))

    @torch.no_grad()
    def evaluate_items(self, model: nn.Module, split: str
                       ) -> tuple[dict[str, float], list[dict[str, Any]]]:
        """:meth:`evaluate`, and one record per sentence (line of the split's file):
        ``{"id": line index, "nll": summed NLL (nats) of its predictions (the closing ``<S>``
        included), "tokens": their number}`` (:mod:`lstmablate_tasks.lm_scores`)."""
        lps, where = self._logprobs(model, split)
        sentence = [w[0] for w in where]
        records = sentence_records(sentence, lps, max(sentence) + 1 if sentence else 0)
        return perplexity_metrics(-math.fsum(lps), len(lps)), records

    def item_metrics(self) -> dict[str, ItemMetric]:
        return lm_item_metrics(bits=False)

    def reference_items(self, split: str) -> list[str]:
        """Each sentence scored (a line of the split's file; ``eval.max_sentences`` of them at
        most), its words as the vocabulary spells them (``<UNK>`` for unknown ones)."""
        words = self.vocab.words
        return [" ".join(words[i] for i in ids) for ids in self._sentences(split)]

    def item_key(self, record: Mapping[str, Any]) -> Any:
        return record["id"], record["tokens"]

    @torch.no_grad()
    def write_predictions(self, model: nn.Module, split: str, path: Path) -> dict[str, float]:
        """``sentence<TAB>index<TAB>token<TAB>logprob`` per prediction (natural log, full
        softmax): sentence = line number of the split's file from 0, index = position of the
        predicted token in ``<S> w_1 .. w_n <S>`` (1 .. n+1), token = the word predicted (as the
        vocabulary spells it; ``<UNK>`` for unknown words).  Returns the metrics of the file."""
        from lstmablate.io import atomic_write_text

        lps, where = self._logprobs(model, split)
        order = sorted(range(len(lps)), key=lambda i: where[i][:2])
        lines = [f"# lstmablate bwb predictions split={split} file={self.paths[split].name}",
                 PREDICTIONS_HEADER]
        lines += [f"{where[i][0]}\t{where[i][1]}\t{self.vocab.words[where[i][2]]}\t{lps[i]:.17g}"
                  for i in order]
        atomic_write_text(path, "\n".join(lines) + "\n")
        return read_predictions(Path(path))


PREDICTIONS_HEADER = "sentence\tindex\ttoken\tlogprob"


def perplexity_metrics(total_nll: float, n: int) -> dict[str, float]:
    mean = total_nll / n if n else math.nan
    return {"ppl": math.exp(mean) if mean < 700 else math.inf, "nll": mean, "tokens": float(n)}


def read_predictions(path: Path) -> dict[str, float]:
    """The metrics of a predictions file written by :meth:`BillionWordTask.write_predictions`."""
    from lstmablate.data import read_lines
    from lstmablate.errors import where

    lines = read_lines(path)
    start = 1 if lines and lines[0].startswith("#") else 0
    if len(lines) <= start or lines[start] != PREDICTIONS_HEADER:
        raise DataError(f"{where(path, start + 1)}: expected the header line "
                        f"{PREDICTIONS_HEADER!r} of a Billion Word predictions file.")
    values = []
    for lineno, line in enumerate(lines[start + 1:], start + 2):
        parts = line.split("\t")
        try:
            values.append(-float(parts[3]))
        except (IndexError, ValueError):
            raise DataError(f"{where(path, lineno)}: expected sentence<TAB>index<TAB>token<TAB>"
                            f"logprob, got {line!r}.") from None
    return perplexity_metrics(math.fsum(values), len(values))
