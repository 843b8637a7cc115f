"""A GPU window's records, collected into the files that come back (:mod:`.window`): one archive
of the window's state, its summary, gpu-check's record and each started run's small records
(never a checkpoint), beside it the summary (:func:`summary`, Markdown) and gpu-check's
``.md`` and ``.json`` -- each written by the output rule (:mod:`lstmablate.io`: the archive
replaced atomically, so an interrupted collection leaves the previous one).  Only the standard
library and the package's bottom floor are imported at start-up.
"""

from __future__ import annotations

import json
import tarfile
import time
from pathlib import Path
from typing import Any

from lstmablate import io
from lstmablate.errors import UserError

from .window_files import STATE, WindowError, check_dir, log_tail, runs_dir

#: the files of a collection in ``--out`` (beside them, gpu-check's ``.md`` and ``.json``)
ARCHIVE = "gpu-window.tar.gz"
SUMMARY = "gpu-window.md"
#: the archive's folder of the runs' records: ``runs/<experiment>/<cell>/seed-<n>/`` and
#: beside each, ``seed-<n>.log`` (the end of its log); :mod:`.window_land` reads it back
RUNS_PREFIX = "runs"
#: the end of each run's log that the archive keeps
LOG_TAIL_BYTES = 256 * 1024
#: the most of one record file the archive keeps (a run's records are KBs; gpu-check's, MBs)
MAX_RECORD_BYTES = 64 * 2**20


def collect(state: dict, base: Path, out: Path) -> Path:
    """One archive in ``out`` of what the window has: its state and summary, gpu-check's
    record, and each started run's small records (config, env, metrics, result, scores, the
    end of its log) -- never a checkpoint; and beside it the summary and gpu-check's
    ``.md`` and ``.json``.  Written by the output rule (:func:`lstmablate.io.atomic_write`:
    a rename), so an interrupted collection leaves the previous archive."""
    from lstmablate.run.runs import RunFiles

    out.mkdir(parents=True, exist_ok=True)
    checks, runs = check_dir(base), runs_dir(base)
    summary_text = summary(state)

    def archive(f: Any) -> None:
        with tarfile.open(fileobj=f, mode="w:gz") as tar:
            def add_bytes(name: str, data: bytes) -> None:
                info = tarfile.TarInfo(name)
                info.size, info.mtime = len(data), int(time.time())
                tar.addfile(info, fileobj=_BytesReader(data))

            def add_file(path: Path, name: str) -> None:  # (regular files only: read bounded)
                try:
                    add_bytes(name, io.read_tail(path, MAX_RECORD_BYTES, WindowError))
                except UserError:
                    pass

            add_bytes(STATE, json.dumps(state, indent=2).encode())
            add_bytes(SUMMARY, summary_text.encode())
            for f in sorted(checks.glob("gpu-check-*")):
                add_file(f, f"check/{f.name}")
            for run in state["runs"]:
                if run["state"] == "planned":
                    continue
                files = RunFiles.of(runs, run["experiment"], run["cell"], run["seed"])
                folder = f"{RUNS_PREFIX}/{run['experiment']}/{run['cell']}/seed-{run['seed']}"
                for path in (files.config, files.env, files.metrics, files.result):
                    if path.is_file():
                        add_file(path, f"{folder}/{path.name}")
                for path in files.score_files():
                    add_file(path, f"{folder}/{RunFiles.SCORES}/{path.name}")
                add_bytes(f"{folder}.log", log_tail(files.log, LOG_TAIL_BYTES))

    io.atomic_write(out / ARCHIVE, archive)
    io.atomic_write_text(out / SUMMARY, summary_text)
    for f in checks.glob("gpu-check-*"):
        if f.suffix in (".md", ".json"):
            io.atomic_write_text(out / f.name, io.read_text(f, error=WindowError))
    return out / ARCHIVE


class _BytesReader:
    """A file-like reader of bytes (tarfile reads members from one)."""

    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def read(self, n: int = -1) -> bytes:
        end = len(self.data) if n < 0 else self.pos + n
        chunk, self.pos = self.data[self.pos:end], min(end, len(self.data))
        return chunk


def summary(state: dict) -> str:
    """The window as Markdown: its calls, gpu-check's stages, every run's state and what was
    not started."""
    lines = [f"# GPU window: {state.get('gpu', '?')}", ""]
    for call in state["calls"]:
        lines.append(f"* {call['mode']} at {call['started']}: {call['minutes']:g} min"
                     + (f", ended {call['ended']}" if call.get("ended") else ""))
    check = state.get("check") or {}
    if check:
        lines += ["", f"gpu-check: exit {check.get('exit')} ({check.get('files', '')})", ""]
        stages = check.get("stages") or {}
        if stages:
            lines += ["| stage | status | note |", "|---|---|---|"]
            lines += [f"| {n} | {s.get('status')} | "
                      f"{'; '.join(x for x in (s.get('summary'), s.get('reason')) if x)} |"
                      for n, s in stages.items()]
    install_report = state.get("install")
    if install_report:
        lines += ["", f"installed: {', '.join(install_report.get('installed', [])) or 'nothing'}"
                  f"; still missing: {', '.join(install_report.get('missing', [])) or 'nothing'}"]
    lines += ["", "| run | planned | estimate | state | progress | last evaluation | test |",
              "|---|---|---|---|---|---|---|"]
    for run in state["runs"]:
        p = run.get("progress", {})
        done = (f"step {p['step']} (epoch {p['epoch']}, {p.get('tokens_per_s', 0):,} tokens/s)"
                if "step" in p else "")
        last = p.get("last_eval") or {}
        shown = ", ".join(f"{k} {v:.4g}" for k, v in last.items()
                          if isinstance(v, float) and k not in ("lr", "train_loss"))
        test = ", ".join(f"{k} {v:.4g}" for k, v in (p.get("test") or {}).items()
                         if isinstance(v, float))
        planned = f"{run['epochs']} epochs" + (" (shortened)" if run["shortened"] else "")
        lines.append(f"| {run['experiment']}/{run['cell']}/seed-{run['seed']} | {planned} | "
                     f"{run['estimate_s'] / 60:.1f} min | {run['state']} | {done} | "
                     f"{('epoch ' + str(last.get('epoch')) + ': ' + shown) if last else ''} | "
                     f"{test} |")
    for note in state.get("not_started", []):
        lines.append(f"\nnot started: {note['group']}: {note['reason']}")
    lines += ["", f"Records: {ARCHIVE} (runs/<experiment>/<cell>/seed-N/: config.yaml, env.json, "
              "metrics.jsonl, result.json, scores/, and the end of each run's log; check/: "
              "gpu-check's record). A run without result.json did not finish in the window: "
              "its metrics.jsonl says how far it got."]
    return "\n".join(lines) + "\n"
