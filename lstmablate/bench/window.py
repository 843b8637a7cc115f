"""A GPU window in one command: minutes of a GPU machine turned into a measured table and
paper-scale runs (``make gpu-window``; docs/performance.md, "GPU window").

    python -m lstmablate.bench.window prepare [--wheels "sacremoses conllu"] [--data-dir DIR]
    python -m lstmablate.bench.window run --minutes 9 --then 4 --out DIR [--device cuda]
    python -m lstmablate.bench.window watch --minutes 4 --out DIR

It is made for a GPU machine reached through commands of a few minutes each, which can reach
no package index, returns only the files of one output folder (a few files of a few MB),
and is given back soon after a command ends (detached processes die with it):

``prepare`` (here, with a network): downloads the wheels the GPU machine lacks for its
Python and platform into ``.gpuwindow/wheels`` and copies the data the runs read into
``.gpuwindow/data`` -- the two folders (git-ignored) that travel with the checkout.

``run`` (on the GPU machine; ``--minutes``: the command's length): installs from the carried
wheels what is missing (into ``.gpuwindow/local/site``) and the checkout itself if it is not
installed; runs ``gpu-check`` within its budget (``--check-budget``); plans from the
training steps it measured which paper-scale runs finish in the minutes left (this
command's and the ``--then`` minutes of the watch command that follows at once) and starts
them detached; then watches them, and writes into ``--out`` every minute and before its
time is up one archive of every run's small records (``gpu-window.tar.gz``), a summary
(``gpu-window.md``) and gpu-check's record.

``watch`` (the next command, at once): watches the same runs until they end or its time is
up, and writes the same files again.

The runs live in ``.gpuwindow/local`` (not carried, so the second command finds them on the
machine).  Only the standard library and the package's bottom floor are imported before the
install step; the project's modules are imported after it.

The command line's contract holds here too: a refusal -- a plan or a state file that is not
what the window reads (:mod:`.window_files`), an option out of its range (``--minutes``,
``--then``, ``--check-budget``, ``--device``), ``--out`` or ``--folder`` naming a file, a
device or a folder inside a run folder, ``run`` with ``--device cuda`` on a machine without
CUDA -- is one paragraph and exit 2, before anything is installed or started; a window that
ran exits 0 (gpu-check's outcome is in its summary).  Relative paths are the caller's,
resolved against the directory it runs in.  Every file is written through
:mod:`lstmablate.io` (the archive, the summary and the state replaced atomically).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import re
import site as python_site
import subprocess
import sys
import sysconfig
import tarfile
import time
from dataclasses import asdict
from importlib import metadata
from pathlib import Path
from typing import Any

from lstmablate import io
from lstmablate.errors import UserError, exit_status

from .gpu_args import MAX_BUDGET, Parser, caller_path, check_device, check_seconds, child_env, \
    output_folder
from .gpu_check import paper_cells
from .gpu_record import read_rows
from .gpu_steps import fastest
from .window_files import (FINAL_S, PLAN_SHAPE, START_S, Run, WindowError,  # noqa: F401
                           check_plan, check_plan_names, read_state, save_state)
from .window_files import load_plan as _load_plan

ROOT = Path(__file__).resolve().parents[2]
#: the window's folder in the checkout (git-ignored); its wheels/ and data/ travel with the
#: checkout, its local/ stays on the GPU machine
FOLDER = ".gpuwindow"
#: the GPU machine's Python and platform, for ``pip download`` (what the wheels are built for)
DEVICE_PYTHON = "3.12"
DEVICE_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
                    "manylinux2014_x86_64", "manylinux1_x86_64")
#: what ``prepare`` downloads by default: the project's dependencies that the GPU machine's
#: image lacks (the tasks of the window's runs need sacremoses; conllu is the parser's)
DEFAULT_WHEELS = ("sacremoses", "conllu")

#: a margin on every estimate (evaluation spread, logging, checkpoints)
SAFETY = 1.15
#: the part of a call kept for its last collection
MARGIN_S = 30.0
POLL_S = 15.0
COLLECT_EVERY_S = 60.0
#: the end of each run's log that the archive keeps
LOG_TAIL_BYTES = 256 * 1024
#: the most of one record file the archive keeps (a run's records are KBs; gpu-check's, MBs)
MAX_RECORD_BYTES = 64 * 2**20
#: gpu-check's stages in a window, in order, with their shares (seconds of a 365 s check):
#: what the window needs first -- the correctness of the fast paths, the cell benchmark, the
#: training steps it plans with -- then the rest as time allows.  The paths, cells and models
#: stages time the paper's cells only (``--check-cell``; gpu-check alone times every cell)
CHECK_STAGES = (("environment", 10), ("paths-fp32", 45), ("cells-fp32", 42), ("cells-tf32", 33),
                ("steps", 90), ("step-capture", 60), ("paths-bf16", 20), ("profile", 35),
                ("tests", 60), ("models", 30))
#: the runs of a window, in order of priority: each slot takes the first of its alternatives
#: that fits beside what the slots before it took (Table 4's five cells at once; then
#: -GATES's learning rate on PTB-medium, full runs only, else Table 1 medium's five cells
#: for as many epochs as fit, marked shortened)
DEFAULT_PLAN: list[list[dict[str, Any]]] = [
    [dict(name="table4", recipe="nmt-multi30k", shorten=True)],
    [dict(name="gates-lr", recipe="ptb-medium", cells=["lstm-gates"], lrs=[0.1, 0.2, 0.3]),
     dict(name="table1-medium", recipe="ptb-medium", shorten=True)],
]
#: timed steps per cell in the window's steps stage (gpu-check's default is 20)
CHECK_STEP_REPEATS = 10
ARCHIVE = "gpu-window.tar.gz"
SUMMARY = "gpu-window.md"
STATE = "window.json"


def work_dir(base: Path) -> Path:
    """Where a window keeps its runs, gpu-check's record, its state and the installed wheels
    (``base``: the window's folder, :data:`FOLDER`): not carried, so on the GPU machine the
    second command finds what the first left."""
    return base / "local"


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S")


def _say(text: str) -> None:
    print(f"[window {time.strftime('%H:%M:%S')}] {text}", flush=True)


# ---------------------------------------------------------------------------------
# prepare (on a machine with a network)
# ---------------------------------------------------------------------------------

def download_wheels(names: list[str], dest: Path, python: str = DEVICE_PYTHON,
                    platforms: tuple[str, ...] = DEVICE_PLATFORMS) -> list[Path]:
    """``pip download`` of ``names`` and what they need, as wheels for the GPU machine's
    Python and platform, into ``dest``; a distribution installed here is taken at the version
    installed here (the one this checkout is tested with: e.g. the NMT task's tokeniser)."""
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("*.whl"):  # one version of each (two would stop the install)
        old.unlink()
    if not names:
        return []
    names = [f"{n}=={metadata.version(n)}" if _installed(n) else n for n in names]
    cmd = [sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--python-version",
           python, "--implementation", "cp", *[a for p in platforms for a in ("--platform", p)],
           "-d", str(dest), *names]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise WindowError(f"`pip download` of {' '.join(names)} failed:\n{r.stderr[-2000:]}\n"
                          "Check the names and the network, or give --platform for another "
                          "manylinux tag.")
    return sorted(dest.glob("*.whl"))


def copy_data(plan: list[list[dict]], data_dir: str | None, dest: Path) -> list[Path]:
    """The files the plan's recipes read (each task's ``required_files``), copied from the
    data directory into ``dest`` under the same relative paths (compressed as they are)."""
    from lstmablate.data import find_file, resolve_data_dir
    from lstmablate.recipes import load_recipe, resolve_config
    from lstmablate.run.runner import make_task
    from lstmablate.task import get_task

    source = resolve_data_dir(data_dir)
    copied = []
    for recipe in dict.fromkeys(g["recipe"] for slot in plan for g in slot):
        spec = load_recipe(recipe)[1]
        cfg = resolve_config(get_task(str(spec["task"])), list(spec["cells"])[0], recipe=recipe)
        for rel in make_task(cfg, source, None).required_files():
            src = find_file(source, rel)  # a DataError names the file and how to get it
            target = dest / src.relative_to(source)
            io.atomic_write(target, lambda f, src=src: _copy_regular(src, f))
            copied.append(target)
    return copied


def _copy_regular(src: Path, out: Any) -> None:
    """The bytes of the regular file ``src`` into ``out`` (a FIFO or a device is refused)."""
    fd = io.open_regular(src, WindowError)
    with os.fdopen(fd, "rb") as f:
        while chunk := f.read(1 << 20):
            out.write(chunk)


def prepare(args: argparse.Namespace) -> int:
    base = args.folder
    plan = check_plan_names(load_plan(args.plan), args.plan or "DEFAULT_PLAN", _resolve)
    wheels = download_wheels(args.wheels.split(), base / "wheels", args.python,
                             tuple(args.platform) or DEVICE_PLATFORMS)
    data = copy_data(plan, args.data_dir, base / "data")
    size = sum(p.stat().st_size for p in [*wheels, *data]) / 2**20
    _say(f"{len(wheels)} wheels in {base / 'wheels'}, {len(data)} data files in "
         f"{base / 'data'}: {size:.1f} MiB to carry")
    carry = [str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)
             for p in (base / "wheels", base / "data")]
    print(f"carry: {json.dumps(carry)}")
    return 0


# ---------------------------------------------------------------------------------
# install (on the GPU machine, before anything of the project is imported)
# ---------------------------------------------------------------------------------

def _installed(name: str) -> bool:
    try:
        metadata.version(name)
        return True
    except metadata.PackageNotFoundError:
        return False


def wheel_distribution(path: Path) -> str:
    """The distribution a wheel file holds (its name's first part, normalised)."""
    return re.sub(r"[-_.]+", "-", path.name.split("-")[0]).lower()


def project_dependencies() -> list[str]:
    """The distributions pyproject.toml's ``dependencies`` name (without versions)."""
    try:
        import tomllib
    except ImportError:  # Python 3.10: nothing to report
        return []
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return [re.match(r"[A-Za-z0-9_.-]+", d).group(0) for d in deps]


def install(base: Path, env: dict[str, str]) -> dict[str, Any]:
    """Install what is missing: every carried wheel whose distribution is not installed
    (``pip install --no-index --no-deps --target .gpuwindow/local/site``), then the checkout
    (``pip install --no-deps --no-build-isolation -e .``) where it is not installed.  ``env``
    (and this process's ``sys.path``) gets the site folder.  Returns
    what was installed and what is still missing."""
    site = work_dir(base) / "site"
    site.mkdir(parents=True, exist_ok=True)
    install_env(base, env)
    wheels = sorted((base / "wheels").glob("*.whl"))
    todo = [w for w in wheels if not _installed(wheel_distribution(w))]
    report: dict[str, Any] = dict(site=str(site), installed=[w.name for w in todo])
    if todo:
        _pip(["install", "-q", "--no-index", "--no-deps", "--no-compile", "--target", str(site),
              *map(str, todo)], env, "the carried wheels")
        importlib.invalidate_caches()
    # (``lstmablate_tasks`` exists only installed: the checkout names its folder tasks/)
    if importlib.util.find_spec("lstmablate_tasks") is None:
        try:
            _pip(["install", "-q", "--no-deps", "--no-build-isolation", "-e", str(ROOT)], env,
                 "the checkout")
            report["project"] = "installed (pip install --no-deps -e .)"
        except WindowError as err:  # e.g. a setuptools too old for an editable install
            _say(f"{err}\ninstalling it as a package instead")
            _pip(["install", "-q", "--no-deps", "--no-build-isolation", str(ROOT)], env,
                 "the checkout")
            report["project"] = "installed (pip install --no-deps .)"
        # this process sees it too (an editable install hooks in through a .pth file, which
        # Python reads at start-up): the plan reads the recipes from the installed package
        python_site.addsitedir(sysconfig.get_paths()["purelib"])
        importlib.invalidate_caches()
        if importlib.util.find_spec("lstmablate_tasks") is None:
            raise WindowError("the checkout was installed, but this Python does not see it yet: "
                              "run the same command again")
    importlib.invalidate_caches()  # (what the installs added, for the checks below)
    report["missing"] = [d for d in project_dependencies() if not _installed(d)]
    return report


def _pip(args: list[str], env: dict[str, str], what: str) -> None:
    r = subprocess.run([sys.executable, "-m", "pip", *args], env=env, capture_output=True,
                       text=True)
    if r.returncode != 0:
        raise WindowError(f"installing {what} failed (pip {' '.join(args[:2])}):\n"
                          f"{r.stderr[-2000:]}")


# ---------------------------------------------------------------------------------
# the plan: which runs fit
# ---------------------------------------------------------------------------------

def load_plan(path: str | None) -> list[list[dict]]:
    """The window's slots (:data:`DEFAULT_PLAN`, or a JSON file of the same shape), read and
    checked by :func:`.window_files.load_plan`."""
    return _load_plan(path, DEFAULT_PLAN)


def _resolve(path: str) -> str:
    """A path of the caller's (a recipe file of the plan), absolute."""
    return str(caller_path(path, "a recipe of the plan"))


def group_runs(group: dict, step_rows: dict[tuple[str, str], dict]) -> list[Run] | str:
    """The runs of one group, each with the speed measured for its recipe and cell; or why
    it cannot be planned (no measured step)."""
    from lstmablate.recipes import load_recipe

    name, spec = load_recipe(group["recipe"])
    cells = group.get("cells") or list(spec["cells"])
    experiment = group.get("experiment") or str(spec.get("experiment") or name)
    measured = [r for (recipe, _), r in step_rows.items() if recipe == name]
    if not measured:
        return f"no training step of {name} was measured (gpu-check's steps stage)"
    runs = []
    for cell in cells:
        row = step_rows.get((name, cell))
        if row is None:  # not timed (the stage's deadline): planned at the slowest step timed
            slowest = max(measured, key=lambda r: r["ms"])
            row = step_rows[(name, cell)] = dict(slowest, cell=cell, timed_as=slowest["cell"])
        for lr in group.get("lrs") or [None]:
            sets = list(group.get("sets", []))
            if row.get("step_capture"):  # the faster mode measured (gpu_steps.fastest)
                sets.append(f"train.step_capture={row['step_capture']}")
            exp = experiment
            if lr is not None:
                sets.append(f"train.lr={lr}")
                exp = f"{experiment}-{cell}-lr{lr:g}"
            runs.append(Run(group=group["name"], recipe=group["recipe"], recipe_name=name,
                            task=row["task"], timed_as=row.get("timed_as"),
                            cell=cell, seed=int(group.get("seed", 1)), experiment=exp, sets=sets,
                            epochs=row["epochs"], full_epochs=row["epochs"],
                            steps_per_epoch=row["steps_per_epoch"], estimate_s=0.0,
                            start_s=float(group.get("start_s", START_S)),
                            final_s=float(group.get("final_s", FINAL_S))))
    return runs


def _share(row: dict) -> float:
    """The part of a step's wall time its GPU work takes (1 where it was not measured)."""
    return min(1.0, row["gpu_ms"] / row["ms"]) if row.get("gpu_ms") else 1.0


def estimate(run: Run, row: dict, slowdown: float, epochs: int | None = None) -> float:
    """Seconds a run of ``epochs`` (default its own) takes when the GPU is shared so that every
    step takes ``slowdown`` times as long as alone: its start (``start_s``: :data:`START_S`
    unless the plan's group says otherwise), reading the data, its steps, one dev evaluation
    per epoch, its final evaluation (``final_s``: :data:`FINAL_S`); times :data:`SAFETY`."""
    epochs = run.epochs if epochs is None else epochs
    steps = min(epochs * run.steps_per_epoch, row["run_steps"])
    busy = steps * row["ms"] / 1e3 + epochs * row["eval_s"]
    return SAFETY * (run.start_s + row["setup_s"] + busy * slowdown + run.final_s)


def plan_runs(plan: list[list[dict]], step_rows: list[dict], seconds: float
              ) -> tuple[list[Run], list[dict]]:
    """The runs that finish within ``seconds`` when started together, slot by slot
    (:data:`DEFAULT_PLAN`), and a note for each group not started.

    Concurrent runs share the GPU: each step takes ``max(1, sum of the runs' GPU shares)``
    times as long as alone (a step's GPU share: the time the profiler saw the GPU busy,
    over the step's wall time; a CPU row counts as 1).  A group that fits whole is taken
    whole; a group with ``shorten`` that does not is taken for as many epochs as fit
    (``train.max_steps``, so its result.json says ``shortened``); a group is never taken if
    it would make a run taken before it miss the end."""
    rows = {(r["recipe"], r["cell"]): r for r in step_rows}
    chosen: list[Run] = []
    skipped: list[dict] = []

    def row_of(run: Run) -> dict:
        return rows[(run.recipe_name, run.cell)]

    for slot in plan:
        for group in slot:
            runs = group_runs(group, rows)
            if isinstance(runs, str):
                skipped.append(dict(group=group["name"], reason=runs))
                continue
            together = chosen + runs
            slowdown = max(1.0, sum(_share(row_of(r)) for r in together))
            if any(estimate(r, row_of(r), slowdown) > seconds for r in chosen):
                skipped.append(dict(group=group["name"], reason=(
                    f"beside the runs already planned, they would no longer finish in "
                    f"{seconds / 60:.1f} min")))
                continue
            fits = True
            for r in runs:
                row = row_of(r)
                if estimate(r, row, slowdown) <= seconds:
                    continue
                epochs = max((e for e in range(1, r.full_epochs + 1)
                              if estimate(r, row, slowdown, e) <= seconds), default=0)
                if not group.get("shorten") or epochs == 0:
                    fits = False
                    need = estimate(r, row, slowdown) / 60
                    skipped.append(dict(group=group["name"], reason=(
                        f"{r.cell} needs about {need:.1f} min (with {len(together)} runs "
                        f"sharing the GPU), {seconds / 60:.1f} min are left"
                        + ("" if not group.get("shorten") else "; not one epoch fits"))))
                    break
                r.epochs, r.shortened = epochs, True
                r.sets = [*r.sets, f"train.max_steps={epochs * r.steps_per_epoch}"]
            if not fits:
                continue
            for r in runs:
                r.estimate_s = round(estimate(r, row_of(r), slowdown), 1)
            chosen = together
            break
    for r in chosen:  # the final slowdown, with every run chosen
        slowdown = max(1.0, sum(_share(row_of(x)) for x in chosen))
        r.estimate_s = round(estimate(r, row_of(r), slowdown), 1)
    return chosen, skipped


# ---------------------------------------------------------------------------------
# starting and watching the runs
# ---------------------------------------------------------------------------------

def start_runs(runs: list[Run], base: Path, device: str, env: dict[str, str]) -> None:
    """Start every run detached (a session of its own: it outlives this command), its output
    in ``<run folder>.log``."""
    from lstmablate.run.runs import RunFiles

    data = base / "data"
    threads = max(1, min(4, (os.cpu_count() or 1) // max(len(runs), 1)))
    for run in runs:
        files = RunFiles.of(work_dir(base) / "runs", run.experiment, run.cell, run.seed)
        files.log.parent.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "lstmablate", "train", "--task", run.task, "--recipe",
               run.recipe, "--cell", run.cell, "--seed", str(run.seed), "--device", device,
               "--out", str(work_dir(base) / "runs"), "--experiment", run.experiment,
               "--threads", str(threads), "--log-interval", "15", "--force",
               *(["--data-dir", str(data)] if data.is_dir() else []),
               *[a for s in run.sets for a in ("--set", s)]]
        with open(files.log, "w", encoding="utf-8") as log:  # (the run's own output)
            proc = subprocess.Popen(cmd, cwd=os.getcwd(), env=child_env(env), stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        run.pid, run.command, run.state = proc.pid, cmd, "running"
        run.started, run.started_at = _now(), time.time()
        _CHILDREN[proc.pid] = proc
        _say(f"started {run.key} (pid {proc.pid}, {run.epochs} epochs"
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


def _tail(path: Path, n: int) -> bytes:
    """The end of a log (nothing if it is missing or not a regular file: never waited on)."""
    try:
        return io.read_tail(path, n, WindowError)
    except UserError:
        return b""


def update(run: Run, base: Path) -> None:
    """The run's state from its folder, its log and its process: ``finished`` (its
    result.json is written), ``running``, ``stopped`` (the process ended without a result:
    its log says why)."""
    from lstmablate.run.runs import RunFiles

    files = RunFiles.of(work_dir(base) / "runs", run.experiment, run.cell, run.seed)
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
    text = _tail(files.log, 64 * 1024).decode("utf-8", errors="replace")
    found = _PROGRESS.findall(text)
    if found:
        epoch, batch, batches, step, loss, tps = found[-1]
        run.progress.update(epoch=int(epoch), batch=int(batch), batches=int(batches),
                            step=int(step), train_loss=loss, tokens_per_s=int(tps.replace(",", "")))
    try:
        lines = read_rows(files.metrics)
    except UserError as err:  # (a FIFO, a file too big: named, never waited on)
        lines, run.progress["problem"] = [], str(err)
    if lines:
        last = lines[-1]
        run.progress.update(evaluations=len(lines), last_eval=last)
    if run.state == "stopped":
        run.progress["log_end"] = text.strip().splitlines()[-3:] if text.strip() else []


# ---------------------------------------------------------------------------------
# collecting
# ---------------------------------------------------------------------------------

def collect(state: dict, base: Path, out: Path) -> Path:
    """One archive in ``out`` of what the window has: its state and summary, gpu-check's
    record, and each started run's small records (config, env, metrics, result, scores, the
    end of its log) -- never a checkpoint; and beside it the summary and gpu-check's
    ``.md`` and ``.json``.  Written by the output rule (:func:`lstmablate.io.atomic_write`:
    a rename), so an interrupted collection leaves the previous archive."""
    from lstmablate.run.runs import RunFiles

    out.mkdir(parents=True, exist_ok=True)
    work = work_dir(base)
    summary_text = summary(state)

    def archive(f: Any) -> None:
        with tarfile.open(fileobj=f, mode="w:gz") as tar:
            def add_bytes(name: str, data: bytes) -> None:
                info = tarfile.TarInfo(name)
                info.size, info.mtime = len(data), int(time.time())
                tar.addfile(info, fileobj=_BytesReader(data))

            def add_file(path: Path, name: str) -> None:  # (regular files only: read bounded)
                try:
                    add_bytes(name, io.read_tail(path, MAX_RECORD_BYTES, WindowError))
                except UserError:
                    pass

            add_bytes(STATE, json.dumps(state, indent=2).encode())
            add_bytes(SUMMARY, summary_text.encode())
            for f in sorted((work / "check").glob("gpu-check-*")):
                add_file(f, f"check/{f.name}")
            for run in state["runs"]:
                if run["state"] == "planned":
                    continue
                files = RunFiles.of(work / "runs", run["experiment"], run["cell"], run["seed"])
                base = f"runs/{run['experiment']}/{run['cell']}/seed-{run['seed']}"
                for path in (files.config, files.env, files.metrics, files.result):
                    if path.is_file():
                        add_file(path, f"{base}/{path.name}")
                scores = files.root / RunFiles.SCORES
                if scores.is_dir():
                    for path in sorted(scores.glob("*.jsonl")):
                        add_file(path, f"{base}/{RunFiles.SCORES}/{path.name}")
                add_bytes(f"{base}.log", _tail(files.log, LOG_TAIL_BYTES))

    io.atomic_write(out / ARCHIVE, archive)
    io.atomic_write_text(out / SUMMARY, summary_text)
    for f in (work / "check").glob("gpu-check-*"):
        if f.suffix in (".md", ".json"):
            io.atomic_write_text(out / f.name, io.read_text(f, error=WindowError))
    return out / ARCHIVE


class _BytesReader:
    """A file-like reader of bytes (tarfile reads members from one)."""

    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def read(self, n: int = -1) -> bytes:
        end = len(self.data) if n < 0 else self.pos + n
        chunk, self.pos = self.data[self.pos:end], min(end, len(self.data))
        return chunk


def summary(state: dict) -> str:
    """The window as Markdown: its calls, gpu-check's stages, every run's state and what was
    not started."""
    lines = [f"# GPU window: {state.get('gpu', '?')}", ""]
    for call in state["calls"]:
        lines.append(f"* {call['mode']} at {call['started']}: {call['minutes']:g} min"
                     + (f", ended {call['ended']}" if call.get("ended") else ""))
    check = state.get("check") or {}
    if check:
        lines += ["", f"gpu-check: exit {check.get('exit')} ({check.get('files', '')})", ""]
        stages = check.get("stages") or {}
        if stages:
            lines += ["| stage | status | note |", "|---|---|---|"]
            lines += [f"| {n} | {s.get('status')} | "
                      f"{'; '.join(x for x in (s.get('summary'), s.get('reason')) if x)} |"
                      for n, s in stages.items()]
    install_report = state.get("install")
    if install_report:
        lines += ["", f"installed: {', '.join(install_report.get('installed', [])) or 'nothing'}"
                  f"; still missing: {', '.join(install_report.get('missing', [])) or 'nothing'}"]
    lines += ["", "| run | planned | estimate | state | progress | last evaluation | test |",
              "|---|---|---|---|---|---|---|"]
    for run in state["runs"]:
        p = run.get("progress", {})
        done = (f"step {p['step']} (epoch {p['epoch']}, {p.get('tokens_per_s', 0):,} tokens/s)"
                if "step" in p else "")
        last = p.get("last_eval") or {}
        shown = ", ".join(f"{k} {v:.4g}" for k, v in last.items()
                          if isinstance(v, float) and k not in ("lr", "train_loss"))
        test = ", ".join(f"{k} {v:.4g}" for k, v in (p.get("test") or {}).items()
                         if isinstance(v, float))
        planned = f"{run['epochs']} epochs" + (" (shortened)" if run["shortened"] else "")
        lines.append(f"| {run['experiment']}/{run['cell']}/seed-{run['seed']} | {planned} | "
                     f"{run['estimate_s'] / 60:.1f} min | {run['state']} | {done} | "
                     f"{('epoch ' + str(last.get('epoch')) + ': ' + shown) if last else ''} | "
                     f"{test} |")
    for note in state.get("not_started", []):
        lines.append(f"\nnot started: {note['group']}: {note['reason']}")
    lines += ["", f"Records: {ARCHIVE} (runs/<experiment>/<cell>/seed-N/: config.yaml, env.json, "
              "metrics.jsonl, result.json, scores/, and the end of each run's log; check/: "
              "gpu-check's record). A run without result.json did not finish in the window: "
              "its metrics.jsonl says how far it got."]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------
# run and watch
# ---------------------------------------------------------------------------------

def _state_path(base: Path) -> Path:
    return work_dir(base) / STATE


def _save(state: dict, base: Path) -> None:
    save_state(state, _state_path(base))


def watch_until(state: dict, runs: list[Run], base: Path, out: Path, deadline: float) -> None:
    """Every :data:`POLL_S` seconds, each run's state; every :data:`COLLECT_EVERY_S` seconds
    a collection; until every run has ended or ``deadline`` (then a last collection)."""
    last_collect = 0.0
    while True:
        for run in runs:
            update(run, base)
        state["runs"] = [asdict(r) for r in runs]
        _save(state, base)
        running = [r for r in runs if r.state == "running"]
        if time.time() - last_collect >= COLLECT_EVERY_S or not running:
            collect(state, base, out)
            last_collect = time.time()
            for r in runs:
                p = r.progress
                _say(f"{r.key}: {r.state}" + (f", step {p['step']}" if "step" in p else "")
                     + (f", epoch {p['last_eval'].get('epoch')} evaluated" if "last_eval" in p
                        else ""))
        if not running or time.time() + POLL_S >= deadline:
            break
        time.sleep(POLL_S)


def _check(args: argparse.Namespace, base: Path, env: dict[str, str], plan: list[list[dict]],
           budget: float) -> dict:
    """gpu-check within ``budget`` seconds, its stages in :data:`CHECK_STAGES`' order, its
    steps stage timing the plan's recipes; returns its exit status, files and stages."""
    check_dir = work_dir(base) / "check"
    for old in check_dir.glob("gpu-check-*"):  # one record per window
        old.unlink()
    cmd = [sys.executable, "-m", "lstmablate.bench.gpu_check", "--out", str(check_dir),
           "--budget", f"{budget:.0f}", "--device", args.device]
    shares = dict(CHECK_STAGES)
    for name in args.check_stage or list(shares):
        cmd += ["--only", name, "--stage-seconds", f"{name}={shares.get(name, 30)}"]
    for cell in args.check_cell or paper_cells():  # the paths, cells and models stages'
        cmd += ["--cell", cell]
    cmd += ["--step-repeats", str(CHECK_STEP_REPEATS)]
    for recipe in dict.fromkeys(g["recipe"] for slot in plan for g in slot):
        cmd += ["--step-recipe", recipe]
    data = base / "data"
    if data.is_dir():
        cmd += ["--data-dir", str(data)]
    cmd += args.check_arg
    _say(f"gpu-check, {budget:.0f} s: {' '.join(cmd[2:])}")
    try:  # (in the caller's directory: the paths of --check-arg are the caller's)
        r = subprocess.run(cmd, cwd=os.getcwd(), env=child_env(env), timeout=budget + 60)
        code = r.returncode
    except subprocess.TimeoutExpired:
        code = "timeout"
    record = sorted(check_dir.glob("gpu-check-*.json"))
    try:
        doc = io.read_json(record[-1], WindowError) if record else {}
        rows = read_rows(record[-1].with_suffix(".jsonl")) if record else []
    except UserError as err:  # (gpu-check's own files: damaged only by a kill mid-write)
        _say(f"gpu-check's record cannot be read: {err}")
        doc, rows = {}, []
    doc = doc if isinstance(doc, dict) else {}
    return dict(exit=code, files=record[-1].stem if record else None,
                stages=doc.get("stages", {}), gpu=(doc.get("environment") or {}).get("gpu"),
                steps=fastest([r for r in rows if r.get("kind") == "step"], rows))


def finish(state: dict, runs: list[Run], base: Path, out: Path, deadline: float) -> int:
    """A command's end: the runs watched until they end or ``deadline``, the last collection."""
    watch_until(state, runs, base, out, deadline)
    state["calls"][-1]["ended"] = _now()
    _save(state, base)
    collect(state, base, out)
    _say(f"wrote {out / ARCHIVE} and {out / SUMMARY}")
    return 0


def check_cuda(device: str) -> None:
    """A WindowError, before anything is installed or started, where ``device`` is a GPU this
    machine does not have (``make gpu-window`` without a GPU: nothing to do)."""
    if not device.startswith("cuda"):
        return
    try:
        import torch
    except ImportError:
        raise WindowError("PyTorch is not installed here, so no GPU can be used; install "
                          "PyTorch with CUDA (the window carries only the project's other "
                          "packages).") from None
    if not torch.cuda.is_available():
        raise WindowError(f"--device {device}: no CUDA device here (torch.cuda.is_available() is "
                          "False), so there is nothing to measure or run; run the window on a "
                          "machine with a GPU (--device cpu is a dry run of the whole window).")
    if device.startswith("cuda:") and int(device[5:]) >= torch.cuda.device_count():
        raise WindowError(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA "
                          "device(s), numbered from 0.")


def check_names(args: argparse.Namespace, plan: list[list[dict]]) -> list[list[dict]]:
    """The plan's names (:func:`.window_files.check_plan_names`) and ``--check-cell``'s, once
    the project's packages are importable."""
    from lstmablate.cells import get_cell

    for cell in args.check_cell:
        if not cell.startswith("nn."):
            try:
                get_cell(cell)
            except UserError as err:
                raise WindowError(f"--check-cell: {err}") from None
    return check_plan_names(plan, args.plan or "DEFAULT_PLAN", _resolve)


def run_window(args: argparse.Namespace) -> int:
    base, out = args.folder, args.out
    start = time.time()
    deadline = start + args.minutes * 60 - MARGIN_S
    plan = load_plan(args.plan)  # (its shape, before anything is installed)
    check_cuda(args.device)
    work_dir(base).mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    if args.device.startswith("cuda"):
        env.pop("TRITON_INTERPRET", None)
    state: dict[str, Any] = dict(created=_now(), device=args.device, calls=[dict(
        mode="run", started=_now(), minutes=args.minutes, then=args.then)], runs=[],
        not_started=[])
    if not args.no_install:
        state["install"] = install(base, env)
        _say(f"installed: {', '.join(state['install']['installed']) or 'nothing needed'}; "
             f"missing: {', '.join(state['install']['missing']) or 'nothing'}")
    else:
        install_env(base, env)
    plan = check_names(args, plan)  # (its recipes and cells: the project's modules read them)
    budget = args.check_budget or default_check_budget(args.minutes)
    check = _check(args, base, env, plan, budget)
    state["check"] = {k: v for k, v in check.items() if k != "steps"}
    state["gpu"] = check.get("gpu") or args.device
    # the runs may go on until the watch command's last collection (the gap between the two
    # commands, when they run on too, is not counted: a margin)
    horizon = deadline - time.time() + args.then * 60
    runs, skipped = plan_runs(plan, check["steps"], horizon)
    state["not_started"] = skipped
    state["horizon_s"] = round(horizon, 1)
    for note in skipped:
        _say(f"not started: {note['group']}: {note['reason']}")
    start_runs(runs, base, args.device, env)
    state["runs"] = [asdict(r) for r in runs]
    _save(state, base)
    return finish(state, runs, base, out, deadline)


def watch_window(args: argparse.Namespace) -> int:
    base, out = args.folder, args.out
    deadline = time.time() + args.minutes * 60 - MARGIN_S
    path = _state_path(base)
    if not os.path.lexists(path):
        raise WindowError(f"no window on this machine ({path} is missing): the machine that ran "
                          "`make gpu-window` was given back (a fresh one starts bare), so its "
                          "runs are gone; the records the first command brought back are all "
                          "there is.")
    state = read_state(path)  # (checked: the window acts only on processes it started)
    install_env(base, os.environ)
    state["calls"].append(dict(mode="watch", started=_now(), minutes=args.minutes))
    return finish(state, [Run(**r) for r in state["runs"]], base, out, deadline)


def install_env(base: Path, env: Any) -> None:
    """The site folder of an earlier install on ``sys.path`` and in ``env``'s PYTHONPATH."""
    site = work_dir(base) / "site"
    if site.is_dir():
        if str(site) not in sys.path:
            sys.path.insert(0, str(site))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH")) if p)


def default_check_budget(minutes: float) -> float:
    """gpu-check's seconds in a window of ``minutes``: 4 minutes of 9 or more, else 45% of
    them."""
    return min(240.0, 0.45 * minutes * 60)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The options, each checked for its range (a UserError: one paragraph and exit 2);
    ``--folder``, ``--out`` and ``--data-dir`` made absolute against the caller's directory,
    the two folders refused where they name a file, a device or a folder in a run folder."""
    from .gpu_check import STAGE_NAMES

    ap = Parser(prog="gpu-window", description=__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="mode", required=True)
    p = sub.add_parser("prepare", help="download the wheels and copy the data to carry")
    p.add_argument("--wheels", default=" ".join(DEFAULT_WHEELS),
                   help="distributions to download (space-separated; default: %(default)s)")
    p.add_argument("--python", default=DEVICE_PYTHON, help="the GPU machine's Python version")
    p.add_argument("--platform", action="append", default=[],
                   help="a platform tag of the GPU machine (repeatable; default: manylinux x86-64)")
    p.add_argument("--data-dir", default=None, help="where the data is (default: $LSTMABLATE_DATA)")
    for name, helptext in (("run", "install, check, start the runs, watch and collect"),
                           ("watch", "watch the runs a `run` started, and collect")):
        q = sub.add_parser(name, help=helptext)
        q.add_argument("--minutes", type=float, required=True,
                       help="this command's length, 1 to 600: it ends about 30 s before")
        q.add_argument("--out", required=True, help="the folder whose files come back")
        if name == "run":
            q.add_argument("--then", type=float, default=0.0,
                           help="minutes, 0 to 600, of the `watch` command that follows at once "
                                "(the runs planned may end in it)")
            q.add_argument("--device", default="cuda", help="cuda, cuda:N, or cpu (a dry run)")
            q.add_argument("--check-budget", type=float, default=None,
                           help="gpu-check's seconds, less than the window's (default: 240, or "
                                "45%% of a shorter window)")
            q.add_argument("--check-stage", action="append", default=[],
                           help="a gpu-check stage to run (repeatable, in order; default: "
                                + ", ".join(n for n, _ in CHECK_STAGES) + ")")
            q.add_argument("--check-cell", action="append", default=[],
                           help="a cell of gpu-check's paths, cells and models stages "
                                "(repeatable; default: the ptb-medium recipe's cells)")
            q.add_argument("--check-arg", action="append", default=[],
                           help="an argument passed on to gpu-check (repeatable)")
            q.add_argument("--no-install", action="store_true",
                           help="install nothing (the machine has what the project needs)")
    for q in sub.choices.values():
        q.add_argument("--plan", default=None, help="a JSON plan (default: DEFAULT_PLAN)")
        q.add_argument("--folder", default=str(ROOT / FOLDER),
                       help="the window's folder (default: %(default)s)")
    args = ap.parse_args(argv)
    if args.mode != "prepare":
        check_seconds(args.minutes, "--minutes", 1.0, 600.0, low_open=False)
        args.out = output_folder(args.out)
    if args.mode == "run":
        check_seconds(args.then, "--then", 0.0, 600.0, low_open=False)
        check_device(args.device)
        if args.check_budget is not None:
            check_seconds(args.check_budget, "--check-budget", 0.0,
                          min(MAX_BUDGET, args.minutes * 60 - MARGIN_S))
        for stage in args.check_stage:
            if stage not in STAGE_NAMES:
                ap.error(f"--check-stage {stage[:40]!r}: expected one of "
                         f"{', '.join(STAGE_NAMES)}")
    if args.mode == "prepare" and args.data_dir is not None:
        args.data_dir = str(caller_path(args.data_dir, "--data-dir"))
    args.folder = output_folder(args.folder, "--folder")
    if args.plan is not None:
        args.plan = str(caller_path(args.plan, "--plan"))
    return args


def main(argv: list[str] | None = None) -> int:
    """``prepare``, ``run`` or ``watch``, with the command line's contract: a refusal is one
    paragraph and exit 2 (:func:`lstmablate.errors.exit_status`)."""
    def body() -> int:
        args = parse_args(argv)
        return {"prepare": prepare, "run": run_window, "watch": watch_window}[args.mode](args)

    return exit_status("gpu-window", body)


if __name__ == "__main__":
    raise SystemExit(main())
