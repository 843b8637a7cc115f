"""A runs tree written by hand for the significance tests: SST-2 runs whose test sentences are
scored right or wrong by a seeded random draw (no training), with their config.yaml,
result.json and scores/test.jsonl.gz as lstmablate writes them.

    runs/sig/lstm/seed-{1,...,5}        80% right, scores
    runs/sig/lstm-srnn/seed-{1,...,5}   65% right: clearly worse, scores
    runs/sig/lstm-gates/seed-1          the lstm seed-1 run's answers on all but 3 items, scores
    runs/sig/lstm-srnn-out/seed-1       80% right, NO scores file (a run from before scores)

Everything is deterministic (fixed numbers, train times and paths relative to ``root``), so a
report of it is the same text on every machine.  Run as a script to print the path of a
fresh tree (``python tests/significance_runs.py DIR``)."""

from __future__ import annotations

import json
import random
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from conftest import write_record_text
from lstmablate.run.runs import RunFiles

ITEMS = 200
RECIPE = """\
base: sst2-bilstm-max-cpu
experiment: sig
cells: [lstm, lstm-srnn, lstm-srnn-out, lstm-gates]
seeds: [1]
cell_seeds: {lstm: [1, 2, 3, 4, 5], lstm-srnn: [1, 2, 3, 4, 5]}
reference:
  lstm: {accuracy: 80.0}
reference_source: "made up for the test"
"""
RUNS = {**{("lstm", s): 0.8 for s in range(1, 6)}, **{("lstm-srnn", s): 0.65 for s in range(1, 6)},
        ("lstm-gates", 1): None, ("lstm-srnn-out", 1): 0.8}
WITHOUT_SCORES = {("lstm-srnn-out", 1)}


def answers(cell: str, seed: int) -> list[int]:
    """1 = the sentence was classified right."""
    if RUNS[(cell, seed)] is None:  # lstm-gates: lstm seed 1, three answers flipped
        out = answers("lstm", 1)
        for i in (0, 1, 2):
            out[i] = 1 - out[i]
        return out
    rng = random.Random(f"{cell}/{seed}")
    return [int(rng.random() < RUNS[(cell, seed)]) for _ in range(ITEMS)]


def make_tree(root: Path) -> Path:
    """Write the recipe (``root/sig.yaml``) and the runs (``root/runs``); returns the runs."""
    from lstmablate.recipes import resolve_config
    from lstmablate.run.scores import reference_digest
    from lstmablate.task import get_task

    root.mkdir(parents=True, exist_ok=True)
    recipe = root / "sig.yaml"
    recipe.write_text(RECIPE)
    gold = [random.Random(7 + i).randint(0, 1) for i in range(ITEMS)]
    for (cell, seed) in RUNS:
        cfg = resolve_config(get_task("sst"), cell, recipe=str(recipe), seed=seed)
        run = root / "runs" / "sig" / cell / f"seed-{seed}"
        run.mkdir(parents=True)
        d = cfg.to_dict()
        d["recipe_file"] = "sig.yaml"  # relative: the report reads it from the current folder
        RunFiles(run).config.write_text(yaml.safe_dump(d, sort_keys=False))
        right = answers(cell, seed)
        accuracy = 100.0 * sum(right) / ITEMS
        test = {"accuracy": accuracy, "loss": 0.5, "sentences": float(ITEMS)}
        result = {"task": "sst", "cell": cell, "experiment": "sig", "seed": seed,
                  "recipe": cfg.recipe, "primary": "accuracy", "higher_is_better": True,
                  "best": {"step": 10, "epoch": 1, "dev": {"accuracy": 75.0, "loss": 0.6}},
                  "test": test, "test_checkpoint": "best", "steps": 100, "epochs": 10,
                  "train_time_s": 60.0 + seed, "wall_time_s": 61.0 + seed, "params": 1000}
        RunFiles(run).result.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
        if (cell, seed) in WITHOUT_SCORES:
            continue
        header = {"scores": 1, "task": "sst", "experiment": "sig", "cell": cell, "seed": seed,
                  "split": "test", "checkpoint": "best", "metrics": test, "items": ITEMS,
                  "reference": reference_digest([str(g) for g in gold])}
        records = [{"id": i, "gold": g, "pred": g if ok else 1 - g, "correct": ok, "nll": 0.5}
                   for i, (g, ok) in enumerate(zip(gold, right))]
        (run / RunFiles.SCORES).mkdir()
        write_record_text(RunFiles(run).scores("test"),
                          "".join(json.dumps(x) + "\n" for x in [header, *records]))
    return root / "runs"


#: the runs of the small tree (cut_to_small): two seeds of each side (paired by seed; too few
#: for ASO)
SMALL = (("lstm", 1), ("lstm", 2), ("lstm-srnn", 1), ("lstm-srnn", 2))


def cut_to_small(runs: Path) -> None:
    """The runs :func:`make_tree` wrote cut to :data:`SMALL`, each with a ``metrics.jsonl`` of
    two evaluations as the trainer writes them (for ``plot``): the fewest runs with which
    report, compare, plot and ``report --significance`` (the paired tests) all run."""
    for (cell, seed) in RUNS:
        run = runs / "sig" / cell / f"seed-{seed}"
        if (cell, seed) not in SMALL:
            shutil.rmtree(run)
            continue
        RunFiles(run).metrics.write_text("".join(json.dumps(
            {"step": 10 * e, "epoch": e, "lr": 0.01, "train_loss": 1.0 / e, "split": "dev",
             "accuracy": 60.0 + e, "loss": 0.7 - 0.1 * e}, sort_keys=True) + "\n" for e in (1, 2)))
    for cell in ("lstm-gates", "lstm-srnn-out"):
        (runs / "sig" / cell).rmdir()


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """The folder of :func:`make_tree`'s recipe and runs, written once per test module."""
    root = tmp_path_factory.mktemp("sig")
    make_tree(root)
    return root


@pytest.fixture(scope="module")
def small_tree(tree, tmp_path_factory) -> Path:
    """A copy of ``tree`` cut to the small tree (:func:`cut_to_small`)."""
    root = tmp_path_factory.mktemp("small") / "t"
    shutil.copytree(tree, root)
    cut_to_small(root / "runs")
    return root


@pytest.fixture
def small_runs(small_tree, tmp_path, monkeypatch) -> Path:
    """A fresh copy of the small tree (runs/ and the recipe sig.yaml) to damage, with the task
    registry read once (each command in-process would read the installed entry points again)."""
    from lstmablate import task as task_module

    eps = task_module._entry_points()
    monkeypatch.setattr(task_module, "_entry_points", lambda: eps)
    root = tmp_path / "t"
    shutil.copytree(small_tree, root)
    return root


if __name__ == "__main__":  # pragma: no cover - a helper for regenerating the golden files
    print(make_tree(Path(sys.argv[1])))
