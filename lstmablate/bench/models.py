"""The model benchmark: a PTB training step per cell (the TensorFlow tutorial's small,
medium and large sizes), tokens/s against the same model on ``torch.nn.LSTM``.

The model is the ``ptb`` task's own (:func:`ptb_model`: the task plugin's
``language_model``, found through the task registry), so the benchmark times the model the
experiments train, at the benchmark's sizes and dropout 0; only the baseline's encoder is
``torch.nn.LSTM`` in place of a registry cell."""

from __future__ import annotations

import functools
import statistics
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from lstmablate.cells import available_cells, build_encoder, get_cell
from lstmablate.errors import ConfigError
from lstmablate.run.runner import resource_guard
from lstmablate.task import get_task

from .measure import _Candidate, _path, precision_in_effect, torch_threads, _time_rounds
from .options import check_bench_threads, check_cells, check_device, check_repeats

#: the recipe whose task's model the benchmark times (at the tutorial's sizes, below)
MODEL_RECIPE = "ptb-small"


def model_task() -> type:
    """The task class of :data:`MODEL_RECIPE` (its ``task:``)."""
    from lstmablate.recipes import load_recipe

    return get_task(str(load_recipe(MODEL_RECIPE)[1]["task"]))
#: the baseline's name in the rows: the same model with ``torch.nn.LSTM`` as its encoder
BASELINE = "nn.LSTM"


# ---------------------------------------------------------------------------------
# full model: PTB training (the tutorial's small, medium, large sizes)
# ---------------------------------------------------------------------------------

class _TorchLSTMEncoder(nn.Module):
    """``torch.nn.LSTM`` behind the encoder interface the task's model calls
    (``forward(x, lengths, state) -> (outputs, state)``, ``output_size``): the baseline."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 dropout: float = 0.0):
        super().__init__()
        self.rnn = nn.LSTM(input_size, hidden_size, num_layers=num_layers, dropout=dropout,
                           batch_first=True)
        self.output_size = hidden_size

    def forward(self, x: Tensor, lengths: Tensor | None = None, state: Any = None):
        return self.rnn(x, state)


def ptb_model(cell: str, vocab: int, hidden: int, layers: int) -> nn.Module:
    """The ``ptb`` task's language model with ``cell`` (or :data:`BASELINE`) at these sizes:
    dropout 0, every parameter uniform(±0.1) (the tutorial's small configuration)."""
    task = model_task()
    cfg = task.ModelConfig(hidden_size=hidden, num_layers=layers, dropout=0.0, init_scale=0.1)
    cfg.validate()
    make = _TorchLSTMEncoder if cell == BASELINE else functools.partial(build_encoder, cell)
    return task.language_model(make, vocab, cfg)


#: The tutorial's model sizes (hidden, num_steps): what ``bench_models(size=...)`` times.
MODEL_SIZES: dict[str, tuple[int, int]] = {"small": (200, 20), "medium": (650, 35),
                                           "large": (1500, 35)}


def check_model_sizes(sizes: list[str]) -> list[str]:
    """``--model-size`` values: each a name of :data:`MODEL_SIZES`, else a ConfigError."""
    for size in sizes:
        if size not in MODEL_SIZES:
            shown = repr(size) if len(size) <= 40 else f"{size[:40]!r}..."
            raise ConfigError(f"--model-size {shown}: expected one of {', '.join(MODEL_SIZES)}")
    return list(sizes)


def bench_models(cells: list[str] | None = None, threads: int = 2, device: str = "cpu",
                 repeats: int = 20, quick: bool = False, warmup: int = 3, vocab: int = 10_000,
                 hidden: int | None = None, layers: int = 2, batch: int = 20,
                 steps: int | None = None, seed: int = 0, size: str = "small",
                 progress: Callable[[str], None] | None = None) -> list[dict]:
    """PTB training tokens/s per cell (and ``nn.LSTM``), on random token ids.

    One iteration = the tutorial's training step: forward over ``batch x steps`` tokens
    from the carried (detached) state, loss = sum over steps of the batch-mean NLL,
    backward, gradient clipping at norm 5, an SGD update at lr 1.0.  ``size`` picks the
    tutorial's hidden size and num_steps (:data:`MODEL_SIZES`: small 200/20, medium
    650/35, large 1500/35); ``hidden``/``steps`` override it.  Vocab 10000, 2 layers,
    batch 20.  ``cells`` defaults to the LSTM family and the GRU.  Returns one dict
    per cell with ``kind="model"``: shape ("ptb-<size>-model"), cell, kernel, device,
    threads, vocab, hidden, layers, batch, steps, ms, ms_min, tokens_per_s, ratio_lstm,
    repeats, precision.
    """
    check_model_sizes([size])
    check_bench_threads(threads)
    check_repeats(repeats, "--model-repeats")
    hidden = MODEL_SIZES[size][0] if hidden is None else hidden
    steps = MODEL_SIZES[size][1] if steps is None else steps
    dev = check_device(device)
    cells = check_cells(cells) or [c for c in available_cells()
                                   if get_cell(c).family in ("lstm", "gru")]
    if quick:
        repeats, warmup = min(repeats, 5), min(warmup, 1)
    gen = torch.Generator().manual_seed(seed)
    n_batches = 8
    data = torch.randint(0, vocab, (n_batches, batch, steps + 1), generator=gen).to(dev)
    cands, meta = [], {}
    with torch_threads(threads), resource_guard(f"timing the ptb-{size} model on {dev}"):
        torch.manual_seed(seed)
        for cell in [BASELINE, *cells]:
            try:
                model = ptb_model(cell, vocab, hidden, layers).to(dev)
            except ConfigError:
                continue
            model.train()
            opt = torch.optim.SGD(model.parameters(), lr=1.0)
            carry: dict[str, Any] = {"state": None, "i": 0}

            def step(model=model, opt=opt, carry=carry) -> None:
                b = data[carry["i"] % n_batches]
                carry["i"] += 1
                x, y = b[:, :-1], b[:, 1:]
                logits, st = model(x, carry["state"])
                nll = nn.functional.cross_entropy(logits.reshape(-1, vocab), y.reshape(-1),
                                                  reduction="none").view_as(y)
                loss = nll.mean(0).sum()
                opt.zero_grad(set_to_none=True)
                loss.backward()
                nn.utils.clip_grad_norm_(model.parameters(), 5.0)
                opt.step()
                carry["state"] = tuple(s.detach() for s in st) if isinstance(st, tuple) else st.detach()

            cands.append(_Candidate(cell, step, [], []))
            enc = getattr(model, "encoder", None)
            meta[cell] = ("PyTorch" if cell == BASELINE else
                          _path(enc, dev, torch.float32, False, batch) if enc is not None else "?")
        _time_rounds(cands, warmup, repeats, dev, progress=progress, what=f"ptb-{size} model")
    base = statistics.median(cands[0].times)
    rows = []
    for c in cands:
        t = statistics.median(c.times)
        rows.append(dict(kind="model", shape=f"ptb-{size}-model", cell=c.name, kernel=meta[c.name],
                         device=dev.type, threads=threads, vocab=vocab, hidden=hidden,
                         layers=layers, batch=batch, steps=steps, tokens=batch * steps,
                         ms=t * 1e3, ms_min=min(c.times) * 1e3, tokens_per_s=batch * steps / t,
                         ratio_lstm=base / t, repeats=len(c.times),
                         precision=precision_in_effect(dev)))
    return rows
