"""Per-sentence scores of a language model (the ``ptb`` and ``bwb`` tasks), for the
paired bootstrap over test sentences.

A record per sentence (line) of the split: ``{"id": line index from 0, "nll": summed
negative log-likelihood of the sentence's predicted tokens (nats), "tokens": how many of
its tokens were predicted}``.  Whatever the protocol scores (a stream with the state
carried across lines, every line alone), each prediction belongs to the line of the token
it predicts; a line none of whose tokens was predicted (the first line's first token, a
tail the protocol drops) has ``tokens`` 0.  Summed over lines: perplexity
``exp(nll / tokens)``, ``nll / tokens`` nats and ``nll / tokens / ln 2`` bits per token.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from lstmablate.task import ItemMetric, ratio, record_fields


def sentence_records(sentence: Sequence[int] | np.ndarray, logprobs: Sequence[float] | np.ndarray,
                     n_sentences: int) -> list[dict[str, float | int]]:
    """One record per sentence from every prediction's sentence index and log-probability."""
    sentence = np.asarray(sentence, dtype=np.int64)
    nll = np.bincount(sentence, weights=-np.asarray(logprobs, dtype=np.float64),
                      minlength=n_sentences)
    tokens = np.bincount(sentence, minlength=n_sentences)
    return [{"id": i, "nll": float(nll[i]), "tokens": int(tokens[i])} for i in range(n_sentences)]


def _perplexity(sums: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.exp(ratio()(sums))


def lm_item_metrics(bits: bool = True) -> dict[str, ItemMetric]:
    """``ppl``, ``nll`` and (``bits``) ``bpc`` from the summed ``nll`` and ``tokens``."""
    stats = record_fields("nll", "tokens")
    out = {"ppl": ItemMetric("ppl", stats, _perplexity),
           "nll": ItemMetric("nll", stats, ratio())}
    if bits:
        out["bpc"] = ItemMetric("bpc", stats, ratio(1 / math.log(2)))
    return out
