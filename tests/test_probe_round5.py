"""The fifth hostile probe, kept as tests: every case it found is refused with exit 2 and one
paragraph naming what is wrong (or works as the user meant), and nothing waits forever.

* **No reader waits on a FIFO**: ``eval`` with ``best.pt`` or ``last.pt`` a FIFO,
  ``visualize`` with ``best.pt`` a FIFO, the GPU window's ``--plan`` and ``tools/pages.py``'s
  page -- each refused within a timeout (:data:`FIFO_READERS`: a new reader of a user's file
  is one more row).
* **The GPU window and gpu-check keep the command line's contract**: plan and state files of
  the wrong shape, size, nesting or kind; unknown recipes, tasks and cells; options out of
  range (``--then``, ``--check-budget``, ``--minutes``, ``--device``, ``--budget``);
  ``--out``/``--folder`` naming a file, a device or a folder inside a run folder; no GPU --
  each exit 2, one line, no traceback; relative paths are the caller's.
* **tools/pages.py** runs only read-only commands: a marker with ``--out`` or ``--force`` is
  an error naming its page and line and writes nothing (``--check`` writes nothing at all: a
  checksum of the trees around it); a broken marker (an unbalanced quote, a start without its
  end), a missing, binary, directory or FIFO page, ``pages headline`` of a missing folder --
  exit 2 naming the page and line.
* **Scores and recipes**: a negative or boolean per-item statistic, a scores header naming
  another cell, seed or split than its run folder; recipes naming unknown cells, metrics,
  options or a seed twice (``train``, ``sweep``, ``report``); ``report --against`` without
  ``--significance``.
* **Data**: blank lines in a PTB file read with ``data.verify=false``, a blank Billion Word
  shard, a vectors file that shares no word with the vocabulary.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from cli_in_process import expect_error, run_cli
from conftest import TINY_DYCK, record_text, write_record_text

from lstmablate.bench import gpu_check, window, window_files
from lstmablate.bench.gpu_record import read_rows
from lstmablate.run.runs import RunFiles

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures"


def _load_pages():
    spec = importlib.util.spec_from_file_location("tools_pages", ROOT / "tools" / "pages.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


pages = sys.modules.get("tools_pages") or _load_pages()
from pagegen import markers as pages_markers  # noqa: E402  (tools/pagegen, on the path through pages.py)


def tree_digest(*folders: Path) -> dict[str, str]:
    """sha256 of every file under ``folders`` (links not followed), by path."""
    out = {}
    for folder in folders:
        for p in sorted(folder.rglob("*")):
            if p.is_file() and not p.is_symlink():
                out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def one_refusal(code: int, err: str, prog: str, *fragments: str) -> str:
    """Exit 2 and one line ``PROG: error: ...`` holding ``fragments``, no traceback."""
    assert code == 2, err
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert err.startswith(f"{prog}: error: "), err
    for f in fragments:
        assert f in err, (f, err)
    return err


def in_thread(fn, timeout: float = 60.0, fifo: Path | None = None):
    """``fn()`` in a thread, which must end within ``timeout`` (else the FIFO it waits on is
    opened for writing to release it, and the test fails)."""
    out = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        if fifo is not None:
            with open(fifo, "w"):
                pass
        pytest.fail("it waits forever on the FIFO")
    return out[0]


# -- runs to read -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Two finished tiny Dyck runs (lstm and lstm-srnn, seed 1) with their scores."""
    home = tmp_path_factory.mktemp("probe5")
    (home / "tiny.yaml").write_text(TINY_DYCK)
    for cell in ("lstm", "lstm-srnn"):
        r = run_cli("train", "--task", "dyck", "--recipe", "tiny.yaml", "--cell", cell, "--out",
                    "runs", "--set", "train.max_steps=2", "--threads", "1", cwd=home)
        assert r.returncode == 0, r.stderr
    return home


@pytest.fixture
def site(trained, tmp_path):
    shutil.copytree(trained, tmp_path, dirs_exist_ok=True)
    return tmp_path


RUN = "runs/tiny/lstm/seed-1"


# -- no reader waits on a FIFO ----------------------------------------------------------------
def _fifo_checkpoint(site: Path, name: str) -> Path:
    path = site / RUN / name
    path.unlink()
    os.mkfifo(path)
    return path


#: (name, how to set the FIFO up in the site and return it, the command; what it says)
FIFO_READERS = {
    "eval best.pt": (lambda s: _fifo_checkpoint(s, RunFiles.BEST),
                     lambda s, f: run_cli("eval", RUN, "--checkpoint", "best", cwd=s),
                     "best.pt is a named pipe (FIFO)"),
    "eval last.pt": (lambda s: _fifo_checkpoint(s, RunFiles.LAST),
                     lambda s, f: run_cli("eval", RUN, "--checkpoint", "last", cwd=s),
                     "last.pt is a named pipe (FIFO)"),
    "visualize best.pt": (lambda s: _fifo_checkpoint(s, RunFiles.BEST),
                          lambda s, f: run_cli("visualize", RUN, "--text", "(a a)",
                                               "--checkpoint", "best", "--out", "w.png", cwd=s),
                          "best.pt is a named pipe (FIFO)"),
}


@pytest.mark.parametrize("name", sorted(FIFO_READERS))
def test_a_command_never_waits_on_a_fifo(site, name):
    make, command, said = FIFO_READERS[name]
    fifo = make(site)
    r = in_thread(lambda: command(site, fifo), fifo=fifo)
    expect_error(r, said, "mv ")


def test_the_window_and_the_page_generator_never_wait_on_a_fifo(tmp_path, capsys):
    fifo = tmp_path / "plan.json"
    os.mkfifo(fifo)
    code = in_thread(lambda: window.main(["prepare", "--wheels", "", "--plan", str(fifo),
                                          "--folder", str(tmp_path / "w")]), fifo=fifo)
    one_refusal(code, capsys.readouterr().err, "gpu-window", "plan.json: it is a named pipe")
    code = in_thread(lambda: pages.main(["--check", str(fifo)]), fifo=fifo)
    one_refusal(code, capsys.readouterr().err, "pages", "plan.json: it is a named pipe")
    # a device is never read forever
    code = window.main(["prepare", "--wheels", "", "--plan", "/dev/zero", "--folder",
                        str(tmp_path / "w")])
    one_refusal(code, capsys.readouterr().err, "gpu-window", "/dev/zero: it is a device")
    one_refusal(pages.main(["--check", "/dev/zero"]), capsys.readouterr().err, "pages",
                "/dev/zero: it is a device")


# -- the GPU window -----------------------------------------------------------------------------
def _window(tmp_path: Path, capsys, *argv: str) -> str:
    code = window.main(list(argv))
    return one_refusal(code, capsys.readouterr().err, "gpu-window")


PLANS = {
    "not JSON": ("[[{", "line 1, column 4"),
    "a mapping": ('{"name": "x"}', "a plan is a JSON list of slots"),
    "empty": ("[]", "a plan at least one slot"),
    "an empty slot": ("[[]]", "every slot holds at least one group"),
    "a name that is a number": ('[[{"name": 1, "recipe": "ptb-medium"}]]', "'name' must be"),
    "a recipe that is a list": ('[[{"name": "a", "recipe": ["x"]}]]', "'recipe' must be"),
    "an unknown field": ('[[{"name": "a", "recipe": "ptb-medium", "epochs": 3}]]',
                         "unknown field 'epochs'"),
    "a string seed": ('[[{"name": "a", "recipe": "ptb-medium", "seed": "1"}]]', "'seed' must be"),
    "a boolean seed": ('[[{"name": "a", "recipe": "ptb-medium", "seed": true}]]', "'seed' must be"),
    "a negative start": ('[[{"name": "a", "recipe": "ptb-medium", "start_s": -5}]]',
                         "'start_s' must be"),
    "a NaN final time": ('[[{"name": "a", "recipe": "ptb-medium", "final_s": NaN}]]',
                         "'final_s' must be"),
    "a negative rate": ('[[{"name": "a", "recipe": "ptb-medium", "lrs": [-0.1]}]]',
                        "'lrs' must be"),
    "two groups of one name": ('[[{"name": "a", "recipe": "ptb-medium"}], '
                               '[{"name": "a", "recipe": "ptb-small"}]]', "a second group named"),
    "cells twice": ('[[{"name": "a", "recipe": "ptb-medium", "cells": ["lstm", "lstm"]}]]',
                    "'cells' must be"),
    "nested deeply": ("[" * 100_000 + "]" * 100_000, "plan.json"),
    "huge": ("[" + " " * (5 * 2**20) + "]", "more than the"),
}


@pytest.mark.parametrize("case", sorted(PLANS))
def test_a_plan_of_the_wrong_shape_is_refused_before_anything_runs(tmp_path, capsys, case):
    text, said = PLANS[case]
    plan = tmp_path / "plan.json"
    plan.write_text(text)
    for mode in (["prepare", "--wheels", ""], ["run", "--minutes", "2", "--out", "o",
                                               "--device", "cpu", "--no-install"]):
        err = _window(tmp_path, capsys, *mode, "--plan", str(plan), "--folder",
                      str(tmp_path / "w"))
        assert said in err and str(plan) in err
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("group, said", [
    ({"recipe": "no-such-recipe"}, "unknown recipe 'no-such-recipe'"),
    ({"recipe": "ptb-medium", "cells": ["no-such-cell"]}, "unknown cell 'no-such-cell'"),
    ({"recipe": "table1"}, "is a table spec"),
    ({"recipe": "ptb-medium", "sets": ["train.no_such_option=1"]}, "no_such_option"),
    ({"recipe": "ptb-medium", "experiment": "a/b"}, "experiment"),
])
def test_a_plan_naming_what_does_not_exist_is_refused(tmp_path, capsys, group, said):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps([[dict(name="g", **group)]]))
    err = _window(tmp_path, capsys, "run", "--minutes", "2", "--out", str(tmp_path / "o"),
                  "--device", "cpu", "--no-install", "--plan", str(plan), "--folder",
                  str(tmp_path / "w"))
    assert said in err and "group 'g'" in err
    assert not (tmp_path / "w" / "local" / "check").exists()  # (gpu-check never started)


@pytest.mark.parametrize("options, said", [
    (["--then", "-1000"], "--then -1000"), (["--then", "nan"], "--then nan"),
    (["--then", "inf"], "--then inf"), (["--then", "1e308"], "--then 1e+308"),
    (["--check-budget", "0"], "--check-budget 0"), (["--check-budget", "nan"], "--check-budget"),
    (["--check-budget", "600"], "--check-budget 600"), (["--minutes", "nan"], "--minutes nan"),
    (["--minutes", "0.5"], "--minutes 0.5"), (["--device", "meta"], "--device 'meta'"),
    (["--device", "cuda:x"], "--device 'cuda:x'"), (["--check-stage", "nope"], "--check-stage"),
    (["--minutes"], "expected one argument"),
])
def test_the_windows_options_are_checked(tmp_path, capsys, options, said):
    argv = ["run", "--minutes", "2", "--out", str(tmp_path / "o"), "--folder",
            str(tmp_path / "w"), *options]
    assert said in _window(tmp_path, capsys, *argv)


def test_the_windows_folders_are_never_a_file_a_device_or_in_a_run_folder(site, capsys):
    (site / "afile").write_text("mine")
    run = site / RUN
    for option, value, said in (("--out", "afile", "not a folder (a regular file)"),
                                ("--out", "/dev/null", "not a folder (a device)"),
                                ("--out", str(run / "out"), "inside the run folder"),
                                ("--out", str(run), "inside the run folder"),
                                ("--folder", str(site / "afile"), "not a folder"),
                                ("--folder", str(run / "w"), "inside the run folder")):
        args = {"--out": str(site / "o"), "--folder": str(site / "w"), option: value}
        os.chdir(site)
        try:
            err = _window(site, capsys, "watch", "--minutes", "2", *[x for kv in args.items()
                                                                      for x in kv])
        finally:
            os.chdir(ROOT)
        assert option in err and said in err
    assert (site / "afile").read_text() == "mine" and not (run / "out").exists()


def test_relative_paths_are_the_callers(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = window.parse_args(["watch", "--minutes", "2", "--out", "o", "--folder", "f",
                              "--plan", "p.json"])
    assert (args.out, args.folder, args.plan) == (tmp_path / "o", tmp_path / "f",
                                                  str(tmp_path / "p.json"))
    args = gpu_check.parse_args(["--out", "rec", "--data-dir", "data"])
    assert (args.out, args.data_dir) == (str(tmp_path / "rec"), str(tmp_path / "data"))


#: a good state file, as a window's run writes it
def _state(**change) -> dict:
    run = dict(group="g", recipe="r", recipe_name="r", task="dyck", cell="lstm", seed=1,
               experiment="e", sets=[], epochs=1, full_epochs=1, steps_per_epoch=1,
               estimate_s=1.0, pid=None, state="planned")
    runs = [dict(run, **change.pop("run", {}))]
    return {**dict(created="now", device="cpu", runs=runs, not_started=[],
                   calls=[dict(mode="run", started="now", minutes=2)]), **change}


@pytest.mark.parametrize("content, said", [
    ("{", "malformed JSON"), ("[]", "the state is a JSON object"),
    (json.dumps({"created": "now"}), "has no 'device'"),
    (json.dumps(_state(extra=1)), "unknown field 'extra'"),
    (json.dumps(_state(run={"pid": 1})), "'pid' must be"),
    (json.dumps(_state(run={"pid": 2**40})), "'pid' must be"),
    (json.dumps(_state(run={"started_at": -5})), "'started_at' must be"),
    (json.dumps(_state(run={"seed": "1"})), "'seed' must be"),
    (json.dumps(_state(run={"colour": "red"})), "unknown field 'colour'"),
    (json.dumps(_state(calls=[])), "'calls' must be"),
])
def test_a_damaged_state_file_is_refused(tmp_path, capsys, content, said):
    state = tmp_path / "w" / "local" / window_files.STATE
    state.parent.mkdir(parents=True)
    state.write_text(content)
    err = _window(tmp_path, capsys, "watch", "--minutes", "2", "--out", str(tmp_path / "o"),
                  "--folder", str(tmp_path / "w"))
    assert said in err and window_files.STATE in err
    assert not (tmp_path / "o").exists()


def test_a_good_state_file_is_read_back():
    from lstmablate.bench.window_files import check_state

    check_state(json.loads(json.dumps(_state())), "window.json")


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has a GPU")
def test_without_a_gpu_the_window_and_make_gpu_window_stop_with_one_line(tmp_path, capsys):
    err = _window(tmp_path, capsys, "run", "--minutes", "2", "--out", str(tmp_path / "o"),
                  "--folder", str(tmp_path / "w"))
    assert "no CUDA device here" in err and not (tmp_path / "w").exists()
    r = subprocess.run(["make", "-s", "gpu-window", f"OUT={tmp_path / 'o'}",
                        f"FOLDER={tmp_path / 'w'}", f"GPU_CHECK_PY={sys.executable}"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    ours = [ln for ln in r.stderr.splitlines() if not ln.startswith("make")]
    assert len(ours) == 1 and ours[0].startswith("gpu-window: error: ") and "no CUDA" in ours[0]
    assert not (tmp_path / "w").exists() and not (tmp_path / "o").exists()


# -- gpu-check ----------------------------------------------------------------------------------
@pytest.mark.parametrize("options, said", [
    (["--device", "meta"], "--device 'meta'"), (["--budget", "nan"], "--budget nan"),
    (["--budget", "0"], "--budget 0"), (["--stage-seconds", "steps=nan"], "--stage-seconds"),
    (["--step-repeats", "0"], "--step-repeats 0"), (["--only", "nope"], "invalid choice"),
    (["--device", "cpu", "--recipe", "no-such"], "unknown recipe 'no-such'"),
    (["--device", "cpu", "--task", "no-such"], "no-such"),
    (["--device", "cpu", "--cell", "no-such"], "unknown cell 'no-such'"),
])
def test_gpu_checks_options_and_names_are_checked_before_any_stage(tmp_path, capsys, options,
                                                                   said):
    code = gpu_check.main(["--out", str(tmp_path / "rec"), "--only", "environment", *options])
    one_refusal(code, capsys.readouterr().err, "gpu-check", said)
    assert not (tmp_path / "rec").exists()


def test_gpu_checks_out_is_never_a_file_a_device_or_in_a_run_folder(site, capsys):
    (site / "afile").write_text("mine")
    for out, said in (("afile", "a regular file"), ("/dev/null", "a device"),
                      (f"{RUN}/rec", "inside the run folder"), (RUN, "inside the run folder")):
        os.chdir(site)
        try:
            code = gpu_check.main(["--out", out, "--device", "cpu", "--only", "environment"])
        finally:
            os.chdir(ROOT)
        one_refusal(code, capsys.readouterr().err, "gpu-check", "--out", said)
    assert (site / "afile").read_text() == "mine" and not (site / RUN / "rec").exists()


def test_gpu_check_with_a_relative_out_writes_there(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = gpu_check.main(["--out", "rec", "--device", "cpu", "--only", "environment",
                           "--budget", "120"])
    assert code == 0, capsys.readouterr().err
    rows = read_rows(next((tmp_path / "rec").glob("*.jsonl")))
    assert [r["status"] for r in rows if r.get("kind") == "stage"] == ["done"]


def test_a_stage_process_refuses_options_that_are_not_json(tmp_path):
    r = subprocess.run([sys.executable, "-m", "lstmablate.bench.gpu_stages", "environment",
                        "--rows", str(tmp_path / "r"), "--result", str(tmp_path / "o"),
                        "--deadline", "1", "--device", "cpu", "--options", "[1"],
                       capture_output=True, text=True, timeout=120)
    one_refusal(r.returncode, r.stderr, "gpu-stage", "--options")


# -- tools/pages.py -----------------------------------------------------------------------------
RECORDS = ROOT / "experiments" / "results"


def _page(tmp_path: Path, *markers: str, text: str = "# A page\n\n") -> Path:
    page = tmp_path / "page.md"
    page.write_text(text + "".join(f"<!-- generated: {m} -->\nold\n<!-- /generated -->\n\n"
                                   for m in markers))
    return page


@pytest.mark.parametrize("extra", ["--out {victim} --force", "--out={victim}", "--force",
                                   "--print", "--format json"])
def test_a_marker_that_would_write_is_refused_and_writes_nothing(tmp_path, capsys, extra):
    victim = tmp_path / "victim.md"
    victim.write_text("the user's own file\n")
    page = _page(tmp_path, "pages records experiments/results",
                 f"lstmablate report experiments/results/dyck-demo {extra.format(victim=victim)}")
    before = tree_digest(tmp_path, RECORDS / "dyck-demo")
    for argv in (["--check", str(page)], [str(page)]):
        err = one_refusal(pages.main(argv), capsys.readouterr().err, "pages",
                          f"{page}, line 7", "does not take")
    assert tree_digest(tmp_path, RECORDS / "dyck-demo") == before
    assert "only reads" in err or "--format" in extra


def test_check_writes_nothing_anywhere(tmp_path, capsys):
    """A stale page checked: exit 1 naming it, and not one byte changed in the page's folder,
    the records it reads or the pages of the repository."""
    page = _page(tmp_path, "pages runs experiments/results --table dyck-demo --col cell",
                 "lstmablate report experiments/results/dyck-demo --cells lstm,lstm-gates")
    before = tree_digest(tmp_path, RECORDS / "dyck-demo", ROOT / "docs")
    assert pages.main(["--check", str(page)]) == 1
    assert "differs from what its run records give" in capsys.readouterr().out
    assert tree_digest(tmp_path, RECORDS / "dyck-demo", ROOT / "docs") == before


@pytest.mark.parametrize("text, said", [
    ("<!-- generated: lstmablate report 'experiments/results -->\nx\n<!-- /generated -->\n",
     "line 1: the marker's command cannot be read"),
    ("prose\n\n<!-- generated: pages records experiments/results -->\nno end\n",
     "line 3: the marker '<!-- generated: pages records experiments/results -->' opens a block"),
    ("prose\n<!-- /generated -->\n", "line 2: the marker '<!-- /generated -->' closes a block"),
    ("<!-- generated: pages headline /nonexistent -->\n<!-- /generated -->\n",
     "line 1: pages headline: /nonexistent is not a folder"),
    ("<!-- generated: lstmablate train --task dyck -->\n<!-- /generated -->\n",
     "line 1: unknown generator"),
])
def test_a_broken_marker_names_its_page_and_line(tmp_path, capsys, text, said):
    page = tmp_path / "page.md"
    page.write_text(text)
    for argv in (["--check", str(page)], [str(page)]):
        one_refusal(pages.main(argv), capsys.readouterr().err, "pages", f"{page}, {said}")
    assert page.read_text() == text


@pytest.mark.parametrize("make, said", [
    (lambda p: None, "No such file"),
    (lambda p: p.write_bytes(b"\xff\xfe\x00 not text"), "not UTF-8 text"),
    (lambda p: p.mkdir(), "it is a directory"),
])
def test_a_page_that_cannot_be_read_is_named(tmp_path, capsys, make, said):
    page = tmp_path / "page.md"
    make(page)
    one_refusal(pages.main(["--check", str(page)]), capsys.readouterr().err, "pages",
                str(page), said)


def test_every_shipped_marker_passes_the_allow_list():
    for page in pages.pages():
        text = pages.read_page(page)
        pages_markers.check_markers(text, str(page))
        for m in pages_markers.BLOCK.finditer(text):
            argv = m.group("command").split()
            if argv[:2] == ["lstmablate", "report"]:
                pages_markers.check_report_options(argv[2:])


# -- scores -------------------------------------------------------------------------------------
def _edit_scores(site: Path, run: str = RUN, header=None, line2=None) -> Path:
    path = RunFiles(site / run).scores("test")
    lines = record_text(path).splitlines()
    if header:
        lines[0] = json.dumps({**json.loads(lines[0]), **header})
    if line2:
        lines[1] = json.dumps({**json.loads(lines[1]), **line2})
    write_record_text(path, "\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("header, line2, said", [
    (None, {"nll": -3.0}, "line 2: the item's 'nll' is -3, a negative number"),
    (None, {"nll": True}, "line 2: the item's 'nll' is true, a boolean"),
    (None, {"targets": False}, "line 2: the item's 'targets' is false, a boolean"),
    (None, {"judged": [[0, 1, -1]]}, "a negative number"),
    ({"cell": "lstm-gates"}, None, "line 1: the header names cell 'lstm-gates'"),
    ({"seed": 7}, None, "line 1: the header names seed 7"),
    ({"split": "dev"}, None, "line 1: the header names split 'dev'"),
])
def test_scores_rows_and_header_are_checked_before_any_verdict(site, header, line2, said):
    path = _edit_scores(site, header=header, line2=line2)
    expect_error(run_cli("compare", RUN, "runs/tiny/lstm-srnn/seed-1", cwd=site),
                 str(path.relative_to(site)), said)
    # the report names the file and leaves the cell untested (no verdict), as it does for
    # every damaged record
    r = run_cli("report", "runs", "--significance", "--cells", "lstm,lstm-srnn", cwd=site)
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())
    assert "not tested (" in text and str(path.relative_to(site)) in text and said in text
    assert "| better |" not in text and "| worse |" not in text


@pytest.mark.parametrize("key, value", [("cell", "lstm-gates"), ("seed", 7)])
def test_an_edited_config_is_named_where_the_scores_and_the_folder_agree(site, key, value):
    """The scores header and the folder's path (.../CELL/seed-N) name one run, config.yaml
    another: the message names config.yaml, not the scores file."""
    import yaml

    config = RunFiles(site / RUN).config
    config.write_text(yaml.safe_dump({**yaml.safe_load(config.read_text()), key: value},
                                     sort_keys=False))
    expect_error(run_cli("compare", RUN, "runs/tiny/lstm-srnn/seed-1", cwd=site),
                 str(config.relative_to(site)), f"names {key} {value!r}",
                 "was edited or copied from another run")


def test_an_infinite_statistic_is_refused(site):
    path = RunFiles(site / RUN).scores("test")
    lines = record_text(path).splitlines()
    lines[1] = lines[1].replace('"nll": ', '"nll": Infinity, "was": ', 1)
    write_record_text(path, "\n".join(lines) + "\n")
    expect_error(run_cli("compare", RUN, "runs/tiny/lstm-srnn/seed-1", cwd=site),
                 "the item's 'nll' is inf, not a finite number")


# -- recipes ------------------------------------------------------------------------------------
RECIPES = {
    "an unknown cell": ("cells: [lstm, lstm-nosuch]", "`cells`: unknown cell 'lstm-nosuch'"),
    "a seed twice": ("seeds: [1, 2, 1]", "`seeds` names 1 twice"),
    "a cell twice": ("cells: [lstm, lstm]", "`cells` names 'lstm' twice"),
    "cell_seeds of an unknown cell": ("cell_seeds: {nosuch: [1]}", "`cell_seeds`: unknown cell"),
    "a cell's seed twice": ("cell_seeds: {lstm: [3, 3]}", "`cell_seeds.lstm` names 3 twice"),
    "cell_overrides of an unknown cell": ("cell_overrides: {nosuch: {train: {lr: 0.1}}}",
                                          "`cell_overrides`: unknown cell 'nosuch'"),
    "a reference of an unknown cell": ("reference: {nosuch: {accuracy: 1.0}}",
                                       "`reference`: unknown cell 'nosuch'"),
    "a reference of an unknown metric": ("reference: {lstm: {bleu: 1.0}}",
                                         "unknown metric in `reference.lstm`"),
    "a grid of an unknown option": ("grid: {data.nosuch: [1, 2]}", "option in `grid`"),
    "a table of an unknown cell": ("table: {cells: [nosuch]}", "`table.cells`: unknown cell"),
    "a table of an unknown metric": ("table: {metrics: [ppl]}", "unknown metric in `table.metrics`"),
}


@pytest.mark.parametrize("case", sorted(RECIPES))
def test_a_recipe_naming_what_does_not_exist_is_refused_by_every_reader(tmp_path, monkeypatch,
                                                                        case):
    line, said = RECIPES[case]
    key = line.split(":")[0]
    text = "\n".join(ln for ln in TINY_DYCK.splitlines() if not ln.startswith(key + ":")
                     and not (key == "reference" and ln.startswith("  lstm: {accuracy")))
    folder = tmp_path / "recipes"
    folder.mkdir()
    (folder / "bad.yaml").write_text(text + "\n" + line + "\n")
    recipe = str(folder / "bad.yaml")
    for argv in (["train", "--task", "dyck", "--recipe", recipe, "--out", "runs"],
                 ["sweep", recipe, "--list", "--out", "runs"]):
        expect_error(run_cli(*argv, cwd=tmp_path), "bad.yaml", said)
    monkeypatch.setenv("LSTMABLATE_RECIPES", str(folder))
    (tmp_path / "runs").mkdir(exist_ok=True)
    expect_error(run_cli("report", "runs", "--table", "bad", cwd=tmp_path), "bad.yaml", said)
    assert not list((tmp_path / "runs").iterdir())


def test_report_checks_against_without_significance(trained):
    expect_error(run_cli("report", "runs", "--against", "lstm-nosuch", cwd=trained),
                 "--against", "unknown cell 'lstm-nosuch'")
    assert run_cli("report", "runs", "--against", "lstm-srnn", cwd=trained).returncode == 0


# -- data ---------------------------------------------------------------------------------------
def _train(tmp_path: Path, task: str, *sets: str):
    return run_cli("train", "--task", task, "--data-dir", "data", "--out", "runs", "--threads",
                   "1", *[a for s in sets for a in ("--set", s)], "--set", "train.max_steps=2",
                   cwd=tmp_path)


PTB_SETS = ("data.verify=false", "data.batch_size=2", "data.num_steps=3", "model.hidden_size=8")


@pytest.mark.parametrize("split", ["ptb.train.txt", "ptb.valid.txt"])
def test_blank_lines_in_a_ptb_file_are_refused_without_the_checksum(tmp_path, split):
    shutil.copytree(FIXTURES / "ptb", tmp_path / "data" / "ptb")
    path = tmp_path / "data" / "ptb" / split
    lines = path.read_text().split("\n")
    lines.insert(2, "   ")
    path.write_text("\n".join(lines))
    expect_error(_train(tmp_path, "ptb", *PTB_SETS), f"{split}, line 3: a blank line")
    assert not list(tmp_path.rglob(RunFiles.RESULT))


BWB_SETS = ("data.vocab_size=0", "data.batch_size=8", "data.num_steps=6", "model.emb_size=16",
            "model.hidden_size=32", "model.proj_size=12", "model.num_sampled=10")


@pytest.mark.parametrize("which", ["training", "heldout"])
def test_a_blank_billion_word_shard_is_refused(tmp_path, which):
    shutil.copytree(FIXTURES / "bwb" / "bwb", tmp_path / "data" / "bwb")
    folder = next((tmp_path / "data" / "bwb").glob(f"{which}-*"))
    shard = sorted(p for p in folder.iterdir() if p.is_file())[0]
    shard.write_text("\n   \n\n")
    expect_error(_train(tmp_path, "bwb", *BWB_SETS), shard.name, "no word" if which ==
                 "training" else "empty or blank")
    assert not list(tmp_path.rglob(RunFiles.RESULT))


SST_SETS = ("data.verify=false", "model.embedding_size=3", "model.hidden_size=4",
            "model.mlp_hidden=4")


def test_a_vectors_file_sharing_no_word_with_the_vocabulary_is_refused(tmp_path):
    shutil.copytree(FIXTURES / "sst", tmp_path / "data" / "sst")
    (tmp_path / "data" / "vec.txt").write_text("zyzzyva 1 2 3\nqwxqwx 4 5 6\n")
    expect_error(_train(tmp_path, "sst", *SST_SETS, "model.pretrained=vec.txt"), "vec.txt",
                 "none of the vocabulary's", "words has a vector")
    assert not list(tmp_path.rglob(RunFiles.RESULT))


def test_a_vectors_file_that_is_a_fifo_is_refused_at_once(tmp_path):
    shutil.copytree(FIXTURES / "sst", tmp_path / "data" / "sst")
    os.mkfifo(tmp_path / "data" / "vec.txt")
    r = in_thread(lambda: _train(tmp_path, "sst", *SST_SETS, "model.pretrained=vec.txt"),
                  fifo=tmp_path / "data" / "vec.txt")
    expect_error(r, "vec.txt: it is a named pipe (FIFO)")


def test_the_vectors_check_of_squad_and_the_parser():
    from lstmablate.errors import DataError
    from lstmablate_tasks.squad.vocab import Vocab, read_vectors
    from lstmablate_tasks.vectors import check_shared

    path = FIXTURES / "vectors" / "glove.squad.24d.txt"
    with pytest.raises(DataError, match="none of the vocabulary's 2 words"):
        read_vectors(path, 24, Vocab(["<PAD>", "<UNK>", "zyzzyva", "qwxqwx"]))
    assert read_vectors(path, 24, Vocab(["<PAD>", "<UNK>", "zyzzyva", "100"]))[1] == 1
    with pytest.raises(DataError, match="model.pretrained would change nothing"):
        check_shared(path, 0, 10)
    check_shared(path, 1, 10)
    assert stat.S_ISREG(path.stat().st_mode)
