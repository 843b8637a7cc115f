"""A grid's choice: which value of one setting (a learning rate) a cell should train with.

Levy et al. gave −GATES a learning rate of its own because it would not train at the LSTM's;
this is that practice as a rule: train the cell at a few values around the base one (the
LSTM's), one seed, whole runs, and keep the value whose run has the best validation number —
the task's primary metric at the run's best dev evaluation (``result.json``'s ``best.dev``;
higher or lower as the task says).  The test set plays no part; a run that diverged is never
the choice.  A tie keeps the value nearest the base one (by ratio: a learning rate is a
scale), then the lower one.  The simpler recurrences' rate grids
(``recipes/simpler-recurrences-*-lr.yaml``) are chosen this way, and the results page checks
that each recipe's rate is its grid's choice.

A grid over the rate and another setting — the second-order report's Dyck setting trains each
cell at m = 4, 6 and 8 with one rate, as the LSTM has one — gives the cell one rate for every
value of the other: the rate whose runs have the best mean validation number over them
(:func:`pooled`).  A run that diverged at one of them rules its rate out.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence


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
