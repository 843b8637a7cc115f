"""Every value of every option is checked before any data is read.

A property-style walk over every field of every registered task's ``data``, ``model`` and
``eval`` config and of the ``train`` config, fed what a careless or hostile user types (nan,
inf, 0, -1, huge numbers, a word where a number goes, a mapping, a list, YAML that does not
parse, YAML tags that would construct Python objects, nesting deep enough to exhaust the
stack), through ``train``, ``sweep --set`` and (for ``eval.*``) ``eval --set``; and the same
for the command-line options ``--threads``, ``--seed``, ``--experiment`` and ``--out``.

Each value either is refused with a one-paragraph UserError (exit code 2) that names the
option, or reaches the point where data would be read -- replaced here by a sentinel, so the
walk runs in-process in seconds.  What a value may do is fixed per type: a bool takes only
true/false, a number never nan/inf/words/YAML, an integer never more than 2**63, a count
never -1, and a value that sizes memory never more than its declared upper bound
(``upper_bounds`` of the config).  Nothing is left on disk by a refused value.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import types
import typing
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from lstmablate.run import runner, sweep
from lstmablate import task as task_module
from lstmablate.config import TrainConfig
from lstmablate.recipes import resolve_config
from lstmablate.errors import UserError
from lstmablate.run.runs import RunFiles, write_config

from cli_in_process import expect_error, run_cli

QUIET = Console(file=io.StringIO())

#: what a user may type, by name
VALUES = {
    "nan": "nan", ".nan": ".nan", "inf": "inf", "-.inf": "-.inf",
    "zero": "0", "minus-one": "-1", "billion": "1000000000", "1e30": "1e30",
    "huge-int": "99999999999999999999999",
    "word": "zero", "mapping": "{a: 1}", "list": "[1, 2]",
    "unclosed-list": "[0.9", "unclosed-mapping": "{",
    "python-tag": "!!python/object/apply:os.system ['true']",
    "tag-in-list": "[!!python/name:os.system x]",
    "deep": "[" * 3000 + "]" * 3000,
}

#: the values a field of each kind may take (it may still refuse them); any other is refused
MAY_ACCEPT = {
    "bool": set(),
    "int": {"zero", "billion"},
    "float": {"zero", "billion", "1e30", "huge-int"},
    "str": set(VALUES),
    "seq": set(VALUES) - {"unclosed-list", "tag-in-list", "deep"},
    "map": {"mapping"},
}

#: integer options that only count or select (epochs, steps, patience, a vocabulary size to
#: check, a cap on examples, a shard number): no upper bound, as no value of theirs allocates
#: memory.  Every other integer option declares one in its config's ``upper_bounds``.
COUNTS = {
    "train": {"decay_start", "decay_steps", "plateau_patience", "max_epochs", "max_steps",
              "eval_every", "patience"},
    "data": {"vocab_size", "train_shards", "dev_shard", "test_shard", "data_seed", "max_length",
             "src_vocab_size", "tgt_vocab_size", "min_freq", "min_word_count", "n_buckets",
             "max_chars", "length_pool", "standin_dev_articles", "max_train_questions"},
    "model": {"tune_partial"},
    "eval": {"max_sentences", "min_bucket_count", "max_span"},
}

#: options where -1 means something: a target of the primary dev metric (stop once it is this
#: good), whose sign is the metric's
NEGATIVE_OK = {"train.stop_at"}


class ReachedData(UserError):
    """Raised where the data would be read: the value passed every check."""


def kind(tp) -> str:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
        origin = typing.get_origin(tp)
    if tp is bool:
        return "bool"
    if tp is int:
        return "int"
    if tp is float:
        return "float"
    if tp is str:
        return "str"
    if origin in (list, tuple):
        return "seq"
    if origin is dict or tp is dict:
        return "map"
    raise AssertionError(f"a config field of type {tp} is not covered by this test")


def sections_of(task_name: str) -> dict[str, type]:
    cls = task_module.get_task(task_name)
    return {"data": cls.DataConfig, "model": cls.ModelConfig, "eval": cls.EvalConfig}


@pytest.fixture
def walk(monkeypatch, tmp_path):
    """The sentinel where data would be read, and the task registry read once."""
    eps = task_module._entry_points()
    monkeypatch.setattr(task_module, "_entry_points", lambda: eps)
    monkeypatch.setattr(runner, "resolve_data_dir",
                        lambda *a, **k: (_ for _ in ()).throw(ReachedData("reached the data")))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def outcome(call) -> tuple[str, str]:
    """("accepted" | "refused", message); any other exception fails the test."""
    try:
        call()
    except ReachedData:
        return "accepted", ""
    except UserError as e:
        return "refused", str(e)
    raise AssertionError("the call neither refused the value nor reached the data")


def message_problem(message: str, names: tuple[str, ...]) -> str | None:
    """What is wrong with a refusal's message (None: one paragraph naming the option)."""
    if not message.strip():
        return "an empty message"
    if "\n\n" in message.strip() or "Traceback" in message:
        return f"not one paragraph: {message!r}"
    if names and not any(n in message for n in names):
        return f"the message names none of {names}: {message!r}"
    return None


def walk_calls(calls: dict[str, typing.Callable[[], object]], context: str, names: tuple[str, ...],
               may_accept: bool, out: Path, failures: list[str]) -> int:
    """Make each of ``calls`` (by command) with one value; add to ``failures`` what is wrong: a
    crash, a refusal whose message is not one paragraph naming one of ``names``, an
    acceptance where the value may not be accepted, a run folder left behind.  Returns the
    number of calls."""
    for command, call in calls.items():
        where = f"{command} {context}"
        try:
            result, message = outcome(call)
        except Exception as e:  # noqa: BLE001 - collected: the point of the walk
            failures.append(f"{where}: {type(e).__name__}: {e}")
            continue
        problem = message_problem(message, names) if result == "refused" else None
        if problem:
            failures.append(f"{where}: {problem}")
        elif result == "accepted" and not may_accept:
            failures.append(f"{where}: accepted")
        if out.exists():
            failures.append(f"{where}: left {out} behind")
    return len(calls)


def test_every_value_of_every_config_field_is_checked_before_data(walk, capsys):
    root = walk
    tasks = task_module.available_tasks()
    assert {"bwb", "dyck", "nmt", "parsing", "ptb", "squad-bidaf", "squad-drqa"} <= set(tasks)
    train_hints = typing.get_type_hints(TrainConfig)
    cases = []  # (task, section, field name, kind, upper bound or None)
    for name in tasks:
        for section, cfg_cls in sections_of(name).items():
            hints = typing.get_type_hints(cfg_cls)
            bounds = getattr(cfg_cls, "upper_bounds", {}) or {}
            for f in dataclasses.fields(cfg_cls):
                cases.append((name, section, f.name, kind(hints[f.name]), bounds.get(f.name)))
    # the train section is the same for every task: walked once
    train_bounds = getattr(TrainConfig, "upper_bounds", {}) or {}
    cases += [("dyck", "train", f.name, kind(train_hints[f.name]), train_bounds.get(f.name))
              for f in dataclasses.fields(TrainConfig)]

    recipes = {}
    for name in tasks:
        recipes[name] = root / f"sweep-{name}.yaml"
        recipes[name].write_text(yaml.safe_dump({"task": name, "cells": ["lstm"], "seeds": [1]}))
    eval_runs = {}
    for name in tasks:
        files = RunFiles(root / "eval-runs" / name)
        write_config(files, resolve_config(task_module.get_task(name), "lstm"))
        eval_runs[name] = files.root

    failures, n_calls, fields_seen = [], 0, set()
    for task_name, section, field_name, k, bound in cases:
        fields_seen.add((task_name, section, field_name))
        option = f"{section}.{field_name}"
        if k == "int" and bound is None and field_name not in COUNTS.get(section, ()):
            failures.append(f"{task_name} {option}: an integer option with neither an upper bound "
                            "(upper_bounds) nor a place in COUNTS")
        if bound is not None:
            assert bound < 1_000_000_000, option  # so that "billion" tests it
        for value_name, value in VALUES.items():
            item = f"{option}={value}"
            may = MAY_ACCEPT[k] | ({"minus-one"} if option in NEGATIVE_OK else set())
            if bound is not None:
                may = may - {"billion"}
            out = root / "runs"
            calls = {
                "train": lambda: runner.train_run(task_name, "lstm", overrides=[item], out=out,
                                                  console=QUIET, progress=False),
                "sweep": lambda: sweep.run_sweep(sweep.plan_sweep(
                    str(recipes[task_name]), out, overrides=[item]), console=QUIET),
            }
            if section == "eval":
                calls["eval"] = lambda: runner.evaluate_run(eval_runs[task_name],
                                                            eval_overrides=[item])
            n_calls += walk_calls(calls, f"--set {item!r} ({task_name})", (option,),
                                  value_name in may, out, failures)
    with capsys.disabled():
        print(f"\n[config validation] {len(tasks)} tasks, {len(fields_seen)} config fields "
              f"(every field of data/model/eval of every task, and train), {len(VALUES)} values "
              f"each, {n_calls} train/sweep/eval calls: every bad value refused before any data "
              "is read")
    assert not failures, "\n".join(failures[:60]) + f"\n({len(failures)} failures)"


def test_bounded_values_are_refused_just_above_their_bound(walk):
    """``bound`` + 1 is refused with a message giving the bound, for every declared bound."""
    n = 0
    for task_name in task_module.available_tasks():
        for section, cfg_cls in sections_of(task_name).items():
            for field_name, bound in (getattr(cfg_cls, "upper_bounds", {}) or {}).items():
                item = f"{section}.{field_name}={bound + 1}"
                with pytest.raises(UserError) as refused:
                    resolve_config(task_module.get_task(task_name), "lstm", overrides=[item])
                assert f"{section}.{field_name} must be <= {bound:,}" in str(refused.value), item
                n += 1
    assert n >= 60  # every task declares its bounds


# ----------------------------------------------------------------- command-line options

BAD_THREADS = [0, -3, 100_000, 10**30]
BAD_SEEDS = [-1, 2**32, 9223372036854775807, 99999999999999999999999]
BAD_EXPERIMENTS = ["/abs/path", "x/../../../..", "..", ".", "", "a/b", "x" * 300, "a\nb"]
GOOD_EXPERIMENTS = ["nan", "0", "-1", "table-1_small.v2"]


def test_every_command_line_option_is_checked_before_data(walk, tiny_recipe):
    root = walk
    out = root / "runs"
    afile = root / "afile"
    afile.write_text("x")
    failures, n = [], 0

    def expect(context, call, refused, names):
        nonlocal n
        n += 1
        try:
            result, message = outcome(call)
        except Exception as e:  # noqa: BLE001
            failures.append(f"{context}: {type(e).__name__}: {e}")
            return
        if refused and result != "refused":
            failures.append(f"{context}: accepted")
        elif refused and message_problem(message, names):
            failures.append(f"{context}: {message_problem(message, names)}")
        elif not refused and result != "accepted":
            failures.append(f"{context}: refused: {message}")
        for p in (out, root / "escape", Path("/abs")):
            if p.exists():
                failures.append(f"{context}: wrote {p}")

    train = functools.partial(runner.train_run, "dyck", "lstm", recipe=str(tiny_recipe),
                              console=QUIET, progress=False)
    run = RunFiles(root / "eval-run")
    write_config(run, resolve_config(task_module.get_task("dyck"), "lstm"))
    for threads in BAD_THREADS:
        expect(f"train --threads {threads}", lambda: train(out=out, threads=threads), True, ("--threads",))
        expect(f"eval --threads {threads}", lambda: runner.evaluate_run(run.root, threads=threads),
               True, ("--threads",))
        expect(f"sweep --threads {threads}", lambda: sweep.run_sweep(sweep.plan_sweep(
            str(tiny_recipe), out, threads=threads), console=QUIET), True, ("--threads",))
    for seed in BAD_SEEDS:
        expect(f"train --seed {seed}", lambda: train(out=out, seed=seed), True, ("--seed",))
        recipe = root / "seeds.yaml"
        recipe.write_text(tiny_recipe.read_text().replace("seeds: [1, 2]", f"seeds: [{seed}]"))
        expect(f"sweep with seeds: [{seed}]", lambda: sweep.plan_sweep(str(recipe), out), True,
               ("seeds",))
    for seed in (0, 2**32 - 1):
        expect(f"train --seed {seed}", lambda: train(out=out, seed=seed), False, ())
    for name in BAD_EXPERIMENTS:
        expect(f"train --experiment {name!r}", lambda: train(out=out, experiment=name), True,
               ("--experiment",))
        recipe = root / "exp.yaml"
        recipe.write_text(tiny_recipe.read_text().replace("experiment: tiny",
                                                          f"experiment: {json_str(name)}"))
        expect(f"sweep with experiment: {name!r}", lambda: sweep.plan_sweep(str(recipe), out),
               True, ("experiment",))
    for name in GOOD_EXPERIMENTS:
        expect(f"train --experiment {name!r}", lambda: train(out=out, experiment=name), False, ())
    for bad_out in (afile, root / ("x" * 300), Path("a\0b")):
        expect(f"train --out {str(bad_out)[:20]!r}", lambda: train(out=bad_out), True, ("--out",))
        expect(f"sweep --out {str(bad_out)[:20]!r}", lambda: sweep.run_sweep(
            sweep.plan_sweep(str(tiny_recipe), bad_out), console=QUIET), True, ("--out",))
    for good_out in ("nan", "0", "-1"):
        expect(f"train --out {good_out}", lambda: train(out=root / good_out), False, ())
    assert not failures, "\n".join(failures)
    assert n >= 50


def json_str(s: str) -> str:
    import json

    return json.dumps(s)


# ----------------------------------------------------------------- the same through the CLI


def test_the_cli_gives_exit_2_and_one_paragraph_for_each_kind_of_bad_value(walk, tiny_recipe):
    """One field of each kind through the real command line (Typer, the error printer): exit 2,
    no traceback, no blank line in the message, no run directory."""
    root = walk
    run = RunFiles(root / "eval-run")
    write_config(run, resolve_config(task_module.get_task("dyck"), "lstm"))
    fields = ["data.batch_size", "model.dropout", "train.eval_test", "model.cell_options",
              "train.betas", "train.stop_at", "data.objective"]
    commands = []
    for item in fields:
        for value in VALUES.values():
            commands.append(["train", "--task", "dyck", "--recipe", str(tiny_recipe), "--out",
                             "runs", "--set", f"{item}={value}"])
            commands.append(["sweep", str(tiny_recipe), "--out", "runs", "--set", f"{item}={value}"])
    for value in VALUES.values():
        commands.append(["eval", str(run.root), "--set", f"eval.batch_size={value}"])
    for flag, values in (("--threads", ["nan", "0", "-3", "100000", "1" + "0" * 30]),
                         ("--seed", ["-1", "4294967296", "99999999999999999999999", "x"]),
                         ("--experiment", BAD_EXPERIMENTS[:-1]),
                         ("--out", ["afile", "x" * 300])):
        for value in values:
            commands.append(["train", "--task", "dyck", "--recipe", str(tiny_recipe), "--out",
                             "runs", flag, value] if flag != "--out" else
                            ["train", "--task", "dyck", "--recipe", str(tiny_recipe), flag, value])
    (root / "afile").write_text("x")
    for argv in commands:
        r = run_cli(*argv, cwd=root)
        code, err = r.returncode, r.stderr
        context = " ".join(argv)[:200]
        assert code == 2, (context, code, err)
        assert "Traceback" not in err, (context, err)
        assert "\n\n" not in err.strip(), (context, err)
        assert not (root / "runs").exists(), context
    assert len(commands) > 250


# ----------------------------------------------------------------- what the probe typed

def probe_inputs(recipe: str, run: str, elsewhere: str) -> list[tuple[list[str], str]]:
    train = ["train", "--task", "dyck", "--recipe", recipe, "--out", "runs"]
    nmt = ["train", "--task", "nmt", "--out", "runs"]
    sweep_ = ["sweep", recipe, "--out", "runs"]
    tag = "[!!python/name:os.system x, 0.9]"
    return [
        ([*train, "--threads", "-3"], "--threads must be between 1 and"),
        ([*train, "--seed", "99999999999999999999999"], "--seed: a seed must be an integer"),
        ([*train, "--seed", "9223372036854775807"], "--seed: a seed must be an integer"),
        ([*train, "--set", "train.betas=[0.9"], "train.betas: expected a list written in YAML"),
        ([*train, "--set", "model.cell_options={"], "model.cell_options: expected a mapping"),
        ([*train, "--set", f"train.betas={tag}"], "train.betas: expected a list written in YAML"),
        ([*sweep_, "--set", "train.betas=[0.9"], "train.betas: expected a list written in YAML"),
        ([*sweep_, "--set", "model.cell_options={"], "model.cell_options: expected a mapping"),
        ([*sweep_, "--set", f"train.betas={tag}"], "train.betas"),
        ([*sweep_, "--set", "train.lr=-5"], "train.lr must be > 0"),
        ([*sweep_, "--threads", "-3"], "--threads must be between 1 and"),
        ([*train, "--experiment", elsewhere], "--experiment"),
        ([*train, "--experiment", "x/../../../.."], "--experiment"),
        ([*nmt, "--set", "data.batch_size=100000"], "data.batch_size must be <= 8,192"),
        ([*nmt, "--set", "model.layers=1e9"], "model.layers must be <= 64"),
        (["eval", run, "--set", "eval.batch_size=100000"], "eval.batch_size must be <= 8,192"),
        (["eval", run, "--set", "eval.beam_size=100000"], "eval.beam_size must be <= 256"),
        (["eval", run, "--threads", "-3"], "--threads must be between 1 and"),
        (["train", "--task", "parsing", "--out", "runs", "--set", "data.batch_tokens=1e12"],
         "data.batch_tokens must be <= 1,000,000"),
    ]


def test_the_inputs_the_probe_found_are_refused_before_anything_is_written(walk, tiny_recipe):
    root = walk
    run = RunFiles(root / "eval-run")
    cfg = resolve_config(task_module.get_task("nmt"), "lstm")
    write_config(run, cfg)
    elsewhere = str(root / "elsewhere")
    for argv, message in probe_inputs(str(tiny_recipe), str(run.root), elsewhere):
        r = run_cli(*argv, cwd=root)
        code, err = r.returncode, r.stderr
        text = " ".join(err.split())
        assert code == 2 and message in text and "Traceback" not in err, (argv, text)
        assert not (root / "runs").exists() and not Path(elsewhere).exists(), argv


def test_a_thread_count_that_crashed_openmp_is_refused(tmp_path, tiny_recipe):
    """--threads 100000 crashed libgomp (exit 139) after the run directory existed."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "lstmablate", "train", "--task", "dyck", "--recipe",
                        str(tiny_recipe), "--out", "runs", "--threads", "100000"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "--threads must be between 1 and" in " ".join(r.stderr.split())
    assert not (tmp_path / "runs").exists()


# ----------------------------------------------------------------- recipe keys

#: the values each top-level recipe key may accept (it may still refuse them); any other value
#: is refused, by the command reading the recipe, with a message naming the key
RECIPE_MAY_ACCEPT = {
    "base": set(), "overlay": set(), "task": set(), "data": set(), "model": set(), "train": set(),
    "eval": set(),
    # strings (YAML 1.1 reads nan, inf and 1e30, without a dot, as text) and folder names
    "experiment": {"nan", "inf", "zero", "minus-one", "billion", "huge-int", "word", "1e30"},
    "description": {"nan", "inf", "word", "1e30"}, "reference_source": {"nan", "inf", "word", "1e30"},
    "reference": set(), "cells": set(), "seeds": {"list"}, "cell_seeds": set(),
    "cell_overrides": set(), "grid": set(), "table": set(),
}

#: values that are not YAML a recipe may hold (a syntax error, a tag, nesting past the bound):
#: the reader refuses the file, naming it and the line, before any key is looked at
NOT_YAML = {"unclosed-list", "unclosed-mapping", "python-tag", "tag-in-list", "deep"}


@pytest.mark.slow  # (about 20 s: 544 commands, each reading a recipe)
def test_every_value_of_every_recipe_key_is_checked_when_the_recipe_is_read(walk, capsys):
    """Each top-level recipe key, fed each value, through ``train --recipe`` and
    ``sweep --list``: refused (exit 2, one paragraph naming the key, nothing written) or
    accepted only where the value is of the key's type."""
    from conftest import TINY_DYCK
    from lstmablate.recipes import RECIPE_KEYS

    assert set(RECIPE_MAY_ACCEPT) == set(RECIPE_KEYS)
    root = walk
    out = root / "runs"
    tiny = {**yaml.safe_load(TINY_DYCK), "cells": ["lstm"], "seeds": [1]}  # one run to plan
    failures, n = [], 0
    for key in RECIPE_KEYS:
        for value_name, value in VALUES.items():
            recipe = root / f"r-{key}-{value_name}.yaml"
            rest = yaml.safe_dump({k: v for k, v in tiny.items() if k != key}, sort_keys=False)
            recipe.write_text(rest + f"{key}: {value}\n")
            calls = {
                "train": lambda: runner.train_run("dyck", "lstm", recipe=recipe.name, out=out,
                                                  console=QUIET, progress=False),
                "sweep --list": lambda: sweep.plan_sweep(recipe.name, out) and throw(ReachedData),
            }
            n += walk_calls(calls, f"with `{key}: {value[:30]}`",
                            (recipe.name,) if value_name in NOT_YAML else (key,),
                            value_name in RECIPE_MAY_ACCEPT[key], out, failures)
    with capsys.disabled():
        print(f"\n[recipe validation] {len(RECIPE_KEYS)} recipe keys, {len(VALUES)} values each, "
              f"{n} train / sweep --list calls: every value of the wrong type refused, naming "
              "the key")
    assert not failures, "\n".join(failures[:60]) + f"\n({len(failures)} failures)"


def throw(error: type[Exception]) -> None:
    raise error("reached the data")


# ----------------------------------------------------------------- what the issue reported

def expect_refused(r, *fragments):
    """A refusal (:func:`expect_error`) before any data is read."""
    text = expect_error(r, *fragments)
    assert "reached the data" not in text, text
    return text


def test_a_recipe_of_the_wrong_shape_is_refused_when_it_is_read(walk, tiny_recipe):
    root = walk
    train = ["train", "--task", "dyck", "--out", "runs", "--recipe"]
    for extra, fragments in (
            ("reference: hello", ("`reference` must be a mapping of cell to a mapping of metric",
                                  "got 'hello'")),
            ("reference: {lstm: {ppl: [1]}}", ("`reference` must be",)),
            ("cell_overrides: [1, 2]", ("`cell_overrides` must be a mapping of cell",)),
            ("cell_overrides: {lstm: {training: {lr: 1}}}", ("section in cell_overrides",
                                                             "'training'")),
            ("cell_seeds: {lstm: 5}", ("`cell_seeds` must be",)),
            ("grid: {m: [1, 2]}", ("`grid` must be a mapping of section.key",)),
            ("table: {title: [1]}", ("`table.title` must be a string",)),
            ("description: [a, b]", ("`description` must be a string",))):
        recipe = root / "shape.yaml"
        recipe.write_text(tiny_recipe.read_text() + extra + "\n")
        for argv in ([*train, str(recipe)], ["sweep", str(recipe), "--list"],
                     ["report", ".", "--table", str(recipe)]):
            expect_refused(run_cli(*argv, cwd=root), "shape.yaml", *fragments)
    assert not (root / "runs").exists()


def test_recipe_names_paths_and_empty_names(walk, tiny_recipe):
    root = walk
    train = ["train", "--task", "dyck", "--out", "runs", "--recipe"]
    expect_refused(run_cli(*train, "", cwd=root), "--recipe is empty")
    (root / "dyck-demo").mkdir()  # a folder named like a shipped recipe does not shadow it
    (root / "dyck-demo" / "notes.txt").write_text("x")
    r = run_cli(*train, "dyck-demo", cwd=root)
    assert r.returncode == 2 and "reached the data" in r.stderr, r.stderr  # the shipped recipe
    expect_refused(run_cli(*train, "./dyck-demo", cwd=root), "dyck-demo is a directory, not a "
                   "recipe file")
    expect_refused(run_cli(*train, "dyck-demo/", cwd=root), "is a directory")
    (root / "mine").write_text(tiny_recipe.read_text())  # a file without .yaml is read as ./mine
    expect_refused(run_cli(*train, "mine", cwd=root), "unknown recipe 'mine'", "write ./mine")
    r = run_cli(*train, "./mine", cwd=root)
    assert r.returncode == 2 and "reached the data" in r.stderr, r.stderr
    assert not (root / "runs").exists()


def test_a_base_that_is_a_device_a_fifo_or_nested_too_deep_is_refused_at_once(walk):
    import os
    import threading

    root = walk
    train = ["train", "--task", "dyck", "--out", "runs", "--recipe"]
    (root / "zero.yaml").write_text("task: dyck\nbase: /dev/zero\n")
    expect_refused(run_cli(*train, "zero.yaml", cwd=root), "zero.yaml: its `base: /dev/zero` "
                   "cannot be used", "it is a device")
    os.mkfifo(root / "pipe.yaml")
    (root / "fifo.yaml").write_text("task: dyck\nbase: pipe.yaml\n")
    results = []
    for argv in ([*train, "fifo.yaml"], [*train, "pipe.yaml"]):  # (a FIFO blocks a plain read)
        t = threading.Thread(target=lambda a=argv: results.append(run_cli(*a, cwd=root)),
                             daemon=True)
        t.start()
        t.join(60)
        assert not t.is_alive(), f"{argv} hangs on the FIFO"
    expect_refused(results[0], "its `base: pipe.yaml` cannot be used", "named pipe (FIFO)")
    expect_refused(results[1], "pipe.yaml: it is a named pipe (FIFO)")
    (root / "deep.yaml").write_text("task: dyck\nreference:\n" + "".join(
        "  " * (i + 1) + f"k{i}:\n" for i in range(200)))
    expect_refused(run_cli(*train, "deep.yaml", cwd=root), "deep.yaml: nested more than")
    (root / "deeper.yaml").write_text("task: dyck\nreference: " + "[" * 5000 + "]" * 5000 + "\n")
    expect_refused(run_cli(*train, "deeper.yaml", cwd=root), "deeper.yaml")
    (root / "child.yaml").write_text("base: deep.yaml\n")
    expect_refused(run_cli(*train, "child.yaml", cwd=root), "its `base: deep.yaml` cannot be used")
    assert not (root / "runs").exists()


def test_training_options_the_issue_found_unbounded_are_refused(walk, tiny_recipe):
    root = walk
    train = ["train", "--task", "dyck", "--recipe", str(tiny_recipe), "--out", "runs"]
    for value in ("nan", "-1", "0", "inf", "1e9"):
        expect_refused(run_cli(*train, "--log-interval", value, cwd=root),
                       "--log-interval must be a number in (0, 86400]")
    r = run_cli(*train, "--log-interval", "0.5", cwd=root)
    assert "reached the data" in r.stderr, r.stderr
    for item, fragment in (
            ("model.init_scale=1e308", "model.init_scale must be >= 0 and <= 10"),
            ("train.weight_decay=1e308", "train.weight_decay must be >= 0 and <= 1"),
            ("train.lr=1e308", "train.lr must be > 0 and <= 1000"),
            ("train.initial_accumulator=1e308", "train.initial_accumulator must be"),
            ("train.momentum=1", "train.momentum must be >= 0 and < 1"),
            ("train.min_lr=0.5", "train.min_lr must be >= 0 and <= 0.02"),
            ("train.decay=2", "train.decay must be > 0 and <= 1"),
            ("model.cell_options={forget_bias: abc}",
             "model.cell_options.forget_bias: cell 'lstm' takes a finite number or none"),
            ("model.cell_options={forget_bias: 1.0e+308}", "in [-100, 100]"),
            ("model.cell_options={init_scale: 1e308}", "YAML reads 1e308 as text"),
            ("model.cell_options={content: 5}", "model.cell_options.content: cell 'lstm' takes "
                                                "a string"),
            ("model.cell_options={bogus: 1}", "'model.cell_options.bogus'")):
        expect_refused(run_cli(*train, "--set", item, cwd=root), fragment)
    expect_refused(run_cli(*train, "--cell", "lstm-gates", "--set",
                           "model.cell_options={memory_cell: true}", cwd=root),
                   "cell 'lstm-gates' fixes option(s) model.cell_options.memory_cell")
    assert not (root / "runs").exists()
