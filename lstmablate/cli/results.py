"""The commands that read runs back: ``compare``, ``report``, ``list`` (what can be run),
``visualize`` and ``plot``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional

import typer

from ..console import err, escape, out, print_listing
from ..errors import UserError
from .options import DATA_DIR_HELP, PLAIN_HELP, significance_option


def compare(
    runs_a: str = typer.Argument(..., metavar="RUNS_A", help="A run folder, a folder of run "
                                 "folders (runs/EXPERIMENT/CELL: every seed) or a quoted glob."),
    runs_b: str = typer.Argument(..., metavar="RUNS_B", help="The same, for the other side."),
    split: str = typer.Option("test", "--split", metavar="SPLIT", help="dev or test."),
    metric: Optional[str] = typer.Option(None, "--metric", metavar="NAME", help="Default: the "
                                         "task's primary metric, else the first it scores per item."),
    test: str = significance_option("--test"),
    resamples: Optional[int] = significance_option("--resamples"),
    seed: int = significance_option("--seed"),
    level: float = significance_option("--level"),
    as_json: bool = typer.Option(False, "--json", help="Print the comparison as JSON."),
) -> None:
    """Is A different from B beyond noise? A paired permutation test over test items for each
    pair of runs (their scores files) with its bootstrap interval, Almost Stochastic Order over
    seeds (5 or more on each side), each side's spread. A side is the seeds of one cell.

    Examples:

    lstmablate compare runs/dyck-demo/lstm-srnn/seed-1 runs/dyck-demo/lstm/seed-1
    lstmablate compare runs/dyck-demo/lstm-gates runs/dyck-demo/lstm --metric wcpa_mean
    lstmablate compare 'runs/ptb-small/lstm*/seed-1' runs/ptb-small/gru --json
    """
    from ..results.compare import compare as run_compare, render, side_runs, to_json

    c = run_compare(side_runs(runs_a), side_runs(runs_b), split=split, metric_name=metric,
                    n_samples=resamples, seed=seed, level=level, test=test)
    if as_json:
        out.print_json(json.dumps(to_json(c), default=str))
        return
    sys.stdout.write(render(c))


def report(
    runs_dir: Path = typer.Argument(Path("runs"), metavar="RUNS_DIR", help="Root of the runs tree."),
    table: Optional[str] = typer.Option(None, "--table", metavar="NAME",
                                        help="Only this experiment, recipe or table spec."),
    cells: Optional[str] = typer.Option(
        None, "--cells", metavar="CELL,...",
        help="Only these cells, in this order: the rows of every table (and, with "
             "--significance, the comparisons of its family), the runs of csv/json."),
    fmt: str = typer.Option("markdown", "--format", "-f", metavar="FORMAT",
                            help="markdown, latex (booktabs), csv or json (csv/json: one row per run)."),
    out_file: Optional[Path] = typer.Option(None, "--out", metavar="FILE",
                                            help="Write the report to this file instead of "
                                                 "printing it (--print: both)."),
    force: bool = typer.Option(False, "--force", help="Replace the --out FILE if it exists."),
    show: bool = typer.Option(False, "--print", help="With --out: print the report too."),
    significance: bool = typer.Option(False, "--significance", help="Mark each cell better / "
                                      "worse / not distinguishable from the --against cell "
                                      "(docs/reporting.md)."),
    against: str = typer.Option("lstm", "--against", metavar="CELL", help="With --significance."),
    test: str = significance_option("--test", "With --significance: "),
    level: float = significance_option("--level", "With --significance: "),
    resamples: Optional[int] = significance_option("--resamples", "With --significance: "),
    seed: int = significance_option("--seed", "With --significance: "),
    correction: str = significance_option("--correction", "With --significance: "),
) -> None:
    """Ours (mean ± std over seeds) beside the paper's numbers, as markdown or LaTeX tables;
    or every run as a CSV/JSON row. Damaged run folders are named and skipped.

    Examples:

    lstmablate report runs --table dyck-demo
    lstmablate report runs --table table1 --format latex --out table1.tex
    lstmablate report runs --format csv > runs.csv
    lstmablate report runs --table table4 --significance

    lstmablate report runs/sst2-bilstm-max-cpu --significance --cells lstm,lstm-srnn
    """
    from ..errors import UnknownNameError
    from ..results.compare import SignificanceOptions
    from ..results.report import build_report
    from ..results.formats import FORMATS, render
    from ..runfolder import check_output

    if fmt not in FORMATS:
        raise UnknownNameError("report format", fmt, FORMATS)
    if out_file is not None:  # before any run is read
        check_output([out_file], force=force)
    # checked as they are made, with --significance or not (a bad value is never ignored)
    options = SignificanceOptions(against, level, resamples, seed, test, correction)
    if not significance:  # (with it, the report checks the cell is one of its rows)
        from ..cells import get_cell

        try:
            get_cell(against)
        except UnknownNameError as e:
            raise UserError(f"--against: {e}") from None
    rows = None
    if cells is not None:
        rows = [c.strip() for c in cells.split(",")]
        if not all(rows) or len(set(rows)) != len(rows):
            raise UserError(f"--cells {cells[:80]!r}: expected cell names separated by commas, "
                            "each once, e.g. --cells lstm,lstm-srnn.")
    with _working("testing each cell against " + against if significance else None):
        built = build_report(runs_dir, table=table,
                             significance=options if significance else None, cells=rows)
    text = render(built, fmt)
    for why in built.damaged:
        err.print(f"[yellow]warning:[/] skipped {escape(why)}", soft_wrap=True)
    if out_file:
        from ..io import atomic_write_text

        atomic_write_text(out_file, text)
        err.print(f"wrote {escape(out_file)}", soft_wrap=True)
    if out_file is None or show:
        sys.stdout.write(text)


def _working(what: str | None) -> Any:
    """On a terminal (stderr), a line that says what is being done and for how long, gone
    when it is done; elsewhere (a log, a pipe, ``what`` None) nothing."""
    import contextlib

    if what is None or not err.is_terminal:
        return contextlib.nullcontext()
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    progress = Progress(SpinnerColumn(), TextColumn(escape(what)), TimeElapsedColumn(),
                        console=err, transient=True)
    progress.add_task(what, total=None)
    return progress


def list_(
    what: str = typer.Argument(..., metavar="cells|tasks|recipes", help="What to list."),
    plain: bool = typer.Option(False, "--plain", help=PLAIN_HELP),
    resolved: Optional[str] = typer.Option(
        None, "--resolved", metavar="RECIPE",
        help="With `recipes`: one recipe (a name or a .yaml path) resolved through its base: "
             "chain and overlay, one row per value with the file it came from."),
) -> None:
    """List the registered cells, the task plugins or the shipped recipes.

    Names are never shortened; descriptions wrap.  Piped or with --plain, the listing is
    tab-separated (a header line, then one row per line).

    Examples:

    lstmablate list cells
    lstmablate list recipes --plain | cut -f1
    lstmablate list recipes --resolved secondorder-cut50-2layer-cpu
    """
    from ..errors import UnknownNameError

    kinds = ("cells", "tasks", "recipes")
    if what not in kinds:
        raise UnknownNameError("thing to list", what, kinds)
    plain_or_auto = True if plain else None
    if resolved is not None:
        if what != "recipes":
            raise UserError(f"--resolved names a recipe: it goes with `lstmablate list recipes`, "
                            f"not `list {what}`.")
        _list_resolved_recipe(resolved, plain_or_auto)
        return
    if what == "cells":
        from ..cells.describe import describe_cells

        rows = describe_cells()
        cols = list(rows[0]) if rows else ["name"]
        print_listing(cols, [[r[c] for c in cols] for r in rows], keep=("name",),
                      plain=plain_or_auto,
                      title="cells (params: one layer, one direction, input = hidden = 650)")
    elif what == "tasks":
        from ..task import available_tasks, get_task

        rows = []
        for name in available_tasks():
            cls = get_task(name)
            arrow = "↑" if cls.primary.higher_is_better else "↓"
            rows.append([name, f"{cls.primary.name} {arrow}", cls.description])
        print_listing(("name", "primary metric", "description"), rows,
                      keep=("name", "primary metric"), plain=plain_or_auto, title="tasks")
    else:
        from ..recipes import available_recipes, load_recipe

        rows = []
        for name, path in available_recipes().items():
            try:
                _, r = load_recipe(str(path))
            except UserError as e:
                rows.append([name, "invalid", str(e)])
                continue
            kind = r.get("task") or "table: " + ", ".join(r["table"].get("experiments") or [])
            rows.append([name, kind, str(r.get("description", ""))])
        print_listing(("name", "task", "description"), rows, keep=("name",), plain=plain_or_auto,
                      title="recipes")


def _list_resolved_recipe(name: str, plain: bool | None) -> None:
    """`list recipes --resolved NAME`: each value of the recipe (dotted keys, values in YAML's
    flow style) and the file of its chain that set it."""
    import yaml

    from ..recipes import explain_recipe

    layers, rows = explain_recipe(name)
    chain = " <- ".join(layer.source for layer in reversed(layers))

    def shown(value: Any) -> str:
        text = yaml.safe_dump(value, default_flow_style=True, width=1 << 30, allow_unicode=True)
        return text.strip().removesuffix("...").strip()  # (a scalar ends with a document end)

    print_listing(("key", "value", "from"), [[k, shown(v), src] for k, v, src in rows],
                  keep=("key", "from"), plain=plain,
                  title=f"recipe {layers[-1].path.stem} resolved through {chain}")


def visualize(
    run_dir: Path = typer.Argument(..., metavar="RUN_DIR", help="A trained run directory."),
    text: str = typer.Option(..., "--text", metavar="TEXT",
                             help="Input to visualise (the task's tokens, separated by spaces)."),
    layer: int = typer.Option(1, "--layer", metavar="N",
                              help="Encoder layer, 1 = the one reading the embeddings."),
    out_file: Path = typer.Option(Path("weights.png"), "--out", metavar="FILE.png",
                                  help="PNG to write (its CSV beside it)."),
    checkpoint: Optional[str] = typer.Option(
        None, "--checkpoint", metavar="best|last", help="Which checkpoint (default: train.test_checkpoint)."),
    data_dir: Optional[str] = typer.Option(None, "--data-dir", metavar="DIR", help=DATA_DIR_HELP),
    force: bool = typer.Option(False, "--force", help="Replace FILE.png and its CSV if they exist."),
) -> None:
    """Appendix A: the heatmap of ||w_j^t|| (the memory cell as a weighted sum of its content).

    Examples:

    lstmablate visualize runs/dyck-demo/lstm-srnn/seed-1 --text "(a (b b) a)" --out fig.png
    lstmablate visualize runs/parsing-ewt-cpu/lstm-srnn-out/seed-1 --text "The/DET stock/NOUN fell/VERB"
    """
    from ..results.visualize import visualize_run

    png, csv = visualize_run(run_dir, text, layer=layer - 1, out=out_file, checkpoint=checkpoint,
                             data_dir=data_dir, force=force)
    out.print(f"wrote {escape(png)}" + (f" and {escape(csv)}" if csv else " (a device or a pipe: "
              "the CSV beside it is not written)"), soft_wrap=True)


def plot(
    runs: list[Path] = typer.Argument(..., metavar="RUNS...",
                                      help="Run directories, or folders holding runs."),
    metric: Optional[list[str]] = typer.Option(
        None, "--metric", "-m", metavar="COLUMN", help="A column of metrics.jsonl (repeatable): a "
        "dev metric, train_loss or lr. Default: the task's primary metric and train_loss."),
    x: str = typer.Option("step", "--x", metavar="step|epoch", help="The x axis."),
    out_file: Path = typer.Option(Path("curves.png"), "--out", metavar="FILE.png|FILE.pdf",
                                  help="PNG or PDF; both are written, and the curves' CSV beside."),
    log_y: bool = typer.Option(False, "--log-y", help="Logarithmic y axis (e.g. perplexity)."),
    force: bool = typer.Option(False, "--force", help="Replace the PNG, PDF and CSV if they exist."),
) -> None:
    """Learning curves from metrics.jsonl: one colour per cell, seeds thin, their mean bold.

    Examples:

    lstmablate plot runs/dyck-demo --out curves.png
    lstmablate plot runs/ptb-small --metric ppl --x epoch --log-y --out ptb.pdf --force
    """
    from ..results.plot import plot_runs

    res = plot_runs(runs, out_file, metrics=metric or None, x=x, log_y=log_y, force=force)
    for why in res["skipped"]:
        err.print(f"[yellow]warning:[/] skipped {escape(why)}", soft_wrap=True)
    written = [str(res[k]) for k in ("png", "pdf", "csv") if res[k] is not None]
    out.print(f"wrote {escape(', '.join(written[:-1]) + ' and ' if len(written) > 1 else '')}"
              f"{escape(written[-1])}" + ("" if len(written) > 1 else " (a device or a pipe: "
              "one figure, nothing beside it)"), soft_wrap=True)
