"""The markers of a results page (``tools/pages.py``): the syntax of a generated block, what a
marker may ask of ``lstmablate report`` (options that only read), and the error that names a
page and line (:class:`PageError`), which every part of the generator raises.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from lstmablate.errors import UserError

#: the repository root: the pages' markers name their records relative to it
ROOT = Path(__file__).resolve().parents[2]
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
