"""The ``lstmablate`` command line. Thin: it parses, then calls library functions.

Every :class:`~lstmablate.errors.UserError` becomes one paragraph on stderr and
exit code 2; no traceback.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from .errors import UserError

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode="rich",
                  help="Reproduce and extend the LSTM ablations of Levy et al. (ACL 2018).")
data_app = typer.Typer(no_args_is_help=True,
                       help="Data directory: where it is, checks, downloads, and the tasks' own tools.")
app.add_typer(data_app, name="data")

out = Console()
err = Console(stderr=True)
# tables too wide for 80 columns: full width when printing to a file or pipe
wide = out if out.is_terminal else Console(width=220)

DATA_DIR_HELP = "Data directory (default: $LSTMABLATE_DATA, else ./data)."


@app.command()
def train(
    task: str = typer.Option(..., "--task", "-t", help="Task plugin, e.g. dyck, ptb."),
    cell: str = typer.Option("lstm", "--cell", "-c", help="Registered cell name."),
    recipe: Optional[str] = typer.Option(None, "--recipe", "-r", help="Recipe name or YAML path."),
    set_: Optional[list[str]] = typer.Option(None, "--set", help="Override: section.key=value (repeatable)."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Seed (default: the recipe's first, else 1)."),
    out_dir: Path = typer.Option(Path("runs"), "--out", help="Root of the runs tree."),
    experiment: Optional[str] = typer.Option(None, "--experiment", help="Experiment name (default: recipe name)."),
    device: str = typer.Option("cpu", "--device", help="cpu, cuda, cuda:N or auto."),
    threads: Optional[int] = typer.Option(None, "--threads", help="torch CPU threads."),
    resume: bool = typer.Option(False, "--resume", help="Continue an interrupted run."),
    force: bool = typer.Option(False, "--force", help="Replace whatever run is in the directory."),
    data_dir: Optional[str] = typer.Option(None, "--data-dir", help=DATA_DIR_HELP),
    deterministic: bool = typer.Option(False, "--deterministic",
                                       help="Deterministic CUDA kernels where they exist (CPU is already)."),
    tensorboard: bool = typer.Option(False, "--tensorboard", help="Also log to <run>/tensorboard "
                                     "(needs: pip install 'lstmablate[tensorboard]')."),
) -> None:
    """Train one run: runs/<experiment>/<cell>/seed-<n>/."""
    from .runner import train_run

    outcome = train_run(task, cell, recipe=recipe, overrides=set_ or [], seed=seed, out=out_dir,
                        experiment=experiment, device=device, threads=threads, resume=resume,
                        force=force, data_dir=data_dir, console=err, deterministic=deterministic,
                        tensorboard=tensorboard)
    if outcome.result is not None:
        out.print(str(outcome.run_dir))


@app.command("eval")
def eval_(
    run_dir: Path = typer.Argument(..., help="A run directory (with config.yaml)."),
    split: str = typer.Option("test", "--split", help="dev or test."),
    checkpoint: Optional[str] = typer.Option(
        None, "--checkpoint", help="best or last (default: the one the run's test numbers use, "
        "train.test_checkpoint)."),
    set_: Optional[list[str]] = typer.Option(
        None, "--set", help="Evaluation option: eval.key=value (repeatable), e.g. eval.batch_size=32."),
    write_predictions: Optional[Path] = typer.Option(
        None, "--write-predictions", help="Also write the predictions here, in the format of the "
        "task's official scorer; the metrics shown are computed from that file."),
    device: str = typer.Option("cpu", "--device"),
    threads: Optional[int] = typer.Option(None, "--threads", help="torch CPU threads."),
    data_dir: Optional[str] = typer.Option(None, "--data-dir", help=DATA_DIR_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the metrics as JSON."),
) -> None:
    """Recompute a run's final metrics from its checkpoint (and write its predictions)."""
    from .runner import evaluate_run

    metrics = evaluate_run(run_dir, split=split, checkpoint=checkpoint, data_dir=data_dir,
                           device=device, eval_overrides=set_ or [],
                           write_predictions=write_predictions, threads=threads)
    if write_predictions is not None:
        err.print(f"wrote {write_predictions}", highlight=False)
    if as_json:
        out.print_json(json.dumps(metrics))
        return
    which = f"{checkpoint}.pt" if checkpoint else "the run's test checkpoint"
    table = Table(title=f"{run_dir} — {split} ({which})")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for k, v in metrics.items():
        table.add_row(k, f"{v:.4f}")
    out.print(table)


@app.command()
def report(
    runs_dir: Path = typer.Argument(Path("runs"), help="Root of the runs tree."),
    table: Optional[str] = typer.Option(None, "--table",
                                        help="Only this experiment, recipe or table spec."),
    fmt: str = typer.Option("markdown", "--format", "-f", help="markdown, latex (booktabs), "
                            "csv or json (csv/json: one row per run)."),
    out_file: Optional[Path] = typer.Option(None, "--out", help="Also write the report here."),
) -> None:
    """Ours (mean ± std over seeds) beside the paper's numbers, as markdown or LaTeX tables;
    or every run as a CSV/JSON row. Damaged run folders are named and skipped."""
    from .errors import UnknownNameError
    from .report import build_report
    from .report_formats import FORMATS, render

    if fmt not in FORMATS:
        raise UnknownNameError("report format", fmt, FORMATS)
    built = build_report(runs_dir, table=table)
    text = render(built, fmt)
    for why in built.damaged:
        err.print(f"[yellow]warning:[/] skipped {why}", highlight=False, soft_wrap=True)
    if out_file:
        from .train.atomic import atomic_write_text

        atomic_write_text(out_file, text)
    sys.stdout.write(text)


@app.command("list")
def list_(what: str = typer.Argument(..., help="cells, tasks or recipes.")) -> None:
    """List registered cells, tasks or recipes."""
    from .errors import UnknownNameError

    kinds = ("cells", "tasks", "recipes")
    if what not in kinds:
        raise UnknownNameError("thing to list", what, kinds)
    if what == "cells":
        _list_cells()
    elif what == "tasks":
        from .task import available_tasks, get_task

        t = Table(title="tasks")
        for c in ("name", "primary metric", "description"):
            t.add_column(c)
        for name in available_tasks():
            cls = get_task(name)
            arrow = "↑" if cls.primary.higher_is_better else "↓"
            t.add_row(name, f"{cls.primary.name} {arrow}", cls.description)
        out.print(t)
    else:
        from .config import available_recipes, load_recipe

        t = Table(title="recipes")
        for c in ("name", "task", "description", "file"):
            t.add_column(c)
        for name, path in available_recipes().items():
            try:
                _, r = load_recipe(str(path))
            except UserError as e:
                t.add_row(name, "[red]invalid[/]", str(e), str(path))
                continue
            kind = r.get("task") or "table: " + ", ".join(r["table"].get("experiments") or [])
            t.add_row(name, kind, str(r.get("description", "")), str(path))
        out.print(t)


def _list_cells() -> None:
    from rich.markup import escape
    try:
        from .cells.describe import describe_cells
    except ImportError:  # pragma: no cover - describe.py is optional
        describe_cells = None
    from .cells import available_cells, get_cell

    t = Table(title="cells (params at input = hidden = 650, one layer, one direction)")
    if describe_cells is None:
        for c in ("name", "family", "summary"):
            t.add_column(c)
        for name in available_cells():
            s = get_cell(name)
            t.add_row(name, s.family, s.summary)
    else:
        rows = describe_cells()
        cols = list(rows[0].keys()) if rows else []
        for c in cols:
            t.add_column(c, overflow="fold", no_wrap=(c == "name"))
        for r in rows:
            t.add_row(*(escape(str(r[c])) for c in cols))
    wide.print(t)


@data_app.command("path")
def data_path(data_dir: Optional[str] = typer.Option(None, "--data-dir", help=DATA_DIR_HELP)) -> None:
    """Print the data directory in use and how it was chosen."""
    from .data import describe_data_dir, resolve_data_dir

    path = resolve_data_dir(data_dir)
    out.print(f"{path} ({describe_data_dir(path)})", highlight=False, soft_wrap=True)


@data_app.command("check")
def data_check(
    task: Optional[str] = typer.Argument(None, help="Only this task's data."),
    data_dir: Optional[str] = typer.Option(None, "--data-dir", help=DATA_DIR_HELP),
) -> None:
    """Verify data files (presence, checksums) for one or all tasks."""
    from .data import resolve_data_dir
    from .task import available_tasks, get_task

    root = resolve_data_dir(data_dir)
    names = [task] if task else available_tasks()
    failed = False
    for name in names:
        cls = get_task(name)
        try:
            lines = cls(cls.DataConfig(), cls.ModelConfig(), root).check_data()
            out.print(f"[green]ok[/] {name}: " + "; ".join(lines))
        except UserError as e:
            if task:
                raise
            failed = True
            out.print(f"[red]FAILED[/] {name}: {e}")
    if failed:
        raise typer.Exit(2)


@data_app.command("fetch")
def data_fetch(
    dataset: str = typer.Argument(..., help="Dataset name (`lstmablate data list`)."),
    data_dir: Optional[str] = typer.Option(None, "--data-dir", help=DATA_DIR_HELP),
) -> None:
    """Download a dataset from its canonical location and verify its checksums."""
    from .data import fetch, resolve_data_dir
    from .task import available_datasets

    datasets = available_datasets()
    if dataset not in datasets:
        from .errors import UnknownNameError

        raise UnknownNameError("dataset", dataset, datasets,
                               "`lstmablate data list` shows what each task reads.")
    for p in fetch(datasets[dataset], resolve_data_dir(data_dir)):
        out.print(str(p))


@data_app.command("list")
def data_list() -> None:
    """The datasets the installed tasks read: files, source and licence."""
    from .task import available_tasks, get_task

    t = Table(title="datasets")
    for c in ("dataset", "task", "files", "source", "licence"):
        t.add_column(c, overflow="fold")
    for name in available_tasks():
        for ds in get_task(name).datasets:
            t.add_row(ds.name, name, "\n".join(f.relpath for f in ds.files), ds.url, ds.licence)
    wide.print(t)


@app.command()
def sweep(
    recipe: str = typer.Argument(..., help="A recipe with `cells` and `seeds`."),
    list_only: bool = typer.Option(False, "--list", help="Print one command per missing run."),
    out_dir: Path = typer.Option(Path("runs"), "--out"),
    set_: Optional[list[str]] = typer.Option(None, "--set", help="Override for every run."),
    threads: Optional[int] = typer.Option(None, "--threads"),
    device: str = typer.Option("cpu", "--device"),
    jobs: int = typer.Option(1, "--jobs", "-j", help="Runs at once (subprocesses)."),
    data_dir: Optional[str] = typer.Option(None, "--data-dir", help=DATA_DIR_HELP),
) -> None:
    """Run every (cell, seed) of a recipe that is not finished; resume interrupted ones."""
    from .sweep import plan_sweep, run_sweep

    plan = plan_sweep(recipe, out_dir, overrides=set_ or [], threads=threads, device=device,
                      data_dir=data_dir)
    if list_only:
        for item in plan:
            if not item.finished:
                out.print(item.command, highlight=False, soft_wrap=True)
        return
    run_sweep(plan, console=err, jobs=jobs)


@app.command()
def bench(
    cells: Optional[list[str]] = typer.Option(None, "--cell", help="Only these cells (repeatable)."),
    shapes: Optional[list[str]] = typer.Option(None, "--shape",
                                               help="ptb-200, ptb-650, parser-400 or BxTxHxL[xbi]."),
    threads: int = typer.Option(2, "--threads"),
    device: str = typer.Option("cpu", "--device"),
    repeats: int = typer.Option(7, "--repeats"),
    quick: bool = typer.Option(False, "--quick", help="Fewer shapes and repeats."),
    models: bool = typer.Option(True, "--models/--no-models", help="Also PTB training tokens/s."),
    model_sizes: Optional[list[str]] = typer.Option(
        None, "--model-size", help="PTB model sizes for --models: small (default), medium, large."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of the table."),
) -> None:
    """Forward+backward tokens/s and memory per cell against torch.nn.LSTM, same process."""
    from . import bench as b

    for size in model_sizes or []:  # before anything is timed
        if size not in b.MODEL_SIZES:
            raise UserError(f"--model-size {size!r}: expected one of {', '.join(b.MODEL_SIZES)}")
    note = (lambda msg: err.print(msg, highlight=False)) if not as_json else None
    rows = b.bench_cells(cells or None, shapes or None, threads=threads, device=device,
                         repeats=repeats, quick=quick, progress=note)
    if models:
        for size in model_sizes or ["small"]:
            rows += b.bench_models(cells or None, threads=threads, device=device, quick=quick,
                                   size=size, progress=note)
    if as_json:
        sys.stdout.write(b.to_json(rows) + "\n")
    else:
        wide.print(b.render(rows))


@app.command()
def visualize(
    run_dir: Path = typer.Argument(..., help="A trained run directory."),
    text: str = typer.Option(..., "--text", help="Input to visualise (task-specific tokens)."),
    layer: int = typer.Option(0, "--layer", help="Encoder layer (0-based)."),
    out_file: Path = typer.Option(Path("weights.png"), "--out", help="PNG to write (CSV beside it)."),
    checkpoint: Optional[str] = typer.Option(
        None, "--checkpoint", help="best or last (default: train.test_checkpoint)."),
    data_dir: Optional[str] = typer.Option(None, "--data-dir", help=DATA_DIR_HELP),
) -> None:
    """Appendix A: heatmap of ||w_j^t|| (the memory cell as a weighted sum)."""
    from .visualize_run import visualize_run

    png, csv = visualize_run(run_dir, text, layer=layer, out=out_file, checkpoint=checkpoint,
                             data_dir=data_dir)
    out.print(f"wrote {png} and {csv}")


def _add_plugin_commands() -> None:
    """Task plugins' own ``lstmablate data ...`` subcommands: each entry point of the
    ``lstmablate.commands`` group names a ``register(data_app)`` function."""
    import warnings
    from importlib.metadata import entry_points

    for ep in entry_points(group="lstmablate.commands"):
        try:
            ep.load()(data_app)
        except Exception as e:  # noqa: BLE001 - a broken plugin must not take the CLI down
            warnings.warn(f"data commands of plugin {ep.name!r} ({ep.value}) failed to load and "
                          f"were skipped: {type(e).__name__}: {e}", RuntimeWarning, stacklevel=2)


_add_plugin_commands()


@app.command()
def plot(
    runs: list[Path] = typer.Argument(..., help="Run directories, or folders holding runs."),
    metric: Optional[list[str]] = typer.Option(
        None, "--metric", "-m", help="A column of metrics.jsonl (repeatable): a dev metric, "
        "train_loss or lr. Default: the task's primary metric and train_loss."),
    x: str = typer.Option("step", "--x", help="step or epoch."),
    out_file: Path = typer.Option(Path("curves.png"), "--out",
                                  help="PNG or PDF; both are written, and the curves' CSV beside."),
    log_y: bool = typer.Option(False, "--log-y", help="Logarithmic y axis (e.g. perplexity)."),
) -> None:
    """Learning curves from metrics.jsonl: one colour per cell, seeds thin, their mean bold."""
    from .plot import plot_runs

    res = plot_runs(runs, out_file, metrics=metric or None, x=x, log_y=log_y)
    for why in res["skipped"]:
        err.print(f"[yellow]warning:[/] skipped {why}", highlight=False, soft_wrap=True)
    out.print(f"wrote {res['png']}, {res['pdf']} and {res['csv']}", highlight=False)


def main(argv: list[str] | None = None) -> None:
    try:
        app(args=argv, standalone_mode=True)
    except UserError as e:
        # soft wrap: no line break inside a path or a suggested command (they stay copyable)
        err.print(f"[bold red]error:[/] {e}", highlight=False, soft_wrap=True)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:  # before training started (the trainer saves and exits cleanly)
        err.print("interrupted; no training step was lost (a run saves its progress once it has "
                  "started training, and `--resume` continues it).", highlight=False)
        sys.exit(130)
    except OSError as e:  # the file system refused: read-only, full, a file where a directory goes
        where = f" ({e.filename})" if e.filename else ""
        err.print(f"[bold red]error:[/] the operating system refused a file operation{where}: "
                  f"{e.strerror or e}. Files already written were written atomically and are "
                  "intact; fix the cause and run the same command again.", highlight=False)
        sys.exit(2)


if __name__ == "__main__":  # pragma: no cover
    main()
