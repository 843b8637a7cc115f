"""``lstmablate ARGV`` run in this process, through the real entry point (``cli.main``: Typer's
parsing and the error printer), without the seconds a new Python process with torch costs.

The command is parsed by a Typer app built once; the working directory is ``cwd`` while it
runs.  Returns what ``subprocess.run`` would: exit code, stdout, stderr."""

from __future__ import annotations

import contextlib
import io
import os
from dataclasses import dataclass
from pathlib import Path

import typer

from lstmablate import cli

_COMMAND = typer.main.get_command(cli.app)


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


def run_cli(*args: str, cwd: str | Path) -> Result:
    out, err = io.StringIO(), io.StringIO()
    real_app, old_cwd = cli.app, os.getcwd()
    cli.app = lambda args, standalone_mode: _COMMAND.main(args=args, standalone_mode=standalone_mode,
                                                          prog_name="lstmablate")
    try:
        os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                cli.main([str(a) for a in args])
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        os.chdir(old_cwd)
        cli.app = real_app
    return Result(code, out.getvalue(), err.getvalue())


def expect_error(r: Result, *fragments: str) -> str:
    """Assert that ``r`` is a refusal (exit code 2, no traceback) whose message holds every one of
    ``fragments``; returns the message on one line."""
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    text = " ".join(r.stderr.split())
    for f in fragments:
        assert f in text, (f, text)
    return text
