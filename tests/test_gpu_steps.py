"""gpu-check's ``step-capture`` and ``peers`` stages and what the window plans with
(``lstmablate/bench/gpu_steps.py``, ``lstmablate/bench/peers.py``), on the CPU: the faster
mode a planner reads, the NMT target, the tables; the stages end to end as gpu-check's dry
run (``--device cpu``; ``graphs`` is a GPU's, ``compile`` runs on inductor's CPU backend:
slow)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lstmablate.bench import gpu_steps, window_plan
from lstmablate.bench.gpu_record import read_rows

ROOT = Path(__file__).resolve().parents[1]


def _cap(recipe, cell, mode, ms, gpu_ms=None, fallback=None):
    return dict(kind="capture-step", recipe=recipe, cell=cell, mode=mode, ms=ms, gpu_ms=gpu_ms,
                tokens_per_s=1000 / ms, warm_s=1.0, capture=dict(captures=1, replays=5, eager=1,
                                                               fallback=fallback))


def _step(recipe, cell, ms, gpu_ms=None):
    return dict(kind="step", recipe=recipe, task="dyck", cell=cell, ms=ms, gpu_ms=gpu_ms,
                tokens_per_s=1000 / ms, steps_per_epoch=10, epochs=2, run_steps=20,
                setup_s=1.0, eval_s=0.5)


def test_the_planner_reads_the_fastest_mode_scaled_by_its_speedup():
    steps = [_step("r", "lstm", 40.0, gpu_ms=8.0), _step("r", "gru", 30.0), _step("s", "lstm", 9)]
    caps = [_cap("r", "lstm", "off", 50.0, gpu_ms=10.0), _cap("r", "lstm", "graphs", 20.0, 9.0),
            _cap("r", "lstm", "compile", 25.0, 9.5),
            _cap("r", "gru", "off", 10.0), _cap("r", "gru", "compile", 12.0),  # slower: kept
            _cap("s", "lstm", "off", 10.0), _cap("s", "lstm", "graphs", 1.0, fallback="x")]
    out = gpu_steps.fastest(steps, caps)
    lstm, gru, other = out
    assert lstm["step_capture"] == "graphs" and lstm["capture_speedup"] == 2.5
    assert lstm["ms"] == pytest.approx(16.0) and lstm["gpu_ms"] == pytest.approx(8.0 * 0.9)
    assert gru == steps[1] and "step_capture" not in gru
    assert other == steps[2]  # a mode that fell back is no measurement of itself


def test_the_nmt_target_and_the_table():
    rows = [_cap("nmt-multi30k", "lstm", "off", 40.0, 8.0),
            _cap("nmt-multi30k", "lstm", "graphs", 14.0, 10.5),
            _cap("ptb-medium", "lstm", "off", 10.0), _cap("ptb-medium", "lstm", "compile", 8.0)]
    got = {t["target"]: t for t in gpu_steps.targets(rows)}
    speed = got["lstm nmt-multi30k step (graphs) >= 2.5x the eager step's tokens/s"]
    assert speed["measured"] == pytest.approx(40 / 14, abs=1e-3) and speed["met"]
    busy = got["lstm nmt-multi30k step (graphs): GPU busy >= 70%"]
    assert busy["measured"] == 0.75 and busy["met"]
    assert len(got) == 2  # (the PTB rows have no step target of their own)
    table = "\n".join(gpu_steps.markdown_rows(rows))
    assert "| nmt-multi30k | lstm | graphs | 14.00 | 2.86 |" in table


def test_a_planned_run_sets_the_faster_mode(tmp_path):
    recipe = tmp_path / "tiny.yaml"
    from conftest import TINY_DYCK

    recipe.write_text(TINY_DYCK)
    rows = [dict(_step("tiny", c, 5.0), step_capture="compile") for c in ("lstm", "lstm-srnn")]
    runs, skipped = window_plan.plan_runs([[dict(name="g", recipe=str(recipe))]], rows, 3600)
    assert not skipped and runs
    assert all("train.step_capture=compile" in r.sets for r in runs)


def test_each_capture_row_comes_as_soon_as_it_is_measured(tmp_path):
    """The stage writes each row as the generator yields it, so a stage ended at its deadline
    (on an H200 the compile mode of the NMT step outran it) keeps the modes it measured:
    the first row ('off') comes before the next mode is even built."""
    recipe = tmp_path / "tiny.yaml"
    from conftest import TINY_DYCK

    recipe.write_text(TINY_DYCK)
    said: list[str] = []
    rows = gpu_steps.bench_capture_steps(str(recipe), ["lstm"], device="cpu", steps=1,
                                         progress=said.append)
    first = next(rows)
    assert first["mode"] == "off" and first["ms"] > 0 and first["cell"] == "lstm"
    assert not any("compile" in line for line in said), said
    rows.close()


def _check(tmp_path, *args) -> tuple[int, list[dict], str]:
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "lstmablate.bench.gpu_check", "--device", "cpu",
                        "--out", str(out), *args], cwd=ROOT, capture_output=True, text=True,
                       timeout=1200)
    jsonl = next(out.glob("gpu-check-*.jsonl"))
    return r.returncode, read_rows(jsonl), jsonl.with_suffix(".md").read_text()


def test_the_step_cells_and_capture_modes_chosen(tmp_path):
    """--step-cell and --capture-mode: the step-capture stage times those cells in those
    modes alone (what a window asks for); a cell that is not registered is refused before
    any stage runs."""
    recipe = tmp_path / "tiny.yaml"
    from conftest import TINY_DYCK

    recipe.write_text(TINY_DYCK)
    code, rows, md = _check(tmp_path, "--only", "step-capture", "--step-recipe", str(recipe),
                            "--step-cell", "lstm-gates", "--capture-mode", "off",
                            "--step-repeats", "1", "--budget", "300")
    caps = [(r["cell"], r["mode"]) for r in rows if r.get("kind") == "capture-step"]
    assert caps == [("lstm-gates", "off")] and code == 0
    r = subprocess.run([sys.executable, "-m", "lstmablate.bench.gpu_check", "--device", "cpu",
                        "--out", str(tmp_path / "bad"), "--only", "steps", "--step-cell",
                        "no-such-cell"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "no-such-cell" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow
def test_the_peers_stage_as_a_dry_run(tmp_path):
    code, rows, md = _check(tmp_path, "--only", "peers", "--shape", "4x5x8x2", "--repeats", "1",
                            "--budget", "300")
    stage = next(r for r in rows if r.get("kind") == "stage")
    assert stage["stage"] == "peers" and stage["status"] == "done", stage
    peers = [r for r in rows if r.get("kind") == "peer"]
    assert {r["peer"] for r in peers} == {"sru", "sru-2017", "flashrnn-lstm", "fla-hgrn"}
    assert "| 4x5x8x2 (1 layer) | fla-hgrn" in md and code == 0


@pytest.mark.slow
def test_the_step_capture_stage_as_a_dry_run(tmp_path):
    recipe = tmp_path / "tiny.yaml"
    from conftest import TINY_DYCK

    recipe.write_text(TINY_DYCK)
    code, rows, md = _check(tmp_path, "--only", "step-capture", "--step-recipe", str(recipe),
                            "--cell", "lstm", "--step-repeats", "2", "--budget", "900")
    stage = next(r for r in rows if r.get("kind") == "stage")
    assert stage["status"] == "done", stage
    caps = {r["mode"]: r for r in rows if r.get("kind") == "capture-step"}
    assert set(caps) == {"off", "compile"}  # (graphs: a GPU's)
    assert caps["compile"]["capture"]["captures"] >= 1 and not caps["compile"]["capture"][
        "fallback"]
    assert caps["off"]["capture"]["mode"] == "off" and caps["off"]["ms"] > 0
    assert "| tiny | lstm | compile |" in md and code == 0
    json.dumps(rows)
