"""The sampled softmax of the Billion Word task against its definition (tf.nn.sampled_softmax_loss
with the log-uniform sampler) and, statistically, against the full softmax."""

from __future__ import annotations

import math

import pytest
import torch

from lstmablate_tasks.bwb.sampled_softmax import (
    Candidates,
    LogUniformSampler,
    full_log_probs,
    log_uniform_log_probs,
    sampled_softmax_nll,
)


# -- the log-uniform distribution ------------------------------------------------------------

@pytest.mark.parametrize("V", [1, 7, 1000, 793_470])
def test_log_uniform_closed_form(V):
    p = log_uniform_log_probs(V).exp()
    k = torch.arange(V, dtype=torch.float64)
    closed = (torch.log(k + 2) - torch.log(k + 1)) / math.log(V + 1)  # TF's Probability(k)
    # (the difference of logs loses ~1e-10 relative precision at k ~ 8e5; ours uses log1p)
    assert torch.allclose(p, closed, rtol=1e-8, atol=0)
    assert p.sum().item() == pytest.approx(1.0, abs=1e-9)
    assert bool((p[1:] < p[:-1]).all())  # rank 0 (the most frequent word) most likely


def test_draws_follow_the_closed_form():
    V, n = 30, 300_000
    sampler = LogUniformSampler(V, 1, unique=False)
    counts = torch.bincount(sampler.draw(n, torch.Generator().manual_seed(0)), minlength=V).double()
    expected = n * log_uniform_log_probs(V).exp()
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 70.0  # chi-square, 29 degrees of freedom: P(chi2 > 70) < 1e-4


def test_unique_candidates_and_expected_counts():
    V, S = 50, 20
    sampler = LogUniformSampler(V, S, unique=True)
    cand = sampler.sample(torch.Generator().manual_seed(3))
    assert cand.ids.numel() == S == cand.ids.unique().numel()
    assert cand.num_tries >= S
    p = log_uniform_log_probs(V).exp()[cand.ids]
    assert torch.allclose(cand.log_q.exp(), 1 - (1 - p) ** cand.num_tries, rtol=1e-12)
    plain = LogUniformSampler(V, S, unique=False).sample(torch.Generator().manual_seed(3))
    q = log_uniform_log_probs(V).exp()[plain.ids]
    assert torch.allclose(plain.log_q.exp(), S * q, rtol=1e-12)  # with replacement: S * P(k)


def test_unique_sampling_counts_tries_as_tensorflow(monkeypatch):
    """TF's unique sampler draws one id at a time until S distinct ids are found and counts every
    draw; ours draws in chunks — fed the same draws, both give the same ids and num_tries."""
    V, S = 40, 12
    draws = LogUniformSampler(V, 1, unique=False).draw(5000, torch.Generator().manual_seed(8))
    picked, tries = [], 0
    for d in draws.tolist():  # the reference: RangeSampler::SampleBatchGetExpectedCountAvoid
        tries += 1
        if d not in picked:
            picked.append(d)
            if len(picked) == S:
                break
    feed = iter(draws.tolist())
    sampler = LogUniformSampler(V, S, unique=True)
    monkeypatch.setattr(sampler, "draw",
                        lambda n, generator=None: torch.tensor([next(feed) for _ in range(n)]))
    cand = sampler.sample()
    assert cand.ids.tolist() == picked and cand.num_tries == tries > S


# -- the loss ----------------------------------------------------------------------------------

def test_loss_by_hand():
    # V = 5, D = 2; two positions with targets 1 and 3; candidates (3, 0) with log Q given
    W = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [-1.0, 0.5], [0.2, 0.3]])
    b = torch.tensor([0.1, -0.2, 0.0, 0.3, 0.0])
    h = torch.tensor([[0.5, -1.0], [2.0, 1.0]])
    targets = torch.tensor([1, 3])
    cand = Candidates(torch.tensor([3, 0]), torch.tensor([-1.0, -0.5], dtype=torch.float64), 2)
    target_log_q = torch.tensor([-2.0, -1.0], dtype=torch.float64)
    nll = sampled_softmax_nll(h, targets, W, b, cand, target_log_q=target_log_q)
    # position 0: target logit h.W1 + b1 - logQ = -1 - 0.2 + 2 = 0.8; candidates
    # 3: (-0.5 - 0.5 + 0.3) + 1 = 0.3 and 0: (0.5 + 0.1) + 0.5 = 1.1
    l0 = math.log(math.exp(0.8) + math.exp(0.3) + math.exp(1.1)) - 0.8
    # position 1: target 3: (-2 + 0.5 + 0.3) + 1 = -0.2; candidate 3 is the target (an accidental
    # hit): removed; candidate 0: (2 + 0.1) + 0.5 = 2.6
    l1 = math.log(math.exp(-0.2) + math.exp(2.6)) + 0.2
    assert nll.tolist() == pytest.approx([l0, l1], rel=1e-6)
    kept = sampled_softmax_nll(h, targets, W, b, cand, remove_accidental_hits=False,
                               target_log_q=target_log_q)
    assert kept[1].item() == pytest.approx(
        math.log(2 * math.exp(-0.2) + math.exp(2.6)) + 0.2, rel=1e-6)


def test_full_log_probs_is_log_softmax_in_chunks():
    g = torch.Generator().manual_seed(0)
    W, b = torch.randn(37, 5, generator=g), torch.randn(37, generator=g)
    h, t = torch.randn(11, 5, generator=g), torch.randint(0, 37, (11,), generator=g)
    ref = torch.log_softmax(h @ W.t() + b, dim=1).gather(1, t[:, None]).squeeze(1)
    assert torch.allclose(full_log_probs(h, t, W, b, chunk=4), ref, atol=1e-6)


# -- statistics: the sampled softmax against the full softmax ----------------------------------

def _grads(s, targets, sampler, n_sets, correct=True, remove_hits=True, seed=0):
    """Per candidate set: the mean over its positions of d loss / d logits (logits = s for every
    position: W = I, b = 0, hidden = s)."""
    V = s.numel()
    eye, zero = torch.eye(V, dtype=torch.float64), torch.zeros(V, dtype=torch.float64)
    g = torch.Generator().manual_seed(seed)
    out = []
    for t in targets:
        cand = sampler.sample(g)
        h = s.expand(t.numel(), V).clone().requires_grad_(True)
        if not correct:
            cand = Candidates(cand.ids, torch.zeros_like(cand.log_q), cand.num_tries)
        tq = sampler.expected_log_count(t, cand.num_tries) if correct else \
            torch.zeros(t.numel(), dtype=torch.float64)
        nll = sampled_softmax_nll(h, t, eye, zero, cand, remove_accidental_hits=remove_hits,
                                  target_log_q=tq)
        nll.sum().backward()
        out.append(h.grad.mean(0))
    return torch.stack(out[:n_sets])


def _data(V=20, sets=1500, per_set=32, seed=1):
    g = torch.Generator().manual_seed(seed)
    p_data = torch.softmax(1.5 * torch.randn(V, generator=g, dtype=torch.float64), 0)
    targets = [torch.multinomial(p_data, per_set, replacement=True, generator=g)
               for _ in range(sets)]
    return p_data, targets


def test_stationary_where_the_full_softmax_is():
    """At logits = log of the data distribution the full softmax's expected gradient,
    E_y[softmax(s) - onehot(y)], is zero.  The sampled softmax with the logQ correction is the
    exact log-posterior of "which candidate is the target" when candidates are drawn with
    replacement (expected count S * P(k)), so its expected gradient is zero there too, accidental
    hits removed or not; without the correction it is not."""
    p_data, targets = _data()
    sets = len(targets)
    sampler = LogUniformSampler(p_data.numel(), 6, unique=False)
    for remove_hits in (True, False):
        grads = _grads(p_data.log(), targets, sampler, sets, remove_hits=remove_hits)
        z = (grads.mean(0) / (grads.std(0) / math.sqrt(sets))).abs()
        assert z.max() < 4.5  # 20 components, each within 4.5 standard errors of 0
    wrong = _grads(p_data.log(), targets, sampler, sets, correct=False)
    assert (wrong.mean(0) / (wrong.std(0) / math.sqrt(sets))).abs().max() > 10


def test_unique_candidates_nearly_stationary():
    """With distinct candidates (TF's default, used in training) the expected count is TF's
    1 - (1 - P(k)) ** num_tries, an approximation of the inclusion probability (num_tries is
    itself random): the expected gradient at the data distribution is not exactly zero (8,000
    candidate sets measure about 0.002, 9 standard errors) but a small fraction of the
    uncorrected loss's."""
    p_data, targets = _data()
    sampler = LogUniformSampler(p_data.numel(), 6, unique=True)
    bias = _grads(p_data.log(), targets, sampler, len(targets)).mean(0).abs().max().item()
    wrong = _grads(p_data.log(), targets, sampler, len(targets),
                   correct=False).mean(0).abs().max().item()
    assert wrong > 0.03 and bias < 0.2 * wrong


def test_expected_gradient_converges_to_the_full_softmax():
    """Per example, with many candidates drawn with replacement (accidental hits kept), the
    expected sampled gradient approaches the full softmax's gradient (the bias is O(1/S));
    without the logQ correction it converges to something else."""
    V = 20
    g = torch.Generator().manual_seed(2)
    s = torch.randn(V, generator=g, dtype=torch.float64)
    y = torch.tensor([3] * 8)
    full = torch.softmax(s, 0) - torch.nn.functional.one_hot(torch.tensor(3), V).double()
    errors = {}
    for S in (20, 2000):
        sampler = LogUniformSampler(V, S, unique=False)
        grads = _grads(s, [y] * 150, sampler, 150, remove_hits=False, seed=S)
        errors[S] = (grads.mean(0) - full).abs().max().item()
    assert errors[2000] < 0.01 and errors[20] > 2 * errors[2000]
    wrong = _grads(s, [y] * 150, LogUniformSampler(V, 2000, unique=False), 150, correct=False,
                   remove_hits=False)
    assert (wrong.mean(0) - full).abs().max().item() > 0.05
