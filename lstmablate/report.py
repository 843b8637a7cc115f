"""Markdown tables of finished runs beside the paper's numbers.

Runs are grouped by experiment and cell; each cell shows the test metrics as
mean ± sample std over seeds with n.  The paper's numbers come from the
recipe's ``reference`` block (saved into every run's ``config.yaml``).  A cell
the recipe expects but that has no finished run is shown as *missing*, never
dropped; unfinished runs are counted; shortened runs (``train.max_steps`` set)
are marked.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .errors import UserError
from .config import recipe_seeds
from .runs import read_json
from .task import Metric, get_task


@dataclass
class CellRuns:
    results: list[dict[str, Any]] = field(default_factory=list)
    unfinished: int = 0
    shortened: int = 0


@dataclass
class Experiment:
    name: str
    task: str
    expected_cells: list[str] = field(default_factory=list)
    expected_seeds: dict[str, list[int]] = field(default_factory=dict)  # cell -> seeds
    reference: dict[str, dict[str, float]] = field(default_factory=dict)
    reference_source: str = ""
    cells: dict[str, CellRuns] = field(default_factory=lambda: defaultdict(CellRuns))


def collect(runs_dir: Path) -> dict[str, Experiment]:
    """Every run under ``runs_dir`` (any depth), grouped by experiment and cell."""
    runs_dir = Path(runs_dir)
    if not runs_dir.exists():
        raise UserError(f"runs directory {runs_dir} does not exist; train something first "
                        "(`lstmablate train ...`) or pass the right directory.")
    experiments: dict[str, Experiment] = {}
    for cfg_path in sorted(runs_dir.rglob("config.yaml")):
        try:
            cfg = yaml.safe_load(cfg_path.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError:
            raise UserError(f"{cfg_path} is not valid YAML; the run directory is damaged.") from None
        if not isinstance(cfg, dict) or "experiment" not in cfg:
            continue
        exp = experiments.get(cfg["experiment"])
        if exp is None:
            exp = experiments[cfg["experiment"]] = Experiment(cfg["experiment"], cfg["task"])
        for c in cfg.get("cells") or []:
            if c not in exp.expected_cells:
                exp.expected_cells.append(c)
        for c in exp.expected_cells:
            exp.expected_seeds.setdefault(c, recipe_seeds(cfg, c))
        exp.reference = exp.reference or dict(cfg.get("reference") or {})
        exp.reference_source = exp.reference_source or cfg.get("reference_source", "")
        runs = exp.cells[cfg["cell"]]
        result_path = cfg_path.parent / "result.json"
        if result_path.exists():
            result = read_json(result_path)
            runs.results.append(result)
            runs.shortened += bool(result.get("shortened"))
        else:
            runs.unfinished += 1
    return experiments


def experiments_from_recipe(name: str) -> tuple[str, list[tuple[str, Experiment]], dict[str, Any]]:
    """The experiments a recipe or table spec expects: (title, [(label, Experiment)], table spec)."""
    from .config import grid_points, load_recipe

    rname, r = load_recipe(name)
    if "task" not in r:  # a table spec: the experiments of each listed recipe
        spec = r["table"]
        groups = []
        labels = spec.get("labels") or {}
        for exp in spec.get("experiments") or []:
            _, sub, _ = experiments_from_recipe(exp)
            groups += [(labels.get(label, label), e) for label, e in sub]
        return spec.get("title") or rname, groups, spec
    groups = []
    for experiment, _, point in grid_points(rname, r):
        label = ", ".join(f"{k.split('.')[-1]}={v}" for k, v in point.items()) or experiment
        cells = list(r.get("cells") or [])
        groups.append((label, Experiment(experiment, r["task"], cells,
                                         {c: recipe_seeds(r, c) for c in cells}, dict(r.get("reference") or {}),
                                         str(r.get("reference_source", "")))))
    spec = r.get("table") or {}
    return spec.get("title") or rname, groups, spec


def mean_std(values: list[float]) -> tuple[float, float | None]:
    vals = [v for v in values if v is not None and not math.isnan(v)]
    if not vals:
        return float("nan"), None
    return statistics.fmean(vals), (statistics.stdev(vals) if len(vals) > 1 else None)


def format_cell(values: list[float], fmt: str) -> str:
    mean, std = mean_std(values)
    if math.isnan(mean):
        return "n/a"
    text = f"{mean:{fmt}}"
    if std is not None:
        text += f" ± {std:{fmt}}"
    return text + f" (n={len(values)})"


def _ours(runs: CellRuns, metric: Metric) -> str:
    if not runs.results:
        return "missing"
    vals = [float((r.get("test") or {}).get(metric.name, float("nan"))) for r in runs.results]
    return format_cell(vals, metric.fmt)


def _notes(label: str, exp: Experiment, cells: list[str]) -> list[str]:
    notes = []
    for cell in cells:
        runs = exp.cells.get(cell) or CellRuns()
        n_expected = len(exp.expected_seeds.get(cell) or [])
        where = f"{label}: " if label else ""
        if n_expected and cell in exp.expected_cells and len(runs.results) < n_expected:
            notes.append(f"{where}`{cell}`: {len(runs.results)} of {n_expected} seeds finished"
                         + (f", {runs.unfinished} unfinished" if runs.unfinished else ""))
        elif runs.unfinished:
            notes.append(f"{where}`{cell}`: {runs.unfinished} unfinished run(s) not counted")
    return notes


def render_table(title: str, groups: list[tuple[str, Experiment]], metrics: list[Metric],
                 cells: list[str] | None = None) -> str:
    """Rows = cells; for each group (experiment) and metric: ours, and the paper's if known."""
    if cells is None:
        cells = []
        for _, exp in groups:
            for c in list(exp.expected_cells) + list(exp.cells):
                if c not in cells:
                    cells.append(c)
    head, columns = ["cell"], []
    for label, exp in groups:
        for m in metrics:
            name = f"{m.label or m.name} {'↑' if m.higher_is_better else '↓'}"
            prefix = f"{label}: " if len(groups) > 1 else ""
            head.append(prefix + name)
            columns.append((exp, m, False))
            if any(m.name in (exp.reference.get(c) or {}) for c in cells):
                head.append(prefix + "paper")
                columns.append((exp, m, True))
    tasks = sorted({exp.task for _, exp in groups})
    which = sorted({r.get("test_checkpoint", "best") for _, exp in groups
                    for runs in exp.cells.values() for r in runs.results}) or ["best"]
    names = {"best": "best-dev", "last": "last (end of training)"}
    lines = [f"## {title}", "",
             f"Task `{', '.join(tasks)}`, test split of the {' / '.join(names[w] for w in which)} "
             "checkpoint; ours = mean ± std over seeds (n).", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for cell in cells:
        row = [f"`{cell}`"]
        for exp, m, paper in columns:
            if paper:
                ref = (exp.reference.get(cell) or {}).get(m.name)
                row.append(str(ref) if ref is not None else "—")
            else:
                row.append(_ours(exp.cells.get(cell) or CellRuns(), m))
        if any((exp.cells.get(cell) or CellRuns()).shortened for _, exp in groups):
            row[0] += " †"
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    if any(r.shortened for _, exp in groups for r in exp.cells.values()):
        lines.append("† includes shortened runs (`train.max_steps` set): not the full protocol.")
    sources = sorted({exp.reference_source for _, exp in groups if exp.reference_source})
    for src in sources:
        lines.append(f"Paper numbers: {src}.")
    for label, exp in groups:
        for n in _notes(label if len(groups) > 1 else "", exp, cells):
            lines.append(f"- {n}")
    for label, exp in groups:
        times = _train_times(exp, cells)
        if times:
            where = f" ({label})" if len(groups) > 1 else ""
            lines.append(f"- training time per run{where}, mean over finished seeds: {times}")
    return "\n".join(lines).rstrip() + "\n"


def format_duration(seconds: float) -> str:
    """12 s, 4.5 min, 2.3 h."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 120 * 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _train_times(exp: Experiment, cells: list[str]) -> str:
    """``train_time_s`` (training and its dev evaluations, summed over resumed sessions) per cell."""
    parts = []
    for cell in cells:
        runs = exp.cells.get(cell) or CellRuns()
        secs = [float(r["train_time_s"]) for r in runs.results if r.get("train_time_s") is not None]
        if secs:
            parts.append(f"`{cell}` {format_duration(statistics.fmean(secs))}")
    return ", ".join(parts)


def render_experiment(exp: Experiment) -> str:
    return render_table(exp.name, [("", exp)], list(get_task(exp.task).metrics))


def render_report(runs_dir: Path, table: str | None = None) -> str:
    runs_dir = Path(runs_dir)
    found = collect(runs_dir) if (runs_dir.exists() or table is None) else {}
    if table is None:
        if not found:
            raise UserError(f"no runs found under {runs_dir}.")
        return "\n".join(render_experiment(e) for _, e in sorted(found.items()))
    if table in found:
        return render_experiment(found[table])
    title, groups, spec = experiments_from_recipe(table)
    merged = []
    for label, exp in groups:
        have = found.get(exp.name)
        if have is not None:  # runs exist: keep the recipe's expectations, add the runs
            exp.cells = have.cells
            for c in have.cells:
                if c not in exp.expected_cells and spec.get("cells") is None:
                    exp.expected_cells.append(c)
        merged.append((label, exp))
    tasks = {exp.task for _, exp in merged}
    metric_names = spec.get("metrics")
    all_metrics = {m.name: m for t in tasks for m in get_task(t).metrics}
    if metric_names:
        unknown = [n for n in metric_names if n not in all_metrics]
        if unknown:
            raise UserError(f"table {table!r} asks for metric(s) {unknown}; the task(s) "
                            f"{sorted(tasks)} have {sorted(all_metrics)}.")
        metrics = [all_metrics[n] for n in metric_names]
    else:
        metrics = list(all_metrics.values())
    return render_table(title, merged, metrics, cells=spec.get("cells"))
