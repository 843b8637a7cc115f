"""The tests' one way to run the CLI, and one check of a refusal.

:func:`run_cli`: ``lstmablate ARGV`` run in this process, through the real entry point
(``cli.main``: Typer's parsing and the error printer), without the seconds a new Python
process with torch costs.  The command is parsed by a Typer app built once; the working
directory is ``cwd`` while it runs.  Returns what ``subprocess.run`` would: exit code,
stdout, stderr.

:func:`start_cli` / :func:`run_cli_process`: ``python -m lstmablate ARGV`` in a process of its
own, for only what the in-process runner cannot show — a signal (Ctrl-C, ``kill -9``), a
second process writing the same run, another ``PYTHONPATH`` (a plugin's entry points).

:func:`expect_error`: a refusal as ``cli.main`` prints one (exit code 2, one paragraph
starting ``error:``, no traceback), naming what the test says it names."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import typer

from lstmablate import cli

_COMMAND = typer.main.get_command(cli.app)
#: the CLI as a command of its own
CLI_PROCESS = (sys.executable, "-m", "lstmablate")


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


def start_cli(*args: str, cwd: str | Path, **popen) -> subprocess.Popen:
    """``lstmablate ARGS`` started in a process of its own and not waited for (``popen``: the
    keywords of :class:`subprocess.Popen`, e.g. its pipes)."""
    return subprocess.Popen([*CLI_PROCESS, *map(str, args)], cwd=cwd, **popen)


def run_cli_process(*args: str, cwd: str | Path, env: dict[str, str] | None = None,
                    timeout: float = 300) -> subprocess.CompletedProcess:
    """``lstmablate ARGS`` in a process of its own, waited for: exit code, stdout, stderr."""
    return subprocess.run([*CLI_PROCESS, *map(str, args)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def expect_error(r: Result | subprocess.CompletedProcess, *fragments: str, code: int = 2) -> str:
    """Assert that ``r`` is a refusal: exit code ``code``, no traceback, no blank line in its
    stderr (the message is one paragraph), every one of ``fragments`` in it; returns stderr on
    one line.  With ``code`` 2 (a user's mistake, :class:`~lstmablate.errors.UserError`) the
    message is the ``error: ...`` paragraph ``cli.main`` prints (after whatever the command
    printed before it failed); 130 is the line of a Ctrl-C before training, which is no
    error."""
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    assert "\n\n" not in r.stderr.strip(), r.stderr
    text = " ".join(r.stderr.split())
    if code == 2:
        assert "error:" in text, text
    for f in fragments:
        assert f in text, (f, text)
    return text
