"""Damaged run records and bad options never end in a traceback (reliability round 4).

What a run folder holds is read by ``report``, ``plot``, ``compare``, ``eval --scores`` and
``visualize``.  Each reader checks what it reads (the document's shape, the seed, metrics,
``best``, ``test``, each metrics line, each scores line): ``report`` and ``plot`` skip a
damaged run and say why (one damaged run never hides the others, with or without
``--significance``); ``compare``, ``eval`` and ``visualize``, asked for that run, stop with one
paragraph naming the file.  The options of the significance tests are bounded in one place.
Nothing in a run folder is changed by any of it.  (The property walks over every option and
every record field are tests/test_records_property.py.)
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from cli_in_process import expect_error, run_cli
from conftest import record_text, write_record_text
from significance_runs import small_runs, small_tree, tree  # noqa: F401 - fixtures
from lstmablate.errors import DataError
from lstmablate.limits import MAX_LINE_BYTES
from lstmablate.run.runs import RunFiles
from lstmablate.run.scores import read_scores

RUN = "runs/sig/lstm/seed-1"  # the run the tests damage
OTHER = "runs/sig/lstm-srnn/seed-1"


@pytest.fixture
def here(small_runs) -> Path:
    return small_runs


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def expect_skipped(done, *fragments: str) -> str:
    """Exit 0, the damaged run named in a warning with every fragment, no traceback."""
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    text = " ".join(done.stderr.split())
    assert "warning: skipped" in text, text
    for f in fragments:
        assert f in text, (f, text)
    return text


def lstm_row(markdown: str) -> str:
    return next(line for line in markdown.splitlines() if line.startswith("| `lstm` "))


def edit_json(path: Path, change) -> None:
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


def set_config(root: Path, key: str, text: str) -> Path:
    """config.yaml of RUN with ``key: <text>`` (text as typed in YAML)."""
    path = RunFiles(root / RUN).config
    lines = [f"{key}: {text}" if line.startswith(f"{key}:") else line
             for line in path.read_text().splitlines()]
    path.write_text("\n".join(lines) + "\n")
    return path


# -- config.yaml ---------------------------------------------------------------------------
@pytest.mark.parametrize("seed, why", [
    ("abc", "seed must be a run seed"),
    ("9" * 5000, "holds a value that cannot be read"),
    ("[1, 2]", "seed must be a run seed"),
    ("-1", "seed must be a run seed"),
])
def test_a_seed_that_is_no_seed_skips_the_run_in_report_and_plot_and_stops_compare(here, seed,
                                                                                   why):
    config = set_config(here, "seed", seed)
    before = snapshot(here)
    plain = run_cli("report", "runs", cwd=here)
    expect_skipped(plain, f"{RUN}/config.yaml", why)
    assert "(n=1)" in lstm_row(plain.stdout)  # the other lstm seed is still there
    expect_skipped(run_cli("report", "runs", "--format", "csv", cwd=here), why)
    tested = run_cli("report", "runs", "--significance", cwd=here)
    # --significance skips it the same way, and the other runs are still tested
    assert expect_skipped(tested, why) == " ".join(plain.stderr.split())
    assert "vs `lstm`" in tested.stdout and "n=1" in lstm_row(tested.stdout)
    text = expect_error(run_cli("compare", RUN, OTHER, cwd=here), str(config.relative_to(here)),
                        why)
    if why.startswith("seed"):  # (what YAML cannot read at all is io's message)
        assert "Restore the run folder from a copy, or train the run again" in text
    expect_skipped(run_cli("plot", "runs", "--out", "c.png", cwd=here), why)
    expect_error(run_cli("visualize", RUN, "--text", "a b", "--out", "v.png", cwd=here), why)
    after = snapshot(here)
    assert {k: v for k, v in after.items() if k.startswith("runs/")} == \
        {k: v for k, v in before.items() if k.startswith("runs/")}


@pytest.mark.parametrize("text, why", [
    ("[1, 2]", "is not a mapping"),
    ("a: " + "[" * 1500 + "]" * 1500, "levels deep"),
])
def test_a_config_that_is_no_mapping_or_nests_deeply_is_named(here, text, why):
    RunFiles(here / RUN).config.write_text(text + "\n")
    expect_skipped(run_cli("report", "runs", cwd=here), f"{RUN}/config.yaml", why)
    expect_skipped(run_cli("plot", "runs", "--out", "c.png", cwd=here), why)
    expect_error(run_cli("compare", RUN, OTHER, cwd=here), f"{RUN}/config.yaml", why)


# -- result.json ---------------------------------------------------------------------------
def _string_metric(d):
    d["test"]["accuracy"] = "high"


def _best_list(d):
    d["best"] = [1]


def _seed_word(d):
    d["seed"] = "abc"


@pytest.mark.parametrize("damage, why", [
    (_string_metric, "`test` must be null or an object mapping metric names to numbers"),
    (_best_list, '`best` must be an object {"step": N, "epoch": N, "dev": metrics}, got [1]'),
    (_seed_word, "`seed` must be a run seed"),
    ("[1, 2]", "it holds a JSON list, not the object lstmablate writes"),
    ("[" * 5000 + "]" * 5000, "levels deep"),
    ('{"test": {"accuracy": ' + "9" * 5000 + "}}", "holds a value that cannot be read"),
])
def test_a_damaged_result_is_skipped_by_report_and_refused_by_compare_and_eval(here, damage, why):
    result = RunFiles(here / RUN).result
    if isinstance(damage, str):
        result.write_text(damage)
    else:
        edit_json(result, damage)
    before = snapshot(here / "runs")
    for fmt in ("markdown", "csv", "latex", "json"):
        done = run_cli("report", "runs", "--format", fmt, cwd=here)
        expect_skipped(done, f"{RUN}/result.json", why)
    expect_error(run_cli("compare", RUN, OTHER, cwd=here), f"{RUN}/result.json", why)
    expect_error(run_cli("eval", RUN, "--scores", cwd=here), f"{RUN}/result.json", why)
    assert snapshot(here / "runs") == before


def test_the_advice_for_a_damaged_result_names_a_command_that_works(here):
    edit_json(RunFiles(here / RUN).result, _string_metric)
    text = expect_error(run_cli("compare", RUN, OTHER, cwd=here))
    assert "command plus --resume evaluates the finished run again and writes it anew" in text


# -- metrics.jsonl -------------------------------------------------------------------------
@pytest.mark.parametrize("line, why", [
    ('{"step": 30, "epoch": 3, "accuracy": "high"}', "`accuracy` must be a number (or null)"),
    ('{"step": 30, "epoch": 3, "lr": [0.1]}', "`lr` must be a number (or null)"),
    ('{"step": 30, "epoch": ' + "9" * 400 + "}", "`epoch` must be an integer between 0 and"),
    ('{"step": ' + "9" * 5000 + "}", "holds a value that cannot be read"),
    ('{"step": 30, "a": ' + "[" * 5000 + "]" * 5000 + "}", "levels deep"),
    ('{"step": 30, "split": 1}', "`split` must be the name of a split"),
    ('{"step": 30, "x": "' + "y" * MAX_LINE_BYTES + '"}', "the line is more than the"),
])
def test_a_damaged_metrics_line_is_skipped_by_plot_and_named(here, line, why):
    with open(RunFiles(here / RUN).metrics, "a") as f:
        f.write(line + "\n")
    expect_skipped(run_cli("plot", "runs", "--out", "c.png", "--x", "epoch", cwd=here),
                   f"{RUN}/metrics.jsonl, line 3", why)
    rows = (here / "c.csv").read_text().splitlines()[1:]
    assert {r.split(",")[1] for r in rows} == {"lstm", "lstm-srnn"}  # the others are drawn
    expect_error(run_cli("plot", RUN, "--out", "d.png", cwd=here), "metrics.jsonl, line 3", why)


def test_non_finite_metrics_in_metrics_jsonl_are_left_out_of_the_curves_not_refused(here):
    with open(RunFiles(here / RUN).metrics, "a") as f:
        f.write('{"step": 30, "epoch": 3, "accuracy": NaN, "train_loss": null}\n')
    assert run_cli("plot", "runs", "--out", "c.png", cwd=here).returncode == 0


# -- scores/<split>.jsonl.gz ----------------------------------------------------------------
@pytest.mark.parametrize("value", ["NaN", "Infinity", "null"])
def test_non_finite_item_scores_are_never_given_a_verdict(here, value):
    scores = RunFiles(here / RUN).scores("test")
    lines = record_text(scores).splitlines()
    lines[5] = lines[5].replace('"correct": 1', f'"correct": {value}').replace(
        '"correct": 0', f'"correct": {value}')
    write_record_text(scores, "\n".join(lines) + "\n")
    expect_error(run_cli("compare", RUN, OTHER, cwd=here), f"{RUN}/scores/test.jsonl.gz, line 6",
                 "not a finite number", f"lstmablate eval {RUN} --split test --scores")
    done = run_cli("report", "runs", "--significance", cwd=here)
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    if value == "null":  # what lstmablate writes for a non-finite statistic: that metric only
        assert f"`lstm-srnn` accuracy: not tested ({RUN}/scores/test.jsonl.gz, line 6" in text
    else:  # a file holding NaN or Infinity is damaged as a whole: neither metric is tested
        assert f"`lstm-srnn` accuracy, loss: not tested ({RUN}/scores/test.jsonl.gz, line 6" in text
        assert f"`lstmablate eval {RUN} --split test --scores`" in text
    # the other seed's pair is still tested (two seeds a side: too few for ASO)
    assert "| worse (1/1 pairs worse, adj. p " in lstm_srnn_row(done.stdout)


def test_a_metric_that_is_no_number_on_some_resamples_gets_no_verdict(here, monkeypatch):
    """Finite statistics may still give NaN on a resample (a ratio over items without
    tokens): such resamples are dropped and counted, and when more than 1 % of them are there
    is no verdict (a p-value counted over them would call any difference significant)."""
    from lstmablate.results import pairing
    from lstmablate.results.significance import PairedResult

    monkeypatch.setattr(pairing, "paired_test", lambda *a, **k: PairedResult(
        80.0, 60.0, -30.0, -10.0, 0.001, 200, 1000, 12345, dropped=400))
    expect_error(run_cli("compare", RUN, OTHER, cwd=here), "no verdict can rest on them")


def test_a_scores_file_without_items_is_named(here):
    for run in (RUN, OTHER):
        scores = RunFiles(here / run).scores("test")
        header = json.loads(record_text(scores).splitlines()[0])
        write_record_text(scores, json.dumps({**header, "items": 0}) + "\n")
    expect_error(run_cli("compare", RUN, OTHER, cwd=here), f"{RUN}/scores/test.jsonl.gz holds no "
                 "items")


def lstm_srnn_row(markdown: str) -> str:
    return next(line for line in markdown.splitlines() if line.startswith("| `lstm-srnn` "))


@pytest.mark.parametrize("header, why", [
    ({"metrics": [1]}, "the header's metrics must be an object mapping metric names to numbers"),
    ({"seed": "abc"}, "the header's seed must be a run seed"),
    ({"items": "200"}, "the header's items must be the number of records"),
    ({"task": ["sst"]}, "the header's task must be a string"),
])
def test_a_scores_header_of_the_wrong_types_is_named(here, header, why):
    scores = RunFiles(here / RUN).scores("test")
    lines = record_text(scores).splitlines()
    lines[0] = json.dumps({**json.loads(lines[0]), **header})
    write_record_text(scores, "\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"test.jsonl.gz, line 1: "):
        read_scores(scores)
    expect_error(run_cli("compare", RUN, OTHER, cwd=here), "scores/test.jsonl.gz, line 1", why)


def test_a_line_separator_inside_a_scores_string_is_not_a_line_break(here):
    """write_scores writes non-ASCII text as it is (ensure_ascii=False): a U+2028 in a
    translation stays inside its JSON string."""
    scores = RunFiles(here / RUN).scores("test")
    lines = record_text(scores).splitlines()
    record = json.loads(lines[1])
    lines[1] = json.dumps({**record, "text": "a\u2028b\x85c"}, ensure_ascii=False)
    write_record_text(scores, "\n".join(lines) + "\n")
    assert read_scores(scores).records[0]["text"] == "a\u2028b\x85c"


# -- recipes on disk ------------------------------------------------------------------------
def test_a_recipe_with_reference_hello_is_a_note_and_the_report_goes_on(here):
    recipe = here / "sig.yaml"
    text = recipe.read_text()
    start = text.index("reference:\n")
    recipe.write_text(text[:start] + "reference: hello\n"
                      + text[text.index("reference_source"):])
    done = run_cli("report", "runs", cwd=here)
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert "recipe 'sig' (trained from" in text and "can no longer be read:" in text
    assert "sig.yaml: `reference` must be a mapping of cell" in text
    assert "(n=2)" in lstm_row(done.stdout)


# -- the options of the significance tests ---------------------------------------------------
@pytest.mark.parametrize("option, value, message", [
    ("--resamples", "1000000000", "--resamples must be an integer between 200 and 100,000"),
    ("--resamples", str(2**70), "--resamples must be an integer between 200 and 100,000"),
    ("--resamples", "0", "--resamples must be an integer between 200 and 100,000"),
    ("--resamples", "1", "--resamples must be an integer between 200 and 100,000"),
    ("--seed", "-1", "--seed: a seed must be an integer between 0 and 4,294,967,295"),
    ("--seed", str(2**32), "--seed: a seed must be an integer between 0 and 4,294,967,295"),
    ("--level", "1e-300", "--level 1e-300 can never be reached with --resamples 10,000: the "
     "smallest p-value the test gives is 1/(resamples + 1) = 0.0001"),
    ("--level", "0.6", "--level must be a number in (0, 0.5]"),
    ("--level", "0", "--level must be a number in (0, 0.5]"),
    ("--level", "nan", "--level must be a number in (0, 0.5]"),
])
def test_the_options_of_the_tests_are_bounded(here, option, value, message):
    expect_error(run_cli("compare", RUN, OTHER, option, value, cwd=here), message)
    expect_error(run_cli("report", "runs", "--significance", option, value, cwd=here), message)


def test_a_level_is_reachable_with_enough_resamples(here):
    done = run_cli("compare", RUN, OTHER, "--level", "0.004", "--resamples", "300", cwd=here)
    assert done.returncode == 0, done.stderr
    expect_error(run_cli("compare", RUN, OTHER, "--level", "0.004", "--resamples", "200",
                         cwd=here), "1/(resamples + 1) = 0.00498")


def test_report_seed_is_the_seed_of_the_resampling(here):
    done = run_cli("report", "runs", "--significance", "--seed", "7", "--resamples", "200",
                   cwd=here)
    assert done.returncode == 0, done.stderr
    assert "200 shuffles, seed 7" in done.stdout


@pytest.mark.parametrize("against, message", [
    ("nosuch", "unknown --against cell 'nosuch'. Valid choices: lstm, lstm-gates, lstm-srnn, "
     "lstm-srnn-out."),
    ("lstm-srn", "Did you mean 'lstm-srnn'?"),
])
def test_against_a_cell_of_no_table_is_refused_naming_the_cells(here, against, message):
    expect_error(run_cli("report", "runs", "--significance", "--against", against, cwd=here),
                 message)


def test_compare_refuses_a_split_that_is_neither_dev_nor_test(here):
    expect_error(run_cli("compare", RUN, OTHER, "--split", "nan", cwd=here),
                 "--split must be dev or test")


def test_a_diverged_run_whose_result_holds_nan_is_read(here):
    """NaN and infinities are numbers a diverged evaluation writes: a result.json holding them
    is read (its mean leaves them out), not called damaged."""
    edit_json(RunFiles(here / RUN).result, lambda d: d["test"].update(loss=math.nan))
    done = run_cli("report", "runs", "--format", "csv", cwd=here)
    assert done.returncode == 0 and "warning" not in done.stderr, done.stderr
