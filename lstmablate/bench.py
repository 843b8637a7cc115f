"""Benchmarks: the cells' forward+backward speed against ``torch.nn.LSTM`` / ``torch.nn.RNN``.

Library functions (the ``lstmablate bench`` command renders their rows):

* :func:`bench_cells` — forward+backward tokens/s of each cell's encoder at the
  PTB shapes (batch 20, 35 steps, 2 layers, hidden 200 and 650) and a
  parser-like bidirectional shape (batch 32, length <= 50 with variable lengths,
  hidden 400, 3 layers), against ``torch.nn.LSTM`` (and ``torch.nn.RNN``, the
  baseline of ``lstm-gates``) of the same size, timed in the same process and
  interleaved round by round (so a busy machine slows every candidate alike);
  plus memory, achieved GFLOP/s, and for the cells without a ratio target the
  speed-up over their own reference step loop;
* :func:`bench_models` — end-to-end PTB (small/medium/large) training tokens/s per cell
  (embedding -> 2-layer encoder -> softmax, SGD with gradient clipping);
* :func:`machine_gflops` — this machine's large matrix-multiply rate (the floor);
* :func:`render` — a ``rich`` table of the rows; :func:`to_json` — the rows as JSON.

Timing: ``warmup`` untimed iterations, then ``repeats`` timed rounds; each row
reports the median (and the minimum) seconds per iteration.  Tokens per
iteration = real (unpadded) tokens of the batch.  Ratios are median against
median.  Memory: on CUDA the peak allocated bytes of one iteration; on CPU the
bytes an iteration keeps for its backward pass (every tensor saved for
backward, distinct storages counted once), which is what grows with the model
and the sequence; PyTorch offers no per-iteration peak on CPU.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from lstmablate.cells import available_cells, build_encoder, get_cell, reference_mode
from lstmablate.cells.kernels import calibrate, native
from lstmablate.cells.kernels.interface import family_of, native_sources
from lstmablate import io
from lstmablate.errors import ConfigError

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
#: memory, the training step, the trainer): ``benchmarks/gpu_check.py``.
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


# ---------------------------------------------------------------------------------
# measuring
# ---------------------------------------------------------------------------------

@contextmanager
def _threads(n: int):
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _SavedBytes:
    """Bytes of every tensor saved for backward inside the context (distinct storages)."""

    def __init__(self) -> None:
        self.seen: dict[int, int] = {}

    def pack(self, t: Tensor) -> Tensor:
        try:
            st = t.untyped_storage()
            self.seen[st.data_ptr()] = st.nbytes()
        except (RuntimeError, NotImplementedError):
            self.seen[id(t)] = t.numel() * t.element_size()
        return t

    @staticmethod
    def unpack(t: Tensor) -> Tensor:
        return t

    @property
    def megabytes(self) -> float:
        return sum(self.seen.values()) / 2**20


@dataclass
class _Candidate:
    name: str
    step: Callable[[], None]  # one forward+backward (or training step)
    params: list[Tensor]
    times: list[float]


def _time_rounds(cands: list[_Candidate], warmup: int, repeats: int, device: torch.device,
                 budget_s: float | None = None) -> None:
    """Warm every candidate up, then time them interleaved, round by round."""
    for c in cands:
        for _ in range(warmup):
            c.step()
    _sync(device)
    start = time.perf_counter()
    for r in range(repeats):
        for c in cands:
            for p in c.params:
                p.grad = None
            _sync(device)
            t0 = time.perf_counter()
            c.step()
            _sync(device)
            c.times.append(time.perf_counter() - t0)
        if budget_s is not None and r >= 2 and time.perf_counter() - start > budget_s:
            break


def _memory_mb(step: Callable[[], Any], device: torch.device) -> float:
    """Peak allocated MB of one step on CUDA; MB saved for backward on CPU (see module doc)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        step()
        torch.cuda.synchronize(device)
        return (torch.cuda.max_memory_allocated(device) - base) / 2**20
    counter = _SavedBytes()
    with torch.autograd.graph.saved_tensors_hooks(counter.pack, counter.unpack):
        step()
    return counter.megabytes


def matrix_entries(module: nn.Module) -> int:
    """Entries of every matrix (>= 2-D parameter or buffer) of ``module``: each is used once per
    token and direction in a multiply-add, so a token costs 2x this many FLOPs forward and
    about 6x forward+backward."""
    n = sum(p.numel() for p in module.parameters() if p.dim() >= 2)
    n += sum(b.numel() for b in module.buffers() if b.dim() >= 2)
    return n


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


def _path(enc: nn.Module, device: torch.device, dtype: torch.dtype, masked: bool,
          batch: int | None = None) -> str:
    """The kernel the encoder's cells take, as their kernel family names it (e.g.
    ``recurrent (native)``, ``torch-lstm (calibrated)``: the path the calibrated dispatch
    chose on this machine for this batch size; on CUDA ``torch-lstm (cuDNN, stacked)``
    where the whole encoder is one cuDNN call, ``triton-recurrent (CUDA graphs)``)."""
    cell = enc.layers[0][0]
    call = dict(device_type=device.type, dtype=dtype, mask="prefix" if masked else "none",
                batch=batch)
    try:
        family = family_of(cell)
        if family is None:
            return "reference"
        if family.stack_plan(enc, **call) is not None:
            call["stacked"] = True
        return family.kernel_name(cell, **call)
    except Exception:  # noqa: BLE001  (a plugin cell's kernel family: just say so)
        return "?"


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
    with _threads(threads):
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


# ---------------------------------------------------------------------------------
# full model: PTB training (the tutorial's small, medium, large sizes)
# ---------------------------------------------------------------------------------

class _LanguageModel(nn.Module):
    """Embedding -> encoder -> untied softmax (PTB-small's architecture, no dropout)."""

    def __init__(self, vocab: int, hidden: int, encoder: nn.Module):
        super().__init__()
        self.embedding = nn.Embedding(vocab, hidden)
        self.encoder = encoder
        self.decoder = nn.Linear(hidden, vocab)

    def forward(self, x: Tensor, state: Any = None):
        out, st = self.encoder(self.embedding(x), None, state)
        return self.decoder(out), st


def _ptb_model(cell: str, vocab: int, hidden: int, layers: int) -> nn.Module:
    if cell == "nn.LSTM":
        class _Enc(nn.Module):
            def __init__(self):
                super().__init__()
                self.rnn = nn.LSTM(hidden, hidden, num_layers=layers, batch_first=True)
                self.output_size = hidden

            def forward(self, x, lengths=None, state=None):
                return self.rnn(x, state)
        enc: nn.Module = _Enc()
    else:
        enc = build_encoder(cell, hidden, hidden, num_layers=layers)
    try:  # the task plugin's own model, when it is installed
        from lstmablate_tasks.ptb.model import PTBLanguageModel

        model: nn.Module = PTBLanguageModel(vocab, hidden, enc, 0.0)
    except ImportError:
        model = _LanguageModel(vocab, hidden, enc)
    with torch.no_grad():
        for p in model.parameters():
            nn.init.uniform_(p, -0.1, 0.1)
    return model


#: The tutorial's model sizes (hidden, num_steps): what ``bench_models(size=...)`` times.
MODEL_SIZES: dict[str, tuple[int, int]] = {"small": (200, 20), "medium": (650, 35),
                                           "large": (1500, 35)}


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
    repeats.
    """
    if size not in MODEL_SIZES:
        raise ConfigError(f"unknown PTB model size {size!r}; expected one of {sorted(MODEL_SIZES)}")
    hidden = MODEL_SIZES[size][0] if hidden is None else hidden
    steps = MODEL_SIZES[size][1] if steps is None else steps
    dev = torch.device(device)
    cells = list(cells) if cells else [c for c in available_cells()
                                       if get_cell(c).family in ("lstm", "gru")]
    if quick:
        repeats, warmup = min(repeats, 5), min(warmup, 1)
    gen = torch.Generator().manual_seed(seed)
    n_batches = 8
    data = torch.randint(0, vocab, (n_batches, batch, steps + 1), generator=gen).to(dev)
    cands, meta = [], {}
    with _threads(threads):
        torch.manual_seed(seed)
        for cell in ["nn.LSTM", *cells]:
            try:
                model = _ptb_model(cell, vocab, hidden, layers).to(dev)
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
            meta[cell] = ("PyTorch" if cell == "nn.LSTM" else
                          _path(enc, dev, torch.float32, False, batch) if enc is not None else "?")
        if progress:
            progress(f"ptb-{size} model: timing {len(cands)} candidates x {repeats} rounds")
        _time_rounds(cands, warmup, repeats, dev)
    base = statistics.median(cands[0].times)
    rows = []
    for c in cands:
        t = statistics.median(c.times)
        rows.append(dict(kind="model", shape=f"ptb-{size}-model", cell=c.name, kernel=meta[c.name],
                         device=dev.type, threads=threads, vocab=vocab, hidden=hidden,
                         layers=layers, batch=batch, steps=steps, tokens=batch * steps,
                         ms=t * 1e3, ms_min=min(c.times) * 1e3, tokens_per_s=batch * steps / t,
                         ratio_lstm=base / t, repeats=len(c.times)))
    return rows


# ---------------------------------------------------------------------------------
# the floor: this machine's matrix-multiply rate
# ---------------------------------------------------------------------------------

def machine_gflops(threads: int = 2, device: str = "cpu", n: int = 1024, repeats: int = 10) -> float:
    """Median GFLOP/s of an n x n x n float32 matrix product (the machine's matmul rate)."""
    dev = torch.device(device)
    with _threads(threads):
        a = torch.randn(n, n, device=dev)
        b = torch.randn(n, n, device=dev)
        for _ in range(3):
            a @ b
        ts = []
        for _ in range(repeats):
            _sync(dev)
            t0 = time.perf_counter()
            a @ b
            _sync(dev)
            ts.append(time.perf_counter() - t0)
    return 2 * n**3 / statistics.median(ts) / 1e9


def environment(threads: int = 2, device: str = "cpu") -> dict:
    """What the numbers were measured on: the run record's environment
    (:func:`lstmablate.io.environment`), which native kernels were built, the calibrated
    choices between ours and PyTorch's made so far, and the load while measuring."""
    info = io.environment(device, threads)
    info["native_kernels"] = ({f: native.library(f) is not None for f in native_sources()}
                              if device == "cpu" else {})
    # per shape class: the timed ms of each path, and which was taken
    info["dispatch"] = {k: dict(choice=d.choice, native_ms=round(d.native_ms, 3),
                                torch_ms=round(d.torch_ms, 3))
                        for k, d in calibrate.decisions().items()}
    try:
        info["load_average"] = os.getloadavg()
    except (AttributeError, OSError):
        pass
    return info


# ---------------------------------------------------------------------------------
# output
# ---------------------------------------------------------------------------------

def to_json(rows: list[dict], **extra: Any) -> str:
    """The rows (and e.g. ``environment=...``) as an indented JSON document."""
    def clean(v: Any) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            return None
        return v
    doc = dict(extra, rows=[{k: clean(v) for k, v in r.items()} for r in rows])
    return json.dumps(doc, indent=2)


def _fmt(v: Any, spec: str = ".2f") -> str:
    return "" if v is None else format(v, spec)


def render(rows: list[dict]):
    """A ``rich.table.Table`` of :func:`bench_cells` and/or :func:`bench_models` rows."""
    from rich.table import Table

    cell_rows = [r for r in rows if r.get("kind") == "cell"]
    model_rows = [r for r in rows if r.get("kind") == "model"]
    if cell_rows:
        dev = cell_rows[0]["device"]
        mem = "peak MB" if dev == "cuda" else "saved MB"
        table = Table(title=f"forward+backward, {dev}, {cell_rows[0]['threads']} threads "
                            "(median of the rounds; ratio = tokens/s over the baseline's)")
        for col, kw in (("shape", {}), ("cell", {}), ("kernel", {}), ("ms/iter", {"justify": "right"}),
                        ("tokens/s", {"justify": "right"}), ("vs nn.LSTM", {"justify": "right"}),
                        ("vs nn.RNN", {"justify": "right"}), ("target", {"justify": "right"}),
                        ("met", {"justify": "center"}), ("GFLOP/s", {"justify": "right"}),
                        ("x ref", {"justify": "right"}), (mem, {"justify": "right"})):
            table.add_column(col, **kw)
        last = None
        for r in cell_rows:
            if last is not None and r["shape"] != last:
                table.add_section()
            last = r["shape"]
            tgt = ""
            if r.get("target") is not None:
                tgt = f"{r['target']:.2f}x " + {"nn.LSTM": "LSTM", "nn.RNN": "RNN",
                                                "reference": "ref"}[r["target_baseline"]]
            met = {True: "[green]yes[/]", False: "[red]NO[/]", None: ""}[r.get("target_met")]
            table.add_row(r["shape"], r["cell"], r["kernel"], _fmt(r["ms"], ".1f"),
                          _fmt(r["tokens_per_s"], ",.0f"), _fmt(r["ratio_lstm"]),
                          _fmt(r["ratio_rnn"]), tgt, met, _fmt(r["gflops"], ".1f"),
                          _fmt(r.get("speedup_vs_reference")), _fmt(r["memory_mb"], ".1f"))
        if not model_rows:
            return table
    if model_rows:
        tables = [] if not cell_rows else [table]
        for group in _by_shape(model_rows):
            m0 = group[0]
            mt = Table(title=f"PTB-{m0['shape'].split('-')[1]} training step (vocab {m0['vocab']}, "
                             f"{m0['layers']}x{m0['hidden']}, batch {m0['batch']}, "
                             f"{m0['steps']} steps), {m0['device']}, {m0['threads']} threads")
            for col in ("cell", "kernel", "ms/iter", "tokens/s", "vs nn.LSTM"):
                mt.add_column(col, justify="left" if col in ("cell", "kernel") else "right")
            for r in group:
                mt.add_row(r["cell"], r["kernel"], _fmt(r["ms"], ".1f"),
                           _fmt(r["tokens_per_s"], ",.0f"), _fmt(r["ratio_lstm"]))
            tables.append(mt)
        if len(tables) == 1:
            return tables[0]
        both = Table.grid(padding=(1, 0))
        for t in tables:
            both.add_row(t)
        return both
    return Table(title="no rows")


def _by_shape(rows: list[dict]) -> list[list[dict]]:
    """Rows grouped by their ``shape``, in order of first appearance."""
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(r["shape"], []).append(r)
    return list(groups.values())


def to_markdown(rows: list[dict]) -> str:
    """The rows as GitHub-flavoured Markdown tables (for docs/performance.md)."""
    out = []
    cell_rows = [r for r in rows if r.get("kind") == "cell"]
    model_rows = [r for r in rows if r.get("kind") == "model"]
    if cell_rows:
        mem = "peak MB" if cell_rows[0]["device"] == "cuda" else "saved MB"
        out.append(f"| shape | cell | kernel | ms/iter | tokens/s | vs nn.LSTM | vs nn.RNN | target "
                   f"| met | GFLOP/s | x ref | {mem} |")
        out.append("|" + "---|" * 12)
        for r in cell_rows:
            tgt = ""
            if r.get("target") is not None:
                tgt = f"{r['target']:.2f}x " + {"nn.LSTM": "LSTM", "nn.RNN": "RNN",
                                                "reference": "ref"}[r["target_baseline"]]
            met = {True: "yes", False: "**no**", None: ""}[r.get("target_met")]
            out.append(f"| {r['shape']} | {r['cell']} | {r['kernel']} | {_fmt(r['ms'], '.1f')} | "
                       f"{_fmt(r['tokens_per_s'], ',.0f')} | {_fmt(r['ratio_lstm'])} | "
                       f"{_fmt(r['ratio_rnn'])} | {tgt} | {met} | {_fmt(r['gflops'], '.1f')} | "
                       f"{_fmt(r.get('speedup_vs_reference'))} | {_fmt(r['memory_mb'], '.1f')} |")
    if model_rows:
        if out:
            out.append("")
        out.append("| model | cell | kernel | ms/iter | tokens/s | vs nn.LSTM |")
        out.append("|---|---|---|---|---|---|")
        for r in model_rows:
            out.append(f"| {r['shape']} | {r['cell']} | {r['kernel']} | {_fmt(r['ms'], '.1f')} | "
                       f"{_fmt(r['tokens_per_s'], ',.0f')} | {_fmt(r['ratio_lstm'])} |")
    return "\n".join(out)
