"""A report names the cells whose runs were trained at another learning rate than their
recipe gives them now (e.g. −GATES's PTB-medium rate, chosen after its run was made); a
grid point or a probe experiment, which sets its own rate, is not flagged."""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from lstmablate.results.report import build_report
from lstmablate.run.runs import RunFiles

RECORD = (Path(__file__).resolve().parents[1] / "experiments" / "results" / "ptb-medium"
          / "lstm-gates" / "seed-1")


def _notes(root: Path) -> list[str]:
    return [n for t in build_report(root).tables for n in t.notes if "recipe now gives" in n]


def _copy(root: Path, experiment: str, lr: float) -> Path:
    run = root / experiment / "lstm-gates" / "seed-1"
    shutil.copytree(RECORD, run)
    cfg = yaml.safe_load((run / RunFiles.CONFIG).read_text())
    cfg["experiment"], cfg["train"]["lr"] = experiment, lr
    (run / RunFiles.CONFIG).write_text(yaml.safe_dump(cfg))
    return run


def test_a_rate_other_than_the_recipes_is_named(tmp_path):
    recipe_lr = yaml.safe_load((Path(__file__).resolve().parents[1] / "recipes" / "ptb-medium.yaml"
                                ).read_text())["cell_overrides"]["lstm-gates"]["train"]["lr"]
    _copy(tmp_path / "a", "ptb-medium", 0.1)
    assert _notes(tmp_path / "a") == [f"`lstm-gates`: 1 of its 1 run trained at lr 0.1; its "
                                      f"recipe now gives it {recipe_lr:g}"]
    _copy(tmp_path / "b", "ptb-medium", recipe_lr)
    assert _notes(tmp_path / "b") == []
    _copy(tmp_path / "c", "ptb-medium-lstm-gates-lr0.1", 0.1)  # a probe: its own rate
    assert _notes(tmp_path / "c") == []


FORMED = RECORD.parents[2] / "simpler-recurrences-dyck-demo" / "minlstm" / "seed-1"


def _forms(root: Path) -> list[str]:
    return [n for t in build_report(root).tables for n in t.notes if "cell_options" in n]


def test_a_form_other_than_the_recipes_is_named(tmp_path):
    """minLSTM's recipe gives it the log-space form (model.cell_options {mode: log}): a run
    made in the plain form is named, a run in the recipe's form is not."""
    for name, options in (("plain", {}), ("log", {"mode": "log"})):
        run = tmp_path / name / "simpler-recurrences-dyck-demo" / "minlstm" / "seed-1"
        shutil.copytree(FORMED, run)
        cfg = yaml.safe_load((run / RunFiles.CONFIG).read_text())
        assert cfg["model"]["cell_options"] == {"mode": "log"}  # the record as trained
        cfg["model"]["cell_options"] = options
        (run / RunFiles.CONFIG).write_text(yaml.safe_dump(cfg))
    assert _forms(tmp_path / "plain") == ['`minlstm`: 1 of its 1 run trained with '
                                          'model.cell_options {}; its recipe now gives it '
                                          '{"mode": "log"}']
    assert _forms(tmp_path / "log") == []


def test_a_cell_another_recipe_trains_into_an_experiment_is_held_to_that_recipe(tmp_path):
    """The CPU parser's experiment is parsing-ewt-cpu's, whose recipe does not list minlstm:
    simpler-recurrences-parsing-ewt-cpu trains it there, and its form is that recipe's."""
    records = RECORD.parents[2] / "parsing-ewt-cpu"
    for cell in ("lstm", "minlstm"):
        shutil.copytree(records / cell / "seed-1", tmp_path / "parsing-ewt-cpu" / cell / "seed-1")
    run = tmp_path / "parsing-ewt-cpu" / "minlstm" / "seed-1"
    cfg = yaml.safe_load((run / RunFiles.CONFIG).read_text())
    cfg["model"]["cell_options"] = {}
    (run / RunFiles.CONFIG).write_text(yaml.safe_dump(cfg))
    assert _forms(tmp_path) == ['`minlstm`: 1 of its 1 run trained with model.cell_options '
                                '{}; its recipe now gives it {"mode": "log"}']
