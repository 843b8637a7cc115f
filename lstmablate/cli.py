"""The ``lstmablate`` command line. Thin: it parses, then calls library functions.

Every :class:`~lstmablate.errors.UserError` becomes one paragraph on stderr and
exit code 2; no traceback.  Help texts are rich markup: a literal square bracket is
written ``\\[``; messages built from data are escaped (:func:`lstmablate.console.escape`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional

import typer
from typer.core import TyperCommand, TyperGroup

from .console import err, escape, out, print_listing
from .errors import UserError


class Interrupted(Exception):
    """Ctrl-C in a command before a training run had saved anything (a training run that has
    started handles Ctrl-C itself: it saves last.pt and says how to continue)."""


def _help_params(params: list[Any]) -> list[Any]:
    """The parameters as help shows them: no type placeholder after a flag (``--resume``, not
    ``--resume <bool>``), arguments by their metavar, a value placeholder from the option's
    name where none is given (commands and groups alike: ``lstmablate --version``)."""
    for p in params:
        if getattr(p, "param_type_name", "") == "argument":
            # the metavar names it already; Typer would add a type column (<path>)
            p.display_type_rich = lambda ctx: None
            continue
        if getattr(p, "param_type_name", "") != "option" or getattr(p, "metavar", None) is not None:
            continue
        if getattr(p, "is_flag", False) or getattr(p, "count", False):
            p.metavar = ""
        else:
            p.metavar = (p.name or "value").upper()
    return params


class HelpCommand(TyperCommand):
    """Help that reads as a user types: no type placeholder after a flag (``--resume``, not
    ``--resume <bool>``), arguments by their metavar (``RUN_DIR``, ``[RUNS_DIR]``), a value
    placeholder from the option's name where none is given."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _help_params(super().get_params(ctx))

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for p in self.get_params(ctx):
            if getattr(p, "param_type_name", "") != "argument":
                continue
            name = p.metavar or (p.name or "arg").upper()
            name += "..." if p.nargs != 1 else ""
            pieces.append(name if p.required else f"[{name}]")
        return pieces


def out_dir_path(text: str) -> Path:
    """The value of ``--out DIR`` (the runs tree): an empty one is refused (it would mean the
    current folder without saying so)."""
    if not text.strip():
        raise UserError(f"--out {text!r} is empty; give the directory of the runs tree "
                        "(e.g. --out runs). Nothing was written.")
    return Path(text)


class Group(TyperGroup):
    """A command group (``lstmablate``, ``lstmablate data``): Ctrl-C anywhere in a command,
    from the parsing of its options on, reaches :func:`main` as :class:`Interrupted` (Typer
    would turn a KeyboardInterrupt into an exit 130 without a word)."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _help_params(super().get_params(ctx))  # (`--version`, not `--version <bool>`)

    def make_context(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().make_context(*args, **kwargs)
        except KeyboardInterrupt:
            raise Interrupted from None

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:  # (a command that handles Ctrl-C itself never lets it out)
            raise Interrupted from None


class App(typer.Typer):
    """A Typer whose commands (the plugins' ``data`` subcommands too) use :class:`HelpCommand`,
    in groups of the class :class:`Group`."""

    def __init__(self, **kwargs: Any):
        super().__init__(cls=Group, **kwargs)

    def command(self, *args: Any, cls: Any = None, **kwargs: Any) -> Any:
        return super().command(*args, cls=cls or HelpCommand, **kwargs)


def _version(value: bool) -> None:
    if not value:
        return
    from . import __version__
    from .io import git_commit

    git = git_commit()
    where = ""
    if git.get("commit"):
        where = f" (git {git['commit'][:12]}{', uncommitted changes' if git.get('dirty') else ''})"
    out.print(f"lstmablate {__version__}{where}")
    raise typer.Exit()


app = App(add_completion=False, no_args_is_help=True, rich_markup_mode="rich",
          help="Reproduce and extend the LSTM ablations of Levy et al. (ACL 2018): train any "
               "registered cell on any task plugin, then print paper-ready tables.\n\n"
               "Start with: lstmablate list recipes; lstmablate sweep dyck-demo; "
               "lstmablate report runs --table dyck-demo")
data_app = App(no_args_is_help=True,
               help="Data directory: where it is, what is there, checks, downloads, and the "
                    "tasks' own tools.")
app.add_typer(data_app, name="data")


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version (and git commit) and exit.")) -> None:
    """Reproduce and extend the LSTM ablations of Levy et al. (ACL 2018)."""


DATA_DIR_HELP = "Data directory (default: $LSTMABLATE_DATA, else ./data)."
DEVICE_HELP = "cpu, cuda, cuda:N or auto (cuda when available)."
THREADS_HELP = ("torch CPU threads (default: the cores this process may use less the machine's "
                "load, at least 1; OMP_NUM_THREADS if set).")
PLAIN_HELP = "Tab-separated values, one row per line (the default when output is not a terminal)."


def _test_option(name: str, prefix: str = "") -> Any:
    """``--test``, ``--level``, ``--resamples``, ``--seed`` or ``--correction`` of the
    significance tests, as ``compare`` and ``report`` take them (their bounds and choices:
    lstmablate.results.compare.check_settings)."""
    default, metavar, what = {
        "--test": ("permutation", "permutation|sacrebleu", "the test over items: the paired "
                   "permutation test with the bootstrap interval, or sacreBLEU's paired "
                   "bootstrap (to quote sacreBLEU's p-values; it over-claims, docs/reporting.md)"),
        "--level": (0.05, "ALPHA", "significance level, in (0, 0.5]"),
        "--resamples": (None, "N", "shuffles or resamples, 200 to 100,000 (default: 10,000 "
                        "shuffles; sacreBLEU's 1,000 resamples with --test sacrebleu)"),
        "--seed": (12345, "N", "seed of the shuffles and resamples (sacreBLEU's default 12345)"),
        "--correction": ("holm", "holm|bh|none", "how the table's comparisons are corrected "
                         "together: Holm-Bonferroni (family-wise error), Benjamini-Hochberg "
                         "(false discovery rate) or none"),
    }[name]
    return typer.Option(default, name, metavar=metavar,
                        help=f"{prefix}{what}." if prefix else f"{what[0].upper()}{what[1:]}.")


@app.command()
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
    from .run.runner import train_run

    outcome = train_run(task, cell, recipe=recipe, overrides=set_ or [], seed=seed, out=out_dir,
                        experiment=experiment, device=device, threads=threads, resume=resume,
                        force=force, data_dir=data_dir, console=err, deterministic=deterministic,
                        tensorboard=tensorboard, log_interval=log_interval)
    if outcome.result is not None:
        out.print(escape(outcome.run_dir), soft_wrap=True)


@app.command("eval")
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
        False, "--scores", help="Write the run's scores/SPLIT.jsonl instead (the final evaluation "
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
    from .run.runner import evaluate_run_task

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
    from .run.runner import score_run
    from .run.runs import RunFiles

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


@app.command()
def compare(
    runs_a: str = typer.Argument(..., metavar="RUNS_A", help="A run folder, a folder of run "
                                 "folders (runs/EXPERIMENT/CELL: every seed) or a quoted glob."),
    runs_b: str = typer.Argument(..., metavar="RUNS_B", help="The same, for the other side."),
    split: str = typer.Option("test", "--split", metavar="SPLIT", help="dev or test."),
    metric: Optional[str] = typer.Option(None, "--metric", metavar="NAME", help="Default: the "
                                         "task's primary metric, else the first it scores per item."),
    test: str = _test_option("--test"),
    resamples: Optional[int] = _test_option("--resamples"),
    seed: int = _test_option("--seed"),
    level: float = _test_option("--level"),
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
    from .results.compare import compare as run_compare, render, side_runs, to_json

    c = run_compare(side_runs(runs_a), side_runs(runs_b), split=split, metric_name=metric,
                    n_samples=resamples, seed=seed, level=level, test=test)
    if as_json:
        out.print_json(json.dumps(to_json(c), default=str))
        return
    sys.stdout.write(render(c))


@app.command()
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
    test: str = _test_option("--test", "With --significance: "),
    level: float = _test_option("--level", "With --significance: "),
    resamples: Optional[int] = _test_option("--resamples", "With --significance: "),
    seed: int = _test_option("--seed", "With --significance: "),
    correction: str = _test_option("--correction", "With --significance: "),
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
    from .errors import UnknownNameError
    from .results.compare import SignificanceOptions
    from .results.report import build_report
    from .results.formats import FORMATS, render
    from .runfolder import check_output

    if fmt not in FORMATS:
        raise UnknownNameError("report format", fmt, FORMATS)
    if out_file is not None:  # before any run is read
        check_output([out_file], force=force)
    # checked as they are made, with --significance or not (a bad value is never ignored)
    options = SignificanceOptions(against, level, resamples, seed, test, correction)
    if not significance:  # (with it, the report checks the cell is one of its rows)
        from .cells import get_cell

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
        from .io import atomic_write_text

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


@app.command("list")
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
    from .errors import UnknownNameError

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
        from .cells.describe import describe_cells

        rows = describe_cells()
        cols = list(rows[0]) if rows else ["name"]
        print_listing(cols, [[r[c] for c in cols] for r in rows], keep=("name",),
                      plain=plain_or_auto,
                      title="cells (params: one layer, one direction, input = hidden = 650)")
    elif what == "tasks":
        from .task import available_tasks, get_task

        rows = []
        for name in available_tasks():
            cls = get_task(name)
            arrow = "↑" if cls.primary.higher_is_better else "↓"
            rows.append([name, f"{cls.primary.name} {arrow}", cls.description])
        print_listing(("name", "primary metric", "description"), rows,
                      keep=("name", "primary metric"), plain=plain_or_auto, title="tasks")
    else:
        from .recipes import available_recipes, load_recipe

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

    from .recipes import explain_recipe

    layers, rows = explain_recipe(name)
    chain = " <- ".join(layer.source for layer in reversed(layers))

    def shown(value: Any) -> str:
        text = yaml.safe_dump(value, default_flow_style=True, width=1 << 30, allow_unicode=True)
        return text.strip().removesuffix("...").strip()  # (a scalar ends with a document end)

    print_listing(("key", "value", "from"), [[k, shown(v), src] for k, v, src in rows],
                  keep=("key", "from"), plain=plain,
                  title=f"recipe {layers[-1].path.stem} resolved through {chain}")


@data_app.command("path")
def data_path(data_dir: Optional[str] = typer.Option(None, "--data-dir", metavar="DIR",
                                                     help=DATA_DIR_HELP)) -> None:
    """Print the data directory in use and how it was chosen, and whether it exists yet
    (`lstmablate data fetch` creates it). Exits with 2 when it is a file.

    Example:

    LSTMABLATE_DATA=/data/nlp lstmablate data path
    """
    from .data import describe_data_dir, resolve_data_dir

    path = resolve_data_dir(data_dir)
    missing = "" if path.is_dir() else "; it does not exist yet"
    out.print(f"{escape(path)} ({escape(describe_data_dir(path))}{missing})", soft_wrap=True)


@data_app.command("list")
def data_list(
    data_dir: Optional[str] = typer.Option(None, "--data-dir", metavar="DIR", help=DATA_DIR_HELP),
    plain: bool = typer.Option(False, "--plain", help=PLAIN_HELP + " One row per file."),
) -> None:
    """The datasets the installed tasks read: their files, which are present in the data
    directory, where they come from and their licence.

    Numbered shards are one line in shell brace notation (--plain: one row per file). A data
    directory that does not exist lists every file as missing; one that is a file exits with 2.

    Examples:

    lstmablate data list
    lstmablate data list --plain | awk -F'\\t' '$4 == "missing"'
    """
    from .run import data_status as ds
    from .data import describe_data_dir, resolve_data_dir

    root = resolve_data_dir(data_dir)
    rows = ds.presence(root)
    catalogue = ds.task_datasets()
    where = f"data directory: {escape(root)} ({escape(describe_data_dir(root))}"
    if plain or not out.is_terminal:
        if not root.is_dir():  # the one line that is not a row, for whoever reads stderr
            err.print(f"{where}; it does not exist)", soft_wrap=True)
        print_listing(("dataset", "tasks", "file", "status", "source", "licence"),
                      [[r.dataset, ", ".join(r.tasks), r.relpath, r.status,
                        catalogue[r.dataset][0].url, catalogue[r.dataset][0].licence]
                       for r in (rows if plain else _folded(rows, _presence))], plain=True)
        return
    err.print(where + ("; it does not exist)" if not root.is_dir() else ")"), soft_wrap=True)
    print_listing(("dataset", "tasks", "file", "status"),
                  _grouped(rows, lambda group: (_presence(group),)),
                  keep=("dataset", "file", "status"), plain=False)
    out.print("Sources and licences:")
    for name, (d, _) in catalogue.items():
        out.print(f"  {name}: {escape(d.url)} — {escape(d.licence)}", soft_wrap=True)


def _presence(group: list[Any]) -> str:
    """The status of a file, or of a folded group of shards (``99 of 99 present``)."""
    return (group[0].status if len(group) == 1 else
            f"{sum(r.status == 'present' for r in group)} of {len(group)} present")


def _folded(rows: list[Any], status: Any) -> list[Any]:
    """``rows`` (file statuses) with each run of numbered shards folded into one row: its
    path in shell brace notation, ``status(group)`` its status (a piped listing keeps a row
    per file only with --plain)."""
    import dataclasses

    from .run import data_status as ds

    folded, by_ds = [], {}
    for r in rows:
        by_ds.setdefault(r.dataset, []).append(r)
    for files in by_ds.values():
        index = {f.relpath: f for f in files}
        for shown, members in ds.summarise([f.relpath for f in files]):
            group = [index[m] for m in members]
            folded.append(group[0] if len(group) == 1 else
                          dataclasses.replace(group[0], relpath=shown, status=status(group),
                                              blocks=sorted({b for g in group for b in g.blocks})))
    return folded


def _grouped(rows: list[Any], columns: Any) -> list[list[str]]:
    """Table rows for file statuses: per dataset, numbered shards folded into one line
    (``columns(group)`` gives the last columns of a folded line); the dataset and its tasks
    only on its first line."""
    from .run import data_status as ds

    table: list[list[str]] = []
    by_ds: dict[str, list[Any]] = {}
    for r in rows:
        by_ds.setdefault(r.dataset, []).append(r)
    for name, files in by_ds.items():
        index = {f.relpath: f for f in files}
        for i, (shown, members) in enumerate(ds.summarise([f.relpath for f in files])):
            group = [index[m] for m in members]
            table.append([name if i == 0 else "", ", ".join(files[0].tasks) if i == 0 else "",
                          shown, *columns(group)])
    return table


@data_app.command("check")
def data_check(
    task: Optional[str] = typer.Argument(None, metavar="TASK", help="Only this task's data."),
    data_dir: Optional[str] = typer.Option(None, "--data-dir", metavar="DIR", help=DATA_DIR_HELP),
    plain: bool = typer.Option(False, "--plain", help=PLAIN_HELP + " One row per file."),
) -> None:
    """Verify the data files (presence and checksums): a line per file (numbered shards
    folded on a terminal); for what is missing or damaged, the recipes it blocks and how to
    get it (once per dataset); which recipes are ready to run.

    Exits with 2 when the data directory is a file, when a present file is damaged, or when
    TASK is given and a file its default configuration reads is missing; a data directory
    that does not exist is answered as an empty one. Piped, numbered shards are folded as on
    a terminal (--plain: one row per file).

    Examples:

    lstmablate data check
    lstmablate data check squad-drqa
    """
    from .run import data_status as ds
    from .data import describe_data_dir, resolve_data_dir
    from .task import get_task

    if task:
        get_task(task)  # an unknown task name: the usual message
    root = resolve_data_dir(data_dir)
    report = ds.check(root, task)
    rows = report.rows
    err.print(f"data directory: {escape(root)} ({escape(describe_data_dir(root))})", soft_wrap=True)

    def note(r: Any) -> str:
        return ", ".join(r.blocks) if r.status == "missing" else (r.message if not r.usable else "")

    def states(group: list[Any]) -> str:
        kinds = {r.status for r in group}
        return (group[0].status if len(kinds) == 1 else
                ", ".join(f"{sum(r.status == s for r in group)} {s}" for s in sorted(kinds)))

    if plain or not out.is_terminal:
        print_listing(("dataset", "tasks", "file", "status", "blocks / note"),
                      [[r.dataset, ", ".join(r.tasks), r.relpath, r.status, note(r)]
                       for r in (rows if plain else _folded(rows, states))], plain=True)
    else:
        def columns(group: list[Any]) -> tuple[str]:
            return (states(group),)
        print_listing(("dataset", "tasks", "file", "status"), _grouped(rows, columns),
                      keep=("dataset", "file", "status"), plain=False)
    for name, (d, _) in ds.task_datasets(task).items():
        bad = [r for r in rows if r.dataset == name and not r.usable]
        if not bad:
            continue
        what = "damaged" if any(r.damaged for r in bad) else "missing"
        blocks = sorted({b for r in bad for b in r.blocks})
        files = ", ".join(shown for shown, _ in ds.summarise([r.relpath for r in bad]))
        err.print(f"{name}: {len(bad)} of {len(d.files)} file(s) {what} ({escape(files)})"
                  + (f"; this blocks {', '.join(blocks)}" if blocks else "")
                  + f". To get them: {escape(ds.advice(d))}", soft_wrap=True)
    if all(r.usable for r in rows):
        err.print("every catalogued file is present and verified.")
    for t, names in report.ready.items():
        err.print(f"ready to run ({escape(t)}): {', '.join(names)}", soft_wrap=True)
    needed: set[str] = set()
    if task:
        cls = get_task(task)
        needed = set(cls(cls.DataConfig(), cls.ModelConfig(), root).required_files())
    damaged = [r for r in rows if r.damaged]
    if damaged:
        from .errors import DataError

        raise DataError(" ".join(r.message for r in damaged))
    if not root.is_dir():  # the same answer as an empty folder: every file is missing
        err.print("the data directory does not exist (yet), so every file is missing; the "
                  "first download creates it.", soft_wrap=True)
    missing = [r.relpath for r in rows if not r.usable and r.relpath in needed]
    if missing:
        from .errors import DataError

        shown = ", ".join(name for name, _ in ds.summarise(missing))  # (shards folded)
        raise DataError(f"task {task!r} (its default configuration) reads {shown}, "
                        "which the data directory does not hold; see above for how to get "
                        "them and which recipes are ready to run without them.")


@data_app.command("fetch")
def data_fetch(
    dataset: str = typer.Argument(..., metavar="DATASET", help="Dataset name (`lstmablate data list`)."),
    data_dir: Optional[str] = typer.Option(None, "--data-dir", metavar="DIR", help=DATA_DIR_HELP),
) -> None:
    """Download a dataset from its canonical location and verify its checksums.

    Files already present that verify are kept; a download that does not verify is never
    written. The data directory is created if it does not exist (a file there exits with 2).

    Example:

    lstmablate data fetch ptb
    """
    from .data import fetch, resolve_data_dir
    from .task import available_datasets

    datasets = available_datasets()
    if dataset not in datasets:
        from .errors import UnknownNameError

        raise UnknownNameError("dataset", dataset, datasets,
                               "`lstmablate data list` shows what each task reads.")
    for p in fetch(datasets[dataset], resolve_data_dir(data_dir),
                   log=lambda msg: err.print(escape(msg), soft_wrap=True)):
        out.print(escape(p), soft_wrap=True)


SLURM = "Slurm (--launcher slurm)"


@app.command()
def sweep(
    recipe: str = typer.Argument(..., metavar="RECIPE", help="A recipe with `cells` and `seeds`, "
                                 "or a table spec (e.g. table1)."),
    list_only: bool = typer.Option(False, "--list", help="Print one `lstmablate train` command per "
                                   "missing or interrupted run (for any scheduler), run nothing."),
    out_dir: Path = typer.Option("runs", "--out", metavar="DIR", parser=out_dir_path,
                                 help="Root of the runs tree."),
    set_: Optional[list[str]] = typer.Option(None, "--set", metavar="SECTION.KEY=VALUE",
                                             help="Override for every run (repeatable)."),
    threads: Optional[int] = typer.Option(None, "--threads", metavar="N",
                                          help="torch CPU threads per run (default: the cores "
                                               "less the machine's load, at least 1, chosen once "
                                               "for every run and divided among the --jobs)."),
    device: str = typer.Option("cpu", "--device", metavar="DEVICE", help=DEVICE_HELP),
    jobs: int = typer.Option(1, "--jobs", "-j", metavar="N",
                             help="Runs at once (subprocesses, each logging beside its run)."),
    data_dir: Optional[str] = typer.Option(None, "--data-dir", metavar="DIR", help=DATA_DIR_HELP),
    status: bool = typer.Option(False, "--status", help="Where each run stands (finished, running, "
                                "queued, interrupted, failed with its log's last lines, missing); "
                                "runs nothing."),
    launcher: str = typer.Option("local", "--launcher", metavar="local|slurm",
                                 help="local: run here; slurm: submit one Slurm array job."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the sbatch script, submit nothing.",
                                 rich_help_panel=SLURM),
    partition: Optional[str] = typer.Option(None, "--partition", rich_help_panel=SLURM,
                                            help="The partition (default: the cluster's)."),
    gpus: Optional[int] = typer.Option(None, "--gpus-per-job", metavar="N", rich_help_panel=SLURM,
                                       help="GPUs of each run (more than 1: torchrun on its node)."),
    cpus: Optional[int] = typer.Option(None, "--cpus-per-job", metavar="N", rich_help_panel=SLURM,
                                       help="CPUs of each run (its torch threads unless --threads)."),
    mem: Optional[str] = typer.Option(None, "--mem", metavar="SIZE", rich_help_panel=SLURM,
                                      help="Memory of each run, as sbatch reads it (16G)."),
    time_limit: Optional[str] = typer.Option(None, "--time", metavar="TIME", rich_help_panel=SLURM,
                                             help="Each job's limit (default 4:00:00); a run that "
                                                  "reaches it is requeued and continues."),
    account: Optional[str] = typer.Option(None, "--account", rich_help_panel=SLURM,
                                          help="The account charged."),
    qos: Optional[str] = typer.Option(None, "--qos", rich_help_panel=SLURM,
                                      help="The quality of service."),
    parallel: Optional[int] = typer.Option(None, "--array-parallelism", metavar="N",
                                           rich_help_panel=SLURM, help="Runs at once at most."),
    slurm_opt: Optional[list[str]] = typer.Option(None, "--slurm-opt", metavar="KEY=VALUE",
                                                  rich_help_panel=SLURM,
                                                  help="Another sbatch option (repeatable)."),
) -> None:
    """Run every (cell, seed) of a recipe that is not finished; resume interrupted ones.

    Running a sweep twice is harmless: finished runs are skipped.  With --launcher slurm the
    runs go to Slurm as one array job; defaults for its options can be kept in
    ~/.config/lstmablate/slurm.yaml (or $LSTMABLATE_SLURM_CONFIG).

    Examples:

    lstmablate sweep dyck-demo
    lstmablate sweep ptb-medium --device cuda --jobs 2
    lstmablate sweep table1 --list
    lstmablate sweep table1 --launcher slurm --device cuda --gpus-per-job 1 --time 12:00:00
    lstmablate sweep table1 --status
    """
    from .run import cluster
    from .run.slurm_options import check_launcher, slurm_options
    from .run.sweep import check_jobs, eval_differs_note, plan_sweep, run_sweep

    check_jobs(jobs)
    slurm = {"partition": partition, "gpus_per_job": gpus, "cpus_per_job": cpus, "mem": mem,
             "time": time_limit, "account": account, "qos": qos, "array_parallelism": parallel,
             "slurm_opts": slurm_opt}
    check_launcher(launcher, slurm, dry_run=dry_run, jobs=jobs, runs_nothing=list_only or status)
    # (checked before the sweep is planned: a bad option is refused at once)
    opts = slurm_options(slurm) if launcher == "slurm" and not (list_only or status) else None
    plan = plan_sweep(recipe, out_dir, overrides=set_ or [], threads=threads, device=device,
                      data_dir=data_dir, refuse_conflicts=not status)
    if status:
        cluster.print_status(cluster.sweep_status(plan), out, err)
        return
    note = eval_differs_note(plan)
    if note:
        err.print(f"[yellow]note:[/] {escape(note)}", highlight=False, soft_wrap=True)
    if list_only:
        missing = [item for item in plan if not item.finished]
        for item in missing:
            out.print(escape(item.command), soft_wrap=True)
        if not missing:
            err.print(f"every run of {escape(recipe)} is finished ({len(plan)} runs under "
                      f"{escape(out_dir)}); `lstmablate report {escape(out_dir)} --table "
                      f"{escape(recipe)}` prints its table.", soft_wrap=True)
        return
    if opts is not None:
        cluster.submit_sweep(plan, recipe, opts, dry_run=dry_run,
                             overrides=set_ or [], console=err, out=out)
        return
    run_sweep(plan, console=err, jobs=jobs)


@app.command()
def bench(
    cells: Optional[list[str]] = typer.Option(None, "--cell", metavar="CELL",
                                              help="Only these cells (repeatable)."),
    shapes: Optional[list[str]] = typer.Option(None, "--shape", metavar="SHAPE",
                                               help="ptb-200, ptb-650, parser-400 or BxTxHxL\\[xbi] "
                                                    "(repeatable)."),
    threads: Optional[int] = typer.Option(None, "--threads", metavar="N",
                                          help=THREADS_HELP + " The CPU targets are stated for 2."),
    device: str = typer.Option("cpu", "--device", metavar="DEVICE", help=DEVICE_HELP),
    repeats: int = typer.Option(7, "--repeats", metavar="N",
                                help="Timed repetitions per cell row (the median is reported)."),
    model_repeats: int = typer.Option(20, "--model-repeats", metavar="N",
                                      help="Timed repetitions per training-step row."),
    quick: bool = typer.Option(False, "--quick", help="Seconds, not minutes: the paper's five "
                               "cells at ptb-200, 3 rounds, no training-step rows (--cell, "
                               "--all-cells, --shape and --models add to it)."),
    all_cells: bool = typer.Option(False, "--all-cells", help="Every registered cell (the default "
                                   "without --quick)."),
    models: Optional[bool] = typer.Option(None, "--models/--no-models",
                                          help="Also PTB training tokens/s (default: yes; with "
                                               "--quick only if --model-size is given)."),
    model_sizes: Optional[list[str]] = typer.Option(
        None, "--model-size", metavar="SIZE",
        help="PTB model sizes for --models: small (default), medium, large (repeatable)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of the table."),
    out_file: Optional[Path] = typer.Option(
        None, "--out", metavar="FILE.json", help="Also keep the run as a record: the rows, the "
        "machine's matmul rate before and after, the environment (JSON), and the tables as "
        "Markdown beside it."),
    force: bool = typer.Option(False, "--force", help="Replace FILE.json and its Markdown if "
                               "they exist."),
    peers: bool = typer.Option(False, "--peers", help="Instead: the cells' own reference "
                               "implementations (the authors' sru, flashrnn, "
                               "flash-linear-attention's HGRN) beside ours and nn.LSTM, one layer "
                               "at each shape; a package not installed is a row naming it."),
) -> None:
    """Forward+backward tokens/s and memory per cell against torch.nn.LSTM, same process.

    Examples:

    lstmablate bench --quick
    lstmablate bench --quick --cell lstm-srnn --shape ptb-650
    lstmablate bench --model-size small --model-size medium --device cuda --json
    lstmablate bench --threads 2 --out benchmarks/results/cpu-2t.json
    lstmablate bench --peers --shape ptb-650 --device cuda
    """
    import torch

    from . import bench as b
    from .bench.render import WIDTH, busy_note
    from .threads import choose_threads, machine_load

    if model_sizes and models is False:
        raise UserError("--model-size chooses the sizes of the model benchmark, which "
                        "--no-models leaves out; give one or the other.")
    if all_cells and cells:
        raise UserError("--all-cells times every registered cell and --cell names some; give "
                        "one or the other.")
    models = models if models is not None else (not quick or bool(model_sizes))
    if quick and not cells and not all_cells:
        from .bench.gpu_check import paper_cells

        cells = paper_cells()
    if quick and not shapes:
        shapes = ["ptb-200"]
    chosen = choose_threads(threads)
    if chosen.threads is not None:
        threads = chosen.threads
    else:  # the user's OMP_NUM_THREADS, as PyTorch read it
        threads = torch.get_num_threads()
    sizes = (model_sizes or ["small"]) if models else []
    b.record.check_options(cells or None, shapes or None, threads=threads, device=device,
                           repeats=repeats, quick=quick, model_sizes=sizes,
                           model_repeats=model_repeats)  # before a warning or a file
    if out_file is not None:
        from .io import is_stream
        from .runfolder import check_output

        companions = [] if is_stream(out_file) else [out_file.with_suffix(".md")]
        check_output([out_file, *companions], force=force)  # before any timing
    busy = busy_note(chosen.load if chosen.load is not None else machine_load(), chosen.cores)
    if busy:
        err.print(f"[yellow]warning:[/] {escape(busy)}", soft_wrap=True)
    # progress on a terminal only (a log keeps the table alone)
    note = (lambda msg: err.print(escape(msg), soft_wrap=True)) \
        if err.is_terminal and not as_json else None
    if peers:  # the reference implementations (lstmablate/bench/peers.py)
        if out_file is not None:
            raise UserError("--out keeps a cell benchmark's record; --peers prints its table "
                            "(--json for its rows).")
        from .bench.peers import bench_peers, markdown_rows

        rows = bench_peers(shapes or None, device=device, threads=threads, repeats=repeats,
                           progress=note)
        sys.stdout.write(b.to_json(rows) + "\n" if as_json else "\n".join(markdown_rows(rows)))
        return
    rows, fields = b.record.measure(cells or None, shapes or None, threads=threads, device=device,
                                    repeats=repeats, model_repeats=model_repeats, quick=quick,
                                    model_sizes=sizes, machine_rate=out_file is not None,
                                    progress=note)
    if out_file is not None:
        written = b.record.write(out_file, rows, **fields)
        err.print(f"wrote {escape(written[0])}" + (f" and {escape(written[1])}" if written[1] else
                  " (a device or a pipe: the Markdown beside it is not written)"), soft_wrap=True)
    if as_json:
        sys.stdout.write(b.to_json(rows) + "\n")
    else:
        import io

        from rich.console import Console

        if out.is_terminal:
            Console(width=min(out.width, WIDTH), highlight=False).print(b.render(rows))
        else:  # a log or a pipe: plain text, no line padded out to the width
            text = Console(width=WIDTH, file=io.StringIO(), highlight=False, color_system=None)
            text.print(b.render(rows))
            sys.stdout.write("".join(line.rstrip() + "\n"
                                     for line in text.file.getvalue().splitlines()))


@app.command()
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
    from .results.visualize import visualize_run

    png, csv = visualize_run(run_dir, text, layer=layer - 1, out=out_file, checkpoint=checkpoint,
                             data_dir=data_dir, force=force)
    out.print(f"wrote {escape(png)}" + (f" and {escape(csv)}" if csv else " (a device or a pipe: "
              "the CSV beside it is not written)"), soft_wrap=True)


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
    from .results.plot import plot_runs

    res = plot_runs(runs, out_file, metrics=metric or None, x=x, log_y=log_y, force=force)
    for why in res["skipped"]:
        err.print(f"[yellow]warning:[/] skipped {escape(why)}", soft_wrap=True)
    written = [str(res[k]) for k in ("png", "pdf", "csv") if res[k] is not None]
    out.print(f"wrote {escape(', '.join(written[:-1]) + ' and ' if len(written) > 1 else '')}"
              f"{escape(written[-1])}" + ("" if len(written) > 1 else " (a device or a pipe: "
              "one figure, nothing beside it)"), soft_wrap=True)


def main(argv: list[str] | None = None) -> None:
    from .threads import passive_waiting

    passive_waiting()  # before PyTorch loads OpenMP: idle threads sleep (lstmablate/threads.py)
    try:
        app(args=argv, standalone_mode=True)
    except UserError as e:
        # soft wrap: no line break inside a path or a suggested command (they stay copyable)
        err.print(f"[bold red]error:[/] {escape(e)}", soft_wrap=True)
        sys.exit(e.exit_code)
    except (KeyboardInterrupt, Interrupted):  # before training started (a training run
        # saves last.pt and exits cleanly)
        err.print("interrupted; no training step was lost (a run saves its progress once it has "
                  "started training, and `--resume` continues it).", soft_wrap=True)
        sys.exit(130)
    except OSError as e:  # the file system refused: read-only, full, a file where a directory goes
        where = f" ({e.filename})" if e.filename else ""
        err.print(f"[bold red]error:[/] the operating system refused a file operation"
                  f"{escape(where)}: {escape(e.strerror or e)}. Files already written were written "
                  "atomically and are intact; fix the cause and run the same command again.")
        sys.exit(2)


if __name__ == "__main__":  # pragma: no cover
    main()
