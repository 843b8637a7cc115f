"""Plugins for real: a third-party distribution (tests/fixtures/thirdparty: one cell, one task,
one data command, found through its entry points) trains through the CLI; the core names no
task's dataset; new task folders are packaged without a hand-written list."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lstmablate.run.runs import RunFiles

from cli_in_process import run_cli_process

ROOT = Path(__file__).resolve().parents[1]
THIRD_PARTY = Path(__file__).parent / "fixtures" / "thirdparty"


def cli(*args, cwd):
    """The CLI with the third-party distribution first on ``PYTHONPATH``: its entry points are
    read when the CLI starts, so in a process of its own."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(THIRD_PARTY)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    return run_cli_process(*args, cwd=cwd, env=env)


def test_third_party_cell_and_task_train_through_the_cli(tmp_path):
    r = cli("list", "cells", cwd=tmp_path)
    assert r.returncode == 0 and "toy-mgu" in r.stdout, r.stderr
    r = cli("list", "tasks", cwd=tmp_path)
    assert r.returncode == 0 and "toy-copy" in r.stdout, r.stderr
    r = cli("data", "toy-info", "--delay", "3", cwd=tmp_path)
    assert r.returncode == 0 and "3 steps ago" in r.stdout, r.stderr
    r = cli("train", "--task", "toy-copy", "--cell", "toy-mgu", "--set", "train.max_epochs=12",
            "--threads", "1", "--out", "runs", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    run = tmp_path / "runs" / "toy-copy" / "toy-mgu" / "seed-1"
    rows = [json.loads(line) for line in RunFiles(run).metrics.read_text().splitlines()]
    assert len(rows) == 12
    assert rows[-1]["loss"] < rows[0]["loss"] - 0.3  # it learns to copy
    assert rows[-1]["accuracy"] > 60  # chance is 25
    r = cli("eval", str(run), "--json", cwd=tmp_path)
    assert r.returncode == 0 and json.loads(r.stdout)["accuracy"] == pytest.approx(
        json.loads(RunFiles(run).result.read_text())["test"]["accuracy"])


def test_third_party_cell_runs_in_a_builtin_task(tmp_path, tiny_recipe):
    r = cli("train", "--task", "dyck", "--cell", "toy-mgu", "--recipe", str(tiny_recipe),
            "--set", "train.max_steps=3", "--threads", "1", "--out", "runs", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert RunFiles(tmp_path / "runs" / "tiny" / "toy-mgu" / "seed-1").result.exists()


def test_third_party_cell_steps_like_its_sequence(tmp_path):
    code = """
import torch
from lstmablate.cells import build_encoder
enc = build_encoder("toy-mgu", 3, 5, num_layers=2, recurrent_dropout=0.3).double().train()
x = torch.randn(2, 4, 3, dtype=torch.float64)
masks = enc.sample_masks(2, like=x)
seq, _ = enc(x, masks=masks)
state, outs = None, []
for t in range(4):
    o, state = enc.step(x[:, t], state, masks)
    outs.append(o)
assert torch.allclose(torch.stack(outs, 1), seq, atol=1e-12)
print("ok")
"""
    env = dict(os.environ, PYTHONPATH=str(THIRD_PARTY))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=120, cwd=tmp_path)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr


def _catalogue() -> tuple[set[str], set[str], set[str]]:
    """What the registered tasks own, asked of each task: (the names of its datasets and their
    folders under the data directory; the paths and file names of their files; the task
    plugins' packages)."""
    from lstmablate.task import available_datasets, available_tasks, get_task

    names, files = set(), set()
    for ds in available_datasets().values():
        names.add(ds.name)
        for f in ds.files:
            path = Path(f.relpath)
            names.add(path.parts[0])
            files |= {f.relpath, path.name}
    packages = {".".join(get_task(t).__module__.split(".")[:2]) for t in available_tasks()}
    return names, files, packages


def test_the_core_names_no_tasks_dataset():
    """Dataset catalogues, readers and data commands live with the tasks, not in lstmablate/.

    Every dataset of every registered task is looked for: no code of the core holds a string
    that is a dataset's name or folder (``"ptb"``, ``"ud-ewt"``, ``"multi30k/"`` ...: the core
    would depend on that task), and no line of it, prose included, names a dataset's file
    (``ptb.train.txt``, ``ud-ewt/en_ewt-ud-dev.conllu`` ...) or a task plugin's package.  A
    dataset or task name inside prose (help texts' examples such as ``--task ptb``) is
    documentation, not a dependency."""
    names, files, packages = _catalogue()
    assert {"ptb", "multi30k", "ud-ewt", "ptb.train.txt"} <= names | files  # the catalogue is read
    in_text = re.compile(r"(?<![\w./-])(" + "|".join(
        re.escape(n) for n in sorted(files | packages, key=len, reverse=True)) + r")(?![\w-])")
    offenders = []
    for path in sorted((ROOT / "lstmablate").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        where = path.relative_to(ROOT)
        for lineno, line in enumerate(text.splitlines(), 1):
            found = in_text.search(line)
            if found:
                offenders.append(f"{where}:{lineno}: names {found.group(1)!r}: {line.strip()}")
        for node in ast.walk(ast.parse(text, filename=str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and (
                    node.value.rstrip("/") in names or node.value.split("/")[0] in names
                    and "/" in node.value):
                offenders.append(f"{where}:{node.lineno}: the string {node.value!r} is a "
                                 "dataset's name")
    assert not offenders, "\n".join(offenders)


def test_every_task_folder_is_packaged():
    """setup.py finds the packages: a new folder under tasks/ needs no hand-written list."""
    assert 'find_packages("tasks")' in (ROOT / "setup.py").read_text()
    find_packages = pytest.importorskip("setuptools").find_packages

    found = {f"lstmablate_tasks.{p}" for p in find_packages(str(ROOT / "tasks"))}
    folders = {f"lstmablate_tasks.{p.parent.name}" for p in (ROOT / "tasks").glob("*/__init__.py")}
    assert folders and folders <= found


def test_task_plugins_are_read_once_and_again_when_a_package_is_installed(tmp_path, monkeypatch):
    """The registry keeps its reading of the entry points (a report looks a task up for every
    run it reads) until the import path or one of its folders changes: a package installed
    into a folder on the path, or removed from it, is seen at the next lookup."""
    import shutil
    import time

    from lstmablate import task as task_module

    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    reads = []
    real = task_module.entry_points
    monkeypatch.setattr(task_module, "entry_points",
                        lambda **kw: reads.append(kw) or real(**kw))
    before = task_module.available_tasks()
    assert "toy-copy" not in before and "ptb" in before
    assert task_module.available_tasks() == before and len(reads) == 1  # the second: kept

    time.sleep(0.05)  # past the file system clock's tick, so that the folder's time moves
    dist = THIRD_PARTY / "lstmablate_toyplugin-0.1.dist-info"
    shutil.copytree(dist, site / dist.name)  # installed: the entry points only, enough to list
    assert task_module.available_tasks() == sorted([*before, "toy-copy"]) and len(reads) == 2
    assert task_module.available_tasks() == sorted([*before, "toy-copy"]) and len(reads) == 2

    time.sleep(0.05)
    shutil.rmtree(site / dist.name)  # removed
    assert task_module.available_tasks() == before and len(reads) == 3
