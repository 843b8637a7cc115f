"""The run folder is a boundary, and every command's outputs have one guard.

* An entry of a run folder that is a symbolic link (the lock, artefacts, scores, metrics ...)
  is refused before anything is written, with one message naming it: no write, truncation,
  append or ``--force`` ever reaches a file outside the run through it.  A runs folder that is
  itself a link keeps working.  ``--force`` removes only the files of the names a run writes.
* ``report --out``, ``bench --out``, ``plot --out``, ``visualize --out``,
  ``eval --write-predictions``, ``data dyck --out`` and ``data fetch`` never write into a run
  folder (through a link neither); ``report`` and ``bench`` replace an existing file of the
  user's only with ``--force``, as ``plot`` and ``visualize`` do.
* Advice that holds: Ctrl-C before the first training step prints its line; an empty
  ``--out`` is refused (the full disk at the first checkpoint: test_suggested_commands.py).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from cli_in_process import expect_error, run_cli

from lstmablate.run.runs import RunFiles


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (links not followed), with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and not p.is_symlink()}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished tiny Dyck run (with its scores), trained once for the module."""
    from conftest import TINY_DYCK

    home = tmp_path_factory.mktemp("trained")
    (home / "tiny.yaml").write_text(TINY_DYCK)
    r = run_cli(*train_args(home / "tiny.yaml"), cwd=home)
    assert r.returncode == 0, r.stderr
    return home


def train_args(recipe: Path) -> list[str]:
    return ["train", "--task", "dyck", "--recipe", str(recipe), "--out", "runs",
            "--set", "train.max_steps=2", "--threads", "1"]


@pytest.fixture
def site(tmp_path, trained):
    """(working folder with runs/ and tiny.yaml, the run folder, the train argv, a folder
    outside the run with files of its own)."""
    shutil.copytree(trained, tmp_path, dirs_exist_ok=True, symlinks=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    for name in ("victim.txt", "vocab.json", "test.jsonl", "events.out.tfevents.1"):
        (outside / name).write_text(f"the user's own {name}\n")
    run = tmp_path / "runs" / "tiny" / "lstm" / "seed-1"
    return tmp_path, run, train_args(tmp_path / "tiny.yaml"), outside


def link(entry: Path, target: Path) -> None:
    if entry.is_dir() and not entry.is_symlink():
        shutil.rmtree(entry)
    elif os.path.lexists(entry):
        entry.unlink()
    entry.symlink_to(target)


# ------------------------------------------------------------------ symbolic links inside a run


@pytest.mark.parametrize("command", ["eval --scores", "train --force"])
def test_a_linked_lock_file_is_refused_and_its_target_kept(site, command):
    cwd, run, argv, outside = site
    link(run / RunFiles.LOCK, outside / "victim.txt")
    before = snapshot(outside)
    args = ["eval", str(run), "--scores"] if command == "eval --scores" else [*argv, "--force"]
    expect_error(run_cli(*args, cwd=cwd), "seed-1/.lock is a symbolic link",
                 "rm ", "Nothing was written")
    assert snapshot(outside) == before
    (run / RunFiles.LOCK).unlink()  # the advice: remove the link, run the same command again
    assert run_cli(*args, cwd=cwd).returncode == 0


@pytest.mark.parametrize("folder", RunFiles.FOLDERS)
def test_force_never_deletes_through_a_linked_folder(site, folder):
    cwd, run, argv, outside = site
    link(run / folder, outside)
    before = snapshot(outside)
    expect_error(run_cli(*argv, "--force", cwd=cwd), f"seed-1/{folder} is a symbolic link",
                 "cp -r", "Nothing was written")
    assert snapshot(outside) == before
    expect_error(run_cli("eval", str(run), "--scores", cwd=cwd), "is a symbolic link")
    assert snapshot(outside) == before


def test_resume_never_appends_through_a_linked_metrics_file(site):
    cwd, run, argv, outside = site
    RunFiles(run).result.unlink()  # unfinished: --resume trains on
    shutil.copy(RunFiles(run).metrics, outside / "victim.txt")
    link(RunFiles(run).metrics, outside / "victim.txt")
    before = snapshot(outside)
    expect_error(run_cli(*argv, "--resume", cwd=cwd), "seed-1/metrics.jsonl is a symbolic link",
                 "cp --remove-destination")
    assert snapshot(outside) == before
    # the advice: a copy of what it pointed to in its place, then the same command resumes
    RunFiles(run).metrics.unlink()
    shutil.copy(outside / "victim.txt", RunFiles(run).metrics)
    assert run_cli(*argv, "--resume", cwd=cwd).returncode == 0
    assert snapshot(outside) == before


@pytest.mark.parametrize("name", [RunFiles.LAST, RunFiles.CONFIG, RunFiles.RESULT])
def test_any_linked_file_of_the_run_is_refused(site, name):
    cwd, run, argv, outside = site
    shutil.copy(run / name, outside / name)
    link(run / name, outside / name)
    before = snapshot(outside)
    expect_error(run_cli(*argv, "--force", cwd=cwd), f"seed-1/{name} is a symbolic link")
    assert snapshot(outside) == before


def test_an_entry_of_another_kind_is_refused_without_waiting(site):
    cwd, run, argv, _ = site
    RunFiles(run).result.unlink()
    RunFiles(run).metrics.unlink()
    os.mkfifo(RunFiles(run).metrics)  # opened for appending, it would block the run forever
    expect_error(run_cli(*argv, "--force", cwd=cwd), "metrics.jsonl is a named pipe", "mv ")


def test_a_runs_folder_reached_through_a_link_keeps_working(site):
    cwd, run, argv, _ = site
    shutil.move(cwd / "runs", cwd / "elsewhere")
    (cwd / "runs").symlink_to(cwd / "elsewhere")  # runs -> elsewhere: the user's choice
    RunFiles(cwd / "runs" / "tiny" / "lstm" / "seed-1").scores("test").unlink()
    assert run_cli("eval", str(run), "--scores", cwd=cwd).returncode == 0
    assert RunFiles(cwd / "elsewhere" / "tiny" / "lstm" / "seed-1").scores("test").exists()
    r = run_cli(*argv, "--force", cwd=cwd)
    assert r.returncode == 0, r.stderr
    assert RunFiles(cwd / "elsewhere" / "tiny" / "lstm" / "seed-1").result.exists()


def test_force_removes_only_what_the_run_wrote(site):
    cwd, run, argv, _ = site
    (run / "notes.txt").write_text("mine")
    RunFiles(run).tensorboard.mkdir()
    (RunFiles(run).tensorboard / "events.out.tfevents.1.host").write_bytes(b"old events")
    (RunFiles(run).tensorboard / "mine.txt").write_text("mine too")
    (RunFiles(run).artefacts / "old.json").write_text("{}")
    r = run_cli(*argv, "--force", "--set", "train.max_steps=1", cwd=cwd)
    assert r.returncode == 0, r.stderr
    assert (run / "notes.txt").read_text() == "mine"
    assert (RunFiles(run).tensorboard / "mine.txt").read_text() == "mine too"
    assert not (RunFiles(run).tensorboard / "events.out.tfevents.1.host").exists()
    assert not (RunFiles(run).artefacts / "old.json").exists()  # the replaced run's


# ------------------------------------------------------------------ one guard for every output


RUN_FILES = [RunFiles.RESULT, RunFiles.LAST, RunFiles.CONFIG, f"{RunFiles.SCORES}/test.jsonl",
             "new.md"]


@pytest.mark.parametrize("name", RUN_FILES)
def test_report_never_writes_into_a_run_folder(site, name):
    cwd, run, _, _ = site
    before = snapshot(run)
    expect_error(run_cli("report", "runs", "--out", str(run / name), cwd=cwd),
                 "the run folder", "Nothing was written")
    assert snapshot(run) == before
    # nor through a link that points into it
    (cwd / "link.md").symlink_to(RunFiles(run).result)
    expect_error(run_cli("report", "runs", "--out", "link.md", "--force", cwd=cwd),
                 "is a file of the run folder")
    assert snapshot(run) == before


def test_report_replaces_a_users_file_only_with_force(site):
    cwd, _, _, _ = site
    (cwd / "table.md").write_text("my notes")
    expect_error(run_cli("report", "runs", "--out", "table.md", cwd=cwd),
                 "table.md already exists", "--force")
    assert (cwd / "table.md").read_text() == "my notes"
    r = run_cli("report", "runs", "--out", "table.md", "--force", "--print", cwd=cwd)
    assert r.returncode == 0, r.stderr
    assert (cwd / "table.md").read_text() == r.stdout
    expect_error(run_cli("report", "runs", "--out", "runs", cwd=cwd), "it is a directory")


def test_bench_checks_its_outputs_before_anything_is_timed(site, monkeypatch):
    from lstmablate import bench

    cwd, run, _, _ = site
    timed = []

    def measure(*a, **k):
        timed.append(1)
        return [], {"environment": {}, "machine_gflops": [None, None]}

    monkeypatch.setattr(bench.record, "measure", measure)
    before = snapshot(run)
    args = ["bench", "--quick", "--no-models", "--cell", "lstm"]
    for name in (RunFiles.RESULT, "new.json"):
        expect_error(run_cli(*args, "--out", str(run / name), cwd=cwd), "the run folder")
    assert snapshot(run) == before
    (cwd / "b.md").write_text("my tables")  # the Markdown beside b.json counts too
    expect_error(run_cli(*args, "--out", "b.json", cwd=cwd), "b.md already exists", "--force")
    assert not timed and (cwd / "b.md").read_text() == "my tables"
    r = run_cli(*args, "--out", "b.json", "--force", cwd=cwd)
    assert r.returncode == 0, r.stderr
    assert timed and (cwd / "b.json").exists() and (cwd / "b.md").read_text() != "my tables"


def test_plot_visualize_and_eval_never_write_into_a_run_folder(site):
    cwd, run, _, _ = site
    before = snapshot(run)
    expect_error(run_cli("plot", str(run), "--out", str(run / "curves.png"), cwd=cwd),
                 "is inside the run folder")
    expect_error(run_cli("visualize", str(run), "--text", "(a a)", "--out", str(run / "w.png"),
                         cwd=cwd), "is inside the run folder")
    expect_error(run_cli("eval", str(run), "--write-predictions",
                         str(run / RunFiles.SCORES / "p.jsonl"), cwd=cwd),
                 "--write-predictions", "is a file of the run folder")
    assert snapshot(run) == before


def test_data_commands_never_write_into_a_run_folder(site):
    cwd, run, _, _ = site
    before = snapshot(run)
    for out in (run, run / "corpus"):
        expect_error(run_cli("data", "dyck", "--out", str(out), "--train-sequences", "4",
                             "--dev-sequences", "2", "--test-sequences", "2", cwd=cwd),
                     "is inside the run folder")
    # (refused before any download: the tests have no network)
    expect_error(run_cli("data", "fetch", "ptb", "--data-dir", str(run), cwd=cwd),
                 "--data-dir", "is inside the run folder")
    assert snapshot(run) == before
    r = run_cli("data", "dyck", "--out", "corpus", "--train-sequences", "4", "--dev-sequences",
                "2", "--test-sequences", "2", cwd=cwd)
    assert r.returncode == 0 and (cwd / "corpus" / "train.txt").exists(), r.stderr


def test_eval_and_data_dyck_replace_a_users_file_only_with_force(site):
    """A user's own files are replaced by --write-predictions and data dyck only with --force."""
    cwd, run, _, _ = site
    mine = cwd / "preds.jsonl"
    mine.write_text("my notes\n")
    expect_error(run_cli("eval", str(run), "--write-predictions", str(mine), cwd=cwd),
                 "preds.jsonl already exists; add --force")
    assert mine.read_text() == "my notes\n"
    r = run_cli("eval", str(run), "--write-predictions", str(mine), "--force", cwd=cwd)
    assert r.returncode == 0 and mine.read_text() != "my notes\n", r.stderr
    corpus = ["data", "dyck", "--out", "corpus", "--train-sequences", "4", "--dev-sequences", "2",
              "--test-sequences", "2"]
    assert run_cli(*corpus, cwd=cwd).returncode == 0
    train = (cwd / "corpus" / "train.txt").read_bytes()
    expect_error(run_cli(*corpus, "--seed", "5", cwd=cwd), "already exist; add --force")
    assert (cwd / "corpus" / "train.txt").read_bytes() == train
    assert run_cli(*corpus, "--seed", "5", "--force", cwd=cwd).returncode == 0
    assert (cwd / "corpus" / "train.txt").read_bytes() != train


# ------------------------------------------------------------------ advice that holds


def test_ctrl_c_before_the_first_step_prints_its_line(site, monkeypatch):
    from lstmablate.run import runner

    cwd, run, argv, _ = site
    shutil.rmtree(cwd / "runs")

    def interrupted(*a, **k):  # Ctrl-C while the data is read (Python raises it anywhere)
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "check_train_batches", interrupted)
    text = expect_error(run_cli(*argv, cwd=cwd), "interrupted", "--resume", code=130)
    assert "error" not in text
    monkeypatch.undo()
    r = run_cli(*argv, "--resume", cwd=cwd)  # what the line says
    assert r.returncode == 0, r.stderr
    assert RunFiles(run).result.exists()


def test_an_empty_out_is_refused(site):
    cwd, _, argv, _ = site
    shutil.rmtree(cwd / "runs")
    for command in (argv, ["sweep", str(cwd / "tiny.yaml"), "--list"]):
        out = command.index("--out") + 1 if "--out" in command else None
        args = [*command[:out], "", *command[out + 1:]] if out else [*command, "--out", ""]
        expect_error(run_cli(*args, cwd=cwd), "--out '' is empty", "Nothing was written")
    assert sorted(p.name for p in cwd.iterdir()) == ["outside", "tiny.yaml"]
