"""Training batches as OpenNMT-py (torchtext 0.2) made them, and padded batch tensors.

Order of one epoch (``onmt.io.OrderedIterator`` in training mode = ``torchtext.data.pool``):
the examples are shuffled; the shuffled list is cut into pools of ``100 * batch_size``
examples; each pool is sorted by source length (stably) and cut into batches of
``batch_size`` sentences (``-batch_type sents``, 64); the batches of a pool are shuffled and
emitted pool by pool. The last batch of the epoch may be smaller. Every random choice is drawn
from the epoch's ``torch.Generator``, so the plan is fixed by it (resume jumps into it).

A batch (:func:`collate`) is a dict of tensors, batch first:
``src`` (B, S) source ids padded with the source ``<blank>``, ``src_lengths`` (B,),
``tgt_in`` (B, T) = ``<s> y_1 .. y_n`` and ``tgt_out`` (B, T) = ``y_1 .. y_n </s>``, both
padded with the target ``<blank>`` (the decoder reads ``tgt[:-1]`` and is scored on
``tgt[1:]``, as ``NMTModel.forward`` / the loss did).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lstmablate.batching import pooled_batches

__all__ = ["POOL_BATCHES", "pooled_batches", "collate", "length_sorted_groups"]

#: torchtext.data.pool sorts chunks of this many batches (the order itself:
#: :func:`lstmablate.batching.pooled_batches`)
POOL_BATCHES = 100


def length_sorted_groups(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Evaluation batches: indices sorted by length (longest first), cut into ``batch_size``.

    The order changes nothing in the results (padding never leaks into a sentence); it only
    keeps the padding small."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]


def _pad(rows: Sequence[Sequence[int]], pad: int) -> torch.Tensor:
    width = max((len(r) for r in rows), default=0)
    out = torch.full((len(rows), max(width, 1)), pad, dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            out[i, :len(r)] = torch.tensor(r, dtype=torch.long)
    return out


def collate(src: Sequence[Sequence[int]], tgt: Sequence[Sequence[int]] | None, *, src_pad: int,
            tgt_pad: int, bos: int, eos: int) -> dict[str, torch.Tensor]:
    """Pad one batch of id sequences (see the module docstring); ``tgt`` None: source only."""
    batch = {"src": _pad(src, src_pad),
             "src_lengths": torch.tensor([len(s) for s in src], dtype=torch.long)}
    if tgt is not None:
        batch["tgt_in"] = _pad([[bos, *t] for t in tgt], tgt_pad)
        batch["tgt_out"] = _pad([[*t, eos] for t in tgt], tgt_pad)
    return batch
