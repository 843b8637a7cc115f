"""How the benchmarks measure: timed rounds interleaved across candidates, memory kept for
backward, matrix entries (FLOPs), the machine's matrix-multiply rate, the environment, and
which kernel path an encoder takes."""

from __future__ import annotations

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
