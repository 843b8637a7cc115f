"""A GPU window in one command: minutes of a GPU machine turned into a measured table and
paper-scale runs (``make gpu-window``; docs/design/gpu-checks.md, "GPU window").

    python -m lstmablate.bench.window prepare [--wheels "sacremoses conllu"] [--data-dir DIR]
    python -m lstmablate.bench.window run --minutes 9 --then 4 --out DIR [--device cuda]
    python -m lstmablate.bench.window watch --minutes 4 --out DIR
    python -m lstmablate.bench.window land DIR/gpu-window.tar.gz [--into experiments/results]

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

``land`` (here, with the archive that came back): writes its finished runs' records into
``experiments/results`` (:mod:`.window_land`: checked first, nothing replaced without
``--force``).

The runs live in ``.gpuwindow/local`` (not carried, so the second command finds them on the
machine).  Only the standard library and the package's bottom floor are imported before the
install step; the project's modules are imported after it.  This module is the command (its
options, the two calls, gpu-check within its budget); its parts are :mod:`.window_carry`
(the wheels and data carried, the install), :mod:`.window_plan` (which runs fit),
:mod:`.window_runs` (the runs started and watched), :mod:`.window_archive` (what comes back),
:mod:`.window_land` (its runs landed as records) and :mod:`.window_files` (the plan, the
state and the window's folder).

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
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from lstmablate import io
from lstmablate.errors import UserError, exit_status

from .gpu_args import MAX_BUDGET, ROOT, Parser, caller_path, check_device, check_seconds, child_env, \
    output_folder
from .gpu_check import STAGE_NAMES, paper_cells
from .gpu_record import read_rows
from .gpu_steps import fastest
from .window_archive import ARCHIVE, SUMMARY, collect
from .window_carry import DEFAULT_WHEELS, DEVICE_PLATFORMS, DEVICE_PYTHON, check_travel, copy_data, \
    download_wheels, install, install_env
from .window_files import (FOLDER, Run, WindowError, as_dicts, carried_data, carried_wheels, check_dir, now,
                           read_state, runs_of, save_state, say, state_path, work_dir)
from .window_land import land
from .window_plan import checked_names, load_plan, plan_runs
from .window_runs import start_runs, watch_until

#: the part of a call kept for its last collection
MARGIN_S = 30.0
#: gpu-check's stages in a window, in order, with their shares (seconds of a 365 s check):
#: what the window needs first -- the correctness of the fast paths, the cell benchmark, the
#: training steps it plans with -- then the rest as time allows.  The paths, cells and models
#: stages time the paper's cells only (``--check-cell``; gpu-check alone times every cell)
CHECK_STAGES = (("environment", 10), ("paths-fp32", 45), ("cells-fp32", 42), ("cells-tf32", 33),
                ("steps", 90), ("step-capture", 60), ("paths-bf16", 20), ("profile", 35),
                ("tests", 60), ("models", 30))
#: timed steps per cell in the window's steps stage (gpu-check's default is 20)
CHECK_STEP_REPEATS = 10
#: the train.step_capture modes the window's step-capture stage times: not ``compile``,
#: whose compilation of a paper-size step takes longer than the stage's share of a window
#: (one cell's NMT step on an H200: more than a minute, unfinished); gpu-check alone times
#: all three
CHECK_CAPTURE_MODES = ("off", "graphs")


def prepare(args: argparse.Namespace) -> int:
    base = args.folder
    plan = checked_names(load_plan(args.plan), args.plan)
    wheels = download_wheels(args.wheels.split(), carried_wheels(base), args.python,
                             tuple(args.platform) or DEVICE_PLATFORMS)
    data = copy_data(plan, args.data_dir, carried_data(base))
    size = sum(p.stat().st_size for p in [*wheels, *data]) / 2**20
    say(f"{len(wheels)} wheels in {carried_wheels(base)}, {len(data)} data files in "
        f"{carried_data(base)}: {size:.1f} MiB to carry")
    carry = [str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)
             for p in (carried_wheels(base), carried_data(base))]
    print(f"carry: {json.dumps(carry)}")
    say(check_travel(ROOT, [carried_wheels(base), carried_data(base)]))
    return 0


def _check(args: argparse.Namespace, base: Path, env: dict[str, str], plan: list[list[dict]],
           budget: float) -> dict:
    """gpu-check within ``budget`` seconds, its stages in :data:`CHECK_STAGES`' order, its
    steps stage timing the plan's recipes; returns its exit status, files and stages."""
    checks = check_dir(base)
    for old in checks.glob("gpu-check-*"):  # one record per window
        old.unlink()
    cmd = [sys.executable, "-m", "lstmablate.bench.gpu_check", "--out", str(checks),
           "--budget", f"{budget:.0f}", "--device", args.device]
    shares = dict(CHECK_STAGES)
    for name in args.check_stage or list(shares):
        cmd += ["--only", name, "--stage-seconds", f"{name}={shares.get(name, 30)}"]
    for cell in args.check_cell or paper_cells():  # the paths, cells and models stages'
        cmd += ["--cell", cell]
    cmd += ["--step-repeats", str(CHECK_STEP_REPEATS)]
    for recipe in dict.fromkeys(g["recipe"] for slot in plan for g in slot):
        cmd += ["--step-recipe", recipe]
    groups = [g for slot in plan for g in slot]
    if all(g.get("cells") for g in groups):  # only the cells the plan trains are timed
        for cell in dict.fromkeys(c for g in groups for c in g["cells"]):
            cmd += ["--step-cell", cell]
    for mode in CHECK_CAPTURE_MODES:
        cmd += ["--capture-mode", mode]
    data = carried_data(base)
    if data.is_dir():
        cmd += ["--data-dir", str(data)]
    cmd += args.check_arg
    say(f"gpu-check, {budget:.0f} s: {' '.join(cmd[2:])}")
    try:  # (in the caller's directory: the paths of --check-arg are the caller's)
        r = subprocess.run(cmd, cwd=os.getcwd(), env=child_env(env), timeout=budget + 60)
        code = r.returncode
    except subprocess.TimeoutExpired:
        code = "timeout"
    record = sorted(checks.glob("gpu-check-*.json"))
    try:
        doc = io.read_json(record[-1], WindowError) if record else {}
        rows = read_rows(record[-1].with_suffix(".jsonl")) if record else []
    except UserError as err:  # (gpu-check's own files: damaged only by a kill mid-write)
        say(f"gpu-check's record cannot be read: {err}")
        doc, rows = {}, []
    doc = doc if isinstance(doc, dict) else {}
    return dict(exit=code, files=record[-1].stem if record else None,
                stages=doc.get("stages", {}), gpu=(doc.get("environment") or {}).get("gpu"),
                steps=fastest([r for r in rows if r.get("kind") == "step"], rows))


def finish(state: dict, runs: list[Run], base: Path, out: Path, deadline: float) -> int:
    """A command's end: the runs watched until they end or ``deadline``, the last collection."""
    watch_until(state, runs, base, out, deadline)
    state["calls"][-1]["ended"] = now()
    save_state(state, state_path(base))
    collect(state, base, out)
    say(f"wrote {out / ARCHIVE} and {out / SUMMARY}")
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
    return checked_names(plan, args.plan)


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
    state: dict[str, Any] = dict(created=now(), device=args.device, calls=[dict(
        mode="run", started=now(), minutes=args.minutes, then=args.then)], runs=[],
        not_started=[])
    if not args.no_install:
        state["install"] = install(base, env)
        say(f"installed: {', '.join(state['install']['installed']) or 'nothing needed'}; "
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
        say(f"not started: {note['group']}: {note['reason']}")
    start_runs(runs, base, args.device, env)
    state["runs"] = as_dicts(runs)
    save_state(state, state_path(base))
    return finish(state, runs, base, out, deadline)


def watch_window(args: argparse.Namespace) -> int:
    base, out = args.folder, args.out
    deadline = time.time() + args.minutes * 60 - MARGIN_S
    path = state_path(base)
    if not os.path.lexists(path):
        raise WindowError(f"no window on this machine ({path} is missing): the machine that ran "
                          "`make gpu-window` was given back (a fresh one starts bare), so its "
                          "runs are gone; the records the first command brought back are all "
                          "there is.")
    state = read_state(path)  # (checked: the window acts only on processes it started)
    install_env(base, os.environ)
    state["calls"].append(dict(mode="watch", started=now(), minutes=args.minutes))
    return finish(state, runs_of(state), base, out, deadline)


def default_check_budget(minutes: float) -> float:
    """gpu-check's seconds in a window of ``minutes``: 4 minutes of 9 or more, else 45% of
    them."""
    return min(240.0, 0.45 * minutes * 60)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The options, each checked for its range (a UserError: one paragraph and exit 2);
    ``--folder``, ``--out`` and ``--data-dir`` made absolute against the caller's directory,
    the two folders refused where they name a file, a device or a folder in a run folder."""
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
    q = sub.add_parser("land", help="write the finished runs of an archive that came back into "
                       "the records folder")
    q.add_argument("archive", help=f"the window's {ARCHIVE}, or the folder holding it")
    q.add_argument("--into", default=str(ROOT / "experiments" / "results"),
                   help="the records folder (default: %(default)s)")
    q.add_argument("--force", action="store_true",
                   help="replace the records of runs already there")
    args = ap.parse_args(argv)
    if args.mode == "land":
        archive = caller_path(args.archive, "archive")
        args.archive = archive / ARCHIVE if archive.is_dir() else archive
        args.into = output_folder(args.into, "--into")
        return args
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
    """``prepare``, ``run``, ``watch`` or ``land``, with the command line's contract: a refusal is one
    paragraph and exit 2 (:func:`lstmablate.errors.exit_status`)."""
    def body() -> int:
        args = parse_args(argv)
        if args.mode == "land":
            landed = land(args.archive, args.into, args.force)
            say(f"runs landed in {args.into}: {len(landed)}; regenerate the pages that read them "
                "(`make pages`)")
            return 0
        return {"prepare": prepare, "run": run_window, "watch": watch_window}[args.mode](args)

    return exit_status("gpu-window", body)


if __name__ == "__main__":
    raise SystemExit(main())
