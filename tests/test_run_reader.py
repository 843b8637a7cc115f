"""A run folder read back through its one reader (``lstmablate.run.record``): ``Run.open``
gives the typed config (an older run's migrated once, by the code that types a recipe), the
result, the metrics and the scores; ``find_runs`` gives the runs and the damaged folders with
why; every command that reads runs goes through them, so a task's hooks see typed configs and
no other module parses a run's records.  (What each reader refuses, and how each command
reports it, is tests/test_damaged_records.py and tests/test_records_property.py.)
"""

from __future__ import annotations

import ast
import csv
import io
import json
from pathlib import Path

import pytest
import yaml

from cli_in_process import run_cli
from significance_runs import small_runs, small_tree, tree  # noqa: F401 - fixtures
from lstmablate.config import RunConfig, config_from_dict
from lstmablate.errors import DataError
from lstmablate.recipes import resolve_config
from lstmablate.run.record import Run, find_runs
from lstmablate.run.runs import RunFiles, RunResult
from lstmablate.task import get_task

RUN = "runs/sig/lstm/seed-1"
ROOT = Path(__file__).resolve().parents[1]


def test_a_run_opens_typed_with_its_records_read_on_demand(small_runs):
    files = RunFiles(small_runs / RUN)
    run = Run.open(files.root)
    saved = yaml.safe_load(files.config.read_text())
    assert isinstance(run.config, RunConfig)
    assert run.config == config_from_dict(get_task("sst"), saved, "x")
    assert (run.experiment, run.cell, run.seed, run.task_name) == ("sig", "lstm", 1, "sst")
    assert run.recipe == saved["recipe"] and run.recipe_file == "sig.yaml"
    assert run.identity == run.config.identity() and run.identity["seed"] == 1
    result = json.loads(files.result.read_text())
    assert run.result == RunResult.from_json(result) and run.status == "finished"
    assert run.reported("test") == result["test"]
    assert run.reported("dev") == result["best"]["dev"]  # no final dev evaluation: the best's
    assert [m["step"] for m in run.metrics()] == [10, 20]
    scores = run.scores("test")
    assert len(scores.records) == 200 and scores.metrics == result["test"]
    # each record is read once, when first asked for, and kept
    files.result.unlink()
    assert run.result == RunResult.from_json(result)
    assert Run.open(files.root).result is None and Run.open(files.root).status == "unfinished"


def test_find_runs_gives_the_runs_and_the_damaged_folders_with_why(small_runs):
    runs_dir = small_runs / "runs"
    config = RunFiles(runs_dir / "sig/lstm-srnn/seed-2").config
    config.write_text("".join("seed: abc\n" if line.startswith("seed:") else line
                              for line in config.read_text().splitlines(keepends=True)))
    result = RunFiles(runs_dir / "sig/lstm/seed-2").result
    result.write_text("[1, 2]")
    other_tool = runs_dir / "notes"  # another tool's config.yaml, nothing else of a run's
    other_tool.mkdir()
    (other_tool / RunFiles.CONFIG).write_text("colour: blue\n")
    # a folder named twice (and inside another one named) is one run
    runs, damaged = find_runs([runs_dir, runs_dir / "sig/lstm/seed-1", runs_dir / "nothing"])
    assert [r.path.relative_to(runs_dir).as_posix() for r in runs] == [
        "sig/lstm/seed-1", "sig/lstm/seed-2", "sig/lstm-srnn/seed-1"]
    assert [(p, "seed must be a run seed" in why and str(config) in why) for p, why in damaged] \
        == [(config.parent, True)]
    # a damaged result.json leaves the run a run, damaged, and says why when asked
    by_seed = {r.seed: r for r in runs if r.cell == "lstm"}
    assert [by_seed[s].status for s in (1, 2)] == ["finished", "damaged"]
    assert str(result) in by_seed[2].problem and "JSON list" in by_seed[2].problem
    with pytest.raises(DataError, match="JSON list"):
        by_seed[2].result  # noqa: B018 -- reading the property raises
    assert find_runs([runs_dir / "nothing"]) == ([], [])


@pytest.mark.parametrize("task, recipe, key, deviation", [
    ("parsing", "parsing-ewt", "model.encoder_lengths", "every word encoded"),
    ("squad-drqa", "squad-drqa", "data.tokenizer", "regular-expression tokenizer"),
])
def test_a_run_saved_before_a_key_existed_reads_as_it_behaved(tmp_path, task, recipe, key,
                                                              deviation):
    """The migration happens once, where a saved config is typed (``Task.added_keys``): the
    report marks an old run by what it did, with the task's hook reading the typed value."""
    section, name = key.split(".")
    now = resolve_config(get_task(task), "lstm", recipe=recipe).to_dict()
    old = json.loads(json.dumps(now))
    del old[section][name]
    for seed, saved in ((1, old), (2, now)):
        files = RunFiles.of(tmp_path / "runs", recipe, "lstm", seed)
        files.root.mkdir(parents=True)
        files.config.write_text(yaml.safe_dump({**saved, "seed": seed}, sort_keys=False))
    added = get_task(task).added_keys[key]
    assert getattr(getattr(Run.open(RunFiles.of(tmp_path / "runs", recipe, "lstm", 1).root).config,
                           section), name) == added != now[section][name]
    done = run_cli("report", "runs", "--format", "csv", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    rows = {int(r["seed"]): r["deviations"] for r in csv.DictReader(io.StringIO(done.stdout))}
    assert deviation in rows[1] and deviation not in rows[2]


#: who may call the readers of a run's records (besides the module that defines each)
READERS = {"from_json", "under", "read_metrics", "read_scores", "config_from_dict",
           "check_saved_identity"}
ALLOWED = {"lstmablate/run/record.py", "lstmablate/run/runs.py", "lstmablate/run/scores.py",
           "lstmablate/config.py"}


def test_only_the_run_reader_parses_a_runs_records():
    """result.json, config.yaml, metrics.jsonl and the scores files are parsed in run/ alone:
    a command reads runs through ``Run`` and ``find_runs`` (a new field is read where its
    format is declared, for every command at once)."""
    callers = set()
    for path in sorted([*ROOT.glob("lstmablate/**/*.py"), *ROOT.glob("tasks/**/*.py")]):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                f = node.func
                name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
                if name in READERS:
                    callers.add(path.relative_to(ROOT).as_posix())
    assert callers and callers <= ALLOWED, callers - ALLOWED
