"""The tables a results page's markers generate (``tools/pages.py``), but the headline's: the
CLI run in this process (:func:`lstmablate`: ``lstmablate report`` and ``compare``), the
finished runs a table reads (:class:`Run`, :func:`find`), the machine they ran on from their
``env.json`` (:func:`machine_line`), numbers as the pages print them, and the generators
``pages runs`` (:func:`runs_table`, its columns: :func:`column`) and ``pages records``
(:func:`records`).
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import re
import shlex
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from lstmablate import cli
from lstmablate.console import count
from lstmablate.io import load_yaml, read_json, read_text
from lstmablate.recipes import load_recipe
from lstmablate.run.record import read_metrics
from lstmablate.run.runs import RunFiles

from .markers import ROOT, PageError, Parser

# -- running the CLI ----------------------------------------------------------------------
def lstmablate(*argv: str) -> str:
    """What ``lstmablate ARGV`` prints on stdout, run in this process through the CLI's entry
    point (its parsing and its error printer).  A PageError for a failure or a warning (a
    skipped run folder is a record the page would silently lose)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            cli.main(list(argv))
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    said = " ".join(err.getvalue().split())
    if code or said:
        raise PageError(f"`lstmablate {shlex.join(argv)}` "
                        + (f"failed (exit {code})" if code else "warned") + f": {said}")
    return out.getvalue()


@dataclass(frozen=True, eq=False)
class Run:
    """One finished run as a generated table reads it: the report's JSON row (``result.json``
    flattened) and, on demand, the run folder's other files."""

    row: dict[str, Any]

    @property
    def files(self) -> RunFiles:
        return RunFiles(Path(self.row["path"]))

    @property
    def cell(self) -> str:
        return self.row["cell"]

    @property
    def seed(self) -> int:
        return self.row["seed"]

    def result(self) -> dict[str, Any]:
        return read_json(self.files.result)

    def config(self) -> dict[str, Any]:
        """``config.yaml``, read once per run (a grid asks it for several keys)."""
        return self._config

    @functools.cached_property
    def _config(self) -> dict[str, Any]:
        return load_yaml(self.files.config)

    def env(self) -> dict[str, Any] | None:
        return read_json(self.files.env) if self.files.env.is_file() else None

    def evaluations(self) -> list[dict[str, Any]]:
        """``metrics.jsonl``: the dev evaluations, in order (read and checked as every command
        reads them, :func:`lstmablate.run.record.read_metrics`)."""
        return read_metrics(self.files.metrics)


def find(runs_dir: str, tables: list[str]) -> list[Run]:
    """The finished runs of ``tables`` under ``runs_dir``, as ``lstmablate report`` reads them;
    an experiment's own folder is read alone (the same runs, found faster)."""
    runs = []
    for table in tables or [""]:
        if table and (ROOT / runs_dir / table).is_dir():
            runs += _finished(str(Path(runs_dir) / table), "")
        else:
            runs += _finished(runs_dir, table)
    if not runs:
        raise PageError(f"no finished run under {runs_dir}" + (f" for {', '.join(tables)}" if tables
                                                               else ""))
    return runs


@functools.lru_cache(maxsize=None)
def _finished(runs_dir: str, table: str) -> tuple[Run, ...]:
    """``lstmablate report RUNS_DIR [--table TABLE] --format json``'s finished runs, read once
    per process."""
    rows = json.loads(lstmablate("report", runs_dir, "--format", "json",
                                 *(["--table", table] if table else [])))
    return tuple(Run(r) for r in rows if r["status"] == "finished")


# -- the machine --------------------------------------------------------------------------
def machine_of(env: dict[str, Any]) -> str:
    """One run's machine as its env.json records it: processor and cores (or GPU), PyTorch,
    threads; never the host name."""
    if str(env.get("device", "cpu")).startswith("cuda"):
        where = env.get("gpu") or "GPU (model not recorded)"
    else:
        where = env.get("processor") or "CPU (model not recorded)"
        if env.get("cpus"):
            where += f", {env['cpus']} cores"
    threads = env.get("threads")
    per_run = f", {threads} thread{'s' if threads != 1 else ''} per run" if threads else ""
    return f"{where}, PyTorch {env.get('torch', '(version not recorded)')}{per_run}"


def machines(runs: list[Run], runs_dir: str) -> str:
    """The machine of a table, once: every description its runs' env.json give, with how many
    runs each when there are several."""
    seen: Counter[str] = Counter()
    unrecorded: set[str] = set()
    for run in runs:
        env = run.env()
        if env is None:
            unrecorded.add(run.row["experiment"])
        else:
            seen[machine_of(env)] += 1
    parts = [m if len(seen) + len(unrecorded) == 1 else f"{m} ({count(n, 'run')})"
             for m, n in seen.items()]
    for experiment in sorted(unrecorded):
        provenance = Path(runs_dir) / experiment / "PROVENANCE.md"
        named = provenance_machine(ROOT / provenance)
        parts.append(f"{named} (`{provenance.as_posix()}`)" if named else
                     f"not in the run records of `{experiment}`"
                     + (f" (`{provenance.as_posix()}` names it)" if (ROOT / provenance).exists()
                        else ""))
    return "; ".join(parts)


def provenance_machine(path: Path) -> str:
    """The ``Machine:`` line of a PROVENANCE.md beside records without env.json ("" if none)."""
    if not path.exists():
        return ""
    for line in read_text(path, error=PageError).splitlines():
        if line.startswith("Machine: "):
            return line[len("Machine: "):].strip().rstrip(".")
    return ""


def machine_line(runs: list[Run], runs_dir: str) -> str:
    return f"Machine (from the runs' `env.json`): {machines(runs, runs_dir)}."


# -- number formatting --------------------------------------------------------------------
def number(value: Any, spec: str = "") -> str:
    if value is None:
        return "—"
    if isinstance(value, str):
        return value
    if spec:
        return format(value, spec)
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()
                                  and abs(value) >= 1000):
        return f"{int(value):,}"
    return f"{value:.2f}"


def paper_number(value: Any) -> str:
    """A recipe's reference number as the paper prints it (or its text, such as "< 50")."""
    return "—" if value is None else value if isinstance(value, str) else f"{value:g}"


@functools.lru_cache(maxsize=None)
def recipe_of(name: str) -> dict[str, Any]:
    """A shipped recipe resolved through its chain (read once per process)."""
    return load_recipe(name)[1]


# -- pages runs ---------------------------------------------------------------------------
@dataclass
class Column:
    label: str
    render: Callable[[Run], str]


def column(spec: str) -> Column:
    """A ``--col [LABEL=]COLUMN[:SPEC]`` of ``pages runs`` (the module's docstring)."""
    label, _, expr = spec.rpartition("=") if "=" in spec else ("", "", spec)
    if "+" in expr:  # several values in one cell, "a / b"
        parts = [column(part) for part in expr.split("+")]
        return Column(label.strip() or " / ".join(p.label for p in parts),
                      lambda run: " / ".join(p.render(run) for p in parts))
    expr, _, fmt = expr.partition(":")
    expr = expr.strip()

    def section(name: str, key: str) -> Callable[[Run], str]:
        return lambda run: number((run.result().get(name) or {}).get(key), fmt)

    if expr == "cell":
        render, default = (lambda run: f"`{run.cell}`"), "cell"
    elif expr in ("seed", "params", "epochs", "best_epoch"):
        render, default = (lambda run: number(run.row.get(expr), fmt)), expr.replace("_", " ")
    elif expr in ("train_time", "train_cpu"):  # result.json's seconds, shown in minutes
        def render(run: Run) -> str:
            seconds = run.row.get(f"{expr}_s")
            return "not recorded" if seconds is None else f"{number(seconds / 60, fmt or '.1f')} min"
        default = {"train_time": "train time", "train_cpu": "train CPU time"}[expr]
    elif expr.startswith(("test.", "dev.", "dev_final.")):
        name, key = expr.split(".", 1)
        render, default = section(name, key), f"{name.replace('_', ' ')} {key}"
    elif expr.startswith("best."):
        key = expr.split(".", 1)[1]

        def render(run: Run) -> str:
            best = run.result().get("best") or {}
            return f"{number((best.get('dev') or {}).get(key), fmt)} ({best.get('epoch', '?')})"
        default = f"best dev {key} (epoch)"
    elif "@" in expr:
        key, _, epochs = expr.partition("@")
        wanted = [e if e == "last" else int(e) for e in epochs.split(",")]

        def render(run: Run) -> str:
            evaluations = run.evaluations()
            at = {e["epoch"]: e.get(key) for e in evaluations}  # the last of each epoch
            if evaluations:
                at["last"] = evaluations[-1].get(key)
            return " / ".join(number(at.get(e), fmt) for e in wanted)
        default = f"dev {key}, epoch {' / '.join(map(str, wanted))}"
    elif expr.startswith("paper"):
        m = re.fullmatch(r"paper(?:\[(?P<recipe>[\w.-]+)\])?\.(?P<key>\w+)", expr)
        if not m:
            raise PageError(f"column {expr!r}: paper.M or paper[RECIPE].M")

        def render(run: Run) -> str:
            reference = recipe_of(m["recipe"] or run.row["recipe"]).get("reference") or {}
            return paper_number((reference.get(run.cell) or {}).get(m["key"]))
        default = "paper"
    elif expr.startswith("config."):
        keys = expr.split(".")[1:]

        def render(run: Run) -> str:
            value: Any = run.config()
            for k in keys:
                value = value.get(k) if isinstance(value, dict) else None
            return number(value, fmt) if not isinstance(value, float) or fmt else str(value)
        default = ".".join(keys)
    else:
        raise PageError(f"unknown column {expr!r}: cell, seed, params, train_time, train_cpu, "
                        "epochs, "
                        "best_epoch, test.M, dev.M, dev_final.M, best.M, M@E1,E2, paper.M, "
                        "paper[RECIPE].M or config.SECTION.KEY")
    return Column(label.strip() or default, render)


def runs_table(argv: list[str]) -> str:
    """``pages runs ...``: one row per run."""
    parser = Parser(prog="pages runs")
    parser.add_argument("runs_dir")
    parser.add_argument("--table", action="append", default=[])
    parser.add_argument("--cells", default="")
    parser.add_argument("--seeds", default="")
    parser.add_argument("--col", action="append", default=[])
    args = parser.parse_args(argv)
    if not args.col:
        raise PageError("pages runs: no --col")
    columns = [column(c) for c in args.col]
    runs = find(args.runs_dir, args.table)
    seeds = {int(n) for n in args.seeds.split(",") if n}
    if seeds:
        runs = [r for r in runs if r.seed in seeds]
    order = [c for c in args.cells.split(",") if c]
    if order:  # grouped by --table, as given; within one, by --cells, then by seed
        tables = [r.row["experiment"] for r in runs]
        runs = [r for r in runs if r.cell in order]
        runs.sort(key=lambda r: (tables.index(r.row["experiment"]), order.index(r.cell), r.seed))
    lines = ["| " + " | ".join(c.label for c in columns) + " |",
             "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(c.render(run) for c in columns) + " |" for run in runs]
    return "\n".join(lines) + "\n\n" + machine_line(runs, args.runs_dir) + "\n"


# -- pages records ------------------------------------------------------------------------
def records(argv: list[str]) -> str:
    """``pages records DIR``: one row per experiment kept under DIR, its cells and their seeds."""
    parser = Parser(prog="pages records")
    parser.add_argument("runs_dir")
    args = parser.parse_args(argv)
    seeds: dict[str, dict[str, list[int]]] = {}
    for run in find(args.runs_dir, []):
        seeds.setdefault(run.row["experiment"], {}).setdefault(run.cell, []).append(run.seed)
    lines = ["| experiment | runs | cells (seeds) |", "|---|---|---|"]
    for experiment, cells in sorted(seeds.items()):
        described = ", ".join(f"`{cell}` ({', '.join(map(str, sorted(s)))})"
                              for cell, s in sorted(cells.items()))
        lines.append(f"| `{experiment}` | {sum(map(len, cells.values()))} | {described} |")
    return "\n".join(lines) + "\n"
