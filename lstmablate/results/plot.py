"""Learning curves of runs, read from their ``metrics.jsonl``.

Every evaluation of a run appends one line to ``metrics.jsonl``: the step and
epoch, the learning rate, ``train_loss`` (the mean training loss over the steps
since the previous evaluation) and the dev metrics.  :func:`plot_runs` draws
chosen columns of several runs against step or epoch, one panel per metric:

* one colour per cell (per experiment and cell when the runs span several
  experiments);
* every seed as a thin line, their mean as a bold line — the mean over seeds at
  the steps (epochs) that all of them evaluated, so a seed that stopped early
  shortens the mean rather than bending it;
* PNG and PDF of the figure, and the numbers behind it as CSV (one row per point,
  the mean curves with seed ``mean``).

matplotlib's Agg backend, no pyplot state (safe on a machine without a display).
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lstmablate.errors import DataError, UnknownNameError, UserError
from lstmablate.io import atomic_write, atomic_write_text, is_stream, path_exists
from lstmablate.run.record import LINE_KEYS, Run, find_runs
from lstmablate.run.runs import RunFiles
from lstmablate.runfolder import check_output

X_AXES = ("step", "epoch")


@dataclass
class Curve:
    seed: int | str | None  # "mean" for the mean over seeds
    x: list[float]
    y: list[float]


@dataclass
class CurveGroup:
    """The runs of one cell (of one experiment): a thin curve per seed, the bold mean."""

    experiment: str
    cell: str
    label: str
    seeds: list[Curve] = field(default_factory=list)
    mean: Curve | None = None


def find_plotted(paths: list[Path], skipped: list[str] | None = None) -> list[Run]:
    """The runs named by ``paths`` (run directories, or folders holding runs at any depth)
    that have a metrics.jsonl, each read (:meth:`~lstmablate.run.record.Run.metrics`).

    A damaged run folder (config.yaml damaged as ``report`` sees it, or a line of metrics.jsonl
    that is not an evaluation, e.g. one cut by a kill) is named in ``skipped`` and left out, as
    ``report`` does, when ``paths`` hold other runs; a single damaged run given by itself is an
    error."""
    for p in map(Path, paths):
        if not path_exists(p, "run folder"):
            raise UserError(f"{p} does not exist; give run directories (runs/<experiment>/<cell>/"
                            "seed-<n>) or a folder that holds them.")
    runs, damaged_folders = find_runs(paths)
    damaged = [why for folder, why in damaged_folders if RunFiles(folder).metrics.exists()]
    found = []
    for run in runs:
        if not run.files.metrics.exists():
            continue
        try:
            run.metrics()
            found.append(run)
        except UserError as e:
            damaged.append(str(e))
    if damaged and (not found or skipped is None):
        raise DataError(damaged[0] if len(damaged) == 1 else
                        f"{len(damaged)} run folders are damaged: " + " ".join(damaged))
    if skipped is not None:
        skipped += damaged
    if not found:
        raise UserError(f"no runs with a metrics.jsonl under {', '.join(map(str, paths))}; "
                        "a run writes one line there at every evaluation.")
    return found


def _value(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def run_curve(run: Run, metric: str, x: str) -> Curve:
    """``metric`` against ``x`` for one run (evaluations without a finite value left out)."""
    xs, ys = [], []
    for rec in run.metrics():
        y = _value(rec.get(metric))
        if y is not None and _value(rec.get(x)) is not None:
            xs.append(float(rec[x]))
            ys.append(y)
    if x == "epoch" and len(set(xs)) < len(xs):
        raise UserError(f"{run.path} evaluated several times per epoch (train.eval_every); "
                        "plot it against --x step.")
    return Curve(run.seed, xs, ys)


def mean_curve(curves: list[Curve]) -> Curve | None:
    """The mean over seeds at the x values every seed has."""
    if not curves:
        return None
    shared = set(curves[0].x)
    for c in curves[1:]:
        shared &= set(c.x)
    xs = sorted(shared)
    points = [dict(zip(c.x, c.y)) for c in curves]
    return Curve("mean", xs, [sum(p[x] for p in points) / len(points) for x in xs])


def group_curves(runs: list[Run], metric: str, x: str) -> list[CurveGroup]:
    """One group per (experiment, cell), in the order first seen; seeds sorted."""
    several = len({r.experiment for r in runs}) > 1
    groups: dict[tuple[str, str], CurveGroup] = {}
    for run in sorted(runs, key=lambda r: (r.seed is None, r.seed or 0)):
        key = (run.experiment, run.cell)
        if key not in groups:
            groups[key] = CurveGroup(run.experiment, run.cell,
                                     f"{run.experiment}: {run.cell}" if several else run.cell)
        curve = run_curve(run, metric, x)
        if curve.x:
            groups[key].seeds.append(curve)
    order = _cell_order(runs)
    out = sorted((g for g in groups.values() if g.seeds),
                 key=lambda g: (g.experiment, order.get(g.cell, len(order)), g.cell))
    for g in out:
        g.mean = mean_curve(g.seeds)
    return out


def _cell_order(runs: list[Run]) -> dict[str, int]:
    """Cells in the order their recipes list them (the paper's order), where readable."""
    from .experiments import RecipeLookup

    lookup, cells = RecipeLookup(), []
    for run in runs:
        recipe, _ = lookup.recipe(run.recipe, run.recipe_file) if run.recipe or run.recipe_file \
            else (None, "")
        cells += [str(c) for c in (recipe or {}).get("cells") or []]
    return {c: i for i, c in enumerate(dict.fromkeys(cells))}


def available_metrics(runs: list[Run]) -> list[str]:
    names = {k for r in runs for rec in r.metrics() for k, v in rec.items()
             if k not in LINE_KEYS and _value(v) is not None}
    return sorted(names)


def default_metrics(runs: list[Run]) -> list[str]:
    """The tasks' primary (dev) metrics, then the training loss."""
    from lstmablate.task import get_task

    names = []
    for task in dict.fromkeys(r.task_name for r in runs):
        try:
            names.append(get_task(task).primary.name)
        except UnknownNameError:
            pass
    return list(dict.fromkeys(names + ["train_loss"]))


def metric_label(runs: list[Run], metric: str) -> str:
    """Axis label: the task's label and direction for its metrics, with the split."""
    from lstmablate.task import get_task

    if metric == "train_loss":
        return "training loss (mean since the previous evaluation)"
    if metric == "lr":
        return "learning rate"
    splits = sorted({str(rec.get("split")) for r in runs for rec in r.metrics() if rec.get("split")})
    for task in dict.fromkeys(r.task_name for r in runs):
        try:
            for m in get_task(task).metrics:
                if m.name == metric:
                    arrow = "↑" if m.higher_is_better else "↓"
                    return f"{'/'.join(splits) or 'dev'} {m.label or m.name} {arrow}"
        except UnknownNameError:
            pass
    return f"{'/'.join(splits) or 'dev'} {metric}"


def draw(panels: list[tuple[str, list[CurveGroup]]], x: str, log_y: bool = False,
         title: str | None = None) -> Any:
    """A matplotlib Figure: one panel per (y label, groups), seeds thin, means bold."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4 * len(panels), 4.4))
    FigureCanvasAgg(fig)
    colours = {}
    palette = [f"C{i}" for i in range(10)]
    for k, (ylabel, groups) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), k + 1)
        for g in groups:
            colour = colours.setdefault(g.label, palette[len(colours) % len(palette)])
            if len(g.seeds) > 1:
                for c in g.seeds:
                    ax.plot(c.x, c.y, color=colour, linewidth=0.8, alpha=0.45,
                            marker=_marker(c), markersize=3)
            if g.mean is not None and g.mean.x:
                ax.plot(g.mean.x, g.mean.y, color=colour, linewidth=2.4, marker=_marker(g.mean),
                        markersize=6, label=f"{g.label} (n={len(g.seeds)})")
        ax.set_xlabel(x)
        ax.set_ylabel(ylabel)
        if log_y:
            ax.set_yscale("log")
        ax.grid(True, linewidth=0.3, alpha=0.6)
        if k == 0:
            ax.legend(fontsize=8, frameon=False)
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return fig


def _marker(curve: Curve) -> str | None:
    """Points are marked on short curves: a run evaluated once is a point, not nothing."""
    return "o" if len(curve.x) <= 25 else None


def figure_title(runs: list[Run]) -> str:
    """The recipe's description when every run comes from one recipe, else the experiments."""
    from lstmablate.recipes import load_recipe

    files = {r.recipe_file or r.recipe for r in runs}
    if len(files) == 1 and None not in files:
        try:
            _, recipe = load_recipe(str(files.pop()))
            if recipe.get("description"):
                return str(recipe["description"])
        except UserError:  # the recipe moved or changed since: fall back to the names
            pass
    return ", ".join(sorted({r.experiment for r in runs}))


def curves_csv(panels: list[tuple[str, list[CurveGroup]]], x: str) -> str:
    """The points of every curve: experiment, cell, seed (or mean), metric, step, epoch, value."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["experiment", "cell", "seed", "metric", "step", "epoch", "value"])
    for metric, groups in panels:
        for g in groups:
            for c in g.seeds + ([g.mean] if g.mean is not None else []):
                for xv, yv in zip(c.x, c.y):
                    xs = {"step": int(xv) if x == "step" else "", "epoch": int(xv) if x == "epoch" else ""}
                    w.writerow([g.experiment, g.cell, "" if c.seed is None else c.seed, metric,
                                xs["step"], xs["epoch"], repr(yv)])
    return buf.getvalue()


def plot_runs(paths: list[Path], out: Path, metrics: list[str] | None = None, x: str = "step",
              log_y: bool = False, force: bool = True) -> dict[str, Any]:
    """Learning curves of the runs under ``paths``: ``out`` (.png or .pdf) and its PNG, PDF and
    CSV siblings (without ``force``, existing ones are refused before anything is read).
    ``out`` a device or a pipe (:func:`lstmablate.io.output_kind`) receives one figure alone,
    a PDF if its name ends in .pdf, else a PNG (the other paths returned are None).
    Returns {"png", "pdf", "csv": paths, "figure": the Figure, "panels", "skipped": why
    each damaged run folder was left out}."""
    out = Path(out)
    streamed = is_stream(out)
    if out.suffix.lower() not in (".png", ".pdf") and not streamed:
        raise UserError(f"--out {out}: give a file name ending in .png or .pdf (both are "
                        "written, and the CSV of the curves beside them).")
    if x not in X_AXES:
        raise UnknownNameError("x axis", x, X_AXES)
    png, pdf, csv_path = out.with_suffix(".png"), out.with_suffix(".pdf"), out.with_suffix(".csv")
    if streamed:  # (its companions would be files beside a device or a pipe)
        as_pdf = out.suffix.lower() == ".pdf"
        png, pdf, csv_path = (None, out, None) if as_pdf else (out, None, None)
    check_output([p for p in (png, pdf, csv_path) if p is not None], force=force)  # before
    # anything is read or written
    skipped: list[str] = []
    runs = find_plotted(paths, skipped)
    metrics = list(dict.fromkeys(metrics or default_metrics(runs)))
    have = available_metrics(runs)
    for m in metrics:
        if m not in have:
            raise UnknownNameError("metric in metrics.jsonl", m, have,
                                   hint="`train_loss` is the training loss, `lr` the learning rate.")
    panels = [(m, group_curves(runs, m, x)) for m in metrics]
    fig = draw([(metric_label(runs, m), groups) for m, groups in panels], x, log_y=log_y,
               title=figure_title(runs))
    if png is not None:
        atomic_write(png, lambda f: fig.savefig(f, format="png", dpi=150))
    if pdf is not None:
        atomic_write(pdf, lambda f: fig.savefig(f, format="pdf"))
    if csv_path is not None:
        atomic_write_text(csv_path, curves_csv(panels, x))
    return {"png": png, "pdf": pdf, "csv": csv_path, "figure": fig, "panels": panels,
            "skipped": skipped}
