"""Where the command line's output goes, and how listings are printed.

* ``out`` (stdout) carries what a command produces (tables, paths, JSON); ``err``
  (stderr) carries messages about the work (progress, warnings, errors).
* A listing is a table on a terminal and tab-separated values otherwise (a pipe, a file,
  ``--plain``): a header line, then one line per row, no truncation and no wrapping, so
  ``cut -f1`` or ``csv.reader(f, delimiter="\\t")`` reads it.  On a terminal, the columns
  named ``keep`` are never shortened (names a user copies); the others wrap.
* Text that comes from data or from a message (paths, file names, error text) may hold
  square brackets, which rich would read as markup: :func:`escape` it before printing.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.markup import escape as _escape
from rich.table import Table

out = Console(highlight=False)
err = Console(stderr=True, highlight=False)


def escape(text: object) -> str:
    """``text`` as literal rich text: ``[tensorboard]`` stays ``[tensorboard]``."""
    return _escape(str(text))


def count(n: int, noun: str, plural: str = "") -> str:
    """``n`` and its noun, plural unless ``n`` is 1: ``count(1, "run")`` is "1 run",
    ``count(3, "run")`` "3 runs", ``count(2, "scores file")`` "2 scores files"."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def tsv_field(value: object) -> str:
    """One TSV field: tabs and line breaks become spaces (they would split the row)."""
    return " ".join(str(value).split()) if any(c in str(value) for c in "\t\r\n") else str(value)


def print_listing(columns: Sequence[str], rows: Sequence[Sequence[object]], *, title: str = "",
                  keep: Sequence[str] = (), plain: bool | None = None,
                  console: Console | None = None) -> None:
    """Print ``rows`` under ``columns``: a rich table on a terminal, TSV otherwise.

    ``plain`` forces TSV (True) or the table (False); by default the table is printed only
    when the console is a terminal.  On a terminal the ``keep`` columns are as wide as their
    longest entry (never cut); the other columns wrap at word boundaries.  A terminal too
    narrow for that gets TSV as well."""
    console = console or out
    widths = [max([len(c)] + [len(str(r[i])) for r in rows]) for i, c in enumerate(columns)]
    if plain is None:
        # a terminal too narrow for the kept columns (and a little of the others) gets TSV too
        needed = sum(w if c in keep else min(w, 12) for c, w in zip(columns, widths))
        plain = not console.is_terminal or needed + 3 * len(columns) + 1 > console.width
    if plain:
        lines = ["\t".join(columns)] + ["\t".join(tsv_field(v) for v in row) for row in rows]
        console.file.write("\n".join(lines) + "\n")
        console.file.flush()
        return
    table = Table(title=title or None, title_justify="left", show_lines=False)
    for i, c in enumerate(columns):
        if c in keep:
            table.add_column(c, no_wrap=True, min_width=widths[i])
        else:
            table.add_column(c, overflow="fold")
    for row in rows:
        table.add_row(*(escape(v) for v in row))
    console.print(table)
