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
    expected_seeds: list[int] = field(default_factory=list)
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
        exp.expected_seeds = exp.expected_seeds or list(cfg.get("seeds") or [])
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


def experiment_from_recipe(name: str) -> Experiment:
    from .config import load_recipe

    _, r = load_recipe(name)
    return Experiment(r.get("experiment") or name, r["task"], list(r.get("cells") or []),
                      list(r.get("seeds") or []), dict(r.get("reference") or {}),
                      str(r.get("reference_source", "")))


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


def render_experiment(exp: Experiment) -> str:
    metrics: tuple[Metric, ...] = get_task(exp.task).metrics
    cells = list(exp.expected_cells) + [c for c in exp.cells if c not in exp.expected_cells]
    has_ref = any(exp.reference.get(c) for c in cells)
    head = ["cell"]
    for m in metrics:
        head.append(f"{m.label or m.name} {'↑' if m.higher_is_better else '↓'}")
        if has_ref and any(m.name in (exp.reference.get(c) or {}) for c in cells):
            head.append("paper")
    lines = [f"## {exp.name}", "",
             f"Task `{exp.task}`, test split of the best-dev checkpoint; ours = mean ± std over seeds (n).", ""]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    notes = []
    for cell in cells:
        runs = exp.cells.get(cell) or CellRuns()
        row = [f"`{cell}`"]
        for m in metrics:
            if runs.results:
                vals = [float((r.get("test") or {}).get(m.name, float("nan"))) for r in runs.results]
                row.append(format_cell(vals, m.fmt))
            else:
                row.append("missing")
            if has_ref and any(m.name in (exp.reference.get(c) or {}) for c in cells):
                ref = (exp.reference.get(cell) or {}).get(m.name)
                row.append(f"{ref}" if ref is not None else "—")
        if runs.shortened:
            row[0] += " †"
        lines.append("| " + " | ".join(row) + " |")
        n_expected = len(exp.expected_seeds)
        if n_expected and cell in exp.expected_cells and len(runs.results) < n_expected:
            notes.append(f"`{cell}`: {len(runs.results)} of {n_expected} seeds finished"
                         + (f", {runs.unfinished} unfinished" if runs.unfinished else ""))
        elif runs.unfinished:
            notes.append(f"`{cell}`: {runs.unfinished} unfinished run(s) not counted")
    lines.append("")
    if any(exp.cells[c].shortened for c in exp.cells):
        lines.append("† includes shortened runs (`train.max_steps` set): not the full protocol.")
    if exp.reference_source:
        lines.append(f"Paper numbers: {exp.reference_source}.")
    for n in notes:
        lines.append(f"- {n}")
    return "\n".join(lines).rstrip() + "\n"


def render_report(runs_dir: Path, table: str | None = None) -> str:
    experiments = collect(runs_dir) if Path(runs_dir).exists() or table is None else {}
    if table is not None:
        if table in experiments:
            experiments = {table: experiments[table]}
        else:
            experiments = {table: experiment_from_recipe(table)}
    if not experiments:
        raise UserError(f"no runs found under {runs_dir}.")
    return "\n".join(render_experiment(e) for _, e in sorted(experiments.items()))
