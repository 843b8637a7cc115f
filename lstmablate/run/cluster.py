"""Sweeps on a Slurm cluster (``sweep --launcher slurm``) through submitit, and ``--status``.

A sweep's unfinished runs go to Slurm as one array job (submitit's ``SlurmExecutor``): each
array task is a :class:`TrainTask`, which trains its run as ``lstmablate train`` does — the
same command a local ``sweep --jobs N`` starts, with ``--resume`` when the run was started
before — in a child process logging to ``<run folder>.log``.  A run that finished meanwhile,
or that another process is training (its lock is held), is skipped, as in a local sweep.

Time limits and preemption follow submitit's checkpointing protocol.  Slurm sends the job
submitit's signal (``USR2``, ``signal_delay_s`` before the time limit, or at preemption when the
cluster is so configured); submitit's handler, in the task's Python process, calls
:meth:`TrainTask.checkpoint`, which asks the training process to stop (SIGTERM: it finishes its
step and saves ``last.pt``) and waits for it, then hands submitit the same task to run again:
submitit requeues the array task (``scontrol requeue``), and the requeued task resumes the run
from ``last.pt`` exactly.  The training process ignores submitit's signal itself (Slurm signals
every process of a job), so the one request to stop comes from its parent.

What was submitted is kept in the runs folder (:class:`~lstmablate.run.runs.SlurmFiles`): the
runs of each array job in task order, and how each task's training ended.  ``--status`` reads
those, the run folders and the queue (``squeue``; ``sacct`` is not used, since clusters without
accounting have none) and says per run: finished, running, queued, interrupted, failed (with
the last lines of its log) or missing.

submitit is optional (``pip install 'lstmablate[slurm]'``); only this module imports it, and
only when a sweep is submitted.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rich.console import Console

from lstmablate.console import count, escape
from lstmablate.errors import UserError
from lstmablate.io import atomic_write_json, read_json
from .runlock import lock_holder
from .runs import RunFiles, SlurmFiles
from .slurm_options import SlurmOptions, check_runs_folder, config_path
from .sweep import SweepItem, claim

INSTALL = "pip install 'lstmablate[slurm]'"
#: how often a task may reach its time limit and be requeued: every requeue continues from
#: the step the previous job saved, so a run longer than its jobs' time limit still finishes
MAX_TIMEOUTS = 50


# -- submitting ------------------------------------------------------------------------------
def require_submitit() -> Any:
    try:
        import submitit
    except ImportError:
        raise UserError(f"--launcher slurm submits through submitit, which is not installed: "
                        f"`{INSTALL}` (or `pip install submitit`).") from None
    return submitit


def task_argv(item: SweepItem, gpus: int | None) -> list[str]:
    """The training command of an array task: ``item``'s ``lstmablate train`` command, under
    ``torchrun`` (one process per GPU, on the job's node) when the job has several GPUs."""
    argv = item.argv
    if gpus and gpus > 1:
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                f"--nproc-per-node={gpus}", *argv[1:]]
    return argv


class TrainTask:
    """One array task: train one run of a sweep (submitit calls it, pickled, in the job)."""

    def __init__(self, item: SweepItem, gpus: int | None = None):
        self.item = item
        self.gpus = gpus
        self._proc: subprocess.Popen | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"item": self.item, "gpus": self.gpus}  # never the child process

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["item"], state["gpus"])

    def __call__(self) -> str:
        import submitit

        console = Console(stderr=True, highlight=False)
        job = submitit.JobEnvironment().job_id
        busy: list[str] = []
        item = claim(self.item, console, busy)  # finished meanwhile, or trained elsewhere: skip
        if item is None:
            state = "finished" if RunFiles(self.item.run_dir).is_finished() else "skipped"
            _write_outcome(self.item, job, state, None, busy[0] if busy else "")
            return state
        files = RunFiles(item.run_dir)
        files.log.parent.mkdir(parents=True, exist_ok=True)
        argv = task_argv(item, self.gpus)
        console.print(f"{job}: {shlex.join(argv)} (log {files.log})", soft_wrap=True)
        sig = getattr(signal, "SIG" + submitit.JobEnvironment.USR_SIG)
        with open(files.log, "a", encoding="utf-8") as log:
            self._proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT,
                preexec_fn=lambda: signal.signal(sig, signal.SIG_IGN))  # its parent passes it on
            while self._proc.poll() is None:  # (a signal handler may run between the polls)
                time.sleep(0.5)
        code = self._proc.returncode
        state = "finished" if files.is_finished() else "interrupted" if code == 0 else "failed"
        _write_outcome(item, job, state, code, "")
        if state == "failed":
            raise RuntimeError(f"training {item.run_dir} failed (exit {code}); log: {files.log}")
        return state

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        """submitit's hook at the time limit or preemption: the training process saves
        ``last.pt`` and stops; the same task, requeued, resumes it."""
        import submitit

        proc = self._proc
        if proc is not None and proc.returncode is None:
            try:
                proc.send_signal(signal.SIGTERM)  # finish the step, save last.pt, exit
                os.waitpid(proc.pid, 0)  # (not proc.wait(): the interrupted poll may hold its lock)
            except (ChildProcessError, ProcessLookupError):
                pass
        # (requeued even if the run just finished: the next task then only says so)
        return submitit.helpers.DelayedSubmission(TrainTask(self.item, self.gpus))


def _for_job(item: SweepItem) -> SweepItem:
    """``item`` with absolute paths (a job may start in another directory)."""
    recipe = Path(item.recipe)
    if recipe.suffix in (".yaml", ".yml") and recipe.is_file():
        item = replace(item, recipe=str(recipe.resolve()))
    return replace(item, out=item.out.resolve(), run_dir=item.run_dir.resolve(),
                   data_dir=str(Path(item.data_dir).resolve()) if item.data_dir else None)


def _write_outcome(item: SweepItem, job: str, state: str, code: int | None, note: str) -> None:
    atomic_write_json(SlurmFiles(item.out).outcome(job),
                      {"job": job, "run": _rel(item), "state": state, "exit": code, "note": note,
                       "ended": time.strftime("%Y-%m-%dT%H:%M:%S%z")})


def _rel(item: SweepItem) -> str:
    return str(item.run_dir.relative_to(item.out))


def submit_command(folder: Path) -> str:
    """What each array task runs: submitit's job runner on the pickled task."""
    return f"{shlex.quote(sys.executable)} -u -m submitit.core._submit {shlex.quote(str(folder))}"


def job_name(recipe: str) -> str:
    """The array job's name, ``lstmablate-<recipe>``: the recipe's file name without its
    extension, each character other than a letter, digit or ``. _ - +`` written ``_`` (the name
    is an ``#SBATCH`` value, and a recipe file may be named anything)."""
    return "lstmablate-" + re.sub(r"[^A-Za-z0-9._+-]", "_", Path(recipe).stem)[:100]


def sbatch_script(opts: SlurmOptions, folder: Path, n: int, name: str) -> str:
    """The sbatch script submitit writes for an array of ``n`` tasks named ``name``
    (``--dry-run``)."""
    from submitit.slurm.slurm import _make_sbatch_string

    params = opts.executor_parameters(name)
    if n > 1:
        params["map_count"] = n
    return _make_sbatch_string(command=submit_command(folder), folder=folder, **params)


def submit_sweep(plan: list[SweepItem], recipe: str, opts: SlurmOptions, *, dry_run: bool = False,
                 overrides: list[str] | None = None, console: Console | None = None,
                 out: Console | None = None) -> list[str]:
    """Submit the unfinished runs of ``plan`` (the sweep of ``recipe`` with the ``--set``
    ``overrides``) as one array job; returns the task job ids (``<job>_<task>``; none for a dry
    run, which prints the sbatch script to ``out``)."""
    console = console or Console(stderr=True, highlight=False)
    out = out or Console(highlight=False)
    submitit = require_submitit()
    queue = squeue() or {}
    latest = latest_jobs(plan)
    todo, waiting = [], []
    for it in plan:
        if it.finished:
            continue
        job = latest.get(_rel(it), "")
        holder = lock_holder(it.run_dir)
        if holder:
            waiting.append(f"{_rel(it)} (being trained by {holder})")
        elif queue.get(job) in QUEUED + RUNNING:
            waiting.append(f"{_rel(it)} (job {job}, {queue[job].lower()})")
        else:
            todo.append(it)
    if waiting:
        console.print(f"{count(len(waiting), 'run')} already queued or running, not submitted again: "
                      + escape("; ".join(waiting)), soft_wrap=True)
    if not todo:
        console.print(f"nothing to submit: {len(plan) - len(waiting)} of {len(plan)} runs are "
                      "finished" + (", the others queued or running" if waiting else "") + ".",
                      soft_wrap=True)
        return []
    threads = opts.cpus_per_job or 1  # torch would otherwise use every core of the node
    todo = [_for_job(it if it.threads else replace(it, threads=threads)) for it in todo]
    files = SlurmFiles(todo[0].out)
    check_runs_folder(files.folder)
    name = job_name(recipe)
    if dry_run:
        out.print(sbatch_script(opts, files.folder, len(todo), name), markup=False,
                  emoji=False, soft_wrap=True)
        console.print(f"dry run: {len(todo)} array task(s), nothing submitted:", soft_wrap=True)
        for i, it in enumerate(todo):
            console.print(f"  task {i}: {escape(shlex.join(task_argv(it, opts.gpus_per_job)))}",
                          soft_wrap=True)
        return []
    try:
        executor = submitit.SlurmExecutor(folder=files.folder, max_num_timeout=MAX_TIMEOUTS)
    except RuntimeError as e:  # no srun
        raise UserError(f"cannot submit to Slurm from this machine ({e}); run the sweep on a "
                        "machine of the cluster (a login node), or `--dry-run` to see the "
                        "script.") from None
    executor.update_parameters(**opts.executor_parameters(name))
    try:
        with executor.batch():
            jobs = [executor.submit(TrainTask(it, opts.gpus_per_job)) for it in todo]
    except (submitit.core.utils.FailedJobError, submitit.core.utils.FailedSubmissionError,
            subprocess.CalledProcessError, OSError) as e:
        raise UserError(f"sbatch refused the sweep's array job: {' '.join(str(e).split())[:800]} "
                        "Fix the Slurm options (--partition, --time, --mem, --slurm-opt, or "
                        f"{config_path()}); nothing was submitted.") from None
    ids = [j.job_id for j in jobs]
    status_command = ["lstmablate", "sweep", recipe, "--out", str(todo[0].out), "--status"]
    for o in overrides or []:
        status_command += ["--set", o]
    master = ids[0].split("_")[0]
    atomic_write_json(files.submission(master), {
        "job": master, "submitted": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "recipe": recipe,
        "runs": [{"run": _rel(it), "job": j} for it, j in zip(todo, ids)]})
    console.print(f"submitted Slurm job {master}: {count(len(todo), 'run')} "
                  f"({len(plan) - len(todo) - len(waiting)} finished); Slurm's logs in "
                  f"{escape(files.folder)}, each run's beside its folder (.log). "
                  f"`{escape(shlex.join(status_command))}` "
                  "shows where they are.", soft_wrap=True)
    return ids


# -- status ----------------------------------------------------------------------------------
QUEUED = ("PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "RESIZING",
          "SUSPENDED", "STOPPED")
RUNNING = ("RUNNING", "COMPLETING", "SIGNALING", "STAGE_OUT")


def squeue() -> dict[str, str] | None:
    """The caller's jobs in the queue, ``{"<job>_<task>" or "<job>": state}``, one entry per
    array task; None where there is no ``squeue``."""
    if shutil.which("squeue") is None:
        return None
    user = os.environ.get("USER") or _user()
    try:
        done = subprocess.run(["squeue", "-h", "-r", "-u", user, "-o", "%i|%T"],
                              capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    jobs = {}
    for line in done.stdout.splitlines():
        job, _, state = line.strip().partition("|")
        if job:
            jobs[job] = state
    return jobs


def _user() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def latest_jobs(plan: list[SweepItem]) -> dict[str, str]:
    """Each run's (folder relative to its runs root) most recently submitted task job id."""
    latest: dict[str, str] = {}
    for root in sorted({it.out for it in plan}, key=str):
        for path in SlurmFiles(root).submissions():
            try:
                doc = read_json(path)
                for entry in doc["runs"]:
                    latest[str(entry["run"])] = str(entry["job"])
            except (UserError, KeyError, TypeError):
                continue  # a damaged record says nothing; the run folders still do
    return latest


@dataclass
class RunStatus:
    item: SweepItem
    state: str  # finished | running | queued | interrupted | failed | missing | conflict
    job: str = ""
    detail: str = ""


def log_tail(path: Path, lines: int = 5) -> str:
    """The last non-empty lines of a log, joined with `` | ``."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 8192))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    kept = [line.strip() for line in text.splitlines() if line.strip()]
    return " | ".join(kept[-lines:])


def sweep_status(plan: list[SweepItem]) -> list[RunStatus]:
    """Where each run of a sweep stands, from its folder, the jobs submitted for it and the
    queue."""
    latest = latest_jobs(plan)
    queue = squeue() if latest else {}
    out = []
    for it in plan:
        files = RunFiles(it.run_dir)
        job = latest.get(_rel(it), "")
        in_queue = (queue or {}).get(job, "")
        if it.conflict:
            out.append(RunStatus(it, "conflict", job, "trained with another config: "
                                 + ", ".join(it.conflict)))
            continue
        if files.is_finished():
            out.append(RunStatus(it, "finished", job, "evaluated with other eval options: "
                                 + ", ".join(it.eval_differs) if it.eval_differs else ""))
            continue
        holder = lock_holder(it.run_dir)
        if in_queue in RUNNING or holder:
            out.append(RunStatus(it, "running", job if in_queue else "", holder or "starting"))
            continue
        if in_queue in QUEUED:
            out.append(RunStatus(it, "queued", job, in_queue.lower()))
            continue
        outcome = _outcome(SlurmFiles(it.out), job) if job else None
        if outcome and outcome.get("state") == "failed":
            out.append(RunStatus(it, "failed", job, f"exit {outcome.get('exit')}: "
                                 + log_tail(files.log)))
        elif files.last.exists():
            out.append(RunStatus(it, "interrupted", job, "resumes from last.pt"))
        elif files.log.exists():  # a start that failed before the first checkpoint
            out.append(RunStatus(it, "failed", job, log_tail(files.log)))
        elif job and not outcome and SlurmFiles(it.out).slurm_log(job).exists():
            out.append(RunStatus(it, "failed", job, "the job ended before training started: "
                                 + log_tail(SlurmFiles(it.out).slurm_log(job))))
        else:
            out.append(RunStatus(it, "missing", job, "its job ended before it ran" if job else ""))
    if latest and queue is None:
        for s in out:
            if s.state in ("interrupted", "failed", "missing") and s.job:
                s.detail = (s.detail + "; " if s.detail else "") + "no squeue here: queue unknown"
    return out


def _outcome(files: SlurmFiles, job: str) -> dict[str, Any] | None:
    path = files.outcome(job)
    if not path.exists():
        return None
    try:
        doc = read_json(path)
    except UserError:
        return None
    return doc if isinstance(doc, dict) else None


def print_status(statuses: list[RunStatus], out: Console, err: Console) -> None:
    """One line per run (a table on a terminal, TSV otherwise), then the counts."""
    from lstmablate.console import print_listing

    rows = [[_rel(s.item), s.state, s.job or "-", s.detail] for s in statuses]
    print_listing(("run", "status", "job", "detail"), rows, keep=("run", "status", "job"),
                  console=out)
    counts: dict[str, int] = {}
    for s in statuses:
        counts[s.state] = counts.get(s.state, 0) + 1
    order = ("finished", "running", "queued", "interrupted", "failed", "missing", "conflict")
    shown = ", ".join(f"{counts[k]} {k}" for k in order if k in counts)
    err.print(f"{count(len(statuses), 'run')}: {shown}", soft_wrap=True)
