"""Length buckets for ``train.step_capture`` (:mod:`lstmablate.train.capture`) and the
task hooks that pad to them (``Task.batch_length`` / ``Task.pad_batch``): a variable-length
task's batches padded to a few lengths chosen from the data, so that a bounded number of
static shapes covers an epoch.

* one length per batch (:func:`choose_buckets`): at most k buckets, the longest length always
  one, the rest the least total padding -- exactly, by dynamic programming over the distinct
  lengths;
* several lengths per batch (:func:`choose_grid`: NMT's source and target, SQuAD's passage and
  question): one tuple of buckets per dimension, grown one bucket at a time in the dimension
  whose next bucket saves the most padding relative to its mean length, while the batches,
  padded, take at most a given number of distinct shapes;
* :func:`bucket_for`: the smallest bucket that holds a length; :func:`pad_to`: one tensor
  padded along one dimension (what the tasks' ``pad_batch`` hooks are made of).
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

__all__ = ["choose_buckets", "choose_grid", "bucket_for", "pad_to"]



def choose_buckets(lengths: Sequence[int], max_buckets: int,
                   weights: Sequence[float] | None = None) -> tuple[int, ...]:
    """At most ``max_buckets`` lengths to pad batches to, chosen from the data: the longest
    length is always one (every batch fits), the others minimise the padding
    sum_i w_i (bucket(l_i) - l_i) over the batches' lengths ``l_i`` (weights ``w_i``, default
    1) -- exactly, by dynamic programming over the distinct lengths (the fewest buckets that
    reach the least padding)."""
    if max_buckets < 1:
        raise ValueError(f"max_buckets must be >= 1, got {max_buckets}")
    if not lengths:
        return ()
    table = _BucketTable(lengths, max_buckets, weights)
    k = min(range(1, table.K + 1), key=lambda k: (table.padding(k), k))
    return table.buckets(k)


class _BucketTable:
    """The dynamic programme of :func:`choose_buckets` for every number of buckets up to
    ``K`` at once: ``best[k][j]``, the least padding of the distinct lengths ``values[0..j]``
    with k buckets, the last at ``values[j]``, is min_i best[k-1][i] + cost(i+1, j), where
    cost(a, b) pads ``values[a..b]`` to ``values[b]`` (one vector operation per (k, j))."""

    def __init__(self, lengths: Sequence[int], K: int,
                 weights: Sequence[float] | None = None):
        w = [1.0] * len(lengths) if weights is None else [float(x) for x in weights]
        total: dict[int, float] = Counter()
        for length, weight in zip(lengths, w):
            total[int(length)] += weight
        self.values = values = sorted(total)
        m = len(values)
        self.K = K = max(1, min(K, m))
        v = np.array(values, dtype=np.float64)
        tw = np.array([total[x] for x in values], dtype=np.float64)
        # prefix sums of the weights and of weight x length
        W = np.concatenate([[0.0], np.cumsum(tw)])
        S = np.concatenate([[0.0], np.cumsum(tw * v)])
        best = np.full((K + 1, m), np.inf)
        back = np.full((K + 1, m), -1, dtype=np.int64)
        best[1] = v * W[1:] - S[1:]  # cost(0, j)
        for k in range(2, K + 1):
            for j in range(k - 1, m):
                i = np.arange(k - 2, j)  # the previous bucket at values[i]
                c = best[k - 1, i] + v[j] * (W[j + 1] - W[i + 1]) - (S[j + 1] - S[i + 1])
                a = int(np.argmin(c))  # (the first of equal costs)
                best[k, j], back[k, j] = c[a], i[a]
        self.best, self.back = best, back

    def padding(self, k: int) -> float:
        """The least padding with at most ``k`` buckets."""
        return float(self.best[1:min(k, self.K) + 1, -1].min())

    def buckets(self, k: int) -> tuple[int, ...]:
        """The buckets of the least padding with at most ``k`` of them (the fewest that reach
        it)."""
        k = min(range(1, min(k, self.K) + 1), key=lambda n: (self.best[n, -1], n))
        out, j = [], len(self.values) - 1
        while k >= 1 and j >= 0:
            out.append(self.values[j])
            j, k = int(self.back[k, j]), k - 1
        return tuple(sorted(out))


def choose_grid(lengths: Sequence[Sequence[int]], max_shapes: int
                ) -> tuple[tuple[int, ...], ...]:
    """Buckets for batches that vary in several lengths (one tuple per batch: e.g. NMT's
    (source, target) tokens): one tuple of buckets per dimension (each from
    :func:`choose_buckets`, its longest length always one), grown one bucket at a time --
    each time in the dimension whose next bucket saves the most padding relative to that
    dimension's mean length -- while these batches, padded, take at most ``max_shapes``
    distinct shapes."""
    if max_shapes < 1:
        raise ValueError(f"max_shapes must be >= 1, got {max_shapes}")
    if not lengths:
        return ()
    rows = [tuple(int(x) for x in row) for row in lengths]
    dims = len(rows[0])
    cols = [[r[d] for r in rows] for d in range(dims)]
    tables = [_BucketTable(c, max_shapes) for c in cols]
    scale = [max(sum(c) / len(c), 1.0) for c in cols]
    k = [1] * dims
    grid = [t.buckets(1) for t in tables]

    def shapes(g: list[tuple[int, ...]]) -> int:
        return len({tuple(bucket_for(r[d], g[d]) for d in range(dims)) for r in rows})

    while True:
        best = None
        for d in range(dims):
            if k[d] >= tables[d].K:
                continue
            g = tables[d].buckets(k[d] + 1)
            trial = grid[:d] + [g] + grid[d + 1:]
            if shapes(trial) > max_shapes:
                continue
            gain = (tables[d].padding(k[d]) - tables[d].padding(k[d] + 1)) / scale[d]
            if best is None or gain > best[0]:
                best = (gain, d, g)
        if best is None:
            return tuple(grid)
        _, d, g = best
        grid[d] = g
        k[d] += 1


def bucket_for(length: int, buckets: Sequence[int]) -> int | None:
    """The smallest bucket that holds ``length`` (None: longer than every bucket)."""
    i = bisect.bisect_left(buckets, length)
    return buckets[i] if i < len(buckets) else None


def pad_to(t: Tensor, dim: int, length: int, value: float | int) -> Tensor:
    """``t`` with its dimension ``dim`` padded at the end to ``length`` with ``value`` (what a
    task's ``pad_batch`` does to each of its tensors)."""
    extra = length - t.shape[dim]
    if extra < 0:
        raise ValueError(f"cannot pad dimension {dim} of size {t.shape[dim]} to {length}")
    if extra == 0:
        return t
    shape = list(t.shape)
    shape[dim] = extra
    return torch.cat([t, t.new_full(shape, value)], dim=dim)
