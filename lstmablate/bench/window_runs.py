"""A GPU window's runs (:mod:`.window`): started detached (:func:`start_runs`: each outlives the
command that started it), each one's state read from its folder, its log and its process
(:func:`update`), and watched until they end or the command's time is up, collected every
minute (:func:`watch_until`).  Only the standard library and the package's bottom floor are
imported at start-up.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from lstmablate import io
from lstmablate.errors import UserError

from .gpu_args import child_env
from .gpu_record import read_rows
from .window_archive import collect
from .window_files import (Run, WindowError, as_dicts, carried_data, log_tail, now, runs_dir, save_state,
                           say, state_path)

#: seconds between two looks at the runs, and between two collections
POLL_S = 15.0
COLLECT_EVERY_S = 60.0


def _from_here(path: Path, cwd: Path) -> str:
    """``path`` as the runs' command line gives it: relative to the folder they start in where
    it lies inside it (the window's folder in the checkout, by default), so that the records
    that come back (``env.json``'s command) name no folder of the GPU machine's."""
    path = Path(os.path.abspath(path))
    return str(path.relative_to(cwd)) if path.is_relative_to(cwd) else str(path)


def start_runs(runs: list[Run], base: Path, device: str, env: dict[str, str]) -> None:
    """Start every run detached (a session of its own: it outlives this command), its output
    in ``<run folder>.log``; ``--out`` and ``--data-dir`` relative to the folder they start in
    (:func:`_from_here`)."""
    from lstmablate.run.runs import RunFiles

    cwd = Path(os.path.abspath(os.getcwd()))
    data = carried_data(base)
    threads = max(1, min(4, (os.cpu_count() or 1) // max(len(runs), 1)))
    for run in runs:
        files = RunFiles.of(runs_dir(base), run.experiment, run.cell, run.seed)
        files.log.parent.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "lstmablate", "train", "--task", run.task, "--recipe",
               run.recipe, "--cell", run.cell, "--seed", str(run.seed), "--device", device,
               "--out", _from_here(runs_dir(base), cwd), "--experiment", run.experiment,
               "--threads", str(threads), "--log-interval", "15", "--force",
               *(["--data-dir", _from_here(data, cwd)] if data.is_dir() else []),
               *[a for s in run.sets for a in ("--set", s)]]
        with open(files.log, "w", encoding="utf-8") as log:  # (the run's own output)
            proc = subprocess.Popen(cmd, cwd=cwd, env=child_env(env), stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        run.pid, run.command, run.state = proc.pid, cmd, "running"
        run.started, run.started_at = now(), time.time()
        _CHILDREN[proc.pid] = proc
        say(f"started {run.key} (pid {proc.pid}, {run.epochs} epochs"
            + (", shortened" if run.shortened else "") + f", about {run.estimate_s / 60:.1f} min)")


#: the runs this process started (so it can reap them); a later command sees only their pids
_CHILDREN: dict[int, subprocess.Popen] = {}

_PROGRESS = re.compile(r"epoch (\d+) batch (\d+)/(\d+) step (\d+): train loss (\S+)\s+"
                       r"([\d,]+) tokens/s")


def _alive(pid: int | None) -> bool:
    if pid is None:
        return False
    proc = _CHILDREN.get(pid)
    if proc is not None:
        return proc.poll() is None
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:  # a pid the system gave to another program since
        return b"lstmablate" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True


def update(run: Run, base: Path) -> None:
    """The run's state from its folder, its log and its process: ``finished`` (its
    result.json is written), ``running``, ``stopped`` (the process ended without a result:
    its log says why)."""
    from lstmablate.run.runs import RunFiles

    files = RunFiles.of(runs_dir(base), run.experiment, run.cell, run.seed)
    if run.state == "planned":
        return
    if files.result.is_file():
        run.state = "finished"
        try:
            result = io.read_json(files.result, WindowError)
        except UserError as err:
            result, run.progress["problem"] = {}, str(err)
        if isinstance(result, dict):
            run.progress.update(steps=result.get("steps"), test=result.get("test"),
                                shortened=result.get("shortened"),
                                train_time_s=result.get("train_time_s"))
    else:
        run.state = "running" if _alive(run.pid) else "stopped"
    text = log_tail(files.log, 64 * 1024).decode("utf-8", errors="replace")
    found = _PROGRESS.findall(text)
    if found:
        epoch, batch, batches, step, loss, tps = found[-1]
        run.progress.update(epoch=int(epoch), batch=int(batch), batches=int(batches),
                            step=int(step), train_loss=loss, tokens_per_s=int(tps.replace(",", "")))
    if "step" in run.progress and isinstance(run.progress.get("steps"), int):
        run.progress["step"] = run.progress["steps"]  # finished: the log's last line came earlier
    try:
        lines = read_rows(files.metrics)
    except UserError as err:  # (a FIFO, a file too big: named, never waited on)
        lines, run.progress["problem"] = [], str(err)
    if lines:
        last = lines[-1]
        run.progress.update(evaluations=len(lines), last_eval=last)
    if run.state == "stopped":
        run.progress["log_end"] = text.strip().splitlines()[-3:] if text.strip() else []


def watch_until(state: dict, runs: list[Run], base: Path, out: Path, deadline: float) -> None:
    """Every :data:`POLL_S` seconds, each run's state; every :data:`COLLECT_EVERY_S` seconds
    a collection; until every run has ended or ``deadline`` (then a last collection)."""
    last_collect = 0.0
    while True:
        for run in runs:
            update(run, base)
        state["runs"] = as_dicts(runs)
        save_state(state, state_path(base))
        running = [r for r in runs if r.state == "running"]
        if time.time() - last_collect >= COLLECT_EVERY_S or not running:
            collect(state, base, out)
            last_collect = time.time()
            for r in runs:
                p = r.progress
                say(f"{r.key}: {r.state}" + (f", step {p['step']}" if "step" in p else "")
                    + (f", epoch {p['last_eval'].get('epoch')} evaluated" if "last_eval" in p
                       else ""))
        if not running or time.time() + POLL_S >= deadline:
            break
        time.sleep(POLL_S)
