"""The ``parsing`` task plugin: Dozat & Manning's deep biaffine dependency parser with the
Parser-v1 protocol (Dozat & Manning 2017; tdozat/Parser-v1) on UD English EWT, with any registered cell.

Data (:mod:`.data`, :mod:`.conllu`): ``ud-ewt/en_ewt-ud-{train,dev,test}.conllu``
read strictly; vocabularies from the training file (:mod:`.vocab`: uncased words
seen twice, UPOS tags, relations) are kept with the run as artefacts.  Batches
(:mod:`.buckets`): Parser-v1's 40 k-means length buckets cut into ~5,000-token
minibatches, shuffled per epoch by the trainer's generator.

Model (:mod:`.model`): word + tag embeddings with whole-token dropout, a 3-layer
bidirectional encoder from the registry (400 per direction, same-mask dropout on
inputs, between layers and on h_{t-1}), split MLPs (arc 500, relation 100, leaky
ReLU) and biaffine scorers; as Parser-v1, the encoder does not read a sentence's last
word (``model.encoder_lengths: parser-v1``).  Training (``train_defaults``): Parser-v1's
Adam — β = (0.9, 0.9), ε 1e-12 inside the square root, embedding rows updated lazily,
the global norm of the update steps clipped at 5, non-finite gradient entries zeroed —
lr 2e-3 · 0.75^(step/5000), 50,000 iterations, a dev evaluation every 100 steps; as
Parser-v1, the model at the end of training is the one tested (``test_checkpoint: last``).

Evaluation (:mod:`.decode`, :mod:`.metrics`): heads decoded to a tree by
Parser-v1's heuristic (``eval.decoder: parser-v1``) or the maximum spanning tree
(``eval.decoder: mst``), relations given the decoded heads; UAS/LAS with
Parser-v1's punctuation convention (primary), all words, and UPOS != PUNCT.
``write_predictions`` writes predicted CoNLL-U and scores that file against the
gold file.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from lstmablate.batching import BatchPlan
from lstmablate.config import MAX_BATCH_TOKENS, MAX_LAYERS, MAX_WIDTH, RunConfig, check_range
from lstmablate.data import check_file, verify_datasets
from lstmablate.errors import DataError, UnknownNameError, UserError, check_choice
from lstmablate.task import ItemMetric, Metric, StepOutput, Task, ratio, record_fields
from lstmablate.train.buckets import pad_to

from ..vectors import GLOVE_6B_100D, catalogue_entry, check_shared
from . import data as pdata
from .buckets import assign_buckets, epoch_groups, eval_groups, kmeans_splits
from .conllu import Sentence, read_conllu, write_conllu
from .decode import DECODERS, decode_heads, parser_v1_rels
from .metrics import CONVENTIONS, AttachmentCounter, score_files
from .model import ENCODER_LENGTHS, BiaffineParser, pad_ids, parser_loss
from .vocab import PAD, ROOT, UNK, Vocabs, build_vocabs


@dataclass
class ParsingData:
    # a directory under the data directory with train/dev/test.conllu instead of UD EWT
    # (not checksummed); "" = the catalogued UD English EWT r2.16 files, verified
    files: str = ""
    min_word_count: int = 2  # Parser-v1 min_occur_count
    n_buckets: int = 40  # Parser-v1 n_bkts (k-means length buckets)
    batch_tokens: int = 5000  # Parser-v1 train_batch_size (tokens, ROOT included, padded)
    verify: bool = True  # compare the UD EWT files' checksums with the catalogue

    #: the largest values that size memory (checked with the other values)
    upper_bounds: ClassVar[dict[str, int]] = {"batch_tokens": MAX_BATCH_TOKENS}

    def validate(self) -> None:
        check_range("data", self, "min_word_count", low=1)
        check_range("data", self, "n_buckets", low=1)
        check_range("data", self, "batch_tokens", low=1)


@dataclass
class ParsingModel:
    word_size: int = 100  # Parser-v1 embed_size (= the pretrained size when given)
    tag_size: int = 100
    # GloVe-format vectors added (fixed) to the word embeddings, absolute or relative to the
    # data directory; Parser-v1 uses glove.6B.100d.txt. "" = none (trainable embeddings only)
    pretrained: str = ""
    word_dropout: float = 0.33  # 1 - word_keep_prob, whole-token
    tag_dropout: float = 0.33  # 1 - tag_keep_prob, whole-token
    hidden_size: int = 400  # recur_size, per direction
    num_layers: int = 3  # n_recur
    input_dropout: float = 0.33  # 1 - ff_keep_prob: every layer's input, same mask over time
    recurrent_dropout: float = 0.33  # 1 - recur_keep_prob: h_{t-1}, same mask over time
    arc_mlp: int = 500  # attn_mlp_size
    rel_mlp: int = 100  # class_mlp_size
    mlp_dropout: float = 0.33  # 1 - mlp_keep_prob: MLP input and both biaffine inputs
    # parser-v1: the encoder reads ROOT and the first n-1 of n words, as Parser-v1 does (its
    # sequence length counts words, ROOT sits at position 0): the last word's encoder output
    # is zero. all: every word is encoded (see model.py)
    encoder_lengths: str = "parser-v1"
    cell_options: dict[str, Any] = field(default_factory=dict)  # passed to make_encoder

    #: the largest values that size memory (checked with the other values)
    upper_bounds: ClassVar[dict[str, int]] = {
        "word_size": MAX_WIDTH, "tag_size": MAX_WIDTH, "hidden_size": MAX_WIDTH,
        "num_layers": MAX_LAYERS, "arc_mlp": MAX_WIDTH, "rel_mlp": MAX_WIDTH}

    def validate(self) -> None:
        if self.encoder_lengths not in ENCODER_LENGTHS:
            raise UnknownNameError("model.encoder_lengths", self.encoder_lengths, ENCODER_LENGTHS)
        for name in ("word_size", "tag_size", "hidden_size", "num_layers", "arc_mlp", "rel_mlp"):
            check_range("model", self, name, low=1)
        for name in ("word_dropout", "tag_dropout", "input_dropout", "recurrent_dropout",
                     "mlp_dropout"):
            check_range("model", self, name, low=0, high=1, high_open=True)


@dataclass
class ParsingEval:
    decoder: str = "parser-v1"  # parser-v1 (Parser-v1's ensure_tree heuristic) | mst
    batch_tokens: int = 5000  # padded tokens per evaluation batch (numbers do not depend on it)

    #: the largest values that size memory (checked with the other values)
    upper_bounds: ClassVar[dict[str, int]] = {"batch_tokens": MAX_BATCH_TOKENS}

    def validate(self) -> None:
        check_choice("eval.decoder", self.decoder, DECODERS)
        check_range("eval", self, "batch_tokens", low=1)


@dataclass
class Encoded:
    """One split as id lists (position 0 = ROOT) plus its gold sentences."""

    sentences: list[Sentence]
    words: list[list[int]]
    tags: list[list[int]]
    heads: list[list[int]]
    rels: list[list[int]]  # -100 for ROOT and for relations without a class
    pret: list[list[int]] | None

    def lengths(self) -> list[int]:
        return [len(w) for w in self.words]


class ParsingTask(Task):
    name = "parsing"
    description = ("Dependency parsing, UD English EWT: Dozat & Manning's deep biaffine parser "
                   "(Parser-v1 protocol); UAS/LAS without punctuation (Parser-v1's convention)")
    DataConfig = ParsingData
    ModelConfig = ParsingModel
    EvalConfig = ParsingEval
    # GloVe 6B 100d: read when model.pretrained names it (the recipe parsing-ewt does)
    datasets = (pdata.UD_EWT, GLOVE_6B_100D)
    # run folders saved before model.encoder_lengths existed encoded every word
    added_keys = {"model.encoder_lengths": "all"}
    # Parser-v1's optimiser (lib/optimizers): Adam with b1 = b2 = 0.9, eps 1e-12 inside the
    # square root, embedding rows updated lazily, the global norm of the update steps clipped
    # at 5, non-finite gradient entries set to zero
    train_defaults = {"optimizer": "adam", "lr": 2e-3, "betas": (0.9, 0.9), "eps": 1e-12,
                      "eps_in_sqrt": True, "lazy_embeddings": True, "clip_on": "update",
                      "nonfinite": "zero",
                      "schedule": "exponential", "decay": 0.75, "decay_steps": 5000,
                      "clip_norm": 5.0, "max_steps": 50_000, "max_epochs": 100_000,
                      "eval_every": 100, "test_checkpoint": "last"}
    metrics = (
        Metric("las", True, "LAS (Parser-v1: punctuation by gold XPOS excluded)", ".2f"),
        Metric("uas", True, "UAS (Parser-v1: punctuation by gold XPOS excluded)", ".2f"),
        Metric("las_all", True, "LAS (all words)", ".2f"),
        Metric("uas_all", True, "UAS (all words)", ".2f"),
        Metric("las_upos", True, "LAS (UPOS != PUNCT)", ".2f"),
        Metric("uas_upos", True, "UAS (UPOS != PUNCT)", ".2f"),
    )
    primary = metrics[0]
    dev_split = "dev"
    test_split = "test"

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._sentences: dict[tuple[str, bool], list[Sentence]] = {}  # read once per split
        self.pretrained_index: dict[str, int] | None = None
        self.pretrained_table: Tensor | None = None

    # -- data ------------------------------------------------------------------------
    def required_files(self) -> list[str]:
        """UD EWT (unless data.files names the user's treebank) and the catalogued vectors
        file model.pretrained names."""
        files = [] if self.data_cfg.files else [f.relpath for f in pdata.UD_EWT.files]
        entry = catalogue_entry(self.model_cfg.pretrained) if self.model_cfg.pretrained else None
        return files + ([entry[1].relpath] if entry else [])

    def check_data(self) -> list[str]:
        if self.data_cfg.files:
            lines = [f"{pdata.split_file(self.data_dir, s, self.data_cfg.files)}: present "
                     "(data.files: not checksummed)" for s in pdata.SPLITS]
        else:
            lines = verify_datasets(self.data_dir, [pdata.UD_EWT])
        if self.model_cfg.pretrained:
            path = pdata.resolve_pretrained(self.data_dir, self.model_cfg.pretrained)
            lines.append(f"{path}: present" + (" and verified" if catalogue_entry(
                self.model_cfg.pretrained) else " (not a catalogued file: not checksummed)"))
        return lines

    @classmethod
    def run_deviations(cls, config: RunConfig) -> list[str]:
        out = []
        if not config.model.pretrained:
            out.append("no pretrained vectors (Parser-v1 adds GloVe 6B 100d)")
        if config.model.encoder_lengths == "all":
            out.append("every word encoded (Parser-v1 never encodes a sentence's last word)")
        return out

    def _read(self, split: str, keep_lines: bool = False) -> list[Sentence]:
        """The split's sentences (read once per task object: build_artefacts and setup both
        need the training file)."""
        cache = self._sentences
        if (split, keep_lines) not in cache:
            d = self.data_cfg
            path = pdata.split_file(self.data_dir, split, d.files)
            if not d.files and d.verify:
                check_file(path, pdata.UD_EWT.file(f"en_ewt-ud-{split}.conllu"))
            cache[(split, keep_lines)] = read_conllu(path, keep_lines=keep_lines)
        return cache[(split, keep_lines)]

    def build_artefacts(self) -> dict[str, Any]:
        """The vocabularies of the training file (and the pretrained file's checksum)."""
        vocabs = build_vocabs(self._read("train"), self.data_cfg.min_word_count)
        out = vocabs.to_artefacts()
        if self.model_cfg.pretrained:
            path = pdata.resolve_pretrained(self.data_dir, self.model_cfg.pretrained,
                                            verify=self.data_cfg.verify)
            out["pretrained_sha256"] = pdata.file_sha256(path)
        return out

    def use_artefacts(self, artefacts: dict[str, Any]) -> None:
        super().use_artefacts(artefacts)
        self.vocabs = Vocabs.from_artefacts(artefacts)
        if self.model_cfg.pretrained and "pretrained_sha256" not in artefacts:
            raise DataError("this run's artefacts have no checksum of model.pretrained; they "
                            "were built without pretrained vectors.")

    def _load_pretrained(self) -> None:
        if not self.model_cfg.pretrained or self.pretrained_table is not None:
            return
        path = pdata.resolve_pretrained(self.data_dir, self.model_cfg.pretrained,
                                        verify=self.data_cfg.verify)
        expected = self.artefacts.get("pretrained_sha256")
        if expected and pdata.file_sha256(path) != expected:
            raise DataError(f"model.pretrained: {path} is not the file this run was trained with "
                            f"(sha256 differs from {expected}); the model's word vectors would "
                            "not match. Use the original file.")
        self.pretrained_index, self.pretrained_table = pdata.read_pretrained(path)
        words = self.vocabs.words.itos[3:]  # (PAD, ROOT, UNK)
        check_shared(path, sum(w.lower() in self.pretrained_index for w in words), len(words))

    def encode(self, sentences: list[Sentence]) -> Encoded:
        v = self.vocabs
        words, tags, heads, rels = [], [], [], []
        pret = [] if self.pretrained_index is not None else None
        for s in sentences:
            words.append([ROOT] + v.words.encode(s.words))
            tags.append([ROOT] + v.tags.encode(s.upos))
            heads.append([0] + list(s.heads))
            rels.append([-100] + [v.rels.stoi.get(r, -100) for r in s.deprels])
            if pret is not None:
                pret.append([ROOT] + [self.pretrained_index.get(w.lower(), UNK) for w in s.words])
        return Encoded(sentences, words, tags, heads, rels, pret)

    def setup(self, splits: Sequence[str] = ("train", "dev", "test")) -> None:
        self._load_pretrained()
        self.splits: dict[str, Encoded] = {}
        for split in splits:
            self.splits[split] = self.encode(self._read(split, keep_lines=split != "train"))
        if "train" in self.splits:
            lengths = self.splits["train"].lengths()  # ROOT counted, as in Parser-v1
            self.bucket_splits = kmeans_splits(lengths, self.data_cfg.n_buckets)
            self.buckets = assign_buckets(lengths, self.bucket_splits)

    # -- batches ---------------------------------------------------------------------
    def collate(self, split: str, idx: Sequence[int]) -> dict[str, Tensor]:
        enc = self.splits[split]
        batch = {
            "words": pad_ids([enc.words[i] for i in idx]),
            "tags": pad_ids([enc.tags[i] for i in idx]),
            "heads": pad_ids([enc.heads[i] for i in idx], 0),
            "rels": pad_ids([enc.rels[i] for i in idx], -100),
            "lengths": torch.tensor([len(enc.words[i]) for i in idx], dtype=torch.long),
        }
        if enc.pret is not None:
            batch["pret"] = pad_ids([enc.pret[i] for i in idx])
        return batch

    def train_plan(self, epoch: int, generator: torch.Generator) -> BatchPlan:
        """Parser-v1's minibatches of this epoch (see :func:`.buckets.epoch_groups`)."""
        groups = epoch_groups(self.buckets, self.bucket_splits, self.data_cfg.batch_tokens,
                              generator)
        return BatchPlan(groups, lambda idx: self.collate("train", idx))

    # -- model -----------------------------------------------------------------------
    def build_model(self, make_encoder) -> nn.Module:
        m = self.model_cfg
        table = self.pretrained_table
        word_size = table.shape[1] if table is not None else m.word_size
        enc = make_encoder(word_size + m.tag_size, m.hidden_size, num_layers=m.num_layers,
                           bidirectional=True, dropout=m.input_dropout,
                           recurrent_dropout=m.recurrent_dropout, variational_dropout=True,
                           **m.cell_options)
        return BiaffineParser(len(self.vocabs.words), len(self.vocabs.tags), len(self.vocabs.rels),
                              enc, word_size=word_size, tag_size=m.tag_size, arc_mlp=m.arc_mlp,
                              rel_mlp=m.rel_mlp, word_dropout=m.word_dropout,
                              tag_dropout=m.tag_dropout, input_dropout=m.input_dropout,
                              mlp_dropout=m.mlp_dropout, pretrained=table,
                              encoder_lengths=m.encoder_lengths)

    def loss(self, model: nn.Module, batch: dict[str, Tensor], carry: Any) -> StepOutput:
        arc, _, _, rel = model(batch["words"], batch["tags"], batch["lengths"], batch.get("pret"),
                               batch["heads"])  # relations scored at the gold heads
        loss, n = parser_loss(arc, rel, batch["heads"], batch["rels"], batch["lengths"])
        return StepOutput(loss, None, n)

    # -- length buckets (train.step_capture) ----------------------------------------------
    #: what each of a batch's (B, N) tensors is padded with (as :meth:`collate` pads them)
    PAD_VALUES = {"words": PAD, "tags": PAD, "pret": PAD, "heads": 0, "rels": -100}

    def batch_length(self, batch: dict[str, Tensor]) -> int:
        return batch["words"].shape[1]

    def pad_batch(self, batch: dict[str, Tensor], length: int) -> dict[str, Tensor]:
        """Every (B, N) tensor padded as :meth:`collate` pads it; the lengths unchanged, so
        the encoder, the head softmax (padded heads at the lowest float) and the loss (words
        only) read the real words only."""
        return {k: pad_to(v, 1, length, self.PAD_VALUES[k]) if k in self.PAD_VALUES else v
                for k, v in batch.items()}

    # -- evaluation --------------------------------------------------------------------
    @torch.no_grad()
    def predict(self, model: nn.Module, split: str) -> tuple[list[list[int]], list[list[str]]]:
        """Decoded heads and relations (words only) of every sentence of ``split``."""
        enc = self.splits[split]
        device = next(model.parameters()).device
        was_training = model.training
        model.eval()
        heads_out: list[list[int]] = [[] for _ in enc.words]
        rels_out: list[list[str]] = [[] for _ in enc.words]
        root_rel = self.vocabs.rels.stoi.get("root")
        try:
            for idx in eval_groups(enc.lengths(), self.eval_cfg.batch_tokens):
                b = self.batch_to(self.collate(split, idx), device)
                arc, rel_dep, rel_head, _ = model(b["words"], b["tags"], b["lengths"], b.get("pret"))
                arc_lp = torch.log_softmax(arc.double(), dim=-1).cpu().numpy()
                lengths = b["lengths"].tolist()
                pred = torch.zeros(b["heads"].shape, dtype=torch.long)  # decoded on the CPU
                for row, n in enumerate(lengths):
                    pred[row, :n] = torch.as_tensor(decode_heads(arc_lp[row, :n, :n],
                                                                 self.eval_cfg.decoder))
                rel = model.rel_scores(rel_dep, rel_head, pred.to(device))  # at the decoded heads
                rel_lp = torch.log_softmax(rel.double(), dim=-1).cpu().numpy()
                for row, (i, n) in enumerate(zip(idx, lengths)):
                    r = parser_v1_rels(rel_lp[row, :n], root_rel)
                    heads_out[i] = pred[row, 1:n].tolist()
                    rels_out[i] = [self.vocabs.rels.itos[k] for k in r[1:]]
        finally:
            model.train(was_training)
        return heads_out, rels_out

    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: str, *, final: bool = False) -> dict[str, float]:
        heads, rels = self.predict(model, split)
        counter = AttachmentCounter()
        for s, h, r in zip(self.splits[split].sentences, heads, rels):
            counter.add(s, h, r)
        return counter.scores()

    @torch.no_grad()
    def evaluate_items(self, model: nn.Module, split: str
                       ) -> tuple[dict[str, float], list[dict[str, Any]]]:
        """:meth:`evaluate`, and one record per sentence (file order): ``{"id": index, and for
        each punctuation convention c in "" (Parser-v1's), "_all", "_upos": "scored<c>": words
        scored, "heads<c>": with the right head, "labels<c>": right head and relation}``."""
        heads, rels = self.predict(model, split)
        total, records = AttachmentCounter(), []
        for i, (s, h, r) in enumerate(zip(self.splits[split].sentences, heads, rels)):
            one = AttachmentCounter()
            one.add(s, h, r)
            total.add(s, h, r)
            records.append({"id": i, **{f"{what}{c}": getattr(one, attr)[c] for c in CONVENTIONS
                                        for what, attr in (("scored", "total"), ("heads", "heads"),
                                                           ("labels", "labels"))}})
        return total.scores(), records

    def item_metrics(self) -> dict[str, ItemMetric]:
        """UAS = 100 heads / scored, LAS = 100 labels / scored, per convention."""
        return {f"{m}{c}": ItemMetric(f"{m}{c}", record_fields(f"{what}{c}", f"scored{c}"),
                                      ratio(100.0))
                for m, what in (("las", "labels"), ("uas", "heads")) for c in CONVENTIONS}

    def reference_items(self, split: str) -> list[str]:
        """The gold trees: each sentence's words with their UPOS, gold head and relation."""
        return ["\n".join(f"{w}\t{u}\t{h}\t{r}" for w, u, h, r in
                          zip(s.words, s.upos, s.heads, s.deprels))
                for s in self.splits[split].sentences]

    def item_key(self, record: Mapping[str, Any]) -> Any:
        return record["id"], record["scored_all"], record["scored"], record["scored_upos"]

    @torch.no_grad()
    def write_predictions(self, model: nn.Module, split: str, path: Path) -> dict[str, float]:
        """The split's sentences with predicted HEAD and DEPREL as CoNLL-U (every other
        column from the input file; DEPS '_'), scored against the gold file."""
        heads, rels = self.predict(model, split)
        write_conllu(path, self.splits[split].sentences, heads, rels)
        gold = pdata.split_file(self.data_dir, split, self.data_cfg.files)
        return score_files(gold, path)

    def visualization_inputs(self, model: nn.Module, text: str):
        """The encoder and its inputs for ``text``: words separated by spaces, each optionally
        tagged ``word/UPOS`` (an untagged word reads the unknown tag).  Position 0 is the
        ROOT token, as in training.  No dropout (eval mode)."""
        tokens = text.split()
        if not tokens:
            raise UserError("--text is empty; give a sentence, e.g. 'The/DET stock/NOUN fell/VERB'.")
        words, tags, labels = [ROOT], [ROOT], ["<root>"]
        for tok in tokens:
            word, slash, tag = tok.rpartition("/")
            if not slash or not word:
                word, tag = tok, ""
            if tag and tag not in self.vocabs.tags.stoi:
                known = " ".join(self.vocabs.tags.itos[3:])
                raise UserError(f"--text: unknown tag {tag!r} in {tok!r}; tags are {known} "
                                "(write word/TAG, or the word alone)")
            words.append(self.vocabs.words.index(word))
            tags.append(self.vocabs.tags.stoi[tag] if tag else UNK)
            labels.append(word)
        device = next(model.parameters()).device
        pret = None
        if getattr(model, "pretrained", None) is not None and self.pretrained_index is not None:
            pret = torch.tensor([[ROOT] + [self.pretrained_index.get(w.lower(), UNK)
                                            for w in labels[1:]]], device=device)
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                x = model.embed(torch.tensor([words], device=device),
                                torch.tensor([tags], device=device), pret)
        finally:
            model.train(was_training)
        return model.encoder, x, labels

