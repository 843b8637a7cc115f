"""Are the cells' SST accuracies different? Two tests (lstmablate.results.significance) for the
runs of the sst-cpu table (docs/results/sst.md):

* over seeds: Almost Stochastic Order of each ablation against `lstm` (test accuracy of the
  seeds, Bonferroni-corrected for the four comparisons of an experiment);
* over test sentences: the paired bootstrap (1,000 resamples, sacreBLEU's seed) of test
  accuracy between the ablation and `lstm` trained with the same seed, from each run's
  test predictions (recomputed from its checkpoint, checked against result.json).

    python experiments/sst_significance.py RUNS [EXPERIMENT ...] [--data-dir DIR]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from lstmablate.results.significance import compare_seeds, paired_bootstrap
from lstmablate.run.runner import load_run_model

CELLS = ["lstm", "lstm-srnn", "lstm-srnn-out", "lstm-srnn-hidden", "lstm-gates"]


def accuracy(sums: np.ndarray) -> np.ndarray:
    return 100.0 * sums[..., 0] / sums[..., 1]


def per_sentence(run: Path, data_dir: str | None) -> np.ndarray:
    """(n, 2): [correct, 1] for every test sentence of a run."""
    _, task, model = load_run_model(run, data_dir=data_dir, splits=("test",))
    pred, _ = task.predict(model, "test")
    stats = np.array([[float(p == g), 1.0] for p, g in zip(pred, task.gold("test"))])
    recorded = json.loads((run / "result.json").read_text())["test"]["accuracy"]
    assert abs(float(accuracy(stats.sum(0))) - recorded) < 1e-9, (run, recorded)
    return stats


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", type=Path)
    ap.add_argument("experiments", nargs="*",
                    default=["sst5-bilstm-max-cpu", "sst2-bilstm-max-cpu"])
    ap.add_argument("--data-dir")
    args = ap.parse_args()
    torch.set_num_threads(1)
    for exp in args.experiments:
        stats = {(c, rd.name): per_sentence(rd, args.data_dir)
                 for c in CELLS for rd in sorted((args.runs / exp / c).glob("seed-*"))
                 if (rd / "result.json").exists()}
        scores = {c: [float(accuracy(v.sum(0))) for (cc, _), v in stats.items() if cc == c]
                  for c in CELLS}
        print(f"{exp}: each cell against lstm")
        for c in CELLS[1:]:
            seeds = compare_seeds(scores[c], scores["lstm"], True, num_comparisons=len(CELLS) - 1)
            line = (f"  {c:17s} ASO over seeds: eps_min({c} better) {seeds.eps_a_better:.2f}, "
                    f"eps_min(lstm better) {seeds.eps_b_better:.2f} -> {seeds.verdict()}")
            for (cc, seed), v in stats.items():
                if cc == c and ("lstm", seed) in stats:
                    p = paired_bootstrap(v, stats[("lstm", seed)], accuracy)
                    line += (f"\n    {seed}: {p.a - p.b:+.2f} points, 95% [{p.low:+.2f}, "
                             f"{p.high:+.2f}], p = {p.p_value:.3f}")
            print(line)


if __name__ == "__main__":
    main()
