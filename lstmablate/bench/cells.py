"""The cell benchmark: forward+backward tokens/s of each cell's encoder against
``torch.nn.LSTM`` / ``torch.nn.RNN`` of the same size, at the PTB shapes and a parser-like
bidirectional shape, with memory, achieved GFLOP/s and each row's target ratio."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from lstmablate.cells import available_cells, build_encoder, reference_mode
from lstmablate.errors import ConfigError

from .measure import (_Candidate, _memory_mb, _path, torch_threads, _time_rounds,
                      matrix_entries)


# ---------------------------------------------------------------------------------
# shapes and targets
# ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    name: str
    batch: int
    steps: int
    hidden: int
    layers: int
    bidirectional: bool = False
    input: int = 0  # 0: = hidden
    min_length: int = 0  # > 0: lengths drawn uniformly from [min_length, steps] (seeded)

    @property
    def input_size(self) -> int:
        return self.input or self.hidden


SHAPES: dict[str, Shape] = {
    "ptb-200": Shape("ptb-200", batch=20, steps=35, hidden=200, layers=2),
    "ptb-650": Shape("ptb-650", batch=20, steps=35, hidden=650, layers=2),
    "parser-400": Shape("parser-400", batch=32, steps=50, hidden=400, layers=3, bidirectional=True,
                        min_length=10),
}
DEFAULT_SHAPES = ["ptb-200", "ptb-650", "parser-400"]

#: the issue's targets (CPU, 2 threads, the PTB shapes): cell -> (baseline, minimum ratio of
#: tokens/s); every other cell: at least OTHER_TARGET x its own reference step loop.
TARGETS: dict[str, tuple[str, float]] = {
    "lstm": ("nn.LSTM", 0.95),
    "lstm-srnn": ("nn.LSTM", 1.05),
    "lstm-srnn-out": ("nn.LSTM", 1.4),
    "lstm-srnn-hidden": ("nn.LSTM", 0.9 * 2.0),  # 0.9 x its bound (4 weight blocks vs 8)
    "lstm-gates": ("nn.RNN", 0.9),
}
OTHER_TARGET = 2.0
TARGET_SHAPES = ("ptb-200", "ptb-650")

#: the GPU targets (ratios of tokens/s against cuDNN in the same process): cell -> (baseline,
#: {shape: minimum}).  gru, mlstm and mmlstm: twice the ratios measured on an NVIDIA H100
#: with the code before the GPU kernels (0.25/0.29/0.25, 0.26/0.26/0.24, 0.16/0.17/0.15 at
#: ptb-200/ptb-650/parser-400).  The targets across rows (parser-400 against ptb-650,
#: memory, the training step, the trainer): ``lstmablate.bench.gpu_check``.
_EVERY = dict.fromkeys(DEFAULT_SHAPES, 0.97)
GPU_TARGETS: dict[str, tuple[str, dict[str, float]]] = {
    "lstm": ("nn.LSTM", _EVERY),
    "lstm-gates": ("nn.RNN", _EVERY),
    "lstm-srnn": ("nn.LSTM", {"ptb-200": 1.0, "ptb-650": 1.0}),
    "lstm-srnn-out": ("nn.LSTM", {"ptb-200": 1.2, "ptb-650": 1.2}),
    "lstm-srnn-hidden": ("nn.LSTM", {"ptb-200": 1.5, "ptb-650": 1.5}),
    "gru": ("nn.LSTM", {"ptb-200": 0.50, "ptb-650": 0.58, "parser-400": 0.50}),
    "mlstm": ("nn.LSTM", {"ptb-200": 0.52, "ptb-650": 0.52, "parser-400": 0.48}),
    "mmlstm": ("nn.LSTM", {"ptb-200": 0.32, "ptb-650": 0.34, "parser-400": 0.30}),
}


def parse_shape(spec: str) -> Shape:
    """A named shape, or ``BxTxHxL[xbi]`` (commas work too), e.g. ``20x35x650x2`` / ``32x50x400x3xbi``."""
    if spec in SHAPES:
        return SHAPES[spec]
    parts = spec.replace(",", "x").split("x")
    try:
        b, t, h, layers = (int(p) for p in parts[:4])
    except ValueError:
        raise ConfigError(f"unknown shape {spec!r}: use one of {', '.join(SHAPES)} or "
                          "'BxTxHxL[xbi]' (batch x steps x hidden x layers)") from None
    bi = len(parts) > 4 and parts[4].strip().lower() in ("bi", "bidirectional", "1", "true")
    return Shape(spec, batch=b, steps=t, hidden=h, layers=layers, bidirectional=bi)


class _TorchEncoder(nn.Module):
    """torch.nn.LSTM / RNN with our encoder's call signature (lengths -> packed sequence)."""

    def __init__(self, kind: str, shape: Shape):
        super().__init__()
        cls = {"nn.LSTM": nn.LSTM, "nn.RNN": nn.RNN, "nn.GRU": nn.GRU}[kind]
        self.rnn = cls(shape.input_size, shape.hidden, num_layers=shape.layers,
                       bidirectional=shape.bidirectional, batch_first=True)

    def forward(self, x: Tensor, lengths: Tensor | None = None, state: Any = None):
        if lengths is None:
            return self.rnn(x, state)
        from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

        packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, st = self.rnn(packed, state)
        return pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])[0], st


def _encoder_step(enc: nn.Module, x: Tensor, lengths: Tensor | None, grad: Tensor,
                  reference: bool = False) -> Callable[[], None]:
    def step() -> None:
        with reference_mode(True if reference else None):
            out, _ = enc(x, lengths)
        out.backward(grad)
    return step


def _build_cell_encoder(cell: str, shape: Shape) -> nn.Module | None:
    try:
        return build_encoder(cell, shape.input_size, shape.hidden, num_layers=shape.layers,
                             bidirectional=shape.bidirectional)
    except ConfigError:
        return None  # e.g. dyck-rnn reads 1-d inputs only


def bench_cells(cells: list[str] | None = None, shapes: list[str] | None = None, threads: int = 2,
                device: str = "cpu", repeats: int = 7, quick: bool = False, warmup: int = 2,
                reference: bool | None = None, seed: int = 0,
                progress: Callable[[str], None] | None = None) -> list[dict]:
    """Forward+backward tokens/s of each cell against torch.nn.LSTM / nn.RNN, per shape.

    ``cells``: registry names (default: every registered cell); ``shapes``: names of
    :data:`SHAPES` or ``"BxTxHxL[xbi]"`` (default: :data:`DEFAULT_SHAPES`);
    ``quick``: 3 repeats, 1 warm-up, and only the first two default shapes unless
    shapes are given; ``reference``: also time each cell's reference step loop (default:
    only for the cells without a ratio target in :data:`TARGETS`).

    Returns one dict per (shape, candidate) with ``kind="cell"``; the baselines have
    ``cell`` = ``"nn.LSTM"`` / ``"nn.RNN"``.  Keys: shape, cell, kernel, device,
    threads, batch, steps, hidden, layers, bidirectional, tokens (per iteration),
    ms (median), ms_min, tokens_per_s, ratio_lstm, ratio_rnn, target, target_baseline,
    target_ratio (the measured ratio the target is about), target_met (None where
    no target applies), gflops, flops_per_token, memory_mb, memory_kind,
    reference_ms, speedup_vs_reference, repeats.
    """
    dev = torch.device(device)
    cells = list(cells) if cells else available_cells()
    if quick:
        repeats, warmup = min(repeats, 3), min(warmup, 1)
        shape_list = [parse_shape(s) for s in (shapes or DEFAULT_SHAPES[:2])]
    else:
        shape_list = [parse_shape(s) for s in (shapes or DEFAULT_SHAPES)]
    rows: list[dict] = []
    with torch_threads(threads):
        for shape in shape_list:
            rows.extend(_bench_shape(cells, shape, dev, threads, repeats, warmup, reference, seed,
                                     progress))
    return rows


def _bench_shape(cells, shape: Shape, dev, threads, repeats, warmup, reference, seed, progress):
    gen = torch.Generator().manual_seed(seed)
    B, T = shape.batch, shape.steps
    x = torch.randn(B, T, shape.input_size, generator=gen).to(dev).requires_grad_(True)
    lengths = None
    if shape.min_length:
        lengths = torch.randint(shape.min_length, T + 1, (B,), generator=gen)
        lengths[0] = T
    tokens = int(lengths.sum()) if lengths is not None else B * T
    D = 2 if shape.bidirectional else 1
    grad = torch.randn(B, T, shape.hidden * D, generator=gen).to(dev)
    if lengths is not None:
        grad = grad * (torch.arange(T)[None, :] < lengths[:, None]).to(dev).unsqueeze(-1)
    lengths_dev = lengths.to(dev) if lengths is not None else None

    cands: list[_Candidate] = []
    meta: dict[str, dict] = {}
    torch.manual_seed(seed)
    for base in ("nn.LSTM", "nn.RNN"):
        mod = _TorchEncoder(base, shape).to(dev)
        cands.append(_Candidate(base, _encoder_step(mod, x, lengths_dev, grad),
                                list(mod.parameters()) + [x], []))
        meta[base] = dict(module=mod, kernel="cuDNN" if dev.type == "cuda" else "PyTorch",
                          ref=None)
    for cell in cells:
        enc = _build_cell_encoder(cell, shape)
        if enc is None:
            if progress:
                progress(f"{shape.name}: {cell} cannot run at this shape, skipped")
            continue
        enc = enc.to(dev)
        want_ref = reference if reference is not None else cell not in TARGETS
        cands.append(_Candidate(cell, _encoder_step(enc, x, lengths_dev, grad),
                                list(enc.parameters()) + [x], []))
        meta[cell] = dict(module=enc, kernel=_path(enc, dev, x.dtype, lengths is not None, B),
                          ref=None)
        if want_ref:
            name = cell + " [reference]"
            cands.append(_Candidate(name, _encoder_step(enc, x, lengths_dev, grad, reference=True),
                                    list(enc.parameters()) + [x], []))
            meta[cell]["ref"] = name
    if progress:
        progress(f"{shape.name}: timing {len(cands)} candidates x {repeats} rounds")
    _time_rounds(cands, warmup, repeats, dev)
    med = {c.name: statistics.median(c.times) for c in cands}
    mins = {c.name: min(c.times) for c in cands}
    nrep = {c.name: len(c.times) for c in cands}
    rows = []
    for c in cands:
        if c.name.endswith(" [reference]"):
            continue
        m = meta[c.name]
        t = med[c.name]
        # every matrix of every layer and direction is used once per token
        flops_tok = 6 * matrix_entries(m["module"])
        gflops = flops_tok * tokens / t / 1e9
        ref_ms = med[m["ref"]] * 1e3 if m["ref"] else None
        row = dict(kind="cell", shape=shape.name, cell=c.name, kernel=m["kernel"], device=dev.type,
                   threads=threads, batch=B, steps=T, hidden=shape.hidden, layers=shape.layers,
                   bidirectional=shape.bidirectional, tokens=tokens, ms=t * 1e3,
                   ms_min=mins[c.name] * 1e3, tokens_per_s=tokens / t,
                   ratio_lstm=med["nn.LSTM"] / t, ratio_rnn=med["nn.RNN"] / t,
                   flops_per_token=flops_tok, gflops=gflops,
                   memory_mb=_memory_mb(c.step, dev),
                   memory_kind="peak" if dev.type == "cuda" else "saved",
                   reference_ms=ref_ms, speedup_vs_reference=(ref_ms / (t * 1e3)) if ref_ms else None,
                   repeats=nrep[c.name])
        row.update(_target(c.name, shape, row))
        rows.append(row)
    return rows


def _target(cell: str, shape: Shape, row: dict) -> dict:
    """This row's target (:data:`TARGETS` on CPU at the PTB shapes, :data:`GPU_TARGETS` on
    CUDA), and whether it is met."""
    out: dict[str, Any] = dict(target=None, target_baseline=None, target_ratio=None, target_met=None)
    if row.get("device") == "cuda":
        base, needs = GPU_TARGETS.get(cell, (None, {}))
        if shape.name in needs:
            got = row["ratio_lstm"] if base == "nn.LSTM" else row["ratio_rnn"]
            out.update(target=needs[shape.name], target_baseline=base, target_ratio=got,
                       target_met=got >= needs[shape.name])
        return out
    if cell.startswith("nn.") or shape.name not in TARGET_SHAPES:
        return out
    if cell in TARGETS:
        base, need = TARGETS[cell]
        got = row["ratio_lstm"] if base == "nn.LSTM" else row["ratio_rnn"]
        out.update(target=need, target_baseline=base, target_ratio=got, target_met=got >= need)
    elif row["speedup_vs_reference"] is not None:
        got = row["speedup_vs_reference"]
        out.update(target=OTHER_TARGET, target_baseline="reference", target_ratio=got,
                   target_met=got >= OTHER_TARGET)
    return out
