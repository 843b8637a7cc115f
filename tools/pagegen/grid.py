"""``pages grid``: a grid over one setting (a learning rate) as a results page shows it.

One row per cell, one column per value of the setting found in the runs: the run's best
validation number (the task's primary metric, ``result.json``'s ``best.dev``, as
:func:`lstmablate.results.grid.shown` writes it; the grid's choice in bold,
:func:`lstmablate.results.grid.choose`) and its test number, then the value chosen.
With ``--recipe NAME``, a recipe that gives a cell (by its ``train.lr``, or its
``cell_overrides``') another value than its complete grid chooses is an error naming the
recipe, the cell and the value to write: the page cannot show a choice its recipe does not
make.
"""

from __future__ import annotations

import math
from typing import Any

from lstmablate.results.experiments import Expectations
from lstmablate.results.grid import choose, shown

from .markers import PageError, Parser
from .tables import Run, find, machine_line, recipe_of


def setting(run: Run, key: str) -> float | None:
    """``SECTION.KEY`` of the run's resolved config, as a number (None if absent)."""
    value: Any = run.config()
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def grid_table(argv: list[str]) -> str:
    """``pages grid DIR --table NAME ... --cells A,B --by SECTION.KEY [--seeds 1] [--base V
    [--base-name TEXT]] [--recipe NAME]``."""
    parser = Parser(prog="pages grid")
    parser.add_argument("runs_dir")
    parser.add_argument("--table", action="append", default=[])
    parser.add_argument("--cells", required=True)
    parser.add_argument("--by", required=True)
    parser.add_argument("--seeds", default="")
    parser.add_argument("--base", type=float, default=None)
    parser.add_argument("--base-name", default="base")
    parser.add_argument("--recipe", default="")
    args = parser.parse_args(argv)
    if args.recipe and args.by != "train.lr":
        raise PageError("pages grid: --recipe checks a recipe's learning rates (--by train.lr)")
    cells = [c for c in args.cells.split(",") if c]
    seeds = {int(n) for n in args.seeds.split(",") if n}
    runs = [r for r in find(args.runs_dir, args.table)
            if r.cell in cells and (not seeds or r.seed in seeds)]
    at: dict[str, dict[float, Run]] = {}
    for run in runs:
        value = setting(run, args.by)
        if value is None:
            raise PageError(f"pages grid: {run.files.config} has no number at {args.by}")
        if value in at.setdefault(run.cell, {}):
            raise PageError(f"pages grid: two runs of `{run.cell}` at {args.by} = {value:g} "
                            f"({at[run.cell][value].files.root} and {run.files.root}): give "
                            "--seeds to keep one")
        at[run.cell][value] = run
    if not at:
        raise PageError(f"pages grid: no finished run of {', '.join(cells)}")
    values = sorted({v for points in at.values() for v in points})
    first = next(iter(next(iter(at.values())).values())).result()
    metric, higher = first["primary"], bool(first["higher_is_better"])
    wants = Expectations.of(recipe_of(args.recipe)).lr if args.recipe else {}
    name = args.by.split(".")[-1]

    def header(value: float) -> str:
        return f"{name} {value:g}" + (f" ({args.base_name})" if args.base is not None
                                     and value == args.base else "")
    columns = [f"{header(v)}: dev / test {metric}" for v in values] + [f"chosen {name}"]
    lines = ["| cell | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for cell in [c for c in cells if c in at]:
        points = at[cell]
        results = {v: r.result() for v, r in points.items()}  # each result.json read once
        dev = {v: float((res.get("best") or {}).get("dev", {}).get(metric, math.nan))
               for v, res in results.items()}
        test = {v: (res.get("test") or {}).get(metric) for v, res in results.items()}
        complete = len(points) == len(values)
        chosen = choose(dev, higher, args.base) if complete else None
        cols = [(f"**{shown(dev[v])}**" if v == chosen else shown(dev[v]))
                + " / " + (shown(test[v]) if isinstance(test[v], (int, float)) else "—")
                if v in dev else "—" for v in values]
        row = [f"`{cell}`", *cols, f"{chosen:g}" if chosen is not None else "grid incomplete"]
        if args.recipe:
            want = wants.get(cell)
            if complete and want != chosen:
                raise PageError(
                    f"recipe {args.recipe} gives `{cell}` {args.by} = "
                    f"{'nothing' if want is None else f'{want:g}'}, but its grid chooses "
                    f"{chosen:g} (best dev {metric} {shown(dev[chosen])}): set cell_overrides: "
                    f"{{{cell}: {{train: {{lr: {chosen:g}}}}}}} in recipes/{args.recipe}.yaml "
                    "and train the cell at that rate")
        lines.append("| " + " | ".join(row) + " |")
    shown_runs = [r for points in at.values() for r in points.values()]
    return "\n".join(lines) + "\n\n" + machine_line(shown_runs, args.runs_dir) + "\n"
