"""`sweep --launcher slurm` (submitit), its options and `--status`; then against a real Slurm.

The first tests need no cluster: the options and the user's config file, the sbatch script a
dry run prints, the array task (it trains its run in a child process with resume semantics,
skips a run another process trains, and hands submitit itself to requeue), and `--status` read
from run folders, records and the queue.  The last two submit to a real one-node Slurm that
this module starts (tests/slurm_cluster.py: root and Debian's slurm-wlm and munge, installed
with apt-get if missing; they skip, saying why, where it cannot be started): a sweep as an array
job gives exactly the run folders the same sweep gives here, and a job signalled before its
time limit saves, requeues itself and continues exactly.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import sys
import time
from pathlib import Path

import pytest

from cli_in_process import run_cli
from lstmablate.errors import ConfigError
from lstmablate.run import cluster, slurm_options
from lstmablate.run.runlock import RunLock
from lstmablate.run.runs import RunFiles, SlurmFiles
from lstmablate.run.sweep import plan_sweep
from slurm_cluster import OneNodeSlurm, why_not

submitit = pytest.importorskip("submitit")  # the dev extra installs it

QUICK = ["--set", "train.max_steps=2"]


def _tsv(stdout: str) -> dict[str, list[str]]:
    """`sweep --status` piped: run -> [status, job, detail]."""
    lines = [line.split("\t") for line in stdout.strip().splitlines()]
    assert lines[0] == ["run", "status", "job", "detail"]
    return {row[0]: row[1:] for row in lines[1:]}


# -- options -----------------------------------------------------------------------------------
@pytest.mark.parametrize("text, minutes", [("240", 240), ("90:30", 91), ("4:00:00", 240),
                                           ("1-12", 2160), ("1-00:30", 1470),
                                           ("1-00:00:30", 1441)])
def test_time_limits_in_the_forms_sbatch_reads_are_whole_minutes(text, minutes):
    assert slurm_options.parse_time(text) == minutes


@pytest.mark.parametrize("text", ["soon", "0", "1:2:3:4", "-5"])
def test_a_time_limit_sbatch_would_not_read_is_refused(text):
    with pytest.raises(ConfigError, match="time"):
        slurm_options.parse_time(text)


def test_the_command_line_wins_over_the_user_file_over_the_defaults(tmp_path, monkeypatch,
                                                                     tiny_recipe):
    conf = tmp_path / "slurm.yaml"
    conf.write_text("partition: gpu\ntime: '2:00:00'\ncpus_per_job: 4\n"
                    "slurm-opts: {constraint: a100}\nsetup: ['module load cuda']\n")
    monkeypatch.setenv(slurm_options.CONFIG_ENV, str(conf))
    opts = slurm_options.slurm_options({"partition": "debug", "time": None, "mem": "16G",
                                  "slurm_opts": ["exclude=node7", "exclusive"]})
    assert (opts.partition, opts.time_minutes, opts.cpus_per_job, opts.mem) == ("debug", 120, 4, "16G")
    assert opts.slurm_opts == {"constraint": "a100", "exclude": "node7", "exclusive": True}
    assert slurm_options.slurm_options({}, config=tmp_path / "absent.yaml").time_minutes == 240

    r = run_cli("sweep", tiny_recipe, "--out", "runs", "--launcher", "slurm", "--dry-run",
                "--partition", "debug", "--slurm-opt", "exclude=node7", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    script = r.stdout
    for line in ("#SBATCH --partition=debug", "#SBATCH --time=120", "#SBATCH --cpus-per-task=4",
                 "#SBATCH --constraint=a100", "#SBATCH --exclude=node7", "#SBATCH --array=0-3%4",
                 "#SBATCH --signal=USR2@90", "module load cuda",
                 f"-m submitit.core._submit {tmp_path / 'runs' / SlurmFiles.FOLDER}"):
        assert line in script, line
    # each of the four tasks would train its run with the CPUs it asked for
    assert r.stderr.count("-m lstmablate train --task dyck") == 4
    assert "--threads 4" in r.stderr and "nothing submitted" in r.stderr
    assert not (tmp_path / "runs").exists()  # a dry run writes nothing


@pytest.mark.parametrize("text, where, expected", [
    ("partition: gpu\ngpu-per-job: 2\n", "line 2", "Did you mean 'gpus-per-job'"),
    ("partition: gpu\n\ntime: soon\n", "line 3", "not a Slurm time limit"),
    ("mem: lots\n", "line 1", "sbatch --mem"),
    ("slurm-opts: {array: 0-9}\n", "line 1", "set by lstmablate"),
    ("partition: !!python/object/apply:os.system ['touch HACKED']\n", "line 1", "YAML"),
    ("- partition\n", "slurm.yaml", "mapping"),
])
def test_a_bad_user_file_is_one_message_naming_file_and_line(tmp_path, monkeypatch, tiny_recipe,
                                                             text, where, expected):
    conf = tmp_path / "slurm.yaml"
    conf.write_text(text)
    monkeypatch.setenv(slurm_options.CONFIG_ENV, str(conf))
    r = run_cli("sweep", tiny_recipe, "--launcher", "slurm", "--dry-run", cwd=tmp_path)
    assert r.returncode == 2
    message = " ".join(r.stderr.split())
    assert str(conf) in message and where in message and expected in message, message
    assert "Traceback" not in r.stderr and not (tmp_path / "HACKED").exists()


@pytest.mark.parametrize("args, expected", [
    (["--partition", "gpu"], "--partition: option(s) of --launcher slurm"),
    (["--dry-run"], "--dry-run: option(s) of --launcher slurm"),
    (["--launcher", "slurm", "--jobs", "2"], "--array-parallelism"),
    (["--launcher", "pbs"], "expected local"),
    (["--launcher", "slurm", "--status", "--dry-run"], "--status submit nothing"),
    (["--list", "--partition", "gpu"], "--status submit nothing"),
    (["--launcher", "slurm", "--dry-run", "--slurm-opt", "output=x.log"], "set by lstmablate"),
    (["--launcher", "slurm", "--dry-run", "--cpus-per-job", "0"], "between 1 and 4,096"),
])
def test_options_that_do_not_go_together_are_refused(tmp_path, tiny_recipe, args, expected):
    r = run_cli("sweep", tiny_recipe, *args, cwd=tmp_path)
    assert r.returncode == 2 and expected in " ".join(r.stderr.split()), r.stderr


def test_without_submitit_the_message_names_the_install_command(tmp_path, tiny_recipe, monkeypatch):
    monkeypatch.setitem(sys.modules, "submitit", None)  # `import submitit` fails
    r = run_cli("sweep", tiny_recipe, "--launcher", "slurm", "--dry-run", cwd=tmp_path)
    assert r.returncode == 2 and cluster.INSTALL in r.stderr, r.stderr
    r = run_cli("sweep", tiny_recipe, "--list", cwd=tmp_path)  # everything else works without it
    assert r.returncode == 0 and r.stdout.count("lstmablate train") == 4


# -- the array task ----------------------------------------------------------------------------
def test_an_array_task_trains_its_run_skips_a_locked_one_and_requeues_itself(tmp_path, tiny_recipe,
                                                                             monkeypatch):
    for key, value in {"SUBMITIT_EXECUTOR": "slurm", "SLURM_JOB_ID": "41",
                       "SLURM_ARRAY_JOB_ID": "40", "SLURM_ARRAY_TASK_ID": "1"}.items():
        monkeypatch.setenv(key, value)  # what Slurm sets in task 1 of array job 40
    monkeypatch.chdir(tmp_path)
    item = plan_sweep(str(tiny_recipe), Path("runs"), overrides=["train.max_steps=2"],
                      threads=1)[1]
    item = cluster._for_job(item)
    files, records = RunFiles(item.run_dir), SlurmFiles(item.out)
    task = cluster.TrainTask(item)

    with RunLock(item.run_dir):  # another process trains it: the task leaves it alone
        assert task() == "skipped"
    outcome = json.loads(records.outcome("40_1").read_text())
    assert outcome["state"] == "skipped" and f"PID {os.getpid()}" in outcome["note"]

    assert task() == "finished"  # `lstmablate train` in a child process, logging beside the run
    outcome = json.loads(records.outcome("40_1").read_text())
    assert (outcome["state"], outcome["exit"], outcome["run"]) == ("finished", 0, "tiny/lstm/seed-2")
    assert files.is_finished() and "done" in files.log.read_text()
    assert task() == "finished"  # a finished run is not trained again

    # a run that fails: the task says so (submitit marks the job failed) and keeps the outcome
    broken = RunFiles(Path("runs/tiny/lstm/seed-1"))
    broken.root.mkdir(parents=True)
    broken.config.write_text("task: [dyck\n")  # damaged, after the run had started
    broken.last.write_bytes(b"")
    broken = cluster._for_job(plan_sweep(str(tiny_recipe), Path("runs"), threads=1,
                                         refuse_conflicts=False)[0])
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "0")
    with pytest.raises(RuntimeError, match="failed .exit 2"):
        cluster.TrainTask(broken)()
    assert json.loads(records.outcome("40_0").read_text())["state"] == "failed"
    assert "not valid YAML" in RunFiles(broken.run_dir).log.read_text()

    # submitit pickles the task without its child process and, at a time limit, requeues it
    import cloudpickle

    again = cloudpickle.loads(cloudpickle.dumps(task))
    assert again.item == item and again._proc is None
    delayed = task.checkpoint()
    assert isinstance(delayed, submitit.helpers.DelayedSubmission)
    assert delayed.function.item == item and delayed.args == ()


def test_a_job_with_several_gpus_trains_under_torchrun(tmp_path, tiny_recipe):
    item = plan_sweep(str(tiny_recipe), tmp_path / "runs", device="cuda")[0]
    assert cluster.task_argv(item, 1) == item.argv
    argv = cluster.task_argv(item, 4)
    assert argv[:5] == [sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc-per-node=4"]
    assert argv[5:] == item.argv[1:] and "--device" in argv and "cuda" in argv


# -- --status ------------------------------------------------------------------------------------
def test_status_reads_run_folders_the_jobs_kept_beside_them_and_the_queue(tmp_path, tiny_recipe,
                                                                          monkeypatch):
    runs = tmp_path / "runs"
    for seed in ("1", "2"):
        r = run_cli("train", "--task", "dyck", "--cell", "lstm", "--recipe", tiny_recipe, "--seed",
                    seed, "--out", "runs", "--experiment", "tiny", "--threads", "1", *QUICK,
                    cwd=tmp_path)
        assert r.returncode == 0, r.stderr
    (runs / "tiny/lstm/seed-2/result.json").unlink()  # stopped before its end: last.pt is there
    records = SlurmFiles(runs)
    records.folder.mkdir()
    records.submission("7").write_text(json.dumps({"job": "7", "runs": [
        {"run": "tiny/lstm-srnn/seed-1", "job": "7_2"}, {"run": "tiny/lstm-srnn/seed-2", "job": "7_3"}]}))
    records.outcome("7_3").write_text(json.dumps({"state": "failed", "exit": 2}))
    (runs / "tiny/lstm-srnn").mkdir()
    RunFiles(runs / "tiny/lstm-srnn/seed-2").log.write_text(
        "tiny task=dyck\nerror: the data directory data/ has no file ptb/ptb.train.txt.\n")
    monkeypatch.setattr(cluster, "squeue", lambda: {"7_2": "PENDING", "9_0": "RUNNING"})

    def status():
        return run_cli("sweep", tiny_recipe, "--out", "runs", *QUICK, "--status", cwd=tmp_path)

    r = status()
    assert r.returncode == 0, r.stderr
    assert _tsv(r.stdout) == {
        "tiny/lstm/seed-1": ["finished", "-", ""],
        "tiny/lstm/seed-2": ["interrupted", "-", "resumes from last.pt"],
        "tiny/lstm-srnn/seed-1": ["queued", "7_2", "pending"],
        "tiny/lstm-srnn/seed-2": ["failed", "7_3", "exit 2: tiny task=dyck | error: the data "
                                  "directory data/ has no file ptb/ptb.train.txt."]}
    assert "4 runs: 1 finished, 1 queued, 1 interrupted, 1 failed" in " ".join(r.stderr.split())

    monkeypatch.setattr(cluster, "squeue", lambda: {})  # the queue emptied
    with RunLock(runs / "tiny/lstm/seed-2"):
        rows = _tsv(status().stdout)
    assert rows["tiny/lstm/seed-2"][0] == "running" and f"PID {os.getpid()}" in rows["tiny/lstm/seed-2"][2]
    assert rows["tiny/lstm-srnn/seed-1"] == ["missing", "7_2", "its job ended before it ran"]

    # another --set: the finished runs were trained with another config
    r = run_cli("sweep", tiny_recipe, "--out", "runs", "--status", cwd=tmp_path)
    assert r.returncode == 0 and _tsv(r.stdout)["tiny/lstm/seed-1"][0] == "conflict"


# -- a real one-node Slurm ---------------------------------------------------------------------
@pytest.fixture(scope="session")
def slurm():
    reason = why_not()
    if reason:
        pytest.skip(f"no one-node Slurm here: {reason}")
    c = OneNodeSlurm.start()
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(c.conf)
    try:
        yield c
    finally:
        if old is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old
        c.stop()


def _queue(c: OneNodeSlurm, job: str) -> dict[str, str]:
    """The array tasks of ``job`` in the queue: task id -> state."""
    text = c.run("squeue", "-h", "-r", "-o", "%i|%T").stdout
    rows = dict(line.split("|") for line in text.split())
    return {k: v for k, v in rows.items() if k == job or k.startswith(f"{job}_")}


def _wait(what: str, condition, timeout: float = 240):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"waited {timeout:.0f} s for {what}")


def _same_runs(a: Path, b: Path, runs: list[str]) -> None:
    for run in runs:
        assert RunFiles(a / run).metrics.read_bytes() == RunFiles(b / run).metrics.read_bytes()
        ra, rb = (json.loads(RunFiles(root / run).result.read_text()) for root in (a, b))
        for key in ("best", "test", "steps", "epochs", "params"):
            assert ra[key] == rb[key], (run, key)


def test_a_sweep_on_slurm_equals_the_same_sweep_run_here(slurm, tmp_path, tiny_recipe):
    recipe = tmp_path / "two.yaml"  # two cells, one seed: an array of two tasks
    recipe.write_text(tiny_recipe.read_text().replace("seeds: [1, 2]", "seeds: [1]"))
    args = ("sweep", recipe, "--launcher", "slurm", "--out", "cluster", "--time", "10")
    dry = run_cli(*args, "--dry-run", cwd=tmp_path)
    r = run_cli(*args, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    records = SlurmFiles(tmp_path / "cluster")
    [record] = records.submissions()
    job = json.loads(record.read_text())["job"]
    # what --dry-run printed is what was submitted
    assert (records.folder / f"{job}_submission.sh").read_text().strip() == dry.stdout.strip()

    [suggested] = re.findall(r"`(lstmablate sweep [^`]*--status)`", " ".join(r.stderr.split()))
    during = _tsv(run_cli(*shlex.split(suggested)[1:], cwd=tmp_path).stdout)  # as it is printed
    assert {row[1] for row in during.values()} == {f"{job}_0", f"{job}_1"}
    assert {row[0] for row in during.values()} <= {"queued", "running", "finished"}
    again = run_cli(*args, cwd=tmp_path)  # nothing is submitted twice
    assert again.returncode == 0 and "not submitted again" in " ".join(again.stderr.split())
    assert len(records.submissions()) == 1

    here = run_cli("sweep", recipe, "--out", "here", "--threads", "1", cwd=tmp_path)
    assert here.returncode == 0, here.stderr
    _wait("the array job to end", lambda: not _queue(slurm, job))

    after = _tsv(run_cli("sweep", recipe, "--out", "cluster", "--status", cwd=tmp_path).stdout)
    assert [row[0] for row in after.values()] == ["finished", "finished"], after
    _same_runs(tmp_path / "cluster", tmp_path / "here", list(after))


def test_a_job_signalled_before_its_time_limit_saves_requeues_and_continues_exactly(
        slurm, tmp_path, tiny_recipe):
    one = ["--set", "train.max_epochs=60"]  # long enough to be running when signalled, on any machine
    recipe = tmp_path / "one.yaml"
    recipe.write_text(tiny_recipe.read_text().replace("cells: [lstm, lstm-srnn]", "cells: [lstm]")
                      .replace("seeds: [1, 2]", "seeds: [1]"))
    r = run_cli("sweep", recipe, "--launcher", "slurm", "--out", "cluster", "--time", "10", *one,
                cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    run = "tiny/lstm/seed-1"
    files = RunFiles(tmp_path / "cluster" / run)
    job = json.loads(SlurmFiles(tmp_path / "cluster").submissions()[0].read_text())["runs"][0]["job"]
    def status():
        return _tsv(run_cli("sweep", recipe, "--out", "cluster", *one, "--status",
                            cwd=tmp_path).stdout)[run]


    _wait("two evaluations", lambda: files.metrics.exists() and
          len(files.metrics.read_text().splitlines()) >= 2)
    assert status()[:2] == ["running", job]
    # what Slurm sends signal_delay_s before the time limit (and at a preemption)
    slurm.run("scancel", "--signal=USR2", job)
    _wait("the requeued job to wait in the queue", lambda: _queue(slurm, job).get(job) == "PENDING", 120)
    requeued = time.time()
    assert files.last.exists() and not files.is_finished()
    assert "interrupted; continue with the same command" in files.log.read_text()
    assert status()[:2] == ["queued", job]
    # Slurm holds a requeued job back for two minutes; let it start sooner, though not within
    # the second slurmd revoked the job's first credential in: a credential made in that second
    # counts as revoked too ("Job credential revoked"), and the job would end without running
    time.sleep(max(0.0, math.floor(requeued) + 2 - time.time()))
    slurm.run("scontrol", "update", f"jobid={job}", "StartTime=now")
    _wait("the requeued job to end", lambda: not _queue(slurm, job))
    assert status()[0] == "finished" and "resuming at epoch" in files.log.read_text(), \
        f"{status()}\n{files.log.read_text()[-2000:]}\n{slurm.job_log(job)}"

    here = run_cli("sweep", recipe, "--out", "here", "--threads", "1", *one, cwd=tmp_path)
    assert here.returncode == 0, here.stderr
    _same_runs(tmp_path / "cluster", tmp_path / "here", [run])
