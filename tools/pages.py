"""The results pages' tables, generated from the run records kept in the repository.

Every table of measured numbers on a results page (``docs/results/*.md``) and the README's
headline table lies between two markers::

    <!-- generated: COMMAND -->
    ...what COMMAND prints, run on the records in experiments/results/...
    <!-- /generated -->

``python tools/pages.py`` (``make pages``) runs every marker's COMMAND and writes its output
between the markers; ``python tools/pages.py --check`` writes nothing anywhere and exits 1
naming the first page and line that differ from what the records give (``tests/test_pages.py``
runs it).  The prose around the blocks is never touched.  A COMMAND only reads: it is one of
the generators below, each run with its output captured, and anything else -- another
command, an option that writes (``--out``, ``--force``), an unbalanced quote, a marker that
does not close -- is an error naming the page and the line, before any command runs.  Exit
status: 0 (written, or ``--check``: every page matches), 1 (``--check``: a page differs), 2
(an error: one paragraph naming the page and line, or the file that cannot be read).

* ``lstmablate report DIR [--table NAME] [--cells A,B] [--significance] [--against CELL]
  [--test T] [--level L] [--resamples N] [--seed S] [--correction C]``
  (:data:`REPORT_OPTIONS`): the report as the CLI prints it (run in this process, through
  ``lstmablate.cli.main``), its headings demoted below the page's sections.
* ``lstmablate compare RUNS_A RUNS_B``: the comparison as the CLI prints it, in a code block
  (run folders only, no options: the test the report's ``--significance`` uses).  No other
  ``lstmablate`` command is run from a page.
* ``pages runs DIR --table NAME [--table NAME ...] [--cells A,B] [--seeds 1,2] --col
  [LABEL=]COLUMN ...``: one row per finished run of the named experiments (the runs
  ``lstmablate report DIR --table NAME --format json`` lists; only those cells and seeds where
  given; grouped by ``--table``, then in the order of ``--cells``, then by seed), for what the
  report does not show: per-epoch values, the best dev epoch, a config value.  COLUMN is one
  of ``cell``, ``seed``, ``params``, ``train_time`` (minutes), ``train_cpu`` (the training
  process's CPU minutes), ``epochs``, ``best_epoch``,
  ``test.M`` / ``dev.M`` / ``dev_final.M`` (``result.json``'s sections), ``best.M`` (the best
  dev value and its epoch), ``M@E1,E2`` (the dev evaluation of ``metrics.jsonl`` at the end of
  those epochs, ``/``-separated; ``last``: the last evaluation), ``paper.M`` /
  ``paper[RECIPE].M`` (the number in the ``reference:`` of the run's recipe, or of RECIPE) and
  ``config.SECTION.KEY``; ``:SPEC`` after it is a Python format spec for its numbers
  (default: 2 decimals, integers with thousands separators); ``A+B`` shows two columns'
  values in one cell, ``a / b``.  LABEL is the column's header (default: the column's name).
* ``pages records DIR``: one row per experiment under DIR, with its cells and the seeds of
  each (the index of the records: no machine line).
* ``pages headline DIR``: the README's table of the five paper cells across tasks
  (:data:`HEADLINE`: one column per task, the mean over seeds of one test metric, the
  paper's number in brackets, a learning rate that differs from its recipe's named).

Every block ends with the machine its runs were measured on, from their ``env.json``
(processor and cores, or GPU; the PyTorch build; threads per run; never the host name), so a
page names the machine once per table and never by hand.  Records without ``env.json`` say so
and point to the ``PROVENANCE.md`` beside them.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import io
import os
import re
import shlex
import statistics
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from lstmablate import cli
from lstmablate.errors import UserError, exit_status
from lstmablate.io import atomic_write_text, load_yaml, read_json, read_text
from lstmablate.recipes import load_recipe
from lstmablate.run.record import read_metrics
from lstmablate.run.runs import RunFiles

ROOT = Path(__file__).resolve().parent.parent
#: the pages whose marked blocks are generated, relative to the repository root
PAGES = ("README.md", "docs/results/*.md", "docs/reporting.md")
#: the command that regenerates every block, as the check's message gives it
FIX = "make pages"
BLOCK = re.compile(r"^<!-- generated: (?P<command>[^\n]+?) -->\n(?P<body>.*?)^<!-- /generated -->$",
                   re.M | re.S)


class PageError(UserError):
    """A marker whose command cannot be run, or records it cannot read: named with its page
    and line (one paragraph and exit 2, as every refusal of the command line)."""


#: the options of ``lstmablate report`` a page's marker may give (each reads; ``--out`` and
#: ``--force`` would write a file): whether each takes a value
REPORT_OPTIONS = {"--table": True, "--cells": True, "--significance": False, "--against": True,
                  "--test": True, "--level": True, "--resamples": True, "--seed": True,
                  "--correction": True}


# -- running the CLI -------------------------------------------------------------------------
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


# -- the machine -----------------------------------------------------------------------------
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
    parts = [m if len(seen) + len(unrecorded) == 1 else f"{m} ({n} run{'s' if n > 1 else ''})"
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


# -- number formatting -------------------------------------------------------------------------
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


# -- pages runs ------------------------------------------------------------------------------
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


# -- pages records ---------------------------------------------------------------------------
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


# -- pages headline --------------------------------------------------------------------------
@dataclass(frozen=True)
class HeadlineColumn:
    """One column of the README's headline table: the mean over seeds of ``metric`` in the test
    section of the runs of ``experiments``, with ``paper_recipe``'s reference number."""

    title: str
    short: str  # the column's name in the notes under the table
    experiments: tuple[str, ...]
    metric: str
    paper_recipe: str | None
    spec: str = ".2f"


#: the five paper cells, in the paper's order, as the headline names them
PAPER_CELLS = (("LSTM", "lstm"), ("−S-RNN", "lstm-srnn"), ("−S-RNN−OUT", "lstm-srnn-out"),
               ("−S-RNN−HIDDEN", "lstm-srnn-hidden"), ("−GATES", "lstm-gates"))
HEADLINE = (
    HeadlineColumn("[PTB small (CPU, 13 epochs)](docs/results/table1-ptb.md)<br>test ppl ↓",
                   "PTB small", ("ptb-small",), "ppl", None),
    HeadlineColumn("[PTB medium (paper scale, GPU)]"
                   "(docs/results/table1-ptb.md#ptb-medium-at-the-papers-scale)<br>test ppl ↓",
                   "PTB medium", ("ptb-medium",), "ppl", "ptb-medium"),
    HeadlineColumn("[SQuAD stand-in (dev split)](docs/results/table2-squad.md)<br>DrQA F1 ↑",
                   "DrQA", ("squad-drqa-standin-dev-split",), "f1", "squad-drqa"),
    HeadlineColumn("[SQuAD stand-in (dev split)](docs/results/table2-squad.md)<br>BiDAF F1 ↑",
                   "BiDAF", ("squad-bidaf-standin-dev-split",), "f1", "squad-bidaf"),
    HeadlineColumn("[UD EWT (CPU stand-in 3×100)](docs/results/table3-parsing.md)<br>LAS ↑",
                   "UD EWT", ("parsing-ewt-cpu",), "las", "parsing-ewt"),
    HeadlineColumn("[Multi30k (CPU 2×256)](docs/results/table4-nmt.md)<br>BLEU ↑",
                   "Multi30k", ("nmt-multi30k-cpu",), "bleu", "nmt-multi30k"),
    # the paper's size on one GPU: the LSTM whole, the ablations' first 8-9 of 13 epochs
    HeadlineColumn("[Multi30k (paper scale, GPU; ablations 8-9 of 13 epochs)]"
                   "(docs/results/table4-nmt.md)<br>BLEU ↑",
                   "Multi30k paper scale", ("nmt-multi30k",), "bleu", "nmt-multi30k"),
    HeadlineColumn("[Dyck demo](docs/results/dyck.md)<br>WCPA mean ↑",
                   "Dyck", ("dyck-demo",), "wcpa_mean", None, ".1f"),
)


@functools.lru_cache(maxsize=None)
def recipe_of(name: str) -> dict[str, Any]:
    """A shipped recipe resolved through its chain (read once per process)."""
    return load_recipe(name)[1]


def headline(argv: list[str]) -> str:
    """``pages headline DIR``: the README's table (:data:`HEADLINE`)."""
    parser = Parser(prog="pages headline")
    parser.add_argument("runs_dir")
    args = parser.parse_args(argv)
    if not (ROOT / args.runs_dir).is_dir():  # (else every column would be a dash)
        raise PageError(f"pages headline: {args.runs_dir} is not a folder of run records "
                        "(relative to the repository root)")
    rows = {cell: [f"{name} (`{cell}`)"] for name, cell in PAPER_CELLS}
    seeds: dict[str, list[str]] = {}
    where: list[str] = []
    missing: dict[str, list[str]] = {}
    for col in HEADLINE:
        runs = [r for e in col.experiments for r in find_or_none(args.runs_dir, e)]
        reference = (recipe_of(col.paper_recipe).get("reference") or {}) if col.paper_recipe else {}
        shown: list[Run] = []  # the runs in the table, whose machines the column names
        for _, cell in PAPER_CELLS:
            mine = [r for r in runs if r.cell == cell]
            shown += mine
            if not mine:
                rows[cell].append("—")
                missing.setdefault(col.short, []).append(f"`{cell}`")
                continue
            twice = sorted(s for s, n in Counter(r.seed for r in mine).items() if n > 1)
            if twice:  # a re-run or a copy is not a new seed
                raise PageError(f"pages headline: column {col.short!r} pools runs of "
                                f"{', '.join(col.experiments)} in which `{cell}` has seed(s) "
                                f"{', '.join(map(str, twice))} more than once; its mean would "
                                "count one seed twice. Keep one experiment per cell in the "
                                "column (tools/pages.py, HEADLINE).")
            text = number(statistics.mean(r.row[f"test.{col.metric}"] for r in mine), col.spec)
            paper = (reference.get(cell) or {}).get(col.metric)
            if paper is not None:
                text += f" ({paper_number(paper)})"
            lr = mine[0].config()["train"]["lr"]
            if lr != recipe_of(mine[0].row["recipe"])["train"]["lr"]:
                text += f", lr {lr:g}"
            rows[cell].append(text)
            if len(mine) > 1:
                seeds.setdefault(col.short, []).append(f"`{cell}` {len(mine)}")
        if shown:
            where.append(f"{col.short}: {machines(shown, args.runs_dir)}")
    lines = ["| cell | " + " | ".join(c.title for c in HEADLINE) + " |",
             "|" + "---|" * (len(HEADLINE) + 1)]
    lines += ["| " + " | ".join(r) + " |" for r in rows.values()]
    notes = ["Ours: the mean over the seeds kept ("
             + "; ".join(f"{short}: {', '.join(cells)} seeds" for short, cells in seeds.items())
             + "; every other entry one run, seed 1); a learning rate is named where it differs "
             "from the recipe's."]
    if missing:
        notes.append("—: no run record in the repository ("
                     + "; ".join(f"{short}: {', '.join(cells)}" for short, cells in missing.items())
                     + ").")
    notes.append("Machines (from the runs' `env.json`):\n\n" + "\n".join(f"* {w}" for w in where))
    return "\n".join(lines) + "\n\n" + "\n\n".join(notes) + "\n"


def find_or_none(runs_dir: str, experiment: str) -> list[Run]:
    """The finished runs of one experiment, none if it has no folder yet."""
    if not (ROOT / runs_dir / experiment).is_dir():
        return []
    return find(runs_dir, [experiment])


# -- the blocks ------------------------------------------------------------------------------
class Parser(argparse.ArgumentParser):
    """argparse that raises (a marker's mistake is the page's, named with it) instead of
    exiting."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise PageError(f"{self.prog}: {message}")


def check_report_options(argv: list[str]) -> None:
    """A PageError unless ``argv`` (after ``lstmablate report``) is one folder and options of
    :data:`REPORT_OPTIONS`: a page's marker only reads."""
    positional, i = [], 0
    while i < len(argv):
        arg = argv[i]
        name = arg.split("=", 1)[0]
        if not arg.startswith("-"):
            positional.append(arg)
        elif name not in REPORT_OPTIONS:
            why = (" (it writes a file: a page's marker only reads)"
                   if name in ("--out", "--force", "--print") else "")
            raise PageError(f"`lstmablate report` in a marker does not take {name}{why}; it takes "
                            f"a folder of runs and {', '.join(REPORT_OPTIONS)}")
        elif REPORT_OPTIONS[name] and "=" not in arg:
            if i + 1 >= len(argv):
                raise PageError(f"`lstmablate report` in a marker: {name} needs a value")
            i += 1
        i += 1
    if len(positional) != 1:
        raise PageError("`lstmablate report` in a marker names one folder of runs, got "
                        f"{len(positional)}")


def render(command: str) -> str:
    """What a marker's command prints: the text between its markers (only the generators of
    the module's docstring, each reading; anything else is a PageError)."""
    try:
        argv = shlex.split(command)
    except ValueError as e:  # an unbalanced quote
        raise PageError(f"the marker's command cannot be read ({e})") from None
    if argv[:2] == ["lstmablate", "report"]:
        check_report_options(argv[2:])
        # its headings (one per table) demoted below the page's sections
        text = re.sub(r"^## ", "#### ", lstmablate(*argv[1:]), flags=re.M)
        spec = Parser(prog="lstmablate report", add_help=False)
        spec.add_argument("runs_dir")
        spec.add_argument("--table", action="append", default=[])
        spec.add_argument("--cells", default="")
        args, _ = spec.parse_known_args(argv[2:])
        runs = find(args.runs_dir, args.table)
        if args.cells:  # the machines of the rows shown (report --cells)
            shown = set(args.cells.split(","))
            runs = [r for r in runs if r.cell in shown]
        return text.rstrip("\n") + "\n\n" + machine_line(runs, args.runs_dir) + "\n"
    if argv[:2] == ["lstmablate", "compare"]:
        paths = argv[2:]
        if any(a.startswith("-") for a in paths):
            raise PageError("a page's `lstmablate compare` names run folders only (its defaults: "
                            "what the report's --significance uses)")
        text = lstmablate(*argv[1:])
        runs = [run for path in paths for run in find(path, [])]
        return f"```text\n{text.strip()}\n```\n\n{machine_line(runs, str(Path(paths[0]).parent))}\n"
    if argv[:2] == ["pages", "runs"]:
        return runs_table(argv[2:])
    if argv[:2] == ["pages", "headline"]:
        return headline(argv[2:])
    if argv[:2] == ["pages", "records"]:
        return records(argv[2:])
    raise PageError(f"unknown generator {command!r}: `lstmablate report ...`, `lstmablate compare "
                    "RUN... RUN...`, `pages runs ...`, `pages records ...` or `pages headline ...`")


def regenerate(text: str, where: str, keep: Callable[[str], bool] = lambda command: True,
               rendered: dict[str, str] | None = None) -> str:
    """``text`` with the body of every marked block whose command ``keep`` accepts rendered
    anew (the others as they are).  ``rendered``: the bodies of the commands already rendered
    in this generation, by command (a table shown on two pages is computed once)."""
    rendered = {} if rendered is None else rendered

    def block(m: re.Match[str]) -> str:
        command = m.group("command")
        if not keep(command):
            return m.group(0)
        try:
            body = rendered[command] if command in rendered else render(command)
        except PageError as e:
            raise PageError(f"{where}, line {text.count(chr(10), 0, m.start()) + 1}: {e}"
                            ) from None
        rendered[command] = body
        return f"<!-- generated: {command} -->\n\n{body.strip()}\n\n<!-- /generated -->"

    check_markers(text, where)
    cwd = os.getcwd()
    os.chdir(ROOT)  # the markers' paths are relative to the repository root
    try:
        return BLOCK.sub(block, text)
    finally:
        os.chdir(cwd)


#: a line that opens or closes a block
START, END = re.compile(r"^<!-- generated: "), re.compile(r"^<!-- /generated -->$")


def check_markers(text: str, where: str) -> None:
    """A PageError naming ``where`` and the line of a start marker that does not close (or
    whose command is empty), or of an end marker that closes nothing: a block the generator
    would otherwise skip, and call the page matching."""
    spans = [(m.start(), m.end()) for m in BLOCK.finditer(text)]
    inside = lambda pos: any(a <= pos < b for a, b in spans)  # noqa: E731
    offset = 0
    for number, line in enumerate(text.split("\n"), 1):
        if (START.match(line) or END.match(line)) and not inside(offset):
            what = ("opens a block that does not close (no `<!-- /generated -->` line after it, "
                    "or no command in it)" if START.match(line) else
                    "closes a block that was not opened")
            raise PageError(f"{where}, line {number}: the marker {line[:60]!r} {what}")
        offset += len(line) + 1


def read_page(path: Path) -> str:
    """A page's text (a regular file of UTF-8 text: a missing, binary or directory page, or a
    FIFO, is a PageError naming it, never waited on)."""
    try:
        return read_text(path, error=PageError)
    except PageError as e:
        raise PageError(f"{e} (a page is a Markdown file)") from None


def pages(root: Path = ROOT) -> list[Path]:
    return sorted({p for pattern in PAGES for p in root.glob(pattern)})


def first_difference(page: str, old: str, new: str) -> str | None:
    """Where ``old`` (the page) differs from ``new`` (what its records give), or None."""
    if old == new:
        return None
    a, b = old.splitlines(), new.splitlines()
    line = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    found = a[line] if line < len(a) else "(the end of the page)"
    given = b[line] if line < len(b) else "(the end of the page)"
    return (f"{page}, line {line + 1}, differs from what its run records give: the page has "
            f"{found!r}, the records give {given!r}. Run `{FIX}` (python tools/pages.py) to "
            "regenerate the marked tables, and commit the pages with the records.")


def shown(path: Path) -> str:
    """A page's name in a message: relative to the repository root where it is inside it."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def check(paths: list[Path], keep: Callable[[str], bool] = lambda command: True) -> list[str]:
    """Every page of ``paths`` that differs from what its records give, named with its first
    differing line."""
    problems: list[str] = []
    rendered: dict[str, str] = {}
    for path in paths:
        old = read_page(path)
        where = shown(path)
        problem = first_difference(where, old, regenerate(old, where, keep, rendered))
        if problem:
            problems.append(problem)
    return problems


def main(argv: list[str] | None = None) -> int:
    """The command line (the module's docstring): its exit status; a refusal is one paragraph
    and exit 2 (:func:`lstmablate.errors.exit_status`)."""
    return exit_status("pages", lambda: run(argv))


def run(argv: list[str] | None = None) -> int:
    parser = Parser(prog="pages", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 naming each page that differs")
    parser.add_argument("page", nargs="*", type=Path, help="only these pages (default: all)")
    parser.add_argument("--only", action="append", default=[], metavar="TEXT",
                        help="only the blocks whose marker's command contains TEXT (repeatable; "
                        "e.g. an experiment's folder, to redo the tables of the records just "
                        "added without rendering the page's other blocks)")
    args = parser.parse_args(argv)
    paths = [p.resolve() for p in args.page] or pages()

    def keep(command: str) -> bool:
        return not args.only or any(text in command for text in args.only)

    if args.check:
        problems = check(paths, keep)
        which = (" in the blocks whose command contains "
                 + " or ".join(repr(t) for t in args.only)) if args.only else ""
        print("\n".join(problems) or f"{len(paths)} pages match their run records{which}.")
        return 1 if problems else 0
    rendered: dict[str, str] = {}
    new_texts = []
    for path in paths:  # every page rendered before the first is written
        old = read_page(path)
        new_texts.append((path, old, regenerate(old, shown(path), keep, rendered)))
    for path, old, new in new_texts:
        if new != old:
            atomic_write_text(path, new)
            print(f"regenerated {shown(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
