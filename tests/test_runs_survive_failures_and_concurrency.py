"""Reliability, round 2: one writer per run, sweeps that tell the truth, every value validated,
OS errors as messages, failed starts that leave nothing behind, honest advice."""

from __future__ import annotations

import dataclasses
import errno
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from rich.console import Console

from lstmablate.errors import RunDirError, UserError
from lstmablate.run.runlock import RunLock, lock_holder
from lstmablate.run.runner import train_run
from lstmablate.run.runs import RunFiles

from cli_in_process import expect_error, run_cli, start_cli

FIXTURES = Path(__file__).parent / "fixtures"
QUIET = Console(file=open(os.devnull, "w"))  # noqa: SIM115


def start_and_interrupt_when(args, cwd, marker: str) -> tuple[int, str]:
    """Run the CLI; once ``marker`` appears on its stderr, Ctrl-C it. (exit code, stderr)"""
    p = start_cli(*args, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seen = []
    for line in p.stderr:
        seen.append(line)
        if marker in line:
            p.send_signal(signal.SIGINT)
            break
    rest = p.stderr.read()
    p.wait(timeout=120)
    return p.returncode, "".join(seen) + rest


# ------------------------------------------------------------------ one writer per run


def test_lock_refuses_a_second_writer_and_names_the_holder(tmp_path):
    d = tmp_path / "run"
    lock = RunLock(d).acquire()
    try:
        with pytest.raises(RunDirError, match=f"PID {os.getpid()} on "):
            RunLock(d).acquire()
        assert f"PID {os.getpid()}" in lock_holder(d)
    finally:
        lock.release()
    assert lock_holder(d) is None
    with RunLock(d):  # free again
        pass


def test_a_second_process_cannot_write_a_running_run_and_kill_9_frees_it(tmp_path, tiny_recipe):
    args = ["train", "--task", "dyck", "--recipe", str(tiny_recipe), "--out", "runs",
            "--threads", "1", "--set", "train.max_epochs=100000", "--set", "train.patience=0"]
    first = start_cli(*args, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    run = tmp_path / "runs" / "tiny" / "lstm" / "seed-1"
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            if RunFiles(run).last.exists() and RunFiles(run).metrics.exists():
                break
            time.sleep(0.05)
        text = expect_error(run_cli(*args, "--resume", cwd=tmp_path), "is being written by",
                            f"PID {first.pid}", "--resume")
        assert "Traceback" not in text
        expect_error(run_cli(*args, "--force", cwd=tmp_path), f"PID {first.pid}")
        assert RunFiles(run).last.exists()  # --force deleted nothing of the running run
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    # the OS released the lock with the process: the killed run resumes
    code, err = start_and_interrupt_when([*args, "--resume"], tmp_path, "resuming at epoch")
    assert code == 0 and "resuming at epoch" in err, err


# ------------------------------------------------------------------ sweeps


def test_parallel_sweep_reads_each_runs_status_and_stops_after_an_interrupt(tmp_path, tiny_recipe,
                                                                            monkeypatch):
    from lstmablate.run import sweep as S

    plan = S.plan_sweep(str(tiny_recipe), tmp_path / "runs")  # 2 cells x 2 seeds
    started = []

    class Child:  # an interrupted `lstmablate train`: exit 0, progress saved, no result.json
        def __init__(self, argv, **kw):
            self.cmd = argv
            started.append(argv)
            run = Path(argv[argv.index("--out") + 1]) / "tiny" / argv[argv.index("--cell") + 1] \
                / f"seed-{argv[argv.index('--seed') + 1]}"
            run.mkdir(parents=True)
            RunFiles(run).last.write_bytes(b"x")
            self.returncode = 0

        def poll(self):
            return 0

        def wait(self):
            return 0

    monkeypatch.setattr(S.subprocess, "Popen", Child)
    with pytest.raises(S.SweepInterrupted, match=r"2 runs interrupted.*2 not started") as e:
        S.run_sweep(plan, console=QUIET, jobs=2)
    assert e.value.exit_code == 130 and len(started) == 2  # no new run after the interrupt
    assert [S.run_status(it) for it in plan] == ["interrupted"] * 2 + ["not started"] * 2


def test_interrupted_sequential_sweep_exits_non_zero(tmp_path, tiny_recipe, monkeypatch):
    from lstmablate.run import runner, sweep as S

    monkeypatch.setattr(runner, "train_run", lambda *a, **k: runner.TrainOutcome(tmp_path, None, True))
    with pytest.raises(S.SweepInterrupted, match="was interrupted"):
        S.run_sweep(S.plan_sweep(str(tiny_recipe), tmp_path / "runs"), console=QUIET)


@pytest.mark.parametrize("jobs", [1, 2])
def test_sweep_leaves_a_run_that_another_process_trains_and_names_it(tmp_path, tiny_recipe,
                                                                      monkeypatch, jobs):
    """One run is locked by someone else (an open RunLock here) and one finished after the
    plan was made: the sweep starts neither, names the locked one, and runs the rest."""
    import io

    from lstmablate.run import runner, sweep as S

    plan = S.plan_sweep(str(tiny_recipe), tmp_path / "runs")  # lstm 1, 2; lstm-srnn 1, 2
    locked, done_meanwhile = plan[1].run_dir, plan[2].run_dir
    done_meanwhile.mkdir(parents=True)
    RunFiles(done_meanwhile).result.write_text("{}")
    RunFiles(done_meanwhile).config.write_text("task: dyck\n")
    started = []
    if jobs == 1:
        monkeypatch.setattr(runner, "train_run", lambda task, cell, seed, **k: (
            started.append((cell, seed)), runner.TrainOutcome(tmp_path, None, False))[1])
    else:
        class Child:  # a `lstmablate train` that finishes at once
            def __init__(self, argv, **kw):
                cell, seed = argv[argv.index("--cell") + 1], int(argv[argv.index("--seed") + 1])
                started.append((cell, seed))
                run = Path(argv[argv.index("--out") + 1]) / "tiny" / cell / f"seed-{seed}"
                run.mkdir(parents=True, exist_ok=True)
                RunFiles(run).result.write_text("{}")
                RunFiles(run).config.write_text("task: dyck\n")
                self.returncode = 0

            def poll(self):
                return 0

            def wait(self):
                return 0

        monkeypatch.setattr(S.subprocess, "Popen", Child)
    out = io.StringIO()
    with RunLock(locked):
        assert lock_holder(locked)
        S.run_sweep(plan, console=Console(file=out, width=400), jobs=jobs)
    text = " ".join(out.getvalue().split())
    assert sorted(started) == [("lstm", 1), ("lstm-srnn", 2)]
    assert f"left alone {locked}: being trained by PID {os.getpid()}" in text
    assert f"finished meanwhile (elsewhere): {done_meanwhile}" in text
    assert "1 run was being trained by other processes and left to them" in text


# ------------------------------------------------------------------ every value validated


def _fields(cfg):
    return [f.name for f in dataclasses.fields(cfg)]


BAD_VALUES = ["nan", "inf", "-1", "0", "zero", "[1, 2]"]


@pytest.mark.parametrize("task", ["dyck", "ptb"])
def test_every_config_field_rejects_bad_values_with_a_message(task, tiny_recipe, tmp_path):
    """Each field of each section, fed nan, inf, a negative number, zero, a string, a list:
    the run is refused with a message (a UserError: exit 2) or, where the value means
    something (dropout 0, clip_norm 0 = off), it trains — never another exception."""
    from lstmablate.config import TrainConfig
    from lstmablate.recipes import resolve_config
    from lstmablate.task import get_task

    cls = get_task(task)
    base = (["train.max_steps=1", "train.eval_test=false"] if task == "ptb" else
            ["train.max_steps=1", "train.eval_test=false"])
    recipe = str(tiny_recipe) if task == "dyck" else None
    if task == "ptb":
        recipe_file = tmp_path / "p.yaml"
        recipe_file.write_text("task: ptb\ndata: {batch_size: 2, num_steps: 3, verify: false}\n"
                               "model: {hidden_size: 8}\n")
        recipe = str(recipe_file)
    sections = {"data": cls.DataConfig(), "model": cls.ModelConfig(), "train": TrainConfig(),
                "eval": cls.EvalConfig()}
    accepted, n = [], 0
    for section, cfg in sections.items():
        for name in _fields(cfg):
            if (section, name) in (("train", "max_steps"), ("train", "max_epochs")):
                continue  # covered below without training for ever
            for value in BAD_VALUES:
                n += 1
                item = f"{section}.{name}={value}"
                try:
                    train_run(task, "lstm", recipe=recipe, overrides=base + [item],
                              out=tmp_path / "runs" / str(n), console=QUIET, progress=False,
                              data_dir=str(FIXTURES), threads=1)
                except UserError:
                    continue
                accepted.append(item)
    # what trains must be meaningful; these the issue named must never be accepted
    never = {"train.lr=0", "train.lr=inf", "train.lr=nan", "train.clip_norm=nan",
             "train.eval_every=-1", "train.patience=-1", "model.hidden_size=-1",
             "model.hidden_size=0" if task == "ptb" else "model.hidden_size=-1",
             "model.embedding_dim=-1"}
    assert not never & set(accepted), sorted(never & set(accepted))
    assert not [a for a in accepted if a.endswith(("=nan", "=inf"))], accepted
    for item in ("train.max_steps=-5", "train.max_epochs=0", "train.max_epochs=nan"):
        with pytest.raises(UserError):
            resolve_config(cls, "lstm", recipe=recipe, overrides=[item])


@pytest.mark.parametrize("item, message", [
    ("train.lr=0", "train.lr must be > 0"),
    ("train.lr=inf", "expected a finite number"),
    ("train.clip_norm=nan", "expected a finite number"),
    ("model.hidden_size=-3", "model.hidden_size must be >= 0"),
    ("model.embedding_dim=-2", "model.embedding_dim must be >= 0"),
    ("train.eval_every=-1", "train.eval_every must be >= 0"),
    ("train.patience=-1", "train.patience must be >= 0"),
])
def test_named_bad_values_exit_2_before_anything_is_written(tmp_path, tiny_recipe, item, message):
    r = run_cli("train", "--task", "dyck", "--recipe", str(tiny_recipe), "--out", "runs",
                "--set", item, cwd=tmp_path)
    expect_error(r, message)
    assert not (tmp_path / "runs").exists()


# ------------------------------------------------------------------ OS errors, failed starts


def test_out_pointing_at_a_file(tmp_path, tiny_recipe):
    (tmp_path / "afile").write_text("x")
    expect_error(run_cli("train", "--task", "dyck", "--recipe", str(tiny_recipe),
                         "--out", "afile", cwd=tmp_path), "afile", "not a directory", "Nothing was written")


def test_read_only_output_is_a_message(tmp_path, tiny_recipe, monkeypatch):
    real_mkdir = Path.mkdir

    def read_only(self, *a, **k):
        if "runs" in str(self):
            raise OSError(errno.EROFS, "Read-only file system", str(self))
        return real_mkdir(self, *a, **k)

    monkeypatch.setattr(Path, "mkdir", read_only)
    with pytest.raises(RunDirError, match="Read-only file system.*Nothing was written"):
        train_run("dyck", "lstm", recipe=str(tiny_recipe), out=tmp_path / "runs", console=QUIET,
                  progress=False, overrides=["train.max_steps=1"])


def test_disk_full_while_saving_keeps_the_previous_checkpoint(tmp_path, tiny_recipe, monkeypatch):
    from lstmablate.io import write as atomic

    saved = []
    real_fsync = atomic.os.fsync

    def fsync(fd):  # the disk fills up at the second save of last.pt
        name = os.readlink(f"/proc/self/fd/{fd}") if os.path.exists(f"/proc/self/fd/{fd}") else ""
        if ".tmp-last.pt" in name:
            saved.append(name)
            if len(saved) == 2:
                raise OSError(errno.ENOSPC, "No space left on device")
        return real_fsync(fd)

    if not Path("/proc/self/fd").exists():
        pytest.skip("needs /proc to name the file being written")
    monkeypatch.setattr(atomic.os, "fsync", fsync)
    out = tmp_path / "runs"
    with pytest.raises(UserError, match="No space left on device.*previous last.pt is intact"):
        train_run("dyck", "lstm", recipe=str(tiny_recipe), out=out, console=QUIET, progress=False,
                  overrides=["train.max_steps=3", "train.eval_every=1"])
    monkeypatch.setattr(atomic.os, "fsync", real_fsync)
    run = out / "tiny" / "lstm" / "seed-1"
    assert not list(run.glob(".tmp-*"))  # no half-written file left
    from lstmablate.train.checkpoint import load_checkpoint

    assert load_checkpoint(RunFiles(run).last)["position"]["step"] == 1  # the previous one, intact
    resumed = train_run("dyck", "lstm", recipe=str(tiny_recipe), out=out, console=QUIET,
                        progress=False, overrides=["train.max_steps=3", "train.eval_every=1"],
                        resume=True)
    assert resumed.result.steps == 3


def test_a_failed_start_leaves_nothing_and_the_corrected_command_starts(tmp_path):
    data = tmp_path / "data" / "ptb"
    data.mkdir(parents=True)
    for f in (FIXTURES / "ptb").iterdir():
        (data / f.name).write_text(f.read_text())
    recipe = tmp_path / "p.yaml"
    recipe.write_text("task: ptb\ndata: {batch_size: 2, num_steps: 3}\nmodel: {hidden_size: 8}\n")
    args = ["train", "--task", "ptb", "--recipe", str(recipe), "--out", "runs", "--data-dir",
            "data", "--set", "train.max_steps=2", "--threads", "1"]
    expect_error(run_cli(*args, cwd=tmp_path), "checksum mismatch")  # fixture != real PTB
    assert not (tmp_path / "runs").exists()
    expect_error(run_cli(*args, "--set", "data.verify=false", "--set",
                         "model.cell_options={bogus: 1}", cwd=tmp_path), "bogus")
    assert not (tmp_path / "runs").exists()
    assert run_cli(*args, "--set", "data.verify=false", cwd=tmp_path).returncode == 0


def test_a_run_folder_whose_start_crashed_is_started_again(tmp_path, tiny_recipe):
    """config.yaml and env.json from a start that died before training do not block."""
    out = tmp_path / "runs"
    done = train_run("dyck", "lstm", recipe=str(tiny_recipe), out=out, console=QUIET,
                     progress=False, overrides=["train.max_steps=1"])
    for name in (RunFiles.METRICS, RunFiles.RESULT, RunFiles.LAST, RunFiles.BEST):
        (done.run_dir / name).unlink()
    again = train_run("dyck", "lstm", recipe=str(tiny_recipe), out=out, console=QUIET,
                      progress=False, overrides=["train.max_steps=2"])
    assert again.result.steps == 2


# ------------------------------------------------------------------ honest advice


def _suggested(text: str, flag: str, args: list[str]) -> list[str]:
    assert flag in text, text
    return [*args, flag]


def test_corrupt_or_missing_last_pt_advice_is_a_command_that_works(tmp_path, tiny_recipe):
    args = ["train", "--task", "dyck", "--recipe", str(tiny_recipe), "--out", "runs",
            "--set", "train.max_steps=2", "--threads", "1"]
    assert run_cli(*args, cwd=tmp_path).returncode == 0
    run = tmp_path / "runs" / "tiny" / "lstm" / "seed-1"
    RunFiles(run).result.unlink()
    RunFiles(run).last.write_bytes(b"damaged")
    text = expect_error(run_cli(*args, "--resume", cwd=tmp_path), RunFiles.LAST, "corrupt")
    assert "without --resume" not in text  # that would be refused: the run exists
    r = run_cli(*_suggested(text, "--force", args), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    RunFiles(run).last.unlink()
    text = expect_error(run_cli(*args, "--resume", cwd=tmp_path), "no last.pt")
    assert run_cli(*_suggested(text, "--force", args), cwd=tmp_path).returncode == 0
    text = expect_error(run_cli(*args, cwd=tmp_path), "already holds this run")
    assert run_cli(*_suggested(text, "--resume", args), cwd=tmp_path).returncode == 0


def test_interrupt_message_command_resumes(tmp_path, tiny_recipe):
    args = ["train", "--task", "dyck", "--recipe", str(tiny_recipe), "--out", "runs",
            "--set", "train.max_epochs=100000", "--set", "train.patience=0", "--threads", "1"]
    p = start_cli(*args, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    run = tmp_path / "runs" / "tiny" / "lstm" / "seed-1"
    deadline = time.time() + 120
    while time.time() < deadline and not RunFiles(run).metrics.exists():
        time.sleep(0.05)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    text = " ".join(err.split())
    assert p.returncode == 0 and "the same command plus --resume" in text
    code, err = start_and_interrupt_when([*args, "--resume"], tmp_path, "resuming at epoch")
    assert code == 0 and "resuming at epoch" in err, err


def test_messages_are_grammatical_and_data_dir_file_is_named(tmp_path, tiny_recipe):
    text = expect_error(run_cli("train", "--task", "dyck", "--recipe", str(tiny_recipe),
                                "--set", "train.max_stepz=3", cwd=tmp_path), "train.max_steps")
    assert "--sets" not in text and "Valid choices:" in text
    (tmp_path / "notadir").write_text("x")
    text = expect_error(run_cli("train", "--task", "ptb", "--data-dir", "notadir", cwd=tmp_path),
                        "is a file, not a directory")
    assert "does not exist" not in text
