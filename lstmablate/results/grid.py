"""A grid's choice: which value of one setting (a learning rate) a cell should train with.

Levy et al. gave −GATES a learning rate of its own because it would not train at the LSTM's;
this is that practice as a rule: train the cell at a few values around the base one (the
LSTM's), one seed, whole runs, and keep the value whose run has the best validation number —
the task's primary metric (higher or lower as the task says) of the model the run tests
(:func:`dev_of_tested_model`): its best dev evaluation (``result.json``'s ``best.dev``) where the run
tests its best checkpoint, its last where it tests the model at the end of training
(``train.test_checkpoint: last``: PTB as the TensorFlow tutorial, the parser as Parser-v1,
NMT as the recipe).  The test set plays no part; a run that diverged is never the choice.  A
tie keeps the value nearest the base one (by ratio: a learning rate is a scale), then the
lower one.  The simpler recurrences' rate grids
(``recipes/simpler-recurrences-*-lr.yaml``) are chosen this way, and the results page checks
that each recipe's rate is its grid's choice.

A grid over the rate and another setting — the second-order report's Dyck setting trains each
cell at m = 4, 6 and 8 with one rate, as the LSTM has one — gives the cell one rate for every
value of the other: the rate whose runs have the best mean validation number over them
(:func:`pooled`).  A run that diverged at one of them rules its rate out.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence


def dev_of_tested_model(metric: str, test_checkpoint: str, best_dev: Mapping[str, Any] | None,
                        evaluations: Callable[[], Sequence[Mapping[str, Any]]]) -> float:
    """The validation number of the model a run tests, in ``metric``: with ``test_checkpoint``
    ``"last"``, the last of its dev ``evaluations()`` (``metrics.jsonl``'s lines, in order,
    read only then) that has ``metric``; otherwise ``best_dev``'s (``result.json``'s
    ``best.dev``).  A rate whose best epoch came early and whose last model — the one tested —
    is worse is compared by that last model, so that a grid's dev and test numbers are of one
    model.  NaN where the run has no such number."""
    def number(value: Any) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if test_checkpoint == "last":
        found = [e[metric] for e in evaluations() if number(e.get(metric))]
        return float(found[-1]) if found else math.nan
    value = (best_dev or {}).get(metric)
    return float(value) if number(value) else math.nan


def choose(dev: Mapping[float, float], higher_is_better: bool, base: float | None = None) -> float:
    """The value of ``dev`` (value -> its run's best validation number) with the best number;
    a tie is broken towards ``base`` (the distance ``|log(value / base)|``, values and base
    positive), then towards the lower value.  A number that is not finite (a run that
    diverged) is never chosen; a ValueError when no value has a finite number."""
    finite = {value: number for value, number in dev.items() if math.isfinite(number)}
    if not finite:
        raise ValueError("no value of the grid has a finite validation number"
                         if dev else "an empty grid has no choice")
    best = max(finite.values()) if higher_is_better else min(finite.values())
    tied = [value for value, number in finite.items() if number == best]

    def distance(value: float) -> float:
        if base is None or base <= 0 or value <= 0:
            return 0.0
        return abs(math.log(value / base))
    return min(tied, key=lambda value: (distance(value), value))


def pooled(numbers: Mapping[float, Sequence[float]]) -> dict[float, float]:
    """Each value's mean validation number over the other setting's points (value -> its runs'
    numbers, one per point), for :func:`choose`; not finite (never chosen) where one of its
    runs is not or it has none."""
    return {value: math.fsum(xs) / len(xs) if xs and all(math.isfinite(x) for x in xs)
            else math.nan for value, xs in numbers.items()}


def shown(number: float) -> str:
    """A validation number as a grid shows it: four decimals below 10 (a loss, where rates
    differ in the third), else two (a percentage, a perplexity)."""
    return f"{number:.4f}" if abs(number) < 10 else f"{number:.2f}"
