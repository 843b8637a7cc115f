"""Sampled softmax with a log-uniform (Zipfian) proposal, as ``tf.nn.sampled_softmax_loss``.

Józefowicz et al. (2016) train the Billion Word models with importance sampling over 8,192
sampled words; their public implementation (rafaljozefowicz/lm ``language_model.py``, reused by
Levy et al.'s group in kentonl/ran ``bwb/language_model.py``) calls
``tf.nn.sampled_softmax_loss(softmax_w, softmax_b, targets, inputs, num_sampled=8192,
num_classes=793470)`` with its defaults.  Those defaults are what this module computes:

* **Proposal** (``tf.nn.log_uniform_candidate_sampler``, ``range_max = V``): word id k (ids in
  decreasing-frequency order) has probability

      P(k) = (log(k + 2) - log(k + 1)) / log(V + 1),          k = 0 .. V-1

  (the sum telescopes to 1), drawn as ``floor(exp(u * log(V + 1))) - 1`` with u ~ U[0, 1).
* **Unique** candidates (``unique=True``): draws are repeated until ``num_sampled`` *distinct*
  ids are found; with ``num_tries`` the number of draws that took, each id's expected count
  ("Q") is TF's ``1 - (1 - P(k)) ** num_tries`` (= ``-expm1(num_tries * log1p(-P(k)))``), or
  ``num_sampled * P(k)`` when no draw was a repeat / without ``unique``.
* **One candidate set per batch**, shared by every position of the batch.
* **logQ correction** (``subtract_log_q=True``): the logit of the target and of every sampled
  candidate has ``log Q`` of its id subtracted.
* **Accidental hits removed** (``remove_accidental_hits=True``): a sampled candidate equal to a
  position's target gets logit -inf for that position (TF adds -FLOAT_MAX).
* The loss of a position is the cross-entropy of the softmax over [target, candidates] with the
  target first.

With the correction, the sampled loss is (up to the removal of accidental hits) the exact
negative log-posterior of "which candidate is the target" given the candidate set, so a model
whose logits equal the data's log-probabilities is a stationary point of its expected gradient,
as of the full softmax's (tests/test_bwb_sampled_softmax.py measures this).  Evaluation uses the
full softmax (``full_log_probs``), as the public code does (``num_sampled = 0`` at eval).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn


def log_uniform_log_probs(num_classes: int, dtype: torch.dtype = torch.float64) -> Tensor:
    """log P(k) of the log-uniform distribution over ``0 .. num_classes-1`` (closed form)."""
    if num_classes < 1:
        raise ValueError(f"num_classes must be >= 1, got {num_classes}")
    k = torch.arange(num_classes, dtype=torch.float64)
    # log((k + 2) / (k + 1)) = log1p(1 / (k + 1)): no cancellation for large k
    return (torch.log1p(1.0 / (k + 1.0)) / math.log(num_classes + 1.0)).log().to(dtype)


@dataclass
class Candidates:
    """One draw of the sampler: ``ids`` (num_sampled,), their expected counts' logs, and the
    number of draws it took (``num_tries``)."""

    ids: Tensor
    log_q: Tensor
    num_tries: int


class LogUniformSampler:
    """``tf.nn.log_uniform_candidate_sampler`` (``unique`` as TF's default) over ``num_classes``."""

    def __init__(self, num_classes: int, num_sampled: int, unique: bool = True):
        if num_sampled < 1:
            raise ValueError(f"num_sampled must be >= 1, got {num_sampled}")
        if unique and num_sampled > num_classes:
            raise ValueError(f"cannot draw {num_sampled} distinct ids from {num_classes} classes")
        self.num_classes, self.num_sampled, self.unique = num_classes, num_sampled, unique
        self.log_range = math.log(num_classes + 1.0)
        self._log_p = log_uniform_log_probs(num_classes)  # float64, on the CPU

    def probability(self, ids: Tensor) -> Tensor:
        """P(k) per id (float64)."""
        return self._log_p[ids.cpu()].exp()

    def draw(self, n: int, generator: torch.Generator | None = None) -> Tensor:
        """``n`` independent draws (with replacement), inverse-CDF as TF's LogUniformSampler."""
        u = torch.rand(n, dtype=torch.float64, generator=generator)
        ids = (torch.exp(u * self.log_range)).floor().long() - 1
        return ids.clamp_(0, self.num_classes - 1)  # u < 1 keeps ids < V; clamp guards rounding

    def expected_log_count(self, ids: Tensor, num_tries: int) -> Tensor:
        """log of TF's expected count of each id after ``num_tries`` draws (float64)."""
        log_p = self._log_p[ids.cpu()]
        if not self.unique or num_tries == self.num_sampled:
            return log_p + math.log(self.num_sampled)
        # 1 - (1 - p) ** tries, computed without cancellation
        return torch.log(-torch.expm1(num_tries * torch.log1p(-log_p.exp())))

    def sample(self, generator: torch.Generator | None = None) -> Candidates:
        """One candidate set: ``num_sampled`` ids (distinct with ``unique``), in draw order."""
        S = self.num_sampled
        if not self.unique:
            ids = self.draw(S, generator)
            return Candidates(ids, self.expected_log_count(ids, S), S)
        chosen: list[Tensor] = []
        have, tries = 0, 0
        seen = torch.zeros(self.num_classes, dtype=torch.bool)
        while have < S:
            chunk = self.draw(max(2 * (S - have), 64), generator)
            new, pos = _first_new(chunk, seen)
            if have + new.numel() >= S:
                take = S - have
                chosen.append(new[:take])
                tries += int(pos[take - 1]) + 1  # draws up to the one giving the last id
                have = S
            else:
                chosen.append(new)
                seen[new] = True
                have += new.numel()
                tries += chunk.numel()
        ids = torch.cat(chosen)
        return Candidates(ids, self.expected_log_count(ids, tries), tries)


def _first_new(chunk: Tensor, seen: Tensor) -> tuple[Tensor, Tensor]:
    """The ids of ``chunk`` not in ``seen``, each at its first occurrence, in draw order, and
    those occurrences' positions in ``chunk``."""
    uniq, inverse = torch.unique(chunk, return_inverse=True)
    first = torch.full((uniq.numel(),), chunk.numel(), dtype=torch.long)
    first.scatter_reduce_(0, inverse, torch.arange(chunk.numel()), reduce="amin")
    keep = ~seen[uniq]
    uniq, first = uniq[keep], first[keep]
    order = first.argsort()
    return uniq[order], first[order]


def sampled_softmax_nll(hidden: Tensor, targets: Tensor, weight: Tensor, bias: Tensor,
                        cand: Candidates, remove_accidental_hits: bool = True,
                        subtract_log_q: bool = True, target_log_q: Tensor | None = None,
                        sparse: bool = False) -> Tensor:
    """Per-position sampled-softmax loss (N,), as ``tf.nn.sampled_softmax_loss``.

    ``hidden`` (N, D), ``targets`` (N,) ids, ``weight`` (V, D), ``bias`` (V,), ``cand`` from
    :meth:`LogUniformSampler.sample`; ``target_log_q`` (N,): log expected counts of the targets
    (TF computes them with the same formula as the candidates'; pass
    ``sampler.expected_log_count(targets, cand.num_tries)``).  ``sparse``: the gradient of
    ``weight`` is a sparse tensor holding only the rows used (as TF's IndexedSlices).
    """
    ids = cand.ids.to(hidden.device)
    rows = nn.functional.embedding(torch.cat([targets, ids]), weight, sparse=sparse)
    true_w, sampled_w = rows[:targets.numel()], rows[targets.numel():]
    true_logits = (hidden * true_w).sum(-1) + bias[targets]                    # (N,)
    sampled_logits = hidden @ sampled_w.t() + bias[ids]                        # (N, S)
    if subtract_log_q:
        if target_log_q is None:
            raise ValueError("subtract_log_q needs target_log_q")
        true_logits = true_logits - target_log_q.to(hidden.device, hidden.dtype)
        sampled_logits = sampled_logits - cand.log_q.to(hidden.device, hidden.dtype)
    if remove_accidental_hits:
        hits = targets.unsqueeze(1) == ids.unsqueeze(0)
        sampled_logits = sampled_logits.masked_fill(hits, float("-inf"))
    logits = torch.cat([true_logits.unsqueeze(1), sampled_logits], dim=1)
    return torch.logsumexp(logits, dim=1) - true_logits


def full_log_probs(hidden: Tensor, targets: Tensor, weight: Tensor, bias: Tensor,
                   chunk: int = 256) -> Tensor:
    """log p(target) under the full softmax over all V words, ``chunk`` positions at a time
    (a chunk's logits are chunk x V floats)."""
    out = []
    for lo in range(0, hidden.shape[0], chunk):
        h = hidden[lo:lo + chunk]
        logits = torch.addmm(bias, h, weight.t())
        t = targets[lo:lo + chunk]
        out.append(logits.gather(1, t.unsqueeze(1)).squeeze(1) - torch.logsumexp(logits, dim=1))
    return torch.cat(out) if out else hidden.new_zeros(0)
