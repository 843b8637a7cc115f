"""The bracket-closing criterion of Hewitt et al. (EMNLP 2020) and its worst-case aggregate, WCPA.

Judgements
    A model is *correct at a position* if it puts more than ``threshold`` = 0.8 of its
    closing-bracket probability on the close bracket the string needs there.  Two objectives:

    ``"lm"`` — next-token language modelling over the whole vocabulary, as in Hewitt's
        ``reporter.py``.  The model reads ``START + seq[:-1]`` and ``probs[b, t]`` is its
        distribution for ``seq[t]`` (having read ``seq[:t]``).  EVERY position t at which the
        stack after ``seq[:t]`` is non-empty is judged, whatever the gold next token is:
        correct iff ``P(close of the top type) / P(any close bracket) > 0.8``.  (If the model puts
        no mass at all on closes the ratio is 0/0, which counts as wrong, as NaN > 0.8 is false
        in Hewitt's code.)  Since only a ratio is used, ``probs`` need not be normalised here.

    ``"close"`` — closing-bracket prediction, as in the second-order-RNN report (its §4.2,
        "Dyck-RNN"): the model outputs a distribution over the k close types, ``probs[b, t, i]``
        = P(``seq[t]`` is the close of type i).  Only positions whose gold token ``seq[t]`` is a
        close bracket are judged: correct iff P(gold close) > 0.8.  ``probs`` must be normalised.

    The report words the threshold as "at least 80% probability mass"; Hewitt's code, which the
    report cites for the metric, tests a strict ``> 0.8``.  We follow the code (the two differ
    only when a probability is exactly 0.8).

Distance buckets
    Each judgement is filed under the distance d between the position and the open bracket on
    top of the stack (for ``"close"``, the open bracket that ``seq[t]`` closes — the same
    bracket).  We follow Hewitt's offset exactly: ``reporter.py`` indexes the model INPUT
    ``START + seq[:-1]``, where the judgement for ``seq[t]`` sits at input index t and an open
    bracket ``seq[j]`` at input index j+1, and files it under ``t - (j+1)``.  So

        d = t - j - 1 = the number of tokens read since the open bracket,

    d = 0 right after the open bracket is read, and when ``seq[t]`` is the matching close, d is
    the number of tokens strictly between the two brackets (``(a a)`` → 0, ``(a (b b) a)`` → 2).

Aggregates (all percentages)
    Per distance d: accuracy = correct / judged at d.  Then

    * ``wcpa_min``  — the minimum over the distance buckets that occur.  This is our reading of
      the report's "worst-case long-distance prediction accuracy (WCPA) [5]" ([5] = Hewitt et al.
      2020): the accuracy at the worst distance.  In Hewitt's public plotting script
      (``make_emnlp2020_plot.py``) the minimum over distances is present but commented out.
    * ``wcpa_mean`` — the mean over the distance buckets (each bucket weighs the same however
      many judgements it holds).  This is what Hewitt's public plots show, titled "Average
      bracket-closing accuracy" (then the median over 3 seeds, which is left to the caller).
    * ``accuracy``  — the micro average over all judgements.

    Hewitt's per-split summary is the list of (accuracy at d, d) for every d with at least one
    judgement; ``compute()`` returns the same table under ``per_distance``.  Buckets holding a
    single judgement can dominate the minimum; ``compute(min_count=...)`` can leave sparse
    buckets out of the two bucket aggregates (default 1 keeps all, as Hewitt does).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from lstmablate_tasks.dyck.language import PAD_ID, DyckVocab, stack_annotations

Objective = Literal["lm", "close"]
OBJECTIVES: tuple[str, ...] = ("lm", "close")
#: Hewitt's ``P_THRESHOLD``.
P_THRESHOLD = 0.8


def _as_sequences(seqs: Sequence[Sequence[int]] | Tensor) -> list[list[int]]:
    """Lists of ids; a (B, T) id tensor is cut at each row's first ``<pad>``."""
    if isinstance(seqs, Tensor):
        if seqs.dim() != 2:
            raise ValueError(f"a tensor of sequences must be (B, T), got shape {tuple(seqs.shape)}")
        rows = []
        for row in seqs.tolist():
            rows.append(row[: row.index(PAD_ID)] if PAD_ID in row else row)
        return rows
    return [[int(tok) for tok in seq] for seq in seqs]


def bracket_closing_judgements(
    probs: Tensor,
    seqs: Sequence[Sequence[int]] | Tensor,
    k: int,
    objective: Objective = "lm",
    threshold: float = P_THRESHOLD,
) -> tuple[np.ndarray, np.ndarray]:
    """The judged positions of a batch: ``(distances, correct)``, two 1-D arrays of equal length.

    See :func:`bracket_closing_records` for the arguments.
    """
    records = bracket_closing_records(probs, seqs, k, objective, threshold)
    distances = np.asarray([r[1] for r in records], dtype=np.int64)
    correct = np.asarray([r[4] for r in records], dtype=bool)
    return distances, correct


def bracket_closing_records(
    probs: Tensor,
    seqs: Sequence[Sequence[int]] | Tensor,
    k: int,
    objective: Objective = "lm",
    threshold: float = P_THRESHOLD,
) -> list[tuple[int, int, int, float, bool]]:
    """Every judgement of a batch, in order: ``(position t, distance d, gold close type,
    probability of the gold close, correct)`` — for ``"lm"`` the probability is the gold
    close's share of the closing-bracket mass (NaN when there is none).

    ``probs`` is (B, T, V) with V = 2k+3 (a :class:`DyckVocab`'s ids) for ``"lm"``, or (B, T, k)
    for ``"close"``; ``probs[b, t]`` predicts ``seqs[b][t]``; positions t >= len(seqs[b]) are
    padding and ignored.  ``seqs`` are lists of ids (ending with END), or a (B, T) id tensor
    padded with ``<pad>`` = 0.  See the module docstring for what is judged and how.
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r}; expected one of {OBJECTIVES}")
    vocab = DyckVocab(k)
    rows = _as_sequences(seqs)
    width = vocab.size if objective == "lm" else k
    if probs.dim() != 3 or probs.shape[0] != len(rows) or probs.shape[2] != width:
        raise ValueError(
            f"for objective {objective!r} with k={k}, probs must be (B={len(rows)}, T, {width}); "
            f"got shape {tuple(probs.shape)}"
        )
    longest = max((len(r) for r in rows), default=0)
    if probs.shape[1] < longest:
        raise ValueError(f"probs has {probs.shape[1]} time steps but a sequence has {longest}")

    batch_idx: list[int] = []
    time_idx: list[int] = []
    gold_type: list[int] = []
    distance: list[int] = []
    for b, seq in enumerate(rows):
        after = stack_annotations(seq, k)  # also checks the close brackets match
        for t in range(1, len(seq)):
            before = after[t - 1]  # the stack after reading seq[:t]
            if before.depth == 0:
                continue  # nothing to close (and a valid seq[t] is no close bracket)
            if objective == "close" and not vocab.is_close(seq[t]):
                continue
            # The gold close is that of the open bracket on top of the stack.
            batch_idx.append(b)
            time_idx.append(t)
            gold_type.append(before.top_type)  # type: ignore[arg-type]
            distance.append(t - before.top_index - 1)  # type: ignore[operator]

    if not batch_idx:
        return []
    device = probs.device
    bi = torch.tensor(batch_idx, device=device)
    ti = torch.tensor(time_idx, device=device)
    gi = torch.tensor(gold_type)
    judged = probs.detach()[bi, ti].to("cpu", torch.float64)  # (N, V) or (N, k)
    if objective == "lm":
        first_close = vocab.close_id(0)
        closes = judged[:, first_close : first_close + k]
        ratio = closes.gather(1, gi[:, None]).squeeze(1) / closes.sum(dim=1)
    else:
        ratio = judged.gather(1, gi[:, None]).squeeze(1)
    correct = (ratio > threshold).tolist()  # NaN (0/0) compares False: wrong
    return list(zip(time_idx, distance, gold_type, ratio.tolist(), correct))


class BracketClosingMeter:
    """Accumulates bracket-closing judgements over batches; :meth:`compute` gives WCPA et al.

    Usage::

        meter = BracketClosingMeter(k=2, objective="lm")
        for probs, seqs in batches:      # probs: softmax of the model's outputs
            meter.update(probs, seqs)
        meter.compute()["wcpa_min"]
    """

    def __init__(self, k: int, objective: Objective = "lm", threshold: float = P_THRESHOLD):
        if objective not in OBJECTIVES:
            raise ValueError(f"unknown objective {objective!r}; expected one of {OBJECTIVES}")
        DyckVocab(k)  # validates k
        self.k = k
        self.objective = objective
        self.threshold = threshold
        self.reset()

    def reset(self) -> None:
        self._correct = np.zeros(0, dtype=np.int64)  # indexed by distance
        self._total = np.zeros(0, dtype=np.int64)

    def update(self, probs: Tensor, seqs: Sequence[Sequence[int]] | Tensor) -> None:
        """Add one batch; arguments as in :func:`bracket_closing_judgements`."""
        distances, correct = bracket_closing_judgements(
            probs, seqs, self.k, self.objective, self.threshold
        )
        self.add(distances, correct)

    def add(self, distances: np.ndarray, correct: np.ndarray) -> None:
        """Add judgements directly: their distances and whether each was correct."""
        distances = np.asarray(distances, dtype=np.int64)
        correct = np.asarray(correct, dtype=bool)
        if distances.size == 0:
            return
        size = max(int(distances.max()) + 1, self._total.size)
        self._total = _grow(self._total, size) + np.bincount(distances, minlength=size)
        self._correct = _grow(self._correct, size) + np.bincount(
            distances, weights=correct.astype(np.int64), minlength=size
        ).astype(np.int64)

    def compute(self, min_count: int = 1) -> dict[str, Any]:
        """Aggregates of everything seen since the last reset, in percent.

        Returns ``wcpa_min``, ``wcpa_mean`` (min / mean over distance buckets holding at least
        ``min_count`` judgements), ``worst_distance`` and ``worst_judged`` (the distance and the
        number of judgements of the bucket behind ``wcpa_min``; the longest such distance on a
        tie), ``accuracy`` (micro average over all judgements), ``n_judged``,
        ``n_buckets`` (buckets entering min/mean) and ``per_distance``: ``{d: {"correct", "total",
        "accuracy"}}`` for every d with a judgement.  With nothing judged the three scores are NaN.
        """
        per_distance = {
            int(d): {
                "correct": int(self._correct[d]),
                "total": int(self._total[d]),
                "accuracy": 100.0 * float(self._correct[d]) / float(self._total[d]),
            }
            for d in np.flatnonzero(self._total)
        }
        kept = {d: row for d, row in per_distance.items() if row["total"] >= min_count}
        bucket_acc = [row["accuracy"] for row in kept.values()]
        n_judged = int(self._total.sum())
        nan = float("nan")
        # wcpa_min is the worst bucket's accuracy (the longest distance among equally bad ones);
        # a min over buckets is only as solid as the number of judgements in that bucket
        worst = max(kept, key=lambda d: (-kept[d]["accuracy"], d)) if kept else None
        return {
            "wcpa_min": float(kept[worst]["accuracy"]) if kept else nan,
            "worst_distance": float(worst) if kept else nan,
            "worst_judged": float(kept[worst]["total"]) if kept else nan,
            "wcpa_mean": float(np.mean(bucket_acc)) if bucket_acc else nan,
            "accuracy": 100.0 * float(self._correct.sum()) / n_judged if n_judged else nan,
            "n_judged": n_judged,
            "n_buckets": len(bucket_acc),
            "per_distance": per_distance,
        }


def _grow(counts: np.ndarray, size: int) -> np.ndarray:
    return np.pad(counts, (0, size - counts.size))


def read_predictions(path) -> dict[str, float]:
    """WCPA, accuracy and the worst bucket from a predictions file written by
    ``DyckTask.write_predictions`` (a header line, then one JSON object per string)."""
    import json
    from pathlib import Path

    from lstmablate.data import read_lines
    from lstmablate.errors import DataError, where

    path = Path(path)
    lines = read_lines(path)
    try:
        header = json.loads(lines[0]) if lines else None
    except json.JSONDecodeError:
        header = None
    if not isinstance(header, dict) or header.get("task") != "dyck":
        raise DataError(f"{where(path, 1)}: expected the JSON header of a Dyck predictions file "
                        '({"task": "dyck", "k": ..., ...}).')
    meter = BracketClosingMeter(int(header["k"]), header["objective"], float(header["threshold"]))
    for lineno, line in enumerate(lines[1:], 2):
        try:
            judged = json.loads(line)["judgements"]
            meter.add([j[1] for j in judged], [bool(j[4]) for j in judged])
        except (json.JSONDecodeError, KeyError, IndexError, TypeError):
            raise DataError(f"{where(path, lineno)}: expected a JSON object with a "
                            '"judgements" list of [position, distance, gold, p, correct].') from None
    res = meter.compute(min_count=int(header.get("min_bucket_count", 1)))
    return {k: float(res[k]) for k in ("wcpa_min", "wcpa_mean", "accuracy", "worst_distance",
                                       "worst_judged")}
