"""``lstmablate data validate-conllu``, the parsing plugin's data command."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from lstmablate.errors import DataError
from lstmablate_tasks.parsing.commands import register

FIXTURES = Path(__file__).parent / "fixtures" / "parsing"


@pytest.fixture
def app() -> typer.Typer:
    data_app = typer.Typer()
    register(data_app)

    @data_app.command("noop")  # a second command, so that typer keeps the command names
    def noop() -> None:
        pass

    return data_app


def test_validate_conllu_reports_counts(app):
    r = CliRunner().invoke(app, ["validate-conllu", str(FIXTURES / "train.conllu")])
    assert r.exit_code == 0, r.output
    assert "ok" in r.output and "6 sentences, 45 words" in r.output


@pytest.mark.parametrize("damage, what", [
    (lambda t: t.replace("\n", "\r\n"), "line 1: malformed CoNLL-U: the line ends in CR LF"),
    (lambda t: t.rstrip("\n") + "\n", "the last sentence is not followed by a blank line"),
])
def test_validate_conllu_rejects_crlf_and_a_missing_final_blank_line(app, tmp_path, damage, what):
    bad = tmp_path / "bad.conllu"
    bad.write_bytes(damage((FIXTURES / "dev.conllu").read_text()).encode())
    r = CliRunner().invoke(app, ["validate-conllu", str(bad)])
    assert isinstance(r.exception, DataError)  # the CLI prints it as one paragraph, exit 2
    assert what in str(r.exception) and "bad.conllu" in str(r.exception)
