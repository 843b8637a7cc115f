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
  (:data:`pagegen.markers.REPORT_OPTIONS`): the report as the CLI prints it (run in this
  process, through ``lstmablate.cli.main``), its headings demoted below the page's sections.
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
* ``pages grid DIR --table NAME ... --cells A,B --by SECTION.KEY [--over SECTION.KEY]
  [--seeds 1] [--base V [--base-name TEXT]] [--recipe NAME]``: a grid over one setting (a
  learning rate), one row per cell and one column per value found in the runs: each run's
  best dev value of the task's primary metric and its test value (``--over``: a grid that
  also varies that setting, one row per cell and value of it, then the row of means that
  carries the choice, :func:`lstmablate.results.grid.pooled`), the grid's choice in bold
  (:func:`lstmablate.results.grid.choose`;
  ``--base``: the value the grid is built around, which wins a tie, its column named TEXT);
  with ``--recipe``, an error where the rate that recipe gives a cell is not its complete
  grid's choice; a line under the table names the runs copied from a twin (``sweep --reuse``)
  (:mod:`pagegen.grid`).
* ``pages records DIR``: one row per experiment under DIR, with its cells and the seeds of
  each (the index of the records: no machine line).
* ``pages headline DIR``: the README's table of the five paper cells across tasks
  (:data:`pagegen.headline.HEADLINE`: one column per task, the mean over seeds of one test
  metric, the paper's number in brackets, a learning rate that differs from its recipe's
  named).

Every block ends with the machine its runs were measured on, from their ``env.json``
(processor and cores, or GPU; the PyTorch build; threads per run; never the host name), so a
page names the machine once per table and never by hand.  Records without ``env.json`` say so
and point to the ``PROVENANCE.md`` beside them.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from pathlib import Path
from typing import Callable

# the generator's parts, in the package beside this script (tools/pagegen)
if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from lstmablate.errors import exit_status  # noqa: E402
from lstmablate.io import atomic_write_text, read_text  # noqa: E402
from pagegen.grid import grid_table  # noqa: E402
from pagegen.headline import headline  # noqa: E402
from pagegen.markers import (BLOCK, ROOT, PageError, Parser, check_markers,  # noqa: E402
                             check_report_options)
from pagegen.tables import find, lstmablate, machine_line, records, runs_table  # noqa: E402

#: the pages whose marked blocks are generated, relative to the repository root
PAGES = ("README.md", "docs/results/*.md", "docs/reporting.md")
#: the command that regenerates every block, as the check's message gives it
FIX = "make pages"


# -- the blocks ---------------------------------------------------------------------------
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
    if argv[:2] == ["pages", "grid"]:
        return grid_table(argv[2:])
    if argv[:2] == ["pages", "headline"]:
        return headline(argv[2:])
    if argv[:2] == ["pages", "records"]:
        return records(argv[2:])
    raise PageError(f"unknown generator {command!r}: `lstmablate report ...`, `lstmablate compare "
                    "RUN... RUN...`, `pages runs ...`, `pages grid ...`, `pages records ...` or "
                    "`pages headline ...`")


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
