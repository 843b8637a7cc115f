"""The SQuAD v1.1 task plugins: ``squad-drqa`` (the DrQA document reader) and ``squad-bidaf``
(BiDAF as in AllenNLP early 2018) — Levy et al. (2018)'s Table 2, every recurrent layer of
either reader built by the run's ``--cell``.

Why two task names rather than one task with ``model.reader``: the two original systems
differ in everything a task declares — the metric that selects the checkpoint (DrQA dev F1,
AllenNLP dev EM), the optimiser (Adamax vs Adam β=(0.9, 0.9)) and schedule, batch size,
vocabulary (cased words + manual features vs lower-cased words + characters), the training
target among several annotations and the span decoder (at most 15 tokens vs no limit) — so
each gets its own defaults, and a run's task name says which protocol it followed.

Shared here (:class:`SquadTask`): data (official files, or the **stand-in** split of the dev
file by article, ``data.splitting: dev-by-article``), tokenisation with character offsets
(spaCy's English tokenizer as both originals, or the built-in regular expressions),
batching, the loss NLL(start) + NLL(end), best-span decoding, and evaluation with the
official v1.1 EM/F1 on the exact original text of each predicted span; ``write_predictions``
writes the official ``{question id: answer}`` JSON and scores that file.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from collections import Counter
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from lstmablate.batching import BatchPlan
from lstmablate.config import RunConfig
from lstmablate.data import verify
from lstmablate.errors import ConfigError, DataError, UserError
from lstmablate.task import ItemMetric, Metric, StepOutput, Task, ratio, record_fields
from lstmablate.train.buckets import pad_to

from . import data as squad_data
from ..vectors import GLOVE_6B_100D, GLOVE_840B_300D, catalogue_entry, pretrained_path
from .batches import eval_batches, length_sorted_batches, random_batches
from .config import BiDAFData, BiDAFEval, BiDAFModel, DrQAData, DrQAModel, SquadEval
from .decode import best_spans
from .drqa import DrQAReader
from .examples import SquadExamples, tokenize_articles
from .features import FEATURES, TAGGER_FEATURES, feature_size, token_features
from .metrics import (exact_match_score, f1_score, max_over_gold, read_predictions,
                      score_predictions)
from .tokenizer import make_tokenizer
from .vocab import Vocab, build_vocab, frequency_order, read_vectors, vector_file_words

SPLITS = ("train", "dev")


class SquadTask(Task):
    """What both readers share; subclasses set the configs and the model hooks."""

    datasets = (squad_data.SQUAD_DATASET,)
    # run folders saved before these keys existed tokenised with the regex rules and drew
    # length-sorted batches
    added_keys = {"data.tokenizer": "regex", "data.batch_order": "length"}
    metrics = (Metric("f1", True, "F1", ".2f"), Metric("em", True, "EM", ".2f"))
    primary = metrics[0]
    # SQuAD's test set is hidden: both systems select on dev and report dev (the official
    # protocol); the final ("test") evaluation is the best checkpoint on dev
    dev_split = "dev"
    test_split = "dev"
    #: which annotated span is the training target, and how answers become spans (examples.py)
    target_rule: ClassVar[str] = "first"
    span_rule: ClassVar[str] = "exact"
    #: spaCy tokenizer: whitespace as spaces before tokenising, keep spaCy's whitespace tokens
    clean_spaces: ClassVar[bool] = True
    keep_space: ClassVar[bool] = True
    #: the pretrained vectors the original system used (for messages and run_deviations)
    original_vectors: ClassVar[str] = ""
    #: the batch entries holding paragraph and question lengths (tokens/s of progress lines)
    length_keys: ClassVar[tuple[str, ...]] = ()

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._tokenizer: Any = None  # built on first use (spaCy is loaded only when needed)
        self.examples: dict[str, SquadExamples] = {}
        self.train_indices: list[int] = []
        self.reads_training_data = False  # setup() was asked for the train split

    # -- data ------------------------------------------------------------------------------
    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            d = self.data_cfg
            self._tokenizer = make_tokenizer(d.tokenizer, split_hyphens=d.split_hyphens,
                                             pipeline=d.tagger, clean_spaces=self.clean_spaces,
                                             keep_space=self.keep_space)
        return self._tokenizer

    def _vectors_path(self) -> Path:
        """model.pretrained: verified when it is a catalogued GloVe file (see vectors.py)."""
        return pretrained_path(self.data_dir, self.model_cfg.pretrained,
                               original=self.original_vectors, verify=self.data_cfg.verify)

    @classmethod
    def run_deviations(cls, config: RunConfig) -> list[str]:
        out = []
        if not config.model.pretrained:
            out.append(f"no pretrained vectors ({cls.original_vectors})")
        if config.data.tokenizer != "spacy":
            out.append("regular-expression tokenizer (the original tokenised with spaCy)")
        return out

    @property
    def standin(self) -> bool:
        return self.data_cfg.splitting == "dev-by-article"

    def _squad_files(self) -> list[str]:
        """The stand-in split reads the dev file only."""
        d = self.data_cfg
        return [d.dev_file] if self.standin else [d.train_file, d.dev_file]

    def required_files(self) -> list[str]:
        """The SQuAD files, and the catalogued vectors file ``model.pretrained`` names."""
        entry = catalogue_entry(self.model_cfg.pretrained) if self.model_cfg.pretrained else None
        return self._squad_files() + ([entry[1].relpath] if entry else [])

    def _verify(self, relpath: str) -> str:
        """Compare a file's checksum with the catalogue (DataError if it differs)."""
        if not any(df.relpath == relpath for df in squad_data.SQUAD_DATASET.files):
            return f"{relpath}: not a catalogued SQuAD file (no checksum to compare)"
        (r,) = verify(self.data_dir, squad_data.SQUAD_DATASET, relpath)
        if r.status not in ("ok", "unchecked"):
            raise DataError(r.message)
        return f"{r.path}: {r.algo} ok" if r.ok else f"{r.path}: {r.message}"

    def check_data(self) -> list[str]:
        lines = [self._verify(rel) for rel in self._squad_files()]
        if self.model_cfg.pretrained:
            lines.append(f"{self._vectors_path()}: present")
        if self.standin:
            lines.append(f"stand-in split: {self.data_cfg.dev_file} by article, the last "
                         f"{self.data_cfg.standin_dev_articles} articles evaluate")
        return lines

    def _load(self, split: str) -> SquadExamples:
        if split not in SPLITS:
            raise UserError(f"the SQuAD tasks have the splits {', '.join(SPLITS)}; got {split!r}.")
        if split in self.examples:
            return self.examples[split]
        d = self.data_cfg
        try:
            if d.verify:
                self._verify(d.dev_file if (self.standin or split == "dev") else d.train_file)
            articles = squad_data.load_split(self.data_dir, d.splitting, split,
                                             d.standin_dev_articles, d.train_file, d.dev_file)
        except DataError as e:
            if split == "train" and not self.standin and "not found" in str(e):
                raise DataError(f"{e} Without the official training file, the stand-in split of "
                                "the dev file by article can be used instead (not the paper's "
                                "protocol): --set data.splitting=dev-by-article, or the recipes "
                                "squad-drqa-standin-dev-split / squad-bidaf-standin-dev-split."
                                ) from None
            raise
        ex = tokenize_articles(articles, self.tokenizer, self.target_rule, self.span_rule)
        self.examples[split] = ex
        return ex

    def build_artefacts(self) -> dict[str, Any]:
        return self.build_vocabularies(self._train_questions(self._load("train")))

    def _train_questions(self, ex: SquadExamples) -> SquadExamples:
        """The training examples, limited to the first ``max_train_questions`` trainable
        ones when that is set (their paragraphs only)."""
        n = self.data_cfg.max_train_questions
        if not n:
            return ex
        keep = [q for q in ex.questions if q.target is not None][:n]
        if len(keep) < n:
            raise ConfigError(f"data.max_train_questions={n}, but the training data has only "
                              f"{len(keep)} questions with an answer on token boundaries.")
        pars = sorted({q.paragraph for q in keep})
        new = {p: i for i, p in enumerate(pars)}
        return SquadExamples([ex.paragraphs[p] for p in pars],
                             [dataclasses.replace(q, paragraph=new[q.paragraph]) for q in keep])

    def setup(self, splits: Sequence[str] = SPLITS) -> None:
        self.reads_training_data = "train" in splits
        for split in splits:
            ex = self._load(split)
            if split == "train":
                ex = self._train_questions(ex)
                self.examples["train"] = ex
                self.train_indices = [i for i, q in enumerate(ex.questions) if q.target is not None]
                if not self.train_indices:
                    raise DataError("no training question has an answer on token boundaries; "
                                    "the training file is empty or not SQuAD.")
            elif not ex.questions:  # checked before training, not at its first evaluation
                raise DataError(f"the {split} split has no question to evaluate; its file holds "
                                "paragraphs without questions.")

    def split_summary(self, split: str) -> str:
        ex = self.examples[split]
        return (f"{split}: {len(ex.paragraphs)} paragraphs, {len(ex.questions)} questions"
                + (f", {ex.n_trainable} with a trainable answer span" if split == "train" else ""))

    def train_plan(self, epoch: int, generator: torch.Generator) -> Sequence[dict[str, Tensor]]:
        ex = self.examples["train"]
        if self.data_cfg.batch_order == "random":
            groups = random_batches(self.train_indices, self.data_cfg.batch_size, generator)
        else:
            groups = length_sorted_batches(ex, self.train_indices, self.data_cfg.batch_size,
                                           generator)
        return BatchPlan(groups, lambda g: self.collate(ex, g))

    # -- reader hooks ------------------------------------------------------------------------
    def build_vocabularies(self, train: SquadExamples) -> dict[str, Any]:
        raise NotImplementedError

    def collate(self, ex: SquadExamples, group: Sequence[int]) -> dict[str, Tensor]:
        raise NotImplementedError

    def span_scores(self, model: nn.Module, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """(start, end) scores (B, T), -inf at padding."""
        raise NotImplementedError

    # -- loss and evaluation -----------------------------------------------------------------
    def loss(self, model: nn.Module, batch: dict[str, Tensor], carry: Any) -> StepOutput:
        start, end = self.span_scores(model, batch)
        # NLL(start) + NLL(end), each averaged over the batch (DrQA and BiDAF alike)
        loss = (F.cross_entropy(start, batch["start"]) + F.cross_entropy(end, batch["end"]))
        tokens = sum(batch[k].sum() for k in self.length_keys)  # stays on the device
        return StepOutput(loss, None, float(batch["start"].numel()), tokens=tokens)

    @torch.no_grad()
    def predict(self, model: nn.Module, split: str) -> dict[str, str]:
        """{question id: the exact context text of the best span} for every question."""
        ex = self.examples.get(split) or self._load(split)
        was_training = model.training
        model.eval()
        device = next(model.parameters()).device
        max_span = self.eval_cfg.max_span or None
        preds: dict[str, str] = {}
        try:
            for group in eval_batches(ex, self.eval_cfg.batch_size):
                batch = self.batch_to(self.collate(ex, group), device)
                start, end = self.span_scores(model, batch)
                first, last, _ = best_spans(start.float().log_softmax(-1),
                                            end.float().log_softmax(-1), max_span)
                for k, qi in enumerate(group):
                    q = ex.questions[qi]
                    preds[q.qid] = ex.paragraphs[q.paragraph].span_text(int(first[k]), int(last[k]))
        finally:
            model.train(was_training)
        return preds

    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: str, *, final: bool = False) -> dict[str, float]:
        ex = self.examples.get(split) or self._load(split)
        return score_predictions(ex.gold(), self.predict(model, split))

    @torch.no_grad()
    def evaluate_items(self, model: nn.Module, split: str
                       ) -> tuple[dict[str, float], list[dict[str, Any]]]:
        """:meth:`evaluate`, and one record per question (file order): ``{"id": question
        id, "em": 0|1, "f1": 0..1}`` (the official v1.1 definitions, max over gold answers)."""
        ex = self.examples.get(split) or self._load(split)
        preds = self.predict(model, split)
        gold = list(ex.gold())
        records = [{"id": qid,
                    "em": max_over_gold(exact_match_score, preds[qid], golds) if qid in preds else 0.0,
                    "f1": max_over_gold(f1_score, preds[qid], golds) if qid in preds else 0.0}
                   for qid, golds in gold]
        return score_predictions(gold, preds), records

    def item_metrics(self) -> dict[str, ItemMetric]:
        return {m.name: ItemMetric(m.name, record_fields(m.name, "items"), ratio(100.0))
                for m in self.metrics}

    def reference_items(self, split: str) -> list[str]:
        """Each question's id and its gold answer texts (tab-separated, file order): what the
        scorer compares with, independent of the reader's tokenizer."""
        return ["\t".join((qid, *golds)) for qid, golds in self._load(split).gold()]

    def write_predictions(self, model: nn.Module, split: str, path: Path) -> dict[str, float]:
        """The official prediction file {question id: answer text} (UTF-8 JSON), scored by
        reading it back with the official v1.1 definitions."""
        from lstmablate.io import atomic_write_text

        preds = self.predict(model, split)
        atomic_write_text(path, json.dumps(preds, ensure_ascii=False, indent=1) + "\n")
        return score_predictions(self.examples[split].gold(), read_predictions(Path(path)))


# -- DrQA ------------------------------------------------------------------------------------
class DrQATask(SquadTask):
    name = "squad-drqa"
    description = ("SQuAD v1.1, DrQA document reader (Chen et al. 2017; hitvoice/facebookresearch "
                   "DrQA defaults): official EM/F1 on dev, selection by dev F1")
    DataConfig = DrQAData
    ModelConfig = DrQAModel
    EvalConfig = SquadEval
    datasets = (squad_data.SQUAD_DATASET, GLOVE_840B_300D)
    added_keys = {**SquadTask.added_keys, "model.fixed_rows": "constant"}
    # hitvoice/DrQA: Adamax (PyTorch defaults, lr 0.002), clip 10, 40 epochs, batch 32
    train_defaults = {"optimizer": "adamax", "lr": 0.002, "clip_norm": 10.0, "max_epochs": 40}
    target_rule = "first"
    original_vectors = "DrQA uses GloVe 840B 300d"

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        tagged = [f for f in self.model_cfg.features if f in TAGGER_FEATURES]
        if tagged and not self.data_cfg.tagger:
            raise ConfigError(
                f"model.features {tagged} need a spaCy pipeline with a tagger and NER: set "
                "data.tagger (e.g. en_core_web_md, as squad-drqa; `python -m spacy download "
                "en_core_web_md`), or leave them out: --set model.features=[em_cased,"
                "em_uncased,tf] (the report marks such runs).")

    @classmethod
    def run_deviations(cls, config: RunConfig) -> list[str]:
        out = super().run_deviations(config)
        missing = [f for f in FEATURES if f not in config.model.features]
        if missing:
            out.append(f"without DrQA's features {', '.join(missing)}")
        return out

    def build_vocabularies(self, train: SquadExamples) -> dict[str, Any]:
        """hitvoice/DrQA's vocabulary: question words then context words by frequency; with
        pretrained vectors, those of the training *and* dev data that have a vector (a dev
        word reads its fixed vector), words compared in NFD form; POS and entity tags of both."""
        m = self.model_cfg
        norm = "NFD"
        parts = [train]
        if m.pretrained or self.data_cfg.tagger:
            parts.append(self._load("dev"))  # words (and tags) only: no answer is read
        keep = vector_file_words(self._vectors_path(), m.embedding_dim, norm) if m.pretrained else None
        vparts = parts if m.pretrained else parts[:1]
        normal = Vocab(["<PAD>", "<UNK>"], norm).normal
        q_words = (normal(w) for ex in vparts for q in ex.questions for w in q.words)
        c_words = (normal(w) for ex in vparts for p in ex.paragraphs for w in p.words)
        words = build_vocab(q_words, c_words, keep)
        n_tuned = min(m.tune_partial + 2, len(words)) if m.pretrained else len(words)
        out = {"words": words, "normalize": norm, "features": list(m.features), "n_tuned": n_tuned,
               "embeddings": (f"pretrained {m.pretrained}, rows 0..{n_tuned - 1} trained, "
                              f"the other {len(words) - n_tuned} fixed ({m.fixed_rows})"
                              if m.pretrained else "trainable, N(0, 1) initialisation")}
        if "pos" in m.features or "ner" in m.features:
            ctx = [t for ex in parts for p in ex.paragraphs for t in p.tokens]
            out["pos_tags"] = frequency_order(Counter(t.tag for t in ctx))
            out["ner_tags"] = frequency_order(Counter(t.ent for t in ctx))
        return out

    def use_artefacts(self, artefacts: dict[str, Any]) -> None:
        super().use_artefacts(artefacts)
        self.vocab = Vocab(artefacts["words"], artefacts.get("normalize", ""))
        self.features = tuple(artefacts["features"])
        self.n_tuned = int(artefacts["n_tuned"])
        self.pos_tags = tuple(artefacts.get("pos_tags", ()))
        self.ner_tags = tuple(artefacts.get("ner_tags", ()))

    def build_model(self, make_encoder) -> nn.Module:
        m = self.model_cfg
        V, E = len(self.vocab), m.embedding_dim
        weight = torch.randn(V, E)  # nn.Embedding's N(0, 1): <UNK> keeps it, as in both DrQAs
        if m.pretrained and self.reads_training_data:  # evaluation reads the embeddings from the checkpoint
            vectors, found = read_vectors(self._vectors_path(), E, self.vocab)
            weight[2:] = vectors[2:]  # every kept word has a vector (the vocabulary was restricted)
        n_features = feature_size(self.features, self.pos_tags, self.ner_tags)
        return DrQAReader(make_encoder, weight, self.n_tuned, n_features,
                          hidden_size=m.hidden_size, doc_layers=m.doc_layers,
                          question_layers=m.question_layers, concat_layers=m.concat_layers,
                          use_qemb=m.use_qemb, question_merge=m.question_merge,
                          dropout_emb=m.dropout_emb, dropout_rnn=m.dropout_rnn,
                          dropout_rnn_output=m.dropout_rnn_output, cell_options=m.cell_options,
                          fixed_grad=bool(m.pretrained) and m.fixed_rows == "reset")

    length_keys = ("doc_len", "q_len")  # the batch's paragraph and question lengths

    def collate(self, ex: SquadExamples, group: Sequence[int]) -> dict[str, Tensor]:
        qs = [ex.questions[i] for i in group]
        docs = [ex.paragraphs[q.paragraph].tokens for q in qs]
        B, T = len(qs), max(len(d) for d in docs)
        Q = max(max(len(q.tokens) for q in qs), 1)
        doc_ids = torch.zeros(B, T, dtype=torch.long)
        q_ids = torch.zeros(B, Q, dtype=torch.long)
        feats = torch.zeros(B, T, feature_size(self.features, self.pos_tags, self.ner_tags))
        for b, (q, d) in enumerate(zip(qs, docs)):
            doc_ids[b, :len(d)] = torch.tensor(self.vocab.ids(t.text for t in d))
            if q.tokens:
                q_ids[b, :len(q.tokens)] = torch.tensor(self.vocab.ids(q.words))
            feats[b, :len(d)] = token_features(d, q.tokens, self.features, self.pos_tags,
                                               self.ner_tags)
        target = [q.target if q.target is not None else (-100, -100) for q in qs]
        return {"doc_ids": doc_ids, "doc_len": torch.tensor([len(d) for d in docs]),
                "doc_feats": feats, "q_ids": q_ids,
                "q_len": torch.tensor([max(len(q.tokens), 1) for q in qs]),
                "start": torch.tensor([t[0] for t in target]),
                "end": torch.tensor([t[1] for t in target])}

    def span_scores(self, model: nn.Module, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        return model(batch["doc_ids"], batch["doc_len"], batch["doc_feats"], batch["q_ids"],
                     batch["q_len"])

    # -- length buckets (train.step_capture) ------------------------------------------------
    def batch_length(self, batch: dict[str, Tensor]) -> tuple[int, int]:
        """(paragraph tokens, question tokens) of the batch's padded tensors."""
        return batch["doc_ids"].shape[1], batch["q_ids"].shape[1]

    def pad_batch(self, batch: dict[str, Tensor], length: tuple[int, int]) -> dict[str, Tensor]:
        """Paragraph ids and features, question ids padded with zeros (``<PAD>``, as
        :meth:`collate`); the lengths unchanged: the encoders, the aligned question
        embedding, the question merge and the span scores (-inf) mask what is padded."""
        T, Q = length
        return {**batch, "doc_ids": pad_to(batch["doc_ids"], 1, T, 0),
                "doc_feats": pad_to(batch["doc_feats"], 1, T, 0),
                "q_ids": pad_to(batch["q_ids"], 1, Q, 0)}

    def visualization_inputs(self, model: nn.Module, text: str):
        """The question encoder's first layer and the embedded words of ``text`` (tokenised
        as questions are; unknown words read as <UNK>)."""
        words = [t.text for t in self.tokenizer.tokenize(text)]
        if not words:
            raise UserError("--text is empty; give a question, e.g. 'Who won Super Bowl 50?'.")
        device = next(model.parameters()).device
        emb = model.embedding(torch.tensor([self.vocab.ids(words)], device=device))
        labels = [w if w in self.vocab else f"{w} (<UNK>)" for w in words]
        return model.question_rnn.layers[0], emb, labels


# -- BiDAF -----------------------------------------------------------------------------------
class BiDAFTask(SquadTask):
    name = "squad-bidaf"
    description = ("SQuAD v1.1, BiDAF as in AllenNLP's early-2018 bidaf.json: official EM/F1 on "
                   "dev, selection by dev EM")
    DataConfig = BiDAFData
    ModelConfig = BiDAFModel
    EvalConfig = BiDAFEval
    metrics = (Metric("em", True, "EM", ".2f"), Metric("f1", True, "F1", ".2f"))
    primary = metrics[0]  # AllenNLP validation_metric "+em"
    # AllenNLP's training_config/bidaf.json (c66fac02): Adam β (0.9, 0.9) lr 1e-3, grad norm 5,
    # 20 epochs, early-stopping patience 10, ReduceLROnPlateau(factor 0.5, patience 2) on dev EM
    train_defaults = {"optimizer": "adam", "lr": 0.001, "betas": (0.9, 0.9), "clip_norm": 5.0,
                      "max_epochs": 20, "patience": 10, "schedule": "plateau", "decay": 0.5,
                      "plateau_patience": 2}
    target_rule = "most_common"  # AllenNLP: the span most annotators gave
    span_rule = "allennlp"  # every answer gives a span, covering an answer that cuts a token
    clean_spaces = keep_space = False  # AllenNLP's SpacyWordSplitter: raw text, no space tokens
    datasets = (squad_data.SQUAD_DATASET, GLOVE_6B_100D)
    added_keys = {**SquadTask.added_keys, "model.char_windows": "word"}
    original_vectors = "AllenNLP's BiDAF uses GloVe 6B 100d, frozen"

    def build_vocabularies(self, train: SquadExamples) -> dict[str, Any]:
        """Lower-cased words by frequency (AllenNLP ``lowercase_tokens``).  With frozen
        pretrained vectors the dev passages' and questions' words are added too, as AllenNLP
        built its vocabulary from the train and validation data (no labels are read): a frozen
        vector needs no training example."""
        words = [w.lower() for q in train.questions for w in q.words]
        words += [w.lower() for p in train.paragraphs for w in p.words]
        if self.model_cfg.pretrained:
            dev = self._load("dev")
            words += [w.lower() for q in dev.questions for w in q.words]
            words += [w.lower() for p in dev.paragraphs for w in p.words]
        vocab = build_vocab(words, [])
        return {"words": vocab,
                "embeddings": (f"pretrained {self.model_cfg.pretrained}, frozen"
                               if self.model_cfg.pretrained else "trainable, Xavier-uniform")}

    def use_artefacts(self, artefacts: dict[str, Any]) -> None:
        super().use_artefacts(artefacts)
        self.vocab = Vocab(artefacts["words"])

    def build_model(self, make_encoder) -> nn.Module:
        from .bidaf import BiDAFReader

        m = self.model_cfg
        weight = torch.empty(len(self.vocab), m.word_dim)
        nn.init.xavier_uniform_(weight)
        if m.pretrained and self.reads_training_data:  # evaluation reads the embeddings from the checkpoint
            vectors, found = read_vectors(self._vectors_path(), m.word_dim, self.vocab,
                                          "model.word_dim")
            have = vectors.abs().sum(1) > 0
            if have.any():  # AllenNLP: words without a vector ~ N(mean, std) of the vectors
                mean, std = vectors[have].mean(), vectors[have].std()
                weight = torch.where(have.unsqueeze(1), vectors,
                                     torch.randn_like(vectors) * std + mean)
        weight[0] = 0.0
        return BiDAFReader(make_encoder, weight, train_words=not m.pretrained,
                           char_dim=m.char_dim, char_filters=m.char_filters,
                           char_width=m.char_width, char_dropout=m.char_dropout,
                           highway_layers=m.highway_layers, hidden_size=m.hidden_size,
                           modeling_layers=m.modeling_layers, dropout=m.dropout,
                           cell_options=m.cell_options)

    def _word_ids(self, seqs: list[list[str]], distinct: dict[tuple[str, str], int],
                  field_name: str) -> tuple[Tensor, ...]:
        """(lower-cased word ids, indices into the batch's distinct words, lengths) of ``seqs``,
        adding new words to ``distinct`` ((field, word) -> row; with char_windows=batch a word
        of the passages and the same word of the questions are two rows, as their padded
        widths may differ)."""
        B, T = len(seqs), max(max(len(s) for s in seqs), 1)
        words = torch.zeros(B, T, dtype=torch.long)
        index = torch.zeros(B, T, dtype=torch.long)
        key = field_name if self.model_cfg.char_windows == "batch" else ""
        for b, s in enumerate(seqs):
            if s:
                words[b, :len(s)] = torch.tensor(self.vocab.ids(w.lower() for w in s))
                index[b, :len(s)] = torch.tensor([distinct.setdefault((key, w), len(distinct))
                                                  for w in s])
        return words, index, torch.tensor([max(len(s), 1) for s in seqs])

    def _char_table(self, distinct: dict[tuple[str, str], int]) -> tuple[Tensor, Tensor, Tensor]:
        """(N, W) character ids of the distinct words (W >= the filter width), (N,) lengths and
        (N,) the number of CNN windows of each: inside the word padded to the filter width, or
        (char_windows=batch, AllenNLP) every window of its field's padded width."""
        from .bidaf import token_char_ids

        width = self.model_cfg.char_width
        ids = [token_char_ids(w) for _, w in distinct] or [[]]
        fields = [f for f, _ in distinct] or [""]
        padded = {}  # field -> its padded width (the longest word of that field in the batch)
        for f, c in zip(fields, ids):
            padded[f] = max(padded.get(f, width), len(c))
        W = max(padded.values())
        chars = torch.zeros(len(ids), W, dtype=torch.long)
        for k, c in enumerate(ids):
            chars[k, :len(c)] = torch.tensor(c, dtype=torch.long)
        lengths = torch.tensor([len(c) for c in ids])
        if self.model_cfg.char_windows == "batch":
            windows = torch.tensor([padded[f] - width + 1 for f in fields])
        else:
            windows = lengths.clamp(min=width) - width + 1
        return chars, lengths, windows

    #: batch entries shared by all its rows (the distinct words' characters): not split
    #: between processes under torchrun
    shared_keys = ("chars", "char_len", "char_windows")
    length_keys = ("p_len", "q_len")  # the batch's paragraph and question lengths

    def shard(self, batch: Any, dist_info: Any) -> Any:
        from lstmablate.batching import shard_batch

        rows = shard_batch({k: v for k, v in batch.items() if k not in self.shared_keys}, dist_info)
        return {**rows, **{k: batch[k] for k in self.shared_keys}}

    def collate(self, ex: SquadExamples, group: Sequence[int]) -> dict[str, Tensor]:
        qs = [ex.questions[i] for i in group]
        distinct: dict[tuple[str, str], int] = {}
        pw, pi, pl = self._word_ids([ex.paragraphs[q.paragraph].words for q in qs], distinct, "p")
        qw, qi, ql = self._word_ids([q.words for q in qs], distinct, "q")
        chars, char_len, windows = self._char_table(distinct)
        target = [q.target if q.target is not None else (-100, -100) for q in qs]
        return {"chars": chars, "char_len": char_len, "char_windows": windows,
                "p_words": pw, "p_index": pi, "p_len": pl,
                "q_words": qw, "q_index": qi, "q_len": ql,
                "start": torch.tensor([t[0] for t in target]),
                "end": torch.tensor([t[1] for t in target])}

    def span_scores(self, model: nn.Module, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        return model(batch["chars"], batch["char_len"], batch["p_words"], batch["p_index"],
                     batch["p_len"], batch["q_words"], batch["q_index"], batch["q_len"],
                     batch["char_windows"])

    # -- length buckets (train.step_capture) ------------------------------------------------
    def batch_length(self, batch: dict[str, Tensor]) -> tuple[int, int, int, int]:
        """(passage tokens, question tokens, distinct words, characters per word) of the
        batch's padded tensors: its shape varies in all four."""
        return (batch["p_words"].shape[1], batch["q_words"].shape[1], batch["chars"].shape[0],
                batch["chars"].shape[1])

    def pad_batch(self, batch: dict[str, Tensor], length: tuple[int, int, int, int]
                  ) -> dict[str, Tensor]:
        """Passage and question words and their rows in the character table padded with 0
        (as :meth:`collate`; the lengths unchanged, so the encoders, the attention flow and
        the span scores mask them); the character table gets rows no position reads (no
        character, one window) and columns of padding characters, which no window that
        enters the CNN's max reaches (``char_windows`` unchanged)."""
        T, J, N, W = length
        return {**batch,
                "p_words": pad_to(batch["p_words"], 1, T, 0),
                "p_index": pad_to(batch["p_index"], 1, T, 0),
                "q_words": pad_to(batch["q_words"], 1, J, 0),
                "q_index": pad_to(batch["q_index"], 1, J, 0),
                "chars": pad_to(pad_to(batch["chars"], 0, N, 0), 1, W, 0),
                "char_len": pad_to(batch["char_len"], 0, N, 0),
                "char_windows": pad_to(batch["char_windows"], 0, N, 1)}

    def visualization_inputs(self, model: nn.Module, text: str):
        """The phrase layer and the highway outputs of ``text``'s tokens."""
        words = [t.text for t in self.tokenizer.tokenize(text)]
        if not words:
            raise UserError("--text is empty; give a question, e.g. 'Who won Super Bowl 50?'.")
        device = next(model.parameters()).device
        distinct: dict[tuple[str, str], int] = {}
        w, index, _ = self._word_ids([words], distinct, "q")
        chars, char_len, windows = self._char_table(distinct)
        vectors = model.chars(chars.to(device), char_len.to(device), windows.to(device))
        labels = [t if t.lower() in self.vocab else f"{t} (<UNK>)" for t in words]
        return model.phrase, model.embed(w.to(device), vectors, index.to(device)), labels
