"""The ``ptb`` task plugin: Penn Treebank language modelling as the TensorFlow PTB
tutorial (Zaremba et al. 2014) does it, with any registered cell.

Data (:mod:`lstmablate_tasks.ptb.data`): Mikolov's ``ptb/ptb.{train,valid,test}.txt``
(``.gz`` accepted) under the data directory, checksums verified; 10,000 word
types with ``<eos>`` at every line end, or with ``data.level: char`` Mikolov's
character version (50 symbols). Batching is the tutorial's ``ptb_producer``:
each split is cut into ``batch_size`` contiguous rows walked left to right in
windows of ``num_steps`` (truncated BPTT), in a fixed order — there is no
shuffling, so the trainer's data generator is not used.

Model (:mod:`lstmablate_tasks.ptb.model`): embedding (hidden_size) ->
``make_encoder(hidden, hidden, num_layers=2, dropout=1-keep_prob)`` -> untied
softmax; every parameter uniform(±init_scale); dropout on the embedding output,
between layers and on the top layer's output, never on the recurrent state.
For the second-order report (Renganathan & Singh, "R&S", §5.3) ``model.embedding_size`` gives the
embedding its own size, ``model.dropout_scope: softmax`` keeps dropout to the top output only, and
``model.init: pytorch`` uses PyTorch's module defaults (:func:`build_language_model`;
:func:`count_parameters` / ``python -m lstmablate_tasks.ptb.task RECIPE`` count a
recipe's parameters without data).

Carry: the encoder's final state, a tuple of ``(num_layers, batch_size, hidden)``
tensors (``h`` first, then ``c`` for cells with a memory cell), detached after
every batch; ``None`` (= zeros) at the start of every epoch and of every
evaluation pass.

Loss (the tutorial's cost, ``ptb_word_lm.py``): the SUM over the ``num_steps``
time steps of the batch-mean NLL, i.e. ``num_steps`` x the mean token NLL, so
that plain SGD at lr 1.0 trains as in the tutorial. The logged training loss
is therefore on that scale; evaluation reports per-token averages.

Sentences (``data.sentences: true``; the second-order report, Renganathan & Singh,
R&S §5.3 / §6.1; see :mod:`lstmablate_tasks.ptb.data` and docs/secondorder-lm.md):
every line is a sequence of its own, ``<eos> t_1 .. t_n`` -> ``t_1 .. t_n <eos>``,
scored from the zero state (no carry); a training epoch is the sentences in a random
order drawn from the epoch's generator (the seed fixes it), ``batch_size`` sentences
per batch, right-padded with their lengths given to the encoder (``data.length_pool: N``
buckets them by length instead: torchtext's pool order, N batches per pool, see
:func:`lstmablate.batching.pooled_batches`; at character level random batches are 2.6
times their real characters in padded positions, pooled ones 1.03 times); the loss is the mean
NLL per real target token of the batch (padding contributes nothing). ``num_steps``
is not used. ``data.max_chars: N`` cuts every *training* sentence to its first N
characters (Table 3); valid and test are always whole sentences. valid and test are
both scored whole, every sentence from zeros, in batches of ``eval.batch_size``.

Metrics (every split, both levels): ``ppl`` = exp(mean NLL per token) — the
primary metric, lower is better (at char level it is 2**bpc, so model
selection is the same as by BPC); ``nll`` = mean nats per token; ``bpc`` = mean
bits per token (bits per character at char level, log2 of the perplexity at
word level); ``tokens`` = number of predictions scored; and
``eval_batch_size`` / ``eval_num_steps``, the protocol of that split (see
:attr:`PTBTask.eval_protocol`; ``eval_num_steps`` 0 = whole sentences), and in sentence
mode ``sentences``, the number of sentences scored. The second-order report's metrics
are ``bpc`` at character level and ``nll`` (its "average cross-entropy", nats per word,
``<eos>`` counted as a word) at word level: both the total over every predicted token
of the split divided by the number of tokens (not a mean of per-sentence means).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from lstmablate.batching import BatchPlan, contiguous_groups, pooled_batches
from lstmablate.config import (MAX_BATCH, MAX_BATCH_TOKENS, MAX_INIT_SCALE, MAX_LAYERS,
                               MAX_WIDTH, check_range)
from lstmablate.errors import ConfigError, DataError, check_choice
from lstmablate.task import ItemMetric, Metric, StepOutput, Task
from ..lm_scores import lm_item_metrics, sentence_records

from . import data as ptb_data
from .evaluate import (PREDICTIONS_HEADER, perplexity_metrics, read_predictions, sentence_logprobs,
                       sequential_logprobs, stream_logprobs)
from .model import DROPOUT_SCOPES, PTBLanguageModel, detach_state, state_to

#: PTB's vocabulary size at each level (for the hint when ``data.vocab_size`` does not match).
PTB_VOCAB_SIZES = {"word": 10_000, "char": 50}


@dataclass
class PTBData:
    level: str = "word"  # word | char (Mikolov's character version; metric bpc)
    batch_size: int = 20
    num_steps: int = 20  # truncated-BPTT length (tutorial: 20 small, 35 medium/large)
    # expected vocabulary size, checked after reading (PTB: 10000 words, 50 characters
    # with <eos>); 0 = do not check
    vocab_size: int = 0
    verify: bool = True  # compare the files' checksums with the catalogue
    # one sequence per line (padded batches of batch_size sentences, each from the zero
    # state; the second-order report) instead of the tutorial's continuous stream
    sentences: bool = False
    # sentences only: cut every training sentence to its first N characters (R&S Table 3;
    # valid/test stay whole); 0 = no cut
    max_chars: int = 0
    # sentences only: 0 = batches cut from a random permutation; N > 0 = torchtext's pool
    # order (shuffle, sort pools of N batches by length, shuffle the batches of each pool):
    # the same sentences per epoch with far less padding, so far less computation
    length_pool: int = 0

    #: the largest values that size memory (checked with the other values)
    upper_bounds: ClassVar[dict[str, int]] = {
        "batch_size": MAX_BATCH, "num_steps": MAX_BATCH_TOKENS}

    def validate(self) -> None:
        check_choice("data.level", self.level, ptb_data.LEVELS)
        if self.max_chars < 0:
            raise ConfigError(f"data.max_chars must be >= 0 (0: whole sentences), got {self.max_chars}")
        if self.length_pool < 0:
            raise ConfigError(f"data.length_pool must be >= 0 (0: random batches), got {self.length_pool}")
        if self.length_pool and not self.sentences:
            raise ConfigError(f"data.length_pool={self.length_pool} groups sentences by length, so it "
                              "needs data.sentences=true (the continuous stream has no sentences).")
        if self.max_chars and not self.sentences:
            raise ConfigError(f"data.max_chars={self.max_chars} cuts sentences, so it needs "
                              "data.sentences=true (the continuous stream has no sentences).")
        for name in ("batch_size", "num_steps"):
            if getattr(self, name) < 1:
                raise ConfigError(f"data.{name} must be >= 1, got {getattr(self, name)}")
        if self.vocab_size < 0:
            raise ConfigError(f"data.vocab_size must be >= 0 (0: no check), got {self.vocab_size}")


@dataclass
class PTBEval:
    # tokens per forward pass of the batch-1 test evaluation; any value gives the same
    # numbers as one token at a time (the model is deterministic in eval mode)
    chunk: int = 2000
    # sentence mode: sentences per evaluation batch (0 = data.batch_size); any value gives
    # the same numbers (every sentence is scored alone, padding masked)
    batch_size: int = 0

    #: the largest values that size memory (checked with the other values)
    upper_bounds: ClassVar[dict[str, int]] = {"chunk": 20_000, "batch_size": MAX_BATCH}

    def validate(self) -> None:
        if self.chunk < 1:
            raise ConfigError(f"eval.chunk must be >= 1, got {self.chunk}")
        if self.batch_size < 0:
            raise ConfigError(f"eval.batch_size must be >= 0 (0: data.batch_size), got {self.batch_size}")


#: model.init: "uniform" = every parameter uniform(±init_scale) (the tutorial); "pytorch" =
#: each module's PyTorch default (the second-order report is silent; see model.py)
INITS = ("uniform", "pytorch")


@dataclass
class PTBModel:
    hidden_size: int = 200  # also the embedding size (tutorial) unless embedding_size is set
    num_layers: int = 2
    dropout: float = 0.0  # 1 - keep_prob: embedding output, between layers, top output
    init_scale: float = 0.1  # every parameter uniform(±init_scale)
    cell_options: dict[str, Any] = field(default_factory=dict)  # passed to make_encoder
    embedding_size: int = 0  # 0 = hidden_size (tutorial); R&S: 128 (char), 64 (word)
    # where `dropout` applies: all = embedding output, between layers, top output (tutorial);
    # softmax = only the top layer's output before the softmax (R&S §5.3)
    dropout_scope: str = "all"
    init: str = "uniform"  # uniform (±init_scale, tutorial) | pytorch (module defaults)

    #: the largest values that size memory (checked with the other values)
    upper_bounds: ClassVar[dict[str, int]] = {
        "hidden_size": MAX_WIDTH, "num_layers": MAX_LAYERS, "embedding_size": MAX_WIDTH}

    def validate(self) -> None:
        if self.hidden_size < 1 or self.num_layers < 1:
            raise ConfigError("model.hidden_size and model.num_layers must be >= 1")
        if self.embedding_size < 0:
            raise ConfigError(f"model.embedding_size must be >= 0 (0: hidden_size), got "
                              f"{self.embedding_size}")
        check_choice("model.dropout_scope", self.dropout_scope, DROPOUT_SCOPES)
        check_choice("model.init", self.init, INITS)
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.dropout (1 - keep_prob) must be in [0, 1), got {self.dropout}")
        check_range("model", self, "init_scale", low=0, low_open=True, high=MAX_INIT_SCALE)


class PTBTask(Task):
    name = "ptb"
    description = ("Penn Treebank LM (TF PTB tutorial / Zaremba et al. 2014): perplexity; "
                   "valid at the training batch shape, test with batch 1 (state carried)")
    eval_protocol = (
        "valid (and train): the training batch shape, batch_size rows x num_steps windows, state "
        "carried across windows from zeros, the tail that fills no window dropped (the tutorial's "
        "validation). test: batch size 1 and num_steps 1 as in the tutorial (every token after "
        "the first predicted, state carried from zeros), computed in chunks of eval.chunk "
        "tokens, which gives the same numbers as one step at a time. Perplexity = exp(total NLL / "
        "tokens); no dropout. Reported as ppl, nll (nats/token), bpc (bits/token: bits per "
        "character at char level), tokens, eval_batch_size, eval_num_steps. With "
        "data.sentences (the second-order report): valid and test alike, every line scored "
        "whole and alone from the zero state, <eos> as its first input and its last target "
        "(every token of the split predicted once), in padded batches of eval.batch_size "
        "(no effect on the numbers); the metrics are totals over tokens (total NLL / tokens), "
        "eval_num_steps = 0, plus sentences = the number of lines scored; data.max_chars "
        "cuts only the training split."
    )
    DataConfig = PTBData
    ModelConfig = PTBModel
    EvalConfig = PTBEval
    renamed_keys = {"data.eval_chunk": "eval.chunk"}
    datasets = (ptb_data.PTB_DATASET,)
    # the tutorial's SmallConfig (recipes ptb-small/medium/large set every value)
    train_defaults = {"optimizer": "sgd", "lr": 1.0, "schedule": "epoch_decay", "decay": 0.5,
                      "decay_start": 4, "clip_norm": 5.0, "max_epochs": 13}
    metrics = (
        Metric("ppl", False, "perplexity", ".2f"),
        Metric("nll", False, "NLL (nats/token)", ".4f"),
        Metric("bpc", False,
               "bits per token: per character (BPC) at char level, per word at word level", ".4f"),
    )
    primary = metrics[0]
    dev_split = "valid"
    test_split = "test"

    # -- data ----------------------------------------------------------------------
    def build_artefacts(self) -> dict[str, Any]:
        """The vocabulary of the training file, in id order (kept with the run)."""
        d = self.data_cfg
        return {"vocab": ptb_data.read_vocab(self.data_dir, level=d.level, verify=d.verify)}

    def use_artefacts(self, artefacts: dict[str, Any]) -> None:
        super().use_artefacts(artefacts)
        d = self.data_cfg
        vocab = artefacts["vocab"]
        if not isinstance(vocab, list) or not all(isinstance(w, str) for w in vocab):
            raise DataError("the run's artefact artefacts/vocab.json is not a list of words; the "
                            "run folder is damaged (copy it again, or train the run again with "
                            "--force).")
        self.vocab: list[str] = list(vocab)
        if d.vocab_size and len(self.vocab) != d.vocab_size:
            expected = PTB_VOCAB_SIZES.get(d.level)
            hint = (f"; PTB at {d.level} level has {expected}, set data.vocab_size={expected}"
                    if expected and expected != d.vocab_size else "")
            raise DataError(
                f"the training file {ptb_data.FILES['train']} under {self.data_dir} gives a "
                f"vocabulary of {len(self.vocab)} {d.level} types, but "
                f"data.vocab_size={d.vocab_size}{hint} (or 0 to not check).")

    def setup(self, splits=("train", "valid", "test")) -> None:
        d = self.data_cfg
        self.corpus = ptb_data.load_corpus(self.data_dir, level=d.level, verify=d.verify,
                                           vocab=self.vocab, splits=tuple(splits))
        if d.sentences:
            # one sequence per line; max_chars cuts the training split only (R&S §6.1)
            self.sentences = {
                split: ptb_data.Sentences(self.corpus.split(split), self.corpus.eos_id,
                                          self.corpus.vocab, d.level,
                                          d.max_chars if split == "train" else 0)
                for split in splits}
            if "train" in splits and len(self.sentences["train"]) == 0:
                raise ConfigError(
                    f"no training sentence is left after cutting at data.max_chars={d.max_chars} "
                    f"(the training file {self.corpus.files.get('train')}); increase it.")
            return
        # fail here, not after the model is built, if a split is too short to batch
        for split in ("train", self.dev_split):
            if split not in splits:
                continue
            stream = self.corpus.split(split)
            if ptb_data.num_batches(stream.numel(), d.batch_size, d.num_steps) == 0:
                raise ConfigError(
                    f"the {split} split ({stream.numel()} tokens) gives no minibatch of "
                    f"batch_size={d.batch_size} x num_steps={d.num_steps}; decrease them.")

    def train_plan(self, epoch: int, generator: torch.Generator) -> Sequence[Any]:
        """Stream: the same contiguous minibatches every epoch (``generator`` is not used).
        Sentences: the training sentences in the order of a permutation drawn from
        ``generator``, cut into batches of ``batch_size`` (the last may be shorter); with
        ``data.length_pool`` N, torchtext's pool order (pools of N batches sorted by length)."""
        d = self.data_cfg
        if d.sentences:
            train = self.sentences["train"]
            if d.length_pool:
                return BatchPlan(pooled_batches(train.lengths, d.batch_size, generator,
                                                d.length_pool), train.collate)
            order = torch.randperm(len(train), generator=generator).tolist()
            return BatchPlan(contiguous_groups(len(train), d.batch_size, order), train.collate)
        return ptb_data.StreamPlan(self.corpus.train, d.batch_size, d.num_steps)

    # -- how metrics are shown -------------------------------------------------------------
    def metric_name(self, key: str) -> str:
        """``bpc`` is bits per character at char level and bits per word at word level."""
        if key == "bpc":
            return "bpc" if self.data_cfg.level == "char" else "bits/word"
        return key

    def metric_description(self, key: str) -> str:
        if key == "bpc":
            return ("bits per character (BPC)" if self.data_cfg.level == "char"
                    else "bits per word (log2 of the perplexity)")
        return super().metric_description(key)

    # -- model -------------------------------------------------------------------------
    def build_model(self, make_encoder) -> nn.Module:
        return self.language_model(make_encoder, self.corpus.vocab_size, self.model_cfg)

    @classmethod
    def language_model(cls, make_encoder, vocab_size: int, model_cfg: PTBModel) -> nn.Module:
        """The task's model of ``model_cfg`` over ``vocab_size`` tokens, without reading any
        data: what :meth:`build_model` builds, and what ``lstmablate bench`` times at its own
        sizes (``lstmablate.bench.models``, through the task registry)."""
        return build_language_model(make_encoder, vocab_size, model_cfg)

    def init_carry(self, model: nn.Module) -> Any:
        return None  # zeros: the encoder's default initial state

    def loss(self, model: nn.Module, batch: tuple[Tensor, ...], carry: Any) -> StepOutput:
        if len(batch) == 3:  # sentences: (x, y, lengths), each from the zero state, no carry
            x, y, lengths = batch
            real = y != ptb_data.PAD_TARGET  # padded positions never reach the softmax
            logits, _ = model(x, None, lengths, select=real)
            nll = nn.functional.cross_entropy(logits, y[real], reduction="mean")
            return StepOutput(nll, None, real.sum())  # mean NLL per real target token
        x, y = batch
        logits, final = model(x, state_to(carry, x.device))
        nll = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                                          reduction="none").view_as(y)
        loss = nll.mean(dim=0).sum()  # sum over time steps of the batch-mean NLL
        return StepOutput(loss, detach_state(final), float(y.numel()), logged=nll.mean())

    def _logprobs(self, model: nn.Module, split: str) -> tuple[Tensor, Tensor, int, int]:
        """(positions, log-probabilities, batch size, num_steps) of ``split``'s protocol
        (num_steps 0: whole sentences)."""
        stream = self.corpus.split(split)
        was_training = model.training
        model.eval()
        try:
            d = self.data_cfg
            if d.sentences:
                bs = self.eval_cfg.batch_size or d.batch_size
                pos, lp = sentence_logprobs(model, self.sentences[split], bs)
                return pos, lp, bs, 0
            if split == self.test_split:
                pos, lp = sequential_logprobs(model, stream, self.eval_cfg.chunk)
                return pos, lp, 1, 1
            pos, lp = stream_logprobs(model, stream, d.batch_size, d.num_steps)
            return pos, lp, d.batch_size, d.num_steps
        finally:
            model.train(was_training)

    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: str, *, final: bool = False) -> dict[str, float]:
        _, lp, bs, ns = self._logprobs(model, split)
        return perplexity_metrics(-float(lp.sum()), lp.numel(), bs, ns, self._num_sentences(split))

    @torch.no_grad()
    def evaluate_items(self, model: nn.Module, split: str
                       ) -> tuple[dict[str, float], list[dict[str, Any]]]:
        """The split's protocol, and one record per line of the split: ``{"id": line index,
        "nll": summed NLL (nats) of the predictions of that line's tokens (its ``<eos>``
        included), "tokens": their number}`` (:mod:`lstmablate_tasks.lm_scores`)."""
        pos, lp, bs, ns = self._logprobs(model, split)
        stream = self.corpus.split(split)
        ends = (stream == self.corpus.eos_id).nonzero().reshape(-1)
        sentence = torch.searchsorted(ends, pos.to(ends.dtype))  # the line whose token p is
        records = sentence_records(sentence.numpy(), lp.numpy(), int(ends.numel()))
        return (perplexity_metrics(-float(lp.sum()), lp.numel(), bs, ns,
                                   self._num_sentences(split)), records)

    def item_metrics(self) -> dict[str, ItemMetric]:
        return lm_item_metrics()

    def reference_items(self, split: str) -> list[str]:
        """Each line of the split's token stream (its ``<eos>`` included), as the vocabulary
        spells its tokens."""
        stream = self.corpus.split(split).tolist()
        lines, start = [], 0
        for i, t in enumerate(stream):
            if t == self.corpus.eos_id:
                lines.append(" ".join(self.corpus.vocab[x] for x in stream[start:i + 1]))
                start = i + 1
        return lines

    def item_key(self, record: Mapping[str, Any]) -> Any:
        return record["id"], record["tokens"]

    def _num_sentences(self, split: str) -> int | None:
        return len(self.sentences[split]) if self.data_cfg.sentences else None

    @torch.no_grad()
    def write_predictions(self, model: nn.Module, split: str, path: Path) -> dict[str, float]:
        """Per-token log-probabilities (natural log) of every prediction the split's
        protocol makes: ``position<TAB>token<TAB>logprob``, position = index of the
        predicted token in the split's token stream (``<eos>`` at every line end)."""
        from lstmablate.io import atomic_write_text

        pos, lp, bs, ns = self._logprobs(model, split)
        stream = self.corpus.split(split).tolist()
        vocab = self.corpus.vocab
        n_sent = self._num_sentences(split)
        lines = [f"# lstmablate ptb predictions split={split} level={self.corpus.level} "
                 f"batch_size={bs} num_steps={ns}"
                 + (f" sentences={n_sent}" if n_sent is not None else ""), PREDICTIONS_HEADER]
        lines += [f"{p}\t{vocab[stream[p]]}\t{v:.17g}" for p, v in zip(pos.tolist(), lp.tolist())]
        atomic_write_text(path, "\n".join(lines) + "\n")
        return read_predictions(Path(path))

    def visualization_inputs(self, model: nn.Module, text: str):
        """The encoder and the embedded tokens of ``text`` (for ``lstmablate visualize``).

        Word level: whitespace-separated words, a word not in the vocabulary shown and
        read as ``<unk>`` (PTB's own marker); char level: the characters with ``_`` at
        word boundaries, as in training. No ``<eos>`` is added.
        """
        from lstmablate.errors import UserError

        stoi = self.corpus.stoi
        if self.corpus.level == "word":
            tokens = [w if w in stoi else "<unk>" for w in text.split()]
        else:
            tokens = ptb_data.line_tokens(text, "char")[:-1]
            unknown = sorted({t for t in tokens if t not in stoi})
            if unknown:
                raise UserError(f"--text has characters not in PTB's character set: "
                                f"{' '.join(unknown)}")
        if not tokens:
            raise UserError("--text is empty; give a few words, e.g. 'the stock market fell'.")
        device = next(model.parameters()).device
        emb = model.embedding(torch.tensor([[stoi[t] for t in tokens]], device=device))
        return model.encoder, emb, tokens


def build_language_model(make_encoder, vocab_size: int, m: PTBModel) -> PTBLanguageModel:
    """The language model of config ``m`` over ``vocab_size`` tokens (see model.py)."""
    emb = m.embedding_size or m.hidden_size
    between = m.dropout if m.dropout_scope == "all" else 0.0  # R&S: dropout before the softmax only
    enc = make_encoder(emb, m.hidden_size, num_layers=m.num_layers, dropout=between,
                       **m.cell_options)
    model = PTBLanguageModel(vocab_size, m.hidden_size, enc, m.dropout, embedding_size=emb,
                             dropout_scope=m.dropout_scope)
    model.init_weights(m.init_scale if m.init == "uniform" else None)
    return model
