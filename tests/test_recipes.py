"""Recipes with `base:` inheritance: a recipe lists only what differs from the one it extends,
and every shipped recipe resolves to the configuration it had before it was shortened."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lstmablate.errors import ConfigError, UnknownNameError
from lstmablate.recipes import available_recipes, grid_points, load_recipe, recipe_seeds, resolve_config
from lstmablate.task import get_task

BASE = """\
task: dyck
experiment: parent
description: the parent
data: {k: 2, m: 4, batch_size: 16}
model: {embedding_dim: 8, hidden_size: 8}
train: {optimizer: adam, lr: 0.02, max_epochs: 2, stop_at: 0.5}
cells: [lstm, lstm-srnn]
seeds: [1, 2]
reference: {lstm: {accuracy: 99.0}, lstm-srnn: {accuracy: 98.0}}
grid: {data.m: [3, 4]}
"""


def write(folder: Path, name: str, text: str) -> Path:
    p = folder / f"{name}.yaml"
    p.write_text(text)
    return p


def test_a_child_lists_only_what_differs(tmp_path):
    write(tmp_path, "parent", BASE)
    child = write(tmp_path, "child", "base: parent\ndescription: the child\n"
                                     "train: {lr: 0.01, stop_at: null}\n"
                                     "reference: {lstm: {accuracy: 97.0}}\n"
                                     "grid: null\nseeds: [3]\n")
    name, r = load_recipe(str(child))
    assert name == "child" and "experiment" not in r  # never inherited: its own runs folder
    assert r["description"] == "the child" and r["task"] == "dyck"
    assert r["data"] == {"k": 2, "m": 4, "batch_size": 16}  # inherited whole
    assert r["train"] == {"optimizer": "adam", "lr": 0.01, "max_epochs": 2, "stop_at": None}
    assert r["reference"] == {"lstm": {"accuracy": 97.0}}  # not a config section: replaced
    assert "grid" not in r and r["seeds"] == [3] and r["cells"] == ["lstm", "lstm-srnn"]
    cfg = resolve_config(get_task("dyck"), "lstm", recipe=str(child))
    assert cfg.experiment == "child" and cfg.train.lr == 0.01 and cfg.train.stop_at is None
    assert cfg.data.m == 4 and cfg.seed == 3
    assert [e for e, _, _ in grid_points(name, r)] == ["child"]
    parent = resolve_config(get_task("dyck"), "lstm", recipe=str(tmp_path / "parent.yaml"))
    assert parent.experiment == "parent" and parent.train.stop_at == 0.5


def test_chains_paths_and_shipped_bases(tmp_path):
    write(tmp_path, "parent", BASE)
    write(tmp_path, "middle", "base: parent\nmodel: {hidden_size: 16}\n")
    (tmp_path / "sub").mkdir()
    leaf = write(tmp_path / "sub", "leaf", "base: ../middle.yaml\nmodel: {embedding_dim: 4}\n")
    _, r = load_recipe(str(leaf))
    assert r["model"] == {"embedding_dim": 4, "hidden_size": 16}
    shipped = write(tmp_path, "mine", "base: dyck-demo\ntrain: {max_epochs: 1}\n")
    _, r = load_recipe(str(shipped))
    _, demo = load_recipe("dyck-demo")
    assert r["train"] == {**demo["train"], "max_epochs": 1} and r["cells"] == demo["cells"]


def test_bad_bases_are_messages(tmp_path):
    write(tmp_path, "a", "base: b\ntask: dyck\n")
    write(tmp_path, "b", "base: a\n")
    with pytest.raises(ConfigError, match=r"extend each other in a circle \(a -> b -> a\)"):
        load_recipe(str(tmp_path / "a.yaml"))
    write(tmp_path, "c", "base: no-such-recipe\n")
    with pytest.raises(ConfigError, match=r"c.yaml: its base unknown recipe 'no-such-recipe'"):
        load_recipe(str(tmp_path / "c.yaml"))
    write(tmp_path, "d", "base: 3\ntask: dyck\n")
    with pytest.raises(ConfigError, match="`base` names the recipe this one extends"):
        load_recipe(str(tmp_path / "d.yaml"))
    write(tmp_path, "e", "task: dyck\nbogus: 1\n")
    write(tmp_path, "f", "base: e\n")
    with pytest.raises(UnknownNameError, match=r"top-level key in recipe .*e.yaml"):
        load_recipe(str(tmp_path / "f.yaml"))


SNAPSHOT = Path(__file__).parent / "fixtures" / "resolved_recipes.json"


def resolved(name: str) -> dict:
    """What a shipped recipe means: per cell and grid point, the resolved config and seeds;
    the recipe's sweep and report metadata."""
    _, r = load_recipe(name)
    if "task" not in r:
        return {"table": r["table"]}
    task = get_task(r["task"])
    out = {k: r.get(k) for k in ("description", "cells", "reference", "reference_source", "grid",
                                 "table", "cell_seeds", "seeds")}
    out["configs"] = {}
    for cell in r.get("cells") or ["lstm"]:
        for experiment, overrides, _ in grid_points(name, r):
            cfg = resolve_config(task, cell, recipe=name, overrides=overrides, experiment=experiment)
            d = cfg.to_dict()
            d.pop("recipe_file", None)
            out["configs"][f"{cell}|{experiment}"] = {"config": d, "seeds": recipe_seeds(r, cell)}
    return json.loads(json.dumps(out, default=str))


@pytest.mark.parametrize("name", sorted(json.loads(SNAPSHOT.read_text())) if SNAPSHOT.exists()
                         else [])
def test_every_shipped_recipe_resolves_as_before(name):
    """The snapshot was taken before the recipes were shortened with `base:`; regenerate it
    (python tests/fixtures/resolved_recipes.py) only for a change meant to alter a recipe."""
    assert name in available_recipes()
    assert resolved(name) == json.loads(SNAPSHOT.read_text())[name]


def test_the_snapshot_covers_every_shipped_recipe():
    assert SNAPSHOT.exists(), "regenerate it: python tests/fixtures/resolved_recipes.py"
    assert sorted(json.loads(SNAPSHOT.read_text())) == sorted(available_recipes())
