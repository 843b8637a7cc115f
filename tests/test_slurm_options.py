"""The sbatch script of `sweep --launcher slurm` runs the job and nothing else; every option of
`sweep` is bounded.

The script submitit writes is a shell script whose ``#SBATCH`` lines are comments to the shell
and options to sbatch.  A value with a line break once put its second half on a line of its own,
which the shell ran before the job (``--partition $'gpu\\ntouch /tmp/MARKER #'``).  Here each
Slurm option, from the command line and from slurm.yaml, is fed hostile values (line breaks as
bash and sbatch see them -- LF -- and as other readers see them -- CR, U+0085, U+2028 --, NUL,
a tab, ``;``, ``$(...)``, backticks, ``#``, quotes, backslashes, very long values): each is
refused with exit 2 and one message naming the option (or the file and line), or, where sbatch
allows it (quotes, spaces and shell characters in a ``--slurm-opt`` value, shell lines in
``setup``), the printed script is read line by line as bash and sbatch read it, and every line
that runs is one the launcher writes.  Then a walk over every option of `sweep`, fed the
hostile values of test_config_validation_property.py: each is refused naming the option or
accepted as a valid value, never a traceback.  No Slurm is needed (``--dry-run``).
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

import pytest
import typer

from cli_in_process import run_cli
from lstmablate import cli
from lstmablate.run import slurm_options
from lstmablate.run.runs import SlurmFiles
from test_config_validation_property import VALUES

pytest.importorskip("submitit")  # --dry-run writes the script with submitit's writer

#: what a hostile user types into a Slurm option, by name
HOSTILE = {
    "newline": "gpu\ntouch /tmp/MARKER #",
    "carriage-return": "gpu\rtouch MARKER",
    "nul": "gpu\0touch MARKER",
    "tab": "gpu\ttouch MARKER",
    "u0085": "gpu\x85touch MARKER",
    "u2028": "gpu\u2028touch MARKER",
    "semicolon": "gpu; touch MARKER",
    "command-substitution": "$(touch MARKER)",
    "backticks": "`touch MARKER`",
    "hash": "gpu #MARKER",
    "quotes": "it's \"MARKER\"",
    "spaces": "a b c",
    "backslash": "gpu\\",
    "hetjob": "x hetjob y",
    "very-long": "g" * 100_000,
}
#: what no line of the script may hold: a line break to some reader, another unprintable
#: character, a value too long
NOT_ONE_LINE = {"newline", "carriage-return", "nul", "tab", "u0085", "u2028", "very-long"}
#: what no #SBATCH line may hold besides: sbatch's escape and its heterogeneous-job separator
NOT_SBATCH = NOT_ONE_LINE | {"backslash", "hetjob"}


@pytest.fixture(autouse=True)
def no_user_config(monkeypatch, tmp_path):
    """No slurm.yaml of the user running the tests is read."""
    monkeypatch.delenv(slurm_options.CONFIG_ENV, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))


def sbatch_words(line: str) -> list[str]:
    """The words sbatch reads in what follows ``#SBATCH`` (Slurm's src/sbatch/opt.c reads them
    so): split at unquoted white space, ``'...'`` and ``"..."`` quote, a backslash escapes the
    next character even inside quotes, an unquoted ``#`` ends the line."""
    words, word, quote, escaped, started = [], [], "", False, False
    for ch in line:
        if escaped:
            word.append(ch)
            escaped = False
        elif ch == "\\":
            escaped = started = True
        elif quote:
            if ch == quote:
                quote = ""
            else:
                word.append(ch)
        elif ch in "'\"":
            quote, started = ch, True
        elif ch == "#":
            break
        elif ch.isspace():
            if started:
                words.append("".join(word))
            word, started = [], False
        else:
            word.append(ch)
            started = True
    assert not quote, f"an unmatched quote: {line!r}"
    if started:
        words.append("".join(word))
    return words


def check_script(script: str, folder: Path, setup: tuple[str, ...] = ()) -> dict[str, str]:
    """The ``#SBATCH`` options of a printed script, ``{name: value}``; fails unless the script,
    read line by line as bash and sbatch read it (both break lines at LF only), runs nothing but
    ``setup`` and the job: every line is printable (one line to every reader: no CR, U+0085,
    U+2028, NUL), every ``#SBATCH`` line comes before the first command and is one option, and
    every other line is a comment, blank, or one the launcher writes."""
    lines = script.split("\n")
    assert lines[0] == "#!/bin/bash"
    options: dict[str, str] = {}
    commands: list[str] = []
    for line in lines:
        assert line.isprintable() and len(line.splitlines()) <= 1, f"not one line: {line!r}"
        if line.startswith(("#SBATCH", "#SLURM")):
            assert not commands, f"an #SBATCH line after a command: {line!r}"
            assert not re.search("hetjob|packjob", line, re.I) and "\\" not in line, line
            words = sbatch_words(line[len("#SBATCH"):])
            assert words == shlex.split(line[len("#SBATCH"):]), line  # as the shell unquotes
            assert len(words) == 1 and re.fullmatch(r"--[a-z][a-z0-9-]*(=.*)?", words[0], re.S), \
                f"not one sbatch option: {line!r}"
            name, _, value = words[0][2:].partition("=")
            assert name not in options, f"--{name} twice"
            options[name] = value
        elif line.strip() and not line.startswith("#"):
            commands.append(line)
    assert commands[:-1] == [*setup, "export SUBMITIT_EXECUTOR=slurm"], commands
    srun = shlex.split(commands[-1])
    assert srun[:2] == ["srun", "--unbuffered"], commands[-1]
    assert srun[-5:] == [sys.executable, "-u", "-m", "submitit.core._submit", str(folder)], srun
    assert [w for w in srun[2:-5] if not w.startswith(str(folder) + "/")] == ["--output", "--error"]
    return options


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else b"/"
            for p in sorted(root.rglob("*"))}


def refused(r, *names: str) -> str:
    """The one-paragraph message of a refusal (exit 2, no traceback) that names ``names``."""
    assert r.returncode == 2, (r.returncode, r.stdout[-500:], r.stderr[-2000:])
    assert "Traceback" not in r.stderr and "\n\n" not in r.stderr.strip(), r.stderr
    message = " ".join(r.stderr.split())
    for name in names:
        assert name in message, (name, message)
    return message


def dry_run(recipe: Path, *args: str, cwd: Path):
    return run_cli("sweep", recipe, "--out", "runs", "--launcher", "slurm", "--dry-run", *args,
                   cwd=cwd)


# -- the reproduction ------------------------------------------------------------------
def test_a_partition_with_a_line_break_is_refused_not_written_as_a_shell_line(tmp_path):
    r = run_cli("sweep", "dyck-demo", "--launcher", "slurm", "--dry-run", "--partition",
                "gpu\ntouch /tmp/MARKER #", cwd=tmp_path)
    message = refused(r, "--partition", "partition name")
    assert "#SBATCH" not in r.stdout and "touch" not in r.stdout
    assert "'gpu\\ntouch /tmp/MARKER #'" in message  # the value as Python writes it: one line
    assert not list(tmp_path.iterdir())


# -- each Slurm option, fed the hostile values -------------------------------------------------
def test_hostile_values_of_the_slurm_options_are_refused_or_run_nothing(tmp_path, tiny_recipe):
    folder = tmp_path / "runs" / SlurmFiles.FOLDER
    before = snapshot(tmp_path)
    n_refused = n_accepted = 0
    for value_name, value in HOSTILE.items():
        for option in ("--partition", "--account", "--qos", "--mem", "--time"):
            refused(dry_run(tiny_recipe, option, value, cwd=tmp_path), option)
            n_refused += 1
        refused(dry_run(tiny_recipe, "--slurm-opt", f"{value}=1", cwd=tmp_path), "--slurm-opt",
                "not an sbatch option name")
        n_refused += 1
        r = dry_run(tiny_recipe, "--slurm-opt", f"comment={value}", cwd=tmp_path)
        if value_name in NOT_SBATCH:
            refused(r, "--slurm-opt", "--comment", "#SBATCH line")
            n_refused += 1
        else:  # sbatch takes it, quoted; the shell never reads it
            assert r.returncode == 0, (value_name, r.stderr)
            assert check_script(r.stdout, folder)["comment"] == value
            n_accepted += 1
        assert snapshot(tmp_path) == before, value_name
    assert (n_refused, n_accepted) == (len(HOSTILE) * 6 + len(NOT_SBATCH),
                                       len(HOSTILE) - len(NOT_SBATCH))


def test_hostile_values_in_slurm_yaml_are_refused_naming_the_file_and_line(tmp_path, monkeypatch,
                                                                           tiny_recipe):
    conf = tmp_path / "slurm.yaml"
    monkeypatch.setenv(slurm_options.CONFIG_ENV, str(conf))
    folder = tmp_path / "runs" / SlurmFiles.FOLDER
    for value_name, value in HOSTILE.items():
        quoted = json.dumps(value)  # a YAML double-quoted scalar: one line, escapes read back
        for key in ("partition", "account", "qos", "mem", "time"):
            conf.write_text(f"cpus-per-job: 2\n{key}: {quoted}\n")
            refused(dry_run(tiny_recipe, cwd=tmp_path), str(conf), "line 2", key)
        conf.write_text(f"slurm-opts:\n  constraint: a100\n  ? {quoted}\n  : 1\n")  # (any length)
        refused(dry_run(tiny_recipe, cwd=tmp_path), str(conf), "line 3", "sbatch option name")
        conf.write_text(f"slurm-opts:\n  constraint: a100\n  comment: {quoted}\n")
        r = dry_run(tiny_recipe, cwd=tmp_path)
        if value_name in NOT_SBATCH:
            refused(r, str(conf), "line 3", "--comment", "#SBATCH line")
        else:
            assert r.returncode == 0, (value_name, r.stderr)
            assert check_script(r.stdout, folder)["comment"] == value
        conf.write_text(f"setup:\n  - module load cuda\n  - {quoted}\n")
        r = dry_run(tiny_recipe, cwd=tmp_path)
        if value_name in NOT_ONE_LINE:
            refused(r, str(conf), "line 3", "setup")
        else:  # a setup line is the user's own shell line: it runs, on a line of its own
            assert r.returncode == 0, (value_name, r.stderr)
            check_script(r.stdout, folder, setup=("module load cuda", value))
        assert not (tmp_path / "runs").exists(), value_name
    conf.write_text("setup:\n  - '#SBATCH --array=0-999'\n")  # sbatch would read it
    refused(dry_run(tiny_recipe, cwd=tmp_path), str(conf), "line 2", "#SBATCH line")


def test_quotes_and_spaces_where_sbatch_allows_them_reach_sbatch_as_written(tmp_path, tiny_recipe,
                                                                            monkeypatch):
    conf = tmp_path / "slurm.yaml"
    conf.write_text("partition: gpu\nslurm-opts:\n  mail_user: a.b+runs@example.org\n"
                    "  exclusive: true\nsetup:\n  - source \"$HOME/venv/bin/activate\"\n")
    monkeypatch.setenv(slurm_options.CONFIG_ENV, str(conf))
    comment = "it's a \"sweep\" of #1; $(not run) `nor this` & | > < ! * ?"
    r = dry_run(tiny_recipe, "--partition", "gpu-a100,gpu.v100", "--account", "lab_1+x",
                "--qos", "high", "--mem", "64g", "--time", "6-23:59:59",
                "--slurm-opt", f"comment={comment}", "--slurm-opt", "--constraint=a100|h100",
                "--slurm-opt", "gpus=2", "--gpus-per-job", "2", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    options = check_script(r.stdout, tmp_path / "runs" / SlurmFiles.FOLDER,
                           setup=('source "$HOME/venv/bin/activate"',))
    assert {k: options[k] for k in ("comment", "constraint", "partition", "account", "qos", "mem",
                                    "time", "mail-user", "exclusive", "gpus", "gpus-per-node")} \
        == {"comment": comment, "constraint": "a100|h100", "partition": "gpu-a100,gpu.v100",
            "account": "lab_1+x", "qos": "high", "mem": "64g", "time": str(7 * 24 * 60),
            "mail-user": "a.b+runs@example.org", "exclusive": "", "gpus": "2",
            "gpus-per-node": "2"}


def test_the_runs_folder_and_the_recipe_name_reach_the_script_as_one_line_each(tmp_path,
                                                                                tiny_recipe):
    for out in ("runs\ntouch MARKER", "runs\u2028x", "runs%j", "run\\s", "my hetjob runs"):
        refused(run_cli("sweep", tiny_recipe, "--out", out, "--launcher", "slurm", "--dry-run",
                        cwd=tmp_path), "--out", "runs folder")
    assert not [p for p in tmp_path.iterdir() if p.name != tiny_recipe.name]
    odd = tmp_path / "odd dir $(x)" / "t'iny;\n`x`#.yaml"  # a recipe may be named anything
    odd.parent.mkdir()
    odd.write_text(tiny_recipe.read_text())
    r = run_cli("sweep", odd, "--out", "my runs 'quoted'", "--launcher", "slurm", "--dry-run",
                cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    options = check_script(r.stdout, tmp_path / "my runs 'quoted'" / SlurmFiles.FOLDER)
    assert options["job-name"] == "lstmablate-t_iny___x__"


@pytest.mark.parametrize("opt, expected", [
    ("array=0-9", "set by lstmablate"), ("arr=0-9", "would read --arr as --array"),
    ("job_name=x", "set by lstmablate"), ("o=x.log", "would read --o as --output"),
    ("time=10", "give it as --time"), ("gpus_per_node=2", "give it as --gpus-per-job"),
    ("cpus-per-task=8", "give it as --cpus-per-job"), ("mem=1G", "give it as --mem"),
    ("nodes=2", "one node, one Slurm task"), ("part=gpu", "would read --part as --partition"),
    ("Constraint=a100", "not an sbatch option name"), ("comment=", "needs a value"),
    ("x" * 41, "not an sbatch option name"), ("=a100", "not an sbatch option name"),
])
def test_slurm_opt_keys_are_sbatch_long_options_lstmablate_does_not_set(tmp_path, tiny_recipe, opt,
                                                                       expected):
    refused(dry_run(tiny_recipe, "--slurm-opt", opt, cwd=tmp_path), "--slurm-opt", expected)


# -- bounds ------------------------------------------------------------------------------------
@pytest.mark.parametrize("args, expected", [
    (["--jobs", "0"], "--jobs must be an integer between 1 and"),
    (["--jobs", "-1"], "--jobs must be an integer between 1 and"),
    (["--jobs", "100000"], "--jobs must be an integer between 1 and"),
    (["--jobs", "99999999999999999999999"], "--jobs must be an integer between 1 and"),
])
def test_sweep_jobs_is_at_least_one_and_bounded(tmp_path, tiny_recipe, args, expected):
    refused(run_cli("sweep", tiny_recipe, "--out", "runs", *args, cwd=tmp_path), expected)
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("args, expected", [
    (["--time", "0"], "at least one minute"), (["--time", "366-00:00:00"], "at most 365 days"),
    (["--time", "99999999999"], "not a Slurm time limit"), (["--time", "1-24"], "D-HH"),
    (["--time", "10:60"], "MM:SS"), (["--time", "1:60:00"], "HH:MM:SS"),
    (["--time", "٣"], "not a Slurm time limit"), (["--time", "240\n"], "not a Slurm time limit"),
    (["--time", "UNLIMITED"], "not a Slurm time limit"),
    (["--gpus-per-job", "65"], "--gpus-per-job must be an integer between 0 and 64"),
    (["--gpus-per-job", "-1"], "--gpus-per-job must be an integer between 0 and 64"),
    (["--cpus-per-job", "0"], "--cpus-per-job must be an integer between 1 and 4,096"),
    (["--cpus-per-job", "4097"], "--cpus-per-job must be an integer between 1 and 4,096"),
    (["--array-parallelism", "0"], "--array-parallelism must be an integer between 1 and"),
    (["--array-parallelism", "100001"], "--array-parallelism must be an integer between 1 and"),
    (["--mem", "65T"], "at most 64T"), (["--mem", "-1"], "--mem must be a size"),
    (["--mem", "16GB"], "--mem must be a size"), (["--mem", "16G\n"], "--mem must be a size"),
    (["--mem", "9" * 40], "--mem must be a size"),
])
def test_slurm_numbers_are_bounded(tmp_path, tiny_recipe, args, expected):
    refused(dry_run(tiny_recipe, *args, cwd=tmp_path), args[0], expected)


@pytest.mark.parametrize("args, line", [
    (["--time", "365-00:00:00"], "#SBATCH --time=525600"), (["--time", "90:30"], "--time=91"),
    (["--time", "1-00:00:30"], "#SBATCH --time=1441"),
    (["--gpus-per-job", "0"], "--gpus-per-node=0"),
    (["--gpus-per-job", "64"], "--gpus-per-node=64"),
    (["--mem", "0"], "#SBATCH --mem=0"), (["--mem", "64T"], "#SBATCH --mem=64T"),
    (["--mem", "500m"], "#SBATCH --mem=500m"), (["--array-parallelism", "2"], "--array=0-3%2"),
    (["--cpus-per-job", "4096"], "--cpus-per-task=4096"),
])
def test_values_at_the_bounds_are_accepted(tmp_path, tiny_recipe, args, line):
    r = dry_run(tiny_recipe, *args, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    check_script(r.stdout, tmp_path / "runs" / SlurmFiles.FOLDER)
    assert line in r.stdout


@pytest.mark.parametrize("text, line", [
    ("time: 4:00:00\n", "#SBATCH --time=240"), ("time: 90:30\n", "#SBATCH --time=91"),
    ("time: 1-12:00:00\n", "#SBATCH --time=2160"), ("time: 240\n", "#SBATCH --time=240"),
    ("time: '4:00:00'\n", "#SBATCH --time=240"),
])
def test_a_time_written_unquoted_in_slurm_yaml_is_the_clock_time_written(tmp_path, monkeypatch,
                                                                         tiny_recipe, text, line):
    """YAML 1.1 reads ``4:00:00`` as 14400 (base 60): ten days, not four hours."""
    conf = tmp_path / "slurm.yaml"
    conf.write_text(text)
    monkeypatch.setenv(slurm_options.CONFIG_ENV, str(conf))
    r = dry_run(tiny_recipe, cwd=tmp_path)
    assert r.returncode == 0 and line in r.stdout.splitlines(), r.stderr


@pytest.mark.parametrize("text, where, expected", [
    ("time: '4:00:00'\npartition: " + "[" * 3000 + "]" * 3000 + "\n", "slurm.yaml", "nested"),
    ("slurm-opts: " + "{a: " * 40 + "1" + "}" * 40 + "\n", "slurm.yaml", "nested"),
    ("gpus-per-job: 100000\n", "line 1", "between 0 and 64"),
    ("gpus-per-job: '2'\n", "line 1", "must be an integer"),
    ("array-parallelism: 0\n", "line 1", "between 1 and"),
    ("time: 1-24\n", "line 1", "not a Slurm time limit"),
    ("mem: true\n", "line 1", "sbatch --mem"),
    ("account: [a, b]\n", "line 1", "account name"),
    ("slurm-opts:\n  constraint: a100\n  comment: null\n", "line 3", "needs a value"),
    ("slurm-opts:\n  exclusive: false\n", "line 2", "needs a value"),
    ("slurm-opts:\n  1: x\n", "line 2", "not an sbatch option name"),
    ("slurm-opts: [a]\n", "line 1", "mapping"),
    ("setup:\n  - ok\n  - [x]\n", "line 3", "a shell line (text)"),
    ("setup: module load cuda\n", "line 1", "list of shell lines"),
])
def test_a_bad_slurm_yaml_is_one_message_naming_the_file_and_line(tmp_path, monkeypatch,
                                                                  tiny_recipe, text, where,
                                                                  expected):
    conf = tmp_path / "slurm.yaml"
    conf.write_text(text)
    monkeypatch.setenv(slurm_options.CONFIG_ENV, str(conf))
    refused(dry_run(tiny_recipe, cwd=tmp_path), str(conf), where, expected)


# -- every option of sweep ---------------------------------------------------------------------
#: what each of sweep's options may accept of VALUES (it may still refuse them); the rest
#: must be refused naming the option.  A path takes any name of a folder (the data directory
#: need not exist yet: a run's readers say what is missing); a Slurm name takes the words and
#: numbers; a --slurm-opt takes a word as a flag's name (sbatch itself knows its options).
WORDS = {"nan", ".nan", "inf", "-.inf", "zero", "minus-one", "billion", "1e30", "huge-int",
         "word"}
MAY_ACCEPT = {
    "RECIPE": set(), "--set": set(), "--threads": set(), "--device": set(), "--jobs": set(),
    "--launcher": set(), "--time": set(), "--cpus-per-job": set(), "--array-parallelism": set(),
    "--reuse": set(),  # (no value names a folder of runs here)
    "--out": set(VALUES) - {"deep"}, "--data-dir": set(VALUES),
    "--gpus-per-job": {"zero"}, "--mem": {"zero"},
    "--partition": WORDS, "--account": WORDS, "--qos": WORDS,
    "--slurm-opt": {"nan", "inf", "word"},
}
#: the options of a submission to Slurm (tried with --launcher slurm --dry-run; the others
#: with --list, which runs nothing)
SLURM_OPTIONS = {"--partition", "--gpus-per-job", "--cpus-per-job", "--mem", "--time", "--account",
                 "--qos", "--array-parallelism", "--slurm-opt"}


def sweep_options() -> dict[str, str]:
    """Every option of `sweep` that takes a value, by its name in messages (its argument
    RECIPE by its metavar)."""
    command = typer.main.get_command(cli.app).commands["sweep"]
    out = {}
    for param in command.params:
        if getattr(param, "is_flag", False) or param.name == "help":
            continue
        name = param.metavar if param.param_type_name == "argument" else \
            max(param.opts, key=len)
        out[name] = param.name
    return out


def test_every_option_of_sweep_refuses_hostile_values_naming_itself_or_accepts_them(tmp_path,
                                                                                   tiny_recipe):
    options = sweep_options()
    assert set(options) == set(MAY_ACCEPT), "an option of sweep that this walk does not know"
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "keep.txt").write_text("kept")
    before = snapshot(tmp_path)
    failures, n, accepted = [], 0, {}
    for option in sorted(options):
        for value_name, value in VALUES.items():
            if option == "RECIPE":
                argv = ["sweep", "--out", "runs", "--list", "--", value]
            elif option in SLURM_OPTIONS:
                argv = ["sweep", tiny_recipe, "--out", "runs", "--launcher", "slurm", "--dry-run",
                        option, value]
            else:
                argv = ["sweep", tiny_recipe, "--out", "runs", "--list", option, value]
            n += 1
            r = run_cli(*argv, cwd=tmp_path)
            context = f"sweep {option} {value_name}"
            message = " ".join(r.stderr.split())
            if "Traceback" in r.stderr or r.returncode not in (0, 2):
                failures.append(f"{context}: exit {r.returncode}: {r.stderr[-300:]}")
            elif r.returncode == 0 and value_name not in MAY_ACCEPT[option]:
                failures.append(f"{context}: accepted")
            elif r.returncode == 2 and option not in message and \
                    not (option == "RECIPE" and "recipe" in message):
                failures.append(f"{context}: the message does not name {option}: {message[:300]}")
            elif r.returncode == 0 and option in SLURM_OPTIONS:
                check_script(r.stdout, tmp_path / "runs" / SlurmFiles.FOLDER)
            accepted[option] = accepted.get(option, 0) + (r.returncode == 0)
            if snapshot(tmp_path) != before:
                failures.append(f"{context}: changed the folder")
                before = snapshot(tmp_path)
    assert not failures, "\n".join(failures)
    assert n == len(MAY_ACCEPT) * len(VALUES)
    # (each option accepts exactly what it may: the walk reached the script or the listing)
    assert accepted == {k: len(v) for k, v in MAY_ACCEPT.items()}, accepted
