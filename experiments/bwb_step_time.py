"""Time one training step of the Billion Word LSTM-2048-512 at its real size.

The model of tasks/bwb at the recipe's values (vocabulary 793,470, embedding 512, one LSTM layer
of 2048 units projected to 512, dropout 0.1, sampled softmax with 8,192 candidates), on a
synthetic batch of 128 x 20 word ids drawn from the log-uniform distribution (no data needed),
with Adagrad (lr 0.2, initial accumulator 1.0) — forward, backward and update, timed per step.
Parameters, Adagrad state and dense gradients of the two 793,470 x 512 matrices take about 10 GB
(``--sparse``: sparse gradients for those two matrices, about 7 GB).

    .venv/bin/python experiments/bwb_step_time.py --threads 1 --steps 3 [--cell lstm] [--eval] [--sparse]

Writes experiments/results/bwb_step_time.json (one entry per cell and thread count).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import torch

from lstmablate.cells import build_encoder
from lstmablate_tasks.bwb.model import BWBLanguageModel
from lstmablate_tasks.bwb.sampled_softmax import LogUniformSampler

OUT = Path(__file__).resolve().parent / "results" / "bwb_step_time.json"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cell", default="lstm")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--num-steps", type=int, default=20)
    ap.add_argument("--vocab", type=int, default=793_470)
    ap.add_argument("--eval", action="store_true", help="also time one full-softmax eval window")
    ap.add_argument("--sparse", action="store_true", help="sparse embedding/softmax gradients")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    opts = {"proj_size": 512}
    if a.cell != "lstm-gates":
        opts["forget_bias"] = 1.0
    enc = build_encoder(a.cell, 512, 2048, num_layers=1, dropout=0.1, **opts)
    model = BWBLanguageModel(a.vocab, 512, enc, 0.1, 8192, emb_grad_scale=128.0,
                             sparse_grads=a.sparse)
    model.init_weights()
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.Adagrad(model.parameters(), lr=0.2, initial_accumulator_value=1.0)
    ids = LogUniformSampler(a.vocab, 1, unique=False).draw(a.batch * (a.num_steps + 1))
    rows = ids.view(a.batch, a.num_steps + 1)
    x, y = rows[:, :-1].contiguous(), rows[:, 1:].contiguous()
    times, state = [], None
    for _ in range(a.steps):
        t0 = time.perf_counter()
        nll, state = model(x, y, state)
        loss = nll.mean() * a.num_steps
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        state = tuple(s.detach() for s in state)
        times.append(time.perf_counter() - t0)
        print(f"step {len(times)}: {times[-1]:.2f} s (loss {loss.item():.2f})", flush=True)
    entry = {"cell": a.cell, "threads": a.threads, "sparse_grads": a.sparse, "batch": a.batch,
             "num_steps": a.num_steps, "vocab": a.vocab, "params": n_params, "step_s": times,
             "steady_step_s": min(times[1:]) if len(times) > 1 else times[0],
             "tokens_per_s": a.batch * a.num_steps / (min(times[1:]) if len(times) > 1 else times[0]),
             "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores "
                        "(shared with other agents)",
             "torch": torch.__version__, "when": time.strftime("%Y-%m-%d %H:%M:%S")}
    if a.eval:
        model.eval()
        with torch.no_grad():
            t0 = time.perf_counter()
            model(x, y, None, chunk=256)
            entry["eval_window_s"] = time.perf_counter() - t0
        print(f"eval window (full softmax, {a.batch} x {a.num_steps}): {entry['eval_window_s']:.2f} s")
    results = json.loads(OUT.read_text()) if OUT.exists() else []
    key = (a.cell, a.threads, a.sparse)
    results = [r for r in results
               if (r["cell"], r["threads"], r.get("sparse_grads", False)) != key] + [entry]
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(results, indent=1))
    print(json.dumps(entry, indent=1))


if __name__ == "__main__":
    main()
