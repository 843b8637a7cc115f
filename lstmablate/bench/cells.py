"""The cell benchmark: forward+backward tokens/s of each cell's encoder against
``torch.nn.LSTM`` / ``torch.nn.RNN`` of the same size, at the PTB shapes and a parser-like
bidirectional shape, with memory, achieved GFLOP/s and each row's target ratio."""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from lstmablate.cells import available_cells, build_encoder, reference_mode
from lstmablate.cells.kernels.common.precision import same_precision
from lstmablate.config import MAX_BATCH, MAX_BATCH_TOKENS, MAX_LAYERS, MAX_WIDTH
from lstmablate.errors import ConfigError
from lstmablate.limits import check_int
from lstmablate.run.runner import resource_guard

from .measure import (_Candidate, _memory_mb, _path, precision_in_effect, torch_threads,
                      _time_rounds, matrix_entries)
from .options import check_bench_threads, check_cells, check_device, check_fits, check_repeats


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

    def min_bytes(self) -> int:
        """The fewest bytes timing this shape takes: the ``nn.LSTM`` baseline alone (every row
        times it) -- its weights and their gradients, the input and the output gradient, and
        what one forward keeps for the backward pass (each layer and direction: the four gates
        and the cell per token, and the layer's output), in float32.  Each cell adds its own."""
        d = 2 if self.bidirectional else 1
        h, tokens = self.hidden, self.batch * self.steps
        weights = sum(d * (4 * h * ((self.input_size if i == 0 else d * h) + h) + 8 * h)
                      for i in range(self.layers))
        inputs = 2 * tokens * self.input_size + tokens * d * h
        kept = self.layers * tokens * d * (5 * h + h)
        return 4 * (2 * weights + inputs + kept)


SHAPES: dict[str, Shape] = {
    "ptb-200": Shape("ptb-200", batch=20, steps=35, hidden=200, layers=2),
    "ptb-650": Shape("ptb-650", batch=20, steps=35, hidden=650, layers=2),
    "parser-400": Shape("parser-400", batch=32, steps=50, hidden=400, layers=3, bidirectional=True,
                        min_length=10),
    # PTB-large (the TF tutorial's LargeConfig) and Table 4's encoder (nmt-multi30k: 2 x 500,
    # unidirectional, batches of 64 sentences of at most 50 tokens)
    "ptb-1500": Shape("ptb-1500", batch=20, steps=35, hidden=1500, layers=2),
    "nmt-500": Shape("nmt-500", batch=64, steps=50, hidden=500, layers=2, min_length=5),
}
DEFAULT_SHAPES = ["ptb-200", "ptb-650", "parser-400"]
#: the shapes of the paper's experiments, where ``make gpu-check`` checks every fast path
#: against the reference loop
PAPER_SHAPES = ["ptb-650", "ptb-1500", "parser-400", "nmt-500"]

#: the issue's targets (CPU, 2 threads, the PTB shapes): cell -> (baseline, minimum ratio of
#: tokens/s); every other cell: at least OTHER_TARGET x its own reference step loop.
TARGETS: dict[str, tuple[str, float]] = {
    "lstm": ("nn.LSTM", 0.95),
    "lstm-srnn": ("nn.LSTM", 1.05),
    "lstm-srnn-out": ("nn.LSTM", 1.4),
    "lstm-srnn-hidden": ("nn.LSTM", 0.9 * 2.0),  # 0.9 x its bound (4 weight blocks vs 8)
    "lstm-gates": ("nn.RNN", 0.9),
    # the linear-scan cells (3 weight blocks against the LSTM's 8, 2 for mingru)
    "qrnn": ("nn.LSTM", 1.8), "sru-2017": ("nn.LSTM", 1.8), "mingru": ("nn.LSTM", 1.8),
    "minlstm": ("nn.LSTM", 1.8),
    # the recurrent simpler recurrences: at least their closest LSTM ablation, timed beside them
    # (:data:`CELL_BASELINES`).  knn-rnn is lstm-srnn-out with its input gate coupled to 1 - f
    # (one recurrent gate); the 2018 sru is lstm-srnn-hidden with i = 1 - f, v ∘ c_{t-1} in the
    # gates and a highway for the output gate (3 weight blocks against 4).  ran (g = tanh) IS
    # lstm-srnn-out, run by the same kernel on the same arithmetic: a tie is its bound, and
    # two medians of one computation differ by the rounds' spread, measured at 0.98-1.00 on a
    # quiet machine (docs/results/speed.md), so its mark is a tie within 3 %
    "ran": ("lstm-srnn-out", 0.97), "knn-rnn": ("lstm-srnn-out", 1.0),
    "sru": ("lstm-srnn-hidden", 1.0),
}
#: the baselines of :data:`TARGETS` that are cells: each is timed wherever a cell measured
#: against it is, in the same rounds
CELL_BASELINES = {c: base for c, (base, _) in TARGETS.items() if not base.startswith("nn.")}
OTHER_TARGET = 2.0
TARGET_SHAPES = ("ptb-200", "ptb-650")
#: the cells whose target is set at some of :data:`TARGET_SHAPES` only
TARGET_ONLY_AT: dict[str, tuple[str, ...]] = dict.fromkeys(
    ("qrnn", "sru-2017", "mingru", "minlstm", "ran", "knn-rnn", "sru"), ("ptb-650",))

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


#: the fifth part of ``BxTxHxLxbi`` (a bidirectional shape)
BIDIRECTIONAL = ("bi", "bidirectional", "1", "true")


def parse_shape(spec: str) -> Shape:
    """A named shape, or ``BxTxHxL[xbi]`` (commas work too), e.g. ``20x35x650x2`` or
    ``32x50x400x3xbi``.

    Each number is bounded as the tasks' configs bound it (:mod:`lstmablate.config`): the batch
    by ``MAX_BATCH``, the hidden size by ``MAX_WIDTH``, the layers by ``MAX_LAYERS``, and the
    tokens of a batch (batch x steps) by ``MAX_BATCH_TOKENS``; anything else is a ConfigError
    naming ``--shape``, before anything is allocated."""
    if spec in SHAPES:
        return SHAPES[spec]
    parts = spec.replace(",", "x").split("x")
    numbers = parts[:4]
    shown = spec if len(spec) <= 60 else f"{spec[:60]}..."
    if (len(parts) not in (4, 5) or not all(p.isascii() and p.isdigit() for p in numbers)
            or (len(parts) == 5 and parts[4].strip().lower() not in BIDIRECTIONAL)):
        raise ConfigError(f"--shape {shown!r}: use one of {', '.join(SHAPES)} or 'BxTxHxL[xbi]' "
                          "(batch x steps x hidden x layers, each a positive integer, then "
                          "'xbi' for a bidirectional encoder), e.g. 20x35x650x2 or 32x50x400x3xbi.")
    # a number of thousands of digits is no size (and int() refuses it): shown cut, refused
    b, t, h, layers = (int(p) if len(p) <= 18 else f"{p[:12]}..." for p in numbers)
    what = f"--shape {shown}:"
    check_int(b, f"{what} the batch", 1, MAX_BATCH)
    check_int(t, f"{what} the steps", 1, MAX_BATCH_TOKENS)
    check_int(h, f"{what} the hidden size", 1, MAX_WIDTH)
    check_int(layers, f"{what} the layers", 1, MAX_LAYERS)
    check_int(b * t, f"{what} the tokens of a batch (batch x steps)", 1, MAX_BATCH_TOKENS)
    return Shape(spec, batch=b, steps=t, hidden=h, layers=layers, bidirectional=len(parts) == 5)


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
                progress: Callable[[str], None] | None = None,
                precision: str | None = None) -> list[dict]:
    """Forward+backward tokens/s of each cell against torch.nn.LSTM / nn.RNN, per shape.

    ``cells``: registry names (default: every registered cell); ``shapes``: names of
    :data:`SHAPES` or ``"BxTxHxL[xbi]"`` (default: :data:`DEFAULT_SHAPES`);
    ``quick``: 3 repeats, 1 warm-up, and only the first two default shapes unless
    shapes are given; ``reference``: also time each cell's reference step loop (default:
    only for the cells without a ratio target in :data:`TARGETS`); ``precision``: ``"fp32"``
    or ``"tf32"`` times every candidate, the cuDNN baselines included, with cuBLAS's and
    cuDNN's float32 products at that precision alike (``common/precision.same_precision``),
    None with PyTorch's flags as they are (by default cuDNN in TF32, cuBLAS in float32).

    Returns one dict per (shape, candidate) with ``kind="cell"``; the baselines have
    ``cell`` = ``"nn.LSTM"`` / ``"nn.RNN"``.  Keys: shape, cell, kernel, device,
    threads, batch, steps, hidden, layers, bidirectional, tokens (the real, unpadded tokens
    per iteration: tokens/s counts only those), padding (the share of the batch's
    positions that are padding, 0 for fixed lengths),
    ms (median), ms_min, tokens_per_s, ratio_lstm, ratio_rnn, target, target_baseline,
    target_ratio (the measured ratio the target is about), target_met (None where
    no target applies), gflops, flops_per_token, memory_mb, memory_kind,
    reference_ms, speedup_vs_reference, repeats, precision (the float32 precision of the
    products, both sides alike: :func:`~lstmablate.bench.measure.precision_in_effect`).
    """
    dev = check_device(device)
    check_bench_threads(threads)
    check_repeats(repeats, "--repeats")
    cells = check_cells(cells) or available_cells()
    shape_list = cell_shapes(shapes, dev, quick)
    if quick:
        repeats, warmup = min(repeats, 3), min(warmup, 1)
    if precision not in (None, "fp32", "tf32"):
        raise ConfigError(f"precision must be fp32 or tf32 (or None: PyTorch's flags as they "
                          f"are), got {precision!r}")
    rows: list[dict] = []
    flags = same_precision(precision == "tf32") if precision else contextlib.nullcontext()
    with torch_threads(threads), flags:  # (each row names the precision in effect)
        for shape in shape_list:
            with resource_guard(f"timing the cells at shape {shape.name} on {dev}"):
                rows.extend(_bench_shape(cells, shape, dev, threads, repeats, warmup, reference,
                                         seed, progress))
    return rows


def cell_shapes(shapes: list[str] | None, device: torch.device, quick: bool = False) -> list[Shape]:
    """The shapes :func:`bench_cells` times (``shapes``, else the default ones: the first two
    with ``quick``), each checked by :func:`parse_shape` and against the memory ``device``
    has free, before anything is allocated."""
    specs = shapes or (DEFAULT_SHAPES[:2] if quick else DEFAULT_SHAPES)
    shape_list = [parse_shape(s) for s in specs]
    for shape in shape_list:
        check_fits(shape.min_bytes(), f"--shape {shape.name}", device,
                   "nn.LSTM's weights, their gradients and what one forward keeps for backward",
                   "a smaller batch, fewer steps, a smaller hidden size or fewer layers")
    return shape_list


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
    baselines = [CELL_BASELINES[c] for c in cells if c in CELL_BASELINES
                 and shape.name in TARGET_ONLY_AT.get(c, TARGET_SHAPES)]
    cells = [*cells, *dict.fromkeys(b for b in baselines if b not in cells)]
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
    _time_rounds(cands, warmup, repeats, dev, progress=progress, what=shape.name)
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
                   bidirectional=shape.bidirectional, tokens=tokens,
                   padding=1 - tokens / (B * T), ms=t * 1e3,
                   ms_min=mins[c.name] * 1e3, tokens_per_s=tokens / t,
                   ratio_lstm=med["nn.LSTM"] / t, ratio_rnn=med["nn.RNN"] / t,
                   flops_per_token=flops_tok, gflops=gflops,
                   memory_mb=_memory_mb(c.step, dev, c.params),
                   memory_kind="peak" if dev.type == "cuda" else "saved",
                   reference_ms=ref_ms, speedup_vs_reference=(ref_ms / (t * 1e3)) if ref_ms else None,
                   repeats=nrep[c.name], precision=precision_in_effect(dev))
        row.update(_target(c.name, shape, row, med))
        rows.append(row)
    return rows


def _target(cell: str, shape: Shape, row: dict, times: dict[str, float] | None = None) -> dict:
    """This row's target (:data:`TARGETS` on CPU at the PTB shapes, :data:`GPU_TARGETS` on
    CUDA), and whether it is met; ``times``: the median time of every candidate of the
    shape, for a target against another cell (:data:`CELL_BASELINES`)."""
    out: dict[str, Any] = dict(target=None, target_baseline=None, target_ratio=None, target_met=None)
    if row.get("device") == "cuda":
        base, needs = GPU_TARGETS.get(cell, (None, {}))
        if shape.name in needs:
            got = row["ratio_lstm"] if base == "nn.LSTM" else row["ratio_rnn"]
            out.update(target=needs[shape.name], target_baseline=base, target_ratio=got,
                       target_met=got >= needs[shape.name])
        return out
    if cell.startswith("nn.") or shape.name not in TARGET_ONLY_AT.get(cell, TARGET_SHAPES):
        return out
    if cell in TARGETS:
        base, need = TARGETS[cell]
        if base in CELL_BASELINES.values():
            if not times or base not in times:
                return out
            got = times[base] / times[cell]
        else:
            got = row["ratio_lstm"] if base == "nn.LSTM" else row["ratio_rnn"]
        out.update(target=need, target_baseline=base, target_ratio=got, target_met=got >= need)
    elif row["speedup_vs_reference"] is not None:
        got = row["speedup_vs_reference"]
        out.update(target=OTHER_TARGET, target_baseline="reference", target_ratio=got,
                   target_met=got >= OTHER_TARGET)
    return out
