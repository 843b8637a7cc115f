"""``make gpu-check`` (``lstmablate.bench.gpu_check``), the parts that need no GPU: the targets
computed from its rows (per precision), the Markdown it writes, the trainer command it runs
(for the recipe and task it is given), that it refuses ``--device cuda`` without a GPU; its
stages' records (a stage cut at its deadline keeps its rows, a stage whose packages are
missing or that needs CUDA is named, and so is every stage that did not pass, in the exit
status; the whole dry run on the CPU: tests/test_gpu_window.py); the accuracy rule
its paths stages apply (``lstmablate.bench.accuracy``), the peak memory it measures after a
reset with the graphs captured before dropped; and the model benchmark it runs, which times
the ``ptb`` task's own model (``lstmablate.bench.models``)."""

from __future__ import annotations

import functools
from importlib import metadata
import json
import subprocess
import sys

import pytest
import torch

from lstmablate import bench
from lstmablate.bench import cells as bench_cells
from lstmablate.bench import accuracy, gpu_check, gpu_record, measure, models
from lstmablate.cells import build_encoder
from lstmablate.recipes import resolve_config
from lstmablate.run.runs import RunFiles, RunResult, write_config, write_result
from lstmablate.cells.kernels.switches import reference_forced
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
    got = {t["target"].split(" (")[0]: t for t in gpu_record.targets(rows)}
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
    doc = dict(started="now", seconds=1.0, environment=dict(gpu="Some GPU"), stages={
        "tests": dict(status="done", summary="3 passed", seconds=1.0)},
        rows=rows, targets=gpu_record.targets(rows))
    md = gpu_record.markdown(json.loads(json.dumps(doc)))
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
    got = [t["target"] for t in gpu_record.targets(rows + [model])]
    assert got == [f"{rows[0]['cell']} trainer tokens/s within 10% of the benchmarked step "
                   "(4,000 vs 4,000)"]
    assert "| ptb-small through the trainer |" in gpu_record.markdown(dict(
        started="now", seconds=1.0, environment={}, stages={}, rows=rows, targets=[]))


def test_the_trainer_trains_only_the_cells_asked_for_on_the_data_given(tmp_path, monkeypatch):
    """``--cell`` narrows the trainer stage to the recipe's cells among them (a window times
    two cells, not five), ``--data-dir`` is the data it trains on, and cells the recipe does
    not train leave the stage not run, saying so."""
    data = tmp_path / "elsewhere"
    for ds in get_task("ptb").datasets:
        for f in ds.files:
            (data / f.relpath).parent.mkdir(parents=True, exist_ok=True)
            (data / f.relpath).write_text("x\n")
    monkeypatch.setenv("LSTMABLATE_DATA", str(tmp_path / "nothing-here"))
    commands = []

    def fake_train(cmd, **kw):
        commands.append(cmd)
        raise subprocess.TimeoutExpired(cmd, 1.0)  # (which cells and data: enough)

    monkeypatch.setattr(gpu_check.subprocess, "run", fake_train)
    part, rows = gpu_check.run_trainer("cpu", 600.0, task="ptb", recipe="ptb-small",
                                       cells=["lstm-gates", "gru", "lstm"], data_dir=str(data))
    assert [c[c.index("--cell") + 1] for c in commands] == ["lstm", "lstm-gates"]
    assert {c[c.index("--data-dir") + 1] for c in commands} == {str(data)}
    assert part["status"] == "not-run" and rows == []
    part, rows = gpu_check.run_trainer("cpu", 600.0, task="ptb", recipe="ptb-small",
                                       cells=["gru"], data_dir=str(data))
    assert part["status"] == "not-run" and "none of the cells asked for (gru)" in part["reason"]
    part, _ = gpu_check.run_trainer("cpu", 600.0, task="ptb", recipe="ptb-small")
    assert "no ptb data under" in part["reason"] and "nothing-here" in part["reason"]


def test_a_record_without_the_environment_stage_still_names_its_device(tmp_path):
    """``--only`` without ``environment``: the record names the device gpu-check was started
    on and PyTorch's version, and says that the rest of the environment is unknown."""
    check = gpu_record.Check(tmp_path, "cuda", 30.0, "NVIDIA H200", "python3 -m ...")
    check.record("cells-fp32", dict(status="done", seconds=1.0))
    env = check.document()["environment"]
    assert env["gpu"] == "NVIDIA H200" and env["torch"] == metadata.version("torch")
    assert "environment stage did not run" in env["note"]
    md = check.md.read_text()
    assert md.startswith("# gpu-check: NVIDIA H200\n") and "environment stage did not run" in md
    assert check.md.name.startswith("gpu-check-nvidia-h200-")


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


def test_targets_are_compared_within_their_precision():
    """cells-fp32 and cells-tf32 rows of the same shape and cell are two measurements: each
    target is computed within one precision, and says which."""
    rows = []
    for precision, ratio, memory in (("fp32", 1.2, 9.0), ("tf32", 0.9, 11.0)):
        for shape in ("ptb-650", "parser-400"):
            rows.append(dict(_cell_row(shape, "nn.LSTM", 1.0), precision=precision))
            rows.append(dict(_cell_row(shape, "lstm-srnn", ratio if shape == "ptb-650" else 0.6,
                                       memory=memory), precision=precision))
    got = {t["target"].split(" (")[0]: t for t in gpu_record.targets(rows)}
    assert got["lstm-srnn >= 1.00x nn.LSTM at ptb-650, fp32"]["met"] is True
    assert got["lstm-srnn >= 1.00x nn.LSTM at ptb-650, tf32"]["met"] is False
    # parser-400 against ptb-650 of the same precision: 0.6 / 1.2 and 0.6 / 0.9
    assert got["lstm-srnn at parser-400 within 10% of its ptb-650 ratio, fp32"]["measured"] == 0.5
    assert got["lstm-srnn at parser-400 within 10% of its ptb-650 ratio, tf32"]["measured"] == \
        pytest.approx(0.667, abs=1e-3)
    # memory against nn.LSTM's (10 MB) of the same precision
    assert got["lstm-srnn peak memory <= nn.LSTM's at ptb-650, fp32"]["met"] is True
    assert got["lstm-srnn peak memory <= nn.LSTM's at ptb-650, tf32"]["met"] is False


def test_the_peak_memory_counts_the_graph_slots_of_the_step_itself(monkeypatch):
    """On CUDA the measurement drops the graphs captured before it (their slots sit in the
    baseline and would hide the memory a graphed cell needs), unsets the gradients, resets
    the peak, then runs the step: the figure is what the step allocates, its own slot
    included.  A fake allocator stands in for the GPU's."""
    mem = dict(now=100, peak=100, calls=[])
    old_slots = 40  # captured by an earlier candidate, before the measurement

    def alloc(n):
        mem["now"] += n
        mem["peak"] = max(mem["peak"], mem["now"])

    def clear():
        mem["calls"].append("release")
        alloc(-old_slots)

    monkeypatch.setattr(measure, "release_graphs", clear)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: (
        mem["calls"].append("reset"), mem.update(peak=mem["now"])))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: mem["now"])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: mem["peak"])
    param = torch.nn.Parameter(torch.zeros(2))
    param.grad = torch.ones(2)
    slot = []

    def step():  # 7 bytes held while it runs; its own graph slot (25) from its third call on
        mem["calls"].append("step")
        assert param.grad is None or mem["calls"].count("step") > 1
        if mem["calls"].count("step") == 3:
            slot.append(alloc(25))
        alloc(7)
        alloc(-7)

    got = measure._memory_mb(step, torch.device("cuda"), [param])
    assert mem["calls"] == ["release", "reset"] + ["step"] * measure.MEMORY_STEPS
    assert got == pytest.approx(32 / 2**20)  # 25 + 7: the slot it made, not the 40 before


def test_the_accuracy_rule_catches_a_wrong_fast_path():
    """A fast path within float32 rounding of the float64 reference passes; one whose outputs
    are off by 0.1% (far above rounding, far below a visible error) fails, naming them."""
    torch.manual_seed(0)
    enc = build_encoder("lstm-srnn", 5, 6, num_layers=2)
    x = torch.randn(3, 4, 5)
    state = (torch.zeros(2, 3, 6), torch.zeros(2, 3, 6))
    ok = accuracy.measure_accuracy(enc, x, torch.tensor([4, 2, 3]), state)
    assert ok.fast_path and ok.passed and ok.error <= ok.allowed
    # the fast path's outputs (never the reference loop's) scaled by 1.001
    enc.register_forward_hook(lambda mod, inputs, out: None if reference_forced() else (
        out[0] * 1.001, out[1]))
    bad = accuracy.measure_accuracy(enc, x, torch.tensor([4, 2, 3]), state)
    assert bad.fast_path and not bad.passed and bad.error > bad.allowed > 0


def test_the_accuracy_rule_keeps_its_bound_under_dropout_between_layers():
    """The paths stages run in training mode with plain dropout between layers, which the
    encoder draws inside ``forward``: the float64 reference, the reference loop and the fast
    path must drop the same elements, or the reference loop's 'own error' is dropout noise
    and the bound grows to the tensors' scale.  So the bound stays at float32 rounding, the
    0.1% error still fails, and a cell that leaves a state component unread (the h of
    lstm-srnn-hidden: a gradient the float64 loop leaves unset) is compared, not an error."""
    from lstmablate.bench.gpu_stages import PATHS_DROPOUT

    for cell in ("lstm-srnn", "lstm-srnn-hidden"):
        torch.manual_seed(0)
        enc = build_encoder(cell, 5, 6, num_layers=3, dropout=PATHS_DROPOUT).train()
        assert enc.dropout > 0 and not enc.variational_dropout
        x = torch.randn(3, 4, 5)
        state = (torch.randn(3, 3, 6), torch.randn(3, 3, 6))
        ok = accuracy.measure_accuracy(enc, x, None, state)
        assert ok.fast_path and ok.passed
        assert ok.allowed < 1e-4 * max(ok.scale, 1.0), (cell, ok)  # rounding, not dropout
        enc.register_forward_hook(lambda mod, inputs, out: None if reference_forced() else (
            out[0] * 1.001, out[1]))
        bad = accuracy.measure_accuracy(enc, x, None, state)
        assert not bad.passed and bad.error > bad.allowed > 0, (cell, bad)


def _check_run(tmp_path, *args):
    """gpu-check in this process, its record read back: (exit status, stages, rows, files)."""
    code = gpu_check.main(["--out", str(tmp_path / "out"), "--device", "cpu", *args])
    files = sorted(p.name for p in (tmp_path / "out").iterdir())
    rows = gpu_record.read_rows(next((tmp_path / "out").glob("*.jsonl")))
    stages = {r["stage"]: r for r in rows if r.get("kind") == "stage"}
    return code, stages, rows, files


def test_a_stage_whose_packages_are_missing_is_named(tmp_path, capsys, monkeypatch):
    specs = tuple(gpu_check.replace(s, needs=("no-such-distribution",)) if s.name == "profile"
                  else s for s in gpu_check.STAGES)
    monkeypatch.setattr(gpu_check, "STAGES", specs)
    code, stages, _, files = _check_run(tmp_path, "--only", "profile", "--only", "cells-tf32")
    assert code == 1
    assert stages["profile"]["status"] == "not-run"
    assert "needs no-such-distribution" in stages["profile"]["reason"]
    assert stages["cells-tf32"] == dict(stages["cells-tf32"], status="not-run",
                                        reason="skipped: no CUDA (cpu)")
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "profile not-run" in last and "cells-tf32 not-run" in last
    assert [f.rsplit(".", 1)[1] for f in files] == ["json", "jsonl", "md"]  # no stage ran: no log


def test_a_stage_past_its_deadline_is_ended_and_keeps_its_rows(tmp_path, monkeypatch):
    """A stage process that overruns is ended GRACE seconds after its deadline; what it
    wrote stays in the record, the stage is "partial", and the .json and .md say so."""
    fake = tmp_path / "fake_stage.py"
    fake.write_text("import json, sys, time\n"
                    "rows = sys.argv[sys.argv.index('--rows') + 1]\n"
                    "with open(rows, 'a') as f:\n"
                    "    f.write(json.dumps(dict(stage=sys.argv[1], kind='path', shape='s', "
                    "cell='c', precision='fp32', kernel='k', fast_path=True, worst='out', "
                    "error=1e-7, allowed=1e-6, scale=1.0, passed=True)) + '\\n')\n"
                    "time.sleep(60)\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setattr(gpu_check, "STAGE_MODULE", "fake_stage")
    monkeypatch.setattr(gpu_check, "GRACE", 0.5)
    code, stages, rows, _ = _check_run(tmp_path, "--only", "paths-fp32", "--budget", "2")
    assert code == 1
    assert stages["paths-fp32"]["status"] == "partial"
    assert "over its budget" in stages["paths-fp32"]["reason"]
    assert stages["paths-fp32"]["seconds"] < 10
    assert [r["cell"] for r in rows if r.get("kind") == "path"] == ["c"]
    md = next((tmp_path / "out").glob("*.md")).read_text()
    assert "| paths-fp32 | partial |" in md and "| s | c | fp32 | k | yes |" in md


def test_gpu_check_and_the_window_start_with_the_standard_library_alone():
    """On a bare GPU machine (no numpy, PyYAML, rich or typer yet) the orchestrator and the
    window start: neither imports a package at start-up, not even PyTorch (gpu-check asks it
    for CUDA in ``main``; the window installs the carried wheels before it imports the
    project's modules)."""
    code = ("import sys\n"
            "for m in ('numpy', 'yaml', 'rich', 'typer', 'torch'):\n"
            "    sys.modules[m] = None\n"
            "from lstmablate.bench import gpu_check, window\n"
            "gpu_check.parse_args(['--budget', '60', '--only', 'steps'])\n"
            "window.parse_args(['watch', '--minutes', '2', '--out', 'x'])\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_a_path_that_raises_is_named_and_the_others_still_run(tmp_path, monkeypatch):
    """A kernel that does not compile or launch is a failed path of the paths stage, with its
    error's first line; the stage goes on with the other cells."""
    from lstmablate.bench import gpu_stages

    measured = accuracy.measure_accuracy

    def measure(enc, *args, **kwargs):
        if enc.cell_name == "lstm-srnn":
            raise RuntimeError("PTX assembly aborted\nmore detail")
        return measured(enc, *args, **kwargs)

    stage = gpu_stages.Stage("paths-fp32", torch.device("cpu"), float("inf"),
                             dict(shapes=["3x4x6x2"], cells=["lstm", "lstm-srnn"]),
                             tmp_path / "rows.jsonl")
    monkeypatch.setattr(accuracy, "measure_accuracy", measure)
    outcome = gpu_stages.paths("fp32")(stage)
    rows = gpu_record.read_rows(tmp_path / "rows.jsonl")
    assert [(r["cell"], r["passed"], r.get("problem")) for r in rows if r["kind"] == "path"] == [
        ("lstm", True, None), ("lstm-srnn", False, "RuntimeError: PTX assembly aborted")]
    # and, last, which path each cell took and every kernel that fell back
    assert rows[-1]["kind"] == "kernels" and set(rows[-1]) >= {"paths", "fallbacks"}
    assert outcome.status == "failed"
    assert outcome.reason == "failed: lstm-srnn at 3x4x6x2 (RuntimeError: PTX assembly aborted)"


def test_without_pytest_the_tests_stage_did_not_run_and_the_exit_says_so(tmp_path, capsys,
                                                                          monkeypatch):
    """The old gpu-check exited 0 when tests/gpu could not run (no pytest): now the stage is
    "not-run", naming pytest, and the exit status is 1.  (A GPU is pretended: nothing runs
    on it, the stage stops before pytest.)"""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Pretend GPU")
    monkeypatch.setattr(gpu_check, "_missing", lambda *names: [n for n in names if n == "pytest"])
    code = gpu_check.main(["--out", str(tmp_path), "--only", "tests"])
    rows = gpu_record.read_rows(next(tmp_path.glob("gpu-check-pretend-gpu-*.jsonl")))
    stage = next(r for r in rows if r.get("kind") == "stage")
    assert code == 1 and stage["status"] == "not-run" and stage["reason"].startswith("needs pytest")
    assert "tests not-run (needs pytest" in capsys.readouterr().err


def test_the_kernel_table_counts_each_kernel_once(monkeypatch):
    """On CUDA the profiler lists every kernel, and also, under the operator that launched
    it, that kernel's time as the operator's own device time: the table (and the GPU's busy
    time per step, its total, which the window plans with) takes the kernels alone."""
    import types

    import torch.profiler

    def event(key, device, us, count=2):
        return types.SimpleNamespace(key=key, count=count, self_device_time_total=us,
                                     self_cpu_time_total=5.0,
                                     device_type=getattr(torch.autograd.DeviceType, device))

    events = [event("aten::mm", "CPU", 300.0), event("gemm_kernel", "CUDA", 300.0),
              event("TritonScan", "CPU", 100.0), event("lstm_scan", "CUDA", 100.0),
              event("aten::add_", "CPU", 0.0)]

    class FakeProfile:
        def __init__(self, activities):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def key_averages(self):
            return events

    monkeypatch.setattr(torch.profiler, "profile", FakeProfile)
    monkeypatch.setattr(measure, "_sync", lambda device: None)
    rows, total = measure.kernel_table(lambda: None, torch.device("cuda"), steps=2)
    assert [r["name"] for r in rows] == ["gemm_kernel", "lstm_scan"]
    assert total == pytest.approx(0.2)  # (300 + 100) us over 2 steps
    assert [r["share"] for r in rows] == pytest.approx([0.75, 0.25])
    # on a CPU the operators' own CPU time is the table
    rows, total = measure.kernel_table(lambda: None, torch.device("cpu"), steps=2)
    assert len(rows) == 5 and total == pytest.approx(5 * 5.0 / 2 / 1e3)
