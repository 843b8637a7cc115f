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
``benchmarks/results``) it writes, named ``gpu-check-<gpu>-<date>``:

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
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from importlib import metadata
from pathlib import Path
from typing import Any

from lstmablate import io
from lstmablate.errors import UserError, exit_status

from .gpu_args import MAX_BUDGET, MAX_REPEATS, Parser, caller_path, check_device, check_seconds, \
    child_env, output_folder

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
#: the ratios of the GPU kernels' targets that are not one row's (docs/performance.md)
PARSER_WITHIN = 0.9  # parser-400 ratio >= 0.9 x the ptb-650 ratio (LSTM family)
TRAINER_WITHIN = 0.9  # the trainer's tokens/s >= 0.9 x the benchmarked step's
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


def read_rows(path: Path) -> list[dict]:
    """The rows of a ``.jsonl`` record (none if it is missing; a last line cut short by a kill
    is left out).  Read as :func:`lstmablate.io.read_lines` reads JSON lines: a FIFO, a device
    or a file too big is a UserError naming it, never waited on."""
    path = Path(path)
    if not path.exists():
        return []
    rows = []
    for line in io.read_lines(path, UserError):
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


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
# what the rows say: targets and tables
# ---------------------------------------------------------------------------------

def targets(rows: list[dict]) -> list[dict]:
    """Every target of docs/performance.md that these rows measure: one record each
    (what, measured, needed, met).  Rows of several precisions (``cells-fp32`` and
    ``cells-tf32``) are compared within their precision, which each target names."""
    out = []

    def add(what: str, got: float | None, need: float):
        out.append(dict(target=what, measured=None if got is None else round(got, 3),
                        needed=need, met=None if got is None else got >= need))

    def at(r: dict) -> str:  # ", tf32" where the row says its precision
        return f", {r['precision']}" if r.get("precision") else ""

    cells = [r for r in rows if r.get("kind") == "cell"]
    by = {(r.get("precision"), r["shape"], r["cell"]): r for r in cells}
    for r in cells:  # the rows' own targets (bench.GPU_TARGETS)
        if r.get("target") is not None:
            add(f"{r['cell']} >= {r['target']:.2f}x {r['target_baseline']} at {r['shape']}{at(r)}",
                r["target_ratio"], r["target"])
    for precision in dict.fromkeys(r.get("precision") for r in cells):
        family = sorted({r["cell"] for r in cells
                         if r["cell"].startswith("lstm") and r.get("precision") == precision})
        for cell in family:
            r650, rp = by.get((precision, "ptb-650", cell)), by.get((precision, "parser-400", cell))
            if r650 and rp:
                base = "ratio_rnn" if cell == "lstm-gates" else "ratio_lstm"
                add(f"{cell} at parser-400 within 10% of its ptb-650 ratio{at(rp)} "
                    f"({rp[base]:.2f} vs {r650[base]:.2f})", rp[base] / r650[base], PARSER_WITHIN)
    for (precision, shape, cell), r in by.items():
        base = by.get((precision, shape, "nn.LSTM"))
        if cell.startswith("lstm-") and base and base.get("memory_mb"):
            add(f"{cell} peak memory <= nn.LSTM's at {shape}{at(r)} (MB {r['memory_mb']:.1f} vs "
                f"{base['memory_mb']:.1f})", base["memory_mb"] / max(r["memory_mb"], 1e-9), 1.0)
    models = {(r["shape"], r["cell"]): r for r in rows if r.get("kind") == "model"}
    for (shape, cell), r in models.items():
        if shape == "ptb-medium-model" and cell.startswith("lstm-"):
            add(f"{cell} PTB-medium training step >= 1.0x the nn.LSTM model", r["ratio_lstm"], 1.0)
    for r in rows:  # a recipe's trainer rows against the model rows of the same name
        if r.get("kind") != "trainer":
            continue
        model = models.get((r["shape"].removesuffix("-trainer") + "-model", r["cell"]))
        if model is not None:
            bench_tps = model["tokens_per_s"]
            add(f"{r['cell']} trainer tokens/s within 10% of the benchmarked step "
                f"({r['tokens_per_s']:,.0f} vs {bench_tps:,.0f})", r["tokens_per_s"] / bench_tps,
                TRAINER_WITHIN)
    from .gpu_steps import targets as capture_targets  # (the step-capture stage's)

    return out + capture_targets(rows)


def _num(v: Any, spec: str) -> str:
    return "" if v is None else format(v, spec)


def markdown(doc: dict) -> str:
    """The record as Markdown: the stages, then a table per kind of row, then the targets."""
    from .render import to_markdown

    env = doc.get("environment", {})
    rows = doc.get("rows", [])
    lines = [f"# gpu-check: {env.get('gpu') or env.get('device', '?')}", "",
             f"{doc['started']}, {doc['seconds']:.0f} s"
             + (f" of a {doc['budget']:.0f} s budget" if doc.get("budget") else "")
             + f"; PyTorch {env.get('torch')}, CUDA {env.get('cuda')}, cuDNN {env.get('cudnn')}, "
             f"Triton {env.get('version_triton', env.get('triton'))}; commit {env.get('git')}", ""]
    if env.get("note"):
        lines[-1:-1] = ["", f"({env['note']})"]
    if doc.get("stages"):
        lines += ["| stage | status | seconds (budget) | note |", "|---|---|---|---|"]
        for name, s in doc["stages"].items():
            note = "; ".join(x for x in (s.get("summary"), s.get("reason")) if x)
            budget = f" ({s['budget']:.0f})" if s.get("budget") is not None else ""
            lines.append(f"| {name} | {s.get('status')} | {s.get('seconds', 0):.0f}{budget} | "
                         f"{note.replace('|', '/')} |")
        lines.append("")
    for r in (r for r in rows if r.get("kind") == "tests" and r.get("failures")):
        lines += ["tests/gpu failures:", "", *[f"* `{f}`" for f in r["failures"]], ""]
    paths = [r for r in rows if r.get("kind") == "path"]
    if paths:
        lines += ["| shape | cell | precision | kernel | fast path | worst | error | allowed | "
                  "passed |", "|---|---|---|---|---|---|---|---|---|"]
        taken = {True: "yes", False: "**no**", None: "?"}
        lines += [f"| {r['shape']} | {r['cell']} | {r['precision']} | {r['kernel']} | "
                  f"{taken[r.get('fast_path')]} | {r.get('worst') or r.get('problem', '')} | "
                  f"{_num(r.get('error'), '.3g')} | {_num(r.get('allowed'), '.3g')} | "
                  f"{'yes' if r['passed'] else '**no**'} |" for r in paths]
        lines.append("")
    measured = [r for r in rows if r.get("kind") in ("cell", "model")]
    if measured:
        lines += [to_markdown(measured), ""]
    steps = [r for r in rows if r.get("kind") == "step"]
    if steps:
        lines += ["| recipe | cell | kernel | ms/step | tokens/s | GPU busy | steps/epoch | epochs "
                  "| one run's steps, alone |", "|---|---|---|---|---|---|---|---|---|"]
        for r in steps:
            busy = f"{r['gpu_ms'] / r['ms']:.0%}" if r.get("gpu_ms") else ""
            minutes = r["run_steps"] * r["ms"] / 6e4
            lines.append(f"| {r['recipe']} | {r['cell']} | {r['kernel']} | {r['ms']:.2f} | "
                         f"{r['tokens_per_s']:,.0f} | {busy} | {r['steps_per_epoch']} | "
                         f"{r['epochs']} | {minutes:.1f} min |")
        lines.append("")
    profile = [r for r in rows if r.get("kind") == "profile"]
    for key in dict.fromkeys((r["shape"], r["cell"]) for r in profile):
        group = [r for r in profile if (r["shape"], r["cell"]) == key]
        lines += [f"| {key[1]} at {key[0]} ({group[0]['kernel']}; {group[0]['total_ms']:.3f} ms "
                  "per forward+backward) | calls | ms | share |", "|---|---|---|---|"]
        lines += [f"| `{r['name'][:80]}` | {r['calls']:g} | {r['ms']:.4f} | "
                  f"{_num(r['share'], '.1%')} |" for r in group]
        lines.append("")
    trainer = [r for r in rows if r.get("kind") == "trainer"]
    for shape in dict.fromkeys(r["shape"] for r in trainer):  # one table per recipe
        lines += [f"| {shape.removesuffix('-trainer')} through the trainer | steps | seconds "
                  "| tokens/s |", "|---|---|---|---|"]
        lines += [f"| {r['cell']} | {r['steps']} | {r['seconds']:.2f} | {r['tokens_per_s']:,.0f} |"
                  for r in trainer if r["shape"] == shape]
        lines.append("")
    from . import gpu_steps, peers  # the step-capture and peers stages' tables

    lines += gpu_steps.markdown_rows(rows) + peers.markdown_rows(rows)
    met = {True: "yes", False: "**no**", None: ""}
    if doc.get("targets"):
        lines += ["| target | measured | needed | met |", "|---|---|---|---|"]
        lines += [f"| {t['target']} | {'' if t['measured'] is None else t['measured']} | "
                  f"{t['needed']} | {met[t['met']]} |" for t in doc["targets"]]
    return "\n".join(lines).rstrip() + "\n"


# ---------------------------------------------------------------------------------
# the run
# ---------------------------------------------------------------------------------

class Check:
    """One gpu-check run: its files, its clock, and the record it rewrites after each stage."""

    def __init__(self, out: Path, device: str, budget: float, gpu: str, command: str):
        self.device, self.budget, self.gpu = device, budget, gpu
        self.t0, self.end = time.perf_counter(), time.time() + budget
        self.started = time.strftime("%Y-%m-%d %H:%M:%S")
        name = re.sub(r"[^A-Za-z0-9]+", "-", gpu).strip("-").lower() or "gpu"
        stem = out / f"gpu-check-{name}-{time.strftime('%Y%m%d-%H%M%S')}"
        self.jsonl, self.json, self.md, self.log = (stem.with_suffix(s) for s in
                                                    (".jsonl", ".json", ".md", ".log"))
        self.stages: dict[str, dict] = {}
        self.command = command
        out.mkdir(parents=True, exist_ok=True)
        io.append_json_line(self.jsonl, dict(kind="run", started=self.started, command=command,
                                             device=device, budget=budget))

    def seconds(self) -> float:
        return round(time.perf_counter() - self.t0, 1)

    def record(self, name: str, outcome: dict, rows: list[dict] = ()) -> None:
        """A stage's rows (those it did not append itself) and its outcome, appended; then
        the ``.json`` and ``.md`` rewritten from everything the ``.jsonl`` holds."""
        for row in rows:
            io.append_json_line(self.jsonl, {"stage": name, **row})
        self.stages[name] = outcome
        io.append_json_line(self.jsonl, dict(kind="stage", stage=name, **outcome))
        self.rewrite()
        note = outcome.get("summary") or outcome.get("reason") or ""
        print(f"gpu-check {name}: {outcome['status']} ({outcome.get('seconds', 0)} s) {note}",
              flush=True)

    def document(self) -> dict:
        rows = read_rows(self.jsonl)
        # without the environment stage, what this process knows: the device and PyTorch
        # (imported by main() to ask for CUDA; the environment stage reads the same version)
        import torch

        env = next((r for r in rows if r.get("kind") == "environment"), None) or dict(
            gpu=self.gpu, device=self.device, torch=torch.__version__,
            note="the environment stage did not run: only the device and PyTorch are known")
        measured = [r for r in rows if r.get("kind") not in ("run", "stage", "environment")]
        return dict(started=self.started, command=self.command, device=self.device,
                    budget=self.budget, seconds=self.seconds(), environment=env,
                    stages=self.stages, rows=measured, targets=targets(measured))

    def rewrite(self) -> None:
        doc = self.document()
        io.atomic_write_text(self.json, json.dumps(doc, indent=2) + "\n")
        io.atomic_write_text(self.md, markdown(doc))

    def run_python(self, name: str, deadline: float, options: dict) -> dict:
        """A stage of :mod:`.gpu_stages` in its own process, ended at ``deadline`` + GRACE."""
        env = child_env()  # (run in the caller's directory: its relative paths hold there)
        if self.device.startswith("cuda"):  # the kernels compiled, never interpreted
            env.pop("TRITON_INTERPRET", None)
        with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
            result = Path(tmp) / "stage-result.json"
            cmd = [sys.executable, "-m", STAGE_MODULE, name, "--rows",
                   str(self.jsonl), "--result", str(result), "--deadline", f"{deadline:.3f}",
                   "--device", self.device, "--options", json.dumps(options)]
            before = len(read_rows(self.jsonl))
            with open(self.log, "a", encoding="utf-8") as log:
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
        made = len(read_rows(self.jsonl)) - before
        if ended:
            return dict(status="partial" if made else "not-run", reason=ended)
        last = [ln for ln in io.read_tail(self.log, 3000, UserError).decode(
            "utf-8", "replace").splitlines() if ln.strip()]
        return dict(status="failed" if made else "not-run",
                    reason=f"exited {proc.returncode}: {last[-1] if last else ''}")


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
            outcome, rows = check.run_python(spec.name, deadline, options), []
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
