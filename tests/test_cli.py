"""The CLI: exit codes and one-paragraph errors, no tracebacks."""

from __future__ import annotations

import pytest

from cli_in_process import expect_error, run_cli

from lstmablate.run.runs import RunFiles


@pytest.mark.parametrize("args, expected", [
    (["train", "--task", "dyck", "--cell", "lstn"], "unknown cell 'lstn'. Did you mean 'lstm'?"),
    (["train", "--task", "dyk"], "unknown task 'dyk'. Did you mean 'dyck'?"),
    (["train", "--task", "dyck", "--recipe", "dyck-dem"], "Did you mean 'dyck-demo'?"),
    (["train", "--task", "dyck", "--set", "train.lrr=1"], "Did you mean 'train.lr'?"),
    (["list", "cels"], "Did you mean 'cells'?"),
    (["eval", "/nonexistent/run"], "is not a run directory"),
    (["bench", "--model-size", "huge"], "--model-size 'huge': expected one of small, medium, large"),
])
def test_user_errors_exit_2_without_traceback(args, expected, tmp_path):
    expect_error(run_cli(*args, cwd=tmp_path), expected)


def test_train_eval_report_list(tmp_path, tiny_recipe):
    r = run_cli("train", "--task", "dyck", "--cell", "lstm-srnn", "--recipe", str(tiny_recipe),
                "--set", "train.max_steps=4", "--out", "runs", "--threads", "1", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    run_dir = tmp_path / "runs" / "tiny" / "lstm-srnn" / "seed-1"
    assert r.stdout.strip() == str(run_dir.relative_to(tmp_path))
    r = run_cli("eval", str(run_dir), "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    import json
    metrics = json.loads(r.stdout)
    result = json.loads(RunFiles(run_dir).result.read_text())
    assert metrics["accuracy"] == pytest.approx(result["test"]["accuracy"], abs=1e-12)
    r = run_cli("report", "runs", "--out", "table.md", "--print", cwd=tmp_path)
    assert r.returncode == 0 and "| `lstm-srnn`" in r.stdout
    assert (tmp_path / "table.md").read_text() == r.stdout
    for what in ("cells", "tasks", "recipes"):
        r = run_cli("list", what, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
    assert "lstm-srnn-hidden" in run_cli("list", "cells", cwd=tmp_path).stdout


def test_sweep_list_prints_one_command_per_missing_run(tmp_path, tiny_recipe):
    r = run_cli("sweep", str(tiny_recipe), "--list", "--out", "runs", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = [l for l in r.stdout.splitlines() if l.strip()]
    assert len(lines) == 4 and all(l.startswith("lstmablate train --task dyck") for l in lines)


def test_sweep_runs_missing_runs_in_parallel_and_skips_finished(tmp_path, tiny_recipe):
    r = run_cli("sweep", str(tiny_recipe), "--out", "runs", "--jobs", "2", "--set", "train.max_steps=2",
                cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    results = {p.relative_to(tmp_path).as_posix()
               for p in (tmp_path / "runs").rglob(RunFiles.RESULT)}
    assert results == {f"runs/tiny/{c}/seed-{s}/result.json" for c in ("lstm", "lstm-srnn") for s in (1, 2)}
    again = run_cli("sweep", str(tiny_recipe), "--out", "runs", "--set", "train.max_steps=2", cwd=tmp_path)
    assert "4 finished, 0 to run" in " ".join(again.stderr.split())


def test_data_path_follows_the_documented_order(tmp_path, monkeypatch):
    monkeypatch.delenv("LSTMABLATE_DATA", raising=False)
    r = run_cli("data", "path", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.startswith(str(tmp_path / "data")), r.stderr
    monkeypatch.setenv("LSTMABLATE_DATA", str(tmp_path / "from-env"))
    r = run_cli("data", "path", cwd=tmp_path)
    assert r.stdout.startswith(str(tmp_path / "from-env")) and "LSTMABLATE_DATA" in r.stdout
    r = run_cli("data", "path", "--data-dir", "x", cwd=tmp_path)
    assert r.stdout.startswith(str(tmp_path / "x")) and "--data-dir" in r.stdout
