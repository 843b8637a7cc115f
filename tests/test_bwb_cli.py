"""The bwb task through the real CLI and trainer (train, eval, torchrun with 2 CPU processes) on
the small corpus of tests/fixtures/bwb.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lstmablate.run.runs import RunFiles

FIXTURE = Path(__file__).parent / "fixtures" / "bwb"
CLI = [sys.executable, "-m", "lstmablate"]


def args(out: str) -> list[str]:
    sets = ["data.vocab_size=0", "data.batch_size=8", "data.num_steps=6", "model.emb_size=16",
            "model.hidden_size=32", "model.proj_size=12", "model.num_sampled=10",
            "model.dropout=0.0", "train.optimizer=adagrad", "train.lr=0.2",
            "train.max_steps=6", "train.eval_every=3", "train.clip_norm=0",
            "eval.batch_size=4", "eval.num_steps=5"]
    return ["train", "--task", "bwb", "--cell", "lstm", "--threads", "1", "--data-dir",
            str(FIXTURE), "--out", out, *[a for s in sets for a in ("--set", s)]]


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_train_and_eval_through_the_cli(tmp_path):
    r = subprocess.run([*CLI, *args("runs")], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    run = tmp_path / "runs" / "bwb" / "lstm" / "seed-1"
    result = json.loads(RunFiles(run).result.read_text())
    assert result["test"]["ppl"] > 1 and result["test"]["tokens"] == 40 + sum(
        len(line.split()) for line in (FIXTURE / "bwb" / "heldout-monolingual.tokenized.shuffled"
                                       / "news.en.heldout-00000-of-00050").read_text().splitlines())
    e = subprocess.run([*CLI, "eval", str(run), "--split", "test",
                        "--data-dir", str(FIXTURE), "--json"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert e.returncode == 0, e.stderr[-3000:]
    assert json.loads(e.stdout)["ppl"] == pytest.approx(result["test"]["ppl"], rel=1e-9)


@pytest.mark.slow
def test_torchrun_two_processes_match_one(tmp_path):
    """Data-parallel training through the trainer: each process trains on half of every global
    batch; the logged losses equal one process's (no dropout; every process draws the same
    candidate set, since the trainer seeds them alike)."""
    one = subprocess.run([*CLI, *args("one")], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr[-3000:]
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc-per-node", "2", "-m", "lstmablate", *args("two")], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    if two.returncode != 0 and "gloo" in two.stderr.lower() and "not available" in two.stderr.lower():
        pytest.skip("this PyTorch build has no gloo backend")
    assert two.returncode == 0, two.stderr[-3000:]
    a = rows(RunFiles(tmp_path / "one" / "bwb" / "lstm" / "seed-1").metrics)
    b = rows(RunFiles(tmp_path / "two" / "bwb" / "lstm" / "seed-1").metrics)
    assert len(a) == len(b) >= 2
    for ra, rb in zip(a, b):
        assert ra["step"] == rb["step"]
        assert rb["train_loss"] == pytest.approx(ra["train_loss"], rel=1e-4)
        assert rb["ppl"] == pytest.approx(ra["ppl"], rel=1e-4)


def test_table1_plans_the_billion_word_runs_only_where_the_data_is(tmp_path):
    """`sweep table1 --list` adds the draft's Billion Word row when the data directory holds
    every file of the benchmark (stand-ins here: 99 training shards, 2 held-out shards, the
    vocabulary), and not otherwise; the report always shows the row."""
    from lstmablate.results.experiments import experiments_from_recipe
    from lstmablate.run.sweep import plan_sweep
    from lstmablate_tasks.bwb.task import BWB_DATASET

    def bwb_runs(data_dir):
        plan = plan_sweep("table1", tmp_path / "runs", data_dir=str(data_dir))
        assert {i.experiment for i in plan} >= {"ptb-medium", "ptb-large"}
        return sorted(i.cell for i in plan if i.task == "bwb")

    full, partial = tmp_path / "full", tmp_path / "partial"
    for f in BWB_DATASET.files:
        for base in (full, partial):
            if base is partial and f.relpath.endswith("00099-of-00100"):
                continue
            (base / f.relpath).parent.mkdir(parents=True, exist_ok=True)
            (base / f.relpath).write_text("<S> 1\n")
    assert bwb_runs(full) == sorted(["lstm", "lstm-srnn", "lstm-srnn-out", "lstm-gates"])
    assert bwb_runs(partial) == [] and bwb_runs(tmp_path / "none") == []
    _, groups, _ = experiments_from_recipe("table1")
    assert [label for label, _ in groups] == ["medium", "large", "BWB (draft)"]
