"""Every option of ``compare`` and ``report``, and every field of a run's records, fed what a
careless or hostile user types (the VALUES of tests/test_config_validation_property.py: nan,
inf, 0, -1, huge numbers, a word, a mapping, a list, YAML that does not parse, YAML tags,
nesting deep enough to exhaust the stack).

* Options: each value is refused with exit 2 and one paragraph naming the option, or is a
  valid value of the option; never a traceback.
* Records: each top-level key of a run's ``config.yaml`` and ``result.json`` and each key of
  a ``metrics.jsonl`` line is replaced by each value.  ``report`` and ``plot`` either skip the
  run and name the damaged file, or take it as it is — only where the value has the field's
  type; ``compare`` and ``eval --scores`` stop with one paragraph naming the file, or go on
  where the value has the field's type.  Never a traceback, never a number from a damaged
  record.

The commands run in-process (tests/cli_in_process.py) on the small tree of
tests/significance_runs.py; ``plot`` draws nothing (its figure is a stub: the curves, their
CSV and the checks are computed).
"""

from __future__ import annotations

import csv
import io
import json
import shutil
from dataclasses import fields
from pathlib import Path

import pytest
import yaml

from cli_in_process import run_cli
from significance_runs import small_runs, small_tree, tree  # noqa: F401 - fixtures
from test_config_validation_property import VALUES, message_problem
from lstmablate.results import plot as plot_module
from lstmablate.run.runs import RunFiles, RunResult

RUN = "runs/sig/lstm/seed-1"  # the run whose records are damaged
OTHER = "runs/sig/lstm-srnn/seed-1"

#: the values (by name) a field of each kind may take; any other must be refused
STRINGS = {"nan", "inf", "word"}  # what YAML and our JSON reading make strings
MAY_ACCEPT = {
    "str": STRINGS | {"1e30"},  # (YAML 1.1 reads 1e30 as a string)
    "json-str": STRINGS,
    "seed": {"zero", "billion"},
    "count": {"zero", "billion"},
    "positive": {"billion"},
    "seconds": {"zero", "billion", "1e30", "huge-int"},
    "number": {".nan", "-.inf", "zero", "minus-one", "billion", "1e30", "huge-int"},
    "mapping": {"mapping"},  # a section, metrics, best: {a: 1} has the type
    "none": set(),
}

#: config.yaml: each top-level key and its kind
CONFIG_KEYS = {"task": "str", "cell": "str", "experiment": "str", "seed": "seed",
               "data": "mapping", "model": "mapping", "train": "mapping", "eval": "mapping",
               "recipe": "str", "recipe_file": "str"}

#: result.json: every key RunResult reads (and the duplicate ``dev`` of older versions)
RESULT_KEYS = {
    "task": "json-str", "cell": "json-str", "experiment": "json-str", "primary": "json-str",
    "recipe": "json-str", "seed": "seed", "higher_is_better": "none", "shortened": "none",
    "best": "mapping", "test": "mapping", "dev_final": "mapping", "dev": "mapping",
    "test_checkpoint": "none", "steps": "count", "epochs": "count", "params": "count",
    "skipped_nonfinite": "count", "world_size": "positive", "train_time_s": "seconds",
    "train_cpu_s": "seconds", "wall_time_s": "seconds",
}

#: a metrics.jsonl line: each key the trainer writes
METRICS_KEYS = {"step": "count", "epoch": "count", "split": "json-str", "lr": "number",
                "train_loss": "number", "accuracy": "number", "loss": "number"}

PLACEHOLDER = "HOSTILE_VALUE_HERE"


@pytest.fixture
def here(small_runs, monkeypatch) -> Path:
    """A copy of the small tree; plot's figure a stub."""
    class Figure:
        def savefig(self, f, **kwargs):
            f.write(b"figure")

    monkeypatch.setattr(plot_module, "draw", lambda *a, **k: Figure())
    return small_runs


def as_json(value: str) -> str:
    """The JSON a typed value becomes in a JSON record: as typed where it is JSON (nesting too
    deep to parse included), else what YAML reads from it (a word, NaN, a mapping), else as
    typed (malformed JSON)."""
    try:
        json.loads(value)
        return value
    except RecursionError:
        return value
    except ValueError:
        pass
    try:
        return json.dumps(yaml.safe_load(value))
    except yaml.YAMLError:
        return value


def json_with(doc: dict, key: str, value: str) -> str:
    """``doc`` as one line of JSON, its ``key`` holding ``value`` as :func:`as_json` makes it."""
    return json.dumps({**doc, key: PLACEHOLDER}).replace(json.dumps(PLACEHOLDER), as_json(value))


def one_paragraph(message: str, names: tuple[str, ...]) -> str | None:
    """message_problem, and no traceback (a Typer usage error is one paragraph in a box)."""
    if "Traceback" in message:
        return f"a traceback: {message[-300:]!r}"
    return message_problem(message, names)


class Walk:
    """Runs each case and collects what went wrong."""

    def __init__(self, root: Path):
        self.root, self.failures, self.cases = root, [], 0

    def cli(self, *args: str):
        self.cases += 1
        try:
            return run_cli(*args, cwd=self.root)
        except Exception as e:  # noqa: BLE001 - collected: the point of the walk
            self.failures.append(f"{' '.join(args)[:120]}: {type(e).__name__}: {e}"[:400])
            return None

    def refused_or_accepted(self, context: str, done, may: bool, names: tuple[str, ...]) -> None:
        """An error command: exit 2 with one paragraph naming one of ``names``, or exit 0 where
        the value may be accepted."""
        if done is None:
            return
        if done.returncode == 0:
            if not may:
                self.failures.append(f"{context}: accepted")
        elif done.returncode != 2:
            self.failures.append(f"{context}: exit {done.returncode}: {done.stderr[-300:]!r}")
        else:
            problem = one_paragraph(done.stderr, names)
            if problem:
                self.failures.append(f"{context}: {problem}")

    def skipped_or_accepted(self, context: str, done, may: bool, damaged: str,
                            skipped: bool | None = None) -> None:
        """A skipping command (report, plot): exit 0, and the run either skipped with a
        warning naming ``damaged``, or taken (only where the value may be accepted)."""
        if done is None:
            return
        if done.returncode != 0 or "Traceback" in done.stderr:
            self.failures.append(f"{context}: exit {done.returncode}: {done.stderr[-300:]!r}")
            return
        warned = damaged in " ".join(done.stderr.split())
        skipped = warned if skipped is None else skipped
        if skipped and not warned:
            self.failures.append(f"{context}: skipped without a warning naming {damaged}")
        if not skipped and not may:
            self.failures.append(f"{context}: accepted")

    def check(self, at_least: int) -> None:
        assert not self.failures, "\n".join(self.failures[:40]) + f"\n({len(self.failures)} " \
            f"failures in {self.cases} cases)"
        assert self.cases >= at_least


# -- the options ---------------------------------------------------------------------------
COMPARE_OPTIONS = {"--split": "none", "--metric": "none", "--resamples": "none",
                   "--seed": "seed", "--level": "none", "RUNS_A": "none", "RUNS_B": "none"}
REPORT_OPTIONS = {"--table": "none", "--format": "none", "--against": "none", "--level": "none",
                  "--resamples": "none", "--seed": "seed", "RUNS_DIR": "none"}
#: the words a refusal of the option names (a recipe of --table is looked up by name)
OPTION_NAMES = {"RUNS_A": ("run folder",), "RUNS_B": ("run folder",),
                "RUNS_DIR": ("runs directory",), "--table": ("recipe", "--table"),
                "--format": ("report format",), "--against": ("--against",)}


def test_every_option_of_compare_and_report_is_checked(here):
    walk = Walk(here)
    for option, kind in COMPARE_OPTIONS.items():
        for name, value in VALUES.items():
            args = {"RUNS_A": ["--", value, OTHER], "RUNS_B": ["--", RUN, value]}.get(
                option, [RUN, OTHER, option, value])
            if option == "--level":  # so that a level down to 1e-5 is reachable
                args += ["--resamples", "100000"] if name != "zero" else []
            walk.refused_or_accepted(f"compare {option} {name}", walk.cli("compare", *args),
                                     name in MAY_ACCEPT[kind], OPTION_NAMES.get(option, (option,)))
    for option, kind in REPORT_OPTIONS.items():
        for name, value in VALUES.items():
            args = ["--", value] if option == "RUNS_DIR" else ["runs", "--significance", option,
                                                               value]
            walk.refused_or_accepted(f"report {option} {name}", walk.cli("report", *args),
                                     name in MAY_ACCEPT[kind], OPTION_NAMES.get(option, (option,)))
    walk.check(len(VALUES) * (len(COMPARE_OPTIONS) + len(REPORT_OPTIONS)))


# -- the records ---------------------------------------------------------------------------
@pytest.fixture
def pair(here) -> Path:
    """The tree cut to RUN and OTHER: every reader of the walk reads two runs."""
    for run in ("runs/sig/lstm/seed-2", "runs/sig/lstm-srnn/seed-2"):
        shutil.rmtree(here / run)
    return here


def _report_takes(walk: Walk, context: str, may: bool, damaged: str) -> None:
    """report as CSV: the run's row finished, or damaged with a problem naming the file, or
    the run skipped with a warning naming it; a run taken is rendered as markdown too."""
    done = walk.cli("report", "runs", "--format", "csv")
    if done is None or done.returncode != 0:
        walk.skipped_or_accepted(f"{context}: report csv", done, may, damaged)
        return
    row = {r["path"]: r for r in csv.DictReader(io.StringIO(done.stdout))}.get(RUN)
    taken = row is not None and row["status"] == "finished"
    if row is not None and row["status"] == "damaged" and damaged not in row["problem"]:
        walk.failures.append(f"{context}: report csv: a problem not naming {damaged}: "
                             f"{row['problem']!r}")
    walk.skipped_or_accepted(f"{context}: report csv", done, may, damaged, not taken)
    if taken:
        walk.skipped_or_accepted(f"{context}: report", walk.cli("report", "runs"), True, damaged,
                                 False)


def walk_record(walk: Walk, path: Path, keys: dict[str, str], text_with, commands) -> None:
    """Each key of ``keys`` given each value: ``path`` rewritten as ``text_with(key, value)``
    and ``commands(context, may)`` run on it; the file restored afterwards."""
    original = path.read_text()
    for key, kind in keys.items():
        for name, value in VALUES.items():
            path.write_text(text_with(key, value))
            commands(f"{path.name} {key}: {name}", name in MAY_ACCEPT[kind])
    path.write_text(original)


def _compare(walk: Walk, context: str, may: bool, damaged: str) -> None:
    walk.refused_or_accepted(f"{context}: compare",
                             walk.cli("compare", RUN, OTHER, "--resamples", "200"), may, (damaged,))


@pytest.mark.slow
def test_every_key_of_config_yaml_given_each_value(pair):
    walk = Walk(pair)
    path = pair / RUN / RunFiles.CONFIG
    saved = yaml.safe_load(path.read_text())
    assert set(CONFIG_KEYS) - {"recipe", "recipe_file"} <= set(saved)
    damaged = f"{RUN}/{RunFiles.CONFIG}"

    def text_with(key: str, value: str) -> str:
        return yaml.safe_dump({**saved, key: PLACEHOLDER}, sort_keys=False).replace(PLACEHOLDER,
                                                                                    value)

    def commands(context: str, may: bool) -> None:
        _report_takes(walk, context, may, damaged)
        walk.skipped_or_accepted(f"{context}: plot", walk.cli("plot", "runs", "--out", "c.png",
                                                              "--force"), may, damaged)
        _compare(walk, context, may, damaged)

    walk_record(walk, path, CONFIG_KEYS, text_with, commands)
    walk.check(len(CONFIG_KEYS) * len(VALUES) * 3)


@pytest.mark.slow
def test_every_key_of_result_json_given_each_value(pair):
    walk = Walk(pair)
    path = pair / RUN / RunFiles.RESULT
    saved = json.loads(path.read_text())
    assert set(RESULT_KEYS) == {f.name for f in fields(RunResult)} - {"extra"} | {"dev"}
    damaged = f"{RUN}/{RunFiles.RESULT}"

    def commands(context: str, may: bool) -> None:
        _report_takes(walk, context, may, damaged)
        _compare(walk, context, may, damaged)
        done = walk.cli("eval", RUN, "--scores")  # the run has no checkpoint to score with
        if done is not None and done.returncode == 2 and "not in the run folder" in done.stderr:
            done = type(done)(0, "", "")  # result.json was read: taken
        walk.refused_or_accepted(f"{context}: eval --scores", done, may, (damaged,))

    walk_record(walk, path, RESULT_KEYS, lambda key, value: json_with(saved, key, value),
                commands)
    walk.check(len(RESULT_KEYS) * len(VALUES) * 3)


@pytest.mark.slow
def test_every_key_of_a_metrics_line_given_each_value(pair):
    walk = Walk(pair)
    path = pair / RUN / RunFiles.METRICS
    first, second = path.read_text().splitlines()
    saved = json.loads(second)
    assert set(METRICS_KEYS) == set(saved)

    def text_with(key: str, value: str) -> str:
        return f"{first}\n{json_with(saved, key, value)}\n"

    def commands(context: str, may: bool) -> None:
        done = walk.cli("plot", "runs", "--out", "c.png", "--force", "--x", "epoch")
        walk.skipped_or_accepted(f"{context}: plot", done, may, f"{RUN}/metrics.jsonl, line 2")

    walk_record(walk, path, METRICS_KEYS, text_with, commands)
    walk.check(len(METRICS_KEYS) * len(VALUES))
