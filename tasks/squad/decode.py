"""Best answer span from start and end scores.

The score of a span (i, j) is ``start[i] + end[j]`` with ``i <= j`` (and, with a maximum
length L, ``j - i + 1 <= L``):

* DrQA (``--max_len 15``) takes the argmax of the outer product
  ``p_start(i) * p_end(j)`` over ``i <= j <= i + 14``; with log-probabilities as scores the
  product is this sum, so the argmax is the same;
* BiDAF (AllenNLP ``_get_best_span``, §2.1) maximises ``start_logit[i] + end_logit[j]``
  over ``i <= j`` with no length limit.

Both are computed exactly without the (T x T) table: with a limit, one pass per offset
``d = j - i`` (L passes of O(T)); without, a running maximum of the start scores
(``max_{i<=j} start[i]``) makes it O(T).  Padding positions must hold ``-inf``.
"""

from __future__ import annotations

import torch
from torch import Tensor


def best_spans(start: Tensor, end: Tensor, max_len: int | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """(first, last, score) of the best span of each row of (B, T) ``start``/``end`` scores.

    ``max_len`` is the longest span in tokens (None or 0: no limit).  Among spans of equal
    score the choice is deterministic (no limit: the earliest end, then the earliest start;
    with a limit: the shortest, then the earliest)."""
    if start.shape != end.shape or start.dim() != 2:
        raise ValueError(f"start and end must be (B, T) of one shape, got {tuple(start.shape)} "
                         f"and {tuple(end.shape)}")
    B, T = start.shape
    if T == 0:
        raise ValueError("cannot decode a span from zero positions")
    if not max_len or max_len >= T:
        best_start = torch.cummax(start, dim=1).values  # max_{i <= j} start[i], for every j
        score, last = (best_start + end).max(dim=1)
        first = _first_argmax_prefix(start).gather(1, last.unsqueeze(1)).squeeze(1)
        return first, last, score
    best = torch.full((B,), float("-inf"), dtype=start.dtype, device=start.device)
    first = torch.zeros(B, dtype=torch.long, device=start.device)
    last = torch.zeros(B, dtype=torch.long, device=start.device)
    for d in range(max_len):  # spans (i, i + d)
        s = start[:, :T - d] + end[:, d:]
        v, i = s.max(dim=1)
        better = v > best
        best = torch.where(better, v, best)
        first = torch.where(better, i, first)
        last = torch.where(better, i + d, last)
    return first, last, best


def _first_argmax_prefix(x: Tensor) -> Tensor:
    """For each row and each j, the first index i <= j where x[i] = max(x[:j+1])."""
    B, T = x.shape
    run = torch.cummax(x, dim=1).values
    # position i starts a new strict maximum when x[i] > max(x[:i])
    prev = torch.cat([torch.full((B, 1), float("-inf"), dtype=x.dtype, device=x.device),
                      run[:, :-1]], dim=1)
    pos = torch.arange(T, device=x.device).expand(B, T)
    new = (x > prev) | (pos == 0)
    return torch.cummax(torch.where(new, pos, torch.zeros_like(pos)), dim=1).values
