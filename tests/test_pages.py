"""The results pages are what their run records give.

Every marked table of ``docs/results/*.md`` and of the README's headline is rendered anew from
the records kept in ``experiments/results/`` (``tools/pages.py``, ``make pages``) and
compared with the page; a page that differs is named with its first differing line and the
command that fixes it.  The records are in the one layout the pages and ``lstmablate report``
read (``<experiment>/<cell>/seed-<n>/``), and the generator's tables are checked against
values read here straight from the records' files.  The significance blocks (a permutation
test over every pair of runs) take minutes: they are the slow test, marked ``slow`` --
``make test`` leaves it out, ``make test-slow`` (and CI, once) runs it.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import re
import statistics
import sys
from pathlib import Path

import pytest
import yaml

from lstmablate.run.runs import RunFiles

ROOT = Path(__file__).resolve().parents[1]
RECORDS = ROOT / "experiments" / "results"


def _load_pages():
    """tools/pages.py (a script, not a module of the package), imported under its own name."""
    spec = importlib.util.spec_from_file_location("tools_pages", ROOT / "tools" / "pages.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


pages = _load_pages()
# its parts (tools/pagegen: importable once the script has put its folder on the path)
from pagegen import headline as pages_headline, markers as pages_markers, tables as pages_tables  # noqa: E402


def slow_block(command: str) -> bool:
    """The blocks that run the paired tests (seconds to minutes each: every pair of runs)."""
    return "--significance" in command or command.startswith("lstmablate compare")


def result(path: Path) -> dict:
    return json.loads((path / RunFiles.RESULT).read_text(encoding="utf-8"))


# -- the pages against the records -------------------------------------------------------------
def test_every_page_has_generated_tables():
    """The pages that show our numbers carry them between markers (the README's headline
    too), and every marker closes."""
    for page in pages.pages():
        text = page.read_text(encoding="utf-8")
        opened = len(re.findall(r"^<!-- generated: ", text, re.M))
        assert opened == len(re.findall(r"^<!-- /generated -->$", text, re.M)), page
        assert opened == len(pages_markers.BLOCK.findall(text)), f"{page}: a marker that does not close"
    marked = {p.name for p in pages.pages() if pages_markers.BLOCK.search(p.read_text(encoding="utf-8"))}
    assert {"README.md", "table1-ptb.md", "table2-squad.md", "table3-parsing.md",
            "table4-nmt.md", "sst.md", "secondorder-table2.md", "secondorder-table3.md",
            "dyck.md"} <= marked


def test_every_page_matches_its_records():
    problems = pages.check(pages.pages(), keep=lambda command: not slow_block(command))
    assert not problems, "\n".join(problems)


@pytest.mark.slow
def test_the_significance_blocks_match_their_records():
    problems = pages.check(pages.pages(), keep=slow_block)
    assert not problems, "\n".join(problems)


def test_a_page_that_differs_is_named_with_its_line_and_the_fix(tmp_path):
    command = ("pages runs experiments/results --table ptb-medium --cells lstm --col cell "
               "--col test.ppl")
    page = tmp_path / "page.md"
    page.write_text(f"# A page\n\nprose\n\n<!-- generated: {command} -->\n<!-- /generated -->\n",
                    encoding="utf-8")
    assert pages.main([str(page)]) == 0
    good = page.read_text(encoding="utf-8")
    expected = f"{result(RECORDS / 'ptb-medium' / 'lstm' / 'seed-1')['test']['ppl']:.2f}"
    assert f"| `lstm` | {expected} |" in good
    assert pages.check([page]) == []

    line = next(n for n, text in enumerate(good.splitlines(), 1) if expected in text)
    page.write_text(good.replace(expected, "80.00"), encoding="utf-8")
    (problem,) = pages.check([page])
    assert problem.startswith(f"{page}, line {line}, differs from what its run records give")
    assert "'| `lstm` | 80.00 |'" in problem and f"'| `lstm` | {expected} |'" in problem
    assert "make pages" in problem
    assert pages.main(["--check", str(page)]) == 1
    assert page.read_text(encoding="utf-8") != good  # --check changes nothing

    page.write_text(good.replace("| `lstm` |", "| `lstm` (hand-edited) |"), encoding="utf-8")
    assert pages.main([str(page)]) == 0
    assert page.read_text(encoding="utf-8") == good  # regenerating restores the block, prose kept


def test_only_the_blocks_change_when_a_page_is_regenerated(tmp_path):
    page = tmp_path / "page.md"
    prose = "Hand-written prose, 12.34 kept as it is.\n"
    page.write_text(prose + "<!-- generated: pages records experiments/results -->\nstale\n"
                    "<!-- /generated -->\n" + prose, encoding="utf-8")
    pages.main([str(page)])
    text = page.read_text(encoding="utf-8")
    assert text.startswith(prose) and text.endswith("<!-- /generated -->\n" + prose)
    assert "stale" not in text and "| `nmt-multi30k-cpu` |" in text


def test_only_renders_the_blocks_whose_command_contains_the_text(tmp_path):
    """`tools/pages.py --only TEXT`: the blocks whose command contains TEXT are rendered and
    checked, the others left exactly as they are, stale or not."""
    medium = "pages runs experiments/results --table ptb-medium --cells lstm --col cell"
    small = "pages runs experiments/results --table ptb-small --cells lstm --col cell"
    page = tmp_path / "page.md"
    page.write_text(f"<!-- generated: {medium} -->\nstale\n<!-- /generated -->\n"
                    f"<!-- generated: {small} -->\nstale\n<!-- /generated -->\n", encoding="utf-8")
    assert pages.main(["--check", "--only", "ptb-medium", str(page)]) == 1
    assert pages.main(["--only", "ptb-medium", str(page)]) == 0
    text = page.read_text(encoding="utf-8")
    first, second = text.split(f"<!-- generated: {small} -->")
    assert "stale" not in first and "| `lstm` |" in first
    assert second == "\nstale\n<!-- /generated -->\n"
    assert pages.main(["--check", "--only", "ptb-medium", str(page)]) == 0
    assert pages.main(["--check", str(page)]) == 1  # the other block is still stale


# -- the records' layout -----------------------------------------------------------------------
def run_folders() -> list[Path]:
    return sorted(p.parent for p in RECORDS.rglob(RunFiles.RESULT))


def test_every_record_is_in_the_one_layout():
    """``<experiment>/<cell>/seed-<n>/``, named as its config.yaml names the run, with the
    files a run writes; one folder per (experiment, cell, seed)."""
    folders = run_folders()
    assert len(folders) > 50
    for folder in folders:
        rel = folder.relative_to(RECORDS).parts
        assert len(rel) == 3 and re.fullmatch(r"seed-\d+", rel[2]), folder
        config = yaml.safe_load((folder / RunFiles.CONFIG).read_text(encoding="utf-8"))
        assert (config["experiment"], config["cell"], f"seed-{config['seed']}") == rel, folder
        assert (folder / RunFiles.METRICS).is_file(), folder
        assert (folder / RunFiles.ENV).is_file() or (RECORDS / rel[0] / "PROVENANCE.md").is_file()
    assert not [p for p in RECORDS.iterdir() if re.search(r"-[0-9a-f]{7}$", p.name)], \
        "a folder named by a commit: records are named by their experiment"


# -- the generator's tables against the records' files -----------------------------------------
def test_a_runs_table_shows_what_the_records_hold():
    folder = RECORDS / "ptb-medium" / "lstm-gates" / "seed-1"
    res = result(folder)
    lines = (folder / RunFiles.METRICS).read_text(encoding="utf-8").splitlines()
    evaluations = [json.loads(line) for line in lines]
    text = pages.render("pages runs experiments/results --table ptb-medium --cells lstm-gates "
                        "--col cell --col lr=config.train.lr --col ppl@1,39 --col best.ppl "
                        "--col train_time --col paper.ppl --col test.ppl+test.nll:.3f")
    header, rule, row = text.splitlines()[:3]
    assert header == ("| cell | lr | dev ppl, epoch 1 / 39 | best dev ppl (epoch) | train time | "
                      "paper | test ppl / test nll |")
    assert rule == "|---|---|---|---|---|---|---|"
    best = res["best"]
    assert row == (f"| `lstm-gates` | 0.1 | {evaluations[0]['ppl']:.2f} / "
                   f"{evaluations[-1]['ppl']:.2f} | {best['dev']['ppl']:.2f} ({best['epoch']}) | "
                   f"{res['train_time_s'] / 60:.1f} min | 140.9 | {res['test']['ppl']:.2f} / "
                   f"{res['test']['nll']:.3f} |")
    # they were trained before the CPU time was recorded
    cpu = pages.render("pages runs experiments/results --table ptb-medium --cells lstm-gates "
                       "--col cell --col train_cpu")
    assert cpu.splitlines()[2] == "| `lstm-gates` | not recorded |"
    # the runs have no env.json: the table names the machine from the PROVENANCE.md beside them
    machine = pages_tables.provenance_machine(RECORDS / "ptb-medium" / "PROVENANCE.md")
    assert machine and f"{machine} (`experiments/results/ptb-medium/PROVENANCE.md`)" in text


def test_the_cpu_time_column_shows_the_records_cpu_minutes(tmp_path, monkeypatch):
    run = tmp_path / "records" / "ptb-medium" / "lstm-gates" / "seed-1"
    shutil.copytree(RECORDS / "ptb-medium" / "lstm-gates" / "seed-1", run)
    shutil.copy(RECORDS / "ptb-medium" / "PROVENANCE.md", run.parents[1])
    res = result(run)
    (run / RunFiles.RESULT).write_text(json.dumps({**res, "train_cpu_s": 5430.0}))
    monkeypatch.chdir(tmp_path)
    text = pages.render("pages runs records --table ptb-medium --col cell --col train_cpu "
                        "--col train_time")
    assert text.splitlines()[0] == "| cell | train CPU time | train time |"
    assert text.splitlines()[2] == (f"| `lstm-gates` | 90.5 min | "
                                    f"{res['train_time_s'] / 60:.1f} min |")


def test_the_headline_is_the_mean_over_the_seeds_kept():
    text = pages.render("pages headline experiments/results")
    lstm = next(line for line in text.splitlines() if line.startswith("| LSTM (`lstm`)"))
    las = statistics.mean(result(f)["test"]["las"]
                          for f in (RECORDS / "parsing-ewt-cpu" / "lstm").iterdir())
    bleu = statistics.mean(result(f)["test"]["bleu"]
                           for f in (RECORDS / "nmt-multi30k-cpu" / "lstm").iterdir())
    assert f"| {las:.2f} (88.05) |" in lstm and f"| {bleu:.2f} (38.19) |" in lstm
    gates = next(line for line in text.splitlines() if line.startswith("| −GATES (`lstm-gates`)"))
    # a learning rate other than the recipe's is named beside its number
    assert ", lr 0.1 |" in gates and ", lr 0.2 |" in gates


def test_the_headline_names_the_machines_of_the_runs_it_shows():
    """The parser's experiment also holds runs of cells the headline does not show (the
    simpler recurrences): its machine line counts the paper cells' runs only."""
    text = pages.render("pages headline experiments/results")
    line = next(x for x in text.splitlines() if x.startswith("* UD EWT: "))
    counted = sum(int(n) for n in re.findall(r"\((\d+) runs?\)", line))
    paper = ("lstm", "lstm-srnn", "lstm-srnn-out", "lstm-srnn-hidden", "lstm-gates")
    shown = [f for cell in paper for f in (RECORDS / "parsing-ewt-cpu" / cell).iterdir()]
    assert [p for p in (RECORDS / "parsing-ewt-cpu").iterdir() if p.name not in paper]
    assert counted == len(shown), line


def test_a_headline_column_never_counts_one_seed_twice(monkeypatch):
    """Two experiments pooled in one column, each with `lstm-gates` seed 1: refused, naming
    the column and the seed, rather than averaged as two seeds."""
    pooled = pages_headline.HeadlineColumn("PTB", "PTB small", ("ptb-small", "ptb-small-gates-lr0.2"),
                                  "ppl", None)
    monkeypatch.setattr(pages_headline, "HEADLINE", (pooled,))
    with pytest.raises(pages_markers.PageError, match=r"'PTB small'.*`lstm-gates` has seed\(s\) 1 "):
        pages.render("pages headline experiments/results")


def test_the_machine_is_named_from_env_json_never_the_host():
    cpu = {"device": "cpu", "processor": "AMD EPYC", "cpus": 2, "threads": 1,
           "torch": "2.13.0+cpu", "hostname": "build-host-7"}
    assert pages_tables.machine_of(cpu) == "AMD EPYC, 2 cores, PyTorch 2.13.0+cpu, 1 thread per run"
    old = {"device": "cpu", "threads": 2, "torch": "2.13.0+cpu", "hostname": "vm"}
    assert pages_tables.machine_of(old) == ("CPU (model not recorded), PyTorch 2.13.0+cpu, "
                                     "2 threads per run")
    gpu = {"device": "cuda:0", "gpu": "NVIDIA H100 80GB HBM3", "cpus": 16, "threads": 4,
           "torch": "2.13.0+cu128"}
    assert pages_tables.machine_of(gpu) == "NVIDIA H100 80GB HBM3, PyTorch 2.13.0+cu128, 4 threads per run"
    for env in (cpu, old, gpu):
        assert env.get("hostname", "-") not in pages_tables.machine_of(env)


def test_a_report_of_some_cells_names_the_machines_of_their_runs_only():
    """`lstmablate report DIR --cells ...` in a marker: the machine line counts the runs of
    the rows shown, not every run of the experiment's folder (the CPU parser's runs were made
    on several machines, so the line counts each one's runs)."""
    def counted(text: str) -> int:
        line = next(x for x in text.splitlines() if x.startswith("Machine (from the runs'"))
        return sum(int(n) for n in re.findall(r"\((\d+) runs?\)", line))

    folder = RECORDS / "parsing-ewt-cpu"
    every = pages.render(f"lstmablate report {folder.relative_to(ROOT)}")
    two = pages.render(f"lstmablate report {folder.relative_to(ROOT)} --cells lstm,sru")
    runs = list(folder.glob("*/seed-*"))
    mine = [p for p in runs if p.parent.name in ("lstm", "sru")]
    assert len(mine) == 6 and len(runs) > len(mine)
    assert "| `sru`" in two and "| `qrnn`" not in two and "| `qrnn`" in every
    assert (counted(two), counted(every)) == (len(mine), len(runs))


@pytest.mark.parametrize("command, named", [
    ("lstmablate train --task dyck --cell lstm", "unknown generator"),
    ("pages runs experiments/results --table ptb-medium --col nonsense",
     "unknown column 'nonsense'"),
    ("pages runs experiments/results --table ptb-medium", "no --col"),
    ("pages runs experiments/results --table no-such-experiment --col cell",
     "unknown recipe 'no-such-experiment'"),
    ("pages runs experiments/results/dyck-demo/lstm/seed-1/scores --col cell", "no runs found"),
    ("lstmablate compare --split dev a b", "run folders only"),
])
def test_a_marker_that_cannot_be_rendered_is_named(tmp_path, command, named):
    page = tmp_path / "page.md"
    page.write_text(f"<!-- generated: {command} -->\n<!-- /generated -->\n", encoding="utf-8")
    with pytest.raises(pages_markers.PageError, match=re.escape(named)) as e:
        pages.check([page])
    assert str(page) in str(e.value)


def test_a_table_shown_on_two_pages_is_computed_once(tmp_path, monkeypatch):
    command = "pages runs experiments/results --table ptb-medium --cells lstm --col cell"
    paths = []
    for name in ("one.md", "two.md"):
        paths.append(tmp_path / name)
        paths[-1].write_text(f"# {name}\n\n<!-- generated: {command} -->\n<!-- /generated -->\n",
                             encoding="utf-8")
    calls = []
    real = pages.render
    monkeypatch.setattr(pages, "render", lambda c: calls.append(c) or real(c))
    assert pages.main([str(p) for p in paths]) == 0
    assert calls == [command]
    texts = [p.read_text(encoding="utf-8") for p in paths]
    assert texts[0].replace("one.md", "two.md") == texts[1] and "| `lstm` |" in texts[0]
    assert pages.check(paths) == [] and calls == [command, command]  # one per generation
