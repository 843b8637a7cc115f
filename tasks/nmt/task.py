"""The ``nmt`` task plugin: Multi30k En->De with OpenNMT-py's early-2018 default model
(Levy et al. 2018, Table 4; OpenNMT-py @ 18d3d2e1).

Which layers the cell replaces: Levy et al. write "We use OpenNMT's default model and
hyperparameters, replacing the stacked bidirectional LSTM encoder with the simplified
architectures" (seed 002, §3, Machine Translation; the earlier draft, 000: "replacing the
stacked bidirectional LSTM of its encoder") — the *encoder* only, so ``model.cell_layers``
defaults to ``encoder`` and the decoder stays OpenNMT's LSTM (``encoder+decoder`` swaps both).
The same sentence calls the encoder bidirectional, but OpenNMT-py's default ``-encoder_type``
was ``rnn``, unidirectional (OpenNMT-py's ``opts.py`` at 18d3d2e1), and "default model" is what they ran:
``model.encoder_type`` defaults to ``rnn``; ``brnn`` gives the bidirectional reading (each
direction hidden/2, as OpenNMT's ``brnn``).

Data (:mod:`.data`, :mod:`.tokenise`, :mod:`.vocab`): the raw Multi30k task 1 files, the
recipe's last-line rule, Moses tokenisation (``-a -no-escape``, cased), train/val pairs longer
than 50 tokens on either side dropped, vocabularies from train (50,000 words each + specials),
kept with the run as artefacts (``src_vocab``, ``tgt_vocab``, ``tokeniser``).

Training (:mod:`.batches`, :mod:`.model`): batches of 64 sentences in torchtext's pooled
length-sorted order; loss = summed token NLL / number of sentences (``-normalization sents``);
SGD 1.0, clip 5, 13 epochs, lr halved every epoch from epoch 9 (``start_decay_at 8``) — the
second trigger of OpenNMT's rule, "or once validation perplexity got worse", needs the
trainer's support (see docs/nmt.md).

Evaluation. ``evaluate(final=False)`` — what the trainer selects on: teacher-forced
perplexity (``ppl`` = exp(NLL per target token, ``</s>`` included), ``acc`` = % of target
tokens predicted, as OpenNMT's validation), on the length-filtered val pairs as preprocess.py
made them (all pairs of the test split). ``evaluate(final=True)`` — beam search (eval config)
on every line of the split, then ``bleu`` (multi-bleu.perl on tokenised text: the paper's
number) and ``sacrebleu`` (detokenised, standard signature); see :mod:`.bleu`.
``write_predictions(path)`` writes the detokenised translations to ``path``, the tokenised
ones to ``path.atok`` (what multi-bleu.perl read) and both scores to ``path.bleu``, and
returns the metrics computed from the two files.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from lstmablate.batching import BatchPlan
from lstmablate.config import MAX_BATCH, MAX_INIT_SCALE, MAX_LAYERS, MAX_WIDTH, check_range
from lstmablate.data import read_lines
from lstmablate.errors import ConfigError, DataError, UserError, check_choice
from lstmablate.task import ItemMetric, Metric, StepOutput, Task
from lstmablate.train.buckets import choose_buckets, pad_to

from . import data as m30k
from .batches import POOL_BATCHES, collate, length_sorted_groups, pooled_batches
from .bleu import (BleuResult, multi_bleu, sacrebleu_detok, score_of_statistics,
                   sentence_statistics)
from .model import NMTModel, StackedLSTMCells
from .search import beam_search, greedy_search, replace_unk
from .stepping import DECODE_BUCKETS, STEP_CAPTURES, DecodeStep
from .tokenise import SETTINGS as TOKENISER, detokenise, tokenise_lines
from .vocab import SRC_SPECIALS, TGT_SPECIALS, UNK, Vocab

ENCODER_TYPES = ("rnn", "brnn")
CELL_LAYERS = ("encoder", "encoder+decoder")


@dataclass
class NMTData:
    src_lang: str = "en"
    tgt_lang: str = "de"
    drop_last_line: bool = True  # the recipe's sed -i "$ d" on train and val (see data.py)
    max_length: int = 50  # preprocess.py -src_seq_length / -tgt_seq_length (train and val)
    src_vocab_size: int = 50_000  # -src_vocab_size (words, specials not counted)
    tgt_vocab_size: int = 50_000  # -tgt_vocab_size
    min_freq: int = 1  # -{src,tgt}_words_min_frequency (0 and 1 both mean every word)
    batch_size: int = 64  # sentences (-batch_type sents)
    verify: bool = True  # compare the files' checksums with the catalogue

    #: the largest values that size memory (checked with the other values)
    upper_bounds: ClassVar[dict[str, int]] = {"batch_size": MAX_BATCH}

    def validate(self) -> None:
        for name in ("src_lang", "tgt_lang"):
            if getattr(self, name) not in m30k.LANGS:
                raise ConfigError(f"data.{name} must be one of {', '.join(m30k.LANGS)} "
                                  f"(Multi30k task 1), got {getattr(self, name)!r}")
        if self.src_lang == self.tgt_lang:
            raise ConfigError(f"data.src_lang and data.tgt_lang are both {self.src_lang!r}")
        for name in ("max_length", "src_vocab_size", "tgt_vocab_size", "batch_size"):
            check_range("data", self, name, low=1)
        check_range("data", self, "min_freq", low=0)


@dataclass
class NMTModelConfig:
    word_vec_size: int = 500  # -word_vec_size (source and target)
    hidden_size: int = 500  # -rnn_size
    layers: int = 2  # -enc_layers = -dec_layers (the decoder starts from the encoder's state)
    encoder_type: str = "rnn"  # rnn (OpenNMT's default) | brnn (each direction hidden/2)
    cell_layers: str = "encoder"  # encoder (Levy et al.) | encoder+decoder
    dropout: float = 0.3
    init_scale: float = 0.1  # -param_init: every parameter uniform(±0.1)
    cell_options: dict[str, Any] = field(default_factory=dict)  # passed to make_encoder

    #: the largest values that size memory (checked with the other values)
    upper_bounds: ClassVar[dict[str, int]] = {
        "word_vec_size": MAX_WIDTH, "hidden_size": MAX_WIDTH, "layers": MAX_LAYERS}

    def validate(self) -> None:
        check_choice("model.encoder_type", self.encoder_type, ENCODER_TYPES)
        check_choice("model.cell_layers", self.cell_layers, CELL_LAYERS)
        for name in ("word_vec_size", "hidden_size", "layers"):
            check_range("model", self, name, low=1)
        if self.encoder_type == "brnn" and self.hidden_size % 2:
            raise ConfigError(f"model.encoder_type brnn splits model.hidden_size between the two "
                              f"directions; {self.hidden_size} is odd")
        check_range("model", self, "dropout", low=0, high=1, high_open=True)
        check_range("model", self, "init_scale", low=0, low_open=True, high=MAX_INIT_SCALE)


@dataclass
class NMTEval:
    beam_size: int = 5  # translate.py -beam_size (1 = greedy)
    max_length: int = 100  # -max_sent_length (target words)
    batch_size: int = 30  # translate.py -batch_size (also the perplexity batches)
    alpha: float = 0.0  # -alpha, GNMT length penalty ((5 + len) / 6) ** alpha; 0 = none
    # OpenNMT-py master (8771a463) ranks finished hypotheses by their log-probability; true:
    # by log-probability / (length + 1), as the work-in-progress commit 18d3d2e1 (search.py)
    length_normalise: bool = False
    # master: a sentence's search ends once </s> has topped its beam (Beam.done); false: it
    # runs max_length steps, as 18d3d2e1
    eos_stop: bool = True
    # stop the beam once the best hypothesis is settled (exact under either rule above)
    stop_early: bool = True
    replace_unk: bool = True  # -replace_unk: <unk> -> the most attended source word
    # the final evaluation also decodes with 18d3d2e1's rule (length-normalised ranking, no
    # </s> stop) and reports those BLEUs as lennorm_bleu, lennorm_sacrebleu, ...
    also_length_normalised: bool = False
    # how a decoding step is computed: off (eagerly) | compile (torch.compile, one graph per
    # (rows, source-length bucket)) | graphs (CUDA graphs of the step, replayed); the search
    # is the same (stepping.py, docs/design/graphs.md)
    step_capture: str = "off"

    #: the largest values that size memory (checked with the other values)
    upper_bounds: ClassVar[dict[str, int]] = {
        "beam_size": 256, "max_length": 10_000, "batch_size": MAX_BATCH}

    def validate(self) -> None:
        for name in ("beam_size", "max_length", "batch_size"):
            check_range("eval", self, name, low=1)
        check_range("eval", self, "alpha", low=0)
        check_choice("eval.step_capture", self.step_capture, STEP_CAPTURES)
        if self.also_length_normalised and (self.length_normalise or self.beam_size == 1):
            raise ConfigError(
                "eval.also_length_normalised decodes a second time with the length-normalised "
                "ranking of OpenNMT-py 18d3d2e1; it needs the first decoding to be a beam "
                "search (eval.beam_size > 1) with the raw ranking (eval.length_normalise: "
                f"false), got beam_size {self.beam_size}, length_normalise "
                f"{str(self.length_normalise).lower()}.")


#: eval.also_length_normalised's second decoding (OpenNMT-py 18d3d2e1's Beam) and the prefix of
#: the metrics it adds
LENGTH_NORMALISED = {"length_normalise": True, "eos_stop": False}
LENGTH_NORMALISED_PREFIX = "lennorm_"


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """No dropout inside the block; the model's mode is restored after it."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


@dataclass
class SplitData:
    """One split, tokenised: every line (for translation and BLEU) and the id pairs scored by
    perplexity (``ppl_index``: the lines that pass the length filter, train and val)."""

    name: str
    src_raw: list[str]
    tgt_raw: list[str]
    src_tokens: list[list[str]]
    tgt_tokens: list[list[str]]
    src_ids: list[list[int]]
    tgt_ids: list[list[int]]
    ppl_index: list[int]


class NMTTask(Task):
    name = "nmt"
    description = ("Multi30k En->De (WMT16 multimodal task 1), OpenNMT-py's early-2018 default "
                   "attentional encoder-decoder, the cell in the encoder: BLEU (multi-bleu, "
                   "tokenised) and sacreBLEU")
    DataConfig = NMTData
    ModelConfig = NMTModelConfig
    EvalConfig = NMTEval
    datasets = (m30k.MULTI30K,)
    train_defaults = {"optimizer": "sgd", "lr": 1.0, "schedule": "epoch_decay", "decay": 0.5,
                      "decay_start": 8, "decay_on_worse": True, "clip_norm": 5.0, "max_epochs": 13,
                      "test_checkpoint": "last"}
    metrics = (
        Metric("bleu", True, "BLEU (tokenised, multi-bleu.perl)", ".2f"),
        Metric("sacrebleu", True, "sacreBLEU (detokenised, 13a)", ".2f"),
        Metric("ppl", False, "perplexity (teacher-forced)", ".2f"),
    )
    # model selection during training: validation perplexity (what OpenNMT watched); the
    # final numbers (end of training, `lstmablate eval`) are the beam-search BLEU columns
    primary = metrics[2]
    final_differs = True
    # the paper does not say which split its Table 4 reports: reports show both
    dev_report_metrics = ("bleu",)
    extra_metrics = (  # eval.also_length_normalised's second decoding
        Metric(LENGTH_NORMALISED_PREFIX + "bleu", True,
               "BLEU, length-normalised ranking (OpenNMT-py 18d3d2e1)", ".2f"),
        Metric(LENGTH_NORMALISED_PREFIX + "sacrebleu", True,
               "sacreBLEU, length-normalised ranking (OpenNMT-py 18d3d2e1)", ".2f"),
    )
    # saved configs from before these keys: they ran 18d3d2e1's search to max_length
    added_keys = {"eval.eos_stop": False, "eval.also_length_normalised": False,
                  "eval.step_capture": "off"}
    dev_split = "val"
    test_split = "test"

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._tokenised: dict[str, tuple[list[str], list[str], list[list[str]], list[list[str]]]] = {}
        self.splits: dict[str, SplitData] = {}

    # -- data ----------------------------------------------------------------------------
    def _read(self, split: str):
        """(raw src, raw tgt, tokenised src, tokenised tgt) of ``split``, read once."""
        if split not in self._tokenised:
            d = self.data_cfg
            src, tgt = m30k.read_split(self.data_dir, split, d.src_lang, d.tgt_lang,
                                       drop_last_line=d.drop_last_line, verify=d.verify)
            self._tokenised[split] = (src, tgt, tokenise_lines(src, d.src_lang),
                                      tokenise_lines(tgt, d.tgt_lang))
        return self._tokenised[split]

    def _kept(self, split: str) -> list[int]:
        _, _, s, t = self._read(split)
        return [i for i in range(len(s)) if m30k.keep_pair(s[i], t[i], self.data_cfg.max_length)]

    def build_artefacts(self) -> dict[str, Any]:
        """The source and target vocabularies of the (filtered) training pairs."""
        d = self.data_cfg
        _, _, src, tgt = self._read("train")
        kept = self._kept("train")
        if not kept:
            raise DataError(f"no training pair of {m30k.relpath('train', d.src_lang)} survives "
                            f"the length filter (1..{d.max_length} tokens per side).")
        src_vocab = Vocab.build((src[i] for i in kept), SRC_SPECIALS, d.src_vocab_size, d.min_freq)
        tgt_vocab = Vocab.build((tgt[i] for i in kept), TGT_SPECIALS, d.tgt_vocab_size, d.min_freq)
        return {"src_vocab": src_vocab.itos, "tgt_vocab": tgt_vocab.itos,
                "tokeniser": dict(TOKENISER), "train_pairs": len(kept)}

    def use_artefacts(self, artefacts: dict[str, Any]) -> None:
        super().use_artefacts(artefacts)
        for key in ("src_vocab", "tgt_vocab", "tokeniser"):
            if key not in artefacts:
                raise DataError(f"the run's artefacts lack {key!r} (expected src_vocab, "
                                f"tgt_vocab and tokeniser, as the nmt task saves them).")
        if artefacts["tokeniser"] != TOKENISER:
            raise DataError(f"this run was tokenised with {artefacts['tokeniser']}, but this "
                            f"version of the nmt task tokenises with {TOKENISER}.")
        self.src_vocab = Vocab(artefacts["src_vocab"], SRC_SPECIALS)
        self.tgt_vocab = Vocab(artefacts["tgt_vocab"], TGT_SPECIALS)

    def setup(self, splits: Sequence[str] = ("train", "val", "test")) -> None:
        for split in splits:
            if split not in m30k.SPLIT_FILES:
                raise UserError(f"unknown split {split!r}; the nmt task has "
                                f"{', '.join(m30k.SPLIT_FILES)}")
            src_raw, tgt_raw, src, tgt = self._read(split)
            if split == "test":  # translate.py reads every line; perplexity too
                ppl = [i for i in range(len(src)) if src[i] and tgt[i]]
            else:
                ppl = self._kept(split)
            self.splits[split] = SplitData(
                split, src_raw, tgt_raw, src, tgt, [self.src_vocab.encode(s) for s in src],
                [self.tgt_vocab.encode(t) for t in tgt], ppl)
        d = self.data_cfg
        for split, sd in self.splits.items():  # every split scores something (before training)
            files = f"{m30k.relpath(split, d.src_lang)} / {m30k.relpath(split, d.tgt_lang)}"
            if not sd.src_raw:
                dropped = (" after its last line is dropped (data.drop_last_line, the recipe's "
                           "sed -i \"$ d\")" if d.drop_last_line and split != "test" else "")
                raise DataError(f"the {split} split ({files} under {self.data_dir}) has no "
                                f"sentence pair{dropped}; every split needs at least one.")
            if not sd.ppl_index:
                raise DataError(f"no sentence pair of the {split} split ({files} under "
                                f"{self.data_dir}) survives the length filter (1..{d.max_length} "
                                "tokens per side on train and val; a non-empty source and "
                                "target on test).")
        if "train" in splits:
            self._tokenised.pop("train", None)  # encoded now; the strings are not needed

    def _split(self, split: str) -> SplitData:
        if split not in self.splits:
            raise UserError(f"split {split!r} was not loaded (setup() loaded "
                            f"{', '.join(self.splits) or 'nothing'}).")
        return self.splits[split]

    def _collate(self, sd: SplitData, index: Sequence[int], with_target: bool = True):
        v = self.tgt_vocab
        return collate([sd.src_ids[i] for i in index],
                       [sd.tgt_ids[i] for i in index] if with_target else None,
                       src_pad=self.src_vocab.pad, tgt_pad=v.pad, bos=v.bos, eos=v.eos)

    def train_plan(self, epoch: int, generator: torch.Generator) -> Sequence[dict[str, Tensor]]:
        sd = self._split("train")
        idx = sd.ppl_index
        groups = pooled_batches([len(sd.src_ids[i]) for i in idx], self.data_cfg.batch_size,
                                generator, POOL_BATCHES)
        return BatchPlan([[idx[j] for j in g] for g in groups], lambda g: self._collate(sd, g))

    # -- model ---------------------------------------------------------------------------
    def build_model(self, make_encoder) -> nn.Module:
        m = self.model_cfg
        brnn = m.encoder_type == "brnn"
        encoder = make_encoder(m.word_vec_size, m.hidden_size // 2 if brnn else m.hidden_size,
                               num_layers=m.layers, bidirectional=brnn, dropout=m.dropout,
                               **m.cell_options)
        dec_in = m.word_vec_size + m.hidden_size  # input feeding: [E y_{t-1}; h̃_{t-1}]
        if m.cell_layers == "encoder+decoder":
            decoder = make_encoder(dec_in, m.hidden_size, num_layers=m.layers, dropout=m.dropout,
                                   **m.cell_options)
        else:
            decoder = StackedLSTMCells(m.layers, dec_in, m.hidden_size, m.dropout)
        model = NMTModel(len(self.src_vocab), len(self.tgt_vocab), m.word_vec_size,
                         m.hidden_size, encoder, decoder, m.dropout, self.src_vocab.pad,
                         self.tgt_vocab.pad)
        model.init_weights(m.init_scale)
        return model

    def loss(self, model: nn.Module, batch: dict[str, Tensor], carry: Any) -> StepOutput:
        """Summed target-token NLL / number of sentences (OpenNMT's ``-normalization sents``)."""
        logp, _ = model(batch["src"], batch["src_lengths"], batch["tgt_in"])
        nll = nn.functional.nll_loss(logp.reshape(-1, logp.shape[-1]), batch["tgt_out"].reshape(-1),
                                     ignore_index=self.tgt_vocab.pad, reduction="sum")
        B = batch["src"].shape[0]
        tokens = (batch["tgt_out"] != self.tgt_vocab.pad).sum()  # stays on the device
        return StepOutput(nll / B, None, float(B), logged=nll / tokens.clamp(min=1), tokens=tokens)

    # -- length buckets (train.step_capture) ----------------------------------------------
    def batch_length(self, batch: dict[str, Tensor]) -> tuple[int, int]:
        """(source tokens, target positions) of the batch's padded tensors."""
        return batch["src"].shape[1], batch["tgt_in"].shape[1]

    def pad_batch(self, batch: dict[str, Tensor], length: tuple[int, int]) -> dict[str, Tensor]:
        """The source padded with the source ``<blank>`` (the encoder's lengths and the
        attention's mask leave it out), both target sides with the target ``<blank>`` (the
        decoder runs the extra positions, whose targets the loss ignores: ``ignore_index``)."""
        S, T = length
        return {**batch, "src": pad_to(batch["src"], 1, S, self.src_vocab.pad),
                "tgt_in": pad_to(batch["tgt_in"], 1, T, self.tgt_vocab.pad),
                "tgt_out": pad_to(batch["tgt_out"], 1, T, self.tgt_vocab.pad)}

    # -- evaluation ----------------------------------------------------------------------
    @torch.no_grad()
    def perplexity(self, model: nn.Module, split: str) -> dict[str, float]:
        """Teacher-forced NLL over the split's scored pairs (see module doc)."""
        sd = self._split(split)
        device = next(model.parameters()).device
        total, correct, n = 0.0, 0, 0
        pad = self.tgt_vocab.pad
        lengths = [len(sd.src_ids[i]) for i in sd.ppl_index]
        with eval_mode(model):
            for g in length_sorted_groups(lengths, self.eval_cfg.batch_size):
                batch = self.batch_to(self._collate(sd, [sd.ppl_index[j] for j in g]), device)
                logp, _ = model(batch["src"], batch["src_lengths"], batch["tgt_in"])
                gold = batch["tgt_out"]
                real = gold != pad
                total += float(nn.functional.nll_loss(logp.reshape(-1, logp.shape[-1]),
                                                      gold.reshape(-1), ignore_index=pad,
                                                      reduction="sum"))
                correct += int(((logp.argmax(-1) == gold) & real).sum())
                n += int(real.sum())
        nll = total / n if n else float("nan")
        return {"ppl": float(torch.tensor(nll).exp()) if n else float("nan"), "nll": nll,
                "acc": 100.0 * correct / n if n else float("nan"), "tokens": float(n)}

    @torch.no_grad()
    def translate(self, model: nn.Module, split: str, **search: bool) -> list[list[str]]:
        """The tokenised translation of every line of ``split`` (eval config: beam, length,
        ranking, stopping, ``-replace_unk``; ``search`` overrides the ranking and stopping
        fields); an empty source line translates to an empty line."""
        sd = self._split(split)
        e = self.eval_cfg
        ranking = {"length_normalise": e.length_normalise, "eos_stop": e.eos_stop, **search}
        v = self.tgt_vocab
        device = next(model.parameters()).device
        out: list[list[str]] = [[] for _ in sd.src_ids]
        with eval_mode(model):
            todo = [i for i, s in enumerate(sd.src_ids) if s]
            groups = length_sorted_groups([len(sd.src_ids[i]) for i in todo], e.batch_size)
            step = {}  # eval.step_capture: the step compiled or replayed per shape
            if e.step_capture != "off" and groups:
                longest = [max(len(sd.src_ids[todo[j]]) for j in g) for g in groups]
                step = {"step": DecodeStep(model, e.step_capture,
                                           choose_buckets(longest, DECODE_BUCKETS))}
            for g in groups:
                index = [todo[j] for j in g]
                batch = self.batch_to(self._collate(sd, index, with_target=False), device)
                mem = model.encode(batch["src"], batch["src_lengths"])
                if e.beam_size == 1:
                    hyps = greedy_search(model, mem, v.bos, v.eos, e.max_length, **step)
                else:
                    hyps = [h[0] for h in beam_search(
                        model, mem, e.beam_size, v.bos, v.eos, e.max_length, alpha=e.alpha,
                        stop_early=e.stop_early, **ranking, **step)]
                for i, h in zip(index, hyps):
                    words = v.decode(h.tokens)
                    if e.replace_unk:
                        words = replace_unk(words, h.attention, sd.src_tokens[i], UNK)
                    out[i] = words
        return out

    def bleu_scores(self, split: str, hyp_tok: Sequence[str], hyp_detok: Sequence[str]
                    ) -> tuple[BleuResult, BleuResult]:
        """(multi-bleu on tokenised text, sacreBLEU on detokenised text) against ``split``'s
        tokenised and raw references."""
        sd = self._split(split)
        refs_tok = [" ".join(t) for t in sd.tgt_tokens]
        return multi_bleu(hyp_tok, refs_tok), sacrebleu_detok(hyp_detok, sd.tgt_raw)

    @staticmethod
    def bleu_metrics(tok: BleuResult, detok: BleuResult) -> dict[str, float]:
        return {"bleu": tok.score, "sacrebleu": detok.score, "bleu_bp": tok.bp,
                "bleu_hyp_len": float(tok.sys_len), "bleu_ref_len": float(tok.ref_len)}

    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: str, *, final: bool = False) -> dict[str, float]:
        if not final:
            return self.perplexity(model, split)
        return self.evaluate_items(model, split)[0]

    @torch.no_grad()
    def evaluate_items(self, model: nn.Module, split: str
                       ) -> tuple[dict[str, float], list[dict[str, Any]]]:
        """The final evaluation (beam search, both BLEUs), and one record per line of the
        split: ``{"id": index, "hyp": the detokenised translation, "hyp_tok": its tokens,
        "bleu": its statistics for multi-bleu.perl's BLEU, "sacrebleu": for sacreBLEU's}``
        (with ``eval.also_length_normalised`` also ``"lennorm_hyp"``: the translation the
        length-normalised ranking chose),
        statistics in sacreBLEU's order ``[hyp_len, ref_len, matches_1..4, totals_1..4]``
        (:func:`.bleu.sentence_statistics`)."""
        sd = self._split(split)
        words = self.translate(model, split)
        tok = [" ".join(w) for w in words]
        detok = [detokenise(w, self.data_cfg.tgt_lang) for w in words]
        refs_tok = [" ".join(t) for t in sd.tgt_tokens]
        records = [{"id": i, "hyp": d, "hyp_tok": t, "bleu": b, "sacrebleu": sb}
                   for i, (d, t, b, sb) in enumerate(zip(
                       detok, tok, sentence_statistics(tok, refs_tok, tokenised=True),
                       sentence_statistics(detok, sd.tgt_raw, tokenised=False)))]
        metrics = self.bleu_metrics(*self.bleu_scores(split, tok, detok))
        if self.eval_cfg.also_length_normalised:
            other = self.translate(model, split, **LENGTH_NORMALISED)
            other_detok = [detokenise(w, self.data_cfg.tgt_lang) for w in other]
            scores = self.bleu_scores(split, [" ".join(w) for w in other], other_detok)
            metrics.update({LENGTH_NORMALISED_PREFIX + k: v
                            for k, v in self.bleu_metrics(*scores).items()})
            for record, hyp in zip(records, other_detok):  # the other ranking's translation
                record[LENGTH_NORMALISED_PREFIX + "hyp"] = hyp
        return metrics, records

    def item_metrics(self) -> dict[str, ItemMetric]:
        """Both BLEUs from summed sentence statistics, as sacreBLEU scores them."""
        def column(name: str):
            return lambda records: np.array([r[name] for r in records], dtype=np.float64
                                            ).reshape(len(records), -1)
        return {"bleu": ItemMetric("bleu", column("bleu"), score_of_statistics(tokenised=True)),
                "sacrebleu": ItemMetric("sacrebleu", column("sacrebleu"),
                                        score_of_statistics(tokenised=False))}

    def reference_items(self, split: str) -> list[str]:
        """The reference translations, as sacreBLEU reads them (detokenised, one per line)."""
        return list(self._split(split).tgt_raw)

    def item_key(self, record: Mapping[str, Any]) -> Any:
        return record["id"], record["bleu"][1], record["sacrebleu"][1]  # the reference lengths

    @torch.no_grad()
    def write_predictions(self, model: nn.Module, split: str, path: Path) -> dict[str, float]:
        """``path``: detokenised translations, one per line (what sacreBLEU reads);
        ``path.atok``: the model's tokens, one sentence per line (what multi-bleu.perl read);
        ``path.bleu``: both scores, multi-bleu's line format, sacreBLEU's signature."""
        from lstmablate.io import atomic_write_text, check_can_write

        path = Path(path)
        tok_path = path.with_name(path.name + ".atok")
        bleu_path = path.with_name(path.name + ".bleu")
        check_can_write(path, tok_path, bleu_path)  # all three, before writing the first
        words = self.translate(model, split)
        atomic_write_text(path, "".join(detokenise(w, self.data_cfg.tgt_lang) + "\n"
                                        for w in words))
        atomic_write_text(tok_path, "".join(" ".join(w) + "\n" for w in words))
        metrics, tok, detok = self.score_files(split, path, tok_path)
        atomic_write_text(bleu_path,
                          f"multi-bleu.perl (tokenised {tok_path.name}): {tok.line()}\n"
                          f"sacreBLEU (detokenised {path.name}): {detok.score:.2f} "
                          f"{detok.signature}\n")
        return metrics

    def score_files(self, split: str, detok_path: Path, tok_path: Path
                    ) -> tuple[dict[str, float], BleuResult, BleuResult]:
        """The BLEU metrics of prediction files written by :meth:`write_predictions`."""
        n = len(self._split(split).tgt_raw)
        lines = []
        for p in (tok_path, detok_path):
            got = read_lines(p) if Path(p).stat().st_size else []
            if len(got) != n:
                raise DataError(f"{p} has {len(got)} lines, but the {split} split has {n} "
                                f"sentences: expected one translation per line.")
            lines.append(got)
        tok, detok = self.bleu_scores(split, lines[0], lines[1])
        return self.bleu_metrics(tok, detok), tok, detok

    def visualization_inputs(self, model: nn.Module, text: str):
        """The encoder and the embedded Moses tokens of ``text`` (source language)."""
        words = tokenise_lines([text], self.data_cfg.src_lang)[0]
        if not words:
            raise UserError("--text is empty; give a source sentence, e.g. 'A man rides a bike.'")
        device = next(model.parameters()).device
        ids = torch.tensor([self.src_vocab.encode(words)], device=device)
        shown = [w if w in self.src_vocab.stoi else f"{w} ({UNK})" for w in words]
        return model.encoder, model.src_embedding(ids), shown
