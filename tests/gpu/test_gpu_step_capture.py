"""``train.step_capture`` on a GPU (skipped without CUDA; ``make gpu-check`` runs it): the
whole training step recorded in a CUDA graph and replayed (``graphs``), and the compiled step
(``compile``, inductor's Triton backend), through the trainer, against the eager step.

The CPU side (the cache's logic, the graphs flow with a stand-in recorder, ``compile`` on
inductor's CPU backend for every task, exact resume): ``tests/test_step_capture.py``.
"""

from __future__ import annotations

import os
import warnings

import pytest
import torch

from lstmablate.recipes import resolve_config
from lstmablate.run.runner import build_model, make_task, seed_everything
from lstmablate.run.runs import RunFiles
from lstmablate.task import get_task
from lstmablate.train.trainer import Trainer

DEVICE = torch.device(os.environ.get("LSTMABLATE_GPU_DEVICE", "cuda"))
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _train(tmp_path, tiny_recipe, mode, *sets):
    cfg = resolve_config(get_task("dyck"), "lstm", recipe=str(tiny_recipe), overrides=[
        f"train.step_capture={mode}", "train.max_steps=12", "train.max_epochs=1",
        "train.eval_test=false", "model.num_layers=2", *sets])
    seed_everything(cfg.seed)
    task = make_task(cfg, tmp_path, tmp_path / mode)
    task.use_artefacts(task.build_artefacts())
    task.setup(["train", task.dev_split])
    model = build_model(task, cfg)
    t = Trainer(cfg.train, task, model, RunFiles(tmp_path / mode), seed=cfg.seed, device=DEVICE,
                identity=cfg.checkpoint_key(), progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a fallback would be a warning
        t.fit()
    return t, [p.detach().float().cpu() for p in model.parameters()]


@pytest.mark.parametrize("mode", ["graphs", "compile"])
def test_a_captured_or_compiled_run_equals_the_eager_run(tmp_path, tiny_recipe, mode):
    """No dropout: the same steps, so the same parameters to float32 rounding (cuDNN's and
    cuBLAS's kernels are the same; inductor's fused elementwise work rounds differently)."""
    eager, want = _train(tmp_path, tiny_recipe, "off", "model.dropout=0.0")
    t, got = _train(tmp_path, tiny_recipe, mode, "model.dropout=0.0")
    rec = t.capture.record()
    assert rec["captures"] >= 1 and rec["replays"] >= 1 and rec["fallback"] is None, rec
    for a, b in zip(got, want):
        scale = float(b.abs().max()) or 1.0
        assert float((a - b).abs().max()) <= 1e-4 * scale


def test_dropout_in_a_captured_step_is_drawn_afresh_at_every_replay(tmp_path, tiny_recipe):
    """With dropout the replays draw from PyTorch's graph-safe CUDA generator: a run trains
    (finite, falling loss) and its steps' losses are not one replay repeated."""
    t, params = _train(tmp_path, tiny_recipe, "graphs", "model.dropout=0.3")
    assert t.capture.record()["replays"] >= 1
    assert all(torch.isfinite(p).all() for p in params)
    rows = RunFiles(tmp_path / "graphs").metrics.read_text().splitlines()
    assert rows
