"""The cells' own reference implementations timed beside ours: ``lstmablate bench --peers``
and gpu-check's ``peers`` stage.

In one process, at one shape, one layer in one direction of it (the shape's batch, steps,
input and hidden sizes), forward + backward in float32, interleaved round by round
(``measure._time_rounds``): each peer, our cell whose equations it computes, and
``torch.nn.LSTM``.  A peer whose package is not installed is a row that says so (``status``:
``skipped: PACKAGE not installed``), never an error; one that raises is a row naming the error.

Peers (:data:`PEERS`; the optional extra ``peers`` of ``pyproject.toml`` installs them):

* ``sru``: the authors' SRU layer (``sru`` package, Lei et al. 2018), ``rescale=False``, its
  CUDA kernel on a GPU and its PyTorch loop on a CPU, against our ``sru`` (same equations,
  ``tests/test_peers.py``);
* ``sru-2017``: the same package's first form (``v1=True``: no v ∘ c_{t-1}; ``use_tanh``),
  against our ``sru-2017``;
* ``flashrnn-lstm``: FlashRNN's fused LSTM (``flashrnn``, Pöppel et al. 2024; its fused CUDA
  kernel on a GPU, its PyTorch loop on a CPU), against our ``lstm`` (the same equations,
  ``tests/test_peers.py``);
* ``fla-hgrn``: flash-linear-attention's HGRN recurrence kernel (``fla-core``: h_t =
  exp(g_t) ∘ h_{t-1} + x_t, Triton) with minGRU's gates, against our ``mingru`` (the same
  recurrence, ``tests/test_peers.py``); on a GPU only (on a CPU its Triton kernels run in
  the interpreter, which times nothing useful).
"""

from __future__ import annotations

import importlib
import statistics
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import torch
from torch import Tensor, nn

#: the shapes of ``bench --peers`` and the ``peers`` stage (one layer of each)
PEER_SHAPES = ("ptb-200", "ptb-650", "parser-400")

Step = tuple[Callable[[], None], list[Tensor]]
Shape = Any  # (.cells.Shape: imported where a peer is timed, so that gpu-check's orchestrator,
#            which renders :func:`markdown_rows`, loads only PyTorch)


@dataclass(frozen=True)
class Peer:
    """A reference implementation: its row name, the module it imports and the distribution
    that installs it, our cell with its equations, where it runs, and how one
    forward+backward of one layer is built (``build(shape, device) -> (step, params)``)."""

    name: str
    module: str
    distribution: str
    ours: str
    build: Callable[[Shape, torch.device], Step]
    gpu_only: bool = False
    note: str = ""


def _inputs(shape: Shape, device: torch.device, time_major: bool = False):
    gen = torch.Generator().manual_seed(0)
    B, T = shape.batch, shape.steps
    x = torch.randn(B, T, shape.input_size, generator=gen)
    g = torch.randn(B, T, shape.hidden, generator=gen)
    if time_major:
        x, g = x.transpose(0, 1).contiguous(), g.transpose(0, 1).contiguous()
    return x.to(device).requires_grad_(True), g.to(device)


def _sru(v1: bool) -> Callable[[Shape, torch.device], Step]:
    def build(shape: Shape, device: torch.device) -> Step:
        from sru import SRU

        m = SRU(shape.input_size, shape.hidden, num_layers=1, rescale=False, v1=v1,
                use_tanh=v1).to(device)
        x, g = _inputs(shape, device, time_major=True)

        def step() -> None:
            h, _ = m(x)
            h.backward(g)
        return step, list(m.parameters())
    return build


def _flashrnn_lstm(shape: Shape, device: torch.device) -> Step:
    from flashrnn import flashrnn

    H = shape.hidden
    proj = nn.Linear(shape.input_size, 4 * H).to(device)  # W x_t + b of the four gates
    R = nn.Parameter(torch.randn(4, 1, H, H, device=device) / H ** 0.5)
    b = nn.Parameter(torch.zeros(4, 1, H, device=device))
    x, g = _inputs(shape, device)
    backend = "cuda_fused" if device.type == "cuda" else "vanilla"

    def step() -> None:
        wx = proj(x).view(shape.batch, shape.steps, 4, 1, H)
        h, _ = flashrnn(wx, R, b, function="lstm", backend=backend, dtype="float32")
        h[0, :, :, 0].backward(g)
    return step, [*proj.parameters(), R, b]


def _fla_hgrn(shape: Shape, device: torch.device) -> Step:
    from fla.ops.hgrn import fused_recurrent_hgrn

    H = shape.hidden
    proj = nn.Linear(shape.input_size, 2 * H).to(device)  # minGRU: W_z x_t + b_z, W_h x_t + b_h
    x, g = _inputs(shape, device)

    def step() -> None:
        a, v = proj(x).chunk(2, dim=-1)
        z = torch.sigmoid(a)  # h_t = (1 - z_t) h_{t-1} + z_t h~_t: x_t = z_t h~_t,
        h, _ = fused_recurrent_hgrn(z * v, nn.functional.logsigmoid(-a))  # g_t = log(1 - z_t)
        h.backward(g)
    return step, list(proj.parameters())


PEERS: tuple[Peer, ...] = (
    Peer("sru", "sru", "sru", "sru", _sru(v1=False),
         note="the authors' SRU layer, rescale=False"),
    Peer("sru-2017", "sru", "sru", "sru-2017", _sru(v1=True),
         note="the authors' package, v1=True, use_tanh=True"),
    Peer("flashrnn-lstm", "flashrnn", "flashrnn", "lstm", _flashrnn_lstm,
         note="FlashRNN's LSTM (fused CUDA kernel; PyTorch loop on a CPU)"),
    Peer("fla-hgrn", "fla.ops.hgrn", "fla-core", "mingru", _fla_hgrn, gpu_only=True,
         note="flash-linear-attention's HGRN kernel with minGRU's gates"),
)


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _ours(cell: str) -> Callable[[Shape, torch.device], Step]:
    def build(shape: Shape, device: torch.device) -> Step:
        from .cells import _build_cell_encoder, _encoder_step

        enc = _build_cell_encoder(cell, shape)
        if enc is None:
            raise ValueError(f"{cell} cannot be built at {shape.name}")
        enc = enc.to(device)
        x, g = _inputs(shape, device)
        return _encoder_step(enc, x, None, g), list(enc.parameters())
    return build


def _nn_lstm(shape: Shape, device: torch.device) -> Step:
    from .cells import _encoder_step, _TorchEncoder

    enc = _TorchEncoder("nn.LSTM", shape).to(device)
    x, g = _inputs(shape, device)
    return _encoder_step(enc, x, None, g), list(enc.parameters())


def bench_peers(shapes: list[str] | None = None, peers: list[str] | None = None,
                device: str = "cpu", threads: int = 2, repeats: int = 7, warmup: int = 2,
                progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """One row (``kind="peer"``) per peer and shape: the peer's, our cell's and
    ``nn.LSTM``'s forward+backward tokens/s of one layer at the shape, the ratios
    (``ours_vs_peer``: ours / the peer's), the peer's package and version, and ``status``
    (``measured``, ``skipped: ...`` or ``failed: ...``)."""
    from .cells import SHAPES, Shape, parse_shape
    from .measure import torch_threads
    from .options import check_device, check_repeats

    check_repeats(repeats, "repeats")
    dev = check_device(device)
    chosen = [p for p in PEERS if not peers or p.name in peers]
    unknown = sorted(set(peers or ()) - {p.name for p in PEERS})
    if unknown:
        raise ValueError(f"unknown peer(s) {', '.join(unknown)}; known: "
                         f"{', '.join(p.name for p in PEERS)}")
    rows = []
    for spec in shapes or PEER_SHAPES:
        full = SHAPES.get(spec) or parse_shape(spec)
        shape = Shape(f"{full.name} (1 layer)", full.batch, full.steps, full.hidden, 1,
                      input=full.input_size)
        for peer in chosen:
            row = dict(kind="peer", shape=shape.name, peer=peer.name, ours=peer.ours,
                       package=peer.distribution, version=_version(peer.distribution),
                       device=dev.type, note=peer.note, tokens=shape.batch * shape.steps)
            rows.append(row)
            if peer.gpu_only and dev.type != "cuda":
                row["status"] = "skipped: Triton kernels, timed on a GPU only"
                continue
            try:
                importlib.import_module(peer.module)
            except ImportError as err:
                why = "not installed" if row["version"] is None else f"not importable ({err})"
                row["status"] = f"skipped: {peer.distribution} {why}"
                continue
            try:  # (the packages' own warnings at every call, e.g. sru's on a CPU, silenced)
                with torch_threads(threads), warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    times = _time_three(peer, shape, dev, repeats, warmup, progress)
            except Exception as err:  # noqa: BLE001  (a row naming it; the others still run)
                row["status"] = f"failed: {type(err).__name__}: {str(err).splitlines()[0][:200]}"
                continue
            tps = {k: shape.batch * shape.steps / v for k, v in times.items()}
            row.update(status="measured", peer_tokens_per_s=tps["peer"],
                       ours_tokens_per_s=tps["ours"], lstm_tokens_per_s=tps["nn.LSTM"],
                       ours_vs_peer=tps["ours"] / tps["peer"],
                       peer_vs_lstm=tps["peer"] / tps["nn.LSTM"],
                       ours_vs_lstm=tps["ours"] / tps["nn.LSTM"], repeats=repeats)
            if progress:
                progress(f"{shape.name} {peer.name}: {tps['peer']:,.0f} tokens/s, ours "
                         f"({peer.ours}) {tps['ours']:,.0f}")
    return rows


def _time_three(peer: Peer, shape: Shape, dev: torch.device, repeats: int, warmup: int,
                progress) -> dict[str, float]:
    """Median seconds of one forward+backward: the peer, our cell, nn.LSTM (interleaved)."""
    from .measure import _Candidate, _time_rounds

    cands = []
    for name, build in (("peer", peer.build), ("ours", _ours(peer.ours)), ("nn.LSTM", _nn_lstm)):
        torch.manual_seed(0)
        step, params = build(shape, dev)
        cands.append(_Candidate(name, step, params, []))
    _time_rounds(cands, warmup, repeats, dev, progress=progress,
                 what=f"{shape.name} {peer.name}")
    return {c.name: statistics.median(c.times) for c in cands}


def markdown_rows(rows: list[dict]) -> list[str]:
    """The peers' rows as one Markdown table (gpu-check's record, ``bench --peers``)."""
    peers = [r for r in rows if r.get("kind") == "peer"]
    if not peers:
        return []
    out = ["| shape | peer (package) | ours | peer tokens/s | ours tokens/s | nn.LSTM tokens/s "
           "| ours / peer | status |", "|---|---|---|---|---|---|---|---|"]
    for r in peers:
        pkg = f"{r['package']} {r['version']}" if r.get("version") else r["package"]
        tps = [f"{r[k]:,.0f}" if r.get(k) is not None else "" for k in
               ("peer_tokens_per_s", "ours_tokens_per_s", "lstm_tokens_per_s")]
        ratio = f"{r['ours_vs_peer']:.2f}" if r.get("ours_vs_peer") is not None else ""
        out.append(f"| {r['shape']} | {r['peer']} ({pkg}) | `{r['ours']}` | "
                   f"{' | '.join(tps)} | {ratio} | {r['status']} |")
    return out + [""]
