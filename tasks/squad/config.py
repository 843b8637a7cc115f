"""The configuration sections of the two SQuAD tasks: the data and evaluation settings both
readers share, and each reader's data defaults and model (DrQA's and AllenNLP BiDAF's
published values are the defaults; every field is checked by ``validate``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from lstmablate.config import MAX_BATCH, MAX_LAYERS, MAX_WIDTH, check_range
from lstmablate.errors import ConfigError, UnknownNameError

from . import data as squad_data
from .features import BASIC_FEATURES, FEATURES
from .tokenizer import TOKENIZERS

BATCH_ORDERS = ("length", "random")


# -- configs shared by both readers ---------------------------------------------------------
@dataclass
class SquadData:
    # official: train-v1.1.json / dev-v1.1.json.  dev-by-article: the STAND-IN for machines
    # without the training file: the articles of dev-v1.1.json in file order, all but the last
    # `standin_dev_articles` to train, those to evaluate (no article in both)
    splitting: str = "official"
    standin_dev_articles: int = 10
    train_file: str = squad_data.TRAIN_FILE  # relative to the data directory (.gz accepted)
    dev_file: str = squad_data.DEV_FILE
    # spacy: spaCy's rule-based English tokenizer, as hitvoice/DrQA and AllenNLP (no model
    # needed; `pip install spacy`) | regex: the built-in rules of tokenizer.py
    tokenizer: str = "spacy"
    split_hyphens: bool = True  # regex tokenizer: split hyphens between letters
    # a spaCy pipeline with a tagger and NER (a package such as en_core_web_md, or a
    # directory) whose tokens, lemmas, tags and entities DrQA's features em_lemma, pos, ner
    # read; "" = spaCy's blank English tokenizer
    tagger: str = ""
    batch_size: int = 32
    # length: batches of similar context lengths in a random order (DrQA's SortedBatchSampler,
    # AllenNLP's bucket iterator) | random: batches drawn at random (hitvoice/DrQA, Feb 2018)
    batch_order: str = "length"
    # use only the first N trainable training questions (0 = all): smoke tests and overfit
    # checks; a run that sets it is not the protocol
    max_train_questions: int = 0
    verify: bool = True  # compare the files' checksums with the catalogue

    #: the largest values that size memory (checked with the other values)
    upper_bounds: ClassVar[dict[str, int]] = {"batch_size": MAX_BATCH}

    def validate(self) -> None:
        if self.splitting not in squad_data.SPLITTINGS:
            raise UnknownNameError("data.splitting", self.splitting, squad_data.SPLITTINGS)
        if self.tokenizer not in TOKENIZERS:
            raise UnknownNameError("data.tokenizer", self.tokenizer, TOKENIZERS)
        if self.tagger and self.tokenizer != "spacy":
            raise ConfigError("data.tagger is a spaCy pipeline: it needs data.tokenizer=spacy")
        if self.batch_order not in BATCH_ORDERS:
            raise UnknownNameError("data.batch_order", self.batch_order, BATCH_ORDERS)
        check_range("data", self, "standin_dev_articles", low=1)
        check_range("data", self, "batch_size", low=1)
        check_range("data", self, "max_train_questions", low=0, why="0 = all")


@dataclass
class SquadEval:
    batch_size: int = 128  # questions per evaluation batch (DrQA's test batch size)
    max_span: int = 15  # longest answer span in tokens; 0 = no limit

    #: the largest values that size memory (checked with the other values)
    upper_bounds: ClassVar[dict[str, int]] = {"batch_size": MAX_BATCH}

    def validate(self) -> None:
        check_range("eval", self, "batch_size", low=1)
        check_range("eval", self, "max_span", low=0, why="0 = no limit")


# -- DrQA ------------------------------------------------------------------------------------
@dataclass
class DrQAData(SquadData):
    batch_size: int = 32  # DrQA -bs 32
    batch_order: str = "random"  # hitvoice/DrQA (February 2018): shuffled, not length-sorted


@dataclass
class DrQAModel:
    embedding_dim: int = 300
    # GloVe 840B 300d text file (relative paths: under the data directory); empty = no
    # pretrained vectors: every word embedding is trained from N(0, 1) (nn.Embedding's default,
    # what DrQA does without an embedding file)
    pretrained: str = ""
    tune_partial: int = 1000  # with pretrained vectors: train only <PAD>, <UNK> and the top-N
    #                           question words (hitvoice --tune_partial 1000); 0 = all fixed
    # the other rows with pretrained vectors: reset (they get gradients, counted in the clip
    # norm, and are put back to their vectors before every use: DrQA's reset_parameters) |
    # constant (a buffer without gradient)
    fixed_rows: str = "reset"
    hidden_size: int = 128
    doc_layers: int = 3
    question_layers: int = 3
    concat_layers: bool = True
    use_qemb: bool = True  # aligned question embedding
    question_merge: str = "self_attn"  # self_attn | avg
    # DrQA's are em_cased, em_uncased, em_lemma, tf, pos, ner; the last three need a spaCy
    # pipeline with a tagger and NER (data.tagger)
    features: list[str] = field(default_factory=lambda: list(BASIC_FEATURES))
    dropout_emb: float = 0.4
    dropout_rnn: float = 0.4
    dropout_rnn_output: bool = True
    cell_options: dict[str, Any] = field(default_factory=dict)  # passed to make_encoder

    #: the largest values that size memory (checked with the other values)
    upper_bounds: ClassVar[dict[str, int]] = {
        "embedding_dim": MAX_WIDTH, "hidden_size": MAX_WIDTH, "doc_layers": MAX_LAYERS,
        "question_layers": MAX_LAYERS}

    def validate(self) -> None:
        for name in ("embedding_dim", "hidden_size", "doc_layers", "question_layers"):
            check_range("model", self, name, low=1)
        check_range("model", self, "tune_partial", low=0)
        for name in ("dropout_emb", "dropout_rnn"):
            check_range("model", self, name, low=0, high=1, high_open=True)
        if self.question_merge not in ("self_attn", "avg"):
            raise UnknownNameError("model.question_merge", self.question_merge, ("self_attn", "avg"))
        if self.fixed_rows not in ("reset", "constant"):
            raise UnknownNameError("model.fixed_rows", self.fixed_rows, ("reset", "constant"))
        for f in self.features:
            if f not in FEATURES:
                raise UnknownNameError("model.features entry", f, FEATURES)
        if len(set(self.features)) != len(self.features):
            raise ConfigError(f"model.features lists a feature twice: {self.features}")


# -- BiDAF -----------------------------------------------------------------------------------
@dataclass
class BiDAFData(SquadData):
    batch_size: int = 40  # AllenNLP bucket iterator, batch 40


@dataclass
class BiDAFEval(SquadEval):
    batch_size: int = 40
    max_span: int = 0  # AllenNLP's best span has no length limit


@dataclass
class BiDAFModel:
    word_dim: int = 100
    # GloVe 6B 100d text file (relative paths: under the data directory), kept FROZEN as in
    # AllenNLP; empty = no pretrained vectors: trainable word embeddings (Xavier-uniform,
    # AllenNLP's Embedding initialisation from April 2018 on; N(0, 1) at c66fac02)
    pretrained: str = ""
    char_dim: int = 16
    char_filters: int = 100
    char_width: int = 5
    char_dropout: float = 0.2
    # which CNN windows enter a word's max: batch (AllenNLP: every window of the field's
    # padded width in the batch) | word (only those inside the word: a batch equals its items)
    char_windows: str = "batch"
    highway_layers: int = 2
    hidden_size: int = 100  # per direction, all three recurrent layers
    modeling_layers: int = 2
    dropout: float = 0.2
    cell_options: dict[str, Any] = field(default_factory=dict)  # passed to make_encoder

    #: the largest values that size memory (checked with the other values)
    upper_bounds: ClassVar[dict[str, int]] = {
        "word_dim": MAX_WIDTH, "char_dim": MAX_WIDTH, "char_filters": MAX_WIDTH, "char_width": 1000,
        "highway_layers": MAX_LAYERS, "hidden_size": MAX_WIDTH, "modeling_layers": MAX_LAYERS}

    def validate(self) -> None:
        for name in ("word_dim", "char_dim", "char_filters", "char_width", "hidden_size",
                     "modeling_layers"):
            check_range("model", self, name, low=1)
        check_range("model", self, "highway_layers", low=0)
        for name in ("dropout", "char_dropout"):
            check_range("model", self, name, low=0, high=1, high_open=True)
        if self.char_windows not in ("batch", "word"):
            raise UnknownNameError("model.char_windows", self.char_windows, ("batch", "word"))
