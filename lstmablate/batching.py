"""Batch plans: a sized, indexable list of one epoch's batches.

A task returns ``BatchPlan(groups, collate)`` from ``train_plan``: ``groups[i]``
says which examples form batch ``i`` (cheap to hold for a whole epoch), and
``collate`` builds the tensors only when batch ``i`` is asked for.  The plan is
fixed by the epoch's ``torch.Generator``, so a resumed run asks for ``plan[i]``
at its saved position and never builds (or draws random numbers for) the
batches it already trained on.

:func:`token_budget_batches` is the generic length-bucketed batching of
parsers and translation systems: examples of similar length together, about
``max_tokens`` tokens per batch, batches in random order.
:func:`pooled_batches` keeps a fixed number of examples per batch and buckets
them by length within pools (torchtext's ``pool`` order, which OpenNMT-py used).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import torch
from torch import Tensor

G = TypeVar("G")


class BatchPlan(Sequence, Generic[G]):
    """``plan[i] == collate(groups[i])``; ``len(plan) == len(groups)``."""

    def __init__(self, groups: Sequence[G], collate: Callable[[G], Any]):
        self.groups = groups
        self.collate = collate

    def __len__(self) -> int:
        return len(self.groups)

    def __getitem__(self, i: int) -> Any:  # type: ignore[override]
        if isinstance(i, slice):
            raise TypeError("a BatchPlan is indexed by one batch number at a time")
        return self.collate(self.groups[i])

    def __repr__(self) -> str:
        return f"BatchPlan({len(self)} batches)"


def contiguous_groups(n: int, batch_size: int, order: Sequence[int] | None = None) -> list[list[int]]:
    """``order`` (default 0..n-1) cut into consecutive groups of ``batch_size`` (last may be short)."""
    idx = list(range(n)) if order is None else list(order)
    return [idx[i:i + batch_size] for i in range(0, len(idx), batch_size)]


def token_budget_batches(lengths: Sequence[int], max_tokens: int, generator: torch.Generator,
                         shuffle_within: bool = True) -> list[list[int]]:
    """Groups of example indices, each about ``max_tokens`` tokens, of similar lengths.

    Examples are sorted by length (ties in a random order drawn from ``generator``), cut
    greedily into groups whose padded size ``len(group) * max(length)`` stays within
    ``max_tokens`` (an example longer than the budget is a group of its own), and the
    groups are returned in a random order.  Deterministic given the generator.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    n = len(lengths)
    tie = torch.randperm(n, generator=generator).tolist() if shuffle_within else list(range(n))
    order = sorted(range(n), key=lambda i: (lengths[i], tie[i]))
    groups: list[list[int]] = []
    cur: list[int] = []
    longest = 0
    for i in order:
        L = max(int(lengths[i]), 1)
        if cur and (len(cur) + 1) * max(longest, L) > max_tokens:
            groups.append(cur)
            cur, longest = [], 0
        cur.append(i)
        longest = max(longest, L)
    if cur:
        groups.append(cur)
    perm = torch.randperm(len(groups), generator=generator).tolist()
    return [groups[j] for j in perm]


def pooled_batches(lengths: Sequence[int], batch_size: int, generator: torch.Generator,
                   pool_batches: int = 100) -> list[list[int]]:
    """One epoch of ``batch_size``-example batches in torchtext's ``pool`` order.

    The examples are shuffled; the shuffled list is cut into pools of
    ``pool_batches * batch_size`` examples; each pool is sorted by length (stably) and cut
    into batches of ``batch_size`` (the epoch's last batch may be smaller); the batches of
    a pool are shuffled and emitted pool by pool.  Every example is in exactly one batch;
    the order is fixed by ``generator``.  Padding stays near zero (a batch's examples are
    neighbours in length) while the batch order stays random.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if pool_batches < 1:
        raise ValueError(f"pool_batches must be >= 1, got {pool_batches}")
    order = torch.randperm(len(lengths), generator=generator).tolist()
    pool = batch_size * pool_batches
    groups: list[list[int]] = []
    for lo in range(0, len(order), pool):
        chunk = sorted(order[lo:lo + pool], key=lambda i: lengths[i])  # stable
        batches = [chunk[j:j + batch_size] for j in range(0, len(chunk), batch_size)]
        perm = torch.randperm(len(batches), generator=generator).tolist()
        groups.extend(batches[j] for j in perm)
    return groups


def shard_batch(batch: Any, info: Any) -> Any:
    """This rank's contiguous slice of every tensor in ``batch`` along dim 0 (``info``: the
    process's ``rank``, ``world_size`` and whether data-parallel training is ``enabled``,
    :class:`lstmablate.train.distributed.DistInfo`).

    Tensors whose first dimension is the batch size are split into
    ``world_size`` near-equal parts; anything else is passed through.
    Tasks whose batches are laid out differently override ``Task.shard``.
    """
    if not info.enabled:
        return batch
    size = _batch_size(batch)
    if size is None:
        return batch
    if size < info.world_size:
        raise ValueError(f"a batch of {size} cannot be split over {info.world_size} processes")
    bounds = [size * r // info.world_size for r in range(info.world_size + 1)]
    lo, hi = bounds[info.rank], bounds[info.rank + 1]

    def cut(x: Any) -> Any:
        if isinstance(x, Tensor) and x.dim() > 0 and x.shape[0] == size:
            return x[lo:hi]
        if isinstance(x, (list, tuple)):
            return type(x)(cut(v) for v in x)
        if isinstance(x, dict):
            return {k: cut(v) for k, v in x.items()}
        return x

    return cut(batch)


def _batch_size(batch: Any) -> int | None:
    if isinstance(batch, Tensor):
        return batch.shape[0] if batch.dim() else None
    if isinstance(batch, (list, tuple)):
        for b in batch:
            n = _batch_size(b)
            if n is not None:
                return n
    if isinstance(batch, dict):
        for b in batch.values():
            n = _batch_size(b)
            if n is not None:
                return n
    return None
