"""``sweep --reuse DIR``: a run another experiment trained with the same settings (a rate grid's
point, say) stands in for the sweep's own run — copied, never re-trained — and every report
names it.  The premise is checked here too: the copy is what training the run again gives."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from lstmablate.errors import UserError
from lstmablate.run.record import Run
from lstmablate.run.runs import RunFiles
from lstmablate.run.sweep import plan_sweep, reuse_twins
from lstmablate.run.twins import TwinRecord, find_twin

from cli_in_process import expect_error, run_cli
from conftest import TINY_DYCK

# a rate grid over the LSTM and the GRU, and the main table that trains each at its chosen rate
GRID = TINY_DYCK.replace("experiment: tiny", "experiment: tgrid") + """\
cells: [lstm, gru]
seeds: [1]
grid:
  train.lr: [0.01, 0.02]
"""
MAIN = TINY_DYCK.replace("experiment: tiny", "experiment: tmain") + """\
cells: [lstm, gru]
seeds: [1, 2]
cell_overrides:
  gru: {train: {lr: 0.01}}
"""


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """The grid's four runs, trained (a few seconds)."""
    root = tmp_path_factory.mktemp("twins")
    (root / "tgrid.yaml").write_text(GRID)
    (root / "tmain.yaml").write_text(MAIN)
    r = run_cli("sweep", "tgrid.yaml", "--out", "grid", "--threads", "1", cwd=root)
    assert r.returncode == 0, r.stderr
    return root


def _fresh(trained: Path, tmp_path: Path) -> Path:
    for name in ("tgrid.yaml", "tmain.yaml"):
        shutil.copy(trained / name, tmp_path / name)
    shutil.copytree(trained / "grid", tmp_path / "grid")
    return tmp_path


def test_the_twins_are_copied_and_the_rest_trained(trained, tmp_path):
    root = _fresh(trained, tmp_path)
    r = run_cli("sweep", "tmain.yaml", "--out", "runs", "--reuse", "grid", "--threads", "1",
                cwd=root)
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stderr.split())
    # seed 1 of each cell at its rate is a grid point; seed 2 is not, and is trained
    assert "(its twin: the same settings, trained as tgrid-lr0.02/lstm/seed-1)" in text
    assert "(its twin: the same settings, trained as tgrid-lr0.01/gru/seed-1)" in text
    assert "sweep: 4 runs, 2 finished, 2 to run" in text
    for cell, lr in (("lstm", "0.02"), ("gru", "0.01")):
        copy, grid = RunFiles(root / "runs" / "tmain" / cell / "seed-1"), \
            RunFiles(root / "grid" / f"tgrid-lr{lr}" / cell / "seed-1")
        # the records and checkpoints as they are; the config filed under the main experiment
        for name in (RunFiles.RESULT, RunFiles.METRICS, RunFiles.ENV, RunFiles.BEST, RunFiles.LAST):
            assert (copy.root / name).read_bytes() == (grid.root / name).read_bytes(), name
        assert sorted(p.name for p in copy.artefacts.iterdir()) == \
            sorted(p.name for p in grid.artefacts.iterdir())
        assert [p.name for p in copy.score_files()] == [p.name for p in grid.score_files()]
        run, twin = Run.open(copy.root), Run.open(grid.root)
        assert run.experiment == "tmain" and run.recipe == "tmain"
        assert run.identity == twin.identity and run.status == "finished"
        assert TwinRecord.read(copy) == TwinRecord("tgrid-lr" + lr, cell, 1, "tgrid",
                                                   TwinRecord.read(copy).copied)
        assert TwinRecord.read(grid) is None  # a run trained in its folder
        assert not (root / "runs" / "tmain" / cell / "seed-2" / RunFiles.TWIN).exists()
    # the copy is a run like any: its checkpoint evaluates to its result's test numbers
    r = run_cli("eval", "runs/tmain/lstm/seed-1", "--split", "test", "--checkpoint", "best",
                "--threads", "1", cwd=root)
    assert r.returncode == 0, r.stderr
    # every report says which runs are copies, and of what
    r = run_cli("report", "runs/tmain", cwd=root)
    assert r.returncode == 0, r.stderr
    report = " ".join(r.stdout.split())
    assert ("2 runs copied from a twin trained for another experiment" in report
            and "`lstm` seed 1 (trained as tgrid-lr0.02/lstm/seed-1)" in report
            and "`gru` seed 1 (trained as tgrid-lr0.01/gru/seed-1)" in report), report
    # a sweep run again has nothing left to do
    r = run_cli("sweep", "tmain.yaml", "--out", "runs", "--reuse", "grid", "--list", cwd=root)
    assert r.returncode == 0 and r.stdout == "" and "is finished" in r.stderr
    # trained again in its folder (--force), the run is no copy any more
    r = run_cli("train", "--task", "dyck", "--cell", "gru", "--recipe", "tmain.yaml", "--seed",
                "1", "--out", "runs", "--threads", "1", "--force", cwd=root)
    assert r.returncode == 0, r.stderr
    assert not (root / "runs" / "tmain" / "gru" / "seed-1" / RunFiles.TWIN).exists()
    report = " ".join(run_cli("report", "runs/tmain", cwd=root).stdout.split())
    assert "1 run copied from a twin" in report and "`gru` seed 1 (trained as" not in report


def test_a_twin_is_what_training_the_run_again_gives(trained, tmp_path):
    """The premise of --reuse: on one machine, training the main run gives its twin's numbers."""
    root = _fresh(trained, tmp_path)
    r = run_cli("train", "--task", "dyck", "--cell", "lstm", "--recipe", "tmain.yaml",
                "--seed", "1", "--out", "again", "--threads", "1", cwd=root)
    assert r.returncode == 0, r.stderr
    again = Run.open(root / "again" / "tmain" / "lstm" / "seed-1")
    grid = Run.open(root / "grid" / "tgrid-lr0.02" / "lstm" / "seed-1")
    assert again.identity == grid.identity
    assert again.result.test == grid.result.test and again.result.dev == grid.result.dev
    assert [m.get("dev") for m in again.metrics()] == [m.get("dev") for m in grid.metrics()]


def test_only_a_run_with_the_same_settings_is_a_twin(trained, tmp_path):
    root = _fresh(trained, tmp_path)
    plan = {(it.cell, it.seed): it for it in plan_sweep(str(root / "tmain.yaml"), root / "runs")}
    lstm = plan["lstm", 1]
    assert find_twin(lstm.config, RunFiles(lstm.run_dir), [root / "grid"]).root == \
        root / "grid" / "tgrid-lr0.02" / "lstm" / "seed-1"
    # another seed, another rate, another form, other eval options: no twin
    assert find_twin(plan["lstm", 2].config, RunFiles(plan["lstm", 2].run_dir), [root / "grid"]) is None
    for key, value in (("train", {"lr": 0.03}), ("model", {"cell_options": {"x": 1}}),
                       ("eval", {"chunk": 7})):
        for lr in ("0.01", "0.02"):
            path = root / "grid" / f"tgrid-lr{lr}" / "lstm" / "seed-1" / RunFiles.CONFIG
            cfg = yaml.safe_load(path.read_text())
            cfg[key] = {**(cfg[key] or {}), **value}
            path.write_text(yaml.safe_dump(cfg))
        assert find_twin(lstm.config, RunFiles(lstm.run_dir), [root / "grid"]) is None, key
        shutil.rmtree(root / "grid")
        shutil.copytree(trained / "grid", root / "grid")
    # an unfinished run is no twin
    (root / "grid" / "tgrid-lr0.02" / "lstm" / "seed-1" / RunFiles.RESULT).unlink()
    assert find_twin(lstm.config, RunFiles(lstm.run_dir), [root / "grid"]) is None
    # nor is a run folder that already holds something reused over
    started = [it for it in plan.values() if it.cell == "gru" and it.seed == 1][0]
    Path(started.run_dir).mkdir(parents=True)
    (Path(started.run_dir) / RunFiles.CONFIG).write_text(yaml.safe_dump(started.config.to_dict()))
    again = {(it.cell, it.seed): it for it in plan_sweep(str(root / "tmain.yaml"), root / "runs")}
    kept = reuse_twins(list(again.values()), [root / "grid"])
    assert all(not it.twin_of for it in kept)
    assert not (Path(started.run_dir) / RunFiles.RESULT).exists()


def test_a_copy_of_a_copy_names_the_run_that_was_trained(trained, tmp_path):
    root = _fresh(trained, tmp_path)
    assert run_cli("sweep", "tmain.yaml", "--out", "runs", "--reuse", "grid", "--list",
                   cwd=root).returncode == 0
    # the main runs' copies, reused into a third experiment of the same settings
    third = MAIN.replace("experiment: tmain", "experiment: tthird")
    (root / "tthird.yaml").write_text(third)
    shutil.rmtree(root / "grid")
    r = run_cli("sweep", "tthird.yaml", "--out", "runs", "--reuse", "runs", "--list", cwd=root)
    assert r.returncode == 0, r.stderr
    assert "trained as tgrid-lr0.02/lstm/seed-1" in " ".join(r.stderr.split())
    assert TwinRecord.read(RunFiles(root / "runs" / "tthird" / "lstm" / "seed-1")).run == \
        "tgrid-lr0.02/lstm/seed-1"
    # copied on again, from another runs tree, a copy still names the run trained
    r = run_cli("sweep", "tthird.yaml", "--out", "elsewhere", "--reuse", "runs", "--list",
                cwd=root)
    assert r.returncode == 0 and "trained as tgrid-lr0.02/lstm/seed-1" in " ".join(r.stderr.split())
    assert TwinRecord.read(RunFiles(root / "elsewhere" / "tthird" / "lstm" / "seed-1")).run == \
        "tgrid-lr0.02/lstm/seed-1"
    # a run copied from another runs tree into its own experiment is the run itself: no twin.json
    r = run_cli("sweep", "tgrid.yaml", "--out", "elsewhere", "--reuse", trained / "grid",
                "--list", cwd=root)
    assert r.returncode == 0 and r.stderr.count("(the same run)") == 4, r.stderr
    assert r.stdout == ""
    assert TwinRecord.read(RunFiles(root / "elsewhere" / "tgrid-lr0.02" / "lstm" / "seed-1")) is None


def test_a_damaged_twin_record_is_named_and_the_run_still_counts(trained, tmp_path):
    root = _fresh(trained, tmp_path)
    assert run_cli("sweep", "tmain.yaml", "--out", "runs", "--reuse", "grid", "--list",
                   cwd=root).returncode == 0
    twin = root / "runs" / "tmain" / "lstm" / "seed-1" / RunFiles.TWIN
    for text in ('{"of": {"experiment": "x", "cell": "lstm", "seed": -1, "recipe": null}, '
                 '"copied": "t"}', "[1, 2]", "not json"):
        twin.write_text(text)
        with pytest.raises(UserError, match="twin.json"):
            TwinRecord.read(RunFiles(twin.parent))
        r = run_cli("report", "runs/tmain", cwd=root)
        assert r.returncode == 0, r.stderr
        report = " ".join(r.stdout.split())
        assert f"runs/tmain/lstm/seed-1/{RunFiles.TWIN}" in report, report
        assert "1 run copied from a twin" in report  # gru's
        assert "lstm | " in report.replace("`", "")


def test_refusals(trained, tmp_path):
    root = _fresh(trained, tmp_path)
    expect_error(run_cli("sweep", "tmain.yaml", "--out", "runs", "--reuse", "nowhere", cwd=root),
                 "--reuse nowhere: not a folder of runs", "Nothing was copied")
    expect_error(run_cli("sweep", "tmain.yaml", "--out", "runs", "--reuse", "", cwd=root),
                 "--reuse '': not a folder of runs")
    expect_error(run_cli("sweep", "tmain.yaml", "--out", "runs", "--reuse", "grid", "--status",
                         cwd=root), "--reuse copies runs, and --status writes nothing")
    assert not (root / "runs").exists()
    # a link inside the run to be copied is refused, never followed
    src = root / "grid" / "tgrid-lr0.02" / "lstm" / "seed-1"
    (src / RunFiles.LAST).unlink()
    (src / RunFiles.LAST).symlink_to(root / "tmain.yaml")
    expect_error(run_cli("sweep", "tmain.yaml", "--out", "runs", "--reuse", "grid", "--list",
                         cwd=root), RunFiles.LAST, "symbolic link")
    assert not (root / "runs" / "tmain" / "lstm" / "seed-1" / RunFiles.RESULT).exists()
    assert json.loads((src / RunFiles.RESULT).read_text())  # the source untouched
