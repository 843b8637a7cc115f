"""Best-span decoding against brute force over every (i, j) pair."""

from __future__ import annotations

import pytest
import torch

from lstmablate_tasks.squad.decode import best_spans


def brute_force(start, end, length, max_len):
    best = (float("-inf"), None)
    for i in range(length):
        for j in range(i, length):
            if max_len and j - i + 1 > max_len:
                continue
            s = float(start[i] + end[j])
            if s > best[0]:
                best = (s, (i, j))
    return best


@pytest.mark.parametrize("max_len", [None, 1, 3, 15])
def test_best_span_equals_brute_force(max_len):
    g = torch.Generator().manual_seed(0)
    B, T = 64, 23
    start = torch.randn(B, T, generator=g, dtype=torch.float64)
    end = torch.randn(B, T, generator=g, dtype=torch.float64)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    pad = torch.arange(T).unsqueeze(0) >= lengths.unsqueeze(1)
    start = start.masked_fill(pad, float("-inf"))
    end = end.masked_fill(pad, float("-inf"))
    first, last, score = best_spans(start, end, max_len)
    for b in range(B):
        want_score, (i, j) = brute_force(start[b], end[b], int(lengths[b]), max_len)
        assert (int(first[b]), int(last[b])) == (i, j)
        assert float(score[b]) == pytest.approx(want_score)
        assert 0 <= first[b] <= last[b] < lengths[b]
        if max_len:
            assert last[b] - first[b] + 1 <= max_len


def test_start_after_the_best_end_is_not_taken():
    # the best start (3) comes after the best end (1): pairing them (18) is not a span; the
    # best spans are (3, 3) = 9.5 and (i <= 1, 1) = 9
    start = torch.tensor([[0.0, 0.0, 0.0, 9.0]])
    end = torch.tensor([[0.0, 9.0, 0.0, 0.5]])
    for max_len in (None, 2, 4):
        first, last, score = best_spans(start, end, max_len)
        assert (int(first), int(last)) == (3, 3) and float(score) == 9.5


def test_length_limit_changes_the_answer():
    start = torch.tensor([[5.0, 0.0, 0.0, 0.0, 0.0]])
    end = torch.tensor([[0.0, 0.0, 0.0, 0.0, 5.0]])
    assert [int(x) for x in best_spans(start, end, None)[:2]] == [0, 4]
    first, last, _ = best_spans(start, end, 2)
    assert int(last) - int(first) + 1 <= 2
