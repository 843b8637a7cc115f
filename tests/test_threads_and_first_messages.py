"""What a new user meets in the first minutes, on a busy machine too:

* the threads a command computes on when ``--threads`` is left out -- the cores this process
  may use less the machine's load, at least one (a pure function of the two), with OpenMP's
  idle threads sleeping (``OMP_WAIT_POLICY=passive``) in the command and in every run it
  starts; a sweep chooses once, for every run alike;
* no command that succeeds while saying nothing: ``report --out`` says what it wrote,
  ``train.precision=bf16`` on a CPU says which path runs, ``bench --quick`` is the paper's
  five cells at one shape and warns on a busy machine, its table fits 100 columns and says
  what its target column is;
* a sweep whose data is missing starts no run; a sweep's lines are never broken inside a
  command.
"""

from __future__ import annotations

import io
import math
import subprocess
import sys

import pytest
import torch
from rich.console import Console

from cli_in_process import expect_error, run_cli
from lstmablate import threads as T
from lstmablate.errors import DataError
from lstmablate.run import sweep as S


# ----------------------------------------------------------------- the thread rule

@pytest.mark.parametrize("cores, load, expected", [
    (2, 0.0, 2),     # idle: every core
    (2, 0.4, 2),     # 1.6 cores free -> 2
    (2, 0.6, 1),     # 1.4 free -> 1
    (2, 1.5, 1),     # 0.5 free rounds half up -> 1
    (2, 2.0, 1),     # two busy processes (the laptop): one thread, never zero
    (2, 5.0, 1),
    (16, 3.2, 13),   # 12.8 free -> 13
    (1, 0.0, 1),
    (4, None, 4),    # no load average (a system without one): every core
    (4, math.nan, 4),
    (8, -1.0, 8),    # (a load is never negative; if one were, no more than the cores)
])
def test_the_default_threads_are_the_free_cores_rounded_between_one_and_all(cores, load, expected):
    assert T.default_threads(cores, load) == expected


def test_threads_given_or_set_by_the_user_win_over_the_rule():
    given = T.choose_threads(3, environ={}, cores=2, load=9.0)
    assert (given.threads, given.source) == (3, "--threads")
    omp = T.choose_threads(None, environ={"OMP_NUM_THREADS": "5"}, cores=2, load=9.0)
    assert (omp.threads, omp.source) == (None, "OMP_NUM_THREADS")  # PyTorch reads it itself
    rule = T.choose_threads(None, environ={}, cores=4, load=1.2)
    assert (rule.threads, rule.reason) == (3, "4 cores, load 1.2")


def test_idle_threads_sleep_unless_the_user_chose_a_policy():
    assert T.passive_waiting({}) == {"OMP_WAIT_POLICY": "passive"}
    assert T.passive_waiting({"OMP_WAIT_POLICY": "active"}) == {"OMP_WAIT_POLICY": "active"}


def test_the_command_line_sets_passive_waiting_before_pytorch_is_imported(monkeypatch, tmp_path):
    """OpenMP reads OMP_WAIT_POLICY when PyTorch loads it: ``cli.main`` sets it first, which
    works only while importing the command line imports no PyTorch."""
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert run_cli("--version", cwd=tmp_path).returncode == 0
    import os

    assert os.environ["OMP_WAIT_POLICY"] == "passive"
    r = subprocess.run([sys.executable, "-c", "import sys, lstmablate.cli; "
                        "print('torch' in sys.modules)"], capture_output=True, text=True,
                       timeout=120)
    assert r.stdout.strip() == "False", r.stderr


# ----------------------------------------------------------------- sweeps

def _record_runs(monkeypatch) -> list[dict]:
    seen: list[dict] = []

    def train_run(task, cell, **kw):
        seen.append({"cell": cell, **kw})
        return type("Outcome", (), {"interrupted": False})()

    monkeypatch.setattr("lstmablate.run.runner.train_run", train_run)
    return seen


def test_a_sweep_chooses_the_threads_once_for_every_run(monkeypatch, tmp_path, tiny_recipe):
    seen = _record_runs(monkeypatch)
    loads = iter([1.7, 0.0, 0.0, 0.0])  # (a later reading must not change the runs' threads)
    monkeypatch.setattr(T, "machine_load", lambda: next(loads))
    monkeypatch.setattr(T, "usable_cores", lambda: 4)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    text = io.StringIO()
    S.run_sweep(S.plan_sweep(str(tiny_recipe), tmp_path / "runs"),
                console=Console(file=text, width=40))
    assert [r["threads"] for r in seen] == [2, 2, 2, 2]  # 4 cores - load 1.7 = 2.3 -> 2
    lines = text.getvalue().splitlines()
    assert "2 thread(s) for each run (4 cores, load 1.7; --threads N to choose)" in lines[0]
    # each run's command on one line however narrow the console: copyable from a log
    commands = [line for line in lines if "lstmablate train" in line]
    assert len(commands) == 4 and all(line.rstrip().endswith("--threads 2") for line in commands)


def test_a_sweep_keeps_the_threads_it_is_given(monkeypatch, tmp_path, tiny_recipe):
    seen = _record_runs(monkeypatch)
    S.run_sweep(S.plan_sweep(str(tiny_recipe), tmp_path / "runs", threads=3),
                console=Console(file=io.StringIO()))
    assert [r["threads"] for r in seen] == [3, 3, 3, 3]


def test_the_runs_a_sweep_starts_wait_passively_on_the_free_cores(monkeypatch, tmp_path,
                                                                   tiny_recipe):
    started: list[tuple[list[str], dict]] = []

    class Done:
        returncode = 0

        def __init__(self, argv, env, **kw):
            started.append((argv, env))

        def poll(self):
            return 0

    monkeypatch.setattr(S.subprocess, "Popen", Done)
    monkeypatch.setattr(T, "machine_load", lambda: 0.2)
    monkeypatch.setattr(T, "usable_cores", lambda: 4)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    with pytest.raises(S.SweepInterrupted):  # (no run finished: the fake processes ran nothing)
        S.run_sweep(S.plan_sweep(str(tiny_recipe), tmp_path / "runs"),
                    console=Console(file=io.StringIO()), jobs=2)
    assert started and all(env["OMP_WAIT_POLICY"] == "passive" for _, env in started)
    assert all(argv[argv.index("--threads") + 1] == "2" for argv, _ in started)  # 4 free / 2


def test_a_sweep_whose_data_is_missing_starts_no_run(monkeypatch, tmp_path):
    seen = _record_runs(monkeypatch)
    empty = tmp_path / "data"
    empty.mkdir()
    plan = S.plan_sweep("ptb-small", tmp_path / "runs", data_dir=str(empty))
    with pytest.raises(DataError, match=r"the sweep's runs read data that is missing, so none "
                                        r"was started: data file ptb/ptb\.\w+\.txt not found"):
        S.run_sweep(plan, console=Console(file=io.StringIO()))
    assert seen == [] and not (tmp_path / "runs").exists()


# ----------------------------------------------------------------- no silent success

def test_report_out_says_what_it_wrote_and_prints_the_report_only_when_asked(tmp_path, tiny_recipe):
    r = run_cli("train", "--task", "dyck", "--cell", "lstm", "--recipe", str(tiny_recipe),
                "--set", "train.max_steps=2", "--out", "runs", "--threads", "1", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    r = run_cli("report", "runs", "--out", "table.md", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout == "", r.stdout
    assert r.stderr.strip() == "wrote table.md"
    assert "| `lstm`" in (tmp_path / "table.md").read_text()
    r = run_cli("report", "runs", "--out", "table.md", "--force", "--print", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout == (tmp_path / "table.md").read_text()


def test_low_precision_on_a_cpu_says_which_path_runs_and_why():
    from lstmablate.train.precision import path_note

    cpu = torch.device("cpu")
    for precision, dtype in (("bf16", "bfloat16"), ("fp16", "float16")):
        note = path_note(precision, cpu)
        assert f"train.precision={precision} on cpu" in note and dtype in note
        assert "step-by-step PyTorch loops" in note and "float32 only" in note
        assert "train.precision=fp32 takes the fast kernels" in note
    assert path_note("fp32", cpu) is None
    assert path_note("bf16", torch.device("cuda")) is None  # (not asked of a GPU: no CUDA needed)


def test_a_cpu_run_in_bf16_says_so_at_its_start(tmp_path, tiny_recipe):
    r = run_cli("train", "--task", "dyck", "--cell", "lstm", "--recipe", str(tiny_recipe),
                "--set", "train.max_steps=1", "--set", "train.precision=bf16", "--out", "runs",
                "--threads", "1", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    first = " ".join(r.stderr.split("\n\n")[0].split())
    assert first.startswith("note: train.precision=bf16 on cpu: the recurrent cells run in bfloat16")


def test_the_busy_warning_is_for_a_load_above_the_cores():
    from lstmablate.bench.render import busy_note

    assert busy_note(None, 2) is None and busy_note(2.0, 2) is None
    assert "the machine is busy (load 2.5 on 2 cores)" in busy_note(2.5, 2)


def _bench_args(monkeypatch, tmp_path, *argv: str, load: float = 0.0) -> dict:
    from lstmablate.bench import record

    got: dict = {}

    def measure(cells, shapes, **kw):
        got.update(cells=cells, shapes=shapes, **kw)
        return [], {}

    monkeypatch.setattr(record, "measure", measure)
    monkeypatch.setattr(T, "machine_load", lambda: load)
    monkeypatch.setattr(T, "usable_cores", lambda: 2)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    r = run_cli("bench", *argv, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    got["stderr"] = " ".join(r.stderr.split())
    return got


def test_bench_quick_is_the_paper_cells_at_one_shape_without_the_model(monkeypatch, tmp_path):
    quick = _bench_args(monkeypatch, tmp_path, "--quick")
    assert quick["cells"] == ["lstm", "lstm-srnn", "lstm-srnn-out", "lstm-srnn-hidden",
                              "lstm-gates"]
    assert quick["shapes"] == ["ptb-200"] and quick["model_sizes"] == [] and quick["quick"]
    assert quick["threads"] == 2 and quick["progress"] is None  # (not a terminal: no progress)
    assert quick["stderr"] == ""
    everything = _bench_args(monkeypatch, tmp_path, "--quick", "--all-cells", "--model-size",
                             "small")
    assert everything["cells"] is None and everything["model_sizes"] == ["small"]
    full = _bench_args(monkeypatch, tmp_path)
    assert (full["cells"], full["shapes"], full["model_sizes"]) == (None, None, ["small"])
    expect_error(run_cli("bench", "--quick", "--all-cells", "--cell", "lstm", cwd=tmp_path),
                 "--all-cells times every registered cell and --cell names some")


def test_bench_warns_on_a_busy_machine_and_takes_the_free_cores(monkeypatch, tmp_path):
    busy = _bench_args(monkeypatch, tmp_path, "--quick", load=3.0)
    assert busy["threads"] == 1
    assert "warning: the machine is busy (load 3.0 on 2 cores)" in busy["stderr"]


def test_the_bench_table_fits_100_columns_and_says_what_a_target_is():
    from lstmablate.bench.render import WIDTH, render

    def row(cell, kernel, ratio, target=None, base=None, met=None):
        return dict(kind="cell", shape="parser-400", cell=cell, kernel=kernel, device="cpu",
                    threads=2, batch=32, steps=50, hidden=400, layers=3, bidirectional=True,
                    padding=0.42, ms=123.4, tokens_per_s=12_345.0, ratio_lstm=ratio,
                    ratio_rnn=ratio / 2, target=target, target_baseline=base, target_met=met)

    rows = [row("nn.LSTM", "PyTorch", 1.0), row("nn.RNN", "PyTorch", 2.0),
            row("lstm-srnn-hidden-out", "recurrent (native, calibrated)", 1.7, 1.8, "nn.LSTM",
                False),
            row("lstm-gates", "recurrent (native, calibrated)", 6.5, 0.9, "nn.RNN", True)]
    text = io.StringIO()
    Console(file=text, width=WIDTH, color_system=None).print(render(rows))
    lines = text.getvalue().splitlines()
    assert max(len(line) for line in lines) <= 100
    flat = " ".join(text.getvalue().split())
    assert "lstm-srnn-hidden-out" in flat and "1.80x LSTM NO" in flat and "0.90x RNN yes" in flat
    assert "target: the ratio this cell should reach against the baseline named" in flat
    assert "parser-400 (32x50 tokens, 3x400, bidirectional, 42% padding)" in flat


# ----------------------------------------------------------------- the data commands

def test_data_check_answers_an_absent_folder_as_an_empty_one(tmp_path):
    (tmp_path / "empty").mkdir()
    absent, empty = (run_cli("data", "check", "--data-dir", d, cwd=tmp_path)
                     for d in ("nowhere", "empty"))
    assert absent.returncode == empty.returncode == 0, (absent.stderr, empty.stderr)
    assert absent.stdout == empty.stdout  # every catalogued file, missing
    assert "does not exist (yet), so every file is missing; the first download" in \
        " ".join(absent.stderr.split())
    for d in ("nowhere", "empty"):
        expect_error(run_cli("data", "check", "ptb", "--data-dir", d, cwd=tmp_path),
                     "task 'ptb' (its default configuration) reads ptb/")


def test_a_piped_data_listing_folds_numbered_shards_unless_plain(tmp_path):
    folded = run_cli("data", "list", "--data-dir", "nowhere", cwd=tmp_path).stdout.splitlines()
    every = run_cli("data", "list", "--plain", "--data-dir", "nowhere", cwd=tmp_path)
    every = every.stdout.splitlines()
    shards = [line for line in every if "/news.en-" in line]
    assert len(shards) == 99 and len(every) - len(folded) == 98
    row = next(line.split("\t") for line in folded if "/news.en-" in line)
    assert row[2:4] == ["bwb/training-monolingual.tokenized.shuffled/news.en-{00001..00099}"
                        "-of-00100", "0 of 99 present"]


def test_a_missing_data_file_names_the_readme_once_and_nests_no_brackets(tmp_path, monkeypatch):
    from lstmablate.data import find_file, resolve_data_dir

    monkeypatch.delenv("LSTMABLATE_DATA", raising=False)
    monkeypatch.chdir(tmp_path)
    for relpath in ("ptb/ptb.train.txt", "bwb/1b_word_vocab.txt", "mine.txt"):
        with pytest.raises(DataError) as e:
            find_file(resolve_data_dir(None), relpath)
        text = str(e.value)
        assert text.count("data/README.md") == 1, text
        assert "(the default ./data" not in text and "the default ./data in the current " \
            "directory, as neither --data-dir nor LSTMABLATE_DATA is given" in text


def test_the_root_help_shows_no_type_after_a_flag(tmp_path):
    for argv in (["--help"], ["data", "--help"]):
        r = run_cli(*argv, cwd=tmp_path)
        assert r.returncode == 0 and "--help" in r.stdout, r.stderr
        assert "<bool>" not in r.stdout, r.stdout
    assert "--version" in run_cli("--help", cwd=tmp_path).stdout


def test_report_significance_shows_its_work_on_a_terminal_only(monkeypatch):
    import contextlib

    from rich.progress import Progress

    from lstmablate.cli import results  # (report's module)

    assert isinstance(results._working("testing"), contextlib.nullcontext)  # (stderr: no terminal)
    screen = io.StringIO()
    monkeypatch.setattr(results, "err", Console(file=screen, force_terminal=True, width=80))
    assert isinstance(results._working(None), contextlib.nullcontext)
    working = results._working("testing each cell against lstm")
    assert isinstance(working, Progress)
    with working:
        pass
    assert "testing each cell against lstm" in screen.getvalue()
