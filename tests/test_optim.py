"""lstmablate's Adam (train/optim.py) against torch.optim.Adam and hand computations of Dozat &
Manning's details: epsilon inside the square root, lazy row-wise embedding updates, the
global norm of the update steps clipped; and the trainer's nonfinite=zero policy."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from lstmablate.config import TrainConfig
from lstmablate.errors import ConfigError
from lstmablate.train.checkpoint import load_checkpoint
from lstmablate.train.optim import Adam, build_optimizer

from test_trainer import make_trainer, read_metrics


def test_with_every_switch_off_it_is_torch_adam():
    """m_t = b_t m + (1 - b_t) g with b_t = b (1 - b^(t-1)) / (1 - b^t) is the bias-corrected
    moment, so the steps equal torch.optim.Adam's (float64, weight decay included)."""
    torch.manual_seed(0)
    a = [nn.Parameter(torch.randn(4, 3, dtype=torch.float64)),
         nn.Parameter(torch.randn(5, dtype=torch.float64))]
    b = [nn.Parameter(p.detach().clone()) for p in a]
    ours = Adam(a, lr=0.01, betas=(0.9, 0.95), eps=1e-6, weight_decay=0.1)
    ref = torch.optim.Adam(b, lr=0.01, betas=(0.9, 0.95), eps=1e-6, weight_decay=0.1)
    for _ in range(6):
        grads = [torch.randn_like(p) for p in a]
        for p, q, g in zip(a, b, grads):
            p.grad, q.grad = g.clone(), g.clone()
        ours.step()
        ref.step()
    for p, q in zip(a, b):
        torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-14)


def test_eps_inside_the_square_root():
    w = nn.Parameter(torch.tensor([1.0, -2.0], dtype=torch.float64))
    opt = Adam([w], lr=0.1, betas=(0.9, 0.9), eps=0.25, eps_in_sqrt=True)
    g1, g2 = torch.tensor([0.5, -1.5], dtype=torch.float64), torch.tensor([-1.0, 2.0], dtype=torch.float64)
    w.grad = g1.clone()
    opt.step()
    # t = 1: m = g, v = g^2, s = lr g / sqrt(g^2 + eps)
    x1 = torch.tensor([1.0, -2.0], dtype=torch.float64) - 0.1 * g1 / (g1 ** 2 + 0.25).sqrt()
    torch.testing.assert_close(w.detach(), x1, rtol=1e-14, atol=0)
    w.grad = g2.clone()
    opt.step()
    # t = 2: b_2 = 0.9 (1 - 0.9) / (1 - 0.81) = 0.9 / 1.9
    b = 0.9 / 1.9
    m = b * g1 + (1 - b) * g2
    v = b * g1 ** 2 + (1 - b) * g2 ** 2
    torch.testing.assert_close(w.detach(), x1 - 0.1 * m / (v + 0.25).sqrt(), rtol=1e-14, atol=0)


def test_lazy_embedding_rows_keep_their_own_moments_and_step_counts():
    """Rows a batch does not use stay put, and so do their m, v and step count: row 0 used in
    steps 1 and 3 gets the bias correction of its own 2nd update at step 3."""
    emb = nn.Embedding(3, 2).double()
    w0 = emb.weight.detach().clone()
    opt = Adam([emb.weight], lr=0.1, betas=(0.5, 0.5), eps=1e-12, lazy=[emb.weight])
    g_row0_a = torch.tensor([1.0, -2.0], dtype=torch.float64)
    g_row0_b = torch.tensor([3.0, 1.0], dtype=torch.float64)
    g_row1 = torch.tensor([0.5, 0.5], dtype=torch.float64)
    for rows in ({0: g_row0_a}, {1: g_row1}, {0: g_row0_b}):
        grad = torch.zeros(3, 2, dtype=torch.float64)
        for r, g in rows.items():
            grad[r] = g
        emb.weight.grad = grad
        opt.step()
    state = opt.state[emb.weight]
    assert state["t"].flatten().tolist() == [2.0, 1.0, 0.0]
    # row 0: t=1 -> m = g_a, v = g_a^2; t=2 -> b_2 = 0.5 * 0.5 / 0.75 = 1/3
    s1 = 0.1 * g_row0_a / (g_row0_a.abs() + 1e-12)
    b = 1 / 3
    m = b * g_row0_a + (1 - b) * g_row0_b
    v = b * g_row0_a ** 2 + (1 - b) * g_row0_b ** 2
    s2 = 0.1 * m / (v.sqrt() + 1e-12)
    torch.testing.assert_close(emb.weight[0].detach(), w0[0] - s1 - s2, rtol=1e-12, atol=1e-14)
    # row 1: one update with t = 1; row 2: never used, never moved
    torch.testing.assert_close(emb.weight[1].detach(), w0[1] - 0.1 * g_row1 / (g_row1.abs() + 1e-12),
                               rtol=1e-12, atol=1e-14)
    assert torch.equal(emb.weight[2].detach(), w0[2])
    # dense Adam would have moved row 2 by momentum and used a global t
    dense = nn.Parameter(w0.clone())
    ref = Adam([dense], lr=0.1, betas=(0.5, 0.5), eps=1e-12)
    for rows in ({0: g_row0_a}, {1: g_row1}, {0: g_row0_b}):
        dense.grad = torch.zeros(3, 2, dtype=torch.float64)
        for r, g in rows.items():
            dense.grad[r] = g
        ref.step()
    assert not torch.allclose(dense[0], emb.weight[0])


def test_the_global_norm_of_the_update_steps_is_clipped():
    """tf.clip_by_global_norm on the steps s_t: each scaled by clip / max(norm, clip)."""
    a = nn.Parameter(torch.zeros(2, dtype=torch.float64))
    b = nn.Parameter(torch.zeros(1, dtype=torch.float64))
    opt = Adam([a, b], lr=1.0, betas=(0.9, 0.9), eps=0.0, clip_update=0.5)
    a.grad = torch.tensor([3.0, -4.0], dtype=torch.float64)
    b.grad = torch.tensor([2.0], dtype=torch.float64)
    opt.step()
    # t = 1, eps 0: s = lr g / |g| = sign(g) -> (1, -1, 1), global norm sqrt(3) > 0.5
    scale = 0.5 / math.sqrt(3)
    torch.testing.assert_close(a.detach(), torch.tensor([-scale, scale], dtype=torch.float64))
    torch.testing.assert_close(b.detach(), torch.tensor([-scale], dtype=torch.float64))
    # a step already inside the bound is not changed
    c = nn.Parameter(torch.zeros(1, dtype=torch.float64))
    opt = Adam([c], lr=0.1, betas=(0.9, 0.9), eps=0.0, clip_update=0.5)
    c.grad = torch.tensor([-7.0], dtype=torch.float64)
    opt.step()
    torch.testing.assert_close(c.detach(), torch.tensor([0.1], dtype=torch.float64))


def test_build_optimizer_picks_the_implementation_and_checks_the_switches():
    model = nn.Sequential(nn.Embedding(5, 3), nn.Linear(3, 2))
    assert type(build_optimizer(TrainConfig(optimizer="adam"), model)) is torch.optim.Adam
    opt = build_optimizer(TrainConfig(optimizer="adam", clip_norm=5.0, clip_on="update",
                                      eps_in_sqrt=True, lazy_embeddings=True), model)
    assert isinstance(opt, Adam) and opt.clip_update == 5.0 and opt.eps_in_sqrt
    assert opt.is_lazy(model[0].weight) and not opt.is_lazy(model[1].weight)
    for bad, match in ((dict(optimizer="adamax", eps_in_sqrt=True), "eps_in_sqrt is an option of the adam"),
                       (dict(optimizer="sgd", clip_on="update"), "clip_on=update is an option of the adam"),
                       (dict(optimizer="adam", clip_on="norm"), "clip_on"),
                       (dict(optimizer="adam", clip_on="update", clip_scope="enc"), "clip_scope")):
        with pytest.raises(ConfigError, match=match):
            TrainConfig(**bad).validate()


def test_update_clipping_through_the_trainer(tmp_path):
    """clip_on=update: the trainer leaves the gradients alone and the first Adam step (each
    entry lr * sign(g) with eps ~ 0) is scaled to the global norm clip_norm."""
    cfg = TrainConfig(optimizer="adam", lr=1.0, eps=1e-30, clip_norm=1e-3, clip_on="update",
                      max_epochs=1, max_steps=1, eval_test=False)
    tr = make_trainer(tmp_path, cfg)
    before = [p.detach().clone() for p in tr.model.parameters()]
    tr.fit()
    delta = torch.sqrt(sum(((p.detach() - b) ** 2).sum() for p, b in zip(tr.model.parameters(), before)))
    assert delta.item() == pytest.approx(1e-3, rel=1e-4)


def test_nonfinite_zero_zeroes_the_entries_and_takes_the_step(tmp_path):
    """nonfinite=zero (Dozat & Manning): gradient entries that are NaN or inf become 0 and the
    step is taken; a NaN loss gives an all-zero gradient. Training goes on; such batches are
    counted."""
    cfg = TrainConfig(optimizer="adam", lr=0.01, max_epochs=2, nonfinite="zero")
    tr = make_trainer(tmp_path, cfg, name="zero")
    real_loss = tr.task.loss
    calls = {"n": 0}
    seen = {}

    def poisoned(model, batch, carry):
        calls["n"] += 1
        out = real_loss(model, batch, carry)
        if calls["n"] == 4:  # the output bias's gradient only: inf and NaN
            def poison(g):
                seen["grad"] = g
                return g * torch.tensor([float("inf")]) * float("nan")
            handle = model.out.bias.register_hook(poison)
            seen["handle"] = handle
            seen["before"] = [p.detach().clone() for p in model.parameters()]
        if calls["n"] == 5:
            seen["handle"].remove()
            seen["after"] = [p.detach().clone() for p in model.parameters()]
        if calls["n"] == 9:
            out.loss = out.loss * float("nan")
        return out

    tr.task.loss = poisoned
    res = tr.fit()
    assert res.skipped_nonfinite == 2 and res.steps == 12  # no batch skipped
    moved = [not torch.equal(b, a) for b, a in zip(seen["before"], seen["after"])]
    assert all(moved)  # the step was taken for every parameter (the bias by momentum)
    assert all(torch.isfinite(p).all() for p in tr.model.parameters())
    assert all(math.isfinite(r["mse"]) for r in read_metrics(tr.metrics_path))


def test_the_optimiser_state_round_trips_with_lazy_rows():
    """Per-row step counts are optimiser state: saved and loaded, the next steps are equal."""
    torch.manual_seed(1)
    embs = [nn.Embedding(6, 3) for _ in range(2)]
    embs[1].load_state_dict(embs[0].state_dict())
    opts = [Adam([e.weight], lr=0.1, betas=(0.9, 0.9), eps=1e-12, eps_in_sqrt=True,
                 lazy=[e.weight], clip_update=0.3) for e in embs]
    grads = [torch.zeros(6, 3) for _ in range(4)]
    for k, g in enumerate(grads):
        g[k % 3] = torch.randn(3)
        g[5 - k % 2] = torch.randn(3)
    for g in grads[:2]:
        embs[0].weight.grad = g.clone()
        opts[0].step()
    saved = copy.deepcopy(opts[0].state_dict())  # as if written to disk
    embs[1].load_state_dict(embs[0].state_dict())
    opts[1].load_state_dict(saved)
    for g in grads[2:]:
        for e, o in zip(embs, opts):
            e.weight.grad = g.clone()
            o.step()
    assert torch.equal(embs[0].weight, embs[1].weight)
    assert opts[1].state[embs[1].weight]["t"].flatten().tolist() == [2, 1, 1, 0, 2, 2]


def test_resume_is_exact_with_update_clipped_adam(tmp_path):
    cfg = TrainConfig(optimizer="adam", lr=0.01, max_epochs=2, eval_every=5, clip_norm=0.05,
                      clip_on="update", eps_in_sqrt=True)
    full = make_trainer(tmp_path, cfg, name="full")
    assert isinstance(full.optimizer, Adam)
    full.fit()
    part = make_trainer(tmp_path, cfg, name="part")
    real_step = part._train_step

    def interrupt_at_5(batch):
        out = real_step(batch)
        if part.pos.step == 5:
            part._stop_signal = "SIGINT"
        return out

    part._train_step = interrupt_at_5
    part.fit()
    assert load_checkpoint(part.last_path)["position"]["step"] == 5
    resumed = make_trainer(tmp_path, cfg, name="part")
    resumed.fit(resume=True)
    assert resumed.metrics_path.read_bytes() == full.metrics_path.read_bytes()
