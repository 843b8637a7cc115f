"""`lstmablate compare` and `lstmablate report --significance` on a runs tree written by hand
(tests/significance_runs.py: an LSTM with five seeds, an ablation clearly worse with five,
one nearly identical run, one run without a scores file), and the BLEU comparison against
sacreBLEU's own paired bootstrap.

Without --significance the report is byte for byte the golden files
tests/fixtures/report/before-significance.* (rendered from this tree without
--significance: ``python tests/significance_runs.py DIR``, then ``lstmablate report runs
--table sig --format FORMAT`` in DIR)."""

from __future__ import annotations

import csv
import io
import json
import random
import shutil
from pathlib import Path

import pytest

from cli_in_process import run_cli
from conftest import record_text, write_record_text
from significance_runs import ITEMS, answers, tree  # noqa: F401 - (tree: a fixture)
from lstmablate.results.compare import (SignificanceOptions, compare, render as render_comparison,
                                        side_runs)
from lstmablate.results.formats import render
from lstmablate.results.report import build_report
from lstmablate.run.record import Run
from lstmablate.run.runs import RunFiles

GOLDEN = Path(__file__).parent / "fixtures" / "report"
FORMATS = {"markdown": "markdown", "latex": "latex", "csv": "csv", "json": "json"}


@pytest.fixture
def here(tree, monkeypatch) -> Path:
    """The tree's folder as the working directory (run paths in the report are relative)."""
    monkeypatch.chdir(tree)
    return tree


# -- the report without --significance: unchanged -------------------------------------------
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("table", ["sig", "sig.yaml"])
def test_without_significance_the_report_is_byte_identical_to_before(here, fmt, table):
    text = render(build_report(Path("runs"), table=table), fmt)
    assert text == (GOLDEN / f"before-significance.sig.{fmt}").read_text()


# -- report --significance ------------------------------------------------------------------
def _report(fmt: str, **options) -> str:
    return render(build_report(Path("runs"), table="sig",
                               significance=SignificanceOptions(**options)), fmt)


def _md_rows(text: str) -> dict[str, list[str]]:
    return {line.split(" | ")[0][2:].strip("`"): [c.strip() for c in line.strip("| ").split(" | ")]
            for line in text.splitlines() if line.startswith("| `")}


def test_markdown_marks_each_ablation_with_a_footnote(here):
    text = _report("markdown")
    head = next(line for line in text.splitlines() if line.startswith("| cell"))
    assert head.count("vs `lstm`") == 2  # after accuracy and after loss, not after "paper"
    rows = _md_rows(text)
    acc = 2  # cell, accuracy, vs, paper, loss, vs
    assert rows["lstm"][acc] == "reference"
    # five seeds each, every seed of the ablation far below every LSTM seed; four of the five
    # pairs differ at the level, more than half: the mark agrees with ASO
    assert rows["lstm-srnn"][acc] == "worse (ASO worse ε 0.00; 4/5 pairs worse, adj. p 0.003)"
    # one run, three answers away from LSTM seed 1: no pair says different
    assert rows["lstm-gates"][acc].startswith("not distinguishable (")
    assert rows["lstm-srnn-out"][acc] == "no scores"
    assert rows["lstm-srnn"][5].startswith("not distinguishable")  # the loss: 0.5 everywhere
    # the numbers are the plain table's, the marks inserted after them
    plain = _md_rows(render(build_report(Path("runs"), table="sig"), "markdown"))
    for cell, cells in rows.items():
        assert [c for j, c in enumerate(cells) if j not in (2, 5)] == plain[cell]
    assert "the paired permutation test (10,000 shuffles, seed 12345)" in text
    assert "level 0.05" in text and "Almost Stochastic Order" in text
    assert "Holm-Bonferroni (family-wise error) of the item-level p-values" in text
    assert ("No per-item scores for 1 run," in text and "runs/sig/lstm-srnn-out/seed-1" in text
            and "lstmablate eval RUN --split test --scores" in text)


def test_level_and_resamples_are_named_and_used(here):
    text = _report("markdown", level=0.01, n_samples=500)
    assert "at level 0.01" in text and "500 shuffles" in text and "confidence 0.99" in text
    bh = _report("markdown", correction="bh")
    assert "Benjamini-Hochberg (false discovery rate)" in bh
    sacre = _report("markdown", test="sacrebleu")
    assert "sacreBLEU's paired bootstrap (1,000 resamples, seed 12345" in sacre


def test_cells_choose_the_rows_their_order_and_the_family(here):
    """--cells: only those rows, in that order, and the table's family of comparisons is
    theirs alone (a page about some cells is not corrected for cells it does not show)."""
    import re

    def family(text: str) -> int:
        return int(re.search(r"(\d+) comparison\(s\) of the table form one family", text)[1])

    full = _report("markdown", n_samples=500)
    only = render(build_report(Path("runs"), table="sig",
                               significance=SignificanceOptions(n_samples=500),
                               cells=["lstm-gates", "lstm"]), "markdown")
    assert list(_md_rows(only)) == ["lstm-gates", "lstm"]
    assert list(_md_rows(full)) == ["lstm", "lstm-srnn", "lstm-srnn-out", "lstm-gates"]
    # lstm-srnn and lstm-gates, accuracy and loss, in the full table; lstm-gates alone here
    assert (family(full), family(only)) == (4, 2)
    assert _md_rows(only)["lstm-gates"][1] == _md_rows(full)["lstm-gates"][1]  # the same numbers
    csv_rows = list(csv.DictReader(io.StringIO(render(
        build_report(Path("runs"), table="sig", cells=["lstm-srnn"]), "csv"))))
    assert sorted((r["cell"], r["seed"]) for r in csv_rows) == [("lstm-srnn", str(s))
                                                                 for s in range(1, 6)]


def test_cells_trained_into_the_experiment_by_another_recipe(tree, tmp_path, monkeypatch):
    """A recipe that trains more cells into an experiment (`base:` its recipe, the same
    `experiment:`) adds rows only: the expectations stay those of the recipe named after the
    experiment, whichever run is read first, and --cells gives the table without them."""
    import yaml

    shutil.copytree(tree, tmp_path / "t")  # (the module's tree is shared: changed in a copy)
    monkeypatch.chdir(tmp_path / "t")
    before = render(build_report(Path("runs"), table="sig"), "markdown")
    extra = Path("runs/sig/aaa-mingru/seed-1")  # read before every run of the experiment's own
    shutil.copytree(Path("runs/sig/lstm-srnn/seed-1"), extra)
    cfg = yaml.safe_load(RunFiles(extra).config.read_text())
    cfg.update(cell="mingru", recipe="sig-more", recipe_file=None)
    RunFiles(extra).config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    result = json.loads(RunFiles(extra).result.read_text())
    RunFiles(extra).result.write_text(json.dumps({**result, "cell": "mingru",
                                                  "recipe": "sig-more"}))
    with_extra = render(build_report(Path("runs"), table="sig"), "markdown")
    assert list(_md_rows(with_extra)) == ["lstm", "lstm-srnn", "lstm-srnn-out", "lstm-gates",
                                          "mingru"]
    assert ("trained with different recipes (sig, sig-more); expected cells and the paper's "
            "numbers are those of 'sig'") in with_extra
    shown = ["lstm", "lstm-srnn", "lstm-srnn-out", "lstm-gates"]
    assert render(build_report(Path("runs"), table="sig", cells=shown), "markdown") == before


def test_cells_that_are_not_rows_are_refused(here):
    for cells, expected in (("lstm,nope", "unknown --cells cell 'nope'"),
                            ("lstm,,lstm-srnn", "expected cell names separated by commas"),
                            ("lstm,lstm", "each once")):
        r = run_cli("report", "runs", "--table", "sig", "--cells", cells, cwd=here)
        assert r.returncode == 2 and expected in r.stderr, (cells, r.stderr)
        assert "Traceback" not in r.stderr
    # the reference cell of --significance must be one of the rows asked for
    r = run_cli("report", "runs", "--table", "sig", "--significance", "--resamples", "200",
                "--cells", "lstm-srnn,lstm-gates", cwd=here)
    assert r.returncode == 2 and "unknown --against cell 'lstm'" in r.stderr


def test_latex_has_the_same_marks_and_names_the_test_in_the_caption(here, tmp_path):
    tex = _report("latex")
    spec = next(line for line in tex.splitlines() if line.startswith(r"\begin{tabular}"))
    ncol = len(spec.split("{")[2].rstrip("}"))
    rows = [line for line in tex.splitlines() if line.startswith(r"\texttt{")]
    assert ncol == 6 and all(row.count(" & ") == ncol - 1 for row in rows)
    srnn = next(r for r in rows if r.startswith(r"\texttt{lstm-srnn} "))
    assert r"worse (ASO worse $\varepsilon$ 0.00; 4/5 pairs worse, adj. p 0.003)" in srnn
    caption = next(line for line in tex.splitlines() if line.startswith(r"\caption"))
    assert "permutation test" in caption and "10,000 shuffles" in caption
    assert "level 0.05" in caption
    if shutil.which("pdflatex"):
        from test_report_formats import _compile

        done = _compile(tmp_path, tex)
        assert done.returncode == 0, done.stdout[-2000:]


def test_csv_and_json_carry_each_runs_pair_and_the_cells_mark(here):
    rows = list(csv.DictReader(io.StringIO(_report("csv"))))
    by = {(r["cell"], int(r["seed"])): r for r in rows}
    assert json.loads(_report("json"))[0].keys() == rows[0].keys()
    for seed in (1, 2, 3, 4, 5):
        assert by[("lstm", seed)]["vs_lstm.accuracy.verdict"] == "reference"
        srnn = by[("lstm-srnn", seed)]
        assert srnn["vs_lstm.accuracy.verdict"] == "worse"
        assert srnn["vs_lstm.accuracy.by"] == "aso+items"
        assert srnn["vs_lstm.accuracy.against"] == f"runs/sig/lstm/seed-{seed}"  # its own seed
        assert float(srnn["vs_lstm.accuracy.p_adjusted"]) >= float(srnn["vs_lstm.accuracy.p_items"])
        pair_way = srnn["vs_lstm.accuracy.pair_verdict"]
        assert pair_way in ("worse", "not distinguishable")
        assert (float(srnn["vs_lstm.accuracy.p"]) < 0.05) == (pair_way == "worse")
        delta = float(srnn["test.accuracy"]) - float(by[("lstm", seed)]["test.accuracy"])
        assert float(srnn["vs_lstm.accuracy.delta"]) == pytest.approx(delta)
        assert float(srnn["vs_lstm.accuracy.low"]) <= delta <= float(srnn["vs_lstm.accuracy.high"])
    gates = by[("lstm-gates", 1)]
    assert gates["vs_lstm.accuracy.against"] == "runs/sig/lstm/seed-1"
    assert gates["vs_lstm.accuracy.pair_verdict"] == "not distinguishable"
    assert by[("lstm-srnn-out", 1)]["vs_lstm.accuracy.p"] == ""
    assert "Almost Stochastic Order" in gates["significance"]


def test_the_cli_writes_every_format_with_significance(here):
    for fmt in ("markdown", "csv"):  # (every format is rendered by the tests above)
        done = run_cli("report", "runs", "--table", "sig", "--significance", "--format", fmt,
                       cwd=here)
        assert done.returncode == 0, done.stderr
        assert done.stdout == _report(fmt)
    bad = run_cli("report", "runs", "--significance", "--level", "1.5", cwd=here)
    assert bad.returncode == 2 and "--level must be a number in (0, 0.5]" in bad.stderr


def test_a_table_without_the_reference_cell_says_so(here, tmp_path, monkeypatch):
    """A reference cell of one table but not of another: the other says so.  (A cell of no
    table at all is an error: tests/test_damaged_records.py.)"""
    import yaml

    other = tmp_path / "runs" / "other" / "lstm-srnn" / "seed-1"
    shutil.copytree(here / "runs", tmp_path / "runs")
    shutil.copytree(here / "runs/sig/lstm-srnn/seed-1", other)
    cfg = yaml.safe_load(RunFiles(other).config.read_text())
    RunFiles(other).config.write_text(yaml.safe_dump({**cfg, "experiment": "other",
                                                       "recipe": None, "recipe_file": None}))
    monkeypatch.chdir(tmp_path)
    text = render(build_report(Path("runs"), significance=SignificanceOptions()), "markdown")
    assert "the table has no `lstm` row to compare the others with" in text
    assert "worse (ASO worse ε 0.00; 4/5 pairs worse, adj. p 0.003)" in text  # sig is tested


# -- compare --------------------------------------------------------------------------------
def test_a_clearly_worse_ablation_is_found_and_a_run_against_itself_is_not(here):
    c = compare(side_runs("runs/sig/lstm-srnn"), side_runs("runs/sig/lstm"))
    assert [(x.seed, y.seed) for x, y, _ in c.pairs] == [(s, s) for s in range(1, 6)]
    assert all(r.delta < 0 for _, _, r in c.pairs)
    assert sum(r.verdict(True) == "worse" for _, _, r in c.pairs) == 4
    assert c.seeds is not None and c.seeds.verdict() == "worse"
    assert c.verdict() == ("worse", "aso+items")
    assert c.spread_a.n == c.spread_b.n == 5
    # one run against five: paired with each; one seed: no ASO, every pair must agree
    one = compare(side_runs("runs/sig/lstm-gates"), side_runs("runs/sig/lstm"))
    assert [(x.seed, y.seed) for x, y, _ in one.pairs] == [(1, s) for s in range(1, 6)]
    assert one.seeds is None
    assert one.verdict() == ("not distinguishable", "items")
    assert one.pairs[0][2].delta == pytest.approx(
        100 * (sum(answers("lstm-gates", 1)) - sum(answers("lstm", 1))) / ITEMS)


def test_compare_cli_text_and_json(here):
    done = run_cli("compare", "runs/sig/lstm-srnn", "runs/sig/lstm", cwd=here)
    assert done.returncode == 0, done.stderr
    assert ("Over the 200 test items: the paired permutation test (10,000 shuffles, seed 12345) "
            "with the paired bootstrap's interval:") in done.stdout
    assert "Almost Stochastic Order" in done.stdout and "A worse" in done.stdout
    assert ("Overall (ASO over seeds and the paired tests over items agree; the rule of report "
            "--significance): A worse") in done.stdout
    assert "A 65.90 ± 4.25 (n=5), B 78.30 ± 3.17 (n=5)" in done.stdout
    assert "over 5 bootstrap seeds" in done.stdout
    js = run_cli("compare", "runs/sig/lstm-srnn/seed-1", "runs/sig/lstm/seed-1", "--json",
                 "--resamples", "300", "--seed", "3", cwd=here)
    got = json.loads(js.stdout)
    assert got["resamples"] == 300 and got["seed"] == 3 and got["paired"][0]["verdict"] == "worse"
    assert got["aso"] is None and got["spread_a"]["std"] is None and got["verdict"] == "worse"
    assert got["aso_not_run"] == "too few seeds to test (n=1; ≥ 5 recommended)"
    assert got["rests_on"] == "items" and got["test"] == "permutation"
    glob = run_cli("compare", "runs/sig/lstm-srnn/seed-*", "runs/sig/lstm", cwd=here)
    assert glob.returncode == 0 and glob.stdout == done.stdout


def test_compare_refuses_what_it_cannot_pair(here, tmp_path):
    def err(*args):
        done = run_cli("compare", *args, cwd=here)
        assert done.returncode == 2, done.stdout
        return done.stderr.replace("\n", " ")

    assert "lstmablate eval runs/sig/lstm-srnn-out/seed-1 --split test --scores" in err(
        "runs/sig/lstm-srnn-out/seed-1", "runs/sig/lstm/seed-1")
    assert "no such run folder" in err("runs/sig/nothing", "runs/sig/lstm")
    assert "--metric 'bleu'" in err("runs/sig/lstm", "runs/sig/lstm-srnn", "--metric", "bleu")
    # another test set: fewer items, or the same number with another gold label
    for what, edit in (("hold 199 and 200 items", lambda lines: lines[:-1]),
                       ("differ at item 5", lambda lines: [*lines[:5], lines[5].replace(
                           '"gold": 0', '"gold": 9').replace('"gold": 1', '"gold": 9'),
                           *lines[6:]])):
        other = tmp_path / what.replace(" ", "-") / "seed-1"
        shutil.copytree(here / "runs/sig/lstm/seed-2", other)
        scores = RunFiles(other).scores("test")
        lines = record_text(scores).splitlines()
        lines = edit(lines)
        head = json.loads(lines[0])
        head["items"] = len(lines) - 1
        write_record_text(scores, "\n".join([json.dumps(head), *lines[1:]]) + "\n")
        assert what in err(str(other), "runs/sig/lstm/seed-1")
        assert "different test sets" in err(str(other), "runs/sig/lstm/seed-1")
    unfinished = tmp_path / "unfinished"
    shutil.copytree(here / "runs/sig/lstm/seed-3", unfinished)
    RunFiles(unfinished).result.unlink()
    assert "the run is not finished" in err(str(unfinished), "runs/sig/lstm/seed-1")
    cut = tmp_path / "cut"
    shutil.copytree(here / "runs/sig/lstm/seed-3", cut)
    scores = RunFiles(cut).scores("test")
    write_record_text(scores, "\n".join(record_text(scores).splitlines()[:50]) + "\n")
    assert "announces 200 items, the file holds 49" in err(str(cut), "runs/sig/lstm/seed-1")


# -- BLEU: sacreBLEU's own paired bootstrap --------------------------------------------------
def _nmt_run(root: Path, cell: str, hyps: list[str], refs: list[str], refs_raw: list[str]) -> Path:
    """A finished nmt run of recipe nmt-multi30k-cpu whose test translations are ``hyps``."""
    import yaml

    from lstmablate.recipes import resolve_config
    from lstmablate.run.runs import RunResult, write_result
    from lstmablate.run.scores import write_scores
    from lstmablate.task import get_task
    from lstmablate_tasks.nmt.bleu import multi_bleu, sacrebleu_detok, sentence_statistics

    cfg = resolve_config(get_task("nmt"), cell, recipe="nmt-multi30k-cpu", seed=1)
    files = RunFiles.of(root, cfg.experiment, cell, 1)
    files.root.mkdir(parents=True)
    files.config.write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    test = {"bleu": multi_bleu(hyps, refs).score, "sacrebleu": sacrebleu_detok(hyps, refs_raw).score}
    write_result(files, RunResult("nmt", cell, cfg.experiment, 1, cfg.recipe, "ppl", False,
                                  {"dev": {}}, test, "last", 10, 1, 1.0, 1.0, 10))
    records = [{"id": i, "hyp": h, "hyp_tok": h, "bleu": b, "sacrebleu": s} for i, (h, b, s) in
               enumerate(zip(hyps, sentence_statistics(hyps, refs, tokenised=True),
                             sentence_statistics(hyps, refs_raw, tokenised=False)))]
    write_scores(files.scores("test"), {"task": "nmt", "experiment": cfg.experiment, "cell": cell,
                                        "seed": 1, "split": "test", "checkpoint": "last",
                                        "metrics": test}, records)
    return files.root


def test_bleu_comparison_equals_sacrebleus_paired_bootstrap(tmp_path):
    """`lstmablate compare --test sacrebleu` of two NMT runs on both BLEUs: sacreBLEU's
    PairedTest (paired bootstrap, 1000 resamples, its default seed) on the same translations
    gives the same scores and p-value."""
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    rng = random.Random(5)
    vocab = "ein Mann eine Frau mit dem Hund auf der Straße läuft sitzt , .".split()
    refs = [" ".join(rng.choices(vocab, k=rng.randint(5, 14))) for _ in range(150)]

    def noisy(p):
        return [" ".join(w if rng.random() > p else rng.choice(vocab) for w in r.split())
                for r in refs]

    baseline, system = noisy(0.35), noisy(0.3)
    a = _nmt_run(tmp_path / "runs", "lstm-srnn", system, refs, refs)
    b = _nmt_run(tmp_path / "runs", "lstm", baseline, refs, refs)
    for metric, sacre in (("bleu", BLEU(tokenize="none", smooth_method="none", force=True)),
                          ("sacrebleu", BLEU())):
        ours = compare([Run.open(a)], [Run.open(b)], metric_name=metric, test="sacrebleu")
        (_, _, r), = ours.pairs
        assert r.n_samples == 1000
        _, results = PairedTest([("baseline", baseline), ("system", system)], {"BLEU": sacre},
                                [refs], test_type="bs", n_samples=1000)()
        theirs = results["BLEU"][1]
        assert r.a == pytest.approx(theirs.score, abs=1e-9), metric
        assert r.p_value == theirs.p_value, metric
        assert f"{r.p_value:.4f}" in render_comparison(ours)
    default = compare([Run.open(a)], [Run.open(b)])
    assert default.metric.name == "bleu"  # the primary metric (ppl) is not a final one
    # the default test's p-value here is larger than sacreBLEU's: its p-value over-claims
    (_, _, permuted), = default.pairs
    sacre = compare([Run.open(a)], [Run.open(b)], test="sacrebleu").pairs[0][2]
    assert permuted.test == "permutation" and permuted.p_value > sacre.p_value


@pytest.mark.parametrize("aso, item_way, has_pairs, mark, by", [
    ("worse", "worse", True, "worse", "aso+items"),
    ("worse", "", True, "not distinguishable", "aso+items"),
    ("worse", "better", True, "not distinguishable", "aso+items"),
    ("not distinguishable", "worse", True, "not distinguishable", "aso+items"),
    ("better", "", False, "better", "aso"),
    (None, "worse", True, "worse", "items"),
    (None, "", True, "not distinguishable", "items"),
    (None, "", False, "", ""),
])
def test_the_mark_needs_both_tests_when_there_are_both(aso, item_way, has_pairs, mark, by):
    from lstmablate.results.significance import ASO_THRESHOLD
    from lstmablate.results.verdict import combined_verdict
    from lstmablate.results.significance import SeedResult

    eps = {"better": ((0.0,), (1.0,)), "worse": ((1.0,), (0.0,)),
           "not distinguishable": ((0.4,), (0.6,))}
    seeds = None if aso is None else SeedResult(*eps[aso], 5, 5, ASO_THRESHOLD)
    assert combined_verdict(seeds, item_way, has_pairs) == (mark, by)


# -- what a comparison refuses ----------------------------------------------------------------
def test_a_side_is_the_seeds_of_one_cell_each_seed_once(here, tmp_path):
    def err(*args):
        done = run_cli("compare", *args, cwd=here)
        assert done.returncode == 2, done.stdout
        assert "Traceback" not in done.stderr
        return " ".join(done.stderr.split())

    # two cells pooled as if they were seeds (and the LSTM then compared with itself)
    assert "side A holds runs of 4 cells (lstm, lstm-gates, lstm-srnn, lstm-srnn-out)" in err(
        "runs/sig/lstm*/seed-1", "runs/sig/lstm-srnn")
    assert "is on both sides" in err("runs/sig/lstm/seed-*", "runs/sig/lstm/seed-1")
    # a copy of one seed counts once, not twice
    side = tmp_path / "copy" / "lstm"
    shutil.copytree(here / "runs/sig/lstm", side)
    shutil.copytree(here / "runs/sig/lstm/seed-1", side / "seed-1-again")
    assert "side B holds seed 1 twice" in err("runs/sig/lstm-srnn", str(side))
    # runs of one cell whose configurations differ in more than the seed
    other = tmp_path / "other" / "lstm" / "seed-9"
    shutil.copytree(here / "runs/sig/lstm/seed-1", other.parent / "seed-1")
    shutil.copytree(here / "runs/sig/lstm/seed-2", other)
    import yaml

    files = RunFiles(other)
    cfg = yaml.safe_load(files.config.read_text())
    cfg["seed"] = 9
    cfg["train"]["lr"] = 0.5
    files.config.write_text(yaml.safe_dump(cfg))
    result = json.loads(files.result.read_text())
    files.result.write_text(json.dumps({**result, "seed": 9}))
    message = err("runs/sig/lstm-srnn", str(other.parent))
    assert "differ in their configuration, not only in the seed (train.lr" in message


def test_two_sides_scored_against_different_gold_data_are_refused(here, tmp_path):
    """Same items, same lengths and labels, but the scores record another digest of the
    split's gold data (another data file): refused; a file without a digest is compared by
    item keys, with a note."""
    other = tmp_path / "x" / "lstm-srnn" / "seed-1"
    shutil.copytree(here / "runs/sig/lstm-srnn/seed-1", other)
    scores = RunFiles(other).scores("test")
    lines = record_text(scores).splitlines()
    head = json.loads(lines[0])
    write_record_text(scores, "\n".join([json.dumps({**head, "reference": "sha256:" + "0" * 64}),
                                         *lines[1:]]) + "\n")
    done = run_cli("compare", str(other), "runs/sig/lstm/seed-1", cwd=here)
    assert done.returncode == 2 and "scored against different gold data" in done.stderr
    del head["reference"]
    write_record_text(scores, "\n".join([json.dumps(head), *lines[1:]]) + "\n")
    done = run_cli("compare", str(other), "runs/sig/lstm/seed-1", cwd=here)
    assert done.returncode == 0, done.stderr
    assert "1 scores file records no hash of their gold data" in " ".join(done.stdout.split())


def test_too_few_items_for_a_paired_test_is_refused(here, tmp_path):
    pair = []
    for cell in ("lstm-srnn", "lstm"):
        run = tmp_path / "few" / cell / "seed-1"
        shutil.copytree(here / f"runs/sig/{cell}/seed-1", run)
        scores = RunFiles(run).scores("test")
        lines = record_text(scores).splitlines()
        head = json.loads(lines[0])
        head.pop("reference")
        write_record_text(scores,
                          "\n".join([json.dumps({**head, "items": 2}), *lines[1:3]]) + "\n")
        pair.append(str(run))
    done = run_cli("compare", *pair, cwd=here)
    assert done.returncode == 2
    assert "scored on 2 test item(s); a paired test needs at least 20" in " ".join(
        done.stderr.split())


# -- the correction over a table's comparisons ------------------------------------------------
def test_holm_and_benjamini_hochberg_adjust_as_their_definitions():
    """Hand-computed: p = (0.01, 0.04, 0.03, 0.005), m = 4.  Holm (ascending, multiplied by
    m - rank, running maximum): 0.005*4 = 0.02, 0.01*3 = 0.03, 0.03*2 = 0.06, 0.04*1 -> 0.06.
    BH (descending, m p / rank, running minimum): 0.04*4/4 = 0.04, 0.03*4/3 = 0.04,
    0.01*4/2 = 0.02, 0.005*4/1 = 0.02."""
    from lstmablate.results.verdict import adjust

    p = [0.01, 0.04, 0.03, 0.005]
    assert adjust(p, "holm") == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert adjust(p, "bh") == pytest.approx([0.02, 0.04, 0.04, 0.02])
    assert adjust(p, "none") == p and adjust([0.2], "holm") == [0.2]


def test_the_tables_comparisons_are_corrected_together(here):
    """With Holm, a comparison's adjusted p is at least its own; the lstm-srnn mark keeps its
    worse; with no correction the item-level p is reported as it is.  (lstm-gates has no
    item-level direction, hence no p of its mark.)"""
    holm = {r["cell"]: r for r in csv.DictReader(io.StringIO(_report("csv")))}
    none = {r["cell"]: r for r in csv.DictReader(io.StringIO(_report("csv", correction="none")))}
    p, adj = (float(holm["lstm-srnn"][f"vs_lstm.accuracy.{k}"]) for k in ("p_items", "p_adjusted"))
    assert adj >= p
    assert float(none["lstm-srnn"]["vs_lstm.accuracy.p_adjusted"]) == pytest.approx(p)
    assert holm["lstm-srnn"]["vs_lstm.accuracy.verdict"] == "worse"
    assert holm["lstm-gates"]["vs_lstm.accuracy.p_items"] == ""
