"""The Triton kernels' time loops: launched eagerly, or captured in CUDA graphs and replayed.

At batch 20 a time step is a few microseconds of GPU work in two or three launches (the
recurrent product and one fused element-wise kernel), so on CUDA the launches themselves
(and Python's loop around them) would cost more than the work.  A CUDA graph records a
whole loop once and replays it as one launch.  A graph replays with the memory it was
recorded with, so a loop that is captured runs on *static* buffers:

* :class:`Loops` holds one call shape's buffers and its two loops (``forward_loop``,
  ``backward_loop``), each a pure function of the buffers (re-running it gives the same
  result).  Its inputs (weights, masks, lengths, the gradients of the outputs) are bound
  with :meth:`Loops.put`: eagerly a reference, statically a copy into the buffer made on
  the first ``put``, so a replay reads this call's values;
* :class:`Slot`: one ``Loops`` with its two graphs (recorded on the first run of each
  loop, after one eager warm-up run that compiles the kernels and computes this call's
  results), busy from a forward until its backward has run (or its autograd graph is
  freed: :class:`Lease`), so a second call of the same shape before the first one's
  backward (two layers, two directions, an encoder used twice) gets a slot of its own;
* :class:`GraphCache`: the slots per key (kernel, layout, T, B, dtype, device, which
  inputs exist: "static shapes" are keys seen before).  A key is captured on its
  ``capture_after``-th call (default 2: a shape seen once, e.g. a parser batch of a rare
  length, stays eager), and at most ``max_slots`` slots exist (the least recently used
  free one is dropped for a new one; with none free the call runs eagerly).

Eager whenever graphs cannot be used: CPU tensors (the interpreter), another capture in
progress, ``LSTMABLATE_CUDA_GRAPHS=0``, or a capture that failed once (a warning; the
loops then always run eagerly).  The recording itself is the backend's
(:class:`CudaGraphs`); tests substitute one that checks, at every replay, that no buffer
was re-bound, which is what a real graph would silently get wrong.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

import torch
from torch import Tensor

from ..switches import graphs_setting


class Loops:
    """The buffers and time loops of one call shape (subclasses allocate the buffers and
    define ``forward_loop`` and ``backward_loop``)."""

    def __init__(self, static: bool):
        self.static = static

    def put(self, name: str, value: Tensor | None, like: Tensor | None = None) -> Tensor:
        """Bind the input ``name``: ``value`` (or zeros like ``like`` for None), contiguous.
        Static loops copy it into their own buffer (made on the first ``put``)."""
        if not self.static:  # the kernels index plain row-major memory
            t = value.contiguous() if value is not None else torch.zeros_like(like)
            setattr(self, name, t)
            return t
        buf = getattr(self, name, None)
        src = value if value is not None else like
        if buf is None:
            buf = torch.empty(src.shape, dtype=src.dtype, device=src.device)
            setattr(self, name, buf)
        if value is None:
            buf.zero_()
        else:
            buf.copy_(value)
        return buf

    def forward_loop(self) -> None:
        raise NotImplementedError

    def backward_loop(self) -> None:
        raise NotImplementedError


class CudaGraphs:
    """Records a loop in a CUDA graph (the recording does not run it).  Each graph has a
    memory pool of its own: the loops allocate nothing while recorded (every buffer is the
    ``Loops``'), so the pools hold only what the libraries take for themselves (cuBLAS's
    workspace), and graphs replayed in any order never share it."""

    @staticmethod
    def record(fn: Callable[[], None]):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, capture_error_mode="thread_local"):
            fn()
        return g

    @staticmethod
    def warm_up(fn: Callable[[], None]) -> None:
        """Run ``fn`` eagerly on a side stream, as a capture wants (this call's results)."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)


class Slot:
    """One :class:`Loops` and its graphs (``backend`` None: always eager)."""

    def __init__(self, loops: Loops, backend: Any = None, cache: GraphCache | None = None):
        self.loops, self.backend, self.cache = loops, backend, cache
        self.graphs: dict[str, Any] = {}
        self.busy = False

    @property
    def graphed(self) -> bool:
        return self.backend is not None

    def run(self, which: str) -> None:
        """Run ``loops.<which>_loop``: replay its graph, or warm up and record it, or
        (eager) just call it."""
        fn = getattr(self.loops, f"{which}_loop")
        if self.backend is None:
            fn()
            return
        graph = self.graphs.get(which)
        if graph is not None:
            graph.replay()
            return
        self.backend.warm_up(fn)  # this call's results; compiles the kernels
        try:
            self.graphs[which] = self.backend.record(fn)
        except Exception as err:  # noqa: BLE001  (any capture failure: eager from now on)
            if self.cache is not None:
                self.cache.failed(err)
            self.backend = None


class Lease:
    """Holds a slot busy; frees it when released or when the lease is garbage (an
    autograd graph dropped without a backward)."""

    def __init__(self, slot: Slot):
        self.slot: Slot | None = slot
        slot.busy = True

    def release(self) -> None:
        if self.slot is not None:
            self.slot.busy = False
            self.slot = None

    def __del__(self) -> None:
        self.release()


class GraphCache:
    """Slots per key (see the module docstring)."""

    def __init__(self, capture_after: int = 2, max_slots: int = 32,
                 backend_for: Callable[[torch.device], Any] | None = None):
        self.capture_after, self.max_slots = capture_after, max_slots
        self.backend_for = backend_for or _cuda_backend
        self.seen: dict[Hashable, int] = {}
        self.slots: OrderedDict[int, tuple[Hashable, Slot]] = OrderedDict()  # LRU order
        self.broken = False

    def failed(self, err: Exception) -> None:
        if not self.broken:
            warnings.warn(f"capturing a CUDA graph failed ({type(err).__name__}: {err}); the "
                          "Triton kernels run their loops eagerly from now on", RuntimeWarning,
                          stacklevel=3)
        self.broken = True

    def acquire(self, key: Hashable, make: Callable[[bool], Loops], device: torch.device) -> Slot:
        """A slot for one call (busy until released): a free captured one of this key, a new
        captured one, or an eager one (``make(static)`` builds the loops)."""
        backend = None if self.broken or graphs_setting() == "0" else self.backend_for(device)
        if backend is None:
            return Slot(make(False))
        self.seen[key] = self.seen.get(key, 0) + 1
        for sid, (k, slot) in self.slots.items():
            if k == key and not slot.busy:
                self.slots.move_to_end(sid)
                return slot
        if self.seen[key] < self.capture_after or not self._room():
            return Slot(make(False))
        slot = Slot(make(True), backend, self)
        self.slots[id(slot)] = (key, slot)
        return slot

    def _room(self) -> bool:
        if len(self.slots) < self.max_slots:
            return True
        for sid, (_, slot) in self.slots.items():  # least recently used first
            if not slot.busy:
                del self.slots[sid]
                return True
        return False

    def keys(self) -> list[Hashable]:
        """The keys that have captured slots (most recently used last)."""
        return [k for k, _ in self.slots.values()]

    def clear(self) -> None:
        self.seen.clear()
        self.slots.clear()
        self.broken = False


def _cuda_backend(device: torch.device) -> CudaGraphs | None:
    if device.type != "cuda" or torch.cuda.is_current_stream_capturing():
        return None
    return _BACKEND


_BACKEND = CudaGraphs()
#: the process's cache (tests replace its ``backend_for``)
CACHE = GraphCache()
