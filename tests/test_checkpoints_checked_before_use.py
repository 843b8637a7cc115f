"""A checkpoint is checked whole before any of it is used, and a run that never trained says so.

``train --resume`` reads every part of ``last.pt`` -- the model, the optimiser, the schedule,
the trainer's position, the RNG states, the task's carried state, the run's identity -- and
checks each (its type, its shape against the model and the optimiser's parameter groups, its
range) before it touches the model or the run folder: a part that is missing, of another
type or shape, or has an extra key is one message naming the file and the part, with what to
do; never a traceback, never a silent restart from step 0, and nothing already written is
changed.  A checkpoint of an older version (without the position's and schedule's later
fields) still resumes.

A run in which every training step was skipped as non-finite (``train.nonfinite=skip``), or
every step had a non-finite loss (``train.nonfinite=zero``), ends with exit code 2 and a
message saying it did not train, and writes no ``result.json``.
"""

from __future__ import annotations

import math
import shutil

import pytest
import torch

from lstmablate.errors import CheckpointError
from lstmablate.run.runs import RunFiles
from lstmablate.train.checkpoint import load_checkpoint
from lstmablate.train.saving import check_resume_checkpoint

from cli_in_process import expect_error, run_cli
from conftest import TINY_DYCK

RUN = "runs/tiny/lstm/seed-1"
TRAIN = ["train", "--task", "dyck", "--recipe", "tiny.yaml", "--out", "runs", "--threads", "1",
         "--set", "train.max_steps=3", "--set", "train.eval_every=2"]


@pytest.fixture(scope="module")
def unfinished(tmp_path_factory):
    """A tiny dyck run of 3 steps whose result.json was removed: to resume, as an interrupted
    run is (trained once per module, copied by each test)."""
    root = tmp_path_factory.mktemp("unfinished")
    (root / "tiny.yaml").write_text(TINY_DYCK)
    r = run_cli(*TRAIN, cwd=root)
    assert r.returncode == 0, r.stderr
    RunFiles(root / RUN).result.unlink()
    return root


@pytest.fixture
def run(tmp_path, unfinished):
    """A copy of the unfinished run in this test's folder (the commands' working directory)."""
    shutil.copytree(unfinished, tmp_path, dirs_exist_ok=True)
    return tmp_path


def snapshot(root):
    """Every file of the run folder, with its bytes."""
    return {p.relative_to(root): p.read_bytes() for p in (root / RUN).rglob("*")
            if p.is_file() and p.name != RunFiles.LOCK}


def first_param(ckpt):
    """The name of the first tensor of a checkpoint's model."""
    return next(iter(ckpt["model"]))


#: what damaged a checkpoint, and what the message must name
DAMAGE = {
    "optimizer missing": (lambda c: c.pop("optimizer"), "`optimizer` is missing"),
    "optimizer a string": (lambda c: c.update(optimizer="abc"), "`optimizer` is 'abc'"),
    "optimizer without groups": (lambda c: c["optimizer"].update(param_groups=[]),
                                 "`optimizer.param_groups`"),
    "optimizer state of another shape": (
        lambda c: c["optimizer"]["state"][0].update(exp_avg=torch.zeros(5)),
        "`optimizer.state[0].exp_avg` is a tensor of shape [5]"),
    "optimizer state with NaN": (
        lambda c: c["optimizer"]["state"][0]["exp_avg"].fill_(math.nan), "`optimizer.state[0].exp_avg`"),
    "optimizer hyperparameter a word": (
        lambda c: c["optimizer"]["param_groups"][0].update(betas="high"),
        "`optimizer.param_groups[0].betas`"),
    "schedule missing": (lambda c: c.pop("schedule"), "`schedule` is missing"),
    "schedule a list": (lambda c: c.update(schedule=[1]), "`schedule` is [1]"),
    "schedule mistyped": (lambda c: c["schedule"].update(bad_evals="two"), "`schedule.bad_evals`"),
    "rng missing": (lambda c: c.pop("rng"), "`rng` is missing"),
    "rng garbage": (lambda c: c.update(rng={"python": 3}), "`rng` is {'python': 3}"),
    "rng torch state cut": (lambda c: c["rng"].update(torch=c["rng"]["torch"][:10]), "`rng.torch`"),
    "rng python state garbage": (lambda c: c["rng"].update(python=(3, (1, 2), None)),
                                 "`rng.python`"),
    "position missing": (lambda c: c.pop("position"), "`position` is missing"),
    "position empty": (lambda c: c.update(position={}), "`position.epoch` is missing"),
    "position extra key": (lambda c: c["position"].update(bogus=1),
                           "`position` is a mapping with the unknown key 'bogus'"),
    "position step mistyped": (lambda c: c["position"].update(step="two"),
                               "`position.step` is 'two'"),
    "position epoch negative": (lambda c: c["position"].update(epoch=-3),
                                "`position.epoch` is -3"),
    "position done a number": (lambda c: c["position"].update(done=2), "`position.done`"),
    "position lr NaN": (lambda c: c["position"].update(lr=math.nan), "`position.lr`"),
    "model missing": (lambda c: c.pop("model"), "`model` is missing"),
    "model tensor missing": (lambda c: c["model"].pop(first_param(c)), "lacks 1 of the model's"),
    "model tensor of another shape": (
        lambda c: c["model"].update({first_param(c): torch.zeros(3)}), "has shape [3]"),
    "model tensor a string": (lambda c: c["model"].update({first_param(c): "w"}), "is 'w'"),
    "model weights NaN": (lambda c: c["model"][first_param(c)].fill_(math.nan),
                          "NaN or infinite values"),
    "carry a string": (lambda c: c.update(carry="abc"), "`carry` is 'abc'"),
    "run identity missing": (lambda c: c.pop("run"), "`run` is missing"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_part_of_last_pt_is_named_before_anything_is_used(run, damage):
    change, fragment = DAMAGE[damage]
    last = RunFiles(run / RUN).last
    ckpt = load_checkpoint(last)
    change(ckpt)
    torch.save(ckpt, last)
    before = snapshot(run)
    text = expect_error(run_cli(*TRAIN, "--resume", cwd=run), f"checkpoint {RUN}/last.pt",
                        fragment)
    assert "--force" in text and "lstmablate eval" not in text  # only what continues the run
    assert snapshot(run) == before  # nothing already written was changed
    assert not RunFiles(run / RUN).result.exists()


def test_an_empty_position_never_restarts_the_run_from_step_0(run):
    """(The issue's repro: an empty position resumed as a fresh run and trained from step 0.)"""
    last = RunFiles(run / RUN).last
    ckpt = load_checkpoint(last)
    ckpt["position"] = {}
    torch.save(ckpt, last)
    r = run_cli(*TRAIN, "--resume", cwd=run)
    expect_error(r, "last.pt is damaged", "`position.epoch` is missing")
    assert "resuming at" not in r.stderr and "step 0" not in r.stderr


def test_a_damaged_best_pt_is_named_when_the_run_resumes_not_at_its_end(run):
    best = RunFiles(run / RUN).best
    ckpt = load_checkpoint(best)
    ckpt["model"][first_param(ckpt)] = torch.zeros(2)
    torch.save(ckpt, best)
    r = run_cli(*TRAIN, "--resume", cwd=run)
    expect_error(r, "best.pt does not fit the model", "has shape [2]", "--force")
    assert "resuming at" not in r.stderr


def test_a_checkpoint_of_an_older_version_without_the_later_fields_still_resumes(run):
    """The position's ``lr`` and ``best_dev`` and the schedule's ``last_value`` and
    ``worse_epoch`` were added after format 1: a checkpoint without them is not damaged."""
    last = RunFiles(run / RUN).last
    ckpt = load_checkpoint(last)
    for key in ("lr", "best_dev"):
        ckpt["position"].pop(key)
    for key in ("last_value", "worse_epoch"):
        ckpt["schedule"].pop(key)
    torch.save(ckpt, last)
    r = run_cli(*TRAIN, "--resume", cwd=run)
    assert r.returncode == 0, r.stderr
    assert RunFiles(run / RUN).result.exists()


def test_the_check_covers_every_part_the_trainer_reads(run):
    """check_resume_checkpoint accepts what the trainer saves and names the part it refuses."""
    from lstmablate.run.runner import load_run_model

    cfg, _, model = load_run_model(run / RUN, "last")
    ckpt = load_checkpoint(RunFiles(run / RUN).last)
    check_resume_checkpoint(ckpt, RunFiles(run / RUN).last, cfg.train, model)
    ckpt["optimizer"]["param_groups"][0]["params"] = [0]
    with pytest.raises(CheckpointError, match=r"last.pt is damaged: its `optimizer.param_groups\[0\]"
                                              r".params` is \[0\]"):
        check_resume_checkpoint(ckpt, RunFiles(run / RUN).last, cfg.train, model)
    ckpt = load_checkpoint(RunFiles(run / RUN).last)
    ckpt["schedule"]["plateau_factor"] = math.inf
    with pytest.raises(CheckpointError, match=r"`schedule.plateau_factor` is inf \(a float\); "
                                              "expected a finite number"):
        check_resume_checkpoint(ckpt, RunFiles(run / RUN).last, cfg.train, model)


# ------------------------------------------------------------------ a run that never trained

def nan_losses(monkeypatch, every: bool = True):
    """Make the dyck task's training loss NaN (at every step, or at the first only)."""
    from lstmablate_tasks.dyck.task import DyckTask

    real, calls = DyckTask.loss, []

    def loss(self, model, batch, carry):
        out = real(self, model, batch, carry)
        calls.append(1)
        if every or len(calls) == 1:
            out.loss = out.loss * math.nan
        return out
    monkeypatch.setattr(DyckTask, "loss", loss)


@pytest.mark.parametrize("nonfinite, fragment", [
    ("skip", "of its training batches were skipped as non-finite"),
    ("zero", "every one of its 3 optimiser steps had a non-finite loss"),
])
def test_a_run_whose_every_step_was_non_finite_writes_no_result(tmp_path, monkeypatch, nonfinite,
                                                                 fragment):
    (tmp_path / "tiny.yaml").write_text(TINY_DYCK)
    nan_losses(monkeypatch)
    r = run_cli(*TRAIN, "--set", f"train.nonfinite={nonfinite}", cwd=tmp_path)
    expect_error(r, "did not train", fragment, "no result.json was written", "--force")
    assert not RunFiles(tmp_path / RUN).result.exists()
    assert RunFiles(tmp_path / RUN).metrics.exists()  # what it wrote is kept
    assert "done runs" not in r.stderr
    # resumed, it says the same again (and still writes no result)
    r = run_cli(*TRAIN, "--set", f"train.nonfinite={nonfinite}", "--resume", cwd=tmp_path)
    expect_error(r, "did not train")
    assert not RunFiles(tmp_path / RUN).result.exists()


def test_a_run_with_some_finite_steps_still_finishes(tmp_path, monkeypatch):
    (tmp_path / "tiny.yaml").write_text(TINY_DYCK)
    nan_losses(monkeypatch, every=False)
    r = run_cli(*TRAIN, "--set", "train.nonfinite=skip", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert RunFiles(tmp_path / RUN).result.exists()
