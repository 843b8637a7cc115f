"""Every option of every ``lstmablate data`` subcommand is checked: exit 2 and one paragraph
naming the option, or accepted; never a traceback.

A property-style walk over the parameters of every subcommand of ``lstmablate data`` (``path``,
``list``, ``check``, ``fetch`` and those the tasks register: ``dyck``, ``validate-dyck``,
``validate-conllu``, and any added later), read from the command-line parser itself, fed the
hostile values of :mod:`test_config_validation_property` (nan, inf, 0, -1, huge numbers, words,
YAML, tags, nesting 3,000 deep) and what a path can be besides a directory (a NUL byte, a name
too long for the file system, a file, a named pipe).  The other parameters hold good values.

Each value is either refused -- exit code 2, no traceback, one paragraph naming the option (its
name, or for an argument its value) -- or accepted: the command runs, or reaches the point where
its real work would start (``data check`` verifying, ``data fetch`` downloading, ``data dyck``
generating), replaced here by a sentinel so the walk takes seconds.  A refused value writes
nothing.  The data directory itself is walked the same way through ``LSTMABLATE_DATA``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import typer

from lstmablate import cli
from lstmablate.errors import UserError

from cli_in_process import run_cli
from test_config_validation_property import VALUES

#: what a path may be that is not a usable file or directory, by name (``{file}``,
#: ``{fifo}``: created in the test's folder)
PATHS = {"nul-byte": "a\0b", "long-name": "x" * 300, "long-path": "/".join(["y" * 200] * 30),
         "a-file": "{file}", "a-fifo": "{fifo}"}

#: the good values each subcommand runs with: its arguments (in order) and options
GOOD = {
    "path": ([], {}),
    "list": ([], {}),
    "check": ([], {}),
    "fetch": (["ptb"], {}),
    "dyck": ([], {"--out": "out", "--k": "2", "--m": "3", "--seed": "1",
                  "--train-sequences": "4", "--dev-sequences": "2", "--test-sequences": "2",
                  "--train-max-length": "20"}),
    "validate-dyck": (["good.txt"], {"--k": "2", "--m": "3"}),
    "validate-conllu": (["good.conllu"], {}),
}

#: options of which two may not be given together: walking one leaves the other out
EXCLUSIVE = {"--train-tokens": "--train-sequences", "--dev-tokens": "--dev-sequences",
             "--test-tokens": "--test-sequences", "--preset": "--k"}

CONLLU = "1\tI\tI\tPRON\tPRP\t_\t2\tnsubj\t_\t_\n2\tran\trun\tVERB\tVBD\t_\t0\troot\t_\t_\n\n"


class ReachedWork(UserError):
    """Raised where a command's real work would start: every value passed every check."""


def reached(*args, **kwargs):
    raise ReachedWork("reached the work")


@pytest.fixture
def walk(tmp_path, monkeypatch):
    """The test's folder as working directory, with a data directory, good input files, a file
    and a FIFO; the commands' real work replaced by the sentinel."""
    from lstmablate import data
    from lstmablate.run import data_status
    from lstmablate_tasks.dyck import generator

    (tmp_path / "data").mkdir()
    (tmp_path / "good.txt").write_text("(a (b b) a) END\n(b b) END\n")
    (tmp_path / "good.conllu").write_text(CONLLU)
    (tmp_path / "afile").write_text("x")
    os.mkfifo(tmp_path / "afifo")
    monkeypatch.setenv(data.ENV_VAR, str(tmp_path / "data"))
    monkeypatch.setattr(data, "fetch", reached)
    monkeypatch.setattr(data_status, "check", reached)
    monkeypatch.setattr(generator, "make_splits", reached)
    monkeypatch.setattr(generator, "make_preset_splits", reached)
    return tmp_path


def hostile(root: Path) -> dict[str, str]:
    paths = {k: v.format(file=root / "afile", fifo=root / "afifo") for k, v in PATHS.items()}
    return {**VALUES, **paths}


def listing(root: Path) -> set[Path]:
    return {p for p in root.rglob("*")}


def problem(argv: list[str], r, names: tuple[str, ...]) -> str | None:
    """What is wrong with the outcome of ``lstmablate data ARGV`` (None: refused as it should
    be, or accepted)."""
    err = r.stderr
    if "Traceback" in err or r.returncode not in (0, 2):
        return f"exit {r.returncode}: {err[-600:]!r}"
    if r.returncode == 0 or "reached the work" in err:
        return None
    if "\n\n" in err.strip():
        return f"not one paragraph: {err[:300]!r}"
    text = " ".join(err.split())
    if not any(n and n in text for n in names):
        return f"the message names none of {names}: {text[:300]!r}"
    return None


def test_every_value_of_every_data_option_is_refused_by_name_or_accepted(walk, capsys):
    root = walk
    group = typer.main.get_command(cli.app).commands["data"]
    assert set(GOOD) <= set(group.commands), sorted(group.commands)
    untested = set(group.commands) - set(GOOD)
    assert not untested, f"add the good values of `lstmablate data {untested.pop()}` to GOOD"
    values = hostile(root)
    before = listing(root)
    failures, n = [], 0
    for name, command in group.commands.items():
        args, options = GOOD[name]
        for param in command.params:
            if getattr(param, "is_flag", False):
                continue
            option = param.opts[0]
            for value_name, value in values.items():
                if param.param_type_name == "argument":
                    i = [p for p in command.params if p.param_type_name == "argument"].index(param)
                    argv_args = args[:i] + [value] + args[i + 1:]
                    argv_opts = dict(options)
                    names = (param.name, param.metavar, value[:40])
                else:
                    argv_args = list(args)
                    argv_opts = {k: v for k, v in options.items() if k != EXCLUSIVE.get(option)
                                 and EXCLUSIVE.get(k) != option}
                    argv_opts[option] = value
                    names = (option,)
                # "--": an argument such as -1 is not read as an option (as in a shell)
                argv = ["data", name, *[x for kv in argv_opts.items() for x in kv], "--",
                        *argv_args]
                n += 1
                r = run_cli(*argv, cwd=root)
                why = problem(argv, r, names)
                if why:
                    failures.append(f"data {name} {option}={value_name}: {why}")
                if r.returncode == 2 and "reached the work" not in r.stderr:
                    new = listing(root) - before
                    if new:
                        failures.append(f"data {name} {option}={value_name} was refused but "
                                        f"wrote {sorted(map(str, new))[:3]}")
                for p in sorted(listing(root) - before, reverse=True):  # an accepted value's
                    if p.is_dir() and not p.is_symlink():                # output: gone again
                        shutil.rmtree(p, ignore_errors=True)
                    else:
                        p.unlink(missing_ok=True)
    with capsys.disabled():
        print(f"\n[data commands] {len(group.commands)} subcommands, {n} calls: every hostile "
              "value refused by name or accepted, no traceback")
    assert not failures, "\n".join(failures[:40]) + f"\n({len(failures)} failures)"
    assert n > 300


@pytest.mark.parametrize("command", ["path", "list", "check", "fetch ptb"])
def test_a_hostile_data_directory_from_the_environment_names_the_variable(walk, monkeypatch,
                                                                         command):
    root = walk
    for value_name, value in hostile(root).items():
        if "\0" in value:
            continue  # an environment variable cannot hold a NUL byte
        monkeypatch.setenv("LSTMABLATE_DATA", value)
        r = run_cli("data", *command.split(), cwd=root)
        why = problem(["data", command], r, ("LSTMABLATE_DATA",))
        assert not why, (value_name, why)


@pytest.mark.parametrize("command, code, says", [
    ("path", 0, "it does not exist yet"),
    ("list", 0, "it does not exist"),
    ("check", 0, "does not exist (yet), so every file is missing"),
    ("check ptb", 2, "which the data directory does not hold"),
])
def test_a_missing_data_directory(tmp_path, command, code, says):
    """`data path` and `data list` say that it is missing; `data check` lists every file as
    missing, with how to get it, as for an empty folder (it fails only for a TASK whose
    files are missing)."""
    r = run_cli("data", *command.split(), "--data-dir", "nowhere", cwd=tmp_path)
    assert r.returncode == code and "Traceback" not in r.stderr, r.stderr
    assert says in " ".join((r.stdout + r.stderr).split())
    assert not (tmp_path / "nowhere").exists()


@pytest.mark.parametrize("command", ["path", "list", "check", "check ptb", "fetch ptb"])
def test_a_file_as_data_directory_is_refused(walk, command):
    """The issue's `lstmablate data check --data-dir /etc/passwd` exited 0."""
    r = run_cli("data", *command.split(), "--data-dir", "afile", cwd=walk)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "--data-dir: the data directory" in r.stderr and "is a file, not a directory" in \
        " ".join(r.stderr.split())


def test_train_refuses_a_file_as_data_directory(walk, tiny_recipe):
    r = run_cli("train", "--task", "dyck", "--recipe", str(tiny_recipe), "--data-dir", "afile",
                "--out", "runs", cwd=walk)
    assert r.returncode == 2 and "is a file, not a directory" in " ".join(r.stderr.split())
    assert not (walk / "runs").exists()


def test_dyck_sizes_are_bounded_as_the_tasks_config_bounds_them(walk):
    """`data dyck --k 100000 --m 100000` ran out of memory after 104 s; `train` refuses k and m
    over 1,000 (the config's upper_bounds), and so does `data dyck`, before generating."""
    from lstmablate_tasks.dyck.task import DyckData

    for option, field in (("--k", "k"), ("--m", "m"), ("--train-tokens", "train_tokens"),
                          ("--test-sequences", "test_sequences")):
        bound = DyckData.upper_bounds[field]
        r = run_cli("data", "dyck", "--out", "out", option, str(bound + 1), cwd=walk)
        assert r.returncode == 2, r.stderr
        assert f"{option} must be an integer between 1 and {bound:,}" in " ".join(r.stderr.split())
        assert not (walk / "out").exists()
    r = run_cli("data", "validate-dyck", "good.txt", "--k", "100000", "--m", "3", cwd=walk)
    assert r.returncode == 2 and "--k must be an integer between 1 and 1,000" in r.stderr
