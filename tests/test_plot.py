"""`lstmablate plot`: learning curves from metrics.jsonl (PNG + PDF + the CSV behind them)."""

from __future__ import annotations

import csv
import io
import json

import pytest
import yaml
from rich.console import Console

from lstmablate.errors import DataError, UnknownNameError, UserError
from lstmablate.results.plot import Curve, mean_curve, plot_runs
from lstmablate.run.record import read_metrics
from lstmablate.run.runs import RunFiles

QUIET = Console(file=io.StringIO())


def fake_run(root, experiment, cell, seed, records, task="dyck"):
    """A run folder as the trainer leaves it, as far as plotting reads it."""
    d = root / experiment / cell / f"seed-{seed}"
    d.mkdir(parents=True)
    RunFiles(d).config.write_text(yaml.safe_dump(
        {"task": task, "cell": cell, "experiment": experiment, "seed": seed}))
    RunFiles(d).metrics.write_text("".join(json.dumps(r) + "\n" for r in records))
    return d


def rec(step, epoch, loss, train_loss, accuracy=50.0):
    return {"step": step, "epoch": epoch, "lr": 0.1, "split": "dev", "loss": loss,
            "train_loss": train_loss, "accuracy": accuracy}


def test_mean_is_over_the_steps_all_seeds_evaluated():
    a = Curve(1, [10, 20, 30], [1.0, 2.0, 3.0])
    b = Curve(2, [10, 20], [3.0, 5.0])  # stopped early
    m = mean_curve([a, b])
    assert (m.x, m.y) == ([10, 20], [2.0, 3.5])


def test_figure_axes_lines_png_pdf_and_csv(tmp_path):
    runs = tmp_path / "runs"
    fake_run(runs, "e", "lstm", 1, [rec(10, 1, 2.0, 3.0), rec(20, 2, 1.0, 2.0), rec(30, 3, 0.5, 1.0)])
    fake_run(runs, "e", "lstm", 2, [rec(10, 1, 4.0, 5.0), rec(20, 2, 2.0, 3.0)])
    fake_run(runs, "e", "lstm-gates", 1, [rec(10, 1, 3.0, 3.5), rec(20, 2, float("nan"), 3.1)])
    res = plot_runs([runs], tmp_path / "fig.png")  # default: the primary metric (loss), train_loss
    fig = res["figure"]
    assert [tuple(fig.get_size_inches())] == [(12.8, 4.4)]
    from matplotlib.image import imread

    png = imread(res["png"])
    assert png.shape[:2] == (round(4.4 * 150), round(12.8 * 150))  # height, width at 150 dpi
    assert res["pdf"].read_bytes().startswith(b"%PDF")
    left, right = fig.axes
    assert left.get_xlabel() == "step" and right.get_xlabel() == "step"
    assert left.get_ylabel() == "dev cross-entropy (nats/token) ↓"
    assert right.get_ylabel().startswith("training loss")
    # lstm: two thin seed lines and a bold mean; lstm-gates (one seed): its bold line only
    lines = left.get_lines()
    assert len(lines) == 4
    bold = [l for l in lines if l.get_linewidth() > 2]
    assert [l.get_label() for l in bold] == ["lstm (n=2)", "lstm-gates (n=1)"]
    assert list(bold[0].get_xdata()) == [10, 20] and list(bold[0].get_ydata()) == [3.0, 1.5]
    assert list(bold[1].get_xdata()) == [10] and list(bold[1].get_ydata()) == [3.0]  # nan left out
    assert bold[0].get_color() != bold[1].get_color()
    thin = [l for l in lines if l.get_linewidth() < 1]
    assert all(t.get_color() == bold[0].get_color() for t in thin)
    rows = list(csv.DictReader(res["csv"].open()))
    mean_loss = [(r["step"], float(r["value"])) for r in rows
                 if r["seed"] == "mean" and r["cell"] == "lstm" and r["metric"] == "loss"]
    assert mean_loss == [("10", 3.0), ("20", 1.5)]
    seed1 = [float(r["value"]) for r in rows
             if r["seed"] == "1" and r["cell"] == "lstm" and r["metric"] == "train_loss"]
    assert seed1 == [3.0, 2.0, 1.0]


def test_against_epoch_and_one_metric(tmp_path):
    runs = tmp_path / "runs"
    fake_run(runs, "e", "lstm", 1, [rec(10, 1, 2.0, 3.0, 40.0), rec(20, 2, 1.0, 2.0, 60.0)])
    res = plot_runs([runs / "e" / "lstm" / "seed-1"], tmp_path / "f.pdf", metrics=["accuracy"],
                    x="epoch")
    (ax,) = res["figure"].axes
    assert ax.get_xlabel() == "epoch" and ax.get_ylabel() == "dev bracket-closing accuracy ↑"
    assert list(ax.get_lines()[0].get_xdata()) == [1.0, 2.0]
    assert res["png"].exists() and res["pdf"].exists()


def test_bad_inputs_are_clear(tmp_path):
    runs = tmp_path / "runs"
    d = fake_run(runs, "e", "lstm", 1, [rec(10, 1, 2.0, 3.0), rec(20, 1, 1.0, 2.0)])
    with pytest.raises(UnknownNameError, match="Did you mean 'accuracy'"):
        plot_runs([runs], tmp_path / "f.png", metrics=["acuracy"])
    with pytest.raises(UserError, match="several times per epoch"):
        plot_runs([runs], tmp_path / "f.png", x="epoch")
    with pytest.raises(UserError, match="ending in .png or .pdf"):
        plot_runs([runs], tmp_path / "f.jpg")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UserError, match="no runs with a metrics.jsonl"):
        plot_runs([empty], tmp_path / "f.png")
    with pytest.raises(UserError, match="does not exist"):
        plot_runs([tmp_path / "nowhere"], tmp_path / "f.png")
    with RunFiles(d).metrics.open("a") as f:
        f.write('{"step": 30, "loss": \n')
    with pytest.raises(DataError, match=r"metrics.jsonl, line 3: malformed JSON"):
        read_metrics(RunFiles(d).metrics)


def test_real_runs_through_the_cli(tiny_recipe, tmp_path, capsys):
    """Two seeds of a tiny Dyck run: the plotted points are metrics.jsonl's."""
    from lstmablate.cli import main
    from lstmablate.run.runner import train_run

    out = tmp_path / "runs"
    for seed in (1, 2):
        train_run("dyck", "lstm", recipe=str(tiny_recipe), seed=seed, out=out, console=QUIET,
                  progress=False, threads=1, overrides=["train.eval_every=2", "train.max_steps=6"])
    with pytest.raises(SystemExit) as e:
        main(["plot", str(out), "--metric", "loss", "--out", str(tmp_path / "curves.png")])
    captured = capsys.readouterr()
    assert e.value.code == 0, captured.err
    for suffix in (".png", ".pdf", ".csv"):
        assert (tmp_path / f"curves{suffix}").stat().st_size > 0
    records = {s: read_metrics(RunFiles.of(out, "tiny", "lstm", s).metrics) for s in (1, 2)}
    assert [r["step"] for r in records[1]] == [2, 4, 6]
    rows = list(csv.DictReader((tmp_path / "curves.csv").open()))
    for s in (1, 2):
        assert [(int(r["step"]), float(r["value"])) for r in rows if r["seed"] == str(s)] == [
            (r["step"], r["loss"]) for r in records[s]]
    means = [float(r["value"]) for r in rows if r["seed"] == "mean"]
    assert means == pytest.approx([(a["loss"] + b["loss"]) / 2 for a, b in zip(records[1], records[2])])
    with pytest.raises(SystemExit) as e:
        main(["plot", str(out), "--metric", "los", "--out", str(tmp_path / "c.png")])
    err = " ".join(capsys.readouterr().err.split())
    assert e.value.code == 2 and "Did you mean 'loss'?" in err


def test_a_run_evaluated_once_is_drawn_as_a_point(tmp_path):
    runs = tmp_path / "runs"
    fake_run(runs, "e", "lstm", 1, [rec(10, 1, 2.0, 3.0)])
    fig = plot_runs([runs], tmp_path / "one.png")["figure"]
    (line,) = fig.axes[0].get_lines()
    assert line.get_marker() == "o" and list(line.get_xdata()) == [10]


def test_the_title_is_the_recipe_description_and_outputs_are_not_overwritten(tiny_recipe, tmp_path):
    from lstmablate.run.runner import train_run

    out = tmp_path / "runs"
    train_run("dyck", "lstm", recipe=str(tiny_recipe), out=out, console=QUIET, progress=False,
              threads=1, overrides=["train.max_steps=2"])
    yaml_text = tiny_recipe.read_text()
    tiny_recipe.write_text(yaml_text.replace("experiment: tiny\n",
                                             "experiment: tiny\ndescription: A tiny Dyck recipe\n"))
    res = plot_runs([out], tmp_path / "c.png", force=False)
    assert res["figure"].texts[0].get_text() == "A tiny Dyck recipe"  # the suptitle
    before = res["png"].read_bytes()
    with pytest.raises(UserError, match=r"c.png, .*c.pdf, .*c.csv already exist; add --force"):
        plot_runs([out], tmp_path / "c.png", force=False)
    assert res["png"].read_bytes() == before
    plot_runs([out], tmp_path / "c.pdf", force=True)  # replaces all three
