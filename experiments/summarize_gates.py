"""Markdown tables of the -GATES probes (experiments/results/gates/*.json), for
docs/gates-investigation.md.

    .venv/bin/python experiments/summarize_gates.py
"""

from __future__ import annotations

import json
import math
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "gates"
# longer probes (a whole medium epoch, 300 large minibatches), kept apart from the short probes
# of the same name: results/gates-<what>/
LONGER = sorted(p for p in RESULTS.parent.glob("gates-*") if p.is_dir())


def fmt(v: float | None) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if v == math.inf:
        return "inf"
    if v >= 1e5:
        return f"{v:.1e}"
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}"


def probe_rows(size: str) -> list[str]:
    files = [*sorted(RESULTS.glob(f"{size}__*.json")),
             *(f for d in LONGER for f in sorted(d.glob(f"{size}__*.json")))]
    runs = [json.loads(p.read_text()) for p in files if "ep.json" not in p.name]
    runs.sort(key=lambda r: (r["candidate"] != "lstm", r["candidate"], -r["lr"], r["seed"]))
    out = ["| candidate | lr | seed | train ppl at step 50 / 100 / 200 / last | min (step) | "
           "above 10,000 at step | valid ppl | ‖W_hh‖₂ layer 1, end | what it is |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        log = {e["step"]: e for e in r["log"]}
        last = r["log"][-1] if r["log"] else None
        traj = " / ".join(fmt(log[s]["train_ppl_window"]) if s in log else "–" for s in (50, 100, 200))
        traj += f" / {fmt(last['train_ppl_window'])} ({last['step']})" if last else ""
        best = min(r["log"], key=lambda e: e["train_ppl_window"]) if r["log"] else None
        status = r["status"]
        # first logging point whose window perplexity is above the uniform model's (10,000)
        above = [e["step"] for e in r["log"] if e["train_ppl_window"] > r["uniform_ppl"]]
        expl = f"≤ {above[0]}" if above else "no"
        if status.startswith("non-finite"):
            expl = f"≤ {above[0] if above else r['exploded_at']} (non-finite)"
        spec = last.get("layer1_w_h_spectral_norm") if last else None
        out.append(f"| `{r['candidate']}` | {r['lr']:g} | {r['seed']} | {traj} | "
                   f"{fmt(best['train_ppl_window']) if best else '–'} ({best['step'] if best else '–'}) | "
                   f"{expl} | {fmt(r.get('valid_ppl'))} | {fmt(spec) if spec else '–'} | "
                   f"{r['description']} |")
    return out


def epoch_rows() -> list[str]:
    out = ["| run | epoch | lr | train ppl | valid ppl |", "|---|---|---|---|---|"]
    for p in sorted(RESULTS.glob("*ep.json")):
        r = json.loads(p.read_text())
        for e in r["epochs_log"]:
            out.append(f"| {r['size']} `{r['candidate']}` from lr {r['lr']:g} | {e['epoch']} | "
                       f"{e['lr']:g} | {fmt(e['train_ppl'])} | {fmt(e['valid_ppl'])} |")
    return out


def main() -> None:
    for size in ("small", "medium", "large"):
        print(f"\n### {size}\n")
        print("\n".join(probe_rows(size)))
    rows = epoch_rows()
    if len(rows) > 2:
        print("\n### whole epochs\n")
        print("\n".join(rows))


if __name__ == "__main__":
    main()
