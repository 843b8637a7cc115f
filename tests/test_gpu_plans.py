"""The GPU window's shipped plans (benchmarks/plans/): each loads, names recipes and cells that
exist, and plans what it is for from the step times measured on an NVIDIA H200
(benchmarks/results/gpu-check-nvidia-h200-20261127-113430.json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lstmablate.bench import window, window_plan
from lstmablate.cells import available_cells
from lstmablate.recipes import load_recipe

ROOT = Path(__file__).resolve().parents[1]
PLANS = sorted((ROOT / "benchmarks" / "plans").glob("*.json"))
H200 = ROOT / "benchmarks" / "results" / "gpu-check-nvidia-h200-20261127-113430.json"


@pytest.mark.parametrize("path", PLANS, ids=lambda p: p.name)
def test_every_shipped_plan_names_recipes_and_cells_that_exist(path):
    plan = window_plan.load_plan(str(path))
    cells = set(available_cells())
    for slot in plan:
        for group in slot:
            _, spec = load_recipe(group["recipe"])
            assert set(group.get("cells") or spec["cells"]) <= cells


def _h200_rows(recipes: list[str]) -> list[dict]:
    """The H200's NMT step rows, for each of ``recipes`` (a recipe whose step was not measured
    there, nmt-multi30k-brnn, is given the unidirectional one's: the window's own check times
    it before planning)."""
    rows = [r for r in json.loads(H200.read_text())["rows"]
            if r.get("kind") == "step" and r["recipe"] == "nmt-multi30k"]
    return [dict(r, recipe=name) for name in recipes for r in rows]


def test_the_encoder_plan_runs_both_readings_side_by_side_three_seeds_each():
    """Table 4's open question (docs/nmt.md): the LSTM with each encoder, whole (13 epochs,
    both rankings decoded at the end: ``final_s``), never shortened. Planned as a window of
    ``run --minutes 9.4 --then 4`` does: the runs' horizon is the first call less its margin
    and its check (49 s, environment + steps), plus the second call's 4 minutes."""
    plan = window_plan.load_plan(str(ROOT / "benchmarks" / "plans" / "table4-encoders.json"))
    rows = _h200_rows(["nmt-multi30k", "nmt-multi30k-brnn"])
    horizon = 9.4 * 60 - window.MARGIN_S - 49 + 4 * 60
    runs, skipped = window_plan.plan_runs(plan, rows, horizon)
    assert skipped == []
    assert sorted((r.experiment, r.seed) for r in runs) == [
        (e, s) for e in ("nmt-multi30k", "nmt-multi30k-brnn") for s in (1, 2, 3)]
    assert not any(r.shortened for r in runs) and all(r.epochs == 13 for r in runs)
    assert {r.cell for r in runs} == {"lstm"} and max(r.estimate_s for r in runs) <= horizon
    # one call alone holds none of them whole: the plan needs the second call
    runs, skipped = window_plan.plan_runs(plan, rows, 9.4 * 60 - window.MARGIN_S - 49)
    assert runs == [] and len(skipped) == 6
