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


def render(rows: list[dict]):
    """A ``rich.table.Table`` of :func:`bench_cells` and/or :func:`bench_models` rows."""
    from rich.table import Table

    cell_rows = [r for r in rows if r.get("kind") == "cell"]
    model_rows = [r for r in rows if r.get("kind") == "model"]
    if cell_rows:
        dev = cell_rows[0]["device"]
        mem = "peak MB" if dev == "cuda" else "saved MB"
        table = Table(title=f"forward+backward, {dev}, {cell_rows[0]['threads']} threads "
                            "(median of the rounds; tokens/s: real tokens, padding excluded; "
                            "ratio = tokens/s over the baseline's)")
        for col, kw in (("shape", {}), ("cell", {}), ("kernel", {}), ("ms/iter", {"justify": "right"}),
                        ("tokens/s", {"justify": "right"}), ("padding", {"justify": "right"}),
                        ("vs nn.LSTM", {"justify": "right"}),
                        ("vs nn.RNN", {"justify": "right"}), ("target", {"justify": "right"}),
                        ("met", {"justify": "center"}), ("GFLOP/s", {"justify": "right"}),
                        ("x ref", {"justify": "right"}), (mem, {"justify": "right"})):
            table.add_column(col, **kw)
        last = None
        for r in cell_rows:
            if last is not None and r["shape"] != last:
                table.add_section()
            last = r["shape"]
            tgt = _target_text(r)
            met = {True: "[green]yes[/]", False: "[red]NO[/]", None: ""}[r.get("target_met")]
            table.add_row(r["shape"], r["cell"], r["kernel"], _fmt(r["ms"], ".1f"),
                          _fmt(r["tokens_per_s"], ",.0f"), _padding(r), _fmt(r["ratio_lstm"]),
                          _fmt(r["ratio_rnn"]), tgt, met, _fmt(r["gflops"], ".1f"),
                          _fmt(r.get("speedup_vs_reference")), _fmt(r["memory_mb"], ".1f"))
        if not model_rows:
            return table
    if model_rows:
        tables = [] if not cell_rows else [table]
        for group in _by_shape(model_rows):
            m0 = group[0]
            mt = Table(title=f"PTB-{m0['shape'].split('-')[1]} training step (vocab {m0['vocab']}, "
                             f"{m0['layers']}x{m0['hidden']}, batch {m0['batch']}, "
                             f"{m0['steps']} steps), {m0['device']}, {m0['threads']} threads")
            for col in ("cell", "kernel", "ms/iter", "tokens/s", "vs nn.LSTM"):
                mt.add_column(col, justify="left" if col in ("cell", "kernel") else "right")
            for r in group:
                mt.add_row(r["cell"], r["kernel"], _fmt(r["ms"], ".1f"),
                           _fmt(r["tokens_per_s"], ",.0f"), _fmt(r["ratio_lstm"]))
            tables.append(mt)
        if len(tables) == 1:
            return tables[0]
        both = Table.grid(padding=(1, 0))
        for t in tables:
            both.add_row(t)
        return both
    return Table(title="no rows")


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
    """The rows as GitHub-flavoured Markdown tables (for docs/performance.md)."""
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
