"""gpu-check's record (its four files: :mod:`.gpu_check`): the run's files and clock, each
stage's rows and outcome appended as it ends and the whole record rewritten from them
(:class:`Check`); the rows read back (:func:`read_rows`, which the window reads too); the
targets of docs/performance.md that they measure (:func:`targets`); and the Markdown.

Like gpu-check, this module imports only the standard library and the package's bottom floor
at start-up (PyTorch where the record names its version, the tables' helpers where they are
drawn): it runs on a bare GPU machine.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

from lstmablate import io
from lstmablate.errors import UserError

#: the ratios of the GPU kernels' targets that are not one row's (docs/performance.md)
PARSER_WITHIN = 0.9  # parser-400 ratio >= 0.9 x the ptb-650 ratio (LSTM family)
TRAINER_WITHIN = 0.9  # the trainer's tokens/s >= 0.9 x the benchmarked step's


def read_rows(path: Path) -> list[dict]:
    """The rows of a ``.jsonl`` record (none if it is missing; a last line cut short by a kill
    is left out).  Read as :func:`lstmablate.io.read_lines` reads JSON lines: a FIFO, a device
    or a file too big is a UserError naming it, never waited on."""
    path = Path(path)
    if not path.exists():
        return []
    rows = []
    for line in io.read_lines(path, UserError):
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


# ---------------------------------------------------------------------------------
# what the rows say: targets and tables
# ---------------------------------------------------------------------------------

def targets(rows: list[dict]) -> list[dict]:
    """Every target of docs/performance.md that these rows measure: one record each
    (what, measured, needed, met).  Rows of several precisions (``cells-fp32`` and
    ``cells-tf32``) are compared within their precision, which each target names."""
    out = []

    def add(what: str, got: float | None, need: float):
        out.append(dict(target=what, measured=None if got is None else round(got, 3),
                        needed=need, met=None if got is None else got >= need))

    def at(r: dict) -> str:  # ", tf32" where the row says its precision
        return f", {r['precision']}" if r.get("precision") else ""

    cells = [r for r in rows if r.get("kind") == "cell"]
    by = {(r.get("precision"), r["shape"], r["cell"]): r for r in cells}
    for r in cells:  # the rows' own targets (bench.GPU_TARGETS)
        if r.get("target") is not None:
            add(f"{r['cell']} >= {r['target']:.2f}x {r['target_baseline']} at {r['shape']}{at(r)}",
                r["target_ratio"], r["target"])
    for precision in dict.fromkeys(r.get("precision") for r in cells):
        family = sorted({r["cell"] for r in cells
                         if r["cell"].startswith("lstm") and r.get("precision") == precision})
        for cell in family:
            r650, rp = by.get((precision, "ptb-650", cell)), by.get((precision, "parser-400", cell))
            if r650 and rp:
                base = "ratio_rnn" if cell == "lstm-gates" else "ratio_lstm"
                add(f"{cell} at parser-400 within 10% of its ptb-650 ratio{at(rp)} "
                    f"({rp[base]:.2f} vs {r650[base]:.2f})", rp[base] / r650[base], PARSER_WITHIN)
    for (precision, shape, cell), r in by.items():
        base = by.get((precision, shape, "nn.LSTM"))
        if cell.startswith("lstm-") and base and base.get("memory_mb"):
            add(f"{cell} peak memory <= nn.LSTM's at {shape}{at(r)} (MB {r['memory_mb']:.1f} vs "
                f"{base['memory_mb']:.1f})", base["memory_mb"] / max(r["memory_mb"], 1e-9), 1.0)
    models = {(r["shape"], r["cell"]): r for r in rows if r.get("kind") == "model"}
    for (shape, cell), r in models.items():
        if shape == "ptb-medium-model" and cell.startswith("lstm-"):
            add(f"{cell} PTB-medium training step >= 1.0x the nn.LSTM model", r["ratio_lstm"], 1.0)
    for r in rows:  # a recipe's trainer rows against the model rows of the same name
        if r.get("kind") != "trainer":
            continue
        model = models.get((r["shape"].removesuffix("-trainer") + "-model", r["cell"]))
        if model is not None:
            bench_tps = model["tokens_per_s"]
            add(f"{r['cell']} trainer tokens/s within 10% of the benchmarked step "
                f"({r['tokens_per_s']:,.0f} vs {bench_tps:,.0f})", r["tokens_per_s"] / bench_tps,
                TRAINER_WITHIN)
    from .gpu_steps import targets as capture_targets  # (the step-capture stage's)

    return out + capture_targets(rows)


def _num(v: Any, spec: str) -> str:
    return "" if v is None else format(v, spec)


def markdown(doc: dict) -> str:
    """The record as Markdown: the stages, then a table per kind of row, then the targets."""
    from .render import to_markdown

    env = doc.get("environment", {})
    rows = doc.get("rows", [])
    lines = [f"# gpu-check: {env.get('gpu') or env.get('device', '?')}", "",
             f"{doc['started']}, {doc['seconds']:.0f} s"
             + (f" of a {doc['budget']:.0f} s budget" if doc.get("budget") else "")
             + f"; PyTorch {env.get('torch')}, CUDA {env.get('cuda')}, cuDNN {env.get('cudnn')}, "
             f"Triton {env.get('version_triton', env.get('triton'))}; commit {env.get('git')}", ""]
    if env.get("note"):
        lines[-1:-1] = ["", f"({env['note']})"]
    if doc.get("stages"):
        lines += ["| stage | status | seconds (budget) | note |", "|---|---|---|---|"]
        for name, s in doc["stages"].items():
            note = "; ".join(x for x in (s.get("summary"), s.get("reason")) if x)
            budget = f" ({s['budget']:.0f})" if s.get("budget") is not None else ""
            lines.append(f"| {name} | {s.get('status')} | {s.get('seconds', 0):.0f}{budget} | "
                         f"{note.replace('|', '/')} |")
        lines.append("")
    for r in (r for r in rows if r.get("kind") == "tests" and r.get("failures")):
        lines += ["tests/gpu failures:", "", *[f"* `{f}`" for f in r["failures"]], ""]
    paths = [r for r in rows if r.get("kind") == "path"]
    if paths:
        lines += ["| shape | cell | precision | kernel | fast path | worst | error | allowed | "
                  "passed |", "|---|---|---|---|---|---|---|---|---|"]
        taken = {True: "yes", False: "**no**", None: "?"}
        lines += [f"| {r['shape']} | {r['cell']} | {r['precision']} | {r['kernel']} | "
                  f"{taken[r.get('fast_path')]} | {r.get('worst') or r.get('problem', '')} | "
                  f"{_num(r.get('error'), '.3g')} | {_num(r.get('allowed'), '.3g')} | "
                  f"{'yes' if r['passed'] else '**no**'} |" for r in paths]
        lines.append("")
    measured = [r for r in rows if r.get("kind") in ("cell", "model")]
    if measured:
        lines += [to_markdown(measured), ""]
    steps = [r for r in rows if r.get("kind") == "step"]
    if steps:
        lines += ["| recipe | cell | kernel | ms/step | tokens/s | GPU busy | steps/epoch | epochs "
                  "| one run's steps, alone |", "|---|---|---|---|---|---|---|---|---|"]
        for r in steps:
            busy = f"{r['gpu_ms'] / r['ms']:.0%}" if r.get("gpu_ms") else ""
            minutes = r["run_steps"] * r["ms"] / 6e4
            lines.append(f"| {r['recipe']} | {r['cell']} | {r['kernel']} | {r['ms']:.2f} | "
                         f"{r['tokens_per_s']:,.0f} | {busy} | {r['steps_per_epoch']} | "
                         f"{r['epochs']} | {minutes:.1f} min |")
        lines.append("")
    profile = [r for r in rows if r.get("kind") == "profile"]
    for key in dict.fromkeys((r["shape"], r["cell"]) for r in profile):
        group = [r for r in profile if (r["shape"], r["cell"]) == key]
        lines += [f"| {key[1]} at {key[0]} ({group[0]['kernel']}; {group[0]['total_ms']:.3f} ms "
                  "per forward+backward) | calls | ms | share |", "|---|---|---|---|"]
        lines += [f"| `{r['name'][:80]}` | {r['calls']:g} | {r['ms']:.4f} | "
                  f"{_num(r['share'], '.1%')} |" for r in group]
        lines.append("")
    trainer = [r for r in rows if r.get("kind") == "trainer"]
    for shape in dict.fromkeys(r["shape"] for r in trainer):  # one table per recipe
        lines += [f"| {shape.removesuffix('-trainer')} through the trainer | steps | seconds "
                  "| tokens/s |", "|---|---|---|---|"]
        lines += [f"| {r['cell']} | {r['steps']} | {r['seconds']:.2f} | {r['tokens_per_s']:,.0f} |"
                  for r in trainer if r["shape"] == shape]
        lines.append("")
    from . import gpu_steps, peers  # the step-capture and peers stages' tables

    lines += gpu_steps.markdown_rows(rows) + peers.markdown_rows(rows)
    met = {True: "yes", False: "**no**", None: ""}
    if doc.get("targets"):
        lines += ["| target | measured | needed | met |", "|---|---|---|---|"]
        lines += [f"| {t['target']} | {'' if t['measured'] is None else t['measured']} | "
                  f"{t['needed']} | {met[t['met']]} |" for t in doc["targets"]]
    return "\n".join(lines).rstrip() + "\n"


# ---------------------------------------------------------------------------------
# the files
# ---------------------------------------------------------------------------------

class Check:
    """One gpu-check run: its files, its clock, and the record it rewrites after each stage."""

    def __init__(self, out: Path, device: str, budget: float, gpu: str, command: str):
        self.device, self.budget, self.gpu = device, budget, gpu
        self.t0, self.end = time.perf_counter(), time.time() + budget
        self.started = time.strftime("%Y-%m-%d %H:%M:%S")
        name = re.sub(r"[^A-Za-z0-9]+", "-", gpu).strip("-").lower() or "gpu"
        stem = out / f"gpu-check-{name}-{time.strftime('%Y%m%d-%H%M%S')}"
        self.jsonl, self.json, self.md, self.log = (stem.with_suffix(s) for s in
                                                    (".jsonl", ".json", ".md", ".log"))
        self.stages: dict[str, dict] = {}
        self.command = command
        out.mkdir(parents=True, exist_ok=True)
        io.append_json_line(self.jsonl, dict(kind="run", started=self.started, command=command,
                                             device=device, budget=budget))

    def seconds(self) -> float:
        return round(time.perf_counter() - self.t0, 1)

    def record(self, name: str, outcome: dict, rows: list[dict] = ()) -> None:
        """A stage's rows (those it did not append itself) and its outcome, appended; then
        the ``.json`` and ``.md`` rewritten from everything the ``.jsonl`` holds."""
        for row in rows:
            io.append_json_line(self.jsonl, {"stage": name, **row})
        self.stages[name] = outcome
        io.append_json_line(self.jsonl, dict(kind="stage", stage=name, **outcome))
        self.rewrite()
        note = outcome.get("summary") or outcome.get("reason") or ""
        print(f"gpu-check {name}: {outcome['status']} ({outcome.get('seconds', 0)} s) {note}",
              flush=True)

    def document(self) -> dict:
        rows = read_rows(self.jsonl)
        # without the environment stage, what this process knows: the device and PyTorch
        # (imported by gpu-check's main() to ask for CUDA; the environment stage reads the same
        # version)
        import torch

        env = next((r for r in rows if r.get("kind") == "environment"), None) or dict(
            gpu=self.gpu, device=self.device, torch=torch.__version__,
            note="the environment stage did not run: only the device and PyTorch are known")
        measured = [r for r in rows if r.get("kind") not in ("run", "stage", "environment")]
        return dict(started=self.started, command=self.command, device=self.device,
                    budget=self.budget, seconds=self.seconds(), environment=env,
                    stages=self.stages, rows=measured, targets=targets(measured))

    def rewrite(self) -> None:
        doc = self.document()
        io.atomic_write_text(self.json, json.dumps(doc, indent=2) + "\n")
        io.atomic_write_text(self.md, markdown(doc))
