"""End to end on the dyck task: runs layout, eval == result.json, report grouping."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from lstmablate.errors import RunDirError
from lstmablate.results.notes import format_duration
from lstmablate.results.formats import render_report
from lstmablate.run.runner import evaluate_run, train_run
from lstmablate.run.runs import RunFiles

QUIET = Console(file=io.StringIO())


def train(tiny_recipe, out, cell="lstm", seed=1, **kw):
    return train_run("dyck", cell, recipe=str(tiny_recipe), seed=seed, out=out, console=QUIET,
                     progress=False, **kw)


def test_run_layout_eval_and_refusals(tiny_recipe, tmp_path):
    out = tmp_path / "runs"
    outcome = train(tiny_recipe, out, overrides=["train.max_steps=6"])
    d = out / "tiny" / "lstm" / "seed-1"
    assert outcome.run_dir == d
    for name in (RunFiles.CONFIG, RunFiles.ENV, RunFiles.METRICS, RunFiles.RESULT, RunFiles.LAST,
                 RunFiles.BEST):
        assert (d / name).exists(), name
    cfg = yaml.safe_load(RunFiles(d).config.read_text())
    assert cfg["train"]["max_steps"] == 6 and cfg["cell"] == "lstm" and cfg["data"]["m"] == 3
    env = json.loads(RunFiles(d).env.read_text())
    for key in ("torch", "python", "git", "device", "threads", "command"):
        assert key in env
    result = json.loads(RunFiles(d).result.read_text())
    assert result["steps"] == 6 and result["shortened"] is True
    assert set(result["test"]) == {"wcpa_min", "wcpa_mean", "accuracy", "loss", "worst_distance",
                                   "worst_judged"}

    again = evaluate_run(d, split="test")
    assert again == pytest.approx(result["test"], rel=0, abs=1e-12, nan_ok=True)
    assert evaluate_run(d, split="dev")["loss"] == pytest.approx(result["best"]["dev"]["loss"], abs=1e-12)

    with pytest.raises(RunDirError, match="already holds this run"):
        train(tiny_recipe, out, overrides=["train.max_steps=6"])
    with pytest.raises(RunDirError, match="different run .*train"):
        train(tiny_recipe, out, overrides=["train.max_steps=7"])
    # --resume of a finished run only re-evaluates; --force starts again
    assert train(tiny_recipe, out, overrides=["train.max_steps=6"], resume=True).result.steps == 6
    assert train(tiny_recipe, out, overrides=["train.max_steps=4"], force=True).result.steps == 4


def test_loss_falls_on_dyck(tiny_recipe, tmp_path):
    outcome = train(tiny_recipe, tmp_path / "runs", overrides=["train.max_epochs=4"])
    rows = [json.loads(l) for l in RunFiles(outcome.run_dir).metrics.read_text().splitlines()]
    assert rows[-1]["loss"] < rows[0]["loss"] - 0.1


def test_report_groups_seeds_and_shows_missing(tiny_recipe, tmp_path):
    out = tmp_path / "runs"
    for seed in (1, 2):
        train(tiny_recipe, out, seed=seed, overrides=["train.max_steps=3"])
    results = [json.loads(RunFiles.of(out, "tiny", "lstm", s).result.read_text()) for s in (1, 2)]
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
    from lstmablate.run.sweep import plan_sweep

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
    cfg_path = RunFiles(out / "tiny" / "lstm" / "seed-1").config
    old = _yaml.safe_load(cfg_path.read_text())
    del old["train"]["test_checkpoint"]  # as an older lstmablate wrote it, with recipe metadata
    old.update(cells=["lstm"], seeds=[1], cell_seeds={"lstm": [1]}, reference={"lstm": {"accuracy": 1.0}})
    cfg_path.write_text(_yaml.safe_dump(old))
    assert train(tiny_recipe, out, overrides=["train.max_steps=2"], resume=True).result.steps == 2
    with pytest.raises(RunDirError, match=r"train.max_steps \(2 -> 3\)"):
        train(tiny_recipe, out, overrides=["train.max_steps=3"], resume=True)


# -- the paper's numbers, cells and seeds come from the recipe (issue 12 item 4) -----------------
def _row(text, cell):
    return next(l for l in text.splitlines() if l.startswith(f"| `{cell}`"))


def test_the_report_reads_the_recipe_at_report_time(tiny_recipe, tmp_path):
    out = tmp_path / "runs"
    train(tiny_recipe, out, overrides=["train.max_steps=2"])
    cfg = yaml.safe_load(RunFiles(out / "tiny" / "lstm" / "seed-1").config.read_text())
    assert not {"cells", "seeds", "cell_seeds", "reference", "reference_source"} & set(cfg)
    assert cfg["recipe"] == "tiny" and cfg["recipe_file"] == str(tiny_recipe.resolve())
    assert "| 99.0 |" in _row(render_report(out), "lstm")
    tiny_recipe.write_text(tiny_recipe.read_text()
                           .replace("lstm: {accuracy: 99.0}", "lstm: {accuracy: 42.5}")
                           .replace("made up for the test", "edited since")
                           .replace("cells: [lstm, lstm-srnn]", "cells: [lstm, lstm-srnn, lstm-gates]"))
    text = render_report(out)
    assert "| 42.5 |" in _row(text, "lstm") and "99.0" not in text
    assert "Paper numbers: edited since." in text
    assert "missing" in _row(text, "lstm-gates")  # the recipe's cells, as they are now
    assert "`lstm-gates`: 0 of 2 seeds finished" in text


def test_a_recipe_that_is_gone_is_a_note(tiny_recipe, tmp_path, monkeypatch):
    out = tmp_path / "runs"
    train(tiny_recipe, out, overrides=["train.max_steps=2"])
    result = json.loads(RunFiles(out / "tiny" / "lstm" / "seed-1").result.read_text())
    tiny_recipe.unlink()
    text = render_report(out)
    assert f"recipe 'tiny' (trained from {tiny_recipe.resolve()}) can no longer be" in " ".join(text.split())
    assert "the paper's numbers are not shown" in text and "paper" not in text.splitlines()[4]
    assert f"{result['test']['accuracy']:.1f} (n=1)" in _row(text, "lstm")  # ours still shown
    # the recipe of that name, where the file is gone (e.g. the checkout moved)
    moved = tmp_path / "recipes"
    moved.mkdir()
    from conftest import TINY_DYCK

    (moved / "tiny.yaml").write_text(TINY_DYCK.replace("accuracy: 99.0", "accuracy: 61.0"))
    monkeypatch.setenv("LSTMABLATE_RECIPES", str(moved))
    assert "| 61.0 |" in _row(render_report(out), "lstm")
    monkeypatch.delenv("LSTMABLATE_RECIPES")
    # an old run folder kept the recipe's metadata in config.yaml: used when the recipe is gone
    cfg_path = RunFiles(out / "tiny" / "lstm" / "seed-1").config
    old = yaml.safe_load(cfg_path.read_text())
    old.update(cells=["lstm", "lstm-srnn"], seeds=[1, 2], reference={"lstm": {"accuracy": 77.0}})
    cfg_path.write_text(yaml.safe_dump(old))
    text = render_report(out)
    assert "| 77.0 |" in _row(text, "lstm") and "those saved with the run" in " ".join(text.split())
    assert "`lstm-srnn`: 0 of 2 seeds finished" in text


# -- damaged run folders are named and skipped (issue 18 items 4 and 8) ---------------------------
@pytest.fixture(scope="module")
def two_seeds(tmp_path_factory):
    from conftest import TINY_DYCK

    root = tmp_path_factory.mktemp("two")
    (root / "tiny.yaml").write_text(TINY_DYCK)
    for seed in (1, 2):
        train(root / "tiny.yaml", root / "runs", seed=seed, overrides=["train.max_steps=2"])
    return root / "runs"


@pytest.mark.parametrize("content, why", [
    (b"\x80\x81\x00\xff binary", "is not UTF-8 text"),
    (b"[1, 2]", "holds a JSON list, not the object"),
    (b"{}", "is an empty object {}: it holds no metrics"),
    (b'{"test": {"accuracy": 1.0,\n  oops}\n', "line 2: malformed JSON"),
    (b'{"steps": 3}', "has no `test` entry"),
    (b'{"test": {"accuracy": "high"}}', "`test` must be null or an object mapping metric names "
     "to numbers"),
])
def test_a_damaged_result_is_named_and_skipped(two_seeds, tmp_path, content, why):
    import shutil

    out = tmp_path / "runs"
    shutil.copytree(two_seeds, out)
    bad = RunFiles(out / "tiny" / "lstm" / "seed-2").result
    bad.write_bytes(content)
    good = json.loads(RunFiles(out / "tiny" / "lstm" / "seed-1").result.read_text())
    text = render_report(out)
    row = _row(text, "lstm")
    assert f"{good['test']['accuracy']:.1f} (n=1)" in row and "n/a" not in row
    assert "## Skipped run folders" in text and f"- {bad}" in text and why in text
    assert "`lstm`: 1 of 2 seeds finished, 1 damaged (skipped)" in text


def test_a_metric_no_finished_run_reports_gets_no_column(two_seeds, tmp_path):
    """A task metric used only for selection (absent from every run's test numbers, as NMT's
    teacher-forced perplexity) gets no column of n/a; absent from one run only, it stays."""
    import shutil

    out = tmp_path / "runs"
    shutil.copytree(two_seeds, out)
    header = "cross-entropy (nats/token)"
    assert header in render_report(out)
    paths = [RunFiles(out / "tiny" / "lstm" / f"seed-{s}").result for s in (1, 2)]
    first = json.loads(paths[0].read_text())
    first["test"].pop("loss")
    paths[0].write_text(json.dumps(first))
    text = render_report(out)
    assert header in text and "n=1" in _row(text, "lstm").split("|")[-2]
    second = json.loads(paths[1].read_text())
    second["test"].pop("loss")
    paths[1].write_text(json.dumps(second))
    text = render_report(out)
    assert header not in text and "n/a" not in text
    assert f"{(first['test']['accuracy'] + second['test']['accuracy']) / 2:.1f} ± " in _row(text, "lstm")


def test_two_finished_runs_of_one_seed_are_named(two_seeds, tmp_path):
    """Copies (or re-runs) of one seed under the folder are not independent seeds: said."""
    import shutil

    out = tmp_path / "runs"
    shutil.copytree(two_seeds, out)
    assert "finished runs" not in render_report(out)
    copy = tmp_path / "runs" / "records" / "tiny" / "lstm" / "seed-1"
    shutil.copytree(out / "tiny" / "lstm" / "seed-1", copy)
    text = render_report(out)
    assert "(n=3)" in _row(text, "lstm")
    assert (f"`lstm`: seed 1 has 2 finished runs ({copy}, {out / 'tiny' / 'lstm' / 'seed-1'}), "
            "each counted as a run in n, the mean and the tests") in text


def test_a_damaged_config_is_named_and_the_cli_warns(two_seeds, tmp_path, capsys):
    import shutil

    from lstmablate.cli import main

    out = tmp_path / "runs"
    shutil.copytree(two_seeds, out)
    RunFiles(out / "tiny" / "lstm" / "seed-2").config.write_text("task: [dyck\n")
    RunFiles(out / "tiny" / "lstm" / "seed-1").result.write_text("{}")
    with pytest.raises(SystemExit) as e:
        main(["report", str(out)])
    captured = capsys.readouterr()
    err = " ".join(captured.err.split())
    assert e.value.code == 0, err
    damaged = RunFiles(out / "tiny" / "lstm" / "seed-2").config
    assert f"YAML syntax error in {damaged}, line 2" in captured.out
    assert "warning: skipped" in err and "is an empty object {}" in err
    assert "missing" in _row(captured.out, "lstm")  # no usable run of lstm is left


#: the run folder's file names, which only RunNames (lstmablate/runfolder.py) spells
RUN_FILE_NAMES = (RunFiles.CONFIG, RunFiles.ENV, RunFiles.METRICS, RunFiles.RESULT, RunFiles.LAST,
                  RunFiles.BEST, RunFiles.MANIFEST, RunFiles.LOCK)


def _spelling(py: Path) -> list[str]:
    """The run-file names ``py`` spells as a string of their own (a quoted ``config.yaml``)."""
    import re

    text = py.read_text(encoding="utf-8")
    return [name for name in RUN_FILE_NAMES if re.search(rf"[\"']{re.escape(name)}[\"']", text)]


def test_the_run_folder_spells_its_names_once_and_result_json_reads_back(tiny_recipe, tmp_path):
    """A run folder's file names are spelled once, in RunNames (lstmablate/runfolder.py, on
    the bottom floor: the output guard of every command needs them), which RunFiles is built
    on (the modules that read or write them ask it); result.json round-trips through
    RunResult, and one written by an older version (a duplicate `dev`, fewer keys) still
    reads."""
    import lstmablate
    from lstmablate.run.runs import RunResult

    root = Path(lstmablate.__file__).parent
    for py in root.rglob("*.py"):
        if py.name == "runfolder.py" and py.parent == root:
            continue
        assert not _spelling(py), f"{py} spells {_spelling(py)}"
    out = train(tiny_recipe, tmp_path / "runs", overrides=["train.max_steps=3"])
    files = RunFiles.of(tmp_path / "runs", "tiny", "lstm", 1)
    saved = json.loads(files.result.read_text())
    assert "dev" not in saved and saved["best"]["dev"] == out.result.dev  # stored once
    assert RunResult.from_json(saved) == out.result
    old = dict(saved, dev=saved["best"]["dev"])
    del old["world_size"], old["skipped_nonfinite"]
    again = RunResult.from_json(old)
    assert again.dev == out.result.dev and again.world_size == 1 and "dev" not in again.extra


def test_the_tests_name_run_files_through_run_files():
    """The tests spell no run-file name either: a fixture writing a fake run folder, an assert
    on a path and a message fragment ask RunFiles (``RunFiles(run).result``,
    ``RunFiles.LAST``), so that a name changes in one place.  (A name inside a longer string,
    such as a message's ``seed-1/metrics.jsonl is a symbolic link``, is the text a user reads.)"""
    here = Path(__file__).parent
    spelled = {str(py.relative_to(here)): _spelling(py) for py in sorted(here.rglob("*.py"))}
    assert not {k: v for k, v in spelled.items() if v}
