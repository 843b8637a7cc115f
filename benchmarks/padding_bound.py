"""How close a variable-length batch runs to the speed of its real tokens, at parser-400.

Each cell's encoder (3 x 400, bidirectional, batch 32) forward+backward on lengths uniform in
[10, 50] padded to 50, against the same number of real tokens in full rows (every length the
mean), 2 threads, one warm-up then 5 interleaved rounds, median and best (ms).  A kernel that
skips padding takes about as long on both; one that runs the padding about 1 / (1 - padding)
times as long on the padded batch.  Usage: ``python benchmarks/padding_bound.py CELL...``
(docs/results/speed.md).
"""
from __future__ import annotations

import statistics
import sys
import time

import torch

from lstmablate.cells import build_encoder

B, T, H = 32, 50, 400  # parser-400
ROUNDS = 5


def main(cells: list[str]) -> None:
    torch.set_num_threads(2)
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(10, T + 1, (B,), generator=gen)
    lengths[0] = T
    mean = round(lengths.float().mean().item())
    runs = {}
    for cell in cells:
        torch.manual_seed(0)
        enc = build_encoder(cell, H, H, num_layers=3, bidirectional=True)
        for case, steps, lens in (("padded", T, lengths), ("full-mean", mean, None)):
            x = torch.randn(B, steps, H, requires_grad=True)

            def run(enc=enc, x=x, lens=lens) -> None:
                out, _ = enc(x, lens)
                out.sum().backward()
            runs[cell, case] = run
    times: dict[tuple[str, str], list[float]] = {k: [] for k in runs}
    for r in range(ROUNDS + 1):  # the first round warms up
        for k, run in runs.items():
            t0 = time.perf_counter()
            run()
            if r:
                times[k].append(time.perf_counter() - t0)
    tokens = int(lengths.sum())
    print(f"tokens {tokens} padded to {B * T} ({1 - tokens / (B * T):.0%} padding); "
          f"full-mean: {B} x {mean} = {B * mean}")
    for (cell, case), ts in times.items():
        print(f"{cell:18s} {case:10s} median {statistics.median(ts) * 1e3:8.1f} ms  "
              f"best {min(ts) * 1e3:8.1f} ms")


if __name__ == "__main__":
    main(sys.argv[1:])
