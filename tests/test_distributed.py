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


def test_cleanup_waits_for_the_group_then_leaves_it(tmp_path):
    """One process in a gloo group: ``cleanup`` passes the barrier and destroys the group
    (after an error it leaves at once); outside torchrun it does nothing."""
    import torch.distributed as dist

    from lstmablate.train.distributed import DistInfo, cleanup

    cleanup(DistInfo())  # no group: nothing to do, nothing raised
    for finished in (True, False):
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / f'init-{finished}'}",
                                rank=0, world_size=1)
        try:
            cleanup(DistInfo(0, 1, 0))  # world 1: not a torchrun run, the group is left alone
            assert dist.is_initialized()
            cleanup(DistInfo(0, 2, 0), finished=finished)
            assert not dist.is_initialized()
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()


def test_a_run_leaves_its_process_group_however_it_ends(tmp_path, monkeypatch):
    """The runner leaves the group after training (waiting for the other ranks), and at once
    when training raised, so that no group is alive at interpreter exit."""
    import io

    from rich.console import Console

    from lstmablate.errors import UserError
    from lstmablate.run import runner
    from lstmablate.train import distributed

    calls = []
    monkeypatch.setattr(distributed, "cleanup",
                        lambda info, finished=True: calls.append((info, finished)))
    quiet = dict(console=Console(file=io.StringIO()), progress=False, threads=1)
    small = ["data.train_tokens=0", "data.train_sequences=32", "data.m=3", "data.dev_sequences=8",
             "data.test_sequences=8", "train.max_steps=2", "train.eval_every=2"]
    runner.train_run("dyck", "lstm", overrides=small, out=tmp_path / "runs", **quiet)
    assert calls == [(distributed.DistInfo(), True)]
    calls.clear()

    def fail(*args, **kwargs):
        raise UserError("a data error in the middle of setting up the run")

    monkeypatch.setattr(runner, "check_train_batches", fail)
    with pytest.raises(UserError):
        runner.train_run("dyck", "lstm", overrides=small, out=tmp_path / "runs2", **quiet)
    assert calls == [(distributed.DistInfo(), False)]
