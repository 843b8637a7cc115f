"""Batch plans for SQuAD readers.

Training (DrQA's ``SortedBatchSampler``, facebookresearch/DrQA reader/data.py; hitvoice sorts
by context length and shuffles the batches likewise): the trainable questions sorted by
context length, then question length, ties in a random order; cut into consecutive batches of
``batch_size``; the batches in a random order.  Every draw comes from the epoch's generator,
so the plan is fixed by it (resume jumps to ``plan[i]``).  AllenNLP's BiDAF iterator buckets
by (passage, question) length in the same way (its ``BucketIterator`` on passage and question lengths).

``random_batches``: hitvoice/DrQA's training batches as of February 2018, drawn at random
whatever the lengths (it sorted by length from May 2018 on).

Evaluation: all questions of a split sorted by context length (longest first, so a batch that
does not fit in memory fails at once), cut into batches of ``eval.batch_size``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .examples import SquadExamples


def length_sorted_batches(examples: SquadExamples, indices: Sequence[int], batch_size: int,
                          generator: torch.Generator) -> list[list[int]]:
    """Batches of ``indices`` (question numbers) of similar lengths, in a random order."""
    tie = torch.randperm(len(indices), generator=generator).tolist()
    qs, ps = examples.questions, examples.paragraphs
    order = sorted(range(len(indices)), key=lambda k: (len(ps[qs[indices[k]].paragraph].tokens),
                                                       len(qs[indices[k]].tokens), tie[k]))
    groups = [[indices[k] for k in order[i:i + batch_size]]
              for i in range(0, len(order), batch_size)]
    perm = torch.randperm(len(groups), generator=generator).tolist()
    return [groups[j] for j in perm]


def random_batches(indices: Sequence[int], batch_size: int,
                   generator: torch.Generator) -> list[list[int]]:
    """Batches of ``indices`` in a random order, whatever their lengths (hitvoice/DrQA of
    February 2018, ``train.py: BatchGen``: shuffle the examples, cut into batches)."""
    perm = torch.randperm(len(indices), generator=generator).tolist()
    return [[indices[k] for k in perm[i:i + batch_size]] for i in range(0, len(perm), batch_size)]


def eval_batches(examples: SquadExamples, batch_size: int) -> list[list[int]]:
    qs, ps = examples.questions, examples.paragraphs
    order = sorted(range(len(qs)), key=lambda i: (-len(ps[qs[i].paragraph].tokens), i))
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
