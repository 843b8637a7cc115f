"""``pages grid``: a grid over one setting (a learning rate) as a results page shows it.

One row per cell, one column per value of the setting found in the runs: the validation
number of the model the run tests (the task's primary metric,
:func:`lstmablate.results.grid.dev_of_tested_model`: the best dev evaluation, or the last where the
run tests the model at the end of training; as :func:`lstmablate.results.grid.shown` writes
it; the grid's choice in bold, :func:`lstmablate.results.grid.choose`) and its test number,
then the value chosen.  ``--test METRIC`` shows that test metric instead of the primary one, to
two decimals as a report does (NMT: the grid chooses by validation perplexity, the table
tests BLEU).
The values are those the runs have and those the grids of their recipes list (a value no run
has yet is a column of dashes, and no choice is made without it).  With ``--over
SECTION.KEY`` (the Dyck report's ``data.m``) the grid also varies that setting and a cell has
one value of ``--by`` for all of its points (:func:`lstmablate.results.grid.pooled`):
a row per cell and point, then the cell's row of means over the points, which carries the
choice.  With ``--recipe NAME``, a recipe that gives a cell (by its ``train.lr``, or its
``cell_overrides``') another value than its complete grid chooses is an error naming the
recipe, the cell and the value to write: the page cannot show a choice its recipe does not
make.  A run of the grid copied from its twin (a run with the same settings trained for another
experiment, ``lstmablate sweep --reuse``) is named under the table with the run it copies.
"""

from __future__ import annotations

import math
from typing import Any

from lstmablate.errors import UserError
from lstmablate.results.experiments import Expectations
from lstmablate.results.grid import choose, pooled, shown, dev_of_tested_model
from lstmablate.run.twins import TwinRecord

from .markers import PageError, Parser
from .tables import Run, find, machine_line, recipe_of


def setting(run: Run, key: str) -> float | None:
    """``SECTION.KEY`` of the run's resolved config, as a number (None if absent)."""
    value: Any = run.config()
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def planned(runs: list[Run], key: str) -> set[float]:
    """The values of ``key`` that the grids of the runs' recipes list (``grid: {KEY: [...]}``),
    whether or not a run has them yet: a value no run has is a column of dashes, and no cell's
    choice is made without it.  A recipe that cannot be read adds nothing."""
    out: set[float] = set()
    for name in sorted({str(r.config().get("recipe") or "") for r in runs} - {""}):
        try:
            grid = recipe_of(name).get("grid") or {}
        except UserError:
            continue
        listed = grid.get(key) if isinstance(grid, dict) else None
        out |= {float(v) for v in listed or [] if isinstance(v, (int, float))
                and not isinstance(v, bool)}
    return out


def grid_table(argv: list[str]) -> str:
    """``pages grid DIR --table NAME ... --cells A,B --by SECTION.KEY [--over SECTION.KEY]
    [--seeds 1] [--base V [--base-name TEXT]] [--recipe NAME] [--test METRIC]``."""
    parser = Parser(prog="pages grid")
    parser.add_argument("runs_dir")
    parser.add_argument("--table", action="append", default=[])
    parser.add_argument("--cells", required=True)
    parser.add_argument("--by", required=True)
    parser.add_argument("--over", default="")
    parser.add_argument("--seeds", default="")
    parser.add_argument("--base", type=float, default=None)
    parser.add_argument("--base-name", default="base")
    parser.add_argument("--recipe", default="")
    parser.add_argument("--test", default="")
    args = parser.parse_args(argv)
    if args.recipe and args.by != "train.lr":
        raise PageError("pages grid: --recipe checks a recipe's learning rates (--by train.lr)")
    cells = [c for c in args.cells.split(",") if c]
    seeds = {int(n) for n in args.seeds.split(",") if n}
    runs = [r for r in find(args.runs_dir, args.table)
            if r.cell in cells and (not seeds or r.seed in seeds)]
    at: dict[str, dict[tuple[float, float | None], Run]] = {}  # cell -> (value, point) -> run
    for run in runs:
        value = setting(run, args.by)
        point = setting(run, args.over) if args.over else None
        for key, got in ((args.by, value), (args.over, point)):
            if key and got is None:
                raise PageError(f"pages grid: {run.files.config} has no number at {key}")
        assert value is not None
        where = f"{args.by} = {value:g}" + (f", {args.over} = {point:g}" if point is not None else "")
        if (value, point) in at.setdefault(run.cell, {}):
            raise PageError(f"pages grid: two runs of `{run.cell}` at {where} "
                            f"({at[run.cell][value, point].files.root} and {run.files.root}): "
                            "give --seeds to keep one")
        at[run.cell][value, point] = run
    if not at:
        raise PageError(f"pages grid: no finished run of {', '.join(cells)}")
    values = sorted({v for grid in at.values() for v, _ in grid} | planned(runs, args.by))
    points = sorted({p for grid in at.values() for _, p in grid}
                    | (planned(runs, args.over) if args.over else set()), key=lambda p: p or 0.0)
    first = next(iter(next(iter(at.values())).values())).result()
    metric, higher = first["primary"], bool(first["higher_is_better"])
    tested = args.test or metric
    wants = Expectations.of(recipe_of(args.recipe)).lr if args.recipe else {}
    name = args.by.split(".")[-1]
    over = args.over.split(".")[-1]

    def header(value: float) -> str:
        return f"{name} {value:g}" + (f" ({args.base_name})" if args.base is not None
                                     and value == args.base else "")

    def cell_text(dev: float | None, test: Any, bold: bool) -> str:
        if dev is None:
            return "—"
        return ((f"**{shown(dev)}**" if bold else shown(dev)) + " / "
                + ("—" if not isinstance(test, (int, float)) or not math.isfinite(test)
                   else shown(test) if tested == metric else f"{test:.2f}"))
    columns = ([f"{over}"] if args.over else []) + [
        f"{header(v)}: dev / test {metric}" if tested == metric
        else f"{header(v)}: dev {metric} / test {tested}" for v in values] + [f"chosen {name}"]
    lines = ["| cell | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for cell in cells:  # (a cell with no finished run yet: a row of dashes)
        grid = at.get(cell, {})
        results = {k: r.result() for k, r in grid.items()}  # each result.json read once
        dev = {k: dev_of_tested_model(metric, str(res.get("test_checkpoint") or "best"),
                                      (res.get("best") or {}).get("dev"), grid[k].evaluations)
               for k, res in results.items()}
        test = {k: (res.get("test") or {}).get(tested) for k, res in results.items()}
        complete = len(grid) == len(values) * len(points)
        mean_dev = pooled({v: [dev[v, p] for p in points if (v, p) in dev] for v in values})
        chosen = choose(mean_dev, higher, args.base) if complete else None
        if args.over:
            mean_test = pooled({v: [float(test[v, p]) if isinstance(test[v, p], (int, float))
                                    else math.nan for p in points if (v, p) in test]
                                for v in values})
            for p in points:
                cols = [cell_text(dev.get((v, p)), test.get((v, p)), False) for v in values]
                lines.append("| " + " | ".join([f"`{cell}`", f"{p:g}", *cols, ""]) + " |")
            cols = [cell_text(mean_dev[v], mean_test[v], v == chosen) if complete else "—"
                    for v in values]
            row = [f"`{cell}`", f"mean over {over}", *cols]
        else:
            row = [f"`{cell}`", *[cell_text(dev.get((v, None)), test.get((v, None)), v == chosen)
                                  for v in values]]
        row.append(f"{chosen:g}" if chosen is not None else "grid incomplete")
        if args.recipe:
            want = wants.get(cell)
            if complete and want != chosen:
                assert chosen is not None
                best = (f"best mean dev {metric} over {over}" if args.over
                        else f"best dev {metric}")  # (of the model each run tests)
                raise PageError(
                    f"recipe {args.recipe} gives `{cell}` {args.by} = "
                    f"{'nothing' if want is None else f'{want:g}'}, but its grid chooses "
                    f"{chosen:g} ({best} {shown(mean_dev[chosen])}): set cell_overrides: "
                    f"{{{cell}: {{train: {{lr: {chosen:g}}}}}}} in recipes/{args.recipe}.yaml "
                    "and train the cell at that rate")
        lines.append("| " + " | ".join(row) + " |")
    shown_runs = [r for grid in at.values() for r in grid.values()]
    return ("\n".join(lines) + "\n\n" + twins_line(shown_runs, args.by)
            + machine_line(shown_runs, args.runs_dir) + "\n")


def twins_line(runs: list[Run], by: str) -> str:
    """A line naming the grid's runs copied from a twin trained for another experiment
    (``sweep --reuse``: :mod:`lstmablate.run.twins`), each with the run it copies, and a blank
    line; empty where every run was trained for its grid point."""
    copies = []
    for run in runs:
        twin = TwinRecord.read(run.files)
        if twin is not None:
            value = setting(run, by)
            copies.append(f"`{run.cell}` at {by.split('.')[-1]} {value:g} "
                          f"(trained as `{twin.run}`)")
    if not copies:
        return ""
    return ("Copied, not trained again, from a run with the same settings trained for another "
            "experiment (its `twin.json`; the copy holds all of that run's records): "
            f"{', '.join(copies)}.\n\n")
