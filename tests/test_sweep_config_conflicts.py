"""Sweeps compare configs: a run folder is "finished" for a sweep only if the run in it was
trained with the config the sweep would train; one trained with another config is a conflict,
reported with the keys that differ before anything runs.  ``sweep --set`` values are checked
exactly as ``train`` checks them."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from lstmablate.run import sweep as S
from lstmablate.errors import ConfigError, RunDirError
from lstmablate.run.runs import RunFiles

from cli_in_process import run_cli

QUIET = Console(file=io.StringIO())


@pytest.fixture
def two_runs(tmp_path, tiny_recipe):
    """A finished sweep of one cell and two seeds."""
    recipe = tmp_path / "two.yaml"
    recipe.write_text(tiny_recipe.read_text().replace("cells: [lstm, lstm-srnn]", "cells: [lstm]"))
    S.run_sweep(S.plan_sweep(str(recipe), tmp_path / "runs", overrides=["train.max_steps=2"],
                             threads=1), console=QUIET)
    return recipe


def snapshot(root):
    return {str(p): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != RunFiles.LOCK}


def test_the_same_settings_find_every_run_finished(tmp_path, two_runs):
    plan = S.plan_sweep(str(two_runs), tmp_path / "runs", overrides=["train.max_steps=2"])
    assert [it.finished for it in plan] == [True, True] and not any(it.conflict for it in plan)
    out = io.StringIO()
    S.run_sweep(plan, console=Console(file=out, width=200))
    assert "2 runs, 2 finished, 0 to run" in out.getvalue()


def test_other_settings_over_finished_runs_are_a_conflict_naming_the_keys(tmp_path, two_runs):
    before = snapshot(tmp_path / "runs")
    args = ["sweep", str(two_runs), "--out", "runs", "--set", "train.max_steps=2",
            "--set", "train.lr=0.5", "--threads", "1"]
    for extra in ([], ["--list"]):
        r = run_cli(*args, *extra, cwd=tmp_path)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        text = " ".join(r.stderr.split())
        assert "2 of the sweep's 2 run folders already hold a run trained with a different " \
               "config" in text, text
        assert "train.lr (0.02 -> 0.5)" in text and "seed-1" in text and "seed-2" in text
        assert "Nothing was run" in text and "finished" not in r.stdout
    assert snapshot(tmp_path / "runs") == before
    # what the message suggests works: another --out for these settings
    r = run_cli(*args, "--out", "other", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert RunFiles(tmp_path / "other" / "tiny" / "lstm" / "seed-2").result.exists()


def test_an_unfinished_run_with_another_config_is_a_conflict_too(tmp_path, two_runs):
    run = tmp_path / "runs" / "tiny" / "lstm" / "seed-2"
    RunFiles(run).result.unlink()
    with pytest.raises(RunDirError, match=r"2 of the sweep's 2 run folders.*seed-2 \(train.max_steps "
                                          r"\(2 -> 3\)\)"):
        S.plan_sweep(str(two_runs), tmp_path / "runs", overrides=["train.max_steps=3"])
    RunFiles(run).config.write_text("task: [dyck\n")
    with pytest.raises(RunDirError, match=r"seed-2 \(config.yaml is damaged\)"):
        S.plan_sweep(str(two_runs), tmp_path / "runs", overrides=["train.max_steps=2"])


def test_runs_are_matched_by_their_resolved_config_however_the_recipe_is_written(tmp_path, two_runs):
    """A recipe rewritten as a base, a named overlay and a leaf that resolve to the same configs
    finds every run finished (a `cell_overrides` entry the leaf does not name is kept: merged
    key by key); an overlay that changes a value is a conflict naming the key."""
    flat = two_runs.read_text()
    (tmp_path / "parent.yaml").write_text(
        flat.replace("hidden_size: 8", "hidden_size: 16").replace("lr: 0.02", "lr: 0.5")
        + "cell_overrides: {lstm: {model: {hidden_size: 8}}}\n")
    (tmp_path / "overlays").mkdir()
    (tmp_path / "overlays" / "quick.yaml").write_text("train: {lr: 0.02}\n")
    leaf = tmp_path / "leaf.yaml"
    leaf.write_text("base: parent\noverlay: quick\nexperiment: tiny\n"
                    "cell_overrides: {lstm-srnn: {train: {lr: 0.1}}}\n")
    plan = S.plan_sweep(str(leaf), tmp_path / "runs", overrides=["train.max_steps=2"])
    assert [it.finished for it in plan] == [True, True] and not any(it.conflict for it in plan)
    (tmp_path / "overlays" / "quick.yaml").write_text("train: {lr: 0.03}\n")
    with pytest.raises(RunDirError, match=r"2 of the sweep's 2 run folders.*"
                                          r"train.lr \(0.02 -> 0.03\)"):
        S.plan_sweep(str(leaf), tmp_path / "runs", overrides=["train.max_steps=2"])


@pytest.mark.parametrize("item, message", [
    ("train.lr=-5", "train.lr must be > 0"),
    ("train.betas=[0.9", "train.betas: expected a list written in YAML"),
    ("model.hidden_size=100000", "model.hidden_size must be <= 32,768"),
    ("data.batch_size=1e9", "data.batch_size must be <= 8,192"),
])
def test_sweep_set_values_are_checked_as_train_checks_them(tmp_path, tiny_recipe, item, message):
    with pytest.raises(ConfigError, match=message):
        S.plan_sweep(str(tiny_recipe), tmp_path / "runs", overrides=[item])
    r = run_cli("sweep", str(tiny_recipe), "--out", "runs", "--set", item, cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr and message in " ".join(r.stderr.split())
    assert not (tmp_path / "runs").exists()
