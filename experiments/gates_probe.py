"""Probe: why does LSTM - GATES (the S-RNN) explode at lr 1.0 on PTB?

Levy et al. (ACL 2018, Table 1) report -GATES at 140.9 (medium) / 126.1 (large) with the
TensorFlow PTB tutorial's LSTM hyperparameters, lr 1.0 (the paper, §4.1); our
``lstm-gates`` explodes there.  This script trains candidate readings of "-GATES" and candidate
differences between the tutorial and our pipeline for the first N minibatches of PTB and records,
every ``--log-every`` steps, the training perplexity and whether/when the run explodes.

It is deliberately independent of the project's trainer: its own loop is the tutorial's
``run_epoch`` (``ptb_word_lm.py``) -- state carried across minibatches (truncated BPTT, zeros at
the start), cost = sum over the num_steps time steps of the batch-mean NLL, global-norm clipping
over *all* trainable variables (``tf.clip_by_global_norm``), plain SGD.  The cells are defined
here (TF layout: one kernel over [x_t; h_{t-1}], one bias), except the candidate ``project``,
which builds the registry's ``lstm-gates`` inside the PTB task's own model, as a cross-check.

Explosion: the training perplexity over a logging window is above the uniform model's (the
vocabulary size, 10,000) at any logging point after the first, or the loss is not finite.

Usage (one probe at a time, 1 thread; results are rewritten after every logging point):

    .venv/bin/python experiments/gates_probe.py --size small --candidate eq1 --steps 600
    .venv/bin/python experiments/gates_probe.py --size medium --candidate eq1 --steps 300 --valid
    .venv/bin/python experiments/gates_probe.py --list

Results: ``experiments/results/gates/<size>__<candidate>__lr<lr>__seed<seed>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from lstmablate_tasks.ptb import data as ptb_data

RESULTS = Path(__file__).resolve().parent / "results" / "gates"

# The TF PTB tutorial's configs (tensorflow/models tutorials/rnn/ptb, ``ptb_word_lm.py``).
SIZES = {
    "small": dict(hidden=200, num_steps=20, init_scale=0.1, clip=5.0, keep_prob=1.0),
    "medium": dict(hidden=650, num_steps=35, init_scale=0.05, clip=5.0, keep_prob=0.5),
    "large": dict(hidden=1500, num_steps=35, init_scale=0.04, clip=10.0, keep_prob=0.35),
}
BATCH, LAYERS = 20, 2


# --------------------------------------------------------------------------------------------
# Candidates
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Candidate:
    """One reading of -GATES (``cell``) and one way of training it (the rest)."""

    cell: str                      # see Cell below, or "project" (registry lstm-gates in PTBTask)
    description: str
    activation: str = "tanh"       # eq 1's nonlinearity
    gates: tuple[float, float, float] = (1.0, 1.0, 1.0)  # constant i, f, o for cell "const-gates"
    bias_init: str = "uniform"     # uniform(±init_scale) like every weight | zero (TF RNN cells)
    loss: str = "sum"              # sum over time of batch-mean NLL (tutorial) | mean per token
    dropout: str = "tf"            # tf: embedding + every layer's output (DropoutWrapper);
    #                                cudnn: embedding + between layers only (no top output);
    #                                none: no dropout at all
    clip_norm_of: str = "dense"    # dense: norm of the summed embedding gradient (PyTorch);
    #                                slices: TF's IndexedSlices norm (one row per occurrence)
    clip: float | None = None      # override the size's max_grad_norm
    forget_bias: float = 0.0       # added to the forget-gate pre-activation (cell "lstm")


CANDIDATES: dict[str, Candidate] = {c_name: c for c_name, c in {
    # the reference points
    "lstm": Candidate("lstm", "LSTM, TF BasicLSTMCell (forget_bias 0, one bias)"),
    "eq1": Candidate("srnn", "eq 1 S-RNN, h = tanh(W[x;h] + b): what lstm-gates computes"),
    "project": Candidate("project", "the registry's lstm-gates in the PTB task's own model"),
    # (a) LSTM - GATES read literally from eqs 2-7: i = 1, f = 0, o = 1
    "tanh-tanh": Candidate("srnn", "(a) eqs 2-7 with i=1, f=0, o=1: h = tanh(tanh(W[x;h] + b))",
                           activation="tanh-tanh"),
    # (b) TensorFlow BasicRNNCell details: bias initialised to zero (kernel ±init_scale)
    "eq1-tf-bias0": Candidate("srnn", "(b) eq 1 with TF BasicRNNCell's zero bias init",
                              bias_init="zero"),
    # (c) dropout placement (only matters at medium/large)
    "eq1-cudnn-dropout": Candidate("srnn", "(c) eq 1, dropout as the tutorial's CUDNN path "
                                   "(no dropout on the top layer's output)", dropout="cudnn"),
    "eq1-no-dropout": Candidate("srnn", "(c) eq 1 without any dropout", dropout="none"),
    # (d) the LSTM with constant gates
    "gates-1-1-1": Candidate("const-gates", "(d) i=f=o=1: c = c' + tanh(W[x;h]+b), h = tanh(c)",
                             gates=(1.0, 1.0, 1.0)),
    "gates-half": Candidate("const-gates", "(d) i=f=o=sigma(0)=0.5 (gate weights removed): "
                            "c = .5 c~ + .5 c', h = .5 tanh(c)", gates=(0.5, 0.5, 0.5)),
    "gates-bias": Candidate("bias-gates", "(d) gate computations removed, gate biases kept: "
                            "i,f,o = sigma(b_i), sigma(b_f), sigma(b_o)"),
    # (e) other activations
    "eq1-relu": Candidate("srnn", "(e) eq 1 with ReLU", activation="relu"),
    "eq1-hardtanh": Candidate("srnn", "(e) eq 1 with hard tanh", activation="hardtanh"),
    "eq1-sigmoid": Candidate("srnn", "(e) eq 1 with the logistic sigmoid", activation="sigmoid"),
    # (f) what else the tutorial does
    "eq1-mean-loss": Candidate("srnn", "(f) eq 1, per-token mean loss (lr effectively / num_steps)",
                               loss="mean"),
    "eq1-tf-slices-norm": Candidate("srnn", "(f) eq 1, clip norm computed as TF does for the "
                                    "embedding's IndexedSlices gradient", clip_norm_of="slices"),
    "eq1-tf-exact": Candidate("srnn", "(b+f) eq 1 with every TF detail at once: zero bias init, "
                              "IndexedSlices clip norm", bias_init="zero", clip_norm_of="slices"),
    "lstm-forget1": Candidate("lstm", "LSTM with forget_bias 1 (for reference)", forget_bias=1.0),
}.items()}


# --------------------------------------------------------------------------------------------
# Cells: TF layout, one kernel over [x_t; h_{t-1}] (split here into W_x and W_h for speed)
# --------------------------------------------------------------------------------------------

ACTIVATIONS = {
    "tanh": torch.tanh,
    "tanh-tanh": lambda z: torch.tanh(torch.tanh(z)),
    "relu": torch.relu,
    "hardtanh": nn.functional.hardtanh,
    "sigmoid": torch.sigmoid,
}


class Cell(nn.Module):
    """One recurrent layer; ``forward`` runs a whole window (T, B, I) from ``state``.

    * ``srnn``: h_t = act(W_hx x_t + W_hh h_{t-1} + b)                         (eq 1)
    * ``lstm``: eqs 2-7 (TF BasicLSTMCell: one bias, forget_bias added at run time)
    * ``const-gates``: eqs 2-7 with constant i, f, o: c_t = i c~_t + f c_{t-1}, h_t = o tanh(c_t),
      c~_t = tanh(W_cx x_t + W_ch h_{t-1} + b_c)
    * ``bias-gates``: as const-gates with i, f, o = sigma(b_i), sigma(b_f), sigma(b_o) (learned,
      input- and state-independent)
    """

    def __init__(self, kind: str, input_size: int, hidden: int, cand: Candidate):
        super().__init__()
        self.kind, self.hidden, self.cand = kind, hidden, cand
        blocks = 4 if kind == "lstm" else 1
        self.w_x = nn.Parameter(torch.empty(blocks * hidden, input_size))
        self.w_h = nn.Parameter(torch.empty(blocks * hidden, hidden))
        self.b = nn.Parameter(torch.empty(blocks * hidden))
        self.gate_b = nn.Parameter(torch.empty(3 * hidden)) if kind == "bias-gates" else None
        self.act = ACTIVATIONS[cand.activation]

    @property
    def has_memory(self) -> bool:
        return self.kind != "srnn"

    def init(self, scale: float) -> None:
        for p in self.parameters():
            nn.init.uniform_(p, -scale, scale)
        if self.cand.bias_init == "zero":
            nn.init.zeros_(self.b)

    def forward(self, x: Tensor, state: tuple[Tensor, ...]) -> tuple[Tensor, tuple[Tensor, ...]]:
        xp = torch.addmm(self.b, x.reshape(-1, x.shape[-1]), self.w_x.t()).view(
            x.shape[0], x.shape[1], -1)
        h = state[0]
        c = state[1] if self.has_memory else None
        H = self.hidden
        outs = []
        for t in range(x.shape[0]):
            z = xp[t] + h @ self.w_h.t()
            if self.kind == "srnn":
                h = self.act(z)  # eq 1
            elif self.kind == "lstm":
                i, g, f, o = z.split(H, dim=-1)  # TF order i, j, f, o
                c = torch.sigmoid(f + self.cand.forget_bias) * c + torch.sigmoid(i) * torch.tanh(g)
                h = torch.sigmoid(o) * torch.tanh(c)
            else:
                if self.kind == "const-gates":
                    gi, gf, go = self.cand.gates
                else:
                    gi, gf, go = torch.sigmoid(self.gate_b).split(H)
                c = gi * torch.tanh(z) + gf * c
                h = go * torch.tanh(c)
            outs.append(h)
        new_state = (h, c) if self.has_memory else (h,)
        return torch.stack(outs), new_state


class LM(nn.Module):
    """The tutorial's model: embedding -> dropout -> L cells (output dropout) -> softmax."""

    def __init__(self, vocab: int, hidden: int, cand: Candidate, keep_prob: float):
        super().__init__()
        self.embedding = nn.Embedding(vocab, hidden)
        self.cells = nn.ModuleList(Cell(cand.cell, hidden, hidden, cand) for _ in range(LAYERS))
        self.softmax = nn.Linear(hidden, vocab)
        self.p = 0.0 if cand.dropout == "none" else 1.0 - keep_prob
        self.cand = cand

    def init(self, scale: float) -> None:
        for p in self.parameters():  # the tutorial's variable-scope initializer
            nn.init.uniform_(p, -scale, scale)
        for cell in self.cells:
            cell.init(scale)

    def zero_state(self, batch: int) -> list[tuple[Tensor, ...]]:
        z = torch.zeros(batch, self.cells[0].hidden)
        return [(z, z) if cell.has_memory else (z,) for cell in self.cells]

    def forward(self, x: Tensor, states: list[tuple[Tensor, ...]]):
        emb = self.embedding(x.t())  # (T, B, H)
        self.emb_out = emb           # for the IndexedSlices norm (its gradient = the slices)
        out = nn.functional.dropout(emb, self.p, self.training)
        finals = []
        for k, (cell, st) in enumerate(zip(self.cells, states)):
            out, fin = cell(out, st)
            finals.append(fin)
            top = k == len(self.cells) - 1
            if not (top and self.cand.dropout == "cudnn"):
                out = nn.functional.dropout(out, self.p, self.training)  # DropoutWrapper
        return self.softmax(out).transpose(0, 1), finals  # (B, T, V)


class ProjectLM(nn.Module):
    """The PTB task's own model with the registry's ``lstm-gates`` (cross-check)."""

    def __init__(self, vocab: int, hidden: int, keep_prob: float):
        super().__init__()
        from lstmablate.cells import build_encoder
        from lstmablate_tasks.ptb.model import PTBLanguageModel

        enc = build_encoder("lstm-gates", input_size=hidden, hidden_size=hidden,
                            num_layers=LAYERS, dropout=1.0 - keep_prob)
        self.model = PTBLanguageModel(vocab, hidden, enc, 1.0 - keep_prob)
        self.embedding = self.model.embedding

    def init(self, scale: float) -> None:
        self.model.init_weights(scale)

    def zero_state(self, batch: int):
        return None

    def forward(self, x: Tensor, states):
        emb_hook = {}

        def keep(module, inp, out):
            emb_hook["out"] = out
        handle = self.model.embedding.register_forward_hook(keep)
        try:
            logits, final = self.model(x, states)
        finally:
            handle.remove()
        self.emb_out = emb_hook["out"]
        return logits, final


# --------------------------------------------------------------------------------------------
# The tutorial's training loop
# --------------------------------------------------------------------------------------------

def detach(states):
    if states is None:
        return None
    if isinstance(states, tuple) and all(isinstance(s, Tensor) for s in states):
        return tuple(s.detach() for s in states)
    return [tuple(s.detach() for s in st) for st in states]


def global_norm(model: nn.Module, how: str) -> Tensor:
    """What ``tf.clip_by_global_norm`` computes (``slices``) or the dense gradient's norm."""
    sq = []
    for _name, p in model.named_parameters():
        if p.grad is None:
            continue
        if how == "slices" and p is model.embedding.weight:
            continue
        sq.append(p.grad.pow(2).sum())
    if how == "slices":
        # TF: the embedding gradient is IndexedSlices whose values are the gradients w.r.t. the
        # looked-up rows, one per token occurrence; its norm is taken over those values.
        sq.append(model._emb_out_grad.pow(2).sum())
    return torch.stack(sq).sum().sqrt()


@torch.no_grad()
def valid_perplexity(model: nn.Module, stream: Tensor, num_steps: int) -> float:
    """The tutorial's validation: batch 20 x num_steps windows, state carried from zeros."""
    model.eval()
    states = model.zero_state(BATCH)
    total, n = 0.0, 0
    for x, y in ptb_data.stream_batches(stream, BATCH, num_steps):
        logits, states = model(x, states)
        total += nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                                             reduction="sum").item()
        n += y.numel()
    model.train()
    return ptb_data.perplexity(total / n)


@dataclass
class Schedule:
    """``epochs`` 1: the first ``steps`` minibatches of epoch 1 (a probe).  More epochs: the
    tutorial's whole schedule, lr * decay ** max(epoch - decay_start, 0) (1-based epochs),
    validation after every epoch, a checkpoint after every epoch (``--resume``)."""

    steps: int = 600
    epochs: int = 1
    decay_start: int = 4
    decay: float = 0.5


def run(size: str, name: str, cand: Candidate, lr: float, sched: Schedule, seed: int,
        log_every: int, valid: bool, data_dir: str | None, out: Path, ckpt_dir: Path | None = None,
        resume: bool = False) -> dict:
    cfg = dict(SIZES[size])
    if cand.clip is not None:
        cfg["clip"] = cand.clip
    torch.manual_seed(seed)
    corpus = ptb_data.load_corpus(data_dir, splits=("train", "valid"))
    V = corpus.vocab_size
    if cand.cell == "project":
        model: nn.Module = ProjectLM(V, cfg["hidden"], cfg["keep_prob"])
    else:
        model = LM(V, cfg["hidden"], cand, cfg["keep_prob"])
    model.init(cfg["init_scale"])
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    plan = ptb_data.StreamPlan(corpus.train, BATCH, cfg["num_steps"])
    steps = min(sched.steps, len(plan)) if sched.epochs == 1 else len(plan)
    tag = f"{size}__{name}__lr{lr:g}__seed{seed}" + (f"__{sched.epochs}ep" if sched.epochs > 1 else "")
    path = out / f"{tag}.json"
    ckpt = (ckpt_dir / f"{tag}.pt") if ckpt_dir else None
    record = {
        "size": size, "candidate": name, "description": cand.description,
        "candidate_spec": asdict(cand), "config": cfg, "lr": lr, "seed": seed,
        "schedule": asdict(sched), "batch_size": BATCH, "steps_per_epoch_run": steps,
        "epoch_batches": len(plan), "threads": torch.get_num_threads(), "torch": torch.__version__,
        "log": [], "epochs_log": [], "exploded_at": None, "status": "running",
        "uniform_ppl": float(V), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    first_epoch = 1
    if resume and ckpt is not None and ckpt.exists():
        saved = torch.load(ckpt, weights_only=True)  # plain data only: loading runs no code
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        torch.set_rng_state(saved["rng"])
        record = saved["record"]
        first_epoch = saved["epoch"] + 1
        print(f"resumed {tag} after epoch {saved['epoch']}", flush=True)
    out.mkdir(parents=True, exist_ok=True)

    def save():
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record, indent=1))
        os.replace(tmp, path)

    t0 = time.time() - record.get("wall_s", 0.0)
    gstep = (first_epoch - 1) * steps
    for epoch in range(first_epoch, sched.epochs + 1):
        ep_lr = lr * sched.decay ** max(epoch - sched.decay_start, 0)
        for group in opt.param_groups:
            group["lr"] = ep_lr
        states = model.zero_state(BATCH)  # the tutorial resets the state every epoch
        win_nll, win_tok, win_norms, win_clipped = 0.0, 0, [], 0
        ep_nll, ep_tok = 0.0, 0
        for step in range(1, steps + 1):
            gstep += 1
            x, y = plan[step - 1]
            logits, states = model(x, states)
            states = detach(states)
            nll = nn.functional.cross_entropy(logits.reshape(-1, V), y.reshape(-1),
                                              reduction="none").view_as(y)
            cost = nll.mean(dim=0).sum() if cand.loss == "sum" else nll.mean()
            opt.zero_grad(set_to_none=True)
            emb_out = model.emb_out
            if cand.clip_norm_of == "slices":
                emb_out.retain_grad()
            cost.backward()
            if cand.clip_norm_of == "slices":
                model._emb_out_grad = emb_out.grad
            norm = global_norm(model, cand.clip_norm_of)
            if not torch.isfinite(cost) or not torch.isfinite(norm):
                record["exploded_at"] = record["exploded_at"] or gstep
                record["status"] = f"non-finite loss or gradient at step {gstep}"
                break
            scale = min(1.0, cfg["clip"] / (norm.item() + 1e-6))  # tf.clip_by_global_norm
            if scale < 1.0:
                win_clipped += 1
                for p in model.parameters():
                    if p.grad is not None:
                        p.grad.mul_(scale)
            opt.step()
            s = nll.detach().sum().item()
            win_nll += s
            win_tok += y.numel()
            ep_nll += s
            ep_tok += y.numel()
            win_norms.append(norm.item())
            if step % log_every == 0 or step == steps:
                wppl = ptb_data.perplexity(win_nll / win_tok)
                entry = {"epoch": epoch, "step": gstep, "lr": ep_lr, "train_ppl_window": wppl,
                         "train_ppl_epoch_so_far": ptb_data.perplexity(ep_nll / ep_tok),
                         "grad_norm_mean": sum(win_norms) / len(win_norms),
                         "grad_norm_max": max(win_norms),
                         "clipped_share": win_clipped / len(win_norms),
                         "elapsed_s": round(time.time() - t0, 1)}
                if isinstance(model, LM):
                    w = model.cells[0].w_h.detach()[:cfg["hidden"]]
                    entry["layer1_w_h_spectral_norm"] = torch.linalg.matrix_norm(w, ord=2).item()
                    h = states[0][0]
                    entry["layer1_h_saturated_share"] = (h.abs() > 0.99).float().mean().item()
                record["log"].append(entry)
                print(f"[{tag}] ep {epoch} step {gstep}: train ppl {wppl:.1f} "
                      f"(epoch {entry['train_ppl_epoch_so_far']:.1f}), "
                      f"|g| {entry['grad_norm_mean']:.2f}, {entry['elapsed_s']:.0f}s", flush=True)
                if gstep > log_every and wppl > V and record["exploded_at"] is None:
                    record["exploded_at"] = gstep
                win_nll, win_tok, win_norms, win_clipped = 0.0, 0, [], 0
                record["wall_s"] = round(time.time() - t0, 1)
                save()
        if record["status"] != "running":
            break
        if sched.epochs > 1 or valid:
            vppl = valid_perplexity(model, corpus.valid, cfg["num_steps"])
            record["epochs_log"].append({"epoch": epoch, "lr": ep_lr, "steps": steps,
                                         "train_ppl": ptb_data.perplexity(ep_nll / ep_tok),
                                         "valid_ppl": vppl})
            print(f"[{tag}] epoch {epoch}: train ppl {ptb_data.perplexity(ep_nll / ep_tok):.1f}, "
                  f"valid ppl {vppl:.1f}", flush=True)
        record["wall_s"] = round(time.time() - t0, 1)
        save()
        if ckpt is not None:
            ckpt.parent.mkdir(parents=True, exist_ok=True)
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                        "rng": torch.get_rng_state(), "record": record, "epoch": epoch},
                       ckpt.with_suffix(".tmp"))
            os.replace(ckpt.with_suffix(".tmp"), ckpt)
    if record["status"] == "running":
        record["status"] = "done"
    record["steps_run"] = gstep
    ppls = [e["train_ppl_window"] for e in record["log"]]
    if ppls:
        record["min_train_ppl_window"] = min(ppls)
        record["final_train_ppl_window"] = ppls[-1]
    record["exploded"] = record["exploded_at"] is not None
    if record["epochs_log"]:
        record["valid_ppl"] = record["epochs_log"][-1]["valid_ppl"]
    record["wall_s"] = round(time.time() - t0, 1)
    save()
    return record


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="small")
    ap.add_argument("--candidate", action="append", default=[],
                    help="candidate name (repeatable); see --list")
    ap.add_argument("--lr", type=float, action="append", default=[], help="repeatable; default 1.0")
    ap.add_argument("--steps", type=int, default=600, help="minibatches (capped at one epoch)")
    ap.add_argument("--epochs", type=int, default=1,
                    help="> 1: the whole schedule (full epochs, decay, valid every epoch)")
    ap.add_argument("--decay-start", type=int, default=None,
                    help="epochs at full lr (tutorial max_epoch: small 4, medium 6)")
    ap.add_argument("--decay", type=float, default=None, help="small 0.5, medium 0.8")
    ap.add_argument("--ckpt-dir", type=Path, default=None, help="checkpoint after every epoch")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--valid", action="store_true", help="valid perplexity at the end")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--data-dir", default=os.environ.get("LSTMABLATE_DATA"))
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--skip-done", action="store_true", help="skip runs whose JSON says done")
    ap.add_argument("--list", action="store_true")
    a = ap.parse_args(argv)
    if a.list:
        for n, c in CANDIDATES.items():
            print(f"{n:22s} {c.description}")
        return 0
    unknown = [c for c in a.candidate if c not in CANDIDATES]
    if unknown or not a.candidate:
        print(f"unknown or no --candidate {unknown}; choose from {', '.join(CANDIDATES)}",
              file=sys.stderr)
        return 2
    torch.set_num_threads(a.threads)
    decay_start, decay = {"small": (4, 0.5), "medium": (6, 0.8), "large": (14, 1 / 1.15)}[a.size]
    sched = Schedule(steps=a.steps, epochs=a.epochs,
                     decay_start=a.decay_start if a.decay_start is not None else decay_start,
                     decay=a.decay if a.decay is not None else decay)
    for name in a.candidate:
        for lr in a.lr or [1.0]:
            tag = f"{a.size}__{name}__lr{lr:g}__seed{a.seed}"
            path = a.out / (tag + (f"__{a.epochs}ep" if a.epochs > 1 else "") + ".json")
            if a.skip_done and path.exists() and json.loads(path.read_text()).get("status") != "running":
                print(f"skip {path.name}")
                continue
            run(a.size, name, CANDIDATES[name], lr, sched, a.seed, a.log_every, a.valid,
                a.data_dir, a.out, a.ckpt_dir, a.resume)
    return 0


if __name__ == "__main__":
    sys.exit(main())
