"""The stages of ``make gpu-check`` that run in Python, each in a process of its own.

    python -m lstmablate.bench.gpu_stages STAGE --rows FILE --result FILE --deadline T
                                          [--device cuda] [--options JSON]

:mod:`lstmablate.bench.gpu_check` starts one such process per stage, with the stage's
deadline (a ``time.time()``): a stage starts no unit of work (a shape, a cell, a recipe)
after it, and the parent ends the process a little later if it is still running.  Each row
is appended to ``--rows`` (JSON lines) the moment it is measured, so a stage cut short keeps
what it measured; ``--result`` receives the stage's outcome (status, reason, summary) when
it ends.  A process per stage also means a CUDA error or a hung compile in one stage cannot
take the others with it.

Stages: ``environment``, ``paths-fp32``, ``paths-bf16``, ``cells-fp32``, ``cells-tf32``,
``models``, ``steps``, ``profile`` (what each does: :data:`STAGES` and docs/design/gpu-checks.md).
Only this module's own imports and PyTorch are loaded before a stage runs; each stage
imports what it needs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from lstmablate import io
from lstmablate.errors import UserError, exit_status

from .render import json_safe

#: the cells of the profiler's kernel table: the baselines, the two cells that call them
#: (``lstm`` on cuDNN's LSTM, ``lstm-gates`` on its RNN: where their time differs), a
#: recurrent and a scan path
PROFILE_CELLS = ("nn.LSTM", "lstm", "nn.RNN", "lstm-gates", "lstm-srnn", "lstm-srnn-hidden")
PROFILE_SHAPE = "ptb-650"
#: the recipe whose cells are the paper's (every path they take is checked)
PAPER_RECIPE = "ptb-medium"
#: dropout between layers while the paths are checked (the runs train with it, which keeps
#: cuDNN's cells on their per-layer path)
PATHS_DROPOUT = 0.3
#: the distributions whose version the environment stage records (besides PyTorch's)
DISTRIBUTIONS = ("lstmablate", "triton", "numpy", "pyyaml", "rich", "typer", "pytest",
                 "sacrebleu", "sacremoses", "conllu")


@dataclass
class Outcome:
    """How a stage ended: ``done`` (ran every unit, nothing failed), ``failed`` (ran; a
    check failed), ``partial`` (stopped at its deadline before every unit), ``not-run`` (it
    could not run here: ``reason`` says why)."""

    status: str = "done"
    reason: str | None = None
    summary: str | None = None


@dataclass
class Stage:
    """What one stage process is given: its device, deadline and options, and where its
    rows go (:meth:`emit`, one JSON line each, written at once)."""

    name: str
    device: torch.device
    deadline: float
    options: dict[str, Any]
    rows_path: Path
    rows: list[dict] = field(default_factory=list)

    def emit(self, row: dict) -> None:
        row = json_safe({"stage": self.name, **row})
        self.rows.append(row)
        io.append_json_line(self.rows_path, row)  # flushed and fsync'd: a kill keeps it

    def time_left(self) -> bool:
        return time.time() < self.deadline

    def log(self, text: str) -> None:
        print(f"[{self.name}] {text}", flush=True)

    def each(self, units: list[str], run: Callable[[str], None]) -> tuple[list[str], list[str]]:
        """``run(unit)`` for each unit (a shape, a cell, a recipe) until the deadline;
        returns (the units that raised, each with its error's first line: the others still
        run; the units the deadline left)."""
        failed, left = [], []
        for unit in units:
            if not self.time_left():
                left.append(unit)
                continue
            try:
                run(unit)
            except Exception as err:  # noqa: BLE001  (named in the stage's outcome)
                failed.append(f"{unit}: {first_line(err)}")
                self.log(failed[-1])
        return failed, left


# ---------------------------------------------------------------------------------
# the stages
# ---------------------------------------------------------------------------------

def environment(stage: Stage) -> Outcome:
    """What the numbers are measured on: versions, the GPU, PyTorch's float32 precision
    flags as a run would find them, and what Triton needs to build its launcher (a C
    compiler and ``Python.h``)."""
    dev = stage.device
    row: dict[str, Any] = dict(
        kind="environment", python=platform.python_version(), platform=platform.platform(),
        executable=sys.executable, torch=torch.__version__, cuda=torch.version.cuda,
        cudnn=torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        device=str(dev), cpus=os.cpu_count(),
        matmul_allow_tf32=torch.backends.cuda.matmul.allow_tf32,
        cudnn_allow_tf32=torch.backends.cudnn.allow_tf32,
        float32_matmul_precision=torch.get_float32_matmul_precision(),
        c_compiler=next((c for c in ("cc", "gcc", "clang") if shutil.which(c)), None),
        python_h=(Path(sysconfig.get_paths()["include"]) / "Python.h").is_file(),
        triton_interpret=os.environ.get("TRITON_INTERPRET"))
    for name in DISTRIBUTIONS:
        try:
            row[f"version_{name}"] = metadata.version(name)
        except metadata.PackageNotFoundError:
            row[f"version_{name}"] = None
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        row.update(gpu=torch.cuda.get_device_name(dev), capability=".".join(
            map(str, torch.cuda.get_device_capability(dev))), multiprocessors=props.multi_processor_count,
            gpu_memory_gib=round(props.total_memory / 2**30, 1), driver=_driver())
    row["git"] = _git()
    stage.emit(row)
    summary = f"PyTorch {row['torch']}, Triton {row['version_triton'] or 'not installed'}"
    if dev.type == "cuda":
        summary = f"{row['gpu']}, {summary}, CUDA {row['cuda']}"
    return Outcome(summary=summary)


def _driver() -> str | None:
    """The NVIDIA driver's version (nvidia-smi), or None."""
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip().splitlines()[0] if r.returncode == 0 and r.stdout.strip() else None


def _git() -> str | None:
    """The checkout's commit (and ``+dirty``), or None where git or the repository is absent."""
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root,
                              capture_output=True, text=True, timeout=20)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def first_line(err: BaseException) -> str:
    """An exception as one line: its type and the first line of its message."""
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0]}" if text else type(err).__name__


def _paper_cells() -> list[str]:
    from lstmablate.recipes import load_recipe

    return list(load_recipe(PAPER_RECIPE)[1]["cells"])


def _inputs(enc, shape, dev: torch.device, seed: int = 0):
    """A batch of the shape: inputs, lengths (drawn as the benchmark draws them, the first
    row full), and a random initial state."""
    gen = torch.Generator().manual_seed(seed)
    B, T = shape.batch, shape.steps
    x = torch.randn(B, T, shape.input_size, generator=gen)
    lengths = None
    if shape.min_length:
        lengths = torch.randint(shape.min_length, T + 1, (B,), generator=gen)
        lengths[0] = T
    cell = enc.layers[0][0]
    n = enc.num_layers * enc.num_directions
    state = []
    for name, size in zip(cell.state_names, cell.state_sizes):
        s = torch.randn(n, B, size, generator=gen)
        state.append(torch.softmax(s, -1) if name.startswith("key") else s)  # (mm cells' keys)
    return x.to(dev), lengths, tuple(s.to(dev) for s in state)


def paths(precision: str) -> Callable[[Stage], Outcome]:
    """Every fast path against the reference loop (:mod:`.accuracy`), per shape (default:
    the paper's, :data:`~.cells.PAPER_SHAPES`) and cell (default: the paper's), in float32
    (TF32 off on both sides) or under bfloat16 autocast."""

    def stage_fn(stage: Stage) -> Outcome:
        from lstmablate.cells import build_encoder

        from .accuracy import measure_accuracy
        from .cells import PAPER_SHAPES, parse_shape
        from .measure import _path, float32_precision

        autocast = torch.bfloat16 if precision == "bf16" else None
        cells = stage.options.get("cells") or _paper_cells()
        shapes = [parse_shape(s) for s in stage.options.get("shapes") or PAPER_SHAPES]
        failed, slow, left = [], [], []
        for shape in shapes:
            for cell in cells:
                if not stage.time_left():
                    left.append(f"{cell} at {shape.name}")
                    continue
                torch.manual_seed(0)
                t0 = time.perf_counter()
                case = dict(kind="path", shape=shape.name, cell=cell, precision=precision)
                try:
                    enc = build_encoder(cell, shape.input_size, shape.hidden,
                                        num_layers=shape.layers, bidirectional=shape.bidirectional,
                                        dropout=PATHS_DROPOUT).to(stage.device).train()
                    x, lengths, state = _inputs(enc, shape, stage.device)
                    with float32_precision("fp32"):
                        acc = measure_accuracy(enc, x, lengths, state, autocast=autocast)
                    kernel = _path(enc, stage.device, autocast or torch.float32,
                                   lengths is not None, shape.batch)
                except Exception as err:  # noqa: BLE001  (named; the other paths still run)
                    problem = first_line(err)
                    stage.emit(dict(case, kernel="?", passed=False, problem=problem,
                                    seconds=round(time.perf_counter() - t0, 2)))
                    stage.log(f"{shape.name} {cell}: {problem}")
                    failed.append(f"{cell} at {shape.name} ({problem})")
                    continue
                stage.emit(dict(case, kernel=kernel, seconds=round(time.perf_counter() - t0, 2),
                                **acc.to_row()))
                stage.log(f"{shape.name} {cell} ({kernel}): error {acc.error:.3g} of "
                          f"{acc.allowed:.3g} allowed in {acc.worst}"
                          + ("" if acc.fast_path else " -- the reference loop ran"))
                if not acc.fast_path:
                    slow.append(f"{cell} at {shape.name}")
                elif not acc.passed:
                    failed.append(f"{cell} at {shape.name} ({acc.worst}: {acc.error:.3g} > "
                                  f"{acc.allowed:.3g})")
        from lstmablate.cells.kernels.interface import kernel_record

        # which path each cell took, and every Triton kernel that failed and fell back
        stage.emit(dict(kind="kernels", precision=precision, **kernel_record()))
        checked = len([r for r in stage.rows if r.get("kind") == "path"])
        if precision == "bf16" and checked and len(slow) == checked:  # (none raised)
            return Outcome("not-run", "under bfloat16 autocast "
                           "every cell ran the reference loop (no bf16 fast path ran)")
        notes = [f"failed: {', '.join(failed)}" if failed else "",
                 f"the reference loop ran (no fast path): {', '.join(slow)}" if slow else "",
                 f"not checked (deadline): {', '.join(left)}" if left else ""]
        reason = "; ".join(n for n in notes if n) or None
        status = "failed" if failed else "partial" if left else "done"
        return Outcome(status, reason, f"{checked - len(failed) - len(slow)} of {checked} fast "
                       "paths within tolerance")

    return stage_fn


def cells(precision: str) -> Callable[[Stage], Outcome]:
    """The cell benchmark (``bench_cells``), one shape at a time (default:
    :data:`~.cells.DEFAULT_SHAPES`), both sides at ``precision`` (fp32 or tf32)."""

    def stage_fn(stage: Stage) -> Outcome:
        from .cells import DEFAULT_SHAPES, bench_cells
        from .measure import float32_precision

        shapes = stage.options.get("shapes") or DEFAULT_SHAPES

        def one(shape: str) -> None:
            with float32_precision(precision):
                rows = bench_cells(stage.options.get("cells"), [shape], threads=1,
                                   device=str(stage.device),
                                   repeats=stage.options.get("repeats", 9), warmup=3,
                                   reference=False, progress=stage.log)
            for row in rows:
                stage.emit(row)

        failed, left = stage.each(shapes, one)
        return _outcome(failed, left, f"{len(stage.rows)} rows at {', '.join(shapes)}")

    return stage_fn


def models(stage: Stage) -> Outcome:
    """The PTB training-step benchmark (``bench_models``, medium then small) against the same
    model on ``torch.nn.LSTM``, at the precision flags a run finds (PyTorch's defaults)."""
    from .models import bench_models

    sizes = stage.options.get("model_sizes") or ["medium", "small"]

    def one(size: str) -> None:
        for row in bench_models(stage.options.get("cells"), threads=1, device=str(stage.device),
                                repeats=stage.options.get("repeats", 15), warmup=3, size=size,
                                progress=stage.log):
            stage.emit(row)

    failed, left = stage.each(sizes, one)
    return _outcome(failed, left, f"PTB-{', '.join(sizes)}")


def steps(stage: Stage) -> Outcome:
    """Training steps of each recipe (``--step-recipe``; default the PTB-medium and NMT ones)
    on its own task and data, per cell (:func:`.steps.bench_task_steps`): what
    ``make gpu-window`` plans its runs with."""
    from .steps import bench_task_steps

    def one(recipe: str) -> None:
        for row in bench_task_steps(recipe, stage.options.get("step_cells"),
                                    device=str(stage.device),
                                    data_dir=stage.options.get("data_dir"),
                                    steps=stage.options.get("step_repeats", 20),
                                    deadline=stage.deadline, progress=stage.log):
            stage.emit(row)

    recipes = stage.options.get("step_recipes") or ["ptb-medium", "nmt-multi30k"]
    failed, left = stage.each(recipes, one)  # (no data here, a task's package missing ...)
    timed = sorted({r["recipe"] for r in stage.rows})
    if failed and not timed:
        return Outcome("not-run", "; ".join(failed))
    return _outcome(failed, left, f"{len(stage.rows)} cells of {', '.join(timed)}")


def profile(stage: Stage) -> Outcome:
    """A ``torch.profiler`` table of where a forward+backward's time goes (the GPU's kernels
    on CUDA, PyTorch's operators elsewhere) for each of :data:`PROFILE_CELLS` at ptb-650 (or
    the first ``--shape``)."""
    from .cells import _TorchEncoder, _build_cell_encoder, _encoder_step, parse_shape
    from .measure import _path, kernel_table

    shape = parse_shape((stage.options.get("shapes") or [PROFILE_SHAPE])[0])
    dev = stage.device
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(shape.batch, shape.steps, shape.input_size, generator=gen).to(dev)
    grad = torch.randn(shape.batch, shape.steps,
                       shape.hidden * (2 if shape.bidirectional else 1), generator=gen).to(dev)
    def one(cell: str) -> None:
        torch.manual_seed(0)
        enc = (_TorchEncoder(cell, shape) if cell.startswith("nn.")
               else _build_cell_encoder(cell, shape)).to(dev)
        step = _encoder_step(enc, x.requires_grad_(True), None, grad)
        for _ in range(5):  # compiled, captured, warm
            step()
        kernel = "cuDNN" if cell.startswith("nn.") and dev.type == "cuda" else (
            "PyTorch" if cell.startswith("nn.") else _path(enc, dev, x.dtype, False, shape.batch))
        table, total_ms = kernel_table(step, dev)
        for rank, entry in enumerate(table, 1):
            stage.emit(dict(kind="profile", shape=shape.name, cell=cell, kernel=kernel,
                            rank=rank, total_ms=total_ms, **entry))
        stage.log(f"{cell}: {total_ms:.3f} ms per forward+backward "
                  f"({'GPU kernels' if dev.type == 'cuda' else 'CPU operators'})")

    failed, left = stage.each(stage.options.get("profile_cells") or PROFILE_CELLS, one)
    return _outcome(failed, left, f"{shape.name}, "
                    + ("GPU kernels" if dev.type == "cuda" else "CPU operators"))


def _outcome(failed: list[str], left: list[str], summary: str) -> Outcome:
    """``failed`` (units that raised: named), else ``partial`` (units ``left`` at the
    deadline), else ``done``."""
    notes = [f"failed: {'; '.join(failed)}" if failed else "",
             f"not run (deadline): {', '.join(left)}" if left else ""]
    status = "failed" if failed else "partial" if left else "done"
    return Outcome(status, "; ".join(n for n in notes if n) or None, summary)


#: the Python stages by name (gpu_check runs ``tests`` and ``trainer`` itself)
def _step_capture(stage: Stage) -> Outcome:
    """``step-capture``: train.step_capture's modes per task (:mod:`.gpu_steps`), every recipe
    of its ``CAPTURE_RECIPES`` (or ``--step-recipe``) whose data are present."""
    from lstmablate.errors import DataError

    from .gpu_steps import CAPTURE_RECIPES, MODES, bench_capture_steps

    recipes = stage.options.get("step_recipes") or list(CAPTURE_RECIPES)
    no_data: list[str] = []

    def one(recipe: str) -> None:
        try:  # (each row written as it is measured: a stage ended at its deadline keeps them)
            for row in bench_capture_steps(recipe, stage.options.get("step_cells")
                                           or stage.options.get("cells"),
                                           modes=tuple(stage.options.get("capture_modes")
                                                       or MODES),
                                           device=str(stage.device),
                                           data_dir=stage.options.get("data_dir"),
                                           steps=stage.options.get("step_repeats", 20),
                                           deadline=stage.deadline, progress=stage.log):
                stage.emit(row)
        except DataError:
            no_data.append(recipe)
            stage.log(f"{recipe}: its data are not here (skipped)")

    failed, left = stage.each(recipes, one)
    timed = sorted({r["recipe"] for r in stage.rows})
    skipped = f"; no data: {', '.join(no_data)}" if no_data else ""
    if not timed and not failed:
        return Outcome("not-run", f"no recipe's data here{skipped}")
    if failed and not timed:
        return Outcome("not-run", "; ".join(failed) + skipped)
    return _outcome(failed, left, f"{len(stage.rows)} steps of {', '.join(timed)}{skipped}")


def _peers(stage: Stage) -> Outcome:
    """``peers``: the cells' reference implementations beside ours (:mod:`.peers`), one shape
    at a time (``--shape``, default its ``PEER_SHAPES``)."""
    from .peers import PEER_SHAPES, bench_peers

    shapes = stage.options.get("shapes") or list(PEER_SHAPES)

    def one(shape: str) -> None:
        for row in bench_peers([shape], device=str(stage.device), threads=1,
                               repeats=stage.options.get("repeats", 9), warmup=3,
                               progress=stage.log):
            stage.emit(row)

    failed, left = stage.each(shapes, one)
    measured = sum(r.get("status") == "measured" for r in stage.rows)
    skipped = sorted({r["status"] for r in stage.rows if r.get("status", "").startswith("skipped")})
    return _outcome(failed, left, f"{measured} measured" + (f"; {'; '.join(skipped)}"
                                                            if skipped else ""))


STAGES: dict[str, Callable[[Stage], Outcome]] = {
    "environment": environment, "paths-fp32": paths("fp32"), "paths-bf16": paths("bf16"),
    "cells-fp32": cells("fp32"), "cells-tf32": cells("tf32"), "models": models,
    "steps": steps, "profile": profile, "step-capture": _step_capture, "peers": _peers,
}


def main(argv: list[str] | None = None) -> int:
    """One stage, its rows appended to ``--rows`` and its outcome written to ``--result`` (both
    through :mod:`lstmablate.io`); a refusal is one paragraph and exit 2
    (:func:`lstmablate.errors.exit_status`)."""
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stage", choices=sorted(STAGES))
    ap.add_argument("--rows", required=True, type=Path)
    ap.add_argument("--result", required=True, type=Path)
    ap.add_argument("--deadline", required=True, type=float)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--options", default="{}")
    args = ap.parse_args(argv)

    def body() -> int:
        if not math.isfinite(args.deadline):
            raise UserError(f"--deadline {args.deadline}: expected a time (seconds since the "
                            "epoch)")
        options = io.parse_json(args.options, "--options", UserError)
        if not isinstance(options, dict):
            raise UserError(f"--options {args.options[:60]!r}: expected a JSON object")
        try:
            device = torch.device(args.device)
        except RuntimeError as e:
            raise UserError(f"--device {args.device!r}: {e}") from None
        stage = Stage(args.stage, device, args.deadline, options, args.rows)
        outcome = STAGES[args.stage](stage)
        io.atomic_write_text(args.result, json.dumps(outcome.__dict__) + "\n")
        return 0

    return exit_status("gpu-stage", body)


if __name__ == "__main__":
    raise SystemExit(main())
