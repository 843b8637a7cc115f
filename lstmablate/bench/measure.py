"""How the benchmarks measure: timed rounds interleaved across candidates, memory kept for
backward, matrix entries (FLOPs), the machine's matrix-multiply rate, the environment, and
which kernel path an encoder takes."""

from __future__ import annotations

import gc
import os
import statistics
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from lstmablate import io
from lstmablate.cells.kernels.common import calibrate, native
from lstmablate.cells.kernels.interface import family_of, native_sources


# ---------------------------------------------------------------------------------
# measuring
# ---------------------------------------------------------------------------------

@contextmanager
def torch_threads(n: int):
    """Run the block with ``torch.set_num_threads(n)`` (the native kernels' OpenMP loops run on
    PyTorch's OpenMP runtime, so this splits their rows across threads too)."""
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


#: the float32 precisions the benchmarks compare at, both sides alike: strict float32, and
#: TF32 tensor cores for cuBLAS's products and cuDNN's RNNs (CUDA only)
PRECISIONS = ("fp32", "tf32")


def float32_precision(name: str):
    """Run the block with cuBLAS and cuDNN at the same float32 precision: ``fp32`` (TF32 off
    for both) or ``tf32`` (on for both) — ``common.precision.same_precision``.  PyTorch's
    defaults differ (cuDNN's RNNs may use TF32, cuBLAS's products may not), which would compare
    precision along with design."""
    if name not in PRECISIONS:
        raise ValueError(f"precision {name!r}: expected one of {', '.join(PRECISIONS)}")
    from lstmablate.cells.kernels.common.precision import same_precision

    return same_precision(name == "tf32")


def precision_in_effect(device: torch.device) -> str:
    """The float32 precision of a computation on ``device`` as PyTorch's flags stand: on CUDA,
    ``common.precision.products_label`` (``fp32``, ``tf32``, or the mix: cuDNN's RNNs at TF32
    and cuBLAS's products at strict float32, PyTorch's default); ``fp32`` on any other device
    (TF32 is a CUDA format)."""
    if device.type != "cuda":
        return "fp32"
    from lstmablate.cells.kernels.common.precision import products_label

    return products_label()


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
                 budget_s: float | None = None, progress: Callable[[str], None] | None = None,
                 what: str = "") -> None:
    """Warm every candidate up, then time them interleaved, round by round; ``progress``
    hears, after the warm-up, how long the rounds will take (from the warm-up's last
    steps)."""
    one_round = 0.0  # the warm-up's last step of each candidate
    for c in cands:
        for _ in range(warmup):
            t0 = time.perf_counter()
            c.step()
            _sync(device)
        if warmup:
            one_round += time.perf_counter() - t0
    _sync(device)
    if progress:
        about = f", about {one_round * repeats:.0f} s" if warmup else ""
        progress(f"{what}: timing {len(cands)} candidates x {repeats} rounds{about}")
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


#: training steps run while a CUDA step's memory is measured: enough for a graph cache that
#: captures a shape on its third sighting to capture and then replay it inside the measurement
MEMORY_STEPS = 4


def release_graphs() -> None:
    """Drop every CUDA graph the kernels captured so far (their slots' buffers are freed once
    nothing else holds them); the next calls capture again as a fresh process would."""
    from lstmablate.cells.kernels.common import graphs

    graphs.CACHE.clear()


def _memory_mb(step: Callable[[], Any], device: torch.device, params: list[Tensor] = ()) -> float:
    """Peak allocated MB of a training step on CUDA; MB saved for backward on CPU (see the
    package doc).

    On CUDA the measurement starts clean: the gradients of ``params`` are unset and the
    captured CUDA graphs dropped (:func:`release_graphs`), then the peak statistics reset, and
    :data:`MEMORY_STEPS` steps run.  So the figure counts what the step itself allocates,
    the cell's own graph slots included (captured during those steps); slots captured before
    the measurement would otherwise sit in the baseline it subtracts, and a graphed cell would
    look smaller than it is."""
    if device.type == "cuda":
        for p in params:
            p.grad = None
        release_graphs()
        gc.collect()
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        for _ in range(MEMORY_STEPS):
            step()
        torch.cuda.synchronize(device)
        return (torch.cuda.max_memory_allocated(device) - base) / 2**20
    counter = _SavedBytes()
    with torch.autograd.graph.saved_tensors_hooks(counter.pack, counter.unpack):
        step()
    return counter.megabytes


def kernel_table(step: Callable[[], Any], device: torch.device, steps: int = 5,
                 top: int = 12) -> tuple[list[dict], float]:
    """Where the time of ``steps`` calls of ``step`` goes, by ``torch.profiler``: on CUDA the
    GPU kernels (each kernel's own device time), elsewhere PyTorch's operators (their own CPU
    time).  Returns (the ``top`` entries, most time first: name, calls and milliseconds per
    step, share of the total; the total milliseconds per step).  On CUDA the total is the
    time the GPU was busy per step, which set against the step's wall time says how much of
    the GPU a step leaves idle."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    _sync(device)
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        _sync(device)

    def own_us(e: Any) -> float:  # (the name changed in PyTorch 2.4: cuda -> device)
        if not cuda:
            return float(e.self_cpu_time_total)
        return float(getattr(e, "self_device_time_total", None)
                     or getattr(e, "self_cuda_time_total", 0.0))

    def on_device(e: Any) -> bool:  # a kernel, copy or memset: an operator's own device
        # time is the time of the kernels it launched, which are listed themselves
        return not cuda or getattr(e, "device_type", None) != torch.autograd.DeviceType.CPU

    entries = [(e.key, e.count, own_us(e)) for e in prof.key_averages() if on_device(e)]
    entries = sorted((x for x in entries if x[2] > 0), key=lambda x: -x[2])
    total = sum(us for _, _, us in entries)
    rows = [dict(name=name, calls=round(count / steps, 2), ms=us / steps / 1e3,
                 share=us / total if total else None) for name, count, us in entries[:top]]
    return rows, total / steps / 1e3


def matrix_entries(module: nn.Module) -> int:
    """Entries of every matrix (>= 2-D parameter or buffer) of ``module``: each is used once per
    token and direction in a multiply-add, so a token costs 2x this many FLOPs forward and
    about 6x forward+backward."""
    n = sum(p.numel() for p in module.parameters() if p.dim() >= 2)
    n += sum(b.numel() for b in module.buffers() if b.dim() >= 2)
    return n


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


# ---------------------------------------------------------------------------------
# the floor: this machine's matrix-multiply rate
# ---------------------------------------------------------------------------------

def machine_gflops(threads: int = 2, device: str = "cpu", n: int = 1024, repeats: int = 10) -> float:
    """Median GFLOP/s of an n x n x n float32 matrix product (the machine's matmul rate)."""
    dev = torch.device(device)
    with torch_threads(threads):
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
    choices between ours and PyTorch's made so far (and of the GEMM of the products of all
    steps: ``common/gemm.py``), and the load while measuring."""
    info = io.environment(device, threads)
    info["native_kernels"] = ({f: native.library(f) is not None for f in native_sources()}
                              if device == "cpu" else {})
    # per shape class: the timed ms of each path, and which was taken
    info["dispatch"] = {k: dict(choice=d.choice, native_ms=round(d.native_ms, 3),
                                torch_ms=round(d.torch_ms, 3))
                        for k, d in calibrate.decisions().items()}
    info["dispatch"].update({k: dict(choice=c) for k, c in calibrate.choices().items()})  # GEMMs
    try:
        info["load_average"] = os.getloadavg()
    except (AttributeError, OSError):
        pass
    return info
