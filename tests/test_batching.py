"""Batch plans: sized, indexable, deterministic given the generator."""

from __future__ import annotations

import torch

import pytest

from lstmablate.batching import BatchPlan, contiguous_groups, pooled_batches, token_budget_batches


def test_plan_builds_only_the_batch_asked_for():
    built = []
    plan = BatchPlan([[0, 1], [2, 3], [4]], lambda g: built.append(g) or sum(g))
    assert len(plan) == 3 and plan[2] == 4 and built == [[4]]
    assert list(plan) == [1, 5, 4]


def test_contiguous_groups():
    assert contiguous_groups(5, 2) == [[0, 1], [2, 3], [4]]
    assert contiguous_groups(4, 3, order=[3, 1, 0, 2]) == [[3, 1, 0], [2]]


def test_token_budget_batches_cover_every_example_within_budget():
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 60, (500,), generator=g).tolist()
    lengths[7] = 300  # longer than the budget: a batch of its own
    groups = token_budget_batches(lengths, 250, torch.Generator().manual_seed(1))
    flat = sorted(i for grp in groups for i in grp)
    assert flat == list(range(500))  # every example exactly once
    for grp in groups:
        padded = len(grp) * max(lengths[i] for i in grp)
        assert padded <= 250 or grp == [7]
    # similar lengths together: the spread inside a batch is small next to the overall spread
    spreads = [max(lengths[i] for i in grp) - min(lengths[i] for i in grp) for grp in groups]
    assert sum(spreads) / len(spreads) < 5
    again = token_budget_batches(lengths, 250, torch.Generator().manual_seed(1))
    other = token_budget_batches(lengths, 250, torch.Generator().manual_seed(2))
    assert again == groups and other != groups  # fixed by the generator alone


def test_pooled_batches_are_torchtexts_order():
    lengths = [(i * 7919) % 23 + 1 for i in range(1000)]
    g = lambda: torch.Generator().manual_seed(5)  # noqa: E731
    groups = pooled_batches(lengths, 8, g(), pool_batches=10)
    assert groups == pooled_batches(lengths, 8, g(), pool_batches=10)  # fixed by the generator
    assert groups != pooled_batches(lengths, 8, torch.Generator().manual_seed(6), pool_batches=10)
    assert sorted(i for grp in groups for i in grp) == list(range(1000))
    assert [len(grp) for grp in groups].count(8) == len(groups)  # 1000 = 125 x 8
    # each pool of 80 examples is sorted by length: every batch is a contiguous length range
    # of its pool, so the batches of a pool, ordered, never overlap in length
    for p in range(0, len(groups), 10):
        pool = sorted(groups[p:p + 10], key=lambda grp: [lengths[i] for i in grp])
        flat = [lengths[i] for grp in pool for i in sorted(grp, key=lambda i: lengths[i])]
        assert flat == sorted(flat)


def test_pooled_batches_follow_torchtexts_recipe_step_by_step():
    """The same epoch rebuilt by hand from the generator's draws: one permutation of all
    examples, then per pool a stable sort by length and one permutation of its batches."""
    lengths = [(i * 13) % 11 + 1 for i in range(37)]
    got = pooled_batches(lengths, 4, torch.Generator().manual_seed(9), pool_batches=3)
    g = torch.Generator().manual_seed(9)
    order = torch.randperm(37, generator=g).tolist()
    want = []
    for lo in (0, 12, 24, 36):  # pools of 3 x 4 examples; the last pool holds 1
        pool = order[lo:lo + 12]
        pool = [i for _, _, i in sorted((lengths[i], k, i) for k, i in enumerate(pool))]
        batches = [pool[j:j + 4] for j in range(0, len(pool), 4)]
        want += [batches[j] for j in torch.randperm(len(batches), generator=g).tolist()]
    assert got == want and [len(b) for b in got].count(1) == 1


def test_pooled_batches_pad_less_than_random_batches():
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 400, (4000,), generator=gen).tolist()
    padded = lambda groups: sum(len(b) * max(lengths[i] for i in b) for b in groups)  # noqa: E731
    order = torch.randperm(4000, generator=gen).tolist()
    random_groups = contiguous_groups(4000, 64, order)
    pooled = pooled_batches(lengths, 64, torch.Generator().manual_seed(1), pool_batches=20)
    assert padded(pooled) < 1.1 * sum(lengths) < padded(random_groups) / 1.5


def test_pooled_batches_refuse_bad_sizes():
    with pytest.raises(ValueError, match="batch_size"):
        pooled_batches([1, 2], 0, torch.Generator())
    with pytest.raises(ValueError, match="pool_batches"):
        pooled_batches([1, 2], 2, torch.Generator(), pool_batches=0)
