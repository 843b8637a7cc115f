"""What ``lstmablate data list`` and ``data check`` report: per task and dataset, which files
are present in the data directory, which verify, and which recipes a missing file blocks.

The catalogue (files, checksums, sources) belongs to the tasks (``Task.datasets``); which
files one configuration reads is the task's :meth:`~lstmablate.task.Task.required_files`;
this module only puts the two together with the shipped recipes.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from .data import Dataset, DataFile, find_file, verify
from .errors import DataError, UserError


@dataclass
class FileStatus:
    tasks: list[str]  # the tasks that read the dataset
    dataset: str
    relpath: str
    status: str  # present | missing (data list); ok | unchecked | missing | mismatch | unreadable
    path: Path | None = None
    message: str = ""
    blocks: list[str] = field(default_factory=list)  # recipes that read this file

    @property
    def damaged(self) -> bool:
        return self.status in ("mismatch", "unreadable")

    @property
    def usable(self) -> bool:
        return self.status in ("ok", "unchecked", "present")


@dataclass
class DataReport:
    rows: list[FileStatus]
    ready: dict[str, list[str]]  # task -> the shipped recipes whose files are all usable
    blocked: dict[str, list[str]]  # task -> the shipped recipes a missing or damaged file blocks


def task_datasets(task: str | None = None) -> dict[str, tuple[Dataset, list[str]]]:
    """dataset name -> (the dataset, the tasks that read it), for every installed task (or
    one), in task order."""
    from .task import available_tasks, get_task

    out: dict[str, tuple[Dataset, list[str]]] = {}
    for name in [task] if task else available_tasks():
        for ds in get_task(name).datasets:
            out.setdefault(ds.name, (ds, []))[1].append(name)
    return out


def presence(data_dir: Path, task: str | None = None) -> list[FileStatus]:
    """Every catalogued file: present or missing (no checksum is computed)."""
    rows = []
    for ds, tasks in task_datasets(task).values():
        for f in ds.files:
            try:
                path = find_file(data_dir, f.relpath)
                rows.append(FileStatus(tasks, ds.name, f.relpath, "present", path))
            except DataError:
                rows.append(FileStatus(tasks, ds.name, f.relpath, "missing"))
    return rows


def check(data_dir: Path, task: str | None = None) -> DataReport:
    """Every catalogued file verified against its checksum; for each file that is missing or
    damaged, the shipped recipes that read it; per task, the recipes ready to run."""
    rows = [FileStatus(tasks, ds.name, r.relpath, r.status, r.path, r.message)
            for ds, tasks in task_datasets(task).values() for r in verify(data_dir, ds)]
    needs = recipe_needs(data_dir)
    unusable = {r.relpath for r in rows if not r.usable}
    for row in rows:
        if not row.usable:
            row.blocks = sorted(name for name, (_, files) in needs.items() if row.relpath in files)
    ready: dict[str, list[str]] = defaultdict(list)
    blocked: dict[str, list[str]] = defaultdict(list)
    for name, (recipe_task, files) in sorted(needs.items()):
        if task and recipe_task != task and task not in recipe_task.split(", "):
            continue
        (blocked if files & unusable else ready)[recipe_task].append(name)
    return DataReport(rows, dict(ready), dict(blocked))


def recipe_needs(data_dir: Path) -> dict[str, tuple[str, set[str]]]:
    """recipe (or table spec) -> (its task(s), the catalogued files its runs read)."""
    from .config import available_recipes, load_recipe, resolve_config
    from .task import get_task

    needs: dict[str, tuple[str, set[str]]] = {}
    tables: dict[str, list[str]] = {}
    for name in available_recipes():
        try:
            _, r = load_recipe(name)
            if "task" not in r:
                spec = r.get("table") or {}
                tables[name] = list(spec.get("experiments") or [])
                continue
            task_cls = get_task(r["task"])
            cell = (r.get("cells") or ["lstm"])[0]
            cfg = resolve_config(task_cls, cell, recipe=name)
            task = task_cls(cfg.data, cfg.model, data_dir)
            needs[name] = (r["task"], set(task.required_files()))
        except UserError:  # an invalid recipe is named by `list recipes`, not here
            continue
    for table, experiments in tables.items():
        parts = [needs[e] for e in experiments if e in needs]
        if parts:
            tasks = ", ".join(dict.fromkeys(t for t, _ in parts))
            needs[table] = (tasks, set().union(*(files for _, files in parts)))
    return needs


def advice(ds: Dataset) -> str:
    """How to get a dataset: the fetch command when every file can be downloaded, and the
    catalogue's instructions."""
    hint = ds.fetch_hint.removeprefix("or ").rstrip(".")
    if all(f.url for f in ds.files):
        return f"`lstmablate data fetch {ds.name}` ({hint})."
    return f"{hint[:1].upper()}{hint[1:]}."


_DIGITS = re.compile(r"\d+")


def summarise(files: list[DataFile] | list[str], min_run: int = 3) -> list[tuple[str, list[str]]]:
    """Group file paths that differ only in their numbers (shards): ``(shown, members)``.

    A group of at least ``min_run`` contiguous numbers is shown in shell brace notation
    (``news.en-{00001..00099}-of-00100``), which a shell expands back into the names."""
    paths = [f.relpath if isinstance(f, DataFile) else f for f in files]
    groups: dict[tuple[str, ...], list[str]] = {}
    for p in paths:
        key = tuple(_DIGITS.split(p))
        groups.setdefault(key, []).append(p)
    out = []
    for key, members in groups.items():
        if len(members) < min_run:
            out += [(m, [m]) for m in members]
            continue
        numbers = [_DIGITS.findall(m) for m in members]
        varying = [i for i in range(len(numbers[0])) if len({n[i] for n in numbers}) > 1]
        if len(varying) != 1:
            out += [(m, [m]) for m in members]
            continue
        i = varying[0]
        values = sorted(n[i] for n in numbers)
        ints = [int(v) for v in values]
        contiguous = ints == list(range(ints[0], ints[0] + len(ints)))
        parts = list(key)
        shown = ""
        for j, text in enumerate(parts):
            shown += text
            if j < len(numbers[0]):
                shown += (f"{{{values[0]}..{values[-1]}}}" if contiguous else f"{{{','.join(values)}}}") \
                    if j == i else numbers[0][j]
        out.append((shown, sorted(members)))
    return out
