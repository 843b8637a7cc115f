"""`lstmablate report --format markdown|latex|csv|json` on real (tiny) Dyck runs.

LaTeX: compiles (pdflatex + booktabs, skipped where absent), shows the same numbers as the
markdown table, marks the best of each column, names task/split/checkpoint/n in its caption.
CSV/JSON: one row per run folder, values equal to result.json, CSV == JSON after parsing.
"""

from __future__ import annotations

import csv
import io
import json
import re
import shutil
import subprocess

import pytest
from rich.console import Console

from cli_in_process import expect_error, run_cli
from conftest import TINY_DYCK
from lstmablate.errors import UnknownNameError
from lstmablate.results.report import build_report
from lstmablate.results.formats import render, render_report, tex_escape, to_latex
from lstmablate.run.runner import train_run
from lstmablate.run.runs import RunFiles

QUIET = Console(file=io.StringIO())
GRID = TINY_DYCK.replace("experiment: tiny", "experiment: g") + (
    "grid:\n  data.m: [2, 3]\ntable:\n  title: The grid\n  metrics: [accuracy, loss]\n")


def _train(recipe, out, cell, seed, experiment=None, extra=()):
    return train_run("dyck", cell, recipe=str(recipe), seed=seed, out=out, console=QUIET,
                     progress=False, threads=1, experiment=experiment,
                     overrides=["train.max_steps=3", *extra])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """lstm seeds 1, 2 and lstm-srnn seed 1 of the tiny recipe; one run of a grid recipe."""
    root = tmp_path_factory.mktemp("report")
    recipe, grid = root / "tiny.yaml", root / "grid.yaml"
    recipe.write_text(TINY_DYCK)
    grid.write_text(GRID)
    out = root / "runs"
    for cell, seed in (("lstm", 1), ("lstm", 2), ("lstm-srnn", 1)):
        _train(recipe, out, cell, seed)
    _train(grid, out, "lstm", 1, experiment="g-m2", extra=["data.m=2"])
    return {"out": out, "recipe": recipe, "grid": grid}


def _results(out, experiment="tiny"):
    return {(p.parent.parent.name, int(p.parent.name.split("-")[1])): json.loads(p.read_text())
            for p in (out / experiment).glob("*/seed-*/result.json")}


# -- LaTeX -----------------------------------------------------------------------------------
def _md_numbers(text: str) -> dict[str, list[float]]:
    """cell -> every number of its markdown row (the (n=..) counts left out)."""
    rows = {}
    for line in text.splitlines():
        m = re.match(r"\| `([^`]+)`", line)
        if m:
            body = re.sub(r"\(n=\d+\)", "", line.split("|", 2)[2])
            rows[m.group(1)] = [float(x) for x in re.findall(r"-?\d+(?:\.\d+)?", body)]
    return rows


def _tex_numbers(text: str) -> dict[str, list[float]]:
    rows = {}
    for line in text.splitlines():
        m = re.match(r"\\texttt\{([^}]+)\}(?:\\textsuperscript\{\\dag\})? & (.*) \\\\$", line)
        if m:
            rows[m.group(1)] = [float(x) for x in re.findall(r"-?\d+(?:\.\d+)?", m.group(2))]
    return rows


def _tex_row(tex: str, cell: str) -> str:
    return next(l for l in tex.splitlines() if re.match(rf"\\texttt\{{{cell}\}}[ \\]", l))


def test_latex_numbers_equal_the_markdown_table(runs):
    for table in (None, str(runs["grid"])):
        md = render_report(runs["out"], table=table, fmt="markdown")
        tex = render_report(runs["out"], table=table, fmt="latex")
        md_rows, tex_rows = _md_numbers(md), _tex_numbers(tex)
        assert md_rows and md_rows == tex_rows
    results = _results(runs["out"])
    accs = [results[("lstm", s)]["test"]["accuracy"] for s in (1, 2)]
    tex = render_report(runs["out"], table="tiny", fmt="latex")
    row = _tex_row(tex, "lstm")
    import statistics

    assert f"{statistics.fmean(accs):.1f}" in row and rf"\pm {statistics.stdev(accs):.1f}" in row
    assert "& $99.0$" in row or r"& $\mathbf{99.0}$" in row  # the paper's number, own column


def test_latex_caption_booktabs_and_best_marked(runs):
    tex = render_report(runs["out"], table="tiny", fmt="latex")
    for rule in (r"\toprule", r"\midrule", r"\bottomrule"):
        assert tex.count(rule) == 1
    caption = re.search(r"\\caption\{(.*)\}\n", tex).group(1)
    assert r"Task \texttt{dyck}, test split, best-dev checkpoint" in caption
    assert r"$n$ seeds per cell: \texttt{lstm} 2, \texttt{lstm-srnn} 1" in caption
    assert "shortened" in caption  # max_steps runs are marked (dagger)
    header = next(l for l in tex.splitlines() if l.startswith("cell & "))
    columns = [c.strip() for c in header.rstrip("\\ ").split(" & ")[1:]]
    assert columns[:3] == [r"WCPA (min over distances) $\uparrow$", r"WCPA (mean over distances) $\uparrow$",
                           r"bracket-closing accuracy $\uparrow$"] and "paper" in columns
    # the best of each of our columns is bold, by mean at the precision shown
    results = _results(runs["out"])
    metric_of = {"bracket-closing accuracy $\\uparrow$": ("accuracy", max, ".1f"),
                 "cross-entropy (nats/token) $\\downarrow$": ("loss", min, ".4f")}
    body = {re.match(r"\\texttt\{([^}]+)\}", l).group(1): l.rstrip("\\ ").split(" & ")[1:]
            for l in tex.splitlines() if l.startswith(r"\texttt{")}
    for heading, (name, pick, fmt) in metric_of.items():
        j = columns.index(heading)
        means = {}
        for cell in ("lstm", "lstm-srnn"):
            vals = [r["test"][name] for (c, _), r in results.items() if c == cell]
            means[cell] = float(f"{sum(vals) / len(vals):{fmt}}")
        best = pick(means.values())
        for cell, mean in means.items():
            assert (r"\mathbf{" in body[cell][j]) == (mean == best), (heading, cell, body[cell][j])


def test_table_of_several_experiments_spans_its_groups(runs):
    tex = render_report(runs["out"], table=str(runs["grid"]), fmt="latex")
    # per group: accuracy, the paper's accuracy, loss
    assert r"\multicolumn{3}{c}{m=2} & \multicolumn{3}{c}{m=3}" in tex
    assert r"\cmidrule(lr){2-4} \cmidrule(lr){5-7}" in tex
    row = _tex_row(tex, "lstm")
    assert row.count(r"\textit{missing}") == 2  # m=3 has no run


def test_cell_outside_an_experiment_is_a_dash_not_missing(runs, tmp_path):
    """A table over two experiments: `solo` lists only lstm and has no runs. Its lstm is
    `missing` (expected, not run); its lstm-srnn is "—" (not part of that experiment)."""
    solo = tmp_path / "solo.yaml"
    solo.write_text(TINY_DYCK.replace("experiment: tiny", "experiment: solo")
                    .replace("cells: [lstm, lstm-srnn]", "cells: [lstm]"))
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"table:\n  title: Two\n  experiments: [{runs['recipe']}, {solo}]\n"
                    f"  labels: {{tiny: A, solo: B}}\n  metrics: [accuracy]\n")
    md = render_report(runs["out"], table=str(spec), fmt="markdown")
    rows = {m.group(1): [c.strip() for c in line.split("|")[2:-1]]
            for line in md.splitlines() if (m := re.match(r"\| `([^`]+)`", line))}
    # columns: A ours, A paper, B ours, B paper
    assert rows["lstm"][2] == "missing" and rows["lstm-srnn"][2] == "—"
    assert re.match(r"\d+\.\d ± \d+\.\d \(n=2\)", rows["lstm"][0])
    assert re.match(r"\d+\.\d \(n=1\)", rows["lstm-srnn"][0])
    assert "not part of that experiment" in md
    tex = render_report(runs["out"], table=str(spec), fmt="latex")
    assert _tex_row(tex, "lstm-srnn").count(r"\textit{missing}") == 0
    assert _tex_row(tex, "lstm").count(r"\textit{missing}") == 1


def test_checkpoint_named_from_the_recipe_before_any_run_finished(runs, tmp_path):
    solo = tmp_path / "solo.yaml"
    solo.write_text(TINY_DYCK.replace("experiment: tiny", "experiment: solo")
                    .replace("  patience: 0\n", "  patience: 0\n  test_checkpoint: last\n"))
    md = render_report(runs["out"], table=str(solo), fmt="markdown")
    assert "test split of the last (end of training) checkpoint" in md
    assert "test split of the best-dev checkpoint" in render_report(
        runs["out"], table="tiny", fmt="markdown")


def _compile(tmp_path, body: str) -> subprocess.CompletedProcess:
    doc = tmp_path / "doc.tex"
    doc.write_text("\\documentclass{article}\n\\usepackage{booktabs}\n\\begin{document}\n"
                   + body + "\n\\end{document}\n", encoding="utf-8")
    return subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", doc.name],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(shutil.which("pdflatex") is None, reason="no pdflatex on this system")
def test_latex_compiles(runs, tmp_path):
    report = build_report(runs["out"])
    report.tables[0].title = r"m_1 & 50% #x {y} ~ ^ \ ± ↑ < 50 — done"  # every special character
    body = to_latex(report) + render_report(runs["out"], table=str(runs["grid"]), fmt="latex")
    r = _compile(tmp_path, body)
    assert r.returncode == 0, r.stdout[-3000:]
    assert (tmp_path / "doc.pdf").stat().st_size > 1000
    if shutil.which("pdftotext"):  # the typeset title reads as written
        text = subprocess.run(["pdftotext", "doc.pdf", "-"], cwd=tmp_path, capture_output=True,
                              text=True).stdout
        assert "& 50% #x {y}" in text and "± ↑ < 50" in text


def test_tex_escape():
    assert tex_escape("a_b & 50%") == r"a\_b \& 50\%"
    assert tex_escape("< 50") == "$<$ 50"


# -- CSV / JSON ------------------------------------------------------------------------------
def _parse_csv(text: str) -> list[dict]:
    def value(s: str):
        if s == "":
            return None
        if s in ("true", "false"):
            return s == "true"
        for conv in (int, float):
            try:
                return conv(s)
            except ValueError:
                pass
        return s

    return [{k: value(v) for k, v in row.items()} for row in csv.DictReader(io.StringIO(text))]


def test_csv_and_json_one_row_per_run_round_trip(runs, tmp_path):
    out = tmp_path / "runs"
    shutil.copytree(runs["out"], out)
    unfinished = out / "tiny" / "lstm-srnn" / "seed-2"
    shutil.copytree(out / "tiny" / "lstm-srnn" / "seed-1", unfinished)
    RunFiles(unfinished).result.unlink()
    cfg = RunFiles(unfinished).config
    cfg.write_text(cfg.read_text().replace("\nseed: 1\n", "\nseed: 2\n"))
    RunFiles(out / "tiny" / "lstm" / "seed-2").result.write_text("[1, 2]")  # damaged
    rows = json.loads(render_report(out, fmt="json"))
    assert _parse_csv(render_report(out, fmt="csv")) == rows
    by_run = {(r["experiment"], r["cell"], r["seed"]): r for r in rows}
    assert set(by_run) == {("tiny", "lstm", 1), ("tiny", "lstm", 2), ("tiny", "lstm-srnn", 1),
                           ("tiny", "lstm-srnn", 2), ("g-m2", "lstm", 1)}
    assert by_run[("tiny", "lstm-srnn", 2)]["status"] == "unfinished"
    damaged = by_run[("tiny", "lstm", 2)]
    assert damaged["status"] == "damaged" and "holds a JSON list" in damaged["problem"]
    for (exp, cell, seed), row in by_run.items():
        if row["status"] != "finished":
            assert row["test.accuracy"] is None
            continue
        result = json.loads(RunFiles(out / exp / cell / f"seed-{seed}").result.read_text())
        for name, v in result["test"].items():
            assert row[f"test.{name}"] == v  # exact: floats round-trip through repr
        for name, v in result["best"]["dev"].items():
            assert row[f"dev.{name}"] == v
        assert (row["steps"], row["train_time_s"], row["train_cpu_s"], row["shortened"]) == (
            result["steps"], result["train_time_s"], result["train_cpu_s"], True)
        assert result["train_cpu_s"] > 0
        assert row["best_step"] == result["best"]["step"] and row["recipe"] == result["recipe"]
    only = json.loads(render_report(out, table="tiny", fmt="json"))
    assert {r["experiment"] for r in only} == {"tiny"} and len(only) == 4


def test_unknown_format_is_named():
    with pytest.raises(UnknownNameError, match="Did you mean 'latex'"):
        render(None, "latx")


def test_cli_formats_and_out_file(runs, tmp_path):
    r = run_cli("report", str(runs["out"]), "--format", "latex", "--out", str(tmp_path / "t.tex"),
                "--print", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout == (tmp_path / "t.tex").read_text()
    assert r"\begin{tabular}" in r.stdout
    r = run_cli("report", str(runs["out"]), "-f", "csv", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("experiment,task,cell,seed,status")
    expect_error(run_cli("report", str(runs["out"]), "--format", "xml", cwd=tmp_path),
                 "unknown report format 'xml'")


def test_a_metric_resting_on_few_judgements_is_footnoted_in_every_format(runs):
    """Dyck's wcpa_min is the accuracy of its worst distance bucket; when that bucket holds
    fewer than DyckTask.FEW_JUDGEMENTS judgements the entry is marked ‡ with the count."""
    from lstmablate_tasks.dyck.task import DyckTask

    results = _results(runs["out"])
    few = {(c, s): r["test"]["worst_judged"] for (c, s), r in results.items()
           if r["test"]["worst_judged"] < DyckTask.FEW_JUDGEMENTS}
    assert few, "the tiny test set should leave a sparse worst bucket"
    md = render_report(runs["out"], table="tiny", fmt="markdown")
    for (cell, seed), n in few.items():
        row = next(l for l in md.splitlines() if l.startswith(f"| `{cell}`"))
        wcpa_min = row.split("|")[2]
        assert wcpa_min.strip().endswith("‡"), row
        assert (f"‡ `{cell}` wcpa_min, seed {seed}: its worst distance bucket" in md
                and f"holds {int(n)} judgement" in md), md
    assert r"\textsuperscript{\ddag}" in render_report(runs["out"], table="tiny", fmt="latex")
    rows = {(r["cell"], int(r["seed"])): r for r in csv.DictReader(io.StringIO(
        render_report(runs["out"], fmt="csv"))) if r["experiment"] == "tiny"}
    for key, r in rows.items():
        assert bool(r["caveats"]) == (key in few), r
    assert DyckTask.caveats({"worst_judged": 20.0, "worst_distance": 3.0}) == {}
    assert "moves it by 10.0 points" in DyckTask.caveats({"worst_judged": 10.0})["wcpa_min"]
