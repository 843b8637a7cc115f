"""Exact resume after a real SIGINT, atomic checkpoint writes under SIGKILL, determinism."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from lstmablate.run.runs import RunFiles
from lstmablate.train.checkpoint import load_checkpoint, save_checkpoint

from cli_in_process import start_cli

TRAIN = ["--task", "dyck", "--cell", "lstm", "--threads", "1",
         "--set", "train.max_epochs=3", "--set", "train.eval_every=3",
         "--set", "data.train_sequences=192", "--set", "model.dropout=0.2",
         "--set", "model.num_layers=2"]


def cli(*args, cwd, **kw):
    """``lstmablate ARGS`` in a process of its own (a real SIGINT / SIGKILL), its output piped."""
    return start_cli(*args, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def test_sigint_then_resume_equals_uninterrupted(tmp_path, tiny_recipe):
    args = ["train", *TRAIN, "--recipe", str(tiny_recipe)]
    full = cli(*args, "--out", "full", cwd=tmp_path)
    assert full.wait(timeout=300) == 0, full.stderr.read()

    part = cli(*args, "--out", "part", cwd=tmp_path)
    metrics = RunFiles(tmp_path / "part" / "tiny" / "lstm" / "seed-1").metrics
    deadline = time.time() + 120
    while time.time() < deadline:  # wait until it is mid-training, then Ctrl-C
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 3:
            break
        time.sleep(0.05)
    part.send_signal(signal.SIGINT)
    out, err = part.communicate(timeout=120)
    assert part.returncode == 0, err
    assert "--resume" in " ".join(err.split())
    ckpt = load_checkpoint(RunFiles(metrics.parent).last)
    assert not ckpt["position"]["done"]
    assert not RunFiles(metrics.parent).result.exists()

    resumed = cli(*args, "--out", "part", "--resume", cwd=tmp_path)
    assert resumed.wait(timeout=300) == 0, resumed.stderr.read()
    full_metrics = RunFiles(tmp_path / "full" / "tiny" / "lstm" / "seed-1").metrics
    assert metrics.read_bytes() == full_metrics.read_bytes()
    a = json.loads(RunFiles(metrics.parent).result.read_text())
    b = json.loads(full_metrics.with_name(RunFiles.RESULT).read_text())
    assert a["test"] == b["test"] and a["best"] == b["best"]
    # the training times are summed over the two sessions
    assert 0 < ckpt["position"]["train_cpu_s"] <= a["train_cpu_s"]
    assert 0 < ckpt["position"]["train_time_s"] <= a["train_time_s"]


def test_a_run_begun_without_cpu_time_records_none_after_a_resume(tmp_path, tiny_recipe):
    """last.pt of a version that did not count CPU seconds (its position has no train_cpu_s):
    the resumed run cannot know the first part's, so result.json says null, not a part."""
    args = ["train", *TRAIN, "--recipe", str(tiny_recipe), "--out", "runs",
            "--set", "train.max_epochs=6"]
    part = cli(*args, cwd=tmp_path)
    files = RunFiles(tmp_path / "runs" / "tiny" / "lstm" / "seed-1")
    deadline = time.time() + 120
    while time.time() < deadline and not (files.metrics.exists() and files.metrics.read_text()):
        time.sleep(0.02)
    part.send_signal(signal.SIGINT)
    assert part.wait(timeout=120) == 0, part.stderr.read()
    ckpt = load_checkpoint(files.last)
    assert not ckpt["position"]["done"] and ckpt["position"]["train_cpu_s"] > 0
    del ckpt["position"]["train_cpu_s"]
    save_checkpoint(files.last, {k: v for k, v in ckpt.items() if k != "format"})
    resumed = cli(*args, "--resume", cwd=tmp_path)
    assert resumed.wait(timeout=300) == 0, resumed.stderr.read()
    result = json.loads(files.result.read_text())
    assert result["train_cpu_s"] is None and result["train_time_s"] > 0


def test_a_paused_run_records_the_pause_in_wall_time_not_in_cpu_time(tmp_path, tiny_recipe):
    """SIGSTOP for PAUSE seconds mid-training (a busy or shared machine's scheduler, a user's
    Ctrl-Z): train_time_s takes it in, train_cpu_s does not."""
    pause = 2.0
    run = cli("train", *TRAIN, "--recipe", str(tiny_recipe), "--out", "runs",
              "--set", "train.max_epochs=8", cwd=tmp_path)
    metrics = RunFiles(tmp_path / "runs" / "tiny" / "lstm" / "seed-1").metrics
    deadline = time.time() + 120
    while time.time() < deadline and not (metrics.exists() and metrics.read_text().strip()):
        time.sleep(0.02)
    run.send_signal(signal.SIGSTOP)
    lines_then = len(metrics.read_text().splitlines())
    time.sleep(pause)
    run.send_signal(signal.SIGCONT)
    assert run.wait(timeout=300) == 0, run.stderr.read()
    assert len(metrics.read_text().splitlines()) > lines_then  # the pause fell inside training
    r = json.loads(RunFiles(metrics.parent).result.read_text())
    assert r["train_cpu_s"] > 0
    # one torch thread: CPU time can only exceed the unpaused wall time by other threads' work
    assert r["train_time_s"] - r["train_cpu_s"] >= 0.75 * pause, r


def test_same_seed_same_result(tmp_path, tiny_recipe):
    results = []
    for out in ("a", "b"):
        p = cli("train", *TRAIN, "--recipe", str(tiny_recipe), "--out", out, cwd=tmp_path)
        assert p.wait(timeout=300) == 0, p.stderr.read()
        r = json.loads(RunFiles(tmp_path / out / "tiny" / "lstm" / "seed-1").result.read_text())
        for timing in ("train_time_s", "train_cpu_s", "wall_time_s"):
            r.pop(timing)
        results.append(r)
    assert results[0] == results[1]
    other = cli("train", *TRAIN, "--recipe", str(tiny_recipe), "--out", "c", "--seed", "2", cwd=tmp_path)
    assert other.wait(timeout=300) == 0
    r = json.loads(RunFiles(tmp_path / "c" / "tiny" / "lstm" / "seed-2").result.read_text())
    assert r["test"] != results[0]["test"]


WRITER = textwrap.dedent("""
    import sys, torch
    from pathlib import Path
    from lstmablate.train.checkpoint import save_checkpoint
    path = Path(sys.argv[1])
    i = 0
    print("ready", flush=True)
    while True:  # keep rewriting a large checkpoint until killed
        i += 1
        save_checkpoint(path, {"run": {}, "i": i, "blob": torch.full((2_000_000,), float(i))})
""")


def test_sigkill_during_checkpoint_writes_never_corrupts(tmp_path):
    path = RunFiles(tmp_path).last
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    for delay in (0.3, 0.55, 0.8):
        p = subprocess.Popen([sys.executable, str(script), str(path)], stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "ready"
        time.sleep(delay)
        p.send_signal(signal.SIGKILL)
        p.wait()
        if path.exists():
            ckpt = load_checkpoint(path)  # never truncated
            assert torch.all(ckpt["blob"] == float(ckpt["i"]))
    assert path.exists(), "no checkpoint write ever completed: the kills tested nothing"
    leftovers = [f for f in os.listdir(tmp_path) if f.startswith(".tmp-")]
    # a killed writer may leave its temporary file, but never in place of last.pt
    assert all(f.startswith(".tmp-last.pt") for f in leftovers)


def test_truncated_checkpoint_is_reported_by_name(tmp_path):
    from lstmablate.errors import CheckpointError
    from lstmablate.train.checkpoint import save_checkpoint

    path = RunFiles(tmp_path).last
    save_checkpoint(path, {"run": {}, "x": torch.zeros(1000)})
    path.write_bytes(path.read_bytes()[:300])
    with pytest.raises(CheckpointError, match=r"last.pt is truncated or corrupt"):
        load_checkpoint(path)


def test_deterministic_flag_sets_and_records(tmp_path, tiny_recipe):
    from lstmablate.run.runner import set_deterministic

    try:
        note = set_deterministic(torch.device("cpu"))
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
        assert "cannot promise" in note
    finally:
        torch.use_deterministic_algorithms(False)
        torch.backends.cudnn.deterministic = False
    p = cli("train", *TRAIN, "--recipe", str(tiny_recipe), "--out", "d", "--deterministic",
            "--set", "train.max_steps=2", cwd=tmp_path)
    assert p.wait(timeout=300) == 0, p.stderr.read()
    env = json.loads(RunFiles(tmp_path / "d" / "tiny" / "lstm" / "seed-1").env.read_text())
    assert "cannot promise" in env["deterministic"]
