"""Benchmark rows as a rich table, Markdown or JSON."""

from __future__ import annotations

import json
import math
from typing import Any


# ---------------------------------------------------------------------------------
# output
# ---------------------------------------------------------------------------------

def json_safe(row: dict) -> dict:
    """``row`` with every non-finite float (NaN, infinity: not JSON) replaced by None."""
    return {k: None if isinstance(v, float) and not math.isfinite(v) else v
            for k, v in row.items()}


def to_json(rows: list[dict], **extra: Any) -> str:
    """The rows (and e.g. ``environment=...``) as an indented JSON document."""
    doc = dict(extra, rows=[json_safe(r) for r in rows])
    return json.dumps(doc, indent=2)


def _target_text(r: dict) -> str:
    """A row's target as the tables show it: ``1.80x LSTM``, ``2.00x ref``, ``1.00x
    lstm-srnn-out`` (a cell timed beside it); empty where none applies."""
    if r.get("target") is None:
        return ""
    base = r["target_baseline"]
    return f"{r['target']:.2f}x " + {"nn.LSTM": "LSTM", "nn.RNN": "RNN", "reference": "ref"}.get(
        base, base)


def _fmt(v: Any, spec: str = ".2f") -> str:
    return "" if v is None else format(v, spec)


#: the widest a benchmark's table is drawn (a terminal of 100 columns, a log, a pull request)
WIDTH = 100

#: what the columns of a cell table mean, printed under it
CELL_COLUMNS = (
    "vs LSTM, vs RNN: tokens/s over those of torch.nn.LSTM / nn.RNN of the same size, timed in "
    "the same process, round by round (real tokens: padding excluded). target: the ratio this "
    "cell should reach against the baseline named (LSTM, RNN, ref = its own step-by-step "
    "loop, or another cell timed beside it): the project's speed targets, on CPU stated for 2 "
    "threads (docs/performance.md, 'Targets'); met: whether this run reached it. --json and "
    "--out FILE.json keep every column: memory, GFLOP/s, the reference loop's time.")


def busy_note(load: float | None, cores: int) -> str | None:
    """A warning when the machine is busy -- its load (processes running or waiting for a
    core) above the ``cores`` this process may use: other processes then take turns with the
    timed loops, and the ratios can be far from a quiet machine's; None otherwise."""
    if load is None or load <= cores:
        return None
    return (f"the machine is busy (load {load:.1f} on {cores} cores): other processes take "
            "turns with the timed loops, so the times are longer and the ratios can be far "
            "from a quiet machine's. Measure again "
            "when the load is below the cores (`uptime`), or read the ratios as rough.")


def render(rows: list[dict]):
    """A ``rich.table.Table`` of :func:`bench_cells` and/or :func:`bench_models` rows: one
    table per shape, at most :data:`WIDTH` columns wide, the cell tables' columns explained
    under them (:data:`CELL_COLUMNS`)."""
    from rich import box
    from rich.table import Table

    def table(title: str, caption: str | None = None) -> Table:
        return Table(title=title, caption=caption, box=box.SIMPLE_HEAD, title_justify="left",
                     caption_justify="left", pad_edge=False)

    tables = []
    cell_groups = _by_shape([r for r in rows if r.get("kind") == "cell"])
    for i, group in enumerate(cell_groups):
        r0 = group[0]
        what = (f"{r0['batch']}x{r0['steps']} tokens, {r0['layers']}x{r0['hidden']}"
                + (", bidirectional" if r0.get("bidirectional") else "")
                + (f", {_padding(r0)} padding" if r0.get("padding") else ""))
        threads = f"{r0['threads']} thread" + ("s" if r0["threads"] != 1 else "")
        t = table(f"{r0['shape']} ({what}): forward+backward, {r0['device']}, {threads}, "
                  "median of the rounds",
                  CELL_COLUMNS if i == len(cell_groups) - 1 else None)
        # a cell's name is never cut (the kernel's words wrap instead)
        t.add_column("cell", no_wrap=True, min_width=max(len(r["cell"]) for r in group))
        t.add_column("kernel")
        for col in ("ms/iter", "tokens/s", "vs LSTM", "vs RNN", "target"):
            t.add_column(col, justify="right", no_wrap=True)
        t.add_column("met", justify="center", no_wrap=True)
        for r in group:
            met = {True: "[green]yes[/]", False: "[red]NO[/]", None: ""}[r.get("target_met")]
            t.add_row(r["cell"], r["kernel"], _fmt(r["ms"], ".1f"), _fmt(r["tokens_per_s"], ",.0f"),
                      _fmt(r["ratio_lstm"]), _fmt(r["ratio_rnn"]), _target_text(r), met)
        tables.append(t)
    for group in _by_shape([r for r in rows if r.get("kind") == "model"]):
        m0 = group[0]
        threads = f"{m0['threads']} thread" + ("s" if m0["threads"] != 1 else "")
        mt = table(f"PTB-{m0['shape'].split('-')[1]} training step (vocab {m0['vocab']}, "
                   f"{m0['layers']}x{m0['hidden']}, batch {m0['batch']}, {m0['steps']} steps), "
                   f"{m0['device']}, {threads}")
        for col in ("cell", "kernel", "ms/iter", "tokens/s", "vs LSTM"):
            mt.add_column(col, justify="left" if col in ("cell", "kernel") else "right")
        for r in group:
            mt.add_row(r["cell"], r["kernel"], _fmt(r["ms"], ".1f"),
                       _fmt(r["tokens_per_s"], ",.0f"), _fmt(r["ratio_lstm"]))
        tables.append(mt)
    if not tables:
        return table("no rows")
    if len(tables) == 1:
        return tables[0]
    both = Table.grid(padding=(1, 0))
    for t in tables:
        both.add_row(t)
    return both


def _padding(row: dict) -> str:
    """A row's share of padded positions ("42%"; blank without padding)."""
    share = row.get("padding")
    return f"{share:.0%}" if share else ""


def _by_shape(rows: list[dict]) -> list[list[dict]]:
    """Rows grouped by their ``shape``, in order of first appearance."""
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(r["shape"], []).append(r)
    return list(groups.values())


def to_markdown(rows: list[dict]) -> str:
    """The rows as GitHub-flavoured Markdown tables (for docs/results/speed.md)."""
    out = []
    cell_rows = [r for r in rows if r.get("kind") == "cell"]
    model_rows = [r for r in rows if r.get("kind") == "model"]
    if cell_rows:
        mem = "peak MB" if cell_rows[0]["device"] == "cuda" else "saved MB"
        out.append(f"| shape | cell | kernel | ms/iter | tokens/s | padding | vs nn.LSTM | vs nn.RNN "
                   f"| target | met | GFLOP/s | x ref | {mem} | precision |")
        out.append("|" + "---|" * 14)
        for r in cell_rows:
            tgt = _target_text(r)
            met = {True: "yes", False: "**no**", None: ""}[r.get("target_met")]
            out.append(f"| {r['shape']} | {r['cell']} | {r['kernel']} | {_fmt(r['ms'], '.1f')} | "
                       f"{_fmt(r['tokens_per_s'], ',.0f')} | {_padding(r)} | "
                       f"{_fmt(r['ratio_lstm'])} | "
                       f"{_fmt(r['ratio_rnn'])} | {tgt} | {met} | {_fmt(r['gflops'], '.1f')} | "
                       f"{_fmt(r.get('speedup_vs_reference'))} | {_fmt(r['memory_mb'], '.1f')} | "
                       f"{r.get('precision', '')} |")
    if model_rows:
        if out:
            out.append("")
        out.append("| model | cell | kernel | ms/iter | tokens/s | vs nn.LSTM | precision |")
        out.append("|---|---|---|---|---|---|---|")
        for r in model_rows:
            out.append(f"| {r['shape']} | {r['cell']} | {r['kernel']} | {_fmt(r['ms'], '.1f')} | "
                       f"{_fmt(r['tokens_per_s'], ',.0f')} | {_fmt(r['ratio_lstm'])} | "
                       f"{r.get('precision', '')} |")
    return "\n".join(out)
