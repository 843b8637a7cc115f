"""Library entry points behind ``lstmablate train`` and ``lstmablate eval``.

``train_run`` resolves the config (before touching data), prepares the run
directory, builds (or, on resume, loads) the task's artefacts, seeds
python/numpy/torch, loads the data and builds the model with the cell bound
into ``make_encoder``, trains, and writes ``result.json``.  ``evaluate_run``
rebuilds the same model from a run directory — its saved artefacts and only the
split asked for — and recomputes the final metrics from a checkpoint.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import random
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console
from lstmablate.console import escape

from lstmablate.cells import build_encoder, get_cell
from lstmablate.cells.kernels.interface import kernel_record, reset_kernel_record
from lstmablate.config import RunConfig, with_eval_overrides
from lstmablate.recipes import resolve_config
from lstmablate.data import resolve_data_dir
from lstmablate.errors import CheckpointError, ConfigError, DataError, RunDirError, UserError
from .runlock import RunLock, lock_holder
from .scores import reference_digest, write_scores
from .record import Run, RunStart, inspect_run_dir, make_task, split_name
from . import twins
from .runs import (RunFiles, RunResult, check_out_dir, clear_run_dir, read_artefacts,
                   remove_interrupted_writes, write_artefacts, write_config, write_env, write_result)
from lstmablate.task import Task, get_task
from lstmablate.train import Trainer
from lstmablate.train import distributed
from lstmablate.io import atomic_write, environment, is_stream
from lstmablate.runfolder import check_output, entry_problem
from lstmablate.limits import (check_float, check_threads,  # noqa: F401 - (re-exported: sweep, cli)
                               max_threads)
from lstmablate.train.checkpoint import check_model_state, load_checkpoint
from lstmablate.train.precision import Precision, check_precision, in_effect, path_note
from lstmablate.threads import ThreadChoice, choose_threads
from lstmablate.train.position import data_generator
from lstmablate.train.saving import check_resume_checkpoint


#: the longest ``--log-interval``, in seconds: a day (a progress line a day reports nothing)
MAX_LOG_INTERVAL = 86_400.0

#: what to do about a damaged checkpoint of a run being resumed: only what continues the run
#: (``eval`` of the other checkpoint is advice for ``eval``, not for ``train --resume``)
RESUME_HINT = "`--force` starts this run again from scratch (replacing the damaged file)."


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
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    return DETERMINISM_NOTE


def check_device_name(name: str, option: str = "--device") -> str:
    """``name`` if it names a device a run may use (cpu, cuda, cuda:N, auto), whether or not
    this machine has one (a sweep submitted to Slurm names the GPUs of the cluster's nodes)."""
    if not isinstance(name, str) or not re.fullmatch(r"auto|cpu|cuda(?::[0-9]{1,4})?", name):
        shown = repr(name) if len(str(name)) <= 40 else f"{str(name)[:40]!r}..."
        raise UserError(f"{option} must be cpu, cuda, cuda:N or auto, got {shown}.")
    return name


def pick_device(name: str) -> torch.device:
    """The torch device ``--device`` names (cpu, cuda, cuda:N or auto), checked before anything
    runs: a misspelt name, CUDA on a build or machine without it, or a GPU index this machine
    does not have is a UserError naming ``--device`` (``train``, ``eval`` and ``bench``)."""
    check_device_name(name)
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError("--device cuda was asked for, but this PyTorch build sees no CUDA GPU "
                        f"(torch {torch.__version__}). Use --device cpu, or install a CUDA build "
                        "of PyTorch (see the README, 'GPU').")
    count = torch.cuda.device_count() if name.startswith("cuda:") else 0
    if name.startswith("cuda:") and int(name[5:]) >= count:
        raise UserError(f"--device {name}: this machine has {count} CUDA GPU(s), "
                        f"cuda:0 to cuda:{count - 1}.")
    return torch.device(name)


def set_threads(threads: int | None) -> ThreadChoice:
    """``threads`` for this process's PyTorch, or, left out, the default of
    :func:`lstmablate.threads.choose_threads` (the cores this process may use less the
    machine's load, at least one; ``OMP_NUM_THREADS`` if the user set it).  Returns the
    choice, which says why (the run's start line shows it)."""
    check_threads(threads)
    choice = choose_threads(threads)
    if choice.threads:
        torch.set_num_threads(choice.threads)
    return choice


@contextlib.contextmanager
def resource_guard(what: str) -> Iterator[None]:
    """Running out of memory (or of stack, in a reader of nested data) while ``what`` is a
    one-paragraph UserError instead of a traceback."""
    try:
        yield
    except MemoryError:
        raise UserError(f"out of memory while {what}. Lower what sets the memory (the batch size, "
                        "the hidden size, the number of layers, the beam size) or use a machine "
                        "with more memory; a training run keeps its last checkpoint "
                        "(continue it with --resume).") from None
    except RuntimeError as e:
        text = str(e)
        if not any(k in text for k in ("can't allocate memory", "out of memory",
                                       "not enough memory", "Cannot allocate memory")):
            raise
        raise UserError(f"out of memory while {what} ({text.splitlines()[0][:200]}). Lower what "
                        "sets the memory (the batch size, the hidden size, the number of layers, "
                        "the beam size) or use a machine with more memory; a training run keeps "
                        "its last checkpoint (continue it with --resume).") from None
    except RecursionError:
        raise UserError(f"Python's recursion limit was reached while {what}: an input nests too "
                        "deeply (it is damaged, or not what the task reads).") from None


def use_artefacts(task: Task, artefacts: dict[str, Any], files: RunFiles) -> None:
    """``task.use_artefacts``, with artefacts the task cannot use (a key missing, a value of
    the wrong type: a damaged or foreign run folder) reported as a DataError naming them."""
    try:
        task.use_artefacts(artefacts)
    except UserError:
        raise
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
        raise DataError(
            f"the artefacts in {files.artefacts} do not fit the {task.name} task "
            f"({type(e).__name__}: {e}); the run folder is damaged or was not written by this "
            f"task. Copy the run folder {files.root} again from where it came from, or train "
            "the run again with the same `lstmablate train` command plus --force.") from None


def load_model_state(model: torch.nn.Module, state: Any, path: Path, hint: str = "") -> None:
    """Load a checkpoint's model state; a state that does not fit the model built from the
    run's config and artefacts (names, shapes, finite weights: :func:`check_model_state`) is
    a CheckpointError naming the file, checked before the model is touched."""
    check_model_state(state, model, path, hint)
    model.load_state_dict(state)


def check_train_batches(task: Task, cfg: RunConfig) -> None:
    """The training split gives at least one batch (checked before anything is written)."""
    plan = task.train_plan(0, data_generator(cfg.seed, 0))
    if len(plan) == 0:
        raise DataError(f"the training data of the {cfg.task} task give no batch with this "
                        "config (the training split is empty, or every example is filtered out "
                        "or larger than a batch); check the data and the data.* options.")


def run_splits(task: Task, cfg: RunConfig) -> tuple[str, ...]:
    """The splits a training run reads."""
    splits = ["train", task.dev_split]
    if cfg.train.eval_test and task.test_split:
        splits.append(task.test_split)
    return tuple(dict.fromkeys(splits))


def run_artefacts(task: Task, files: RunFiles, new_run: bool = False) -> tuple[dict[str, Any], bool]:
    """(the run's artefacts, whether they were built now): those saved with the run, else
    (a new run, or a run folder from before artefacts existed) built from the training data;
    the caller saves built ones of a new run (evaluation writes nothing)."""
    saved = None if new_run else read_artefacts(files)
    return (saved, False) if saved is not None else (task.build_artefacts(), True)


def build_model(task: Task, cfg: RunConfig) -> torch.nn.Module:
    return task.build_model(functools.partial(build_encoder, cfg.cell))


@dataclass
class TrainOutcome:
    run_dir: Path
    result: RunResult | None  # None: interrupted
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
    check_threads(threads)
    check_float(log_interval, "--log-interval", 0, MAX_LOG_INTERVAL, low_open=True,
                hint="(seconds between the progress lines of a log file or a pipe; the default "
                     "is 30)")
    check_out_dir(out)
    cfg = resolve_config(task_cls, cell, recipe=recipe, overrides=overrides, seed=seed,
                         experiment=experiment)
    if tensorboard:  # before anything is written
        from lstmablate.train.tensorboard import require_tensorboard

        require_tensorboard()
    dev = pick_device(device)
    check_precision(cfg.train.precision, dev)  # e.g. tf32 on a CPU: refused before any write
    slow = path_note(cfg.train.precision, dev)  # bf16 / fp16 on a CPU: which path, and why
    if slow:
        console.print(f"[yellow]note:[/] {escape(slow)}", highlight=False, soft_wrap=True)
    with resource_guard(f"running {cfg.experiment}/{cfg.cell}/seed-{cfg.seed}"):
        return _start(cfg, dev, out, threads, resume, force, data_dir, console, progress,
                      deterministic, tensorboard, log_interval)


def _start(cfg: RunConfig, dev: torch.device, out: Path, threads: int | None, resume: bool,
           force: bool, data_dir: str | None, console: Console, progress: bool | None,
           deterministic: bool, tensorboard: bool, log_interval: float) -> TrainOutcome:
    chosen = set_threads(threads)
    note = set_deterministic(dev) if deterministic else None
    if note:
        console.print(note, highlight=False)
    dist = distributed.setup(dev)  # a no-op unless launched by torchrun
    try:
        outcome = _run_in_group(cfg, distributed.device_for(dev, dist), dist, out, resume, force,
                                data_dir, console, progress, note, tensorboard, log_interval,
                                chosen)
    except BaseException:
        distributed.cleanup(dist, finished=False)
        raise
    # every rank finished its training: they leave the group together (an interrupted rank
    # leaves at once: the others may have stopped at another step, or not at all)
    distributed.cleanup(dist, finished=not outcome.interrupted)
    return outcome


def _run_in_group(cfg: RunConfig, dev: torch.device, dist: distributed.DistInfo, out: Path,
                  resume: bool, force: bool, data_dir: str | None, console: Console,
                  progress: bool | None, note: str | None, tensorboard: bool,
                  log_interval: float, threads: ThreadChoice | None = None) -> TrainOutcome:
    """The run of ``_start`` once this process has its place in the group (``note``: what
    ``--deterministic`` set, recorded in env.json)."""
    if not dist.is_main:
        console, progress = Console(file=io.StringIO()), False
    files = RunFiles.of(out, cfg.experiment, cfg.cell, cfg.seed)
    data_path = resolve_data_dir(data_dir)
    task_obj = make_task(cfg, data_path, files.root)
    # Everything that can be checked is checked before the run directory is written:
    # the directory's state, the checkpoint to resume, the data, the model.
    start = inspect_run_dir(files, cfg, resume=resume, force=force) if dist.is_main else \
        RunStart(resume=resume and files.last.exists(), replace=False)
    checkpoint = None  # last.pt, read once (other ranks read it in the trainer)
    if start.resume and dist.is_main:  # a checkpoint of another run is refused here
        checkpoint = load_checkpoint(files.last, expect=cfg.checkpoint_key(), hint=RESUME_HINT)
    artefacts, built = run_artefacts(task_obj, files, new_run=not start.resume)
    seed_everything(cfg.seed)
    use_artefacts(task_obj, artefacts, files)
    task_obj.setup(run_splits(task_obj, cfg))
    check_train_batches(task_obj, cfg)
    model = build_model(task_obj, cfg)
    if checkpoint is not None:  # every part of it fits this run's model and optimiser
        check_resume_checkpoint(checkpoint, files.last, cfg.train, model, hint=RESUME_HINT)
        if files.best.exists():  # the final evaluation may load it: checked now, not hours later
            best = load_checkpoint(files.best, expect=cfg.checkpoint_key(), hint=RESUME_HINT)
            check_model_state(best.get("model"), model, files.best, RESUME_HINT)
    lock = RunLock(files.root).acquire() if dist.is_main else None  # one writer per run
    env: dict[str, Any] | None = None
    try:
        if lock is not None:
            if inspect_run_dir(files, cfg, resume=resume, force=force) != start:
                raise RunDirError(f"{files.root} changed while this run was starting; run the "
                                  "command again.")
            if start.replace:
                clear_run_dir(files)
            remove_interrupted_writes(files)  # what a kill -9 in the middle of a write left
            write_config(files, cfg)
            env = environment(dev, torch.get_num_threads())
            env["world_size"] = dist.world_size
            env["deterministic"] = note
            env["precision"] = in_effect(cfg.train.precision, dev)
            write_env(files, env, resume=start.resume)
            if built:
                write_artefacts(files, artefacts)
        distributed.barrier(dist)
        reset_kernel_record()
        return _train(cfg, task_obj, model, files, dev, dist, start, checkpoint, console, progress,
                      tensorboard, log_interval, threads)
    finally:
        if env is not None:  # however training ended: which path each cell took, what failed
            record_kernels(files, env)
        if lock is not None:  # (the OS releases it too, however the process ends)
            lock.release()


def record_kernels(files: RunFiles, env: dict[str, Any]) -> None:
    """Add to the run's ``env.json`` (``env``: what was written at its start) the record of
    its cells' kernel paths: the calls per cell and path, and every fallback of a GPU path
    (``interface.kernel_record``).  A failed write is let go: it is a diagnostic record, and
    the run's outcome (or its error) is what the user must see."""
    with contextlib.suppress(OSError):
        write_env(files, {**env, "kernels": kernel_record()})


def _train(cfg: RunConfig, task_obj: Task, model: torch.nn.Module, files: RunFiles,
           dev: torch.device, dist: Any, start: RunStart, checkpoint: dict[str, Any] | None,
           console: Console, progress: bool | None, tensorboard: bool = False,
           log_interval: float = 30.0, threads: ThreadChoice | None = None) -> TrainOutcome:
    task_cls = type(task_obj)
    n_params = sum(p.numel() for p in model.parameters())
    # the threads and, where the default chose them, why (the cores and the load)
    why = f" ({threads.reason})" if threads is not None and threads.source == "default" else ""
    console.print(f"[bold]{escape(cfg.experiment)}[/] task={cfg.task} cell={cfg.cell} seed={cfg.seed} "
                  f"params={n_params:,} device={dev} threads={torch.get_num_threads()}{why} -> "
                  f"{escape(files.root)}", soft_wrap=True)
    trainer = Trainer(cfg.train, task_obj, model, files, seed=cfg.seed, device=dev,
                      identity=cfg.checkpoint_key(), console=console, progress=progress, dist_info=dist,
                      tensorboard=cfg.to_dict() if tensorboard else None, log_interval=log_interval)
    t0 = time.time()
    res = trainer.fit(resume=start.resume, checkpoint=checkpoint)
    if res.interrupted:
        console.print(f"interrupted; continue with the same command plus --resume "
                      f"(run directory {escape(files.root)}).", soft_wrap=True)
        return TrainOutcome(files.root, None, True)
    result = RunResult(
        **cfg.checkpoint_key(), recipe=cfg.recipe, primary=task_cls.primary.name,
        higher_is_better=task_cls.primary.higher_is_better, best=res.best, test=res.test,
        dev_final=res.dev_final, test_checkpoint=cfg.train.test_checkpoint, steps=res.steps,
        epochs=res.epochs_completed, train_time_s=round(res.train_time_s, 2),
        train_cpu_s=None if res.train_cpu_s is None else round(res.train_cpu_s, 2),
        wall_time_s=round(time.time() - t0, 2), params=n_params,
        skipped_nonfinite=res.skipped_nonfinite,
        # max_steps shortens a run unless the protocol itself is a number of steps (Parser-v1)
        shortened=bool(cfg.train.max_steps) and cfg.train.max_steps < task_cls.train_defaults.get(
            "max_steps", float("inf")),
        world_size=dist.world_size)
    if dist.is_main:  # the scores first: a run with a result.json has its scores files
        for split, records in res.items.items():
            metrics = res.test if split == task_obj.test_split else res.dev_final
            write_run_scores(files, cfg, split, cfg.train.test_checkpoint, metrics or {}, records,
                             task_obj.reference_items(split))
        write_result(files, result)
    shown = ", ".join(f"{task_obj.metric_name(k)} {task_obj.format_metric(k, v)}"
                      for k, v in (res.test or {}).items())
    console.print(f"[bold green]done[/] {escape(files.root)}: test {escape(shown)}", soft_wrap=True)
    return TrainOutcome(files.root, result, False)


def write_run_scores(files: RunFiles, cfg: RunConfig, split: str, checkpoint: str,
                     metrics: dict[str, float], records: list[dict[str, Any]],
                     reference: Sequence[str] | None = None) -> Path:
    """``scores/<split>.jsonl.gz`` of the run: ``records`` of the final evaluation of ``split``
    with ``checkpoint``'s weights, which reported ``metrics``; ``reference``, the split's gold
    items (``Task.reference_items``), is recorded as its sha256.  The split's file as runs
    wrote it before scores were compressed, if the run has one, goes once this one is written
    (it would hold the same evaluation, or an older one)."""
    files.own_folder(RunFiles.SCORES)  # a real folder of the run, never a link out of it
    path = files.scores(split)
    write_scores(path, {"task": cfg.task, "experiment": cfg.experiment, "cell": cfg.cell,
                        "seed": cfg.seed, "split": split, "checkpoint": checkpoint,
                        "metrics": metrics,
                        "reference": reference_digest(reference) if reference else None}, records)
    files.scores_before(split).unlink(missing_ok=True)
    return path


def checkpoint_file(files: RunFiles, checkpoint: str) -> Path:
    """The file ``--checkpoint`` names in the run folder: best or last, else a UserError."""
    path = files.checkpoint(checkpoint)
    if path is None:
        raise UserError(f"--checkpoint must be best or last, got {checkpoint!r}")
    return path


def load_run_model(run_path: Path, checkpoint: str | None = None, data_dir: str | None = None,
                   device: str = "cpu", splits: tuple[str, ...] = (),
                   eval_overrides: list[str] | None = None) -> tuple[RunConfig, Task, torch.nn.Module]:
    """Rebuild a run's task (its saved artefacts, the data of ``splits`` only) and model,
    and load a checkpoint into the model (default: the one its test numbers use)."""
    run = Run.open(run_path)
    cfg, files = with_eval_overrides(run.config, eval_overrides or []), run.files
    ckpt_path = checkpoint_file(files, checkpoint if checkpoint is not None
                                else cfg.train.test_checkpoint)
    if ckpt_path.exists() and not ckpt_path.is_file() and not ckpt_path.is_dir():
        # (a FIFO would be waited on forever, a device read forever: refused as `train
        # --resume` refuses it; a directory is load_checkpoint's own message)
        raise CheckpointError(f"{entry_problem(ckpt_path)}. Nothing was read.")
    holder = lock_holder(files.root)
    if holder and not ckpt_path.exists():  # checkpoints are written atomically: never half
        raise CheckpointError(f"{ckpt_path} does not exist yet: the run is being trained by "
                              f"{holder}. Evaluate it once it has saved its first checkpoint.")
    seed_everything(cfg.seed)
    task = make_task(cfg, resolve_data_dir(data_dir), files.root)
    splits = tuple(split_name(task, s) for s in splits)
    # before any data is read
    ckpt = load_checkpoint(ckpt_path, expect=twins.checkpoint_key(files, cfg),
                           hint=files.checkpoint_hint(ckpt_path))
    use_artefacts(task, run_artefacts(task, files)[0], files)
    task.setup(splits)
    model = build_model(task, cfg)
    load_model_state(model, ckpt.get("model"), ckpt_path, hint=files.checkpoint_hint(ckpt_path))
    model.to(pick_device(device)).eval()
    return cfg, task, model


def evaluate_run(run_path: Path, split: str = "test", checkpoint: str | None = None,
                 data_dir: str | None = None, device: str = "cpu",
                 eval_overrides: list[str] | None = None,
                 write_predictions: Path | None = None,
                 threads: int | None = None, force: bool = False) -> dict[str, float]:
    """A run's final metrics on ``split`` from a checkpoint (``evaluate(final=True)``); with
    ``write_predictions``, the task writes its predictions there in its official scorer's
    format and the metrics are those computed from that file (never over a run's own files;
    an existing file only with ``force``)."""
    return evaluate_run_task(run_path, split, checkpoint, data_dir, device, eval_overrides,
                             write_predictions, threads, force)[1]


def evaluate_run_task(run_path: Path, split: str = "test", checkpoint: str | None = None,
                      data_dir: str | None = None, device: str = "cpu",
                      eval_overrides: list[str] | None = None,
                      write_predictions: Path | None = None,
                      threads: int | None = None,
                      force: bool = False) -> tuple[Task, dict[str, float]]:
    """:func:`evaluate_run`, also returning the run's task (it knows how its metrics read)."""
    check_threads(threads)
    if write_predictions is not None:  # before anything is read or computed
        check_output([write_predictions], option="--write-predictions", force=force)
    with resource_guard(f"evaluating {run_path}"):
        set_threads(threads)
        cfg, task, model = load_run_model(run_path, checkpoint, data_dir, device, splits=(split,),
                                          eval_overrides=eval_overrides)
        name = split_name(task, split)
        amp = evaluation_precision(cfg, model)
        with amp.products(), torch.no_grad(), amp.autocast():
            if write_predictions is not None:
                metrics = _write_predictions(task, model, name, Path(write_predictions))
            else:
                metrics = task.evaluate(model, name, final=True)
    return task, {k: float(v) for k, v in metrics.items()}


def _write_predictions(task: Task, model: torch.nn.Module, split: str, path: Path
                       ) -> dict[str, Any]:
    """The task's predictions written to ``path`` and the metrics computed from that file;
    ``path`` a device or a pipe (``--write-predictions /dev/null``, ``>(gzip > p.gz)``): the
    file is made and scored in a temporary folder, then copied into it (the companions some
    tasks write beside it, such as NMT's ``.bleu``, stay in that folder and are not kept)."""
    if not is_stream(path):
        return task.write_predictions(model, split, path)
    import shutil
    import tempfile

    with tempfile.TemporaryDirectory(prefix="lstmablate-predictions-") as folder:
        made = Path(folder) / "predictions"
        metrics = task.write_predictions(model, split, made)

        def copy(f: Any) -> None:
            with open(made, "rb") as src:
                shutil.copyfileobj(src, f, 1 << 20)

        atomic_write(path, copy)
    return metrics


def evaluation_precision(cfg: RunConfig, model: torch.nn.Module) -> Precision:
    """The precision an evaluation of a run computes in: the run's ``train.precision`` (so
    its final numbers are recomputed as they were made), or fp32 on a device that cannot run
    it (tf32 off CUDA, a dtype this device's autocast lacks)."""
    first = next(model.parameters(), None)
    device = first.device if first is not None else torch.device("cpu")
    try:
        return Precision(cfg.train.precision, device)
    except ConfigError:
        return Precision("fp32", device)


@dataclass
class ScoredRun:
    """What ``lstmablate eval RUN --scores`` did: the file, the metrics of the evaluation,
    the same metrics recomputed from the file, and the run's result.json numbers."""

    path: Path
    task: Task
    split: str
    checkpoint: str
    metrics: dict[str, float]
    recomputed: dict[str, float]
    reported: dict[str, float]


def score_run(run_path: Path, split: str = "test", data_dir: str | None = None,
              device: str = "cpu", threads: int | None = None) -> ScoredRun:
    """Write ``scores/<split>.jsonl.gz`` for a finished run: the final evaluation of ``split``
    item by item, with the checkpoint its result.json's test numbers came from and the eval
    options it was trained with.  Writes nothing else but the run's lock file, held meanwhile
    (it names this command), so no training of the same run starts while it runs."""
    check_threads(threads)
    run = Run.open(run_path)
    files, result = run.files, run.result
    if result is None:
        raise UserError(f"{run_path} has no {RunFiles.RESULT}: the run is not finished. Its final "
                        "evaluation writes the scores file when it finishes (continue it with "
                        "the same `lstmablate train` command plus --resume).")
    checkpoint = str(result.test_checkpoint or "best")
    ckpt_path = files.checkpoint(checkpoint)
    if ckpt_path is None or not ckpt_path.exists():
        raise CheckpointError(f"{run_path}: {RunFiles.RESULT}'s test numbers come from the "
                              f"{checkpoint!r} checkpoint, which is not in the run folder "
                              f"({ckpt_path.name if ckpt_path else checkpoint + '.pt'}); without "
                              "it the scores cannot be computed.")
    with resource_guard(f"scoring {run_path}"), RunLock(files.root):
        set_threads(threads)
        cfg, task, model = load_run_model(files.root, checkpoint, data_dir, device, splits=(split,))
        name = split_name(task, split)
        amp = evaluation_precision(cfg, model)
        with amp.products(), torch.no_grad(), amp.autocast():
            metrics, records = task.evaluate_items(model, name)
        if records is None:
            raise UserError(f"the {cfg.task} task does not score test items one by one (its "
                            "plugin has no evaluate_items hook), so it has no scores file.")
        metrics = {k: float(v) for k, v in metrics.items()}
        path = write_run_scores(files, cfg, name, checkpoint, metrics, records,
                                task.reference_items(name))
    recomputed = {k: m.of(records) for k, m in task.item_metrics().items()}
    return ScoredRun(path, task, name, checkpoint, metrics, recomputed, run.reported(name))
