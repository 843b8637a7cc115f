"""Every command an error message suggests works.

The messages of a catalogue of errors (missing or damaged data, damaged checkpoints and
artefacts, unknown names, a read-only disk during a resume) are collected, every command in
backticks is taken from them, and each is run as it is: a ``lstmablate`` command must exit 0,
a ``lstmablate data fetch NAME`` must name a dataset whose every file has a download location
(the tests have no network), and "the same ``lstmablate train`` command plus --force" is run
as the original command plus ``--force``.
"""

from __future__ import annotations

import errno
import io
import os
import re
import shlex
import shutil
from pathlib import Path

import pytest
from rich.console import Console

from lstmablate.errors import UserError
from lstmablate.run.runs import RunFiles

from cli_in_process import run_cli

FIXTURES = Path(__file__).parent / "fixtures"
QUIET = Console(file=io.StringIO())
#: a bare command name in backticks refers to the user's own command, it suggests nothing
REFERENCES = {"lstmablate train", "lstmablate train ...", "lstmablate eval", "lstmablate data fetch"}


def message_of(r) -> str:
    assert r.returncode == 2 and "Traceback" not in r.stderr, (r.returncode, r.stderr)
    return " ".join(r.stderr.split())


def suggestions(text: str) -> list[str]:
    return [c for c in re.findall(r"`(lstmablate[^`]*)`", text) if c not in REFERENCES]


def follow(text: str, argv: list[str], cwd: Path) -> int:
    """Run every command ``text`` suggests (``argv``: the command that failed); returns how many
    were checked."""
    from lstmablate.task import available_datasets

    n = 0
    for command in suggestions(text):
        words = shlex.split(command)
        assert "RUN" not in words and "..." not in words and "NAME" not in words, \
            f"a placeholder in a suggested command: {command!r} ({text})"
        if words[1:3] == ["data", "fetch"]:
            ds = available_datasets().get(words[3])
            assert ds is not None, f"{command!r}: no such dataset ({text})"
            assert all(f.url for f in ds.files), f"{command!r} cannot download every file ({text})"
        else:
            r = run_cli(*words[1:], cwd=cwd)
            assert r.returncode == 0, (command, r.stderr, text)
        n += 1
    if "the same `lstmablate train` command plus --force" in text or \
            "the same `lstmablate train` command with --force" in text:
        r = run_cli(*argv, "--force", cwd=cwd)
        assert r.returncode == 0, (argv, r.stderr)
        n += 1
    return n


def test_data_messages_suggest_fetch_only_where_it_works(tmp_path):
    checked = 0
    # a data.files directory of one's own: nothing to fetch
    r = run_cli("train", "--task", "parsing", "--set", "data.files=tinyud", "--data-dir", "data",
                "--out", "runs", cwd=tmp_path)
    text = message_of(r)
    assert "tinyud/train.conllu" in text and "data fetch tinyud" not in text
    checked += follow(text, [], tmp_path)
    # the Billion Word shards cannot be downloaded one by one
    for argv in (["train", "--task", "bwb", "--data-dir", "data", "--out", "runs"],
                 ["data", "check", "bwb", "--data-dir", "data"]):
        text = message_of(run_cli(*argv, cwd=tmp_path))
        assert "data fetch bwb" not in text and "statmt.org" in text
        checked += follow(text, argv, tmp_path)
    # PTB can be fetched
    text = message_of(run_cli("train", "--task", "ptb", "--data-dir", "data", "--out", "runs",
                              cwd=tmp_path))
    assert "`lstmablate data fetch ptb`" in text
    checked += follow(text, [], tmp_path)
    # a damaged file of a fetchable dataset
    data = tmp_path / "data" / "ptb"
    data.mkdir(parents=True)
    for f in (FIXTURES / "ptb").iterdir():
        shutil.copy(f, data / f.name)
    (data / "ptb.valid.txt").write_bytes(b"\xff\xfe bad\n")
    text = message_of(run_cli("train", "--task", "ptb", "--data-dir", "data", "--out", "runs",
                              "--set", "data.verify=false", cwd=tmp_path))
    assert "ptb.valid.txt, line 1" in text
    checked += follow(text, [], tmp_path)
    assert checked >= 2
    assert not (tmp_path / "runs").exists()


@pytest.fixture
def run(tmp_path, tiny_recipe):
    argv = ["train", "--task", "dyck", "--recipe", str(tiny_recipe), "--out", "runs",
            "--set", "train.max_steps=2", "--threads", "1"]
    assert run_cli(*argv, cwd=tmp_path).returncode == 0
    return tmp_path / "runs" / "tiny" / "lstm" / "seed-1", argv


def test_damaged_checkpoint_messages_suggest_the_other_checkpoint_and_force(tmp_path, run):
    run_dir, argv = run
    good = {name: (run_dir / name).read_bytes() for name in (RunFiles.LAST, RunFiles.BEST)}
    for damaged, evaluated in ((RunFiles.LAST, "last"), (RunFiles.BEST, "best")):
        (run_dir / damaged).write_bytes(good[damaged][:200])
        text = message_of(run_cli("eval", str(run_dir), "--checkpoint", evaluated, cwd=tmp_path))
        other = "best" if evaluated == "last" else "last"
        assert f"`lstmablate eval {run_dir} --checkpoint {other}`" in text, text
        assert f"--checkpoint {evaluated}`" not in text  # never the damaged one again
        assert follow(text, argv, tmp_path) == 2  # the other checkpoint, and --force
        for name, data in good.items():  # (--force trained it again: put the damage back)
            (run_dir / name).write_bytes(data)
    RunFiles(run_dir).result.unlink()
    RunFiles(run_dir).last.write_bytes(b"damaged")
    text = message_of(run_cli(*argv, "--resume", cwd=tmp_path))
    assert "--force" in text and "lstmablate eval" not in text  # resume: only what continues it
    r = run_cli(*argv, "--force", cwd=tmp_path)
    assert r.returncode == 0, r.stderr


def test_damaged_artefacts_suggest_a_command_that_works(tmp_path, tiny_recipe):
    recipe = tmp_path / "p.yaml"
    recipe.write_text("task: ptb\ndata: {batch_size: 2, num_steps: 3, verify: false}\n"
                      "model: {hidden_size: 8}\n")
    argv = ["train", "--task", "ptb", "--recipe", str(recipe), "--out", "runs", "--data-dir",
            str(FIXTURES), "--set", "train.max_steps=2", "--threads", "1"]
    assert run_cli(*argv, cwd=tmp_path).returncode == 0
    run_dir = tmp_path / "runs" / "p" / "lstm" / "seed-1"
    (RunFiles(run_dir).artefacts / "vocab.json").unlink()
    RunFiles(run_dir).result.unlink()
    text = message_of(run_cli(*argv, "--resume", cwd=tmp_path))
    assert follow(text, argv, tmp_path) == 1


def test_unknown_names_suggest_listing_commands_that_work(tmp_path):
    checked = 0
    for argv in (["train", "--task", "ptbb"], ["train", "--task", "dyck", "--recipe", "nosuch"],
                 ["train", "--task", "dyck", "--cell", "lstmm"], ["data", "fetch", "ptbb"]):
        text = message_of(run_cli(*argv, "--out", "runs", cwd=tmp_path) if argv[0] == "train"
                          else run_cli(*argv, cwd=tmp_path))
        checked += follow(text, argv, tmp_path)
    assert checked == 4


def test_a_read_only_run_folder_during_resume_suggests_making_it_writable(tmp_path, run, monkeypatch):
    from lstmablate.run import runlock
    from lstmablate.run.runner import train_run

    run_dir, argv = run
    RunFiles(run_dir).result.unlink()
    real_open = runlock.os.open

    def read_only(path, flags, *a, **k):  # (reading still works on a read-only file system)
        if "seed-1" in str(path) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_open(path, flags, *a, **k)

    monkeypatch.setattr(runlock.os, "open", read_only)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError) as e:
        train_run("dyck", "lstm", recipe=argv[4], out=Path("runs"), resume=True, console=QUIET,
                  progress=False, overrides=["train.max_steps=2"], threads=1)
    text = str(e.value)
    assert "Read-only file system" in text and "Choose another --out" not in text
    assert "run the same command again" in text
    monkeypatch.undo()
    r = run_cli(*argv, "--resume", cwd=tmp_path)  # once writable, the same command resumes
    assert r.returncode == 0, r.stderr
    assert os.path.exists(RunFiles(run_dir).result)


def test_a_full_disk_at_the_first_checkpoint_suggests_what_starts_the_run(tmp_path, tiny_recipe,
                                                                           monkeypatch):
    """The disk fills up at the first save of last.pt (metrics.jsonl and best.pt are written):
    there is nothing to continue from, so every message (the failure's, then those of the same
    command and of --resume) suggests the one command that starts the run, and it does."""
    from lstmablate.io import write as atomic

    if not Path("/proc/self/fd").exists():
        pytest.skip("needs /proc to name the file being written")
    real_fsync = atomic.os.fsync

    def fsync(fd):
        if ".tmp-last.pt" in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_fsync(fd)

    argv = ["train", "--task", "dyck", "--recipe", str(tiny_recipe), "--out", "runs",
            "--set", "train.max_steps=2", "--threads", "1"]
    monkeypatch.setattr(atomic.os, "fsync", fsync)
    failed = message_of(run_cli(*argv, cwd=tmp_path))
    monkeypatch.undo()
    run_dir = tmp_path / "runs" / "tiny" / "lstm" / "seed-1"
    assert "No space left on device" in failed and not RunFiles(run_dir).last.exists()
    assert RunFiles(run_dir).best.exists() and RunFiles(run_dir).metrics.stat().st_size > 0
    kept = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
    again = [message_of(run_cli(*argv, *extra, cwd=tmp_path)) for extra in ([], ["--resume"])]
    assert {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()} == kept
    for text in (failed, *again):
        assert "--resume" not in text, text  # there is nothing to continue from
        assert follow(text, argv, tmp_path) == 1
    assert RunFiles(run_dir).result.exists()
