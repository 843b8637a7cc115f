"""Sweeps: a recipe's ``cells`` x ``seeds`` as independent runs.

``plan_sweep`` lists every run with its directory, whether it is finished and
the exact ``lstmablate train`` command for it (what ``sweep --list`` prints,
for any cluster scheduler); ``run_sweep`` runs the unfinished ones one after
another, resuming interrupted runs and skipping finished ones, so running a
sweep twice is harmless.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from .config import grid_points, load_recipe
from .errors import ConfigError
from .runs import RunFiles, run_dir


@dataclass
class SweepItem:
    recipe: str
    task: str
    experiment: str
    cell: str
    seed: int
    run_dir: Path
    finished: bool
    started: bool
    overrides: list[str]
    threads: int | None
    device: str
    data_dir: str | None

    @property
    def command(self) -> str:
        parts = ["lstmablate", "train", "--task", self.task, "--cell", self.cell, "--recipe",
                 self.recipe, "--seed", str(self.seed), "--out", str(self.run_dir.parents[2])]
        if self.experiment != self.recipe:
            parts += ["--experiment", self.experiment]
        for o in self.overrides:
            parts += ["--set", o]
        if self.threads:
            parts += ["--threads", str(self.threads)]
        if self.device != "cpu":
            parts += ["--device", self.device]
        if self.data_dir:
            parts += ["--data-dir", self.data_dir]
        if self.started:
            parts.append("--resume")
        return shlex.join(parts)


def plan_sweep(recipe: str, out: Path, *, overrides: list[str] | None = None, threads: int | None = None,
               device: str = "cpu", data_dir: str | None = None) -> list[SweepItem]:
    """Every run of a recipe (cells x seeds x grid points), or of each recipe of a table spec."""
    name, r = load_recipe(recipe)
    if "task" not in r:  # a table spec: the sweeps of its experiments
        return [item for exp in r["table"].get("experiments") or []
                for item in plan_sweep(exp, out, overrides=overrides, threads=threads,
                                       device=device, data_dir=data_dir)]
    cells, seeds = r.get("cells") or [], r.get("seeds") or [1]
    if not cells:
        raise ConfigError(f"recipe {r['_path']} has no `cells:` list, so it is not a sweep.")
    items = []
    for experiment, grid_overrides, _ in grid_points(name, r):
        for cell in cells:
            for seed in seeds:
                files = RunFiles(run_dir(out, experiment, cell, int(seed)))
                items.append(SweepItem(recipe, r["task"], experiment, cell, int(seed), files.root,
                                       files.is_finished(), files.config.exists(),
                                       grid_overrides + list(overrides or []), threads, device, data_dir))
    return items


def run_sweep(plan: list[SweepItem], console: Console | None = None) -> None:
    from .runner import train_run

    console = console or Console(stderr=True)
    todo = [it for it in plan if not it.finished]
    console.print(f"sweep: {len(plan)} runs, {len(plan) - len(todo)} finished, {len(todo)} to run")
    for i, it in enumerate(todo, 1):
        console.print(f"[bold]({i}/{len(todo)})[/] {it.command}", highlight=False)
        outcome = train_run(it.task, it.cell, recipe=it.recipe, overrides=it.overrides, seed=it.seed,
                            experiment=it.experiment,
                            out=it.run_dir.parents[2], device=it.device, threads=it.threads,
                            resume=it.started, data_dir=it.data_dir, console=console)
        if outcome.interrupted:
            console.print("sweep interrupted; run the same command again to continue.")
            return
