"""Reports show a task's final dev metrics beside test (NMT: validation BLEU, Table 4 does not
name its split), and a table spec may name a task's extra metrics (NMT: the BLEU of the
length-normalised ranking); neither is ever tested for significance."""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path

import pytest

from lstmablate.run.runs import RunFiles
from lstmablate.results.formats import markdown_table
from lstmablate.results.report import build_report
from lstmablate.results.compare import SignificanceOptions

RECORDS = Path(__file__).resolve().parents[1] / "experiments" / "results" / "nmt-multi30k-cpu"
VAL = {("lstm", 1): 30.5, ("lstm", 2): 31.5, ("lstm-gates", 1): 12.25}
LENNORM = {("lstm", 1): 29.0, ("lstm", 2): 30.0, ("lstm-gates", 1): 11.0}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """Three real NMT run records, their val and length-normalised BLEU set to known values."""
    root = tmp_path_factory.mktemp("runs")
    for (cell, seed), val in VAL.items():
        src = RECORDS / cell / f"seed-{seed}"
        dst = root / "nmt-multi30k-cpu" / cell / f"seed-{seed}"
        shutil.copytree(src, dst)
        result = json.loads((dst / RunFiles.RESULT).read_text())
        result["dev_final"]["bleu"] = val
        result["test"]["lennorm_bleu"] = LENNORM[cell, seed]
        (dst / RunFiles.RESULT).write_text(json.dumps(result))
    return root


def _column(text: str, heading: str) -> dict[str, str]:
    lines = [line for line in text.splitlines() if line.startswith("|")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    j = head.index(heading)
    return {row.split("|")[1].strip(" `"): row.strip("|").split("|")[j].strip()
            for row in lines[2:]}


def test_the_validation_bleu_is_a_column_beside_test(runs):
    (table,) = build_report(runs).tables
    text = markdown_table(table)
    val = _column(text, "val BLEU (tokenised, multi-bleu.perl) ↑")
    mean = statistics.fmean([VAL["lstm", 1], VAL["lstm", 2]])
    sd = statistics.stdev([VAL["lstm", 1], VAL["lstm", 2]])
    assert val["lstm"] == f"{mean:.2f} ± {sd:.2f} (n=2)" and val["lstm-gates"] == "12.25 (n=1)"
    assert val["lstm-srnn"] == "missing"  # a cell of the recipe without a run here
    assert "Columns headed `val`: the final evaluation of that (validation) split" in text
    # the test column still reads the test section
    test = _column(text, "BLEU (tokenised, multi-bleu.perl) ↑")
    gates = json.loads((RECORDS / "lstm-gates" / "seed-1" / RunFiles.RESULT).read_text())
    assert test["lstm-gates"] == f"{gates['test']['bleu']:.2f} (n=1)"


def test_an_extra_metric_shows_where_a_table_spec_names_it(runs, tmp_path):
    assert "length-normalised" not in markdown_table(build_report(runs).tables[0])
    spec = tmp_path / "spec.yaml"
    spec.write_text("table:\n  title: t\n  experiments: [nmt-multi30k-cpu]\n"
                    "  metrics: [bleu, lennorm_bleu]\n")
    (table,) = build_report(runs, table=str(spec)).tables
    got = _column(markdown_table(table), "BLEU, length-normalised ranking (OpenNMT-py 18d3d2e1) ↑")
    assert got["lstm-gates"] == "11.00 (n=1)" and got["lstm"].startswith("29.50 ± 0.71")
    spec.write_text("table:\n  title: t\n  experiments: [nmt-multi30k-cpu]\n  metrics: [nosuch]\n")
    with pytest.raises(Exception, match="lennorm_bleu"):  # the error lists what exists
        build_report(runs, table=str(spec))


def test_neither_is_tested_for_significance(runs, tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text("table:\n  title: t\n  experiments: [nmt-multi30k-cpu]\n"
                    "  metrics: [bleu, lennorm_bleu]\n")
    opts = SignificanceOptions(reference="lstm", n_samples=200)
    (table,) = build_report(runs, table=str(spec), significance=opts).tables
    tested = {table.columns[j].heading for row in table.rows for j in row.tests}
    assert tested == {"BLEU (tokenised, multi-bleu.perl) ↑"}
    head = [line for line in markdown_table(table).splitlines() if line.startswith("|")][0]
    assert head.count("vs `lstm`") == 1


def test_runs_evaluated_differently_are_named(runs, tmp_path):
    """One table, runs decoded with different beam-search rules: a note says so."""
    import yaml

    mixed = tmp_path / "mixed"
    shutil.copytree(runs, mixed)
    assert not any("evaluated with different eval options" in n
                   for n in build_report(mixed).tables[0].notes)
    cfg_path = mixed / "nmt-multi30k-cpu" / "lstm" / "seed-2" / RunFiles.CONFIG
    cfg = yaml.safe_load(cfg_path.read_text())
    cfg["eval"]["length_normalise"] = not cfg["eval"]["length_normalise"]
    cfg_path.write_text(yaml.safe_dump(cfg))
    (table,) = build_report(mixed).tables
    (note,) = [n for n in table.notes if "evaluated with different eval options" in n]
    assert "eval.length_normalise: false (1 run), true (2 runs)" in note or \
        "eval.length_normalise: false (2 runs), true (1 run)" in note
    assert "eval.beam_size" not in note  # only the keys that differ
