"""``lstmablate train`` and ``lstmablate eval``: one run trained, one run evaluated (or its
per-item scores written)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from ..console import err, escape, out, print_listing
from ..errors import UserError
from .options import DATA_DIR_HELP, DEVICE_HELP, THREADS_HELP, out_dir_path


def train(
    task: str = typer.Option(..., "--task", "-t", metavar="TASK",
                             help="Task plugin (`lstmablate list tasks`), e.g. dyck, ptb."),
    cell: str = typer.Option("lstm", "--cell", "-c", metavar="CELL",
                             help="Registered cell (`lstmablate list cells`)."),
    recipe: Optional[str] = typer.Option(None, "--recipe", "-r", metavar="NAME|FILE.yaml",
                                         help="Recipe name (`lstmablate list recipes`) or a YAML file "
                                              "(a path: it ends in .yaml or .yml, or holds a /)."),
    set_: Optional[list[str]] = typer.Option(
        None, "--set", metavar="SECTION.KEY=VALUE",
        help="Override one config value (repeatable); sections data, model, train, eval."),
    seed: Optional[int] = typer.Option(None, "--seed", metavar="N",
                                       help="Seed (default: the recipe's first, else 1)."),
    out_dir: Path = typer.Option("runs", "--out", metavar="DIR", parser=out_dir_path,
                                 help="Root of the runs tree."),
    experiment: Optional[str] = typer.Option(None, "--experiment", metavar="NAME",
                                             help="Experiment name (default: the recipe's name)."),
    device: str = typer.Option("cpu", "--device", metavar="DEVICE", help=DEVICE_HELP),
    threads: Optional[int] = typer.Option(None, "--threads", metavar="N", help=THREADS_HELP),
    resume: bool = typer.Option(False, "--resume", help="Continue an interrupted run."),
    force: bool = typer.Option(False, "--force", help="Replace whatever run is in the directory."),
    data_dir: Optional[str] = typer.Option(None, "--data-dir", metavar="DIR", help=DATA_DIR_HELP),
    deterministic: bool = typer.Option(False, "--deterministic",
                                       help="Deterministic CUDA kernels where they exist (CPU is already)."),
    tensorboard: bool = typer.Option(False, "--tensorboard", help="Also log to <run>/tensorboard "
                                     "(needs: pip install 'lstmablate\\[tensorboard]')."),
    log_interval: float = typer.Option(30.0, "--log-interval", metavar="SECONDS",
                                       help="Seconds between progress lines when the output is not "
                                            "a terminal (a log file, a pipe): more than 0, at most "
                                            "86400 (a day)."),
) -> None:
    """Train one run into OUT/EXPERIMENT/CELL/seed-N/ and print its directory.

    Ctrl-C saves the run; the same command with --resume continues it exactly.

    Examples:

    lstmablate train --task dyck --cell lstm-srnn --recipe dyck-demo --experiment quickstart
    lstmablate train --task ptb --cell lstm-srnn --recipe ptb-small --device cuda
    lstmablate train --task ptb --cell lstm-srnn --recipe ptb-small --device cuda --resume
    """
    from ..run.runner import train_run

    outcome = train_run(task, cell, recipe=recipe, overrides=set_ or [], seed=seed, out=out_dir,
                        experiment=experiment, device=device, threads=threads, resume=resume,
                        force=force, data_dir=data_dir, console=err, deterministic=deterministic,
                        tensorboard=tensorboard, log_interval=log_interval)
    if outcome.result is not None:
        out.print(escape(outcome.run_dir), soft_wrap=True)


def eval_(
    run_dir: Path = typer.Argument(..., metavar="RUN_DIR", help="A run directory (with config.yaml)."),
    split: str = typer.Option("test", "--split", metavar="SPLIT", help="dev or test."),
    checkpoint: Optional[str] = typer.Option(
        None, "--checkpoint", metavar="best|last", help="Which checkpoint (default: the one the "
        "run's test numbers use, train.test_checkpoint)."),
    set_: Optional[list[str]] = typer.Option(
        None, "--set", metavar="eval.KEY=VALUE",
        help="Evaluation option (repeatable), e.g. eval.batch_size=32."),
    write_predictions: Optional[Path] = typer.Option(
        None, "--write-predictions", metavar="FILE", help="Also write the predictions here, in "
        "the format of the task's official scorer (never into a run folder); the metrics shown "
        "are computed from that file."),
    force: bool = typer.Option(False, "--force", help="Replace the --write-predictions FILE if "
                               "it exists."),
    scores: bool = typer.Option(
        False, "--scores", help="Write the run's scores/SPLIT.jsonl.gz instead (the final evaluation "
        "item by item, for `lstmablate compare` and `report --significance`), with the checkpoint "
        "and eval options of its result.json; nothing else in the run changes."),
    device: str = typer.Option("cpu", "--device", metavar="DEVICE", help=DEVICE_HELP),
    threads: Optional[int] = typer.Option(None, "--threads", metavar="N", help=THREADS_HELP),
    data_dir: Optional[str] = typer.Option(None, "--data-dir", metavar="DIR", help=DATA_DIR_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the metrics as one JSON object."),
) -> None:
    """Recompute a run's final metrics from its checkpoint (and write its predictions).

    Examples:

    lstmablate eval runs/dyck-demo/lstm-srnn/seed-1
    lstmablate eval runs/dyck-demo/lstm-srnn/seed-1 --split dev --checkpoint last --json
    lstmablate eval RUN_DIR --set eval.batch_size=16 --write-predictions preds.jsonl
    lstmablate eval runs/dyck-demo/lstm-srnn/seed-1 --split test --scores
    """
    from ..run.runner import evaluate_run_task

    if scores:
        if checkpoint or set_ or write_predictions:
            raise UserError("--scores evaluates with the checkpoint and eval options the run's "
                            "result.json came from; leave out --checkpoint, --set and "
                            "--write-predictions (run those as a separate eval).")
        return _write_scores(run_dir, split, data_dir, device, threads, as_json)
    task, metrics = evaluate_run_task(run_dir, split=split, checkpoint=checkpoint,
                                      data_dir=data_dir, device=device, eval_overrides=set_ or [],
                                      write_predictions=write_predictions, threads=threads,
                                      force=force)
    if write_predictions is not None:
        err.print(f"wrote {escape(write_predictions)}", soft_wrap=True)
    if as_json:
        out.print_json(json.dumps(metrics))
        return
    which = f"{checkpoint}.pt" if checkpoint else "the run's test checkpoint (train.test_checkpoint)"
    err.print(f"{escape(run_dir)}: {split} split, {which}", soft_wrap=True)  # stdout: the table
    rows = [(task.metric_name(k), task.format_metric(k, v), task.metric_description(k))
            for k, v in metrics.items()]
    print_listing(("metric", "value", "meaning"), rows, keep=("metric", "value"))


def _write_scores(run_dir: Path, split: str, data_dir: Optional[str], device: str,
                  threads: Optional[int], as_json: bool) -> None:
    from ..run.runner import score_run
    from ..run.runs import RunFiles

    done = score_run(run_dir, split, data_dir=data_dir, device=device, threads=threads)
    err.print(f"wrote {escape(done.path)} ({done.split} split, {done.checkpoint}.pt)", soft_wrap=True)
    reported = done.reported or {}
    if as_json:
        out.print_json(json.dumps({"path": str(done.path), "metrics": done.metrics,
                                   "from_scores": done.recomputed, "result_json": reported}))
        return
    t = done.task
    rows = [(t.metric_name(k), t.format_metric(k, v), t.format_metric(k, done.metrics[k]),
             t.format_metric(k, reported[k]) if k in reported else "—")
            for k, v in done.recomputed.items()]
    columns = ("metric", "from the scores", "this evaluation", RunFiles.RESULT)
    print_listing(columns, rows, keep=columns)
