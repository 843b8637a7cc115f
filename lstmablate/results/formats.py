"""A :class:`~lstmablate.results.report.Report` as text: markdown, LaTeX, CSV or JSON.

* **markdown** — one table per experiment (or table spec): rows = cells, ours as
  ``mean ± std (n=…)`` over seeds, the paper's numbers in their own columns, notes.
* **latex** — the same tables for a paper: ``booktabs`` rules, ``mean $\\pm$ std``,
  the paper's numbers in their own columns, the best entry of every column in
  bold, and a caption naming the task, the split, the checkpoint and n.  Needs
  ``\\usepackage{booktabs}``; notes follow as ``%`` comments.
* **csv**, **json** — one row per run folder (finished, unfinished or damaged):
  identity, status, steps, times and every dev/test metric of its result.json,
  for one's own analyses (e.g. ``pandas.read_csv``).

Every format shows the same numbers: all of them read the one Report.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from pathlib import Path
from typing import Any

from lstmablate.console import count
from lstmablate.errors import UnknownNameError
from lstmablate.run.record import Run
from lstmablate.run.runs import RunResult
from lstmablate.task import get_task
from .pairing import unhashed_note
from .report import Report, Row, Stat, Table, build_report, run_caveats, run_deviations
from .significance import ASO_THRESHOLD, MIN_SEEDS
from .verdict import CORRECTION_NAMES, RESTS_ON, test_name

FORMATS = ("markdown", "latex", "csv", "json")
CHECKPOINTS = {"best": "best-dev", "last": "last (end of training)"}
NOT_RUN_LEGEND = ("— in our columns: the cell is not part of that experiment (its recipe does not "
                  "list it); `missing`: listed, but no finished run.")
#: rows whose runs depart from the original system (Task.run_deviations)
DEVIATION_LEGEND = "§ not the original system's setup:"


def render_report(runs_dir: Path, table: str | None = None, fmt: str = "markdown") -> str:
    """The report of ``runs_dir`` (see :func:`~lstmablate.results.report.build_report`) as ``fmt``."""
    if fmt not in FORMATS:
        raise UnknownNameError("report format", fmt, FORMATS)
    return render(build_report(runs_dir, table), fmt)


def render(report: Report, fmt: str) -> str:
    if fmt not in FORMATS:
        raise UnknownNameError("report format", fmt, FORMATS)
    return {"markdown": to_markdown, "latex": to_latex, "csv": to_csv, "json": to_json}[fmt](report)


# -- markdown --------------------------------------------------------------------------------
def format_stat(stat: Stat | None, fmt: str) -> str:
    """``12.3 ± 0.4 (n=3)``; ``missing`` (no finished run); ``n/a`` (runs without the metric)."""
    if stat is None:
        return "missing"
    if not stat.n:
        return "n/a"
    text = f"{stat.mean:{fmt}}"
    if stat.std is not None:
        text += f" ± {stat.std:{fmt}}"
    return text + f" (n={stat.n})"


# -- significance (report --significance) ------------------------------------------------------
def p_text(p: float) -> str:
    """A p-value to three decimals, ``< 0.001`` below."""
    return "< 0.001" if p < 0.001 else f"{p:.3f}"


def verdict_cell(table: Table, row: Row, j: int) -> str:
    """Column ``j``'s mark for ``row``: ``worse (ASO ε 0.00; items p 0.004)``, ``better (items:
    5/5 pairs, p 0.001)``, ``reference``, ``too few seeds``, ``no scores`` or ``—`` (not
    tested: the footnotes say why)."""
    if row.cell == table.significance.reference:
        return "reference"
    test = row.tests.get(j)
    if test is None or not test.verdict:
        if test is not None and test.why.startswith(("too few seeds", "no per-item scores")):
            return "no scores" if test.missing and not test.pairs else "too few seeds"
        return "—"
    evidence = []
    if test.seeds is not None:
        way = test.seeds.verdict()
        eps = {"better": test.seeds.eps_a_better, "worse": test.seeds.eps_b_better}.get(
            way, min(test.seeds.eps_a_better, test.seeds.eps_b_better))
        evidence.append(f"ASO {'n.d.' if way == 'not distinguishable' else way} ε {eps:.2f}")
    if test.pairs:
        ways = test.pair_verdicts()
        counts = [f"{ways.count(w)}/{len(ways)} pairs {w}" for w in ("better", "worse")
                  if w in ways] or [f"0/{len(ways)} pairs differ"]
        adjusted = (f", adj. p {p_text(test.p_adjusted)}" if test.p_adjusted is not None
                    and table.significance.correction != "none" else "")
        evidence.append("; ".join(counts) + adjusted)
    return f"{test.verdict} ({'; '.join(evidence)})"


def significance_notes(table: Table) -> list[str]:
    """The footnotes of --significance: the rule, the tests, their settings, the correction,
    what was not tested."""
    opt = table.significance
    ref = opt.reference
    tests = [(row, j, t) for row in table.rows for j, t in sorted(row.tests.items())]
    if not any(row.cell == ref for row in table.rows):
        return [f"--significance: the table has no `{ref}` row to compare the others with."]
    marked = sum(1 for _, _, t in tests if t.verdict)
    notes = [f"vs `{ref}`: better / worse / not distinguishable from `{ref}` at level "
             f"{opt.level:g} (docs/reporting.md, 'The verdict rule'). Over test items: "
             f"{test_name(opt.test, opt.samples, opt.seed)}, each run against the `{ref}` run "
             "of its seed (a cell with one run: against every run of the other); a pair differs "
             "when p < level and its interval excludes 0. Over seeds, when both cells have at "
             f"least {MIN_SEEDS} finished seeds: Almost Stochastic Order of their test numbers "
             f"(Dror et al. 2019, as deepsig computes it; better when ε_min < "
             f"{ASO_THRESHOLD:g} at confidence {1 - opt.level:g} for each of 5 bootstrap seeds; "
             "ε shown for the direction found). With both, the mark is better or worse only "
             "when ASO says so and more than half of the pairs agree; with seeds only, ASO's; "
             "with pairs only (too few seeds), only when every pair agrees. "
             f"{marked} comparison(s) of the table form one family: "
             f"{CORRECTION_NAMES[opt.correction]} of the item-level p-values"
             + (", and ASO with deepsig's Bonferroni correction for them." if
                opt.correction != "none" else ".")]
    rests = sorted({t.by for _, _, t in tests if t.verdict})
    if rests:
        notes.append("Marks rest on: " + "; ".join(f"{RESTS_ON[b]}" for b in rests) + ".")
    missing = list(dict.fromkeys(p for _, _, t in tests for p in t.missing))
    if missing:
        notes.append(f"No per-item scores for {count(len(missing), 'run')}, so no paired test with "
                     "them (`lstmablate eval RUN --split test --scores` writes them from the run's "
                     "checkpoint): " + ", ".join(str(p) for p in missing) + ".")
    unhashed = list(dict.fromkeys(p for _, _, t in tests for p in t.unhashed))
    if unhashed:
        notes.append(unhashed_note(len(unhashed)) + ": their test sets were matched by item "
                     "count and lengths only.")
    untested: dict[tuple[str, str], list[str]] = {}  # (cell, why) -> metrics
    for row, j, t in tests:
        if t.why and t.why != "no finished run":
            untested.setdefault((row.cell, t.why), []).append(table.columns[j].metric.name)
    notes += [f"`{cell}` {', '.join(dict.fromkeys(names))}: not tested ({why})."
              for (cell, why), names in untested.items()]
    return notes


def markdown_table(table: Table) -> str:
    sig = table.significance
    head = ["cell"]
    for c in table.columns:
        head.append((f"{c.group}: " if c.group else "") + c.heading)
        if sig and not c.paper and c.tested:
            head.append(f"vs `{sig.reference}`")
    which = " / ".join(CHECKPOINTS.get(w, w) for w in table.checkpoints)
    dev = sorted({c.split for c in table.columns if c.section != "test"})
    dev_note = (f" Columns headed {' / '.join(f'`{d}`' for d in dev)}: the final evaluation of "
                "that (validation) split with the same checkpoint." if dev else "")
    lines = [f"## {table.title}", "",
             f"Task `{', '.join(table.tasks)}`, {'/'.join(table.test_splits)} split of the {which} "
             f"checkpoint; ours = mean ± std over seeds (n).{dev_note}", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in table.rows:
        cells = [f"`{row.cell}`" + (" †" if row.shortened else "") + (" §" if row.deviations else "")]
        for j, (col, entry) in enumerate(zip(table.columns, row.entries)):
            if col.paper:
                cells.append(str(entry) if entry is not None else "—")
            else:
                cells.append("—" if j in row.not_run else format_stat(entry, col.metric.fmt)
                             + (" ‡" if j in row.caveats else ""))
                if sig and col.tested:
                    cells.append("—" if j in row.not_run else verdict_cell(table, row, j))
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    if sig:
        lines += significance_notes(table)
    if any(r.shortened for r in table.rows):
        lines.append("† includes shortened runs (`train.max_steps` set): not the full protocol.")
    lines += [f"‡ `{cell}` {metric}, {note}." for cell, metric, note in caveat_notes(table)]
    if any(r.not_run for r in table.rows):
        lines.append(NOT_RUN_LEGEND)
    lines += [f"{DEVIATION_LEGEND} `{r.cell}`: {'; '.join(r.deviations)}."
              for r in table.rows if r.deviations]
    lines += [f"Paper numbers: {src}." for src in table.sources]
    lines += [f"- {n}" for n in table.notes]
    lines += [f"- training time per run{f' ({group})' if group else ''}, mean over finished "
              f"seeds: {times}" for group, times in table.train_times]
    return "\n".join(lines).rstrip() + "\n"


def caveat_notes(table: Table) -> list[tuple[str, str, str]]:
    """(cell, metric, why) of every entry that rests on too little evidence (``‡``)."""
    return [(row.cell, table.columns[j].metric.name, note)
            for row in table.rows for j, notes in sorted(row.caveats.items()) for note in notes]


def damaged_section(report: Report) -> list[str]:
    if not report.damaged:
        return []
    return ["## Skipped run folders", ""] + [f"- {why}" for why in report.damaged]


def to_markdown(report: Report) -> str:
    parts = [markdown_table(t) for t in report.tables]
    skipped = damaged_section(report)
    if skipped:
        parts.append("\n".join(skipped) + "\n")
    return "\n".join(parts)


# -- LaTeX ----------------------------------------------------------------------------------
_TEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#",
                "_": r"\_", "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}",
                "^": r"\textasciicircum{}", "±": r"$\pm$", "↑": r"$\uparrow$", "↓": r"$\downarrow$",
                "<": r"$<$", ">": r"$>$", "—": "---", "–": "--", "×": r"$\times$", "−": "$-$",
                "≈": r"$\approx$", "ε": r"$\varepsilon$", "≤": r"$\leq$", "≥": r"$\geq$",
                "…": r"\ldots{}", "†": r"\dag{}"}


def tex_escape(text: str) -> str:
    """Plain text -> LaTeX source that typesets it."""
    return "".join(_TEX_SPECIAL.get(ch, ch) for ch in str(text))


def _tex_stat(stat: Stat | None, fmt: str, best: bool) -> str:
    if stat is None:
        return r"\textit{missing}"
    if not stat.n:
        return "n/a"
    mean = f"{stat.mean:{fmt}}"
    text = rf"\mathbf{{{mean}}}" if best else mean
    if stat.std is not None:
        text += rf" \pm {stat.std:{fmt}}"
    return f"${text}$"


def _tex_paper(entry: Any, best: bool) -> str:
    if entry is None:
        return "--"
    if isinstance(entry, (int, float)) and not isinstance(entry, bool):
        return rf"$\mathbf{{{entry}}}$" if best else f"${entry}$"
    return tex_escape(entry)


def _caption_n(table: Table) -> str:
    """n of the caption: one number if every cell has it, else per cell."""
    per_cell = {}
    for row in table.rows:
        ns = [e.n for c, e in zip(table.columns, row.entries) if not c.paper and e is not None]
        if ns and max(ns):
            per_cell[row.cell] = max(ns)
    if not per_cell:
        return "no finished runs"
    if len(set(per_cell.values())) == 1 and len(per_cell) == len(table.rows):
        n = next(iter(per_cell.values()))
        return f"$n = {n}$ seed{'' if n == 1 else 's'} per cell"
    listed = ", ".join(rf"\texttt{{{tex_escape(c)}}} {n}" for c, n in per_cell.items())
    missing = [r.cell for r in table.rows if r.cell not in per_cell]
    return f"$n$ seeds per cell: {listed}" + (
        "; no finished run: " + ", ".join(rf"\texttt{{{tex_escape(c)}}}" for c in missing)
        if missing else "")


def _label(title: str) -> str:
    return "tab:" + (re.sub(r"[^A-Za-z0-9]+", "-", title).strip("-").lower() or "results")[:40]


def latex_table(table: Table) -> str:
    sig = table.significance
    # with --significance a "vs <reference>" column follows each of ours
    extra = {j for j, c in enumerate(table.columns) if sig and not c.paper and c.tested}
    ncol = len(table.columns) + len(extra)
    which = " / ".join(CHECKPOINTS.get(w, w) for w in table.checkpoints)
    caption = (f"{tex_escape(table.title)}. Task "
               + ", ".join(rf"\texttt{{{tex_escape(t)}}}" for t in table.tasks)
               + f", {tex_escape('/'.join(table.test_splits))} split, {tex_escape(which)} checkpoint; "
               rf"ours: mean $\pm$ sample standard deviation over seeds, {_caption_n(table)}; "
               "best of each column in bold.")
    if any(r.shortened for r in table.rows):
        caption += r" \dag{} includes shortened runs (\texttt{train.max\_steps} set)."
    if any(r.not_run for r in table.rows):
        caption += " " + tex_escape(NOT_RUN_LEGEND.replace("`", ""))
    for cell, metric, note in caveat_notes(table):
        caption += r" \ddag{} " + tex_escape(f"{cell} {metric}, {note}.")
    for r in table.rows:
        if r.deviations:
            caption += (r" \S{} " + tex_escape(f"{DEVIATION_LEGEND[2:]} {r.cell}: "
                                                f"{'; '.join(r.deviations)}."))
    for src in table.sources:
        caption += f" Paper numbers: {tex_escape(src)}."
    if sig:
        caption += "".join(" " + tex_escape(n.replace("`", "")) for n in significance_notes(table))
    lines = ["% lstmablate report; needs \\usepackage{booktabs} in the preamble",
             r"\begin{table}[t]", r"\centering", rf"\caption{{{caption}}}",
             rf"\label{{{_label(table.title)}}}",
             r"\begin{tabular}{l" + "c" * ncol + "}", r"\toprule"]
    if table.groups:
        spans, rules, start = [], [], 2
        for group in table.groups:
            width = sum(1 + (j in extra) for j, c in enumerate(table.columns) if c.group == group)
            spans.append(rf"\multicolumn{{{width}}}{{c}}{{{tex_escape(group)}}}")
            rules.append(rf"\cmidrule(lr){{{start}-{start + width - 1}}}")
            start += width
        lines += [" & " + " & ".join(spans) + r" \\", " ".join(rules)]
    heads = []
    for j, c in enumerate(table.columns):
        heads += [tex_escape(c.heading)] + ([rf"vs \texttt{{{tex_escape(sig.reference)}}}"]
                                             if j in extra else [])
    lines.append("cell & " + " & ".join(heads) + r" \\")
    lines.append(r"\midrule")
    best = [table.best_rows(j) for j in range(len(table.columns))]
    for i, row in enumerate(table.rows):
        cells = [rf"\texttt{{{tex_escape(row.cell)}}}" + (r"\textsuperscript{\dag}" if row.shortened else "")
                 + (r"\textsuperscript{\S}" if row.deviations else "")]
        for j, (col, entry) in enumerate(zip(table.columns, row.entries)):
            cells.append(_tex_paper(entry, i in best[j]) if col.paper
                         else "--" if j in row.not_run
                         else _tex_stat(entry, col.metric.fmt, i in best[j])
                         + (r"\textsuperscript{\ddag}" if j in row.caveats else ""))
            if j in extra:
                cells.append("--" if j in row.not_run else tex_escape(verdict_cell(table, row, j)))
        lines.append(" & ".join(cells) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    lines += [f"% {n}" for n in table.notes]
    lines += [f"% training time per run{f' ({group})' if group else ''}, mean over finished "
              f"seeds: {times}" for group, times in table.train_times]
    return "\n".join(lines) + "\n"


def to_latex(report: Report) -> str:
    parts = [latex_table(t) for t in report.tables]
    parts += [f"% skipped: {why}\n" for why in report.damaged]
    return "\n".join(parts)


# -- one row per run: CSV and JSON ------------------------------------------------------------
RUN_FIELDS = ("experiment", "task", "cell", "seed", "status", "recipe", "test_checkpoint", "steps",
              "epochs", "best_step", "best_epoch", "shortened", "train_time_s", "train_cpu_s",
              "wall_time_s", "params", "world_size", "skipped_nonfinite")
# after the metrics: test metrics that rest on too little evidence (Task.caveats), and why
METRIC_SECTIONS = ("dev", "dev_final", "test")  # best-dev metrics, final dev, test


def _finite(v: Any) -> Any:
    return None if isinstance(v, float) and not math.isfinite(v) else v


def _result(run: Run) -> RunResult | None:
    """The run's result.json; None where it has none, or a damaged one (the row says why)."""
    return None if run.problem else run.result


def _metric_order(runs: list[Run]) -> list[str]:
    """Metric names: each task's declared order, then any other name a result holds."""
    names: list[str] = []
    for task in dict.fromkeys(r.task_name for r in runs):
        try:
            names += [m.name for m in get_task(task).metrics]
        except UnknownNameError:
            pass
    for r in runs:
        for section in METRIC_SECTIONS:
            names += sorted((_result(r).section(section) if _result(r) else None) or {})
    return list(dict.fromkeys(names))


SIGNIFICANCE_FIELDS = ("verdict", "by", "aso_eps_better", "aso_eps_worse", "p_items",
                      "p_adjusted", "against", "delta", "low", "high", "p", "pair_verdict")


def significance_columns(tables: list[Table]) -> tuple[list[str], dict[Path, dict[str, Any]]]:
    """--significance as per-run columns ``vs_<reference>.<metric>.<field>`` (the cell's mark
    and ASO, the run's own paired bootstrap: against the reference run of its seed, else
    the first it was paired with), and ``significance``, what the tests were."""
    columns: list[str] = []
    values: dict[Path, dict[str, Any]] = {}
    for table in tables:
        opt = table.significance
        if opt is None:
            continue
        about = significance_notes(table)[0]
        for row in table.rows:
            for j, test in sorted(row.tests.items()):
                prefix = f"vs_{opt.reference}.{table.columns[j].metric.name}"
                columns += [f"{prefix}.{f}" for f in SIGNIFICANCE_FIELDS]
                for path in test.reference_runs:
                    values.setdefault(Path(path), {})[f"{prefix}.verdict"] = "reference"
                seeds = test.seeds
                for path in test.runs:
                    pair = test.pair_of(path)
                    got = values.setdefault(Path(path), {})
                    got.update({f"{prefix}.verdict": test.verdict or None,
                                f"{prefix}.by": test.by or None,
                                f"{prefix}.aso_eps_better": seeds.eps_a_better if seeds else None,
                                f"{prefix}.aso_eps_worse": seeds.eps_b_better if seeds else None,
                                f"{prefix}.p_items": test.p_items,
                                f"{prefix}.p_adjusted": test.p_adjusted,
                                "significance": about})
                    if pair is not None:
                        ref, r = pair
                        got.update({f"{prefix}.against": str(ref.path), f"{prefix}.delta": r.delta,
                                    f"{prefix}.low": r.low, f"{prefix}.high": r.high,
                                    f"{prefix}.p": r.p_value,
                                    f"{prefix}.pair_verdict": r.verdict(test.higher_is_better)})
    if columns:
        columns.append("significance")
    return list(dict.fromkeys(columns)), values


def run_rows(runs: list[Run], tables: list[Table] | None = None
             ) -> tuple[list[str], list[dict[str, Any]]]:
    """(column names, one dict per run); absent and non-finite values are None."""
    metrics = _metric_order(runs)
    present = {f"{s}.{m}" for r in runs for s in METRIC_SECTIONS
               for m in ((_result(r).section(s) if _result(r) else None) or {})}
    metric_cols = [f"{s}.{m}" for s in METRIC_SECTIONS for m in metrics if f"{s}.{m}" in present]
    sig_cols, sig = significance_columns(tables or [])
    columns = list(RUN_FIELDS) + metric_cols + ["caveats", "deviations", "problem"] + sig_cols \
        + ["path"]
    rows = []
    for r in runs:
        result = _result(r)
        res = result.to_json() if result else {}
        best = res.get("best") if isinstance(res.get("best"), dict) else {}
        row = {"experiment": r.experiment, "task": r.task_name, "cell": r.cell, "seed": r.seed,
               "status": r.status, "recipe": r.recipe,
               "best_step": best.get("step"), "best_epoch": best.get("epoch")}
        for key in RUN_FIELDS:
            if key not in row:
                row[key] = res.get(key)
        for col in metric_cols:
            section, name = col.split(".", 1)
            row[col] = ((result.section(section) if result else None) or {}).get(name)
        notes = run_caveats(r)
        row["caveats"] = "; ".join(f"test.{m}: {why}" for m, why in notes.items()) or None
        row["deviations"] = "; ".join(run_deviations(r)) or None
        row["problem"] = r.problem or None
        row.update(sig.get(Path(r.path), {}))
        row["path"] = str(r.path)
        rows.append({c: _finite(row.get(c)) for c in columns})
    return columns, rows


def to_csv(report: Report) -> str:
    columns, rows = run_rows(report.runs, report.tables)
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow(["" if v is None else ("true" if v is True else "false" if v is False else v)
                         for v in (row[c] for c in columns)])
    return buf.getvalue()


def to_json(report: Report) -> str:
    _, rows = run_rows(report.runs, report.tables)
    return json.dumps(rows, indent=2, allow_nan=False) + "\n"
