"""Parser-v1's length buckets and token-count minibatches (tdozat/Parser-v1).

Parser-v1 (``dataset.py``, ``lib/etc/k_means.py``) sorts the training sentences
into ``n_bkts = 40`` buckets by length — the length counts the ROOT token that
is prepended to every sentence — with bucket boundaries ("splits") chosen by a
one-dimensional k-means that reduces the padded size.  Every epoch, each bucket
is shuffled and cut into ``max(len(bucket) * bucket_size // 5000, 1)`` nearly
equal pieces (``np.array_split``), and all pieces of all buckets are shuffled
together; a piece is padded to its own longest sentence.  So a batch holds
about 5,000 tokens of sentences of similar length.

:func:`kmeans_splits` ports ``KMeans`` step by step, including its bookkeeping
(the right shift adds the count of the old boundary length, not of the new
one), and gives Parser-v1's splits wherever Parser-v1 finishes (checked against
its ``k_means.py``).  One guard is added: Parser-v1's initialisation moves a split
down until it is a length that occurs and lies below the next split, and never
stops when more than two of the equal-count chunks end at the shortest length —
which happens on UD EWT r2.16's training file with 40 buckets (521 one-word
sentences, length 2 with ROOT): Parser-v1's code as released loops forever there.
The guard stops at the shortest length and lets the following pass move the
next split up instead.  :func:`epoch_groups` ports ``get_minibatches`` with a
``torch.Generator`` in place of NumPy's global random state, so an epoch's plan
is fixed by the trainer's generator and a resumed run rebuilds it exactly.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import torch


def _initial_splits(len_cntr: Counter, k: int) -> list[int]:
    """The largest length of each of ``k`` equal-count chunks of the sorted lengths, moved
    to lengths that occur and made strictly increasing (Parser-v1's initialisation)."""
    lengths = sorted(len_cntr.elements())
    n = len(lengths)
    # np.array_split: the first n % k chunks have one more element
    size, extra = divmod(n, k)
    splits, start = [], 0
    for i in range(k):
        stop = start + size + (1 if i < extra else 0)
        splits.append(lengths[stop - 1])
        start = stop
    lo = lengths[0]
    for i in range(len(splits) - 1, 0, -1):
        # (the guard `> lo` is not in Parser-v1, which loops forever when more than two
        # chunks end at the shortest length; the pass below then moves the next split up)
        while (splits[i - 1] >= splits[i] or splits[i - 1] not in len_cntr) and splits[i - 1] > lo:
            splits[i - 1] -= 1
    for i in range(1, len(splits) - 1):
        while splits[i] <= splits[i - 1] or splits[i] not in len_cntr:
            splits[i] += 1
    return splits


def kmeans_splits(lengths: Sequence[int], k: int, max_rounds: int = 10_000) -> list[int]:
    """Bucket boundaries for ``lengths``: sentence i goes to the first split >= lengths[i].

    ``k`` is capped at the number of distinct lengths (Parser-v1 raises instead).
    """
    len_cntr = Counter(int(n) for n in lengths)
    if not len_cntr:
        raise ValueError("no lengths to bucket")
    k = max(1, min(k, len(len_cntr)))
    sorted_lengths = sorted(len_cntr)
    splits = _initial_splits(len_cntr, k)
    if splits != sorted(set(splits)) or splits[-1] != sorted_lengths[-1]:
        # not reached on real treebanks; a safe fallback for degenerate length sets
        splits = sorted(set(splits) | {sorted_lengths[-1]})
        return splits

    # split -> number of sentences in its bucket; split -> index in sorted_lengths
    split_cntr: Counter = Counter()
    split2len_idx: dict[int, int] = {}
    split_idx, split = 0, splits[0]
    for len_idx, length in enumerate(sorted_lengths):
        split_cntr[split] += len_cntr[length]
        if length == split:
            split2len_idx[split] = len_idx
            split_idx += 1
            if split_idx < len(splits):
                split = splits[split_idx]
                split_cntr[split] = 0

    def recenter() -> None:
        for i in range(len(splits)):
            split = splits[i]
            len_idx = split2len_idx[split]
            if split == splits[-1]:
                continue
            right_split = splits[i + 1]
            # try moving the boundary one length to the left
            if len_idx > 0 and sorted_lengths[len_idx - 1] not in split_cntr:
                new_split = sorted_lengths[len_idx - 1]
                left_delta = (len_cntr[split] * (right_split - new_split)
                              - split_cntr[split] * (split - new_split))
                if left_delta < 0:
                    splits[i] = new_split
                    split2len_idx[new_split] = len_idx - 1
                    del split2len_idx[split]
                    split_cntr[split] -= len_cntr[split]
                    split_cntr[right_split] += len_cntr[split]
                    split_cntr[new_split] = split_cntr[split]
                    del split_cntr[split]
            # else try moving it one length to the right (bookkeeping as in Parser-v1)
            elif len_idx < len(sorted_lengths) - 2 and sorted_lengths[len_idx + 1] not in split_cntr:
                new_split = sorted_lengths[len_idx + 1]
                right_delta = (split_cntr[split] * (new_split - split)
                               - len_cntr[split] * (new_split - split))
                if right_delta <= 0:
                    splits[i] = new_split
                    split2len_idx[new_split] = len_idx + 1
                    del split2len_idx[split]
                    split_cntr[split] += len_cntr[split]
                    split_cntr[right_split] -= len_cntr[split]
                    split_cntr[new_split] = split_cntr[split]
                    del split_cntr[split]

    old = None
    rounds = 0
    while splits != old and rounds < max_rounds:
        old = list(splits)
        recenter()
        rounds += 1
    return splits


def assign_buckets(lengths: Sequence[int], splits: Sequence[int]) -> list[list[int]]:
    """Indices of ``lengths`` per bucket (in input order): the first split >= the length."""
    import bisect

    buckets: list[list[int]] = [[] for _ in splits]
    for i, n in enumerate(lengths):
        b = bisect.bisect_left(splits, n)
        if b == len(splits):
            raise ValueError(f"length {n} is longer than the last bucket ({splits[-1]})")
        buckets[b].append(i)
    return buckets


def epoch_groups(buckets: Sequence[Sequence[int]], splits: Sequence[int], batch_tokens: int,
                 generator: torch.Generator) -> list[list[int]]:
    """One epoch's minibatches (lists of example indices), Parser-v1's ``get_minibatches``:
    each bucket shuffled and cut into max(len * bucket_size // batch_tokens, 1) nearly equal
    pieces, then all pieces shuffled.  Deterministic given ``generator``.  A ``batch_tokens``
    smaller than a bucket's sentences would ask for more pieces than sentences (empty pieces in
    ``np.array_split``): a bucket is cut into at most one piece per sentence."""
    if batch_tokens < 1:
        raise ValueError(f"batch_tokens must be >= 1, got {batch_tokens}")
    pieces: list[list[int]] = []
    for bucket, size in zip(buckets, splits):
        if not bucket:
            continue
        n_splits = min(max(len(bucket) * size // batch_tokens, 1), len(bucket))
        perm = torch.randperm(len(bucket), generator=generator).tolist()
        q, extra = divmod(len(bucket), n_splits)  # np.array_split sizes
        start = 0
        for j in range(n_splits):
            stop = start + q + (1 if j < extra else 0)
            pieces.append([bucket[p] for p in perm[start:stop]])
            start = stop
    order = torch.randperm(len(pieces), generator=generator).tolist()
    return [pieces[j] for j in order]


def eval_groups(lengths: Sequence[int], batch_tokens: int) -> list[list[int]]:
    """Evaluation batches: indices sorted by length, cut so that the padded size
    (batch size x longest) stays within ``batch_tokens`` (a longer sentence is alone)."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    groups: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        if cur and (len(cur) + 1) * lengths[i] > batch_tokens:
            groups.append(cur)
            cur = []
        cur.append(i)
    if cur:
        groups.append(cur)
    return groups
