"""Scoring a language model the tutorial's ways: per-token log-probabilities of a token stream
at the training batch shape with the state carried (valid), one token at a time at batch 1
(test), or of whole sentences in padded batches (the second-order report's protocol); the
metrics from a summed NLL; and the predictions file, read back."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from lstmablate.errors import DataError

from . import data as ptb_data


def _token_logprobs(model: nn.Module, x: Tensor, y: Tensor, state: Any) -> tuple[Tensor, Any]:
    """log p(y | x, state) per target token (same shape as ``y``) and the final state."""
    logits, state = model(x, state)
    logp = -nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                                        reduction="none")
    return logp.view_as(y), state


@torch.no_grad()
def stream_logprobs(model: nn.Module, stream: Tensor, batch_size: int,
                    num_steps: int) -> tuple[Tensor, Tensor]:
    """(positions, log-probabilities) of every token the tutorial's validation pass predicts.

    The pass: ``batch_size`` contiguous rows, windows of ``num_steps``, the state
    carried from window to window starting from zeros; the tail that does not fill a
    window is dropped (as ``ptb_producer`` does).  ``positions`` index ``stream``: row r
    holds ``stream[r * L : (r + 1) * L]`` with ``L = len(stream) // batch_size``.
    """
    device = next(model.parameters()).device
    L = stream.numel() // batch_size
    pos, lps, state = [], [], None
    for i, (x, y) in enumerate(ptb_data.stream_batches(stream, batch_size, num_steps)):
        lp, state = _token_logprobs(model, x.to(device), y.to(device), state)
        rows = torch.arange(batch_size).unsqueeze(1) * L
        cols = torch.arange(y.shape[1]).unsqueeze(0) + i * num_steps + 1
        pos.append((rows + cols).reshape(-1))
        lps.append(lp.reshape(-1).double().cpu())
    if not pos:
        return torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.float64)
    return torch.cat(pos), torch.cat(lps)


@torch.no_grad()
def sequential_logprobs(model: nn.Module, stream: Tensor, chunk: int) -> tuple[Tensor, Tensor]:
    """(positions, log-probabilities) of the tutorial's test pass, computed in chunks.

    The tutorial tests with batch size 1 and num_steps 1: every token but the
    first is predicted from all tokens before it, the state carried token by
    token from zeros (``len(stream) - 1`` predictions). With batch size 1 a
    chunk of ``chunk`` tokens run from the carried state gives exactly the same
    outputs and final state as ``chunk`` single steps (eval mode is
    deterministic), so this computes the same numbers with far fewer calls.
    Unlike :func:`stream_logprobs` nothing is dropped: the last chunk may be short.
    """
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    device = next(model.parameters()).device
    data = stream.to(device)
    lps, state = [], None
    for lo in range(0, data.numel() - 1, chunk):
        hi = min(lo + chunk, data.numel() - 1)
        lp, state = _token_logprobs(model, data[lo:hi].unsqueeze(0), data[lo + 1:hi + 1].unsqueeze(0),
                                    state)
        lps.append(lp.reshape(-1).double().cpu())
    n = max(stream.numel() - 1, 0)
    return torch.arange(1, n + 1), (torch.cat(lps) if lps else torch.zeros(0, dtype=torch.float64))


@torch.no_grad()
def sentence_logprobs(model: nn.Module, sentences: ptb_data.Sentences,
                      batch_size: int) -> tuple[Tensor, Tensor]:
    """(positions, log-probabilities) of every target of ``sentences``, each sentence scored
    on its own from the zero state (the sentence protocol); sorted by stream position.

    Sentences are batched longest first (less padding; the order changes no number since
    padding is masked and every sentence starts from zeros).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    device = next(model.parameters()).device
    order = sorted(range(len(sentences)), key=lambda i: -sentences.lengths[i])
    pos, lps = [], []
    for lo in range(0, len(order), batch_size):
        idx = order[lo:lo + batch_size]
        x, y, lengths = sentences.collate(idx)
        lp, _ = _sentence_logprobs(model, x.to(device), y.to(device), lengths.to(device))
        lps.append(lp.double().cpu())  # row by row: the order of positions() below
        pos.append(torch.cat([sentences.positions(i) for i in idx]))
    if not pos:
        return torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.float64)
    pos_t, lp_t = torch.cat(pos), torch.cat(lps)
    perm = pos_t.argsort()
    return pos_t[perm], lp_t[perm]


def _sentence_logprobs(model: nn.Module, x: Tensor, y: Tensor, lengths: Tensor) -> tuple[Tensor, Any]:
    """log p(y | x) of every real target of a padded sentence batch, (N,) in row-major order
    (padding is never scored)."""
    real = y != ptb_data.PAD_TARGET
    logits, state = model(x, None, lengths, select=real)
    return -nn.functional.cross_entropy(logits, y[real], reduction="none"), state


def perplexity_metrics(total_nll: float, n: int, batch_size: int, num_steps: int,
                       sentences: int | None = None) -> dict[str, float]:
    """The task's metrics from a summed NLL (nats) over ``n`` predictions (``num_steps`` 0:
    whole sentences, ``sentences`` of them)."""
    nll = total_nll / n if n else math.nan
    out = {"ppl": ptb_data.perplexity(nll), "nll": nll, "bpc": ptb_data.bits_per_char(nll),
           "tokens": float(n), "eval_batch_size": float(batch_size),
           "eval_num_steps": float(num_steps)}
    if sentences is not None:
        out["sentences"] = float(sentences)
    return out


PREDICTIONS_HEADER = "position\ttoken\tlogprob"


def read_predictions(path: Path) -> dict[str, float]:
    """The metrics of a predictions file written by :meth:`PTBTask.write_predictions`."""
    from lstmablate.data import read_lines
    from lstmablate.errors import where

    lines = read_lines(path)
    meta = {}
    if lines and lines[0].startswith("#"):
        meta = dict(kv.split("=", 1) for kv in lines[0][1:].split() if "=" in kv)
        lines = lines[1:]
    if not lines or lines[0] != PREDICTIONS_HEADER:
        raise DataError(f"{where(path, 1 + bool(meta))}: expected the header line "
                        f"{PREDICTIONS_HEADER!r} of a PTB predictions file.")
    total, n = 0.0, 0
    for lineno, line in enumerate(lines[1:], 2 + bool(meta)):
        parts = line.split("\t")
        try:
            total -= float(parts[2])
        except (IndexError, ValueError):
            raise DataError(f"{where(path, lineno)}: expected position<TAB>token<TAB>logprob, "
                            f"got {line!r}.") from None
        n += 1
    sentences = int(meta["sentences"]) if "sentences" in meta else None
    return perplexity_metrics(total, n, int(meta.get("batch_size", 0)), int(meta.get("num_steps", 0)),
                              sentences)
