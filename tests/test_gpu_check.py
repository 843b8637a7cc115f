"""``make gpu-check`` (``lstmablate.bench.gpu_check``), the parts that need no GPU: the targets
computed from its rows, the Markdown it writes, the trainer command it runs (for the recipe
and task it is given), and that it refuses to run without a GPU; and the model benchmark it
runs, which times the ``ptb`` task's own model (``lstmablate.bench.models``)."""

from __future__ import annotations

import functools
import json
import subprocess
import sys

import pytest
import torch

from lstmablate import bench
from lstmablate.bench import cells as bench_cells
from lstmablate.bench import gpu_check, models
from lstmablate.cells import build_encoder
from lstmablate.recipes import resolve_config
from lstmablate.run.runs import RunFiles, RunResult, write_config, write_result
from lstmablate.task import get_task


def _cell_row(shape, cell, ratio_lstm, ratio_rnn=1.0, memory=10.0):
    row = dict(kind="cell", shape=shape, cell=cell, kernel="k", device="cuda", threads=1,
               ratio_lstm=ratio_lstm, ratio_rnn=ratio_rnn, memory_mb=memory, ms=1.0, ms_min=1.0,
               tokens_per_s=1000.0 * ratio_lstm, gflops=1.0, speedup_vs_reference=None)
    row.update(bench_cells._target(cell, bench_cells.SHAPES[shape], row))
    return row


def test_the_targets_of_a_run():
    rows = [_cell_row(s, "nn.LSTM", 1.0) for s in bench.DEFAULT_SHAPES]
    rows += [_cell_row("ptb-200", "lstm-srnn", 1.1, memory=8.0),
             _cell_row("ptb-650", "lstm-srnn", 1.0, memory=12.0),
             _cell_row("parser-400", "lstm-srnn", 0.85),
             _cell_row("ptb-650", "lstm", 0.9), _cell_row("ptb-200", "gru", 0.6)]
    rows += [dict(kind="model", shape="ptb-medium-model", cell="lstm-srnn", kernel="k", ms=1.0,
                  ratio_lstm=1.05, tokens_per_s=5000.0),
             dict(kind="trainer", shape="ptb-medium-trainer", cell="lstm-srnn", tokens_per_s=4000.0,
                  steps=200, seconds=1.0)]
    got = {t["target"].split(" (")[0]: t for t in gpu_check.targets(rows)}
    assert got["lstm-srnn >= 1.00x nn.LSTM at ptb-650"]["met"] is True
    assert got["lstm >= 0.97x nn.LSTM at ptb-650"]["met"] is False
    assert got["gru >= 0.50x nn.LSTM at ptb-200"]["met"] is True
    parser = got["lstm-srnn at parser-400 within 10% of its ptb-650 ratio"]
    assert parser["measured"] == 0.85 and parser["met"] is False
    assert got["lstm-srnn peak memory <= nn.LSTM's at ptb-200"]["met"] is True
    assert got["lstm-srnn peak memory <= nn.LSTM's at ptb-650"]["met"] is False
    assert got["lstm-srnn PTB-medium training step >= 1.0x the nn.LSTM model"]["met"] is True
    trainer = got["lstm-srnn trainer tokens/s within 10% of the benchmarked step"]
    assert trainer["measured"] == 0.8 and trainer["met"] is False
    doc = dict(started="now", seconds=1.0, environment=dict(gpu="Some GPU"), parts={
        "tests": dict(status="passed", summary="3 passed", seconds=1.0)},
        rows=rows, targets=gpu_check.targets(rows))
    md = gpu_check.markdown(json.loads(json.dumps(doc)))
    assert md.startswith("# gpu-check: Some GPU") and "| lstm-srnn | 200 | 1.00 | 4,000 |" in md
    assert "| lstm >= 0.97x nn.LSTM at ptb-650 | 0.9 | 0.97 | **no** |" in md


def test_a_cpu_row_keeps_the_cpu_targets():
    row = dict(device="cpu", ratio_lstm=1.1, ratio_rnn=0.5, speedup_vs_reference=None)
    assert bench_cells._target("lstm-srnn", bench_cells.SHAPES["ptb-650"], row)["target"] == 1.05
    row["device"] = "cuda"
    assert bench_cells._target("lstm-srnn", bench_cells.SHAPES["ptb-650"], row)["target"] == 1.0
    assert bench_cells._target("lstm-srnn", bench_cells.SHAPES["parser-400"], row)["target"] is None


def test_the_paper_cells_come_from_the_recipe():
    assert gpu_check.paper_cells()[:2] == ["lstm", "lstm-srnn"]
    assert gpu_check.paper_cells("ptb-small") == gpu_check.paper_cells()  # the same five cells
    assert gpu_check.tokens_per_step("ptb", "ptb-medium", "lstm") == 20 * 35
    assert gpu_check.tokens_per_step("ptb", "ptb-small", "lstm") == 20 * 20
    with pytest.raises(ValueError, match="no batch_size and num_steps"):
        gpu_check.tokens_per_step("sst", "sst", "lstm")


def test_the_trainer_runs_the_task_and_recipe_it_is_given(tmp_path, monkeypatch):
    """The trainer part trains the cells of ``--recipe`` with ``--task`` (PTB-medium by
    default) and reports its rows under ``<recipe>-trainer``, checked against the model
    benchmark's ``<recipe>-model`` rows."""
    data = tmp_path / "data"
    for ds in get_task("ptb").datasets:  # the files the task looks for (their content unread)
        for f in ds.files:
            (data / f.relpath).parent.mkdir(parents=True, exist_ok=True)
            (data / f.relpath).write_text("x\n")
    monkeypatch.setenv("LSTMABLATE_DATA", str(data))
    commands = []

    def fake_train(cmd, **kw):  # `lstmablate train` as a subprocess: its config and result
        commands.append(cmd)
        out, cell = (cmd[cmd.index(flag) + 1] for flag in ("--out", "--cell"))
        steps = next(int(a.split("=")[1]) for a in cmd if a.startswith("train.max_steps="))
        cfg = resolve_config(get_task("ptb"), cell, recipe="ptb-small", seed=1,
                             experiment=f"gpu-check-{steps}")
        files = RunFiles.of(tmp_path / out, cfg.experiment, cell, 1)
        files.root.mkdir(parents=True, exist_ok=True)
        write_config(files, cfg)
        write_result(files, RunResult(
            **cfg.checkpoint_key(), recipe=cfg.recipe, primary="ppl", higher_is_better=False,
            best={"step": steps, "epoch": 1, "dev": {}}, test=None, test_checkpoint="best",
            steps=steps, epochs=1, train_time_s=steps / 10, wall_time_s=steps / 10, params=0))
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(gpu_check.subprocess, "run", fake_train)
    part, rows = gpu_check.run_trainer("cpu", 600.0, task="ptb", recipe="ptb-small")
    assert part["status"] == "done", part
    assert {tuple(c[c.index("--task"):c.index("--task") + 4]) for c in commands} == {
        ("--task", "ptb", "--recipe", "ptb-small")}
    assert [r["cell"] for r in rows] == gpu_check.paper_cells("ptb-small")
    assert {r["shape"] for r in rows} == {"ptb-small-trainer"}
    # 200 steps of batch 20 x 20 steps in 20 s (the difference of the two runs' times)
    assert rows[0]["tokens_per_s"] == pytest.approx(200 * 20 * 20 / 20.0)
    model = dict(kind="model", shape="ptb-small-model", cell=rows[0]["cell"], ratio_lstm=1.0,
                 tokens_per_s=rows[0]["tokens_per_s"])
    got = [t["target"] for t in gpu_check.targets(rows + [model])]
    assert got == [f"{rows[0]['cell']} trainer tokens/s within 10% of the benchmarked step "
                   "(4,000 vs 4,000)"]
    assert "| ptb-small through the trainer |" in gpu_check.markdown(dict(
        started="now", seconds=1.0, environment={}, parts={}, rows=rows, targets=[]))


def test_the_model_benchmark_times_the_task_model():
    """One PTB model: the benchmark builds the ``ptb`` task's own (through the registry),
    with a registry cell or with ``torch.nn.LSTM`` as the encoder."""
    task = get_task("ptb")
    cfg = task.ModelConfig(hidden_size=8, num_layers=2, dropout=0.0)
    theirs = task.language_model(functools.partial(build_encoder, "lstm-srnn"), 50, cfg)
    ours = models.ptb_model("lstm-srnn", 50, 8, 2)
    assert type(ours) is type(theirs)
    assert [(n, p.shape) for n, p in ours.named_parameters()] == [
        (n, p.shape) for n, p in theirs.named_parameters()]
    base = models.ptb_model(models.BASELINE, 50, 8, 2)
    assert type(base) is type(theirs) and isinstance(base.encoder.rnn, torch.nn.LSTM)
    logits, state = base(torch.randint(0, 50, (2, 3)))
    assert logits.shape == (2, 3, 50) and state[0].shape == (2, 2, 8)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without a GPU")
def test_without_a_gpu_it_says_so_and_stops(tmp_path):
    r = subprocess.run([sys.executable, "-m", "lstmablate.bench.gpu_check", "--out",
                        str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "no CUDA device" in r.stderr
    assert not list(tmp_path.iterdir())
