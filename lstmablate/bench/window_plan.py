"""Which runs fit a GPU window (:mod:`.window`): the plan's slots of groups (:data:`DEFAULT_PLAN`,
or a plan file read and checked by :mod:`.window_files`), each group's runs timed with the
training steps gpu-check measured, and the runs that finish in the minutes left when they
share the GPU (:func:`plan_runs`).  Only the standard library and the package's bottom floor
are imported at start-up; the recipes are read (after the window's install) where a group's
runs are made.
"""

from __future__ import annotations

from typing import Any

from .gpu_args import caller_path
from .window_files import FINAL_S, START_S, Run, check_plan_names
from .window_files import load_plan as _load_plan

#: a margin on every estimate (evaluation spread, logging, checkpoints)
SAFETY = 1.15
#: the runs of a window, in order of priority: each slot takes the first of its alternatives
#: that fits beside what the slots before it took (Table 4's five cells at once; then
#: -GATES's learning rate on PTB-medium, full runs only, else Table 1 medium's five cells
#: for as many epochs as fit, marked shortened)
DEFAULT_PLAN: list[list[dict[str, Any]]] = [
    [dict(name="table4", recipe="nmt-multi30k", shorten=True)],
    [dict(name="gates-lr", recipe="ptb-medium", cells=["lstm-gates"], lrs=[0.1, 0.2, 0.3]),
     dict(name="table1-medium", recipe="ptb-medium", shorten=True)],
]


def load_plan(path: str | None) -> list[list[dict]]:
    """The window's slots (:data:`DEFAULT_PLAN`, or a JSON file of the same shape), read and
    checked by :func:`.window_files.load_plan`."""
    return _load_plan(path, DEFAULT_PLAN)


def _resolve(path: str) -> str:
    """A path of the caller's (a recipe file of the plan), absolute."""
    return str(caller_path(path, "a recipe of the plan"))


def checked_names(plan: list[list[dict]], path: str | None) -> list[list[dict]]:
    """The plan (read from ``path``, or :data:`DEFAULT_PLAN`) with its names checked
    (:func:`.window_files.check_plan_names`), a recipe file made absolute against the caller's
    directory (the runs start elsewhere)."""
    return check_plan_names(plan, path or "DEFAULT_PLAN", _resolve)


def group_runs(group: dict, step_rows: dict[tuple[str, str], dict]) -> list[Run] | str:
    """The runs of one group, each with the speed measured for its recipe and cell; or why
    it cannot be planned (no measured step)."""
    from lstmablate.recipes import load_recipe

    name, spec = load_recipe(group["recipe"])
    cells = group.get("cells") or list(spec["cells"])
    experiment = group.get("experiment") or str(spec.get("experiment") or name)
    measured = [r for (recipe, _), r in step_rows.items() if recipe == name]
    if not measured:
        return f"no training step of {name} was measured (gpu-check's steps stage)"
    runs = []
    for cell in cells:
        row = step_rows.get((name, cell))
        if row is None:  # not timed (the stage's deadline): planned at the slowest step timed
            slowest = max(measured, key=lambda r: r["ms"])
            row = step_rows[(name, cell)] = dict(slowest, cell=cell, timed_as=slowest["cell"])
        for lr in group.get("lrs") or [None]:
            sets = list(group.get("sets", []))
            if row.get("step_capture"):  # the faster mode measured (gpu_steps.fastest)
                sets.append(f"train.step_capture={row['step_capture']}")
            exp = experiment
            if lr is not None:
                sets.append(f"train.lr={lr}")
                exp = f"{experiment}-{cell}-lr{lr:g}"
            runs.append(Run(group=group["name"], recipe=group["recipe"], recipe_name=name,
                            task=row["task"], timed_as=row.get("timed_as"),
                            cell=cell, seed=int(group.get("seed", 1)), experiment=exp, sets=sets,
                            epochs=row["epochs"], full_epochs=row["epochs"],
                            steps_per_epoch=row["steps_per_epoch"], estimate_s=0.0,
                            start_s=float(group.get("start_s", START_S)),
                            final_s=float(group.get("final_s", FINAL_S))))
    return runs


def _share(row: dict) -> float:
    """The part of a step's wall time its GPU work takes (1 where it was not measured)."""
    return min(1.0, row["gpu_ms"] / row["ms"]) if row.get("gpu_ms") else 1.0


def estimate(run: Run, row: dict, slowdown: float, epochs: int | None = None) -> float:
    """Seconds a run of ``epochs`` (default its own) takes when the GPU is shared so that every
    step takes ``slowdown`` times as long as alone: its start (``start_s``: :data:`START_S`
    unless the plan's group says otherwise), reading the data, its steps, one dev evaluation
    per epoch, its final evaluation (``final_s``: :data:`FINAL_S`); times :data:`SAFETY`."""
    epochs = run.epochs if epochs is None else epochs
    steps = min(epochs * run.steps_per_epoch, row["run_steps"])
    busy = steps * row["ms"] / 1e3 + epochs * row["eval_s"]
    return SAFETY * (run.start_s + row["setup_s"] + busy * slowdown + run.final_s)


def plan_runs(plan: list[list[dict]], step_rows: list[dict], seconds: float
              ) -> tuple[list[Run], list[dict]]:
    """The runs that finish within ``seconds`` when started together, slot by slot
    (:data:`DEFAULT_PLAN`), and a note for each group not started.

    Concurrent runs share the GPU: each step takes ``max(1, sum of the runs' GPU shares)``
    times as long as alone (a step's GPU share: the time the profiler saw the GPU busy,
    over the step's wall time; a CPU row counts as 1).  A group that fits whole is taken
    whole; a group with ``shorten`` that does not is taken for as many epochs as fit
    (``train.max_steps``, so its result.json says ``shortened``); a group is never taken if
    it would make a run taken before it miss the end."""
    rows = {(r["recipe"], r["cell"]): r for r in step_rows}
    chosen: list[Run] = []
    skipped: list[dict] = []

    def row_of(run: Run) -> dict:
        return rows[(run.recipe_name, run.cell)]

    for slot in plan:
        for group in slot:
            runs = group_runs(group, rows)
            if isinstance(runs, str):
                skipped.append(dict(group=group["name"], reason=runs))
                continue
            together = chosen + runs
            slowdown = max(1.0, sum(_share(row_of(r)) for r in together))
            if any(estimate(r, row_of(r), slowdown) > seconds for r in chosen):
                skipped.append(dict(group=group["name"], reason=(
                    f"beside the runs already planned, they would no longer finish in "
                    f"{seconds / 60:.1f} min")))
                continue
            fits = True
            for r in runs:
                row = row_of(r)
                if estimate(r, row, slowdown) <= seconds:
                    continue
                epochs = max((e for e in range(1, r.full_epochs + 1)
                              if estimate(r, row, slowdown, e) <= seconds), default=0)
                if not group.get("shorten") or epochs == 0:
                    fits = False
                    need = estimate(r, row, slowdown) / 60
                    skipped.append(dict(group=group["name"], reason=(
                        f"{r.cell} needs about {need:.1f} min (with {len(together)} runs "
                        f"sharing the GPU), {seconds / 60:.1f} min are left"
                        + ("" if not group.get("shorten") else "; not one epoch fits"))))
                    break
                r.epochs, r.shortened = epochs, True
                r.sets = [*r.sets, f"train.max_steps={epochs * r.steps_per_epoch}"]
            if not fits:
                continue
            for r in runs:
                r.estimate_s = round(estimate(r, row_of(r), slowdown), 1)
            chosen = together
            break
    for r in chosen:  # the final slowdown, with every run chosen
        slowdown = max(1.0, sum(_share(row_of(x)) for x in chosen))
        r.estimate_s = round(estimate(r, row_of(r), slowdown), 1)
    return chosen, skipped
