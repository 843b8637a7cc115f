"""The ``sst`` task plugin: sentence-level sentiment classification on the Stanford Sentiment
Treebank (Socher et al. 2013), fine-grained (SST-5) or binary (SST-2), with an InferSent-style
classifier over any registered cell.

Data (:mod:`.data`, :mod:`.trees`): the treebank's PTB-format trees read strictly; labels
in the setting of ``data.classes`` (5: 0-4; 2: neutral dropped, 0-1 -> 0, 3-4 -> 1);
evaluation on sentences, training on sentences or (``data.train_phrases``) on every phrase.
The vocabulary of the training sentences is kept with the run (artefact ``vocab``), with the
provenance of the pretrained vectors, if any (``pretrained``).

Model (:mod:`.model`): embeddings (``model.pretrained``: GloVe-format vectors for the
vocabulary's words, e.g. GloVe 840B 300d; otherwise random), a bidirectional encoder from
the registry pooled over time (``model.pooling``, default ``max``: BiLSTM-max;
``model.layer_mix``: ELMo's scalar mix of the layers), an MLP and a softmax.

Defaults (``DataConfig``, ``ModelConfig``, ``train_defaults``): Tai et al. (2015)'s
sequential-BiLSTM sentiment setting (stanfordnlp/treelstm ``sentiment/LSTMSentiment.lua``:
150 units per direction, AdaGrad 0.05, minibatches of 25, L2 1e-4, dropout 0.5 before the
classifier, 10 epochs, the best dev epoch tested, sentences only, fine-grained) with
InferSent's sentence encoder: max pooling instead of the final states, and InferSent's
classifier (an MLP with one hidden layer of 512 units; Conneau et al. 2017 §3.3).  The
recipes ``sst{2,5}-bilstm-max`` name every value and its source; differences from both
originals are listed there and in docs/results/sst.md.

Metrics: ``accuracy`` (% of sentences whose predicted label is the gold one; primary),
``loss`` (mean cross-entropy per sentence, nats) and ``sentences``.  ``write_predictions``
writes one predicted label per line (the setting's label space, the split's sentences in
file order; SST-2: its non-neutral sentences) and scores that file against the gold labels.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from lstmablate.batching import BatchPlan, pooled_batches
from lstmablate.cells.pooling import LAYER_MIXES, POOLINGS
from lstmablate.config import MAX_BATCH, MAX_LAYERS, MAX_WIDTH, check_range
from lstmablate.data import read_lines
from lstmablate.errors import ConfigError, DataError, UserError, check_choice, where
from lstmablate.task import ItemMetric, Metric, StepOutput, Task, ratio, record_fields
from lstmablate.train.buckets import pad_to

from . import data as sst
from .data import PAD, Example, Vocab
from .model import ACTIVATIONS, SentenceClassifier
from .trees import Tree


@dataclass
class SSTData:
    classes: int = 5  # 5: fine-grained labels 0-4 (SST-5); 2: binary, neutral dropped (SST-2)
    # train on every phrase of the training trees (Socher et al. 2013's protocol); false: on
    # sentences only, as Tai et al.'s sequential LSTMs (evaluation is always on sentences)
    train_phrases: bool = False
    lowercase: bool = False  # fold case in the vocabulary (Tai et al.: cased, as GloVe 840B)
    batch_size: int = 25  # sentences (or phrases) per batch; Tai et al.: 25
    verify: bool = True  # compare the files' checksums with the catalogue

    #: the largest values that size memory (checked with the other values)
    upper_bounds: ClassVar[dict[str, int]] = {"classes": max(sst.CLASSES), "batch_size": MAX_BATCH}

    def validate(self) -> None:
        if self.classes not in sst.CLASSES:
            raise ConfigError(f"data.classes must be 5 (fine-grained, SST-5) or 2 (binary, "
                              f"SST-2), got {self.classes}")
        check_range("data", self, "batch_size", low=1)


@dataclass
class SSTModel:
    embedding_size: int = 300  # GloVe 840B 300d (= the vectors' size when model.pretrained is set)
    # GloVe-format vectors for the vocabulary's words, absolute or relative to the data
    # directory (Tai et al. and InferSent: glove.840B.300d.txt); "" = random embeddings
    pretrained: str = ""
    freeze_embeddings: bool = False  # Tai et al. update them (lr 0.1); InferSent keeps them fixed
    hidden_size: int = 150  # per direction; Tai et al.'s code: mem_dim 150 (InferSent: 2048)
    num_layers: int = 1
    bidirectional: bool = True
    pooling: str = "max"  # max (InferSent's BiLSTM-max) | mean | last (Tai et al.: final states)
    layer_mix: str = "none"  # none | scalar (ELMo's γ Σ softmax(s)_j h_j over the layers)
    layer_mix_input: bool = False  # also mix in the embeddings (needs sizes that match)
    encoder_dropout: float = 0.0  # between encoder layers (InferSent dpout_model: 0)
    mlp_hidden: int = 512  # InferSent's classifier: one hidden layer of 512; 0 = a linear softmax
    mlp_activation: str = "tanh"  # tanh (InferSent's non-linear classifier) | relu | none
    dropout: float = 0.5  # before every linear layer of the classifier (Tai et al.: 0.5)
    cell_options: dict[str, Any] = field(default_factory=dict)  # passed to make_encoder

    #: the largest values that size memory (checked with the other values)
    upper_bounds: ClassVar[dict[str, int]] = {
        "embedding_size": MAX_WIDTH, "hidden_size": MAX_WIDTH, "num_layers": MAX_LAYERS,
        "mlp_hidden": MAX_WIDTH}

    def validate(self) -> None:
        for name in ("embedding_size", "hidden_size", "num_layers"):
            check_range("model", self, name, low=1)
        check_range("model", self, "mlp_hidden", low=0, why="0 = no hidden layer")
        for name in ("encoder_dropout", "dropout"):
            check_range("model", self, name, low=0, high=1, high_open=True)
        check_choice("model.pooling", self.pooling, POOLINGS[1:])
        check_choice("model.layer_mix", self.layer_mix, LAYER_MIXES)
        check_choice("model.mlp_activation", self.mlp_activation, ACTIVATIONS)


@dataclass
class SSTEval:
    batch_size: int = 256  # sentences per evaluation batch (the numbers do not depend on it)

    #: the largest values that size memory (checked with the other values)
    upper_bounds: ClassVar[dict[str, int]] = {"batch_size": MAX_BATCH}

    def validate(self) -> None:
        check_range("eval", self, "batch_size", low=1)


class SSTTask(Task):
    name = "sst"
    description = ("Stanford Sentiment Treebank sentence classification, fine-grained (SST-5) or "
                   "binary (SST-2): an InferSent-style BiLSTM-max classifier; accuracy")
    DataConfig = SSTData
    ModelConfig = SSTModel
    EvalConfig = SSTEval
    datasets = (sst.SST,)
    # Tai et al. 2015 (LSTMSentiment.lua): AdaGrad lr 0.05, L2 1e-4, 10 epochs, best dev epoch
    train_defaults = {"optimizer": "adagrad", "lr": 0.05, "eps": 1e-10, "weight_decay": 1e-4,
                      "max_epochs": 10, "eval_every": 0, "test_checkpoint": "best"}
    metrics = (
        Metric("accuracy", True, "sentence-level accuracy (%)", ".2f"),
        Metric("loss", False, "cross-entropy per sentence (nats)", ".4f"),
    )
    primary = metrics[0]
    dev_split = "dev"
    test_split = "test"

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._trees: dict[str, list[Tree]] = {}
        self.examples: dict[str, list[Example]] = {}
        self.pretrained: sst.Pretrained | None = None  # read for a new run only

    def metric_description(self, key: str) -> str:
        if key == "sentences":
            return "sentences scored (SST-2: the non-neutral ones)"
        return super().metric_description(key)

    # -- data ------------------------------------------------------------------------
    def _read(self, split: str) -> list[Tree]:
        if split not in self._trees:
            self._trees[split] = sst.load_split(self.data_dir, split, self.data_cfg.verify)
        return self._trees[split]

    def build_artefacts(self) -> dict[str, Any]:
        """The vocabulary of the training sentences; with ``model.pretrained``, the vectors of
        its words are read now (a new run; they go into the model's initial embeddings, and
        the checkpoints carry them from there) and the file's provenance is saved."""
        vocab = sst.build_vocab(self._read("train"), self.data_cfg.lowercase)
        out: dict[str, Any] = {"vocab": {"words": vocab.itos, "lowercase": vocab.lowercase},
                               "pretrained": {"file": None}}  # marks a run without vectors
        m = self.model_cfg
        if m.pretrained:
            path = sst.resolve_pretrained(self.data_dir, m.pretrained)
            self.pretrained = sst.read_pretrained(path, vocab, m.embedding_size)
            out["pretrained"] = self.pretrained.provenance(len(vocab))
        return out

    def use_artefacts(self, artefacts: dict[str, Any]) -> None:
        super().use_artefacts(artefacts)
        try:
            v = artefacts["vocab"]
            self.vocab = Vocab(list(v["words"]), bool(v["lowercase"]))
        except (KeyError, TypeError):
            raise DataError("the run's saved vocabulary is missing or damaged (artefact 'vocab' "
                            "with 'words' and 'lowercase'); the artefacts folder is damaged or "
                            "from another task.") from None
        if self.model_cfg.pretrained and not (artefacts.get("pretrained") or {}).get("file"):
            raise DataError("model.pretrained is set but this run's artefacts record no "
                            "pretrained vectors; the run was built without them.")

    def setup(self, splits: Sequence[str] = sst.SPLITS) -> None:
        d = self.data_cfg
        for split in splits:
            trees = self._read(split)
            phrases = split == "train" and d.train_phrases
            examples = (sst.phrase_examples if phrases else sst.sentence_examples)(trees, d.classes)
            if not examples:  # SST-2 of a file whose every sentence (or phrase) is neutral
                raise sst.no_examples_error(sst.split_path(self.data_dir, split, verify=False),
                                            split, len(trees), phrases)
            self.examples[split] = examples
        self._ids = {s: [self.vocab.encode(e.words) for e in ex] for s, ex in self.examples.items()}

    # -- batches ---------------------------------------------------------------------
    def collate(self, split: str, idx: Sequence[int]) -> dict[str, Tensor]:
        ids = [self._ids[split][i] for i in idx]
        lengths = torch.tensor([len(s) for s in ids], dtype=torch.long)
        words = torch.full((len(ids), int(lengths.max())), PAD, dtype=torch.long)
        for b, s in enumerate(ids):
            words[b, :len(s)] = torch.tensor(s, dtype=torch.long)
        labels = torch.tensor([self.examples[split][i].label for i in idx], dtype=torch.long)
        return {"words": words, "lengths": lengths, "labels": labels}

    def train_plan(self, epoch: int, generator: torch.Generator) -> BatchPlan:
        """``data.batch_size`` examples per batch in torchtext's pooled length order (random
        batches of examples of similar lengths), fixed by ``generator``."""
        lengths = [len(s) for s in self._ids["train"]]
        groups = pooled_batches(lengths, self.data_cfg.batch_size, generator)
        return BatchPlan(groups, lambda idx: self.collate("train", idx))

    # -- model -----------------------------------------------------------------------
    def build_model(self, make_encoder) -> nn.Module:
        m, d = self.model_cfg, self.data_cfg
        opts = dict(m.cell_options)
        for key in ("pooling", "layer_mix", "layer_mix_input"):
            if key in opts:
                raise ConfigError(f"model.cell_options.{key}: set model.{key} instead")
        enc = make_encoder(m.embedding_size, m.hidden_size, num_layers=m.num_layers,
                           bidirectional=m.bidirectional, dropout=m.encoder_dropout,
                           pooling=m.pooling, layer_mix=m.layer_mix,
                           layer_mix_input=m.layer_mix_input, **opts)
        model = SentenceClassifier(len(self.vocab), m.embedding_size, enc, d.classes,
                                   mlp_hidden=m.mlp_hidden, activation=m.mlp_activation,
                                   dropout=m.dropout, freeze_embeddings=m.freeze_embeddings)
        if self.pretrained is not None:  # a new run: GloVe rows over the random ones
            model.set_pretrained(self.pretrained.rows)
        return model

    def loss(self, model: nn.Module, batch: dict[str, Tensor], carry: Any) -> StepOutput:
        logits = model(batch["words"], batch["lengths"])
        loss = nn.functional.cross_entropy(logits, batch["labels"])
        return StepOutput(loss, None, weight=batch["labels"].numel(), tokens=batch["lengths"].sum())

    # -- length buckets (train.step_capture) ----------------------------------------------
    def batch_length(self, batch: dict[str, Tensor]) -> int:
        return batch["words"].shape[1]

    def pad_batch(self, batch: dict[str, Tensor], length: int) -> dict[str, Tensor]:
        """The words padded with ``<pad>``; the lengths unchanged, so the encoder and the
        pooling read the real words only."""
        return {**batch, "words": pad_to(batch["words"], 1, length, PAD)}

    # -- evaluation --------------------------------------------------------------------
    @torch.no_grad()
    def predict(self, model: nn.Module, split: str) -> tuple[list[int], float]:
        """The predicted label of every example of ``split`` (in file order) and the summed
        cross-entropy; no dropout."""
        pred, nll, _ = self._predict(model, split)
        return pred, nll

    def _predict(self, model: nn.Module, split: str) -> tuple[list[int], float, list[float]]:
        """:meth:`predict`, and each example's cross-entropy."""
        device = next(model.parameters()).device
        ids = self._ids[split]
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))  # little padding
        pred = [0] * len(ids)
        each = [0.0] * len(ids)
        nll = 0.0
        was_training = model.training
        model.eval()
        try:
            bs = self.eval_cfg.batch_size
            for lo in range(0, len(order), bs):
                idx = order[lo:lo + bs]
                b = self.batch_to(self.collate(split, idx), device)
                logits = model(b["words"], b["lengths"]).double()
                losses = nn.functional.cross_entropy(logits, b["labels"], reduction="none")
                nll += float(losses.sum())
                for i, y, loss in zip(idx, logits.argmax(-1).tolist(), losses.tolist()):
                    pred[i], each[i] = y, loss
        finally:
            model.train(was_training)
        return pred, nll, each

    def gold(self, split: str) -> list[int]:
        return [e.label for e in self.examples[split]]

    @staticmethod
    def accuracy(pred: Sequence[int], gold: Sequence[int]) -> dict[str, float]:
        correct = sum(int(p == g) for p, g in zip(pred, gold))
        return {"accuracy": 100.0 * correct / max(len(gold), 1), "sentences": len(gold)}

    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: str, *, final: bool = False) -> dict[str, float]:
        pred, nll = self.predict(model, split)
        gold = self.gold(split)
        return {**self.accuracy(pred, gold), "loss": nll / max(len(gold), 1)}

    @torch.no_grad()
    def evaluate_items(self, model: nn.Module, split: str
                       ) -> tuple[dict[str, float], list[dict[str, Any]]]:
        """One record per sentence of ``split`` (file order; SST-2: the non-neutral ones):
        ``{"id": index, "gold": label, "pred": label, "correct": 0|1, "nll": cross-entropy}``."""
        pred, nll, each = self._predict(model, split)
        gold = self.gold(split)
        records = [{"id": i, "gold": g, "pred": p, "correct": int(p == g), "nll": e}
                   for i, (g, p, e) in enumerate(zip(gold, pred, each))]
        return {**self.accuracy(pred, gold), "loss": nll / max(len(gold), 1)}, records

    def item_metrics(self) -> dict[str, ItemMetric]:
        return {"accuracy": ItemMetric("accuracy", record_fields("correct", "items"),
                                       ratio(100.0)),
                "loss": ItemMetric("loss", record_fields("nll", "items"), ratio())}

    def reference_items(self, split: str) -> list[str]:
        """Each sentence's gold label (in the setting's label space) and its words."""
        return [f"{e.label}\t{' '.join(e.words)}" for e in self.examples[split]]

    def item_key(self, record: Mapping[str, Any]) -> Any:
        return record["id"], record["gold"]

    def score_file(self, split: str, path: Path) -> dict[str, float]:
        """Accuracy of a predictions file (one label per line) against ``split``'s gold labels."""
        lines = read_lines(path)
        gold = self.gold(split)
        if len(lines) != len(gold):
            which = " (SST-2: the non-neutral ones)" if self.data_cfg.classes == 2 else ""
            raise DataError(f"{path} has {len(lines)} lines, but the {split} split has "
                            f"{len(gold)} sentences{which}; expected one predicted label per line.")
        labels = [str(k) for k in range(self.data_cfg.classes)]
        pred = []
        for k, line in enumerate(lines, start=1):
            if line.strip() not in labels:
                raise DataError(f"{where(path, k)}: {line.strip()!r} is not a label of this "
                                f"setting; expected one of {', '.join(labels)}.")
            pred.append(int(line))
        return self.accuracy(pred, gold)

    @torch.no_grad()
    def write_predictions(self, model: nn.Module, split: str, path: Path) -> dict[str, float]:
        """One predicted label per line, the split's sentences in file order (SST-2: its
        non-neutral sentences); returns the accuracy computed from that file (and the loss,
        which the file cannot hold)."""
        from lstmablate.io import atomic_write_text

        pred, nll = self.predict(model, split)
        atomic_write_text(path, "".join(f"{y}\n" for y in pred))
        return {**self.score_file(split, Path(path)), "loss": nll / max(len(pred), 1)}

    def visualization_inputs(self, model: nn.Module, text: str):
        """The encoder and the embedded words of ``text`` (tokens separated by spaces, as the
        treebank writes them; ``(`` and ``)`` are read as ``-LRB-`` / ``-RRB-``).  A word not in
        the vocabulary reads ``<unk>``."""
        tokens = text.split()
        if not tokens:
            raise UserError("--text is empty; give a sentence, e.g. 'a gorgeous , witty film'.")
        words = [{"(": "-LRB-", ")": "-RRB-"}.get(t, t) for t in tokens]
        device = next(model.parameters()).device
        ids = torch.tensor([self.vocab.encode(words)], device=device)
        with torch.no_grad():
            x = model.embedding(ids)
        return model.encoder, x, tokens
