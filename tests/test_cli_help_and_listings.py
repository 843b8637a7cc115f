"""What a new user meets first: help that teaches, --version, listings a person and a script
can read, data list/check that say what is there and what it blocks, and messages whose
square brackets survive rich markup.  In-process (Typer's runner), so it adds seconds."""

from __future__ import annotations

import csv
import io
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass

import pytest
from rich.console import Console
from typer.testing import CliRunner

from lstmablate.cli import app
from lstmablate.console import print_listing
from lstmablate.run.data_status import summarise

runner = CliRunner()


def invoke(*args, **env):
    """Run the command in this process; a UserError is exit code 2, its message the output's
    last paragraph (what ``lstmablate.cli.main`` does)."""
    from lstmablate.errors import UserError

    r = runner.invoke(app, list(args), env={"COLUMNS": "200", **env})
    if isinstance(r.exception, UserError):
        return Outcome(r.exception.exit_code, f"{r.output}\nerror: {r.exception}\n")
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    return Outcome(r.exit_code, r.output)


@dataclass
class Outcome:
    exit_code: int
    output: str


def commands():
    """(path, click command) of every command, the plugins' data subcommands included."""
    import typer.main

    root = typer.main.get_command(app)
    found = []

    def walk(cmd, path):
        subs = getattr(cmd, "commands", None)
        if subs:
            for name, sub in subs.items():
                walk(sub, path + [name])
        else:
            found.append((path, cmd))
    walk(root, [])
    return found


COMMANDS = commands()


def test_every_command_is_found():
    names = {" ".join(p) for p, _ in COMMANDS}
    assert {"train", "eval", "report", "list", "sweep", "bench", "visualize", "plot", "data path",
            "data list", "data check", "data fetch", "data dyck", "data validate-dyck",
            "data validate-conllu"} <= names


@pytest.mark.parametrize("path", [p for p, _ in COMMANDS], ids=[" ".join(p) for p, _ in COMMANDS])
def test_help_teaches(path):
    """No type placeholders (<bool>, <str>, <list[str]>), arguments as typed (RUN_DIR, not
    {run_dir}), a description on every option, and at least one example."""
    r = invoke(*path, "--help")
    assert r.exit_code == 0, r.output
    text = r.output
    assert not re.search(r"<(bool|str|int|float|path|list\[[a-z]+\])>", text), text
    assert "{" not in text.split("Usage:")[1].splitlines()[0], text  # the usage line
    assert "Example" in text, f"{' '.join(path)} --help has no example"
    _, cmd = dict((tuple(p), (p, c)) for p, c in COMMANDS)[tuple(path)]
    for p in cmd.params:
        assert (p.help or "").strip(), f"{' '.join(path)}: {p.name} has no description"


def test_brackets_in_help_and_messages_are_kept():
    assert "lstmablate[tensorboard]" in " ".join(invoke("train", "--help").output.split())
    pytest.importorskip("typer")
    try:
        import tensorboard  # noqa: F401
        pytest.skip("tensorboard is installed: its missing-package message cannot be shown")
    except ImportError:
        pass
    r = subprocess.run([sys.executable, "-m", "lstmablate", "train", "--task", "dyck", "--recipe",
                        "dyck-demo", "--tensorboard"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "lstmablate[tensorboard]" in " ".join(r.stderr.split()), r.stderr


def test_version():
    from lstmablate import __version__

    r = invoke("--version")
    assert r.exit_code == 0 and r.output.startswith(f"lstmablate {__version__}")


def test_listings_are_tab_separated_when_not_a_terminal():
    """Piped (the runner is not a terminal): a header line, then one row per line, every
    name whole."""
    from lstmablate.recipes import available_recipes

    r = invoke("list", "recipes")
    rows = list(csv.reader(io.StringIO(r.output), delimiter="\t"))
    assert rows[0] == ["name", "task", "description"]
    assert [row[0] for row in rows[1:]] == list(available_recipes())
    assert all(len(row) == 3 for row in rows)
    for what, first in (("cells", "name"), ("tasks", "name")):
        out = invoke("list", what, "--plain").output.splitlines()
        assert out[0].split("\t")[0] == first and all("\t" in line for line in out)


@pytest.mark.parametrize("width", [60, 80, 120])
def test_a_terminal_table_never_cuts_a_kept_column(width):
    names = ["squad-drqa-standin-dev-split", "dyck-rnn-trainable", "x"]
    rows = [[n, "some task", "a long description that has to wrap " * 3] for n in names]
    buf = io.StringIO()
    console = Console(file=buf, width=width, force_terminal=True, color_system=None)
    print_listing(("name", "task", "description"), rows, keep=("name",), console=console)
    text = buf.getvalue()
    for n in names:
        assert n in text, text
    assert "…" not in text


def test_shards_fold_into_shell_brace_notation():
    shards = [f"bwb/train/news.en-{i:05d}-of-00100" for i in range(1, 100)]
    folded = summarise(["bwb/vocab.txt", *shards, "bwb/heldout-00000", "bwb/heldout-00001"])
    assert folded[0] == ("bwb/vocab.txt", ["bwb/vocab.txt"])
    assert folded[1] == ("bwb/train/news.en-{00001..00099}-of-00100", shards)
    assert [s for s, _ in folded[2:]] == ["bwb/heldout-00000", "bwb/heldout-00001"]  # < 3: as is
    gaps = summarise(["a1.txt", "a2.txt", "a5.txt"])
    assert gaps == [("a{1,2,5}.txt", ["a1.txt", "a2.txt", "a5.txt"])]


def test_data_list_says_what_is_present(tmp_path):
    (tmp_path / "ptb").mkdir()
    (tmp_path / "ptb" / "ptb.train.txt").write_text("a b\n")
    rows = list(csv.reader(io.StringIO(invoke("data", "list", "--plain", "--data-dir",
                                              str(tmp_path)).output), delimiter="\t"))
    assert rows[0] == ["dataset", "tasks", "file", "status", "source", "licence"]
    status = {row[2]: row[3] for row in rows[1:]}
    assert status["ptb/ptb.train.txt"] == "present" and status["ptb/ptb.valid.txt"] == "missing"
    assert sum(r.startswith("bwb/training-") for r in status) == 99  # --plain: a row per file
    rows = list(csv.reader(io.StringIO(invoke("data", "list", "--data-dir", str(tmp_path)).output),
                           delimiter="\t"))
    assert sum(row[2].startswith("bwb/training-") for row in rows) == 1  # piped: shards folded


def test_data_check_without_data_gives_the_advice_once_per_dataset(tmp_path):
    r = invoke("data", "check", "--data-dir", str(tmp_path))
    assert r.exit_code == 0, r.output  # nothing damaged: missing data is not an error here
    lines = r.output.splitlines()
    advice = [line for line in lines if "To get them" in line]
    from lstmablate.task import available_datasets

    catalogue = available_datasets()  # bwb, glove-*, multi30k, ptb, squad, sst, ud-ewt, ...
    assert {"bwb", "glove-6b-100d", "glove-840b-300d", "multi30k", "ptb", "squad", "sst",
            "ud-ewt"} <= set(catalogue)
    assert len(advice) == len(catalogue)  # once each
    glove = next(line for line in advice if line.startswith("glove-6b-100d"))
    assert "parsing-ewt," in glove and "parsing-ewt-cpu" not in glove  # the stand-in reads none
    ready = next(line for line in lines if line.startswith("ready to run (dyck): "))
    assert "dyck-demo" in ready.split(": ", 1)[1].split(", ")
    rows = [line.split("\t") for line in lines if line.count("\t") == 4]
    assert rows[0] == ["dataset", "tasks", "file", "status", "blocks / note"]
    squad = {row[2]: row for row in rows if row[0] == "squad"}
    assert "squad-drqa-standin-dev-split" in squad["squad/dev-v1.1.json"][4]
    assert "squad-drqa-standin-dev-split" not in squad["squad/train-v1.1.json"][4]


def test_data_check_knows_the_standin_needs_only_the_dev_file(tmp_path, real_data_dir):
    (tmp_path / "squad").mkdir()
    shutil.copy(real_data_dir / "squad" / "dev-v1.1.json.gz", tmp_path / "squad")
    r = invoke("data", "check", "squad-drqa", "--data-dir", str(tmp_path))
    text = " ".join(r.output.split())
    assert r.exit_code == 2 and "squad/train-v1.1.json" in text  # the default config reads it
    assert "ready to run (squad-drqa): squad-drqa-standin-dev-split" in text
    assert "this blocks squad-bidaf, squad-drqa, table2." in text


def test_sweep_list_says_so_when_every_run_is_finished(tmp_path, tiny_recipe):
    from lstmablate.run.sweep import plan_sweep, run_sweep

    out = tmp_path / "runs"
    run_sweep(plan_sweep(str(tiny_recipe), out, overrides=["train.max_steps=2"], threads=1),
              console=Console(file=io.StringIO()))
    r = invoke("sweep", str(tiny_recipe), "--list", "--out", str(out), "--set", "train.max_steps=2")
    assert r.exit_code == 0
    assert "every run of" in r.output and "is finished (4 runs under" in r.output
