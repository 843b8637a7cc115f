"""A grid's choice (lstmablate.results.grid) and the page table that shows it (``pages grid``):
the best validation number wins, ties go to the base value, a diverged run never wins, and a
recipe whose rate is not its grid's choice cannot be shown."""

from __future__ import annotations

import json
import math
import re
import shutil

import pytest
import yaml

from lstmablate.results.grid import choose, pooled, shown, dev_of_tested_model
from lstmablate.run.runs import RunFiles

from test_pages import RECORDS, pages, pages_markers, pages_tables


@pytest.fixture(autouse=True)
def _fresh_records():
    """Each test's records are read anew (the generator reads a folder once per process, by
    its name, and every test here names its own tmp_path/records)."""
    pages_tables._finished.cache_clear()
    yield
    pages_tables._finished.cache_clear()


def test_the_best_validation_number_wins_in_the_metric_s_direction():
    assert choose({0.5: 120.0, 1.0: 115.9, 2.0: 131.2}, higher_is_better=False) == 1.0
    assert choose({0.5: 120.0, 1.0: 115.9, 2.0: 101.0}, higher_is_better=False) == 2.0
    assert choose({0.001: 80.1, 0.002: 81.9, 0.004: 82.3}, higher_is_better=True) == 0.004


def test_a_run_is_compared_by_the_validation_number_of_the_model_it_tests():
    evaluations = [{"epoch": 1, "ppl": 157.76}, {"epoch": 2, "ppl": 145.94},
                   {"epoch": 3, "lr": 1.0}, {"epoch": 13, "ppl": 197.99}]
    best = {"ppl": 145.94, "nll": 4.98}
    # the best checkpoint tested: its number; the last model tested: the last evaluation's
    assert dev_of_tested_model("ppl", "best", best, lambda: evaluations) == 145.94
    assert dev_of_tested_model("ppl", "last", best, lambda: evaluations) == 197.99
    assert dev_of_tested_model("ppl", "last", best, lambda: evaluations[:3]) == 145.94  # (a line without it)
    assert math.isnan(dev_of_tested_model("ppl", "last", best, list))
    assert math.isnan(dev_of_tested_model("bleu", "best", best, lambda: evaluations))
    assert math.isnan(dev_of_tested_model("ppl", "best", None, lambda: evaluations))


def test_a_tie_keeps_the_value_nearest_the_base_then_the_lower():
    # 0.005 and 0.02 are each a factor 2 from 0.01: equally near, the lower wins
    assert choose({0.005: 79.24, 0.01: 78.0, 0.02: 79.24}, True, base=0.01) == 0.005
    assert choose({0.005: 79.24, 0.01: 79.24, 0.02: 79.24}, True, base=0.01) == 0.01
    # nearness is by ratio: 0.02 is nearer 0.01 than 0.0025 is (x2 against /4)
    assert choose({0.0025: 79.0, 0.01: 70.0, 0.02: 79.0}, True, base=0.01) == 0.02
    assert choose({0.0025: 79.0, 0.02: 79.0}, True) == 0.0025  # no base: the lower


def test_a_diverged_run_is_never_chosen():
    assert choose({0.5: 140.0, 1.0: math.inf, 2.0: math.nan}, False) == 0.5
    assert choose({0.5: math.nan, 1.0: 50.0}, True) == 1.0
    with pytest.raises(ValueError, match="no value of the grid has a finite"):
        choose({1.0: math.nan, 2.0: math.inf}, False)
    with pytest.raises(ValueError, match="empty grid"):
        choose({}, True)


def test_a_rate_over_several_points_is_chosen_by_its_mean():
    """One rate for m = 4, 6 and 8: the mean of its three dev losses (hand-computed), and a
    rate whose run diverged at one m is never chosen however good the others are."""
    means = pooled({0.0005: [0.01, 0.07, 0.13], 0.001: [0.0001, 0.06, 0.12],
                    0.002: [0.0, 0.05, math.nan]})
    assert means[0.0005] == pytest.approx(0.07, rel=1e-12)  # (0.01 + 0.07 + 0.13) / 3
    assert means[0.001] == pytest.approx((0.0001 + 0.06 + 0.12) / 3, rel=1e-12)
    assert math.isnan(means[0.002]) and math.isnan(pooled({1.0: []})[1.0])
    assert choose(means, higher_is_better=False, base=0.001) == 0.001


def test_a_loss_is_shown_to_the_decimal_where_rates_differ():
    assert (shown(1.09123), shown(1.0899), shown(79.7), shown(115.912)) == (
        "1.0912", "1.0899", "79.70", "115.91")


# -- pages grid ---------------------------------------------------------------------------------
SOURCE = RECORDS / "sst2-bilstm-max-cpu" / "sru" / "seed-1"


def grid_records(tmp_path, dev: dict[float, float], cell: str = "sru",
                 experiments: str = "g-lr") -> None:
    """A grid of one cell over train.lr under tmp_path/records: a real SST record of the cell
    copied into one experiment per rate (``experiments`` + the rate), its rate and best dev
    accuracy set to ``dev``'s."""
    for lr, accuracy in dev.items():
        experiment = f"{experiments}{lr:g}"
        run = tmp_path / "records" / experiment / cell / "seed-1"
        shutil.copytree(SOURCE.parents[1] / cell / "seed-1", run)
        config = yaml.safe_load((run / RunFiles.CONFIG).read_text(encoding="utf-8"))
        config["experiment"], config["train"]["lr"] = experiment, lr
        (run / RunFiles.CONFIG).write_text(yaml.safe_dump(config), encoding="utf-8")
        res = json.loads((run / RunFiles.RESULT).read_text(encoding="utf-8"))
        res["experiment"] = experiment
        res["best"]["dev"]["accuracy"] = accuracy
        res["test"]["accuracy"] = accuracy - 1
        (run / RunFiles.RESULT).write_text(json.dumps(res), encoding="utf-8")


COMMAND = ("pages grid records --table g-lr0.005 --table g-lr0.01 --table g-lr0.02 --cells sru "
           "--by train.lr --base 0.01 --base-name \"the LSTM's\"")


def test_the_grid_table_shows_each_rate_s_dev_number_and_the_choice(tmp_path, monkeypatch):
    grid_records(tmp_path, {0.005: 78.5, 0.01: 79.25, 0.02: 80.75})
    monkeypatch.chdir(tmp_path)
    lines = pages.render(COMMAND).splitlines()
    assert lines[0] == ("| cell | lr 0.005: dev / test accuracy | lr 0.01 (the LSTM's): dev / "
                        "test accuracy | lr 0.02: dev / test accuracy | chosen lr |")
    assert lines[2] == "| `sru` | 78.50 / 77.50 | 79.25 / 78.25 | **80.75** / 79.75 | 0.02 |"
    assert lines[-1].startswith("Machine (from the runs' `env.json`): ")


def test_the_grid_table_shows_another_test_metric_where_asked(tmp_path, monkeypatch):
    """--test: the choice stays the validation one's; the test column is the named metric
    (NMT: chosen by validation perplexity, tested in BLEU)."""
    grid_records(tmp_path, {0.005: 78.5, 0.01: 79.25, 0.02: 80.75})
    for lr, loss in ((0.005, 0.61), (0.01, 0.6), (0.02, 0.7)):
        run = tmp_path / "records" / f"g-lr{lr:g}" / "sru" / "seed-1"
        res = json.loads((run / RunFiles.RESULT).read_text(encoding="utf-8"))
        res["test"]["loss"] = loss
        (run / RunFiles.RESULT).write_text(json.dumps(res), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    lines = pages.render(COMMAND + " --test loss").splitlines()
    assert lines[0] == ("| cell | lr 0.005: dev accuracy / test loss | lr 0.01 (the LSTM's): dev "
                        "accuracy / test loss | lr 0.02: dev accuracy / test loss | chosen lr |")
    assert lines[2] == "| `sru` | 78.50 / 0.61 | 79.25 / 0.60 | **80.75** / 0.70 | 0.02 |"
    assert pages.render(COMMAND + " --test nonsense").splitlines()[2] == (
        "| `sru` | 78.50 / — | 79.25 / — | **80.75** / — | 0.02 |")


def test_a_run_that_tests_its_last_model_is_shown_and_chosen_by_its_last_evaluation(
        tmp_path, monkeypatch):
    """0.02's best dev accuracy (80.75) came early and its last model, the one tested, fell to
    76.00: the grid shows and compares 76.00, and 0.01 (79.25 at the end) is chosen."""
    grid_records(tmp_path, {0.005: 78.5, 0.01: 79.25, 0.02: 80.75})
    for lr, last in ((0.005, 78.5), (0.01, 79.25), (0.02, 76.0)):
        run = tmp_path / "records" / f"g-lr{lr:g}" / "sru" / "seed-1"
        res = json.loads((run / RunFiles.RESULT).read_text(encoding="utf-8"))
        res["test_checkpoint"] = "last"
        (run / RunFiles.RESULT).write_text(json.dumps(res), encoding="utf-8")
        lines = (run / RunFiles.METRICS).read_text(encoding="utf-8").splitlines()
        final = json.loads(lines[-1])
        final["accuracy"] = last
        (run / RunFiles.METRICS).write_text("\n".join(lines[:-1] + [json.dumps(final)]) + "\n",
                                            encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    lines = pages.render(COMMAND).splitlines()
    assert lines[2] == "| `sru` | 78.50 / 77.50 | **79.25** / 78.25 | 76.00 / 79.75 | 0.01 |"


def test_a_grid_point_copied_from_its_twin_is_named_under_the_table(tmp_path, monkeypatch):
    grid_records(tmp_path, {0.005: 78.5, 0.01: 79.25, 0.02: 80.75})
    twin = {"of": {"experiment": "main", "cell": "sru", "seed": 1, "recipe": "main"},
            "copied": "2026-11-29T04:00:00+0000"}
    (tmp_path / "records" / "g-lr0.01" / "sru" / "seed-1" / RunFiles.TWIN).write_text(
        json.dumps(twin), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    lines = pages.render(COMMAND).splitlines()
    assert lines[2] == "| `sru` | 78.50 / 77.50 | 79.25 / 78.25 | **80.75** / 79.75 | 0.02 |"
    assert lines[4] == ("Copied, not trained again, from a run with the same settings trained for "
                        "another experiment (its `twin.json`; the copy holds all of that run's "
                        "records): `sru` at lr 0.01 (trained as `main/sru/seed-1`).")
    assert lines[-1].startswith("Machine (from the runs' `env.json`): ")


def test_a_cell_missing_a_rate_of_the_grid_has_no_choice(tmp_path, monkeypatch):
    grid_records(tmp_path, {0.005: 78.5, 0.01: 79.25, 0.02: 80.75})
    grid_records(tmp_path, {0.005: 77.0, 0.01: 76.5}, cell="qrnn")  # its 0.02: still to run
    monkeypatch.chdir(tmp_path)
    lines = pages.render(COMMAND.replace("--cells sru", "--cells qrnn,sru")).splitlines()
    assert lines[2] == "| `qrnn` | 77.00 / 76.00 | 76.50 / 75.50 | — | grid incomplete |"
    assert lines[3] == "| `sru` | 78.50 / 77.50 | 79.25 / 78.25 | **80.75** / 79.75 | 0.02 |"


def test_a_rate_the_grid_s_recipe_lists_and_no_run_has_yet_leaves_the_grid_incomplete(
        tmp_path, monkeypatch):
    grid_records(tmp_path, {0.005: 78.5, 0.01: 79.25})  # the recipe's 0.02: still to run
    for run in (tmp_path / "records").glob("g-lr*/sru/seed-1"):
        config = yaml.safe_load((run / RunFiles.CONFIG).read_text(encoding="utf-8"))
        config["recipe"] = "simpler-recurrences-sst2-cpu-lr"  # grid: train.lr [0.005, 0.01, 0.02]
        (run / RunFiles.CONFIG).write_text(yaml.safe_dump(config), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    lines = pages.render(COMMAND.replace(" --table g-lr0.02", "").replace(
        "--cells sru", "--cells sru,qrnn")).splitlines()
    assert lines[0].endswith("| lr 0.02: dev / test accuracy | chosen lr |")
    assert lines[2] == "| `sru` | 78.50 / 77.50 | 79.25 / 78.25 | — | grid incomplete |"
    assert lines[3] == "| `qrnn` | — | — | — | grid incomplete |"  # no run yet


def test_a_recipe_that_does_not_make_its_grid_s_choice_is_named(tmp_path, monkeypatch):
    """simpler-recurrences-sst2-cpu gives sru the LSTM's 0.01 unless its grid chose otherwise:
    a grid that chooses 0.02 cannot be shown beside it."""
    rate = pages_tables_rate("simpler-recurrences-sst2-cpu", "sru")
    other = 0.02 if rate != 0.02 else 0.005
    grid_records(tmp_path, {0.005: 78.5, 0.01: 79.25, 0.02: 80.75} if other == 0.02
                 else {0.005: 81.0, 0.01: 79.25, 0.02: 80.75})
    monkeypatch.chdir(tmp_path)
    with pytest.raises(pages_markers.PageError, match=re.escape(
            f"recipe simpler-recurrences-sst2-cpu gives `sru` train.lr = {rate:g}, but its grid "
            f"chooses {other:g}")) as e:
        pages.render(COMMAND + " --recipe simpler-recurrences-sst2-cpu")
    assert "recipes/simpler-recurrences-sst2-cpu.yaml" in str(e.value)


def pages_tables_rate(recipe: str, cell: str) -> float:
    from lstmablate.recipes import load_recipe
    from lstmablate.results.experiments import Expectations
    return Expectations.of(load_recipe(recipe)[1]).lr[cell]


@pytest.mark.parametrize("extra, named", [
    ("--by train.lr --recipe simpler-recurrences-sst2-cpu --by model.hidden_size",
     "--recipe checks a recipe's learning rates"),
    ("--by train.nonsense", "has no number at train.nonsense"),
])
def test_a_grid_marker_that_cannot_be_rendered_is_named(tmp_path, monkeypatch, extra, named):
    grid_records(tmp_path, {0.005: 78.5, 0.01: 79.25})
    monkeypatch.chdir(tmp_path)
    with pytest.raises(pages_markers.PageError, match=re.escape(named)):
        pages.render("pages grid records --table g-lr0.005 --table g-lr0.01 --cells sru " + extra)


# -- the report's note ---------------------------------------------------------------------------
def test_the_report_of_a_rate_grid_names_each_complete_cell_s_choice(tmp_path):
    """`lstmablate report --table simpler-recurrences-sst2-cpu-lr`: a cell with a run at every
    rate gets the grid's choice (a tie at the top goes to the LSTM's 0.01, the recipe's rate);
    a cell missing a rate gets none."""
    from lstmablate.results.report import build_report
    base = "sst2-bilstm-max-cpu-simpler-lr"
    grid_records(tmp_path, {0.005: 79.5, 0.01: 79.5, 0.02: 78.0}, experiments=base)
    grid_records(tmp_path, {0.005: 77.0, 0.01: 77.5}, cell="qrnn", experiments=base)
    report = build_report(tmp_path / "records", table="simpler-recurrences-sst2-cpu-lr")
    notes = [n for t in report.tables for n in t.notes if "rate grid" in n]
    assert notes == ["`sru`: the rate grid (seed 1) chooses lr 0.01, the best dev accuracy "
                     "(79.50; 0.005: 79.50, 0.01: 79.50, 0.02: 78.00)"]


# -- a grid over the rate and another setting (the Dyck report's m) ----------------------------
DYCK = RECORDS / "dyck-report-m4" / "sru" / "seed-1"
DYCK_GRID = "dyck-report-simpler"  # simpler-recurrences-dyck-report-lr's experiment


def dyck_grid_records(tmp_path, dev: dict[tuple[float, int], float], cell: str = "sru",
                      recipe: str | None = None) -> None:
    """Real Dyck-report records of ``cell`` copied into the points of the rate x m grid
    (``dyck-report-simpler-m<m>-lr<lr>``), each run's rate, m, best dev loss and test loss
    (dev + 0.01) set to ``dev``'s; with ``recipe``, the recipe each run names (a grid of other
    values than the rate grid's recipe lists names one without a grid: ``dyck``)."""
    for (lr, m), loss in dev.items():
        experiment = f"{DYCK_GRID}-m{m}-lr{lr:g}"
        run = tmp_path / "records" / experiment / cell / "seed-1"
        shutil.copytree(DYCK, run)
        config = yaml.safe_load((run / RunFiles.CONFIG).read_text(encoding="utf-8"))
        config["experiment"], config["cell"] = experiment, cell
        config["train"]["lr"], config["data"]["m"] = lr, m
        if recipe is not None:
            config["recipe"] = recipe
        (run / RunFiles.CONFIG).write_text(yaml.safe_dump(config), encoding="utf-8")
        res = json.loads((run / RunFiles.RESULT).read_text(encoding="utf-8"))
        res["experiment"], res["cell"] = experiment, cell
        res["best"]["dev"]["loss"], res["test"]["loss"] = loss, loss + 0.01
        (run / RunFiles.RESULT).write_text(json.dumps(res), encoding="utf-8")


OVER = ("pages grid records " + " ".join(f"--table {DYCK_GRID}-m{m}-lr{lr}" for m in (4, 8)
                                         for lr in ("0.0005", "0.001"))
        + " --cells qrnn,sru --by train.lr --over data.m --base 0.001")


def test_a_grid_over_m_gives_each_cell_one_rate_by_the_mean_over_m(tmp_path, monkeypatch):
    """sru is best at m = 8 with 0.0005 and at m = 4 with 0.001; the mean over m chooses
    0.0005 ((0.02 + 0.10) / 2 = 0.06 against (0.01 + 0.13) / 2 = 0.07); qrnn lacks a point."""
    dyck_grid_records(tmp_path, {(0.0005, 4): 0.02, (0.0005, 8): 0.10,
                                 (0.001, 4): 0.01, (0.001, 8): 0.13}, recipe="dyck")
    dyck_grid_records(tmp_path, {(0.0005, 4): 0.05, (0.001, 4): 0.04, (0.001, 8): 0.2},
                      cell="qrnn", recipe="dyck")
    monkeypatch.chdir(tmp_path)
    lines = pages.render(OVER).splitlines()
    assert lines[0] == ("| cell | m | lr 0.0005: dev / test loss | lr 0.001 (base): dev / test "
                        "loss | chosen lr |")
    assert lines[2:9] == [
        "| `qrnn` | 4 | 0.0500 / 0.0600 | 0.0400 / 0.0500 |  |",
        "| `qrnn` | 8 | — | 0.2000 / 0.2100 |  |",
        "| `qrnn` | mean over m | — | — | grid incomplete |",
        "| `sru` | 4 | 0.0200 / 0.0300 | 0.0100 / 0.0200 |  |",
        "| `sru` | 8 | 0.1000 / 0.1100 | 0.1300 / 0.1400 |  |",
        "| `sru` | mean over m | **0.0600** / 0.0700 | 0.0700 / 0.0800 | 0.0005 |",
        ""]


def test_a_recipe_that_does_not_make_the_mean_s_choice_is_named(tmp_path, monkeypatch):
    """simpler-recurrences-dyck-report gives sru one rate for every m: a grid whose mean over
    m chooses another cannot be shown beside it."""
    rate = pages_tables_rate("simpler-recurrences-dyck-report", "sru")
    other = 0.0005 if rate != 0.0005 else 0.001
    dyck_grid_records(tmp_path, {(lr, m): (0.01 if lr == other else 0.05)
                                 for lr in (0.0005, 0.001) for m in (4, 8)}, recipe="dyck")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(pages_markers.PageError, match=re.escape(
            f"gives `sru` train.lr = {rate:g}, but its grid chooses {other:g} (best mean dev "
            "loss over m 0.0100)")):
        pages.render(OVER + " --recipe simpler-recurrences-dyck-report")


def test_the_report_of_a_rate_grid_over_m_names_the_mean_s_choice(tmp_path):
    """`lstmablate report --table simpler-recurrences-dyck-report-lr`: nine experiments (three
    rates x three m); a cell with one run in each gets the rate of the best mean dev loss."""
    from lstmablate.results.report import build_report
    losses = {0.0005: (0.002, 0.08, 0.12), 0.001: (0.0001, 0.07, 0.14), 0.002: (0.01, 0.09, 0.1)}
    dyck_grid_records(tmp_path, {(lr, m): loss for lr, row in losses.items()
                                 for m, loss in zip((4, 6, 8), row)})
    report = build_report(tmp_path / "records", table="simpler-recurrences-dyck-report-lr")
    notes = [n for t in report.tables for n in t.notes if "rate grid" in n]
    # means: 0.0673, 0.0700, 0.0667 -> 0.002
    assert notes == ["`sru`: the rate grid (seed 1) chooses lr 0.002, the best dev loss (mean "
                     "over the 3 runs at each rate: 0.0667; 0.0005: 0.0673, 0.001: 0.0700, "
                     "0.002: 0.0667)"]


def test_a_grid_point_with_no_finished_run_has_the_columns_of_the_others(tmp_path):
    """`report --table simpler-recurrences-nmt-multi30k-cpu-lr` with one run (lr 0.5): the
    rates with no finished run show the columns the run decided (test BLEU, sacreBLEU, val
    BLEU), not every metric of the task (NMT's teacher-forced perplexity, which it computes
    only to select checkpoints)."""
    from lstmablate.results.report import build_report
    experiment = "nmt-multi30k-cpu-simpler-lr0.5"
    shutil.copytree(RECORDS / experiment / "minlstm" / "seed-1",
                    tmp_path / "records" / experiment / "minlstm" / "seed-1")
    report = build_report(tmp_path / "records", table="simpler-recurrences-nmt-multi30k-cpu-lr")
    [table] = report.tables
    by_group: dict[str, list[tuple[str, str]]] = {}
    for column in table.columns:
        by_group.setdefault(column.group, []).append((column.metric.name, column.section))
    assert sorted(by_group) == ["lr=0.5", "lr=1.0", "lr=2.0"]
    assert by_group["lr=0.5"] == [("bleu", "test"), ("sacrebleu", "test"), ("bleu", "dev_final")]
    assert by_group["lr=1.0"] == by_group["lr=0.5"] == by_group["lr=2.0"]
