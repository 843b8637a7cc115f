"""Library entry points behind ``lstmablate train`` and ``lstmablate eval``.

``train_run`` resolves the config (before touching data), prepares the run
directory, builds (or, on resume, loads) the task's artefacts, seeds
python/numpy/torch, loads the data and builds the model with the cell bound
into ``make_encoder``, trains, and writes ``result.json``.  ``evaluate_run``
rebuilds the same model from a run directory — its saved artefacts and only the
split asked for — and recomputes the final metrics from a checkpoint.
"""

from __future__ import annotations

import functools
import io
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from rich.console import Console
from .console import escape

from .cells import build_encoder, get_cell
from .config import RunConfig, config_from_dict, resolve_config, with_eval_overrides
from .data import resolve_data_dir
from .errors import CheckpointError, ConfigError, RunDirError, UserError
from .runlock import RunLock, lock_holder
from .runs import (RunFiles, RunStart, clear_run_dir, environment, inspect_run_dir, read_artefacts,
                   read_json, run_dir, write_artefacts, write_config, write_env, write_result)
from .task import Task, get_task
from .train import Trainer
from .train import distributed
from .train.checkpoint import load_checkpoint


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


DETERMINISM_NOTE = (
    "deterministic mode: torch.use_deterministic_algorithms(True, warn_only=True), "
    "cudnn.deterministic=True, cudnn.benchmark=False, CUBLAS_WORKSPACE_CONFIG=:4096:8. "
    "What this cannot promise on CUDA: ops without a deterministic kernel only warn (see the log); "
    "results still differ across GPU models, driver/cuDNN/PyTorch versions and numbers of GPUs; "
    "cuDNN's fused RNN kernels are deterministic only with these settings and the same hardware. "
    "On CPU, runs are deterministic without this flag.")


def set_deterministic(device: torch.device) -> str:
    """Ask PyTorch/cuDNN for deterministic kernels; returns what was (and was not) promised."""
    import os

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    return DETERMINISM_NOTE


def pick_device(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError("--device cuda was asked for, but this PyTorch build sees no CUDA GPU "
                        f"(torch {torch.__version__}). Use --device cpu, or install a CUDA build "
                        "of PyTorch (see the README, 'GPU').")
    if name not in ("cpu",) and not name.startswith("cuda"):
        raise UserError(f"unknown device {name!r}; use cpu, cuda, cuda:N or auto.")
    return torch.device(name)


def identity(cfg: RunConfig) -> dict[str, Any]:
    """What a checkpoint must match to belong to a run."""
    return {"task": cfg.task, "cell": cfg.cell, "experiment": cfg.experiment, "seed": cfg.seed}


def make_task(cfg: RunConfig, data_dir: Path, run_dir: Path | None) -> Task:
    """The task object of a run (its data is not loaded yet)."""
    return get_task(cfg.task)(cfg.data, cfg.model, data_dir, seed=cfg.seed, eval_cfg=cfg.eval,
                              run_dir=run_dir)


def run_splits(task: Task, cfg: RunConfig) -> tuple[str, ...]:
    """The splits a training run reads."""
    splits = ["train", task.dev_split]
    if cfg.train.eval_test and task.test_split:
        splits.append(task.test_split)
    return tuple(dict.fromkeys(splits))


def run_artefacts(task: Task, files: RunFiles) -> dict[str, Any]:
    """The artefacts saved with a run; for a run folder from before artefacts existed, built
    again from the training data (and not saved: evaluation writes nothing)."""
    saved = read_artefacts(files)
    return saved if saved is not None else task.build_artefacts()


def build_model(task: Task, cfg: RunConfig) -> torch.nn.Module:
    return task.build_model(functools.partial(build_encoder, cfg.cell))


@dataclass
class TrainOutcome:
    run_dir: Path
    result: dict[str, Any] | None
    interrupted: bool


def train_run(
    task: str,
    cell: str,
    *,
    recipe: str | None = None,
    overrides: list[str] | None = None,
    seed: int | None = None,
    out: Path = Path("runs"),
    experiment: str | None = None,
    device: str = "cpu",
    threads: int | None = None,
    resume: bool = False,
    force: bool = False,
    data_dir: str | None = None,
    console: Console | None = None,
    progress: bool | None = None,
    deterministic: bool = False,
    tensorboard: bool = False,
    log_interval: float = 30.0,
) -> TrainOutcome:
    console = console or Console(stderr=True)
    task_cls = get_task(task)
    get_cell(cell)  # unknown cell: fail before anything else
    cfg = resolve_config(task_cls, cell, recipe=recipe, overrides=overrides, seed=seed,
                         experiment=experiment)
    if tensorboard:  # before anything is written
        from .train.tensorboard import require_tensorboard

        require_tensorboard()
    dev = pick_device(device)
    if threads:
        torch.set_num_threads(threads)
    note = set_deterministic(dev) if deterministic else None
    if note:
        console.print(note, highlight=False)
    dist = distributed.setup(dev)  # a no-op unless launched by torchrun
    dev = distributed.device_for(dev, dist)
    if not dist.is_main:
        console, progress = Console(file=io.StringIO()), False
    files = RunFiles(run_dir(out, cfg.experiment, cfg.cell, cfg.seed))
    data_path = resolve_data_dir(data_dir)
    task_obj = make_task(cfg, data_path, files.root)
    # Everything that can be checked is checked before the run directory is written:
    # the directory's state, the checkpoint to resume, the data, the model.
    start = inspect_run_dir(files, cfg, resume=resume, force=force) if dist.is_main else \
        RunStart(resume=resume and files.last.exists(), replace=False)
    checkpoint = None  # last.pt, read once (other ranks read it in the trainer)
    if start.resume and dist.is_main:  # a checkpoint of another run is refused here
        checkpoint = load_checkpoint(files.last, expect=identity(cfg), hint=(
            "`--force` starts this run again from scratch (replacing the damaged file)."))
    saved = read_artefacts(files) if start.resume else None
    artefacts = saved if saved is not None else task_obj.build_artefacts()
    seed_everything(cfg.seed)
    task_obj.use_artefacts(artefacts)
    task_obj.setup(run_splits(task_obj, cfg))
    model = build_model(task_obj, cfg)
    lock = RunLock(files.root).acquire() if dist.is_main else None  # one writer per run
    try:
        if lock is not None:
            if inspect_run_dir(files, cfg, resume=resume, force=force) != start:
                raise RunDirError(f"{files.root} changed while this run was starting; run the "
                                  "command again.")
            if start.replace:
                clear_run_dir(files)
            write_config(files, cfg)
            env = environment(dev, torch.get_num_threads())
            env["world_size"] = dist.world_size
            env["deterministic"] = note
            write_env(files, env, resume=start.resume)
            if saved is None:
                write_artefacts(files, artefacts)
        distributed.barrier(dist)
        return _train(cfg, task_obj, model, files, dev, dist, start, checkpoint, console, progress,
                      tensorboard, log_interval)
    finally:
        if lock is not None:  # (the OS releases it too, however the process ends)
            lock.release()


def _train(cfg: RunConfig, task_obj: Task, model: torch.nn.Module, files: RunFiles,
           dev: torch.device, dist: Any, start: RunStart, checkpoint: dict[str, Any] | None,
           console: Console, progress: bool | None, tensorboard: bool = False,
           log_interval: float = 30.0) -> TrainOutcome:
    task_cls = type(task_obj)
    n_params = sum(p.numel() for p in model.parameters())
    console.print(f"[bold]{escape(cfg.experiment)}[/] task={cfg.task} cell={cfg.cell} seed={cfg.seed} "
                  f"params={n_params:,} device={dev} threads={torch.get_num_threads()} -> "
                  f"{escape(files.root)}", soft_wrap=True)
    trainer = Trainer(cfg.train, task_obj, model, files.root, seed=cfg.seed, device=dev,
                      identity=identity(cfg), console=console, progress=progress, dist_info=dist,
                      tensorboard=cfg.to_dict() if tensorboard else None, log_interval=log_interval)
    t0 = time.time()
    res = trainer.fit(resume=start.resume, checkpoint=checkpoint)
    if res.interrupted:
        console.print(f"interrupted; continue with the same command plus --resume "
                      f"(run directory {escape(files.root)}).", soft_wrap=True)
        return TrainOutcome(files.root, None, True)
    result = {
        **identity(cfg),
        "recipe": cfg.recipe,
        "primary": task_cls.primary.name,
        "higher_is_better": task_cls.primary.higher_is_better,
        "best": res.best,
        "dev": res.best.get("dev"),
        "test": res.test,
        **({"dev_final": res.dev_final} if res.dev_final is not None else {}),
        "test_checkpoint": cfg.train.test_checkpoint,
        "steps": res.steps,
        "epochs": res.epochs_completed,
        "train_time_s": round(res.train_time_s, 2),
        "wall_time_s": round(time.time() - t0, 2),
        "params": n_params,
        "skipped_nonfinite": res.skipped_nonfinite,
        # max_steps shortens a run unless the protocol itself is a number of steps (Parser-v1)
        "shortened": bool(cfg.train.max_steps) and cfg.train.max_steps < task_cls.train_defaults.get(
            "max_steps", float("inf")),
        "world_size": dist.world_size,
    }
    if dist.is_main:
        write_result(files, result)
    shown = ", ".join(f"{task_obj.metric_name(k)} {task_obj.format_metric(k, v)}"
                      for k, v in (res.test or {}).items())
    console.print(f"[bold green]done[/] {escape(files.root)}: test {escape(shown)}", soft_wrap=True)
    return TrainOutcome(files.root, result, False)


def load_run_config(run_path: Path) -> RunConfig:
    files = RunFiles(Path(run_path))
    if not files.config.exists():
        raise ConfigError(f"{run_path} is not a run directory (no config.yaml).")
    try:
        raw = yaml.safe_load(files.config.read_text(encoding="utf-8"))
    except yaml.YAMLError:
        raise ConfigError(f"{files.config} is not valid YAML.") from None
    task_cls = get_task(raw.get("task", ""))
    return config_from_dict(task_cls, raw, str(files.config))


def load_run_model(run_path: Path, checkpoint: str | None = None, data_dir: str | None = None,
                   device: str = "cpu", splits: tuple[str, ...] = (),
                   eval_overrides: list[str] | None = None) -> tuple[RunConfig, Task, torch.nn.Module]:
    """Rebuild a run's task (its saved artefacts, the data of ``splits`` only) and model,
    and load a checkpoint into the model (default: the one its test numbers use)."""
    cfg = with_eval_overrides(load_run_config(run_path), eval_overrides or [])
    files = RunFiles(Path(run_path))
    checkpoint = checkpoint or cfg.train.test_checkpoint
    ckpt_path = {"best": files.best, "last": files.last}.get(checkpoint)
    if ckpt_path is None:
        raise UserError(f"--checkpoint must be best or last, got {checkpoint!r}")
    holder = lock_holder(files.root)
    if holder and not ckpt_path.exists():  # checkpoints are written atomically: never half
        raise CheckpointError(f"{ckpt_path} does not exist yet: the run is being trained by "
                              f"{holder}. Evaluate it once it has saved its first checkpoint.")
    seed_everything(cfg.seed)
    task = make_task(cfg, resolve_data_dir(data_dir), files.root)
    splits = tuple(_split_name(task, s) for s in splits)
    task.use_artefacts(run_artefacts(task, files))
    task.setup(splits)
    model = build_model(task, cfg)
    ckpt = load_checkpoint(ckpt_path, expect=identity(cfg))
    model.load_state_dict(ckpt["model"])
    model.to(pick_device(device)).eval()
    return cfg, task, model


def _split_name(task: Task, split: str) -> str:
    valid = {"dev": task.dev_split, "test": task.test_split,
             task.dev_split: task.dev_split, task.test_split: task.test_split}
    if split not in valid:
        raise UserError(f"--split must be dev or test (this task calls them "
                        f"{task.dev_split!r} and {task.test_split!r}), got {split!r}")
    return valid[split]


def evaluate_run(run_path: Path, split: str = "test", checkpoint: str | None = None,
                 data_dir: str | None = None, device: str = "cpu",
                 eval_overrides: list[str] | None = None,
                 write_predictions: Path | None = None) -> dict[str, float]:
    """A run's final metrics on ``split`` from a checkpoint (``evaluate(final=True)``); with
    ``write_predictions``, the task writes its predictions there in its official scorer's
    format and the metrics are those computed from that file."""
    cfg, task, model = load_run_model(run_path, checkpoint, data_dir, device, splits=(split,),
                                      eval_overrides=eval_overrides)
    return evaluate_model(task, model, split, write_predictions=write_predictions)


def evaluate_model(task: Task, model: torch.nn.Module, split: str,
                   write_predictions: Path | None = None) -> dict[str, float]:
    """:func:`evaluate_run` on a run already loaded (:func:`load_run_model`)."""
    name = _split_name(task, split)
    with torch.no_grad():
        if write_predictions is not None:
            metrics = task.write_predictions(model, name, Path(write_predictions))
        else:
            metrics = task.evaluate(model, name, final=True)
    return {k: float(v) for k, v in metrics.items()}


def read_result(run_path: Path) -> dict[str, Any]:
    return read_json(RunFiles(Path(run_path)).result)
