"""The calibrated choice between our native kernel and PyTorch's own, on CPU.

Three cells compute exactly what a PyTorch module computes: ``lstm`` (``torch.nn.LSTM``),
``lstm-gates`` (``torch.nn.RNN``, tanh) and ``gru`` with ``reset_after``
(``torch.nn.GRU``).  On CPU both our native kernel and PyTorch's (oneDNN for float32, ATen
otherwise) can run them, and which is faster depends on the CPU: on the Intel Xeon these
kernels were written on, ours (MKL's packed sgemm per step) is faster; on an AMD EPYC,
where MKL does not run its best code, oneDNN's own GEMM is.  So the dispatch times both
once per machine and *shape class* and takes the faster:

* the shape class (:class:`ShapeClass`): the kernel kind, dtype, input and hidden size,
  the batch rounded up to a power of two, the thread count, whether gradients are taken,
  and the version of our kernel's source;
* the timing (:func:`measure`): both paths on random data of that class (``STEPS`` steps,
  the batch of the first call of the class; forward and, if gradients are taken,
  backward), one warm-up each, then ``ROUNDS`` interleaved rounds; the fastest round of
  each decides (on a busy machine the least disturbed one is the best estimate);
* the cache: in memory, and on disk next to the kernels
  (``<kernel cache>/dispatch-<machine>.json``, the machine being this CPU's instruction set
  and PyTorch's version), so only the first process on a machine pays for the timing.

``LSTMABLATE_TORCH_ON_CPU=1`` / ``0`` skip the timing (always PyTorch's / always ours).

The same file keeps the choice of the native kernels' per-step product path
(:func:`choose_step_gemm`: sgemm, MKL's packed GEMM or ours), timed once per machine, kernel
source and thread count on two step products of PTB sizes (20 x 4H x H for H = 200, 650).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from lstmablate.errors import UserError
from lstmablate.io import atomic_write_json

from . import native_build

#: time steps of the random sequences the paths are timed on
STEPS = 16
#: timed rounds per path (after one warm-up)
ROUNDS = 5


@dataclass(frozen=True)
class ShapeClass:
    kind: str  # "lstm", "rnn" or "gru": which PyTorch kernel is the alternative
    dtype: str  # "float32" / "float64"
    input_size: int
    hidden_size: int
    batch: int  # the call's batch, rounded up to a power of two
    threads: int
    grad: bool  # forward + backward (training), or forward only
    source: int  # the version of our kernel's source

    def key(self) -> str:
        return (f"{self.kind}|{self.dtype}|I{self.input_size}|H{self.hidden_size}|B{self.batch}|"
                f"t{self.threads}|{'grad' if self.grad else 'nograd'}|src{self.source}")


def bucket(batch: int) -> int:
    """The batch size rounded up to a power of two (1, 2, 4, ...)."""
    return 1 << max(0, int(batch) - 1).bit_length()


def shape_class(kind: str, family: str, input_size: int, hidden_size: int, batch: int,
                dtype: torch.dtype, grad: bool) -> ShapeClass:
    return ShapeClass(kind, str(dtype).replace("torch.", ""), int(input_size), int(hidden_size),
                      bucket(batch), torch.get_num_threads(), bool(grad),
                      native_build.source_version(family))


@dataclass(frozen=True)
class Decision:
    choice: str  # "native" or "torch"
    native_ms: float
    torch_ms: float
    measured_here: bool  # timed in this process (else read from the cache file)


def measure(runners: dict[str, Callable[[], None]]) -> dict[str, float]:
    """Seconds per call of each runner, the fastest of ROUNDS interleaved rounds after one
    warm-up each (interleaved, so a busy machine slows every candidate alike)."""
    for run in runners.values():
        run()
    times: dict[str, list[float]] = {k: [] for k in runners}
    for _ in range(ROUNDS):
        for k, run in runners.items():
            t0 = time.perf_counter()
            run()
            times[k].append(time.perf_counter() - t0)
    return {k: min(v) for k, v in times.items()}


_decisions: dict[ShapeClass, Decision] = {}


def _cache_file():
    machine = native_build.cpu_key() + "|" + torch.__version__
    machine = hashlib.sha256(machine.encode()).hexdigest()[:16]
    return native_build.cache_dir() / f"dispatch-{machine}.json"


def _read_cache() -> dict:
    try:
        doc = json.loads(_cache_file().read_text())
        return doc if isinstance(doc, dict) else {}
    except (OSError, ValueError):
        return {}


def _write_record(key: str, record: dict) -> None:
    path = _cache_file()
    doc = _read_cache()
    doc[key] = dict(record, when=time.strftime("%Y-%m-%d %H:%M:%S"))
    try:
        atomic_write_json(path, doc)
    except UserError:
        pass  # a cache we cannot write only costs the timing again


def choose(sc: ShapeClass, runners: Callable[[], dict[str, Callable[[], None]]]) -> Decision:
    """The faster path for this shape class: remembered, read from the cache file, or
    timed now (``runners()`` gives the "native" and "torch" runs to time)."""
    if sc in _decisions:
        return _decisions[sc]
    rec = _read_cache().get(sc.key())
    if isinstance(rec, dict) and rec.get("choice") in ("native", "torch"):
        d = Decision(rec["choice"], float(rec.get("native_ms", 0)), float(rec.get("torch_ms", 0)),
                     False)
    else:
        with torch.enable_grad() if sc.grad else torch.no_grad():
            t = measure(runners())
        choice = "torch" if t["torch"] < t["native"] else "native"
        d = Decision(choice, t["native"] * 1e3, t["torch"] * 1e3, True)
        _write_record(sc.key(), dict(choice=d.choice, native_ms=d.native_ms, torch_ms=d.torch_ms))
    _decisions[sc] = d
    return d


#: the step products the per-step path is timed on: (rows, outputs, inputs) of one step of a
#: 4-block LSTM at the PTB widths, batch 20
STEP_SHAPES = ((20, 800, 200), (20, 2600, 650))
#: products timed per packing of the weight (a call packs once for all its steps)
STEP_REPS = 24


def choose_step_gemm(lib, threads: int) -> str:
    """The fastest per-step product path of ``lib`` (a ``native.NativeLibrary``) for this
    thread count: remembered, read from the cache file, or timed now (each path on
    :data:`STEP_SHAPES`, STEP_REPS products per packing, one warm-up, then ROUNDS
    interleaved rounds, the fastest round of each; the sum over the shapes decides)."""
    key = f"step_gemm|{lib.family}|t{threads}|src{native_build.source_version(lib.family)}"
    known = _recalled(_step_gemm, key, lambda choice: choice in lib.modes)
    if known is not None:
        return known
    total = {m: 0.0 for m in lib.modes}
    for M, N, K in STEP_SHAPES:
        reps = STEP_REPS  # products per packing, as in a call of about that many steps
        best = {m: float("inf") for m in lib.modes}
        for m in lib.modes:
            lib.time_step_gemm(m, M, N, K, reps)  # warm-up
        for _ in range(ROUNDS):
            for m in lib.modes:
                best[m] = min(best[m], lib.time_step_gemm(m, M, N, K, reps) / reps)
        for m in lib.modes:
            total[m] += best[m]
    return _remember(_step_gemm, key, total)


_step_gemm: dict[str, str] = {}


def _recalled(memo: dict[str, str], key: str, valid: Callable[[object], bool]) -> str | None:
    """The choice for ``key`` made in this process (``memo``) or recorded in the cache file
    (if ``valid``), else None."""
    if key not in memo:
        rec = _read_cache().get(key)
        choice = rec.get("choice") if isinstance(rec, dict) else None
        if valid(choice):
            memo[key] = choice
    return memo.get(key)


def _remember(memo: dict[str, str], key: str, times: dict[str, float]) -> str:
    """The fastest of ``times`` (seconds per name), kept for ``key`` in ``memo`` and in the
    cache file with every time (in ms)."""
    choice = min(times, key=times.get)
    memo[key] = choice
    _write_record(key, dict(choice=choice, **{f"{k}_ms": round(t * 1e3, 4)
                                              for k, t in times.items()}))
    return choice


def decisions() -> dict[str, Decision]:
    """The decisions this process has made or read (shape-class key -> Decision)."""
    return {sc.key(): d for sc, d in _decisions.items()}


def choose_among(key: str, runners: Callable[[], dict[str, Callable[[], None]]]) -> str:
    """The fastest of several named runs for ``key`` (``runners()``: name -> run):
    remembered, read from the cache file, or timed now (:func:`measure`; the record keeps
    every run's time).  For choices other than ours against PyTorch's kernel
    (``common/gemm.py``: which GEMM runs the products of all steps)."""
    known = _recalled(_among, key, lambda choice: isinstance(choice, str))
    return known if known is not None else _remember(_among, key, measure(runners()))


_among: dict[str, str] = {}


def choices() -> dict[str, str]:
    """The choices of :func:`choose_among` this process has made or read (key -> name)."""
    return dict(_among)


def forget() -> None:
    """Forget every decision, in memory and on disk (the next call times again)."""
    _decisions.clear()
    _step_gemm.clear()
    _among.clear()
    try:
        _cache_file().unlink()
    except OSError:
        pass


def random_call(sc: ShapeClass, state_sizes: tuple[int, ...], batch: int):
    """Random inputs for timing a cell's paths: x (STEPS, batch, input) of the shape class
    (``batch``: the batch of the call that asked, within the class's bucket), requiring
    grad when the class takes gradients, and a zero initial state."""
    gen = torch.Generator().manual_seed(0)
    dtype = getattr(torch, sc.dtype)
    x = torch.randn(STEPS, batch, sc.input_size, generator=gen, dtype=dtype)
    state = tuple(torch.zeros(batch, n, dtype=dtype) for n in state_sizes)
    if sc.grad:
        x.requires_grad_(True)
    return x, state


def runner(fn: Callable[[], tuple], cell, x, grad: bool) -> Callable[[], None]:
    """A zero-argument run of one path: ``fn()`` gives (outputs, final state); with ``grad``
    the gradients of a sum of the outputs w.r.t. x and every parameter are computed (and
    returned, never accumulated into ``.grad``)."""
    params = [p for p in cell.parameters() if p.requires_grad]

    def run() -> None:
        out, _ = fn()
        if grad:
            torch.autograd.grad(out.sum(), [x, *params], allow_unused=True)
    return run
