"""One full measured run of ``lstmablate.bench`` (what docs/performance.md records).

    .venv/bin/python benchmarks/run_bench.py --threads 2 --out benchmarks/results/cpu-2t.json

Prints the rich tables and writes the rows, the machine's matmul rate and the
environment (load average included) as JSON, plus the Markdown tables next to it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from rich.console import Console

from lstmablate import bench


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--cells", default="", help="comma-separated registry names (default: all)")
    ap.add_argument("--shapes", default="", help="comma-separated shape names (default: all)")
    ap.add_argument("--model-repeats", type=int, default=20)
    ap.add_argument("--no-models", action="store_true")
    ap.add_argument("--model-sizes", default="small,medium",
                    help="comma-separated PTB model sizes for the training-step rows")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    console = Console(width=220)
    env = bench.environment(args.threads, args.device)
    env["load_average_before"] = env.pop("load_average", None)
    t0 = time.time()
    peak = bench.machine_gflops(args.threads, args.device, n=2048)
    console.print(f"machine matmul rate (2048^3 sgemm, {args.threads} threads): {peak:.0f} GFLOP/s")
    cells = [c for c in args.cells.split(",") if c] or None
    shapes = [s for s in args.shapes.split(",") if s] or None
    rows = bench.bench_cells(cells, shapes, threads=args.threads, device=args.device,
                             repeats=args.repeats, quick=args.quick, progress=console.print)
    if not args.no_models:
        for size in [z for z in args.model_sizes.split(",") if z]:
            rows += bench.bench_models(threads=args.threads, device=args.device,
                                       repeats=args.model_repeats, quick=args.quick, size=size,
                                       cells=["lstm", "lstm-srnn", "lstm-srnn-out", "lstm-srnn-hidden",
                                              "lstm-srnn-hidden-out", "lstm-gates", "lstm-noforget",
                                              "gru"],
                                       progress=console.print)
    peak_after = bench.machine_gflops(args.threads, args.device, n=2048)
    env["load_average_after"] = os.getloadavg()
    env["dispatch"] = bench.environment(args.threads, args.device)["dispatch"]  # the choices made
    env["seconds"] = round(time.time() - t0, 1)
    env["command"] = " ".join([os.path.basename(sys.executable), *sys.argv])
    console.print(bench.render(rows))
    console.print(f"machine matmul rate after: {peak_after:.0f} GFLOP/s; {env}")
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as fh:
            fh.write(bench.to_json(rows, environment=env, machine_gflops=[peak, peak_after]))
        with open(os.path.splitext(args.out)[0] + ".md", "w") as fh:
            fh.write(bench.to_markdown(rows) + "\n")
        console.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
