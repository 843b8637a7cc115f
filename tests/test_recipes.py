"""Recipes with `base:` inheritance and named overlays: a recipe lists only what differs from the
one it extends, a CPU stand-in is its paper recipe plus a named overlay, ``cell_overrides``
merge key by key, ``list recipes --resolved`` says where each value came from, the Makefile's
``reproduce-*`` targets are derived from the table specs, and every shipped recipe resolves to
the configuration it had before it was shortened."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lstmablate.errors import ConfigError, UnknownNameError
from lstmablate.recipes import (available_recipes, explain_recipe, grid_points, load_recipe,
                                recipe_seeds, report_tables, resolve_config)
from lstmablate.task import get_task

from cli_in_process import run_cli

ROOT = Path(__file__).resolve().parents[1]

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


def test_an_overlay_is_a_named_change_applied_over_the_base(tmp_path):
    """A CPU stand-in = the paper recipe + a named overlay of what the scale changes: the
    overlay goes over the base's chain, the recipe's own keys over the overlay, and a null in
    the overlay removes what the base had."""
    write(tmp_path, "parent", BASE + "cell_overrides: {lstm-srnn: {train: {lr: 0.1}}}\n")
    (tmp_path / "overlays").mkdir()
    write(tmp_path / "overlays", "small", "model: {hidden_size: 4}\ntrain: {max_epochs: 1}\n"
                                          "reference: null\ncell_overrides: {lstm-srnn: null}\n")
    child = write(tmp_path, "child", "base: parent\noverlay: small\ntrain: {max_epochs: 3}\n")
    _, r = load_recipe(str(child))
    assert r["model"] == {"embedding_dim": 8, "hidden_size": 4}  # merged key by key
    assert r["train"]["max_epochs"] == 3 and r["train"]["lr"] == 0.02  # the recipe's own wins
    assert "reference" not in r and r["cell_overrides"] == {}  # removed by the overlay's nulls
    assert r["grid"] == {"data.m": [3, 4]} and r["cells"] == ["lstm", "lstm-srnn"]
    layers, rows = explain_recipe(str(child))
    assert [layer.source for layer in layers] == ["parent", "overlay small", "child"]
    where = {key: (value, source) for key, value, source in rows}
    assert where["model.hidden_size"] == (4, "overlay small")
    assert where["model.embedding_dim"] == (8, "parent")
    assert where["train.max_epochs"] == (3, "child") and where["task"] == ("dyck", "parent")
    # a path next to the recipe works too; an overlay named by a shipped recipe is found there
    write(tmp_path, "other", "base: parent\noverlay: overlays/small.yaml\n")
    assert load_recipe(str(tmp_path / "other.yaml"))[1]["model"]["hidden_size"] == 4
    _, sst = load_recipe("sst5-bilstm-max-cpu")
    assert sst["train"]["lr"] == 0.01 and sst["seeds"] == [1, 2, 3, 4, 5] and "cell_overrides" not in sst


def test_cell_overrides_merge_cell_by_cell_and_key_by_key(tmp_path):
    """A child adding one cell's override keeps its base's others (and the other keys of a
    cell it changes); `cell: null` removes one cell's; a field's null is its value."""
    write(tmp_path, "parent", BASE + "cell_overrides:\n"
                                     "  lstm: {model: {hidden_size: 6}, train: {lr: 0.1}}\n"
                                     "  lstm-srnn: {train: {lr: 0.3}}\n"
                                     "  lstm-gates: {train: {lr: 0.05}}\n")
    child = write(tmp_path, "child", "base: parent\ncell_overrides:\n"
                                     "  lstm: {train: {lr: 0.2, stop_at: null}}\n"
                                     "  lstm-gates: null\n"
                                     "  lstm-srnn-out: {model: {hidden_size: 12}}\n")
    _, r = load_recipe(str(child))
    assert r["cell_overrides"] == {
        "lstm": {"model": {"hidden_size": 6}, "train": {"lr": 0.2, "stop_at": None}},
        "lstm-srnn": {"train": {"lr": 0.3}},
        "lstm-srnn-out": {"model": {"hidden_size": 12}}}
    task = get_task("dyck")
    lstm = resolve_config(task, "lstm", recipe=str(child))
    assert (lstm.model.hidden_size, lstm.train.lr, lstm.train.stop_at) == (6, 0.2, None)
    assert resolve_config(task, "lstm-srnn", recipe=str(child)).train.lr == 0.3
    assert resolve_config(task, "lstm-gates", recipe=str(child)).train.lr == 0.02  # removed
    _, rows = explain_recipe(str(child))
    where = {key: source for key, _, source in rows}
    assert where["cell_overrides.lstm.model.hidden_size"] == "parent"
    assert where["cell_overrides.lstm.train.lr"] == "child"


def test_a_table_spec_merges_its_base_table_key_by_key(tmp_path):
    write(tmp_path, "paper", "table: {title: Paper, experiments: [dyck-demo], metrics: [wcpa_min],"
                             " cells: [lstm], labels: {dyck-demo: demo}}\n")
    write(tmp_path, "small", "base: paper\ntable: {title: Small, experiments: [dyck-report]}\n")
    _, r = load_recipe(str(tmp_path / "small.yaml"))
    assert r["table"] == {"title": "Small", "experiments": ["dyck-report"], "metrics": ["wcpa_min"],
                          "cells": ["lstm"], "labels": {"dyck-demo": "demo"}}


def test_bad_overlays_are_messages_naming_the_file(tmp_path):
    write(tmp_path, "parent", BASE)
    (tmp_path / "overlays").mkdir()
    cases = {
        "overlay: nowhere": r"unknown overlay in .*r.yaml 'nowhere'.*overlays/",
        "overlay: 3": "`overlay` names the overlay this recipe applies",
        "overlay: ./none.yaml": r"its overlay ./none.yaml does not exist",
        "overlay: named": r"key in overlay .*named.yaml 'task'.*its name, task, base and table "
                          "stay in the recipe",
        "overlay: listed": r"overlays/listed.yaml: an overlay must be a YAML mapping",
        "overlay: typed": r"overlays/typed.yaml: `seeds` must be a list of seeds",
        "overlay: fifo": r"its `overlay: fifo` cannot be used",
    }
    write(tmp_path / "overlays", "named", "task: dyck\n")
    write(tmp_path / "overlays", "listed", "[1, 2]\n")
    write(tmp_path / "overlays", "typed", "seeds: three\n")
    os.mkfifo(tmp_path / "overlays" / "fifo.yaml")
    for line, message in cases.items():
        write(tmp_path, "r", f"base: parent\n{line}\n")
        with pytest.raises(ConfigError, match=message):
            load_recipe(str(tmp_path / "r.yaml"))
        r = run_cli("train", "--task", "dyck", "--recipe", "r.yaml", "--out", "runs", cwd=tmp_path)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert "overlay" in r.stderr and not (tmp_path / "runs").exists()


def test_list_recipes_resolved_says_where_each_value_came_from(tmp_path):
    r = run_cli("list", "recipes", "--resolved", "secondorder-cut50-2layer-cpu", "--plain",
                cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    rows = [line.split("\t") for line in r.stdout.splitlines()]
    assert rows[0] == ["key", "value", "from"]
    where = {key: (value, source) for key, value, source in rows[1:]}
    assert where["cell_overrides.lstm.model.hidden_size"] == (
        "88", "overlay cpu-secondorder-char-2layer")
    assert where["data.max_chars"] == ("50", "secondorder-cut50-2layer")
    assert where["model.num_layers"] == ("2", "secondorder-char-2layer")
    assert where["cells"] == ("[lstm, mmlstm]", "secondorder-cut50-2layer")
    for args, message in [
            (("list", "cells", "--resolved", "ptb-small"), "goes with `lstmablate list recipes`"),
            (("list", "recipes", "--resolved", "no-such"), "unknown recipe 'no-such'")]:
        r = run_cli(*args, cwd=tmp_path)
        assert r.returncode == 2 and message in " ".join(r.stderr.split()), r.stderr


def make_n(*args: str, env: dict[str, str] | None = None) -> list[str]:
    """The commands `make -n ARGS` would run (the Python path and output folder left out)."""
    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed")
    r = subprocess.run([make, "-n", "-s", "-C", str(ROOT), f"PY={sys.executable}", *args],
                       capture_output=True,
                       text=True, env={**os.environ, **(env or {})}, check=True)
    return [line.split(" -m lstmablate ", 1)[1].replace(" --out runs --threads 2", "").strip()
            for line in r.stdout.splitlines() if " -m lstmablate " in line]


def test_make_reproduce_is_derived_from_the_table_specs(tmp_path):
    """`make reproduce-NAME` sweeps the table spec NAME and prints its table, or each table of
    a set of tables; CPU=1 takes NAME-cpu. The Makefile lists no recipe: a table spec added
    (here in $LSTMABLATE_RECIPES) is reproduced as the shipped ones are."""
    env = {"RUNS": "runs", "THREADS": "2", "SWEEP_ARGS": ""}
    assert make_n("reproduce-table1", env=env) == ["sweep table1", "report runs --table table1"]
    assert make_n("reproduce-table3", "CPU=1", env=env) == [
        "sweep table3-cpu", "report runs --table table3-cpu"]
    tables = ("secondorder-table2-char-cpu", "secondorder-table2-word-cpu", "secondorder-table3-cpu")
    assert make_n("reproduce-secondorder", "CPU=1", env=env) == ["sweep secondorder-cpu"] + [
        f"report runs --table {t}" for t in tables]
    assert report_tables("dyck") == ["dyck-report", "dyck-rnn-trainable"]
    write(tmp_path, "mine", "table: {experiments: [table1, dyck]}\n")
    assert make_n("reproduce-mine", env={**env, "LSTMABLATE_RECIPES": str(tmp_path)}) == [
        "sweep mine", "report runs --table table1", "report runs --table dyck"]
    text = (ROOT / "Makefile").read_text()
    assert "RECIPES_" not in text and "TABLES_" not in text


SNAPSHOT = Path(__file__).parent / "fixtures" / "resolved_recipes.json"
#: the one command that rewrites the snapshot (tests/fixtures/resolved_recipes.py)
REGENERATE = "make recipe-snapshot"


def resolved(name: str) -> dict:
    """What a shipped recipe means for its runs: per cell and grid point, the resolved config
    and seeds; its cells, seeds, grid, paper's numbers and table (a table spec: its table).
    The prose (description, reference_source) is left out: editing it changes no run."""
    _, r = load_recipe(name)
    if "task" not in r:
        return {"table": r["table"]}
    task = get_task(r["task"])
    out = {k: r.get(k) for k in ("cells", "reference", "grid", "table", "cell_seeds", "seeds")}
    out["configs"] = {}
    for cell in r.get("cells") or ["lstm"]:
        for experiment, overrides, _ in grid_points(name, r):
            cfg = resolve_config(task, cell, recipe=name, overrides=overrides, experiment=experiment)
            d = cfg.to_dict()
            d.pop("recipe_file", None)
            out["configs"][f"{cell}|{experiment}"] = {"config": d, "seeds": recipe_seeds(r, cell)}
    return json.loads(json.dumps(out, default=str))


def differences(before: object, now: object, key: str = "") -> list[str]:
    """One line per value that differs between two resolutions, named by its dotted key."""
    if isinstance(before, dict) and isinstance(now, dict):
        return [line for k in sorted(set(before) | set(now), key=str)
                for line in differences(before.get(k, "(absent)"), now.get(k, "(absent)"),
                                        f"{key}.{k}" if key else str(k))]
    return [] if before == now else [f"{key}: {before!r} in the snapshot, {now!r} now"]


@pytest.mark.parametrize("name", sorted(json.loads(SNAPSHOT.read_text())) if SNAPSHOT.exists()
                         else [])
def test_every_shipped_recipe_resolves_as_before(name):
    """Every run config of every shipped recipe (per cell, grid point and seed) is the one the
    snapshot holds: finished runs and users' run folders are matched by their resolved config,
    so a recipe edit that changes one would make `sweep` train them again.  A change meant to
    alter a recipe's runs is committed with the snapshot rewritten by one command,
    ``make recipe-snapshot`` (= python tests/fixtures/resolved_recipes.py), its diff showing
    what changed."""
    assert name in available_recipes()
    diff = differences(json.loads(SNAPSHOT.read_text())[name], resolved(name))
    assert not diff, (f"recipe {name} resolves differently from tests/fixtures/"
                      f"resolved_recipes.json ({len(diff)} values):\n  " + "\n  ".join(diff[:40])
                      + f"\nIf the change is meant, rewrite the snapshot: {REGENERATE}")


def test_the_snapshot_covers_every_shipped_recipe():
    assert SNAPSHOT.exists(), f"write it: {REGENERATE}"
    assert sorted(json.loads(SNAPSHOT.read_text())) == sorted(available_recipes()), \
        f"a recipe was added or removed: {REGENERATE}"


def test_a_changed_value_is_named_with_its_key():
    before = {"configs": {"lstm|x": {"config": {"train": {"lr": 0.3}}, "seeds": [1]}}}
    now = {"configs": {"lstm|x": {"config": {"train": {"lr": 0.2}}, "seeds": [1, 2]}}}
    assert differences(before, now) == [
        "configs.lstm|x.config.train.lr: 0.3 in the snapshot, 0.2 now",
        "configs.lstm|x.seeds: [1] in the snapshot, [1, 2] now"]
