"""The host's work around a cuDNN call of ``lstm`` / ``lstm-gates``, measured on a CPU.

On CUDA a stacked ``lstm`` (``lstm-gates``) encoder is one call of the same fused kernel
``torch.nn.LSTM`` (``nn.RNN``) calls (``cells/kernels/common/delegate.py``), so the time
it takes beyond its baseline is work outside the kernel: deciding the path, the cells'
parameters handed to the kernel in PyTorch's layout (kept between calls), and the
gradients mapped back onto our own parameters.  That work is Python and dispatcher calls,
the same on any device; here it is timed with PyTorch's CPU kernels at a tiny size (hidden
8, batch 4, 5 steps, 2 layers), where the kernel itself is short.  Each row: the best of
``--rounds`` rounds of ``--calls`` calls, microseconds per forward+backward (the plan row:
per decision).

    python benchmarks/host_overhead.py [--rounds 7] [--calls 400] [--threads 1]

Rows, per cell and baseline:
  module     ``nn.LSTM`` / ``nn.RNN`` (the module around ``torch._VF.lstm`` / ``rnn_tanh``)
  bare call  ``torch._VF`` with leaf weights (the kernel and autograd, nothing around them)
  ours       ``delegate.stacked``: the whole encoder as CUDA runs it, on CPU kernels
  plan       the decision the encoder makes before it (``stack_plan`` for a CUDA call,
             and the cells' views)
"""

from __future__ import annotations

import argparse
import time

import torch

from lstmablate.cells import build_encoder
from lstmablate.cells.kernels.common import delegate
from lstmablate.cells.kernels.interface import family_of

H, B, T, LAYERS = 8, 4, 5, 2
BASELINES = {"lstm": ("lstm", torch.nn.LSTM), "lstm-gates": ("rnn", torch.nn.RNN)}


def best_us(fn, rounds: int, calls: int) -> float:
    for _ in range(max(1, calls // 4)):  # warm-up
        fn()
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return best * 1e6


def rows_for(cell: str, rounds: int, calls: int) -> list[tuple[str, float]]:
    kind, module = BASELINES[cell]
    torch.manual_seed(0)
    enc = build_encoder(cell, H, H, num_layers=LAYERS)
    ref = module(H, H, num_layers=LAYERS)
    family = family_of(enc.layers[0][0])
    x = torch.randn(T, B, H, requires_grad=True)
    leaf = [w.detach().clone().requires_grad_() for w in ref._flat_weights]
    zeros = x.new_zeros(LAYERS, B, H)
    hx = (zeros, zeros) if kind == "lstm" else zeros
    vf = getattr(torch._VF, "lstm" if kind == "lstm" else "rnn_tanh")

    def module_call():
        ref(x)[0].sum().backward()

    def bare_call():
        vf(x, hx, leaf, True, LAYERS, 0.0, True, False, False)[0].sum().backward()

    def ours():
        delegate.stacked(family, kind, enc, x, None, None)[0].sum().backward()

    def plan():
        family.stack_plan(enc, None, device_type="cuda", dtype=x.dtype, mask="none",
                          autocast=False, batch=B)
        [family.view(c) for c in enc.cells()]

    return [(f"nn.{module.__name__} module", best_us(module_call, rounds, calls)),
            ("bare call", best_us(bare_call, rounds, calls)),
            (f"ours ({cell})", best_us(ours, rounds, calls)),
            ("plan", best_us(plan, rounds, calls))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s), hidden {H}, batch {B}, "
          f"{T} steps, {LAYERS} layers; microseconds per forward+backward (plan: per call)")
    print("| cell | row | us |\n|---|---|---|")
    for cell in BASELINES:
        rows = dict(rows_for(cell, args.rounds, args.calls))
        for name, us in rows.items():
            print(f"| {cell} | {name} | {us:.0f} |")
        bare = rows["bare call"]
        print(f"| {cell} | ours - bare call (the weights in PyTorch's layout, the gradients "
              f"mapped back) | {rows[f'ours ({cell})'] - bare:.0f} |")


if __name__ == "__main__":
    main()
