"""One command for a GPU machine: check the GPU paths and measure them (``make gpu-check``).

    python -m lstmablate.bench.gpu_check [--out benchmarks/results] [--device cuda]
                                         [--task ptb] [--recipe ptb-medium]

In one run, on one GPU, in under eight minutes (``tests/gpu/`` has a time budget, and the
trainer part starts no run after ``TOTAL_BUDGET`` seconds; a part that cannot run here is
recorded as skipped, with the reason, and the rest still runs):

1. ``tests/gpu/`` (pytest): the Triton kernels compiled and run on the GPU against the
   reference loop, the CUDA-graph capture, cuDNN with the weights kept in its layout;
2. the cell benchmark (``lstmablate.bench.bench_cells``) at ptb-200, ptb-650 and
   parser-400, every registered cell against ``torch.nn.LSTM`` / ``torch.nn.RNN`` (cuDNN)
   in the same process, with the path each cell took and its peak memory;
3. the PTB small and medium training-step benchmark (``bench_models``);
4. 200 training steps per cell of a recipe (``--recipe``, default ``ptb-medium``, of the task
   ``--task``, default ``ptb``: its ``cells``) through the real trainer (``lstmablate
   train``), tokens/s = 200 steps x the recipe's ``batch_size`` x ``num_steps`` tokens /
   (the train time of a run of 220 steps - that of a run of 20 steps), so compiling,
   capturing and the first steps' warm-up are left out.  Needs the task's data
   (``LSTMABLATE_DATA``) and the CLI's dependencies;

and writes ``gpu-check-<gpu>-<date>.json`` (the environment: device, driver-side versions,
Triton's; every row; every target of docs/performance.md with the measured ratio and
whether it is met) and the same as Markdown tables (``.md``) under ``--out``.

It needs only PyTorch with CUDA (and Triton for the Triton paths) and this checkout
installed (``pip install --no-deps -e .``): nothing is built beforehand (the Triton kernels
compile on first use).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from lstmablate import io

ROOT = Path(__file__).resolve().parents[2]  # the checkout (tests/gpu, benchmarks/results)
TOTAL_BUDGET = 460.0  # seconds: the trainer part stops starting runs after this
TESTS_BUDGET = 210.0  # tests/gpu (the first run compiles every Triton kernel it uses)
TRAIN_STEPS = 200  # measured steps per cell (the difference of two runs)
WARM_STEPS = 20  # the shorter run's steps
#: the trainer part's recipe (``--recipe``; its task is the recipe's unless ``--task`` says
#: otherwise): PTB-medium, whose training step the model benchmark also times
#: (``ptb-medium-model``)
RECIPE = "ptb-medium"
#: the ratios of the GPU kernels' targets that are not one row's (docs/performance.md)
PARSER_WITHIN = 0.9  # parser-400 ratio >= 0.9 x the ptb-650 ratio (LSTM family)
TRAINER_WITHIN = 0.9  # the trainer's tokens/s >= 0.9 x the benchmarked step's


def _missing(*modules: str) -> list[str]:
    return [m for m in modules if importlib.util.find_spec(m) is None]


def _tail(text: str, n: int = 4000) -> str:
    return text[-n:]


def run_tests(device: str, budget: float) -> dict:
    """tests/gpu/ under pytest (a subprocess: the Triton kernels compiled, not interpreted)."""
    missing = _missing("pytest")
    if missing:
        return dict(status="skipped", reason=f"not installed: {', '.join(missing)}")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["LSTMABLATE_GPU_DEVICE"] = device
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
           str(ROOT / "tests" / "gpu")]
    try:
        r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=budget)
    except subprocess.TimeoutExpired as err:
        return dict(status="timeout", reason=f"over {budget:.0f} s",
                    output=_tail((err.stdout or b"").decode(errors="replace")
                                 if isinstance(err.stdout, bytes) else err.stdout or ""))
    lines = (r.stdout or "").strip().splitlines()
    summary = lines[-1] if lines else ""
    status = "passed" if r.returncode == 0 else "failed"
    if r.returncode == 5:
        status = "skipped"  # no tests collected
    return dict(status=status, summary=summary, output=_tail(r.stdout + r.stderr))


def run_cells(device: str) -> list[dict]:
    from lstmablate import bench

    return bench.bench_cells(None, bench.DEFAULT_SHAPES, threads=1, device=device, repeats=9,
                             warmup=3, reference=False, progress=print)


def run_models(device: str) -> list[dict]:
    from lstmablate import bench

    rows = []
    for size in ("small", "medium"):
        rows += bench.bench_models(None, threads=1, device=device, repeats=15, warmup=3,
                                   size=size, progress=print)
    return rows


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
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd[2:])}` failed:\n{_tail(r.stderr, 2000)}")
    from lstmablate.run.record import Run
    from lstmablate.run.runs import RunFiles

    result = Run.open(RunFiles.of(out, f"gpu-check-{steps}", cell, 1).root).result
    if result is None:
        raise RuntimeError(f"no result.json for {cell} ({steps} steps) under {out}")
    if result.steps != steps:
        raise RuntimeError(f"{cell}: the run stopped after {result.steps} of {steps} steps")
    return float(result.train_time_s)


def run_trainer(device: str, budget: float, task: str | None = None,
                recipe: str = RECIPE) -> tuple[dict, list[dict]]:
    """Per cell of ``recipe`` (of ``task``): tokens/s of TRAIN_STEPS steps through
    ``lstmablate train`` (the difference of a run of WARM_STEPS + TRAIN_STEPS steps and one
    of WARM_STEPS); no run is started after ``budget`` seconds."""
    missing = _missing("typer", "rich", "yaml")
    if missing:
        return dict(status="skipped", reason=f"the CLI needs {', '.join(missing)}"), []
    task = task or recipe_task(recipe)
    data_dir = os.environ.get("LSTMABLATE_DATA", str(ROOT / "data"))
    from lstmablate.data import find_file
    from lstmablate.errors import DataError, UserError
    from lstmablate.task import get_task

    try:  # the files the recipe's task reads (the task plugin owns their names)
        for ds in get_task(task).datasets:
            for f in ds.files:
                find_file(data_dir, f.relpath)
    except DataError:
        return dict(status="skipped",
                    reason=f"no {task} data under {data_dir} (set LSTMABLATE_DATA)"), []
    rows, errors, start = [], [], time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpu-check-runs-") as tmp:
        for cell in paper_cells(recipe):
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
    status = "done" if not errors else "partial" if rows else "error"
    return dict(status=status, reason="; ".join(errors) or None), rows


def targets(rows: list[dict]) -> list[dict]:
    """Every target of docs/performance.md that these rows measure: one record each
    (what, measured, needed, met)."""
    out = []

    def add(what: str, got: float | None, need: float):
        out.append(dict(target=what, measured=None if got is None else round(got, 3),
                        needed=need, met=None if got is None else got >= need))

    cells = [r for r in rows if r.get("kind") == "cell"]
    by = {(r["shape"], r["cell"]): r for r in cells}
    for r in cells:  # the rows' own targets (bench.GPU_TARGETS)
        if r.get("target") is not None:
            add(f"{r['cell']} >= {r['target']:.2f}x {r['target_baseline']} at {r['shape']}",
                r["target_ratio"], r["target"])
    family = sorted({r["cell"] for r in cells if r["cell"].startswith("lstm")})
    for cell in family:
        r650, rp = by.get(("ptb-650", cell)), by.get(("parser-400", cell))
        if r650 and rp:
            base = "ratio_rnn" if cell == "lstm-gates" else "ratio_lstm"
            add(f"{cell} at parser-400 within 10% of its ptb-650 ratio "
                f"({rp[base]:.2f} vs {r650[base]:.2f})", rp[base] / r650[base], PARSER_WITHIN)
    for (shape, cell), r in by.items():
        base = by.get((shape, "nn.LSTM"))
        if cell.startswith("lstm-") and base and base.get("memory_mb"):
            add(f"{cell} peak memory <= nn.LSTM's at {shape} (MB {r['memory_mb']:.1f} vs "
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
    return out


def markdown(doc: dict) -> str:
    from lstmablate import bench

    env = doc["environment"]
    lines = [f"# gpu-check: {env.get('gpu', '?')}", "",
             f"{doc['started']}, {doc['seconds']:.0f} s; PyTorch {env.get('torch')}, CUDA "
             f"{env.get('cuda')}, cuDNN {env.get('cudnn')}, Triton {env.get('triton')}", ""]
    for name, part in doc["parts"].items():
        note = part.get("summary") or part.get("reason") or ""
        lines.append(f"* {name}: {part.get('status')} {note} ({part.get('seconds', 0):.0f} s)")
    measured = [r for r in doc["rows"] if r.get("kind") in ("cell", "model")]
    lines += ["", bench.to_markdown(measured)]
    trainer = [r for r in doc["rows"] if r.get("kind") == "trainer"]
    for shape in dict.fromkeys(r["shape"] for r in trainer):  # one table per recipe
        lines += ["", f"| {shape.removesuffix('-trainer')} through the trainer | steps | seconds "
                  "| tokens/s |", "|---|---|---|---|"]
        lines += [f"| {r['cell']} | {r['steps']} | {r['seconds']:.2f} | {r['tokens_per_s']:,.0f} |"
                  for r in trainer if r["shape"] == shape]
    met = {True: "yes", False: "**no**", None: ""}
    lines += ["", "| target | measured | needed | met |", "|---|---|---|---|"]
    lines += [f"| {t['target']} | {'' if t['measured'] is None else t['measured']} | "
              f"{t['needed']} | {met[t['met']]} |" for t in doc["targets"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--skip", action="append", default=[],
                    choices=["tests", "cells", "models", "trainer"])
    ap.add_argument("--task", default=None,
                    help="the trainer part's task (default: the recipe's task)")
    ap.add_argument("--recipe", default=RECIPE,
                    help="the trainer part's recipe, whose cells it trains (default: %(default)s)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu-check: no CUDA device here (torch.cuda.is_available() is False); nothing to do",
              file=sys.stderr)
        return 2
    from lstmablate import bench

    t_start = time.perf_counter()
    doc = dict(started=time.strftime("%Y-%m-%d %H:%M:%S"),
               command=" ".join([os.path.basename(sys.executable), *sys.argv]),
               environment=bench.environment(1, args.device), parts={}, rows=[])
    def left() -> float:  # of the whole run's budget
        return TOTAL_BUDGET - (time.perf_counter() - t_start)

    def part(name, fn):
        if name in args.skip:
            doc["parts"][name] = dict(status="skipped", reason="--skip")
            return
        t0 = time.perf_counter()
        try:
            res = fn()
        except Exception as err:  # noqa: BLE001  (recorded; the other parts still run)
            res = dict(status="error", reason=f"{type(err).__name__}: {err}")
        if isinstance(res, list):
            doc["rows"] += res
            res = dict(status="done", rows=len(res))
        elif isinstance(res, tuple):
            res, rows = res
            doc["rows"] += rows
        res["seconds"] = round(time.perf_counter() - t0, 1)
        doc["parts"][name] = res
        print(f"gpu-check {name}: {res.get('status')} ({res['seconds']} s) "
              f"{res.get('summary') or res.get('reason') or ''}", flush=True)

    part("tests", lambda: run_tests(args.device, TESTS_BUDGET))
    part("cells", lambda: run_cells(args.device))
    part("models", lambda: run_models(args.device))
    part("trainer", lambda: run_trainer(args.device, max(left(), 0.0), args.task, args.recipe))
    doc["targets"] = targets(doc["rows"])
    doc["seconds"] = round(time.perf_counter() - t_start, 1)
    gpu = re.sub(r"[^A-Za-z0-9]+", "-", doc["environment"].get("gpu", "gpu")).strip("-").lower()
    out = Path(args.out) / f"gpu-check-{gpu}-{time.strftime('%Y%m%d-%H%M')}.json"
    text = bench.to_json(doc.pop("rows"), **doc) + "\n"
    io.atomic_write_text(out, text)
    io.atomic_write_text(out.with_suffix(".md"), markdown(json.loads(text)))
    print(f"wrote {out} and {out.with_suffix('.md')} ({doc['seconds']:.0f} s)")
    met = [t["met"] for t in doc["targets"] if t["met"] is not None]
    print(f"targets met: {sum(met)} of {len(met)}")
    failed = [n for n, p in doc["parts"].items() if p["status"] in ("failed", "error", "timeout")]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
