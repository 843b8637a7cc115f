"""Sweeps: a recipe's ``cells`` x ``seeds`` as independent runs.

``plan_sweep`` lists every run with its directory, whether it is finished and
the exact ``lstmablate train`` command for it (what ``sweep --list`` prints,
for any cluster scheduler); ``run_sweep`` runs the unfinished ones one after
another, resuming interrupted runs and skipping finished ones, so running a
sweep twice is harmless.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from rich.console import Console

from lstmablate.recipes import grid_points, load_recipe, recipe_seeds, resolve_config
from lstmablate import io
from lstmablate.config import RunConfig
from lstmablate.console import count, escape
from lstmablate.errors import ConfigError, RunDirError, UserError
from lstmablate.limits import check_int, max_threads
from .runlock import lock_holder
from .record import saved_config_differences, saved_eval_differences
from .runs import RunFiles, check_out_dir, has_started


@dataclass
class SweepItem:
    recipe: str
    task: str
    experiment: str
    cell: str
    seed: int
    out: Path  # the runs root
    run_dir: Path  # its run folder under ``out``
    finished: bool
    started: bool
    overrides: list[str]
    threads: int | None
    device: str
    data_dir: str | None
    #: how the run already in ``run_dir`` differs from this item's config (empty: no conflict)
    conflict: list[str] = field(default_factory=list)
    #: a finished run's eval options that differ from this item's (not a conflict: the same
    #: training, but its final numbers are not this recipe's)
    eval_differs: list[str] = field(default_factory=list)
    #: the config it resolves to (as ``train`` resolves it)
    config: RunConfig | None = field(default=None, repr=False, compare=False)
    #: the run it was copied from by :func:`reuse_twins` (``<experiment>/<cell>/seed-<n>``)
    twin_of: str = ""

    @property
    def command(self) -> str:
        parts = ["lstmablate", "train", "--task", self.task, "--cell", self.cell, "--recipe",
                 self.recipe, "--seed", str(self.seed), "--out", str(self.out)]
        if self.experiment != self.recipe:
            parts += ["--experiment", self.experiment]
        for o in self.overrides:
            parts += ["--set", o]
        if self.threads:
            parts += ["--threads", str(self.threads)]
        if self.device != "cpu":
            parts += ["--device", self.device]
        if self.data_dir:
            parts += ["--data-dir", self.data_dir]
        if self.started:
            parts.append("--resume")
        return shlex.join(parts)

    @property
    def argv(self) -> list[str]:
        """:attr:`command` as this Python runs it (``python -m lstmablate train ...``)."""
        return [sys.executable, "-m", "lstmablate", *shlex.split(self.command)[1:]]


def plan_sweep(recipe: str, out: Path, *, overrides: list[str] | None = None, threads: int | None = None,
               device: str = "cpu", data_dir: str | None = None,
               refuse_conflicts: bool = True) -> list[SweepItem]:
    """Every run of a recipe (cells x seeds x grid points), or of each recipe of a table spec.

    Each run's config is resolved (and so checked) as ``train`` would resolve it; a run folder
    that already holds a run with another config (a different ``--set``, an edited recipe) is a
    conflict: the sweep refuses to start, naming each such folder and the keys that differ
    (with ``refuse_conflicts=False`` the items carry their conflicts, for ``--status``)."""
    from .runner import check_device_name, check_threads

    check_threads(threads)
    check_device_name(device)
    check_out_dir(out)
    items = _plan(recipe, out, overrides=overrides, threads=threads, device=device,
                  data_dir=data_dir)
    conflicts = [it for it in items if it.conflict]
    if conflicts and refuse_conflicts:
        shown = "; ".join(f"{it.run_dir} ({', '.join(it.conflict)})" for it in conflicts[:5])
        more = f"; and {len(conflicts) - 5} more" if len(conflicts) > 5 else ""
        raise RunDirError(
            f"{len(conflicts)} of the sweep's {len(items)} run folders already hold a run trained "
            f"with a different config (saved -> this sweep): {shown}{more}. Nothing was run. "
            "Give the sweep another --out directory for these settings, or run it with the "
            "settings those runs were trained with (or delete those run folders to train them "
            "again).")
    return items


def _plan(recipe: str, out: Path, *, overrides: list[str] | None, threads: int | None,
          device: str, data_dir: str | None) -> list[SweepItem]:
    from lstmablate.cells import get_cell
    from lstmablate.task import get_task

    name, r = load_recipe(recipe)
    if "task" not in r:  # a table spec: the sweeps of its experiments
        spec = r["table"]
        exps = list(spec.get("experiments") or [])
        exps += [e for e in spec.get("experiments_with_data") or [] if has_data(e, data_dir)]
        return [item for exp in exps
                for item in _plan(exp, out, overrides=overrides, threads=threads,
                                  device=device, data_dir=data_dir)]
    cells = r.get("cells") or []
    if not isinstance(cells, list) or not cells:
        raise ConfigError(f"recipe {r['_path']} has no `cells:` list, so it is not a sweep.")
    task_cls = get_task(r["task"])
    items = []
    for experiment, grid_overrides, _ in grid_points(name, r):
        for cell in cells:
            get_cell(str(cell))
            for seed in recipe_seeds(r, cell) or [1]:
                sets = grid_overrides + list(overrides or [])
                cfg = resolve_config(task_cls, str(cell), recipe=recipe, overrides=sets, seed=seed,
                                     experiment=experiment)  # checked as `train` checks it
                files = RunFiles.of(out, cfg.experiment, cfg.cell, cfg.seed)
                # (a folder whose start failed before training is simply started again)
                diff = saved_config_differences(files, cfg) if has_started(files) else []
                conflict = ["config.yaml is damaged"] if diff is None else diff
                finished = files.is_finished() and not conflict
                items.append(SweepItem(recipe, r["task"], experiment, str(cell), seed, Path(out),
                                       files.root, finished, files.config.exists(),
                                       sets, threads, device, data_dir, conflict,
                                       saved_eval_differences(files, cfg) if finished else [],
                                       cfg))
    return items


def has_data(recipe: str, data_dir: str | None) -> bool:
    """Every file of the datasets the recipe's task declares is in the data directory (a
    table spec's ``experiments_with_data`` are planned only then: data no user is expected to
    have, such as the 4 GB Billion Word benchmark)."""
    from lstmablate.data import find_file, resolve_data_dir
    from lstmablate.errors import DataError
    from lstmablate.task import get_task

    _, r = load_recipe(recipe)
    base = resolve_data_dir(data_dir)
    try:
        for ds in get_task(r["task"]).datasets:
            for f in ds.files:
                find_file(base, f.relpath)
    except DataError:
        return False
    return True


def reuse_twins(plan: list[SweepItem], roots: list[str | Path],
                console: Console | None = None) -> list[SweepItem]:
    """``sweep --reuse DIR``: into each run folder of ``plan`` that holds nothing yet, copy the
    finished run found under ``roots`` that is its twin — trained for another experiment with
    the same config (:mod:`lstmablate.run.twins`) — instead of training it.  Returns the plan
    with those runs finished (``twin_of`` naming the run copied); a folder another process is
    writing is left alone.  A root that is not a folder is a UserError before anything is
    copied."""
    from .twins import copy_twin, find_twin

    for root in roots:
        io.check_dir_path(root, "--reuse", RunDirError)
        if not str(root).strip() or not Path(root).is_dir():
            raise RunDirError(f"--reuse {shlex.quote(str(root))}: not a folder of runs (a runs tree, "
                              "<experiment>/<cell>/seed-<n>/, such as a sweep's --out or "
                              "experiments/results). Nothing was copied.")
    console = console or Console(stderr=True)
    out = []
    for it in plan:
        if it.finished or it.started or it.config is None or lock_holder(it.run_dir):
            out.append(it)
            continue
        target = RunFiles(it.run_dir)
        twin = find_twin(it.config, target, [Path(r) for r in roots])
        if twin is None:
            out.append(it)
            continue
        record = copy_twin(twin, target, it.config)
        what = ("the same run" if record.experiment == it.experiment else
                f"its twin: the same settings, trained as {record.run}")
        console.print(f"copied {escape(twin.root)} -> {escape(it.run_dir)} ({escape(what)})",
                      highlight=False, soft_wrap=True)
        out.append(replace(it, finished=True, started=True, twin_of=record.run))
    return out


class SweepInterrupted(UserError):
    """A sweep stopped before every run finished (Ctrl-C / SIGTERM); exit code 130."""

    exit_code = 130


def eval_differs_note(plan: list[SweepItem]) -> str:
    """One paragraph on the finished runs evaluated with other eval options than the sweep's
    (empty if none): kept as finished, but their final numbers are not this recipe's."""
    odd = [it for it in plan if it.finished and it.eval_differs]
    if not odd:
        return ""
    shown = "; ".join(f"{it.run_dir} ({', '.join(it.eval_differs)})" for it in odd[:5])
    more = f"; and {len(odd) - 5} more" if len(odd) > 5 else ""
    verb = "was" if len(odd) == 1 else "were"
    return (f"{count(len(odd), 'finished run')} {verb} evaluated with other eval options than this "
            f"sweep's (saved -> this sweep): {shown}{more}. They count as finished (the same "
            "training), but their final numbers are not this recipe's: re-evaluate one from its "
            "checkpoint with `lstmablate eval RUN --set eval.KEY=VALUE`, or remove its folder "
            "and run the sweep again to train and evaluate it anew.")


def run_status(item: SweepItem) -> str:
    """finished | interrupted | not started — read from the run directory, not an exit code."""
    files = RunFiles(item.run_dir)
    if files.is_finished():
        return "finished"
    return "interrupted" if files.last.exists() else "not started"


def claim(item: SweepItem, console: Console, busy: list[str]) -> SweepItem | None:
    """Just before a run starts: None if it finished since the plan was made, or if another
    process is training it now (its holder appended to ``busy``: the sweep leaves it alone
    rather than fail on its lock); else the item, marked to resume if it was started since."""
    files = RunFiles(item.run_dir)
    if files.is_finished():
        console.print(f"finished meanwhile (elsewhere): {escape(item.run_dir)}", highlight=False,
                      soft_wrap=True)
        return None
    holder = lock_holder(item.run_dir)
    if holder:
        busy.append(f"{item.run_dir} ({holder})")
        console.print(f"[yellow]left alone[/] {escape(item.run_dir)}: being trained by {holder}",
                      highlight=False, soft_wrap=True)
        return None
    return replace(item, started=files.config.exists())


def _report_busy(busy: list[str], console: Console) -> None:
    if busy:
        verb = "was" if len(busy) == 1 else "were"
        console.print(f"[yellow]{count(len(busy), 'run')} {verb} being trained by other processes "
                      "and left to them[/]: " + escape("; ".join(busy)) + ". Run the same sweep "
                      "command again after they end to check that every run finished.",
                      highlight=False, soft_wrap=True)


def check_jobs(jobs: int, option: str = "--jobs") -> int:
    """``--jobs``: between 1 and :func:`~lstmablate.limits.max_threads` runs at once (each is a
    training process with a thread at least; more than that only wait for the cores)."""
    return check_int(jobs, option, 1, max_threads(),
                     "(four per CPU core of this machine; 1 runs the runs one after another.)")


def check_sweep_data(todo: list[SweepItem]) -> None:
    """The data files every run of ``todo`` reads (its task's ``required_files`` for its
    config) are in its data directory, found as ``train`` finds them; else the DataError of
    the first missing one, before any run starts."""
    from lstmablate.data import find_file
    from lstmablate.errors import DataError
    from lstmablate.task import get_task

    from . import runner

    seen: set[tuple] = set()
    for it in todo:
        key = (it.recipe, it.task, it.experiment, tuple(it.overrides), it.data_dir)
        if key in seen:  # (the cells and seeds of one experiment read the same files)
            continue
        seen.add(key)
        cfg = resolve_config(get_task(it.task), it.cell, recipe=it.recipe, overrides=it.overrides,
                             seed=it.seed, experiment=it.experiment)
        data_path = runner.resolve_data_dir(it.data_dir)
        try:
            for relpath in runner.make_task(cfg, data_path, None).required_files():
                find_file(data_path, relpath)
        except DataError as e:
            raise DataError(f"the sweep's runs read data that is missing, so none was "
                            f"started: {e}") from None


def sweep_threads(todo: list[SweepItem], jobs: int = 1) -> tuple[list[SweepItem], str]:
    """``todo`` with the threads of each run left out (no ``--threads``) chosen once, for
    every run alike, by the rule of :func:`lstmablate.threads.choose_threads` (the cores less
    the machine's load) divided among the ``jobs``; and what was chosen, in words."""
    from lstmablate.threads import choose_threads

    chosen = choose_threads(None)
    if chosen.threads is None or all(it.threads for it in todo):  # (OMP_NUM_THREADS: torch's)
        return todo, ""
    per_job = max(1, chosen.threads // jobs)
    each = "each of the runs at once" if jobs > 1 else "each run"
    return ([it if it.threads else replace(it, threads=per_job) for it in todo],
            f"{per_job} thread(s) for {each} ({chosen.reason}; --threads N to choose)")


def run_sweep(plan: list[SweepItem], console: Console | None = None, jobs: int = 1) -> None:
    """Run the unfinished runs of ``plan``; raises SweepInterrupted (Ctrl-C) or UserError
    (failed runs), naming every run that did not finish.  A run that another process is
    training (its lock is held) is left to that process and named at the end.  The data of
    every run is checked first (:func:`check_sweep_data`), and the runs left without
    ``--threads`` get the same threads (:func:`sweep_threads`)."""
    from .runner import train_run

    console = console or Console(stderr=True)
    todo = [it for it in plan if not it.finished]
    check_sweep_data(todo)
    todo, threads_note = sweep_threads(todo, jobs)
    console.print(f"sweep: {len(plan)} runs, {len(plan) - len(todo)} finished, {len(todo)} to run"
                  + (f"; {threads_note}" if todo and threads_note else ""), soft_wrap=True)
    busy: list[str] = []
    if jobs > 1:
        try:
            _run_parallel(todo, console, jobs, busy)
        finally:
            _report_busy(busy, console)
        return
    for i, it in enumerate(todo, 1):
        it = claim(it, console, busy)
        if it is None:
            continue
        console.print(f"[bold]({i}/{len(todo)})[/] {escape(it.command)}", highlight=False,
                      soft_wrap=True)  # (one line: the command stays copyable from a log)
        outcome = train_run(it.task, it.cell, recipe=it.recipe, overrides=it.overrides, seed=it.seed,
                            experiment=it.experiment,
                            out=it.out, device=it.device, threads=it.threads,
                            resume=it.started, data_dir=it.data_dir, console=console)
        if outcome.interrupted:
            left = len(todo) - i
            raise SweepInterrupted(
                f"sweep interrupted: {it.run_dir} was interrupted (its progress is saved) and "
                f"{count(left, 'run')} {'was' if left == 1 else 'were'} not started. Run the same "
                "sweep command again to continue: finished runs are skipped, interrupted ones resumed.")
    _report_busy(busy, console)


def _run_parallel(todo: list[SweepItem], console: Console, jobs: int, busy: list[str]) -> None:
    """Up to ``jobs`` runs at once, each a ``lstmablate train`` subprocess logging to
    ``<run dir>.log`` (its threads: :func:`sweep_threads`; its OpenMP threads wait
    passively, :func:`lstmablate.threads.passive_waiting`).  A run's status is read from its
    directory when its process ends; Ctrl-C (or a run that was interrupted) stops the sweep
    from starting new runs."""
    from lstmablate.threads import passive_waiting

    env = passive_waiting(dict(os.environ))
    pending = list(todo)
    running: list[tuple[SweepItem, subprocess.Popen, object]] = []
    failed: list[SweepItem] = []
    interrupted: list[SweepItem] = []
    try:
        while pending or running:
            while pending and len(running) < jobs and not interrupted:
                it = claim(pending.pop(0), console, busy)
                if it is None:
                    continue
                log_path = RunFiles(it.run_dir).log
                log_path.parent.mkdir(parents=True, exist_ok=True)
                log = open(log_path, "a", encoding="utf-8")
                proc = subprocess.Popen(it.argv, stdout=log, stderr=subprocess.STDOUT, env=env)
                console.print(f"started {escape(it.run_dir)} (log {escape(log_path)})", highlight=False,
                              soft_wrap=True)
                running.append((it, proc, log))
            for entry in list(running):
                it, proc, log = entry
                if proc.poll() is None:
                    continue
                log.close()
                running.remove(entry)
                status = run_status(it)
                if status == "finished":
                    console.print(f"[green]finished[/] {escape(it.run_dir)}", highlight=False, soft_wrap=True)
                elif proc.returncode == 0:  # it saved its progress and stopped (a signal)
                    interrupted.append(it)
                    console.print(f"[yellow]interrupted[/] {escape(it.run_dir)}", highlight=False,
                                  soft_wrap=True)
                else:
                    failed.append(it)
                    console.print(f"[red]failed[/] {escape(it.run_dir)} "
                                  f"(exit {proc.returncode}; see its .log)",
                                  highlight=False, soft_wrap=True)
            if interrupted and not running:
                break
            time.sleep(0.2)
    except KeyboardInterrupt:  # the children got the same Ctrl-C and save their checkpoints
        for it, proc, log in running:
            proc.wait()
            log.close()
            if run_status(it) != "finished":
                interrupted.append(it)
    not_started = [it for it in pending if it not in interrupted]
    if interrupted:
        raise SweepInterrupted(
            f"sweep interrupted: {count(len(interrupted), 'run')} interrupted ("
            + ", ".join(str(it.run_dir) for it in interrupted) + f"), {len(not_started)} not "
            "started" + (f", {len(failed)} failed" if failed else "") + ". Run the same sweep "
            "command again to continue: finished runs are skipped, interrupted ones resumed.")
    if failed:
        raise UserError(f"{len(failed)} of {len(todo)} runs failed: "
                        + ", ".join(str(it.run_dir) for it in failed) + ". Their logs are beside them.")
