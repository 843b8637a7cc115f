"""gpu-check's ``step-capture`` stage: each task's paper-size training step timed eagerly
(``off``) and compiled or captured (``compile``, ``graphs``: ``train.step_capture``,
``lstmablate/train/capture.py``), on the recipe's own task and data, through the trainer's
own step; and what ``make gpu-window`` plans with: the faster mode of each recipe and cell
(:func:`fastest`).

Per recipe (:data:`CAPTURE_RECIPES`, or gpu-check's ``--step-recipe``), per cell (the
recipe's, or ``--cell``) and mode, a fresh model and trainer (``Trainer.prepare_steps``: the
deferred host reads of a CUDA run, the shapes chosen from the first epoch) take the first
:data:`BATCHES` batches of the first epoch once as a warm-up (where every chosen shape is
compiled or recorded: ``warm_s``), then ``steps`` more, timed: ``ms`` is their mean (a mix of
the epoch's shapes, as a run's), ``gpu_ms`` the GPU's busy time per step (profiler, CUDA).
A recipe whose data are missing is named in the stage's outcome (not a failure).  This module
imports only the standard library at its top (``window`` reads :func:`fastest` before anything is installed).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

#: each task's paper-size training recipe (one whose data are absent is skipped, named)
CAPTURE_RECIPES = ("ptb-medium", "nmt-multi30k", "parsing-ewt", "sst5-bilstm-max", "squad-drqa",
                   "secondorder-word-2layer", "bwb-lstm-2048-512")
MODES = ("off", "graphs", "compile")
#: the first batches of the epoch a unit steps through (a warm-up pass, then timed steps)
BATCHES = 16
#: the NMT target of docs/performance.md: the best mode's tokens/s over the eager step's, and
#: the GPU busy for at least this share of the best mode's step
NMT_SPEEDUP, NMT_BUSY = 2.5, 0.70


def bench_capture_steps(recipe: str, cells: list[str] | None = None, device: str = "cuda",
                        data_dir: str | None = None, modes: tuple[str, ...] = MODES,
                        steps: int = 20, deadline: float | None = None,
                        progress: Callable[[str], None] | None = None) -> Iterator[dict]:
    """Rows ``kind="capture-step"`` (recipe, task, cell, mode, ms, tokens_per_s, gpu_ms,
    warm_s, the capture's record, steps_per_epoch, epochs, run_steps) for each cell and mode
    of ``recipe``, each yielded as soon as it is measured (a stage ended at its deadline
    keeps the rows it made); no unit starts after ``deadline`` (a ``time.time()``)."""
    import torch  # (this module is imported by the window before anything is installed)

    from lstmablate.recipes import resolve_config
    from lstmablate.run.runner import build_model, resource_guard, seed_everything
    from lstmablate.run.runs import RunFiles
    from lstmablate.train.trainer import Trainer

    from .measure import _sync, kernel_table
    from .options import check_device, check_repeats
    from .steps import recipe_task

    check_repeats(steps, "steps")
    dev = check_device(device)
    name, task_cls, cells, task, plan, setup_s = recipe_task(recipe, cells, data_dir, dev_split=False)
    sample = [plan[i] for i in range(min(BATCHES, len(plan)))]
    for cell in cells:
        for mode in modes:
            if deadline is not None and time.time() >= deadline:
                return
            if mode == "graphs" and dev.type != "cuda":
                continue  # (CUDA graphs exist on a GPU only)
            cfg = resolve_config(task_cls, cell, recipe=recipe,
                                 overrides=[f"train.step_capture={mode}"])
            torch._dynamo.reset()  # every unit compiles afresh, within its own limits
            with resource_guard(f"timing {name}'s step with {cell} ({mode}) on {dev}"), \
                    tempfile.TemporaryDirectory(prefix="capture-steps-") as tmp:
                seed_everything(cfg.seed)
                model = build_model(task, cfg).to(dev).train()
                trainer = Trainer(cfg.train, task, model, RunFiles(Path(tmp)), seed=cfg.seed,
                                  device=dev, identity={}, progress=False)
                trainer.prepare_steps()
                trainer.carry = task.init_carry(model)
                if progress:
                    progress(f"{name} {cell} {mode}: {len(sample)} warm-up + {steps} steps")
                _sync(dev)
                t = time.perf_counter()
                for batch in sample:  # compiles / records every chosen shape
                    trainer.train_step(batch)
                _sync(dev)
                warm_s = time.perf_counter() - t
                tokens0 = trainer._acc.tokens_seen()
                _sync(dev)
                t = time.perf_counter()
                for i in range(steps):
                    trainer.train_step(sample[i % len(sample)])
                _sync(dev)
                seconds = time.perf_counter() - t
                tokens = (trainer._acc.tokens_seen() - tokens0) / steps
                gpu_ms = kernel_table(_cycle(trainer, sample), dev, steps=3)[1] \
                    if dev.type == "cuda" else None
                record = trainer.capture.record()
            ms = seconds / steps * 1e3
            epochs = int(cfg.train.max_epochs)
            run_steps = epochs * len(plan)
            if cfg.train.max_steps:
                run_steps = min(run_steps, int(cfg.train.max_steps))
            if progress:
                progress(f"{name} {cell} {mode}: {ms:.2f} ms/step"
                         + (f", fell back: {record['fallback']}" if record["fallback"] else ""))
            yield dict(kind="capture-step", recipe=name, task=cfg.task, cell=cell, mode=mode,
                       device=dev.type, ms=ms, tokens=tokens, tokens_per_s=tokens / (ms / 1e3),
                       gpu_ms=gpu_ms, warm_s=round(warm_s, 2), setup_s=round(setup_s, 2),
                       steps_per_epoch=len(plan), epochs=epochs, run_steps=run_steps,
                       repeats=steps, capture=record)


def _cycle(trainer: Any, batches: list) -> Callable[[], None]:
    """One training step per call, through ``batches`` in turn."""
    state = {"i": 0}

    def step() -> None:
        trainer.train_step(batches[state["i"] % len(batches)])
        state["i"] += 1
    return step


def fastest(step_rows: list[dict], capture_rows: list[dict]) -> list[dict]:
    """The ``steps`` stage's rows, each made as fast as its recipe's and cell's fastest mode of
    the ``step-capture`` stage measured (its time scaled by that mode's speed-up over ``off``
    in the same stage, its GPU time by the same; ``step_capture`` names the mode, which the
    window's runs then set): what the window planner reads."""
    by: dict[tuple[str, str], dict[str, dict]] = {}
    for r in capture_rows:
        if r.get("kind") == "capture-step" and not (r.get("capture") or {}).get("fallback"):
            by.setdefault((r["recipe"], r["cell"]), {})[r["mode"]] = r
    out = []
    for row in step_rows:
        modes = by.get((row.get("recipe"), row.get("cell")), {})
        off = modes.get("off")
        best = min((r for m, r in modes.items() if m != "off"), key=lambda r: r["ms"],
                   default=None)
        if off is None or best is None or best["ms"] >= off["ms"]:
            out.append(row)
            continue
        speed = off["ms"] / best["ms"]
        faster = dict(row, ms=row["ms"] / speed, tokens_per_s=row["tokens_per_s"] * speed,
                      step_capture=best["mode"], capture_speedup=round(speed, 3))
        if row.get("gpu_ms") and best.get("gpu_ms") and off.get("gpu_ms"):
            faster["gpu_ms"] = row["gpu_ms"] * best["gpu_ms"] / off["gpu_ms"]
        out.append(faster)
    return out


def targets(rows: list[dict]) -> list[dict]:
    """The step targets of docs/performance.md these rows measure: per cell of the NMT recipe,
    the fastest mode's tokens/s >= 2.5x the eager step's and its GPU busy >= 70 %."""
    out: list[dict] = []
    by: dict[tuple[str, str], dict[str, dict]] = {}
    for r in rows:
        if r.get("kind") == "capture-step":
            by.setdefault((r["recipe"], r["cell"]), {})[r["mode"]] = r
    for (recipe, cell), modes in by.items():
        off = modes.get("off")
        best = min(modes.values(), key=lambda r: r["ms"])
        if off is None or not recipe.startswith("nmt"):
            continue
        speed = off["ms"] / best["ms"]
        out.append(dict(target=f"{cell} {recipe} step ({best['mode']}) >= {NMT_SPEEDUP}x the "
                        f"eager step's tokens/s", measured=round(speed, 3), needed=NMT_SPEEDUP,
                        met=speed >= NMT_SPEEDUP))
        if best.get("gpu_ms"):
            busy = best["gpu_ms"] / best["ms"]
            out.append(dict(target=f"{cell} {recipe} step ({best['mode']}): GPU busy >= "
                            f"{NMT_BUSY:.0%}", measured=round(busy, 3), needed=NMT_BUSY,
                            met=busy >= NMT_BUSY))
    return out


def markdown_rows(rows: list[dict]) -> list[str]:
    """The ``step-capture`` rows as one Markdown table (gpu-check's record)."""
    steps = [r for r in rows if r.get("kind") == "capture-step"]
    if not steps:
        return []
    off = {(r["recipe"], r["cell"]): r["ms"] for r in steps if r["mode"] == "off"}
    out = ["| recipe | cell | step_capture | ms/step | x off | tokens/s | GPU busy | warm-up s "
           "| shapes, replays, eager | fell back |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in steps:
        c = r.get("capture") or {}
        base = off.get((r["recipe"], r["cell"]))
        cells = [r["recipe"], r["cell"], r["mode"], f"{r['ms']:.2f}",
                 f"{base / r['ms']:.2f}" if base else "", f"{r['tokens_per_s']:,.0f}",
                 f"{r['gpu_ms'] / r['ms']:.0%}" if r.get("gpu_ms") else "", f"{r['warm_s']:.1f}",
                 f"{c.get('captures', 0)}, {c.get('replays', 0)}, {c.get('eager', 0)}",
                 c.get("fallback") or ""]
        out.append("| " + " | ".join(cells) + " |")
    return out + [""]
