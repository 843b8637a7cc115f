"""The training step of a recipe, timed on its own task and data: what a whole run of each of
its cells costs, for ``make gpu-window`` to decide which runs fit the minutes it has.

Unlike :mod:`.models` (a PTB model on random tokens, against ``torch.nn.LSTM``), this builds
the recipe's task exactly as ``lstmablate train`` does (the recipe's config for each cell,
its data, its vocabularies, its model and optimiser), and times optimiser steps on the
batches of its first epoch: the task's loss, backward, gradient clipping at the recipe's
``clip_norm`` and the optimiser's step.  It also measures what a run spends besides its
steps: reading the data (``setup_s``) and one evaluation of the dev split (``eval_s``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from lstmablate.cells.encoder import Encoder
from lstmablate.data import resolve_data_dir
from lstmablate.recipes import load_recipe, resolve_config
from lstmablate.run.runner import build_model, make_task, resource_guard, seed_everything
from lstmablate.task import get_task
from lstmablate.train.optim import build_optimizer
from lstmablate.train.position import data_generator

from .measure import _path, _sync, kernel_table, precision_in_effect
from .options import check_cells, check_device, check_repeats


def recipe_task(recipe: str, cells: list[str] | None, data_dir: str | None,
                dev_split: bool) -> tuple[str, Any, list[str], Any, Any, float]:
    """A recipe's task set up once for timing its cells' steps: (the recipe's name, its task
    class, the cells -- those asked for, checked, or the recipe's --, the task with its data
    read and vocabularies built from the first cell's config, the first epoch's batch plan,
    the seconds that took). ``dev_split`` reads the dev split too (for an evaluation)."""
    name, spec = load_recipe(recipe)
    task_cls = get_task(str(spec["task"]))
    cells = check_cells(cells) or list(spec["cells"])
    t0 = time.perf_counter()
    first = resolve_config(task_cls, cells[0], recipe=recipe)
    task = make_task(first, resolve_data_dir(data_dir), None)
    task.use_artefacts(task.build_artefacts())
    task.setup(("train", task.dev_split) if dev_split else ("train",))
    setup_s = time.perf_counter() - t0
    return name, task_cls, cells, task, task.train_plan(0, data_generator(first.seed, 0)), setup_s


def bench_task_steps(recipe: str, cells: list[str] | None = None, device: str = "cpu",
                     data_dir: str | None = None, steps: int = 20, warmup: int = 5,
                     deadline: float | None = None,
                     progress: Callable[[str], None] | None = None) -> list[dict]:
    """Seconds per training step of ``recipe`` per cell (default: the recipe's ``cells``).

    Returns one dict per cell with ``kind="step"``: recipe, task, cell, kernel, device,
    precision, ms (median of ``steps`` timed steps after ``warmup``), ms_min, tokens (per
    step, the task's count), tokens_per_s, steps_per_epoch (the first epoch's batches),
    epochs (``train.max_epochs``), run_steps (the steps of a whole run: epochs x
    steps_per_epoch, or ``train.max_steps`` where that is fewer), gpu_ms (on CUDA the time
    the GPU was busy per step, by the profiler; None elsewhere), setup_s (reading the data
    and building the vocabularies, once for the recipe), eval_s (one evaluation of the dev
    split with the first cell's model).  No cell is started after ``deadline`` (a
    ``time.time()``)."""
    check_repeats(steps, "steps")
    dev = check_device(device)
    name, task_cls, cells, task, plan, setup_s = recipe_task(recipe, cells, data_dir, dev_split=True)
    rows: list[dict] = []
    eval_s = None
    for cell in cells:
        if deadline is not None and time.time() >= deadline:
            break
        cfg = resolve_config(task_cls, cell, recipe=recipe)
        with resource_guard(f"timing {name}'s training step with {cell} on {dev}"):
            seed_everything(cfg.seed)
            model = build_model(task, cfg).to(dev).train()
            step = _train_step(task, model, cfg, plan, dev)
            if progress:
                progress(f"{name} {cell}: {warmup} + {steps} steps")
            for _ in range(warmup):
                step()
            times, tokens = [], []
            for _ in range(steps):
                _sync(dev)
                t = time.perf_counter()
                tokens.append(step())
                _sync(dev)
                times.append(time.perf_counter() - t)
            gpu_ms = kernel_table(step, dev, steps=3)[1] if dev.type == "cuda" else None
            if eval_s is None:
                _sync(dev)
                t = time.perf_counter()
                model.eval()
                with torch.no_grad():
                    task.evaluate(model, task.dev_split)
                model.train()
                _sync(dev)
                eval_s = time.perf_counter() - t
        ms = statistics.median(times) * 1e3
        n_tokens = statistics.mean(float(t) for t in tokens)
        epochs = int(cfg.train.max_epochs)
        run_steps = epochs * len(plan)
        if cfg.train.max_steps:
            run_steps = min(run_steps, int(cfg.train.max_steps))
        encoder = next((m for m in model.modules() if isinstance(m, Encoder)), None)
        rows.append(dict(
            kind="step", recipe=name, task=cfg.task, cell=cell,
            kernel=_path(encoder, dev, torch.float32, False) if encoder is not None else "?",
            device=dev.type, precision=precision_in_effect(dev), ms=ms,
            ms_min=min(times) * 1e3, tokens=n_tokens, tokens_per_s=n_tokens / (ms / 1e3),
            steps_per_epoch=len(plan), epochs=epochs, run_steps=run_steps, gpu_ms=gpu_ms,
            setup_s=round(setup_s, 2), eval_s=round(eval_s, 3), repeats=steps))
        del model, step
    return rows


def _train_step(task: Any, model: torch.nn.Module, cfg: Any, plan: Any,
                dev: torch.device) -> Callable[[], float]:
    """One optimiser step of the trainer's kind on the plan's next batch (cycling); returns
    the step's tokens (the task's count, read once the step is timed)."""
    optimizer = build_optimizer(cfg.train, model)
    state: dict[str, Any] = {"carry": task.init_carry(model), "i": 0}
    clip = float(cfg.train.clip_norm)

    def step() -> float:
        batch = task.batch_to(plan[state["i"] % len(plan)], dev)
        state["i"] += 1
        optimizer.zero_grad(set_to_none=True)
        out = task.loss(model, batch, state["carry"])
        out.loss.backward()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        state["carry"] = out.carry
        return out.tokens if out.tokens is not None else out.weight

    return step
