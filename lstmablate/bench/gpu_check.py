"""One command for a short GPU window: check the GPU paths, then measure them
(``make gpu-check``).

    python -m lstmablate.bench.gpu_check [--out DIR] [--budget SECONDS] [--device cuda]
        [--only STAGE]... [--skip STAGE]... [--shape SHAPE]... [--cell CELL]...
        [--step-recipe RECIPE]... [--data-dir DIR] [--task TASK] [--recipe RECIPE]

Stages, in this order (:data:`STAGES`; ``--only`` picks some, in the order given):

``environment``  versions, the GPU, PyTorch's float32 precision flags, Triton's toolchain;
``tests``        ``tests/gpu/`` under pytest (the Triton kernels compiled for this GPU);
``paths-fp32``   every fast path of the paper's cells against the float64 reference at the
                 paper's shapes (ptb-650, ptb-1500, parser-400, nmt-500), float32;
``paths-bf16``   the same under bfloat16 autocast;
``cells-fp32``   the cell benchmark against cuDNN, both sides strict float32;
``cells-tf32``   the same with TF32 allowed on both sides;
``steps``        training steps of the PTB-medium and NMT recipes on their data, per cell
                 (what ``make gpu-window`` plans its runs with);
``models``       the PTB-medium and -small training-step benchmark against ``nn.LSTM``;
``profile``      a ``torch.profiler`` kernel table of ``nn.LSTM``, ``lstm``, ``nn.RNN``,
                 ``lstm-gates``, ``lstm-srnn`` and ``lstm-srnn-hidden`` at ptb-650;
``trainer``      (only with ``--only trainer``) 200 steps per cell through ``lstmablate train``
                 (the recipe's cells, or those of ``--cell`` it trains).

Each stage has a budget: its share of ``--budget`` (default 480 s, 8 minutes) among the
stages still to run, of the time left, so what one stage leaves unused goes to the next.
Every stage runs in a process of its own (:mod:`.gpu_stages`), which starts no unit of work
after its deadline and is ended :data:`GRACE` seconds after it.  Under ``--out`` (default
``benchmarks/results``) it writes its record (:mod:`.gpu_record`), named
``gpu-check-<gpu>-<date>``:

* ``.jsonl``: one line per measured row, the moment it is measured, and one per stage as it
  ends (its status, reason and seconds) -- a window that closes mid-stage keeps every row
  measured so far;
* ``.json``: the whole record (environment, stages, rows, the targets of docs/performance.md
  with the measured ratio and whether each is met), rewritten after every stage;
* ``.md``: the same as Markdown tables, rewritten after every stage;
* ``.log``: every stage's output.

Exit status: 0 when every stage ran and passed; 1 when the check ran and a stage could not
run, ran out of its budget or failed (the last line names each, with the reason) -- 1 is
only ever that outcome; 2 when the command refuses to start, with one paragraph saying why
(``--device cuda`` on a machine without CUDA, an option out of its range, ``--out`` naming a
file, a device or a folder inside a run folder, an unknown recipe, task or cell, a file the
system refuses to write).  A CUDA-only stage (``tests``, ``cells-tf32``) on another device
records "skipped: no CUDA".  Relative paths (``--out``, ``--data-dir``, a recipe given as a
file) are the caller's, resolved against the directory it runs in.  Every file is written
through :mod:`lstmablate.io` (the record's ``.json`` and ``.md`` replaced atomically, its
rows appended and fsync'd).

This module imports only the standard library and the package's bottom floor
(:mod:`lstmablate.io`, :mod:`lstmablate.errors`, :mod:`lstmablate.runfolder`, which need
nothing else) at start-up, and PyTorch in ``main`` to ask for CUDA: it starts on a bare
machine with PyTorch and the checkout installed by ``pip install --no-deps -e .``, and a
stage whose packages are missing (pytest, or numpy, PyYAML and rich, which the library
imports) is recorded as not run, naming them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from importlib import metadata
from pathlib import Path

from lstmablate import io
from lstmablate.errors import UserError, exit_status

from .gpu_args import MAX_BUDGET, MAX_REPEATS, Parser, caller_path, check_device, check_seconds, \
    child_env, output_folder
from .gpu_record import Check, read_rows
from .gpu_steps import MODES as CAPTURE_MODES

ROOT = Path(__file__).resolve().parents[2]  # the checkout (tests/gpu, benchmarks/results)
DEFAULT_OUT = ROOT / "benchmarks" / "results"
DEFAULT_BUDGET = 480.0  # seconds: 8 minutes
GRACE = 10.0  # seconds a stage's process may run past its deadline before it is ended
STAGE_MODULE = "lstmablate.bench.gpu_stages"  # what runs the Python stages
RESERVE = 0.04  # of the budget, kept for starting processes and writing the files
TRAIN_STEPS = 200  # the trainer stage's measured steps per cell (the difference of two runs)
WARM_STEPS = 20  # the shorter run's steps
#: the trainer stage's recipe (``--recipe``; its task is the recipe's unless ``--task`` says
#: otherwise): PTB-medium, whose training step the model benchmark also times
#: (``ptb-medium-model``)
RECIPE = "ptb-medium"
#: the distributions lstmablate's library modules import besides PyTorch
LIBRARY = ("numpy", "pyyaml", "rich")


@dataclass(frozen=True)
class StageSpec:
    """A stage: its name, its share of :data:`DEFAULT_BUDGET` in seconds, the distributions
    it needs, whether it needs CUDA, and whether it runs by default."""

    name: str
    seconds: float
    needs: tuple[str, ...] = LIBRARY
    cuda_only: bool = False
    default: bool = True


STAGES: tuple[StageSpec, ...] = (
    StageSpec("environment", 10, needs=()),
    StageSpec("tests", 110, needs=("pytest", *LIBRARY), cuda_only=True),
    StageSpec("paths-fp32", 45),
    StageSpec("paths-bf16", 25),
    StageSpec("cells-fp32", 60),
    StageSpec("cells-tf32", 45, cuda_only=True),
    StageSpec("steps", 70),
    StageSpec("models", 45),
    StageSpec("profile", 40),
    # (only when asked for: train.step_capture's modes per task, the peers' packages)
    StageSpec("step-capture", 90, default=False),  # lstmablate/bench/gpu_steps.py
    StageSpec("peers", 30, default=False),  # lstmablate/bench/peers.py
    StageSpec("trainer", 150, needs=("typer", *LIBRARY), default=False),
)
STAGE_NAMES = tuple(s.name for s in STAGES)
#: the statuses that make the exit non-zero (``skipped`` is only ever asked for: ``--skip``)
NOT_PASSED = ("failed", "partial", "not-run")


def _missing(*distributions: str) -> list[str]:
    """The distributions of these names that are not installed."""
    out = []
    for name in distributions:
        try:
            metadata.version(name)
        except metadata.PackageNotFoundError:
            out.append(name)
    return out


def _tail(text: str, n: int = 4000) -> str:
    return text[-n:]


# ---------------------------------------------------------------------------------
# the stages run from here (the others: lstmablate.bench.gpu_stages)
# ---------------------------------------------------------------------------------

def run_tests(device: str, budget: float) -> tuple[dict, list[dict]]:
    """tests/gpu/ under pytest (a subprocess: the Triton kernels compiled, not interpreted)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["LSTMABLATE_GPU_DEVICE"] = device
    cmd = [sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider",
           str(ROOT / "tests" / "gpu")]
    try:
        r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=max(budget, 1.0))
    except subprocess.TimeoutExpired as err:
        out = err.stdout.decode(errors="replace") if isinstance(err.stdout, bytes) else (
            err.stdout or "")
        return (dict(status="partial", reason=f"over its budget of {budget:.0f} s"),
                [dict(kind="tests", summary="(ended at its deadline)", output=_tail(out))])
    lines = (r.stdout or "").strip().splitlines()
    summary = lines[-1].strip("= ") if lines else ""
    failures = [ln for ln in lines if ln.startswith(("FAILED", "ERROR"))]
    row = dict(kind="tests", summary=summary, failures=failures,
               output=_tail(r.stdout + r.stderr))
    if r.returncode == 0:
        return dict(status="done", summary=summary), [row]
    if r.returncode == 5:
        return dict(status="not-run", reason="pytest collected no tests"), [row]
    return dict(status="failed", reason=summary or f"pytest exited {r.returncode}",
                summary=summary), [row]


def paper_cells(recipe: str = RECIPE) -> list[str]:
    """The cells the recipe trains (its ``cells``)."""
    from lstmablate.recipes import load_recipe

    return list(load_recipe(recipe)[1]["cells"])


def recipe_task(recipe: str = RECIPE) -> str:
    """The task the recipe trains (its ``task``)."""
    from lstmablate.recipes import load_recipe

    return str(load_recipe(recipe)[1]["task"])


def tokens_per_step(task: str, recipe: str, cell: str) -> int:
    """Tokens of one training step of ``cell`` under the recipe: its ``data.batch_size`` x
    ``data.num_steps`` (a ValueError for a task whose data has no such options)."""
    from lstmablate.recipes import resolve_config
    from lstmablate.task import get_task

    data = resolve_config(get_task(task), cell, recipe=recipe).data
    if not (hasattr(data, "batch_size") and hasattr(data, "num_steps")):
        raise ValueError(f"the {task} task's data has no batch_size and num_steps, so the "
                         "tokens of a training step are not known here")
    return int(data.batch_size) * int(data.num_steps)


def _train_time(cell: str, steps: int, device: str, out: Path, data_dir: str,
                timeout: float, task: str | None = None, recipe: str = RECIPE) -> float:
    task = task or recipe_task(recipe)
    cmd = [sys.executable, "-m", "lstmablate", "train", "--task", task, "--recipe",
           recipe, "--cell", cell, "--seed", "1", "--device", device, "--out", str(out),
           "--force", "--experiment", f"gpu-check-{steps}", "--data-dir", data_dir,
           "--set", f"train.max_steps={steps}", "--set", "train.eval_test=false"]
    r = subprocess.run(cmd, cwd=os.getcwd(), env=child_env(), capture_output=True, text=True,
                       timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd[2:])}` failed:\n{_tail(r.stderr, 2000)}")
    from lstmablate.run.record import Run
    from lstmablate.run.runs import RunFiles

    result = Run.open(RunFiles.of(out, f"gpu-check-{steps}", cell, 1).root).result
    if result is None:
        raise RuntimeError(f"no {RunFiles.RESULT} for {cell} ({steps} steps) under {out}")
    if result.steps != steps:
        raise RuntimeError(f"{cell}: the run stopped after {result.steps} of {steps} steps")
    return float(result.train_time_s)


def run_trainer(device: str, budget: float, task: str | None = None,
                recipe: str = RECIPE, cells: list[str] | None = None,
                data_dir: str | None = None) -> tuple[dict, list[dict]]:
    """Per cell of ``recipe`` (of ``task``; only those in ``cells`` when it is given, as
    ``--cell`` gives it), on the data in ``data_dir`` (``--data-dir``; default
    ``$LSTMABLATE_DATA``, else ./data): tokens/s of TRAIN_STEPS steps through ``lstmablate
    train`` (the difference of a run of WARM_STEPS + TRAIN_STEPS steps and one of
    WARM_STEPS); no run is started after ``budget`` seconds."""
    task = task or recipe_task(recipe)
    trained = [c for c in paper_cells(recipe) if not cells or c in cells]
    if not trained:
        return dict(status="not-run", reason=f"none of the cells asked for ({', '.join(cells)}) "
                    f"is trained by the {recipe} recipe"), []
    data_dir = data_dir or os.environ.get("LSTMABLATE_DATA", str(ROOT / "data"))
    from lstmablate.data import find_file
    from lstmablate.errors import DataError, UserError
    from lstmablate.task import get_task

    try:  # the files the recipe's task reads (the task plugin owns their names)
        for ds in get_task(task).datasets:
            for f in ds.files:
                find_file(data_dir, f.relpath)
    except DataError:
        return dict(status="not-run",
                    reason=f"no {task} data under {data_dir} (--data-dir, or set "
                    "LSTMABLATE_DATA)"), []
    rows, errors, start = [], [], time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpu-check-runs-") as tmp:
        for cell in trained:
            left = budget - (time.perf_counter() - start)
            if left <= 0:
                errors.append(f"{cell}: not run (over the {budget:.0f} s left)")
                continue
            try:
                tokens = tokens_per_step(task, recipe, cell)
                short = _train_time(cell, WARM_STEPS, device, Path(tmp), data_dir, left, task,
                                    recipe)
                long = _train_time(cell, WARM_STEPS + TRAIN_STEPS, device, Path(tmp), data_dir,
                                   max(budget - (time.perf_counter() - start), 30.0), task,
                                   recipe)
            except (RuntimeError, ValueError, UserError, subprocess.TimeoutExpired) as err:
                errors.append(f"{cell}: {err}")
                continue
            seconds = max(long - short, 1e-9)
            rows.append(dict(kind="trainer", shape=f"{recipe}-trainer", cell=cell, device=device,
                             steps=TRAIN_STEPS, seconds=round(seconds, 3),
                             tokens_per_s=TRAIN_STEPS * tokens / seconds))
            print(f"trainer {cell}: {rows[-1]['tokens_per_s']:,.0f} tokens/s", flush=True)
    status = "done" if not errors else "partial" if rows else "not-run"
    return dict(status=status, reason="; ".join(errors) or None), rows


# ---------------------------------------------------------------------------------
# the Python stages, each in a process of its own (lstmablate.bench.gpu_stages)
# ---------------------------------------------------------------------------------

def run_python(check: Check, name: str, deadline: float, options: dict) -> dict:
    """A stage of :mod:`.gpu_stages` in its own process, ended at ``deadline`` + GRACE."""
    env = child_env()  # (run in the caller's directory: its relative paths hold there)
    if check.device.startswith("cuda"):  # the kernels compiled, never interpreted
        env.pop("TRITON_INTERPRET", None)
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        result = Path(tmp) / "stage-result.json"
        cmd = [sys.executable, "-m", STAGE_MODULE, name, "--rows",
               str(check.jsonl), "--result", str(result), "--deadline", f"{deadline:.3f}",
               "--device", check.device, "--options", json.dumps(options)]
        before = len(read_rows(check.jsonl))
        with open(check.log, "a", encoding="utf-8") as log:
            log.write(f"\n==> {name} (until {time.strftime('%H:%M:%S', time.localtime(deadline))})\n")
            log.flush()
            proc = subprocess.Popen(cmd, cwd=os.getcwd(), env=env, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            try:
                proc.wait(timeout=max(deadline - time.time(), 0.0) + GRACE)
                ended = None
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                ended = f"over its budget: ended {GRACE:.0f} s after its deadline"
        if result.exists():
            try:
                outcome = io.read_json(result, UserError)
            except UserError as e:
                outcome = dict(status="failed", reason=f"its outcome cannot be read: {e}")
            if isinstance(outcome, dict) and isinstance(outcome.get("status"), str):
                return outcome
            return dict(status="failed", reason="its outcome is not a stage's outcome")
    made = len(read_rows(check.jsonl)) - before
    if ended:
        return dict(status="partial" if made else "not-run", reason=ended)
    last = [ln for ln in io.read_tail(check.log, 3000, UserError).decode(
        "utf-8", "replace").splitlines() if ln.strip()]
    return dict(status="failed" if made else "not-run",
                reason=f"exited {proc.returncode}: {last[-1] if last else ''}")


# ---------------------------------------------------------------------------------
# the command
# ---------------------------------------------------------------------------------

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = Parser(prog="gpu-check", description=__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(DEFAULT_OUT), help="folder of the record's four files")
    ap.add_argument("--budget", type=float, default=DEFAULT_BUDGET,
                    help="seconds for every stage together (default: %(default)s)")
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N, or cpu (a dry run)")
    ap.add_argument("--only", action="append", choices=STAGE_NAMES, default=[],
                    help="run this stage (repeatable; in the order given)")
    ap.add_argument("--stage-seconds", action="append", default=[], metavar="STAGE=SECONDS",
                    help="a stage's share of the budget, in seconds of the default 480 "
                         "(repeatable; default: STAGES)")
    ap.add_argument("--skip", action="append", default=[],
                    help="do not run this stage, or every stage it starts (e.g. cells)")
    ap.add_argument("--shape", action="append", default=[],
                    help="the shapes of paths, cells and profile (default: each stage's own)")
    ap.add_argument("--cell", action="append", default=[],
                    help="the cells of paths, cells, models and trainer (default: each stage's "
                         "own; trainer: those of them its recipe trains)")
    ap.add_argument("--step-recipe", action="append", default=[],
                    help="a recipe of the steps stage (default: ptb-medium and nmt-multi30k)")
    ap.add_argument("--step-cell", action="append", default=[],
                    help="a cell of the steps and step-capture stages (default: steps, every "
                         "cell of each recipe; step-capture, the --cell cells, else each "
                         "recipe's)")
    ap.add_argument("--capture-mode", action="append", default=[], choices=CAPTURE_MODES,
                    help="a train.step_capture mode the step-capture stage times (repeatable; "
                         "default: all three; 'off' is what the others are measured against)")
    ap.add_argument("--step-repeats", type=int, default=None,
                    help="timed steps per cell of the steps stage (default: 20)")
    ap.add_argument("--model-size", action="append", default=[],
                    help="a PTB size of the models stage (default: medium and small)")
    ap.add_argument("--repeats", type=int, default=None,
                    help="timed rounds of the benchmarks (default: each stage's own; the "
                         "stages check it)")
    ap.add_argument("--data-dir", default=None,
                    help="the steps and trainer stages' data (default: $LSTMABLATE_DATA, else "
                         "./data)")
    ap.add_argument("--task", default=None,
                    help="the trainer stage's task (default: the recipe's task)")
    ap.add_argument("--recipe", default=RECIPE,
                    help="the trainer stage's recipe, whose cells it trains (default: %(default)s)")
    args = ap.parse_args(argv)
    check_seconds(args.budget, "--budget")
    check_device(args.device)
    for option in ("step_repeats", "repeats"):
        value = getattr(args, option)
        if value is not None and not 1 <= value <= MAX_REPEATS:
            ap.error(f"--{option.replace('_', '-')} {value}: expected 1 to {MAX_REPEATS:,}")
    args.out = str(output_folder(args.out))
    if args.data_dir is not None:
        args.data_dir = str(caller_path(args.data_dir, "--data-dir"))
    shares = {}
    for item in args.stage_seconds:
        name, _, value = item.partition("=")
        try:
            shares[name] = float(value)
        except ValueError:
            shares[name] = -1.0
        if name not in STAGE_NAMES or not (math.isfinite(shares[name])
                                           and 0 < shares[name] <= MAX_BUDGET):
            ap.error(f"--stage-seconds {item}: expected STAGE=SECONDS, a stage of "
                     f"{', '.join(STAGE_NAMES)} and a positive number")
    args.shares = shares
    unknown = [s for s in args.skip if not any(n == s or n.startswith(s + "-") for n in STAGE_NAMES)]
    if unknown:
        ap.error(f"--skip {unknown[0]}: expected a stage ({', '.join(STAGE_NAMES)}) or the first "
                 "part of one (cells, paths)")
    return args


def check_names(args: argparse.Namespace) -> None:
    """The recipes, task and cells named, known (a UserError naming the one that is not)
    before any stage runs -- where the library's packages are installed (else the stages
    that read them are recorded as not run)."""
    if _missing(*LIBRARY):
        return
    from lstmablate.cells import get_cell
    from lstmablate.recipes import load_recipe
    from lstmablate.task import get_task

    for recipe in dict.fromkeys([*args.step_recipe, args.recipe]):
        load_recipe(recipe)  # (its cells, seeds, metrics ... checked: lstmablate.recipes)
    if args.task is not None:
        get_task(args.task)
    for cell in args.cell:
        if not cell.startswith("nn."):  # (the baselines of the benchmarks)
            get_cell(cell)
    for cell in args.step_cell:
        get_cell(cell)


def main(argv: list[str] | None = None) -> int:
    """The check (:func:`run`), with the command line's contract: a refusal is one paragraph
    and exit 2 (:func:`lstmablate.errors.exit_status`); 1 is a check that ran and did not
    pass."""
    return exit_status("gpu-check", lambda: run(argv))


def run(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    cuda = torch.cuda.is_available()
    if args.device.startswith("cuda") and not cuda:
        raise UserError("no CUDA device here (torch.cuda.is_available() is False); nothing to "
                        "do. (--device cpu runs the stages that need no GPU, as a dry run.)")
    if args.device.startswith("cuda:") and int(args.device[5:]) >= torch.cuda.device_count():
        raise UserError(f"--device {args.device}: this machine has "
                        f"{torch.cuda.device_count()} CUDA device(s), numbered from 0.")
    check_names(args)
    gpu = torch.cuda.get_device_name(torch.device(args.device)) if cuda and \
        args.device.startswith("cuda") else args.device
    chosen = [next(s for s in STAGES if s.name == n) for n in dict.fromkeys(args.only)] or [
        s for s in STAGES if s.default]
    chosen = [replace(s, seconds=args.shares.get(s.name, s.seconds)) for s in chosen]
    options = {k: v for k, v in dict(
        shapes=args.shape, cells=args.cell, step_recipes=args.step_recipe,
        step_cells=args.step_cell, capture_modes=args.capture_mode,
        model_sizes=args.model_size, repeats=args.repeats, step_repeats=args.step_repeats,
        data_dir=args.data_dir).items() if v}
    check = Check(Path(args.out), args.device, args.budget, gpu,
                  " ".join([Path(sys.executable).name, "-m", "lstmablate.bench.gpu_check",
                            *(argv if argv is not None else sys.argv[1:])]))
    for i, spec in enumerate(chosen):
        # this stage's share of what is left, among the stages still to run
        left = check.end - time.time() - RESERVE * args.budget
        budget = max(left, 0.0) * spec.seconds / sum(s.seconds for s in chosen[i:])
        deadline = time.time() + budget
        t0 = time.perf_counter()
        missing = _missing(*spec.needs)
        if any(spec.name == s or spec.name.startswith(s + "-") for s in args.skip):
            outcome, rows = dict(status="skipped", reason="--skip"), []
        elif spec.cuda_only and not args.device.startswith("cuda"):
            outcome, rows = dict(status="not-run", reason=f"skipped: no CUDA ({args.device})"), []
        elif missing:
            outcome, rows = dict(status="not-run", reason=f"needs {', '.join(missing)} (not "
                                 "installed; `make gpu-window-prepare` carries wheels)"), []
        elif budget <= 1.0:
            outcome, rows = dict(status="not-run", reason="no time left in --budget"), []
        elif spec.name == "tests":
            outcome, rows = run_tests(args.device, budget)
        elif spec.name == "trainer":
            outcome, rows = run_trainer(args.device, budget, args.task, args.recipe, args.cell,
                                         args.data_dir)
        else:
            outcome, rows = run_python(check, spec.name, deadline, options), []
        outcome.update(seconds=round(time.perf_counter() - t0, 1), budget=round(budget, 1))
        check.record(spec.name, outcome, rows)
    check.rewrite()
    print(f"wrote {check.jsonl.with_suffix('')}.{{jsonl,json,md,log}} ({check.seconds():.0f} s)")
    met = [t["met"] for t in check.document()["targets"] if t["met"] is not None]
    if met:
        print(f"targets met: {sum(met)} of {len(met)}")
    bad = {n: s for n, s in check.stages.items() if s["status"] in NOT_PASSED}
    if bad:
        print("gpu-check: " + "; ".join(f"{n} {s['status']} ({s.get('reason') or ''})"
                                        for n, s in bad.items()), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
