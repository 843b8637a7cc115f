"""The run-level contracts of tasks: artefacts kept with the run, predictions in the official
scorer's format, evaluation options apart from a run's identity, recipe metadata apart from
the run, old run folders migrating."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from rich.console import Console

from tolerance import rel_tol
from lstmablate.errors import ConfigError, RunDirError
from lstmablate.run.runner import evaluate_run, train_run
from lstmablate.run.runs import RunFiles
from lstmablate_tasks.dyck.metrics import read_predictions as read_dyck_predictions
from lstmablate_tasks.ptb.evaluate import read_predictions as read_ptb_predictions

FIXTURES = Path(__file__).parent / "fixtures"
QUIET = Console(file=open("/dev/null", "w"))  # noqa: SIM115

TINY_PTB = """\
task: ptb
experiment: tiny-ptb
data: {batch_size: 2, num_steps: 3, verify: false}
model: {hidden_size: 8, num_layers: 2}
train: {max_epochs: 2}
cells: [lstm]
seeds: [1]
reference: {lstm: {ppl: 80.0}}
"""


def train_dyck(recipe: Path, out: Path, **kw):
    return train_run("dyck", "lstm", recipe=str(recipe), out=out, console=QUIET, progress=False, **kw)


@pytest.fixture
def ptb_run(tmp_path):
    """A 2-epoch run on the PTB fixture, its data in a directory of its own."""
    data = tmp_path / "data"
    shutil.copytree(FIXTURES / "ptb", data / "ptb")
    recipe = tmp_path / "tiny-ptb.yaml"
    recipe.write_text(TINY_PTB)
    outcome = train_run("ptb", "lstm", recipe=str(recipe), out=tmp_path / "runs",
                        data_dir=str(data), console=QUIET, progress=False)
    return outcome, data


def test_vocabulary_is_kept_with_the_run_and_eval_reads_no_training_data(ptb_run):
    outcome, data = ptb_run
    vocab = json.loads((RunFiles(outcome.run_dir).artefacts / "vocab.json").read_text())
    assert len(vocab) == 17 and vocab[0] == "<eos>"
    (data / "ptb" / "ptb.train.txt").unlink()  # evaluation must not need it
    (data / "ptb" / "ptb.valid.txt").unlink()
    again = evaluate_run(outcome.run_dir, split="test", data_dir=str(data),
                         checkpoint=outcome.result.test_checkpoint)
    assert again == pytest.approx(outcome.result.test, rel=1e-12)


def test_ptb_predictions_file_gives_the_run_metrics(ptb_run, tmp_path):
    outcome, data = ptb_run
    path = tmp_path / "test-logprobs.tsv"
    metrics = evaluate_run(outcome.run_dir, split="test", data_dir=str(data),
                           checkpoint=outcome.result.test_checkpoint, write_predictions=path)
    assert metrics == pytest.approx(outcome.result.test, rel=1e-9)
    assert read_ptb_predictions(path) == pytest.approx(metrics, rel=1e-12)
    rows = path.read_text().splitlines()[2:]
    assert len(rows) == metrics["tokens"] and all(float(r.split("\t")[2]) <= 0 for r in rows)


def test_dyck_predictions_file_parses_and_matches_evaluate(tiny_recipe, tmp_path):
    outcome = train_dyck(tiny_recipe, tmp_path / "runs", overrides=["train.max_steps=8"])
    path = tmp_path / "preds.jsonl"
    metrics = evaluate_run(outcome.run_dir, split="test", write_predictions=path)
    lines = path.read_text().splitlines()
    header = json.loads(lines[0])
    assert header["task"] == "dyck" and header["split"] == "test"
    records = [json.loads(line) for line in lines[1:]]
    assert len(records) == 16  # every test string, in file order
    assert [r["index"] for r in records] == list(range(16))
    judged = [j for r in records for j in r["judgements"]]
    assert judged and all(j[2].endswith(")") and 0 <= j[3] <= 1 for j in judged)
    assert all(j[4] == (j[3] > 0.8) for j in judged)  # Hewitt's criterion
    expected = evaluate_run(outcome.run_dir, split="test")
    for key in ("wcpa_min", "wcpa_mean", "accuracy", "worst_distance", "worst_judged"):
        assert metrics[key] == pytest.approx(expected[key], rel=1e-12), key
    assert metrics.keys() == expected.keys()  # the loss too, though the file cannot hold it
    assert metrics["loss"] == expected["loss"]  # the same evaluation, the same batches
    assert read_dyck_predictions(path) == pytest.approx(
        {k: metrics[k] for k in read_dyck_predictions(path)})


def test_eval_batch_size_changes_no_metric_and_is_not_identity(tiny_recipe, tmp_path):
    out = tmp_path / "runs"
    outcome = train_dyck(tiny_recipe, out, overrides=["train.max_steps=6"])
    base = evaluate_run(outcome.run_dir, split="dev")
    for bs in ("1", "5"):
        other = evaluate_run(outcome.run_dir, split="dev", eval_overrides=[f"eval.batch_size={bs}"])
        # float32 sums in another grouping: the loss to rounding, the judgements exactly
        assert other["loss"] == pytest.approx(base["loss"], rel=rel_tol(torch.float32))
        assert {k: v for k, v in other.items() if k != "loss"} == {
            k: v for k, v in base.items() if k != "loss"}
        assert {k: other[k] for k in ("wcpa_min", "wcpa_mean", "accuracy")} == \
            {k: base[k] for k in ("wcpa_min", "wcpa_mean", "accuracy")}
    with pytest.raises(ConfigError, match="evaluation options only"):
        evaluate_run(outcome.run_dir, split="dev", eval_overrides=["train.lr=3"])
    # an evaluation option may differ on --resume: it is not part of the run's identity
    again = train_dyck(tiny_recipe, out, overrides=["train.max_steps=6", "eval.batch_size=3"],
                       resume=True)
    assert again.result is not None
    saved = yaml.safe_load(RunFiles(outcome.run_dir).config.read_text())
    assert saved["eval"]["batch_size"] == 3
    with pytest.raises(RunDirError, match="train.max_steps"):
        train_dyck(tiny_recipe, out, overrides=["train.max_steps=7"], resume=True)


def test_resume_after_the_recipe_reference_numbers_changed(tiny_recipe, tmp_path):
    out = tmp_path / "runs"
    first = train_dyck(tiny_recipe, out, overrides=["train.max_steps=4"])
    saved = yaml.safe_load(RunFiles(first.run_dir).config.read_text())
    assert "reference" not in saved and "cells" not in saved and "seeds" not in saved
    assert saved["recipe"] == "tiny" and saved["recipe_file"] == str(tiny_recipe.resolve())
    text = tiny_recipe.read_text()
    tiny_recipe.write_text(text.replace("accuracy: 99.0", "accuracy: 97.5")
                           .replace("seeds: [1, 2]", "seeds: [1, 2, 3]")
                           .replace('"made up for the test"', '"corrected"'))
    resumed = train_dyck(tiny_recipe, out, overrides=["train.max_steps=4"], resume=True)
    assert resumed.result.steps == 4


def test_resume_keeps_the_environment_of_every_earlier_segment(tiny_recipe, tmp_path):
    """env.json of a resumed run: the new segment's environment on top, the earlier ones
    (oldest first) under "earlier", so a commit or machine change mid-run stays visible; an
    unreadable earlier env.json is noted, never a reason to refuse the resume."""
    out = tmp_path / "runs"
    first = train_dyck(tiny_recipe, out, overrides=["train.max_steps=4"])
    env_path = RunFiles(first.run_dir).env
    env = json.loads(env_path.read_text())
    assert "earlier" not in env
    env["git"] = {"commit": "1" * 40, "dirty": False}  # as if trained at another commit
    env_path.write_text(json.dumps(env))
    train_dyck(tiny_recipe, out, overrides=["train.max_steps=4"], resume=True)
    second = json.loads(env_path.read_text())
    assert [e["git"]["commit"] for e in second["earlier"]] == ["1" * 40]
    assert "earlier" not in second["earlier"][0]
    assert second["command"] and "started" in second
    train_dyck(tiny_recipe, out, overrides=["train.max_steps=4"], resume=True)
    third = json.loads(env_path.read_text())
    assert [e["git"]["commit"] for e in third["earlier"]] == \
        ["1" * 40, second["git"]["commit"]]
    env_path.write_text("{not json")
    train_dyck(tiny_recipe, out, overrides=["train.max_steps=4"], resume=True)
    fourth = json.loads(env_path.read_text())
    assert len(fourth["earlier"]) == 1 and "could not be read" in fourth["earlier"][0]["unreadable"]
    # a fresh start (--force) begins a new history
    train_dyck(tiny_recipe, out, overrides=["train.max_steps=4"], force=True)
    assert "earlier" not in json.loads(env_path.read_text())


def test_an_old_run_folder_migrates(tiny_recipe, tmp_path):
    """A run saved before eval options had their own section, with recipe metadata in its
    config and no artefacts folder, still resumes and evaluates."""
    out = tmp_path / "runs"
    first = train_dyck(tiny_recipe, out, overrides=["train.max_steps=4", "eval.batch_size=5"])
    d = first.run_dir
    cfg = yaml.safe_load(RunFiles(d).config.read_text())
    cfg["data"]["eval_batch_size"] = cfg["eval"].pop("batch_size")
    cfg["data"]["min_bucket_count"] = cfg["eval"].pop("min_bucket_count")
    del cfg["eval"], cfg["recipe_file"]
    cfg.update(cells=["lstm", "lstm-srnn"], seeds=[1, 2], cell_seeds={},
               reference={"lstm": {"accuracy": 99.0}}, reference_source="old")
    RunFiles(d).config.write_text(yaml.safe_dump(cfg))
    shutil.rmtree(RunFiles(d).artefacts)
    RunFiles(d).result.unlink()  # interrupted at the end
    assert evaluate_run(d, split="test") == pytest.approx(first.result.test, rel=1e-12)
    resumed = train_dyck(tiny_recipe, out, overrides=["train.max_steps=4", "eval.batch_size=5"],
                         resume=True)
    assert resumed.result.test == pytest.approx(first.result.test, rel=1e-12)
    assert RunFiles(d).artefacts.is_dir()  # written on the resume
