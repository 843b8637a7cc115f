"""The GPU window's shipped plans (benchmarks/plans/): each loads, names recipes and cells that
exist, and the encoder plans plan what they are for from the step times their window measured
on an NVIDIA H200 (benchmarks/results/gpu-check-nvidia-h200-20261128-215229.json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lstmablate.bench import window, window_plan
from lstmablate.cells import available_cells
from lstmablate.recipes import load_recipe

ROOT = Path(__file__).resolve().parents[1]
PLANS = sorted((ROOT / "benchmarks" / "plans").glob("*.json"))


@pytest.mark.parametrize("path", PLANS, ids=lambda p: p.name)
def test_every_shipped_plan_names_recipes_and_cells_that_exist(path):
    plan = window_plan.load_plan(str(path))
    cells = set(available_cells())
    for slot in plan:
        for group in slot:
            _, spec = load_recipe(group["recipe"])
            assert set(group.get("cells") or spec["cells"]) <= cells


#: the window that ran the encoder plan on an NVIDIA H200: its check's steps of both recipes
H200_ENCODERS = ROOT / "benchmarks" / "results" / "gpu-check-nvidia-h200-20261128-215229.json"
#: the same machine's step-capture timings of the unidirectional LSTM's step (ms, 20 steps
#: after 16 warm-up; the stage was ended at its deadline before it wrote its rows, so they
#: are the lines of benchmarks/results/gpu-check-nvidia-h200-20261128-220128.log)
H200_LSTM_CAPTURE = {"off": 36.07, "graphs": 14.65}


def _steps(path: Path, recipes: list[str]) -> list[dict]:
    """The step rows of ``recipes`` in the record ``path``."""
    return [r for r in json.loads(path.read_text())["rows"]
            if r.get("kind") == "step" and r["recipe"] in recipes]


def test_the_encoder_plan_as_the_window_planned_it_from_its_own_check():
    """Table 4's open question (docs/nmt.md): the LSTM with each encoder, whole (13 epochs,
    both rankings decoded at the end: ``final_s``), never shortened. From the steps its own
    check timed on the H200 (the bidirectional step 66 ms, the unidirectional 31 ms) and the
    10.3 minutes its log gave the runs, the planner takes the three unidirectional seeds and
    no bidirectional one -- what that window did."""
    plan = window_plan.load_plan(str(ROOT / "benchmarks" / "plans" / "table4-encoders.json"))
    rows = _steps(H200_ENCODERS, ["nmt-multi30k", "nmt-multi30k-brnn"])
    runs, skipped = window_plan.plan_runs(plan, rows, 10.3 * 60)
    assert sorted((r.experiment, r.seed) for r in runs) == [("nmt-multi30k", s) for s in (1, 2, 3)]
    assert [s["group"] for s in skipped] == ["brnn-1", "brnn-2", "brnn-3"]
    assert not any(r.shortened for r in runs) and all(r.epochs == 13 for r in runs)


def test_the_bidirectional_plan_fits_with_the_captured_step():
    """The next window's plan: the bidirectional seeds, then the unidirectional seeds 4 and
    5. Eagerly not one bidirectional run fits a window's horizon (a 9.5-minute call, its
    check, and a 3-minute second call: only seeds 4 and 5 are taken); at the speed-up CUDA
    graphs gave the unidirectional step on the same GPU (the window's step-capture stage
    measures the bidirectional one's own before it plans), the three bidirectional seeds
    fit side by side."""
    plan = window_plan.load_plan(str(ROOT / "benchmarks" / "plans" / "table4-brnn.json"))
    rows = _steps(H200_ENCODERS, ["nmt-multi30k", "nmt-multi30k-brnn"])
    horizon = 9.5 * 60 - window.MARGIN_S - 90 + 3 * 60
    runs, skipped = window_plan.plan_runs(plan, rows, horizon)
    assert [s["group"] for s in skipped] == ["brnn-1", "brnn-2", "brnn-3"]
    assert [(r.experiment, r.seed) for r in runs] == [("nmt-multi30k", 4), ("nmt-multi30k", 5)]
    speed = H200_LSTM_CAPTURE["off"] / H200_LSTM_CAPTURE["graphs"]
    captured = [dict(r, ms=r["ms"] / speed, gpu_ms=r["gpu_ms"], step_capture="graphs")
                for r in rows]
    runs, skipped = window_plan.plan_runs(plan, captured, horizon)
    assert [(r.experiment, r.seed) for r in runs][:3] == [
        ("nmt-multi30k-brnn", s) for s in (1, 2, 3)]
    assert all("train.step_capture=graphs" in r.sets and not r.shortened for r in runs)
    assert max(r.estimate_s for r in runs) <= horizon


