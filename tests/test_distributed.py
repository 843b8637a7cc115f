"""torchrun with 2 CPU processes (gloo) gives the same losses as one process at the
same global batch; only rank 0 writes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from lstmablate.run.runs import RunFiles

ARGS = ["train", "--task", "dyck", "--cell", "lstm", "--threads", "1",
        "--set", "data.train_tokens=0", "--set", "data.train_sequences=128", "--set", "data.m=3",
        "--set", "data.dev_sequences=32", "--set", "data.test_sequences=16", "--set", "data.batch_size=15",
        "--set", "train.max_steps=6", "--set", "train.eval_every=2", "--set", "model.num_layers=2"]


def rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_two_process_ddp_matches_one_process(tmp_path):
    single = subprocess.run([sys.executable, "-m", "lstmablate", *ARGS, "--out", "one"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=300)
    assert single.returncode == 0, single.stderr
    ddp = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc-per-node", "2", "-m", "lstmablate", *ARGS, "--out", "two"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    if ddp.returncode != 0 and "gloo" in ddp.stderr.lower() and "not available" in ddp.stderr.lower():
        pytest.skip("this PyTorch build has no gloo backend")
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    a = rows(RunFiles(tmp_path / "one" / "dyck" / "lstm" / "seed-1").metrics)
    b = rows(RunFiles(tmp_path / "two" / "dyck" / "lstm" / "seed-1").metrics)
    assert len(a) == len(b) == 3  # written once, by rank 0 only
    for ra, rb in zip(a, b):
        assert ra["step"] == rb["step"]
        # batch 15 splits 8 + 7 with unequal token counts: the per-rank loss weighting must be exact
        assert rb["train_loss"] == pytest.approx(ra["train_loss"], abs=1e-5)
        assert rb["loss"] == pytest.approx(ra["loss"], abs=1e-5)
    env = json.loads(RunFiles(tmp_path / "two" / "dyck" / "lstm" / "seed-1").env.read_text())
    assert env["world_size"] == 2
