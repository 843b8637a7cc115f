"""The parsing task's own ``lstmablate data`` subcommand: ``validate-conllu``.

Registered through the ``lstmablate.commands`` entry-point group, so the core CLI
names no task's tools and the task module itself knows nothing about the CLI.
"""

from __future__ import annotations

from pathlib import Path

import typer


def register(data_app: typer.Typer) -> None:
    data_app.command("validate-conllu")(data_validate_conllu)


def data_validate_conllu(
    path: Path = typer.Argument(..., metavar="FILE", help="A .conllu or .conllu.gz file."),
) -> None:
    """Check a CoNLL-U file line by line (fields, IDs, one tree per sentence, LF line endings,
    a blank line after every sentence); report the first malformed line.

    Example:

    lstmablate data validate-conllu data/ud-ewt/en_ewt-ud-dev.conllu.gz
    """
    from .conllu import read_conllu

    sents = read_conllu(path)
    n_words = sum(len(s) for s in sents)
    typer.echo(f"ok {path}: {len(sents)} sentences, {n_words} words")
