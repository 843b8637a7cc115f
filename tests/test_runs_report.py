"""End to end on the dyck task: runs layout, eval == result.json, report grouping."""

from __future__ import annotations

import io
import json

import pytest
import yaml
from rich.console import Console

from lstmablate.errors import RunDirError
from lstmablate.report import format_duration, render_report
from lstmablate.runner import evaluate_run, train_run

QUIET = Console(file=io.StringIO())


def train(tiny_recipe, out, cell="lstm", seed=1, **kw):
    return train_run("dyck", cell, recipe=str(tiny_recipe), seed=seed, out=out, console=QUIET,
                     progress=False, **kw)


def test_run_layout_eval_and_refusals(tiny_recipe, tmp_path):
    out = tmp_path / "runs"
    outcome = train(tiny_recipe, out, overrides=["train.max_steps=6"])
    d = out / "tiny" / "lstm" / "seed-1"
    assert outcome.run_dir == d
    for name in ("config.yaml", "env.json", "metrics.jsonl", "result.json", "last.pt", "best.pt"):
        assert (d / name).exists(), name
    cfg = yaml.safe_load((d / "config.yaml").read_text())
    assert cfg["train"]["max_steps"] == 6 and cfg["cell"] == "lstm" and cfg["data"]["m"] == 3
    env = json.loads((d / "env.json").read_text())
    for key in ("torch", "python", "git", "device", "threads", "command"):
        assert key in env
    result = json.loads((d / "result.json").read_text())
    assert result["steps"] == 6 and result["shortened"] is True
    assert set(result["test"]) == {"wcpa_min", "wcpa_mean", "accuracy", "loss", "worst_distance", "worst_judged"}

    again = evaluate_run(d, split="test")
    assert again == pytest.approx(result["test"], rel=0, abs=1e-12, nan_ok=True)
    assert evaluate_run(d, split="dev")["loss"] == pytest.approx(result["dev"]["loss"], abs=1e-12)

    with pytest.raises(RunDirError, match="already holds this run"):
        train(tiny_recipe, out, overrides=["train.max_steps=6"])
    with pytest.raises(RunDirError, match="different run .*train"):
        train(tiny_recipe, out, overrides=["train.max_steps=7"])
    # --resume of a finished run only re-evaluates; --force starts again
    assert train(tiny_recipe, out, overrides=["train.max_steps=6"], resume=True).result["steps"] == 6
    assert train(tiny_recipe, out, overrides=["train.max_steps=4"], force=True).result["steps"] == 4


def test_loss_falls_on_dyck(tiny_recipe, tmp_path):
    outcome = train(tiny_recipe, tmp_path / "runs", overrides=["train.max_epochs=4"])
    rows = [json.loads(l) for l in (outcome.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["loss"] < rows[0]["loss"] - 0.1


def test_report_groups_seeds_and_shows_missing(tiny_recipe, tmp_path):
    out = tmp_path / "runs"
    for seed in (1, 2):
        train(tiny_recipe, out, seed=seed, overrides=["train.max_steps=3"])
    results = [json.loads((out / "tiny" / "lstm" / f"seed-{s}" / "result.json").read_text()) for s in (1, 2)]
    text = render_report(out)
    assert "## tiny" in text
    row = next(l for l in text.splitlines() if l.startswith("| `lstm`"))
    accs = [r["test"]["accuracy"] for r in results]
    mean = sum(accs) / 2
    assert f"{mean:.1f} ± " in row and "(n=2)" in row
    assert "| 99.0 |" in row  # the paper column from the recipe's reference
    assert "†" in row  # shortened runs are marked
    missing = next(l for l in text.splitlines() if l.startswith("| `lstm-srnn`"))
    assert "missing" in missing
    assert "`lstm-srnn`: 0 of 2 seeds finished" in text
    mean_s = sum(r["train_time_s"] for r in results) / 2
    assert f"training time per run, mean over finished seeds: `lstm` {mean_s:.0f} s" in text
    # a table name with no runs renders from the recipe, everything missing
    demo = render_report(out, table="dyck-demo")
    assert demo.count("missing") >= 5 * 4


def test_format_duration():
    assert [format_duration(x) for x in (12.4, 119, 600, 7199, 9000)] == [
        "12 s", "119 s", "10.0 min", "120.0 min", "2.5 h"]


def test_grid_recipe_expands_to_experiments_and_one_table(tmp_path, tiny_recipe):
    from lstmablate.sweep import plan_sweep

    grid = tmp_path / "grid.yaml"
    grid.write_text(tiny_recipe.read_text().replace("experiment: tiny", "experiment: g")
                    + "grid:\n  data.m: [2, 3]\ntable:\n  title: The grid\n  metrics: [accuracy]\n")
    plan = plan_sweep(str(grid), tmp_path / "runs")
    assert {(p.experiment, p.cell, p.seed) for p in plan} == {
        (f"g-m{m}", c, s) for m in (2, 3) for c in ("lstm", "lstm-srnn") for s in (1, 2)}
    assert all(f"--set data.m={p.experiment[-1]}" in p.command for p in plan)
    first = plan[0]
    train_run("dyck", first.cell, recipe=str(grid), seed=first.seed, out=tmp_path / "runs",
              experiment=first.experiment, overrides=first.overrides + ["train.max_steps=2"],
              console=QUIET, progress=False)
    text = render_report(tmp_path / "runs", table=str(grid))
    assert "## The grid" in text and "m=2: bracket-closing accuracy" in text
    assert "m=3: bracket-closing accuracy" in text and "WCPA" not in text
    row = next(l for l in text.splitlines() if l.startswith("| `lstm` "))
    assert row.count("missing") == 1  # m=2 has a run, m=3 has none


def test_a_run_saved_before_an_option_existed_still_resumes(tiny_recipe, tmp_path):
    import yaml as _yaml

    out = tmp_path / "runs"
    train(tiny_recipe, out, overrides=["train.max_steps=2"])
    cfg_path = out / "tiny" / "lstm" / "seed-1" / "config.yaml"
    old = _yaml.safe_load(cfg_path.read_text())
    del old["train"]["test_checkpoint"], old["cell_seeds"]  # as an older lstmablate wrote it
    cfg_path.write_text(_yaml.safe_dump(old))
    assert train(tiny_recipe, out, overrides=["train.max_steps=2"], resume=True).result["steps"] == 2
    with pytest.raises(RunDirError, match=r"train.max_steps \(2 -> 3\)"):
        train(tiny_recipe, out, overrides=["train.max_steps=3"], resume=True)
