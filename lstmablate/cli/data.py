"""``lstmablate data path | list | check | fetch``: the data directory and the datasets the
installed tasks read (the tasks' own ``data`` subcommands come from their plugins)."""

from __future__ import annotations

from typing import Any, Optional

import typer

from ..console import count, err, escape, out, print_listing
from .options import DATA_DIR_HELP, PLAIN_HELP


def data_path(data_dir: Optional[str] = typer.Option(None, "--data-dir", metavar="DIR",
                                                     help=DATA_DIR_HELP)) -> None:
    """Print the data directory in use and how it was chosen, and whether it exists yet
    (`lstmablate data fetch` creates it). Exits with 2 when it is a file.

    Example:

    LSTMABLATE_DATA=/data/nlp lstmablate data path
    """
    from ..data import describe_data_dir, resolve_data_dir

    path = resolve_data_dir(data_dir)
    missing = "" if path.is_dir() else "; it does not exist yet"
    out.print(f"{escape(path)} ({escape(describe_data_dir(path))}{missing})", soft_wrap=True)


def data_list(
    data_dir: Optional[str] = typer.Option(None, "--data-dir", metavar="DIR", help=DATA_DIR_HELP),
    plain: bool = typer.Option(False, "--plain", help=PLAIN_HELP + " One row per file."),
) -> None:
    """The datasets the installed tasks read: their files, which are present in the data
    directory, where they come from and their licence.

    Numbered shards are one line in shell brace notation (--plain: one row per file). A data
    directory that does not exist lists every file as missing; one that is a file exits with 2.

    Examples:

    lstmablate data list
    lstmablate data list --plain | awk -F'\\t' '$4 == "missing"'
    """
    from ..run import data_status as ds
    from ..data import describe_data_dir, resolve_data_dir

    root = resolve_data_dir(data_dir)
    rows = ds.presence(root)
    catalogue = ds.task_datasets()
    where = f"data directory: {escape(root)} ({escape(describe_data_dir(root))}"
    if plain or not out.is_terminal:
        if not root.is_dir():  # the one line that is not a row, for whoever reads stderr
            err.print(f"{where}; it does not exist)", soft_wrap=True)
        print_listing(("dataset", "tasks", "file", "status", "source", "licence"),
                      [[r.dataset, ", ".join(r.tasks), r.relpath, r.status,
                        catalogue[r.dataset][0].url, catalogue[r.dataset][0].licence]
                       for r in (rows if plain else _folded(rows, _presence))], plain=True)
        return
    err.print(where + ("; it does not exist)" if not root.is_dir() else ")"), soft_wrap=True)
    print_listing(("dataset", "tasks", "file", "status"),
                  _grouped(rows, lambda group: (_presence(group),)),
                  keep=("dataset", "file", "status"), plain=False)
    out.print("Sources and licences:")
    for name, (d, _) in catalogue.items():
        out.print(f"  {name}: {escape(d.url)} — {escape(d.licence)}", soft_wrap=True)


def _presence(group: list[Any]) -> str:
    """The status of a file, or of a folded group of shards (``99 of 99 present``)."""
    return (group[0].status if len(group) == 1 else
            f"{sum(r.status == 'present' for r in group)} of {len(group)} present")


def _folded(rows: list[Any], status: Any) -> list[Any]:
    """``rows`` (file statuses) with each run of numbered shards folded into one row: its
    path in shell brace notation, ``status(group)`` its status (a piped listing keeps a row
    per file only with --plain)."""
    import dataclasses

    from ..run import data_status as ds

    folded, by_ds = [], {}
    for r in rows:
        by_ds.setdefault(r.dataset, []).append(r)
    for files in by_ds.values():
        index = {f.relpath: f for f in files}
        for shown, members in ds.summarise([f.relpath for f in files]):
            group = [index[m] for m in members]
            folded.append(group[0] if len(group) == 1 else
                          dataclasses.replace(group[0], relpath=shown, status=status(group),
                                              blocks=sorted({b for g in group for b in g.blocks})))
    return folded


def _grouped(rows: list[Any], columns: Any) -> list[list[str]]:
    """Table rows for file statuses: per dataset, numbered shards folded into one line
    (``columns(group)`` gives the last columns of a folded line); the dataset and its tasks
    only on its first line."""
    from ..run import data_status as ds

    table: list[list[str]] = []
    by_ds: dict[str, list[Any]] = {}
    for r in rows:
        by_ds.setdefault(r.dataset, []).append(r)
    for name, files in by_ds.items():
        index = {f.relpath: f for f in files}
        for i, (shown, members) in enumerate(ds.summarise([f.relpath for f in files])):
            group = [index[m] for m in members]
            table.append([name if i == 0 else "", ", ".join(files[0].tasks) if i == 0 else "",
                          shown, *columns(group)])
    return table


def data_check(
    task: Optional[str] = typer.Argument(None, metavar="TASK", help="Only this task's data."),
    data_dir: Optional[str] = typer.Option(None, "--data-dir", metavar="DIR", help=DATA_DIR_HELP),
    plain: bool = typer.Option(False, "--plain", help=PLAIN_HELP + " One row per file."),
) -> None:
    """Verify the data files (presence and checksums): a line per file (numbered shards
    folded on a terminal); for what is missing or damaged, the recipes it blocks and how to
    get it (once per dataset); which recipes are ready to run.

    Exits with 2 when the data directory is a file, when a present file is damaged, or when
    TASK is given and a file its default configuration reads is missing; a data directory
    that does not exist is answered as an empty one. Piped, numbered shards are folded as on
    a terminal (--plain: one row per file).

    Examples:

    lstmablate data check
    lstmablate data check squad-drqa
    """
    from ..run import data_status as ds
    from ..data import describe_data_dir, resolve_data_dir
    from ..task import get_task

    if task:
        get_task(task)  # an unknown task name: the usual message
    root = resolve_data_dir(data_dir)
    report = ds.check(root, task)
    rows = report.rows
    err.print(f"data directory: {escape(root)} ({escape(describe_data_dir(root))})", soft_wrap=True)

    def note(r: Any) -> str:
        return ", ".join(r.blocks) if r.status == "missing" else (r.message if not r.usable else "")

    def states(group: list[Any]) -> str:
        kinds = {r.status for r in group}
        return (group[0].status if len(kinds) == 1 else
                ", ".join(f"{sum(r.status == s for r in group)} {s}" for s in sorted(kinds)))

    if plain or not out.is_terminal:
        print_listing(("dataset", "tasks", "file", "status", "blocks / note"),
                      [[r.dataset, ", ".join(r.tasks), r.relpath, r.status, note(r)]
                       for r in (rows if plain else _folded(rows, states))], plain=True)
    else:
        def columns(group: list[Any]) -> tuple[str]:
            return (states(group),)
        print_listing(("dataset", "tasks", "file", "status"), _grouped(rows, columns),
                      keep=("dataset", "file", "status"), plain=False)
    for name, (d, _) in ds.task_datasets(task).items():
        bad = [r for r in rows if r.dataset == name and not r.usable]
        if not bad:
            continue
        what = "damaged" if any(r.damaged for r in bad) else "missing"
        blocks = sorted({b for r in bad for b in r.blocks})
        files = ", ".join(shown for shown, _ in ds.summarise([r.relpath for r in bad]))
        err.print(f"{name}: {len(bad)} of {count(len(d.files), 'file')} {what} ({escape(files)})"
                  + (f"; this blocks {', '.join(blocks)}" if blocks else "")
                  + f". To get them: {escape(ds.advice(d))}", soft_wrap=True)
    if all(r.usable for r in rows):
        err.print("every catalogued file is present and verified.")
    for t, names in report.ready.items():
        err.print(f"ready to run ({escape(t)}): {', '.join(names)}", soft_wrap=True)
    needed: set[str] = set()
    if task:
        cls = get_task(task)
        needed = set(cls(cls.DataConfig(), cls.ModelConfig(), root).required_files())
    damaged = [r for r in rows if r.damaged]
    if damaged:
        from ..errors import DataError

        raise DataError(" ".join(r.message for r in damaged))
    if not root.is_dir():  # the same answer as an empty folder: every file is missing
        err.print("the data directory does not exist (yet), so every file is missing; the "
                  "first download creates it.", soft_wrap=True)
    missing = [r.relpath for r in rows if not r.usable and r.relpath in needed]
    if missing:
        from ..errors import DataError

        shown = ", ".join(name for name, _ in ds.summarise(missing))  # (shards folded)
        raise DataError(f"task {task!r} (its default configuration) reads {shown}, "
                        "which the data directory does not hold; see above for how to get "
                        "them and which recipes are ready to run without them.")


def data_fetch(
    dataset: str = typer.Argument(..., metavar="DATASET", help="Dataset name (`lstmablate data list`)."),
    data_dir: Optional[str] = typer.Option(None, "--data-dir", metavar="DIR", help=DATA_DIR_HELP),
) -> None:
    """Download a dataset from its canonical location and verify its checksums.

    Files already present that verify are kept; a download that does not verify is never
    written. The data directory is created if it does not exist (a file there exits with 2).

    Example:

    lstmablate data fetch ptb
    """
    from ..data import fetch, resolve_data_dir
    from ..task import available_datasets

    datasets = available_datasets()
    if dataset not in datasets:
        from ..errors import UnknownNameError

        raise UnknownNameError("dataset", dataset, datasets,
                               "`lstmablate data list` shows what each task reads.")
    for p in fetch(datasets[dataset], resolve_data_dir(data_dir),
                   log=lambda msg: err.print(escape(msg), soft_wrap=True)):
        out.print(escape(p), soft_wrap=True)
