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
* :class:`GraphCache`: the slots per key (kernel family, layout, T, B, dtype, device, which
  inputs exist: "static shapes" are keys seen before), under a policy meant to make every
  capture pay for itself (docs/design/graphs.md, "CUDA graphs: the capture policy"):

  - a key is captured on its ``capture_after``-th call (default 3): a shape seen once or
    twice (a parser batch of a rare length, the last short batch of an epoch, an
    evaluation pass) stays eager, so its recording, whose cost only replays repay, is not
    paid;
  - the slots are bounded in number (``max_slots``) and in memory (``max_bytes``: by
    default a tenth of the GPU's memory); a new key takes the place of a free slot only if
    it has been seen at least twice as often as that slot's key (the least seen first),
    so a stream of many distinct shapes (NMT, the parser, SQuAD) settles on its most
    frequent ones instead of capturing over and over; a key without room runs eagerly;
  - a capture never synchronizes the device, collects garbage or empties PyTorch's
    allocator cache (what ``torch.cuda.graph`` does on entry): it records on a side stream
    (:meth:`CudaGraphs.record`).

Eager whenever graphs cannot be used: CPU tensors (the interpreter), another capture in
progress, ``LSTMABLATE_CUDA_GRAPHS=0``, or a capture that failed once (a warning naming the
kernel and the error; the loops then always run eagerly).  A slot whose loop raised is
dropped (the family falls back: ``interface.KernelFamily._run``).  The recording itself is
the backend's (:class:`CudaGraphs`); tests substitute one that checks, at every replay,
that no buffer was re-bound, which is what a real graph would silently get wrong.
"""

from __future__ import annotations

import contextlib
import warnings
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

import torch
from torch import Tensor

from ..interface import first_line, note_fallback
from ..switches import graphs_setting


class Loops:
    """The buffers and time loops of one call shape (subclasses allocate the buffers and
    define ``forward_loop`` and ``backward_loop``)."""

    def __init__(self, static: bool):
        self.static = static

    def put(self, name: str, value: Tensor | None, like: Tensor | None = None,
            align: bool = False) -> Tensor:
        """Bind the input ``name``: ``value`` (or zeros like ``like`` for None), contiguous.
        Static loops copy it into their own buffer (made on the first ``put``); with
        ``align`` (a matrix only cuBLAS reads: the recurrent weights) that buffer's rows are
        padded to a multiple of 16 bytes, the alignment cuBLAS's tensor-core kernels want
        (a row of 650 float32 is 2,600 bytes), and the input is a view of its first
        columns — the copy a capture makes anyway, so the padding costs nothing per call."""
        if not self.static:  # the kernels index plain row-major memory
            t = value.contiguous() if value is not None else torch.zeros_like(like)
            setattr(self, name, t)
            return t
        buf = getattr(self, name, None)
        src = value if value is not None else like
        if buf is None:
            buf = padded_empty(src, align)
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

    def nbytes(self) -> int:
        """The bytes of the tensors the loops hold (buffers and bound inputs; each storage
        once)."""
        seen: dict[int, int] = {}
        for t in vars(self).values():
            if isinstance(t, Tensor):
                st = t.untyped_storage()
                seen[st.data_ptr()] = st.nbytes()
        return sum(seen.values())


def padded_empty(like: Tensor, align: bool) -> Tensor:
    """An empty tensor of ``like``'s shape, dtype and device; with ``align``, a 2-D one is a
    view of the first columns of rows padded to a multiple of 16 bytes."""
    if not align or like.dim() != 2:
        return torch.empty(like.shape, dtype=like.dtype, device=like.device)
    rows, cols = like.shape
    per = max(1, 16 // like.element_size())  # elements per 16 bytes
    width = -(-cols // per) * per
    return torch.empty(rows, width, dtype=like.dtype, device=like.device)[:, :cols]


class CudaGraphs:
    """Records a loop in a CUDA graph (the recording does not run it).  Each graph has a
    memory pool of its own: the loops allocate nothing while recorded (every buffer is the
    ``Loops``'), so the pools hold only what the libraries take for themselves (cuBLAS's
    workspace), and graphs replayed in any order never share it.

    Recording and warming up run on one side stream (a capture may not run on the default
    stream).  Unlike ``torch.cuda.graph``, nothing synchronizes the device, collects garbage
    or empties the allocator's cache before a capture: the loops allocate nothing while
    recorded, so there is nothing to make room for, and an emptied cache would make every
    later allocation of the training step go back to the driver."""

    def __init__(self):
        self._side: Any = None

    def side(self):
        if self._side is None:
            self._side = torch.cuda.Stream()
        return self._side

    def record(self, fn: Callable[[], None]):
        g = torch.cuda.CUDAGraph()
        side, current = self.side(), torch.cuda.current_stream()
        side.wait_stream(current)
        with torch.cuda.stream(side):
            g.capture_begin(capture_error_mode="thread_local")
            try:
                fn()
            except BaseException:
                with contextlib.suppress(Exception):  # end the broken capture; its error wins
                    g.capture_end()
                raise
            g.capture_end()
        current.wait_stream(side)
        return g

    def warm_up(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` eagerly on the side stream, as a capture wants (this call's results)."""
        side, current = self.side(), torch.cuda.current_stream()
        side.wait_stream(current)
        with torch.cuda.stream(side):
            fn()
        current.wait_stream(side)


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
        (eager) just call it.  A loop that raises (a launch, a replay) drops the slot from
        its cache: its buffers may be half written."""
        try:
            self._run(which)
        except BaseException:
            if self.cache is not None:
                self.cache.discard(self)
            raise

    def _run(self, which: str) -> None:
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
                self.cache.failed(err, self)
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
    """Slots per key under the capture policy of the module docstring."""

    def __init__(self, capture_after: int = 3, max_slots: int = 64, max_bytes: int | None = None,
                 backend_for: Callable[[torch.device], Any] | None = None):
        self.capture_after, self.max_slots, self.max_bytes = capture_after, max_slots, max_bytes
        self.backend_for = backend_for or _cuda_backend
        self.seen: dict[Hashable, int] = {}
        self.sizes: dict[Hashable, int] = {}  # a key's loops, in bytes, when last made
        self.slots: OrderedDict[int, tuple[Hashable, Slot]] = OrderedDict()  # LRU order
        self.broken = False
        self.captures = 0  # slots captured so far (tests, diagnostics)

    def failed(self, err: Exception, slot: Slot | None = None) -> None:
        """A capture failed: warn once (naming the kernel and the error), list it in the
        kernel record, and run every loop eagerly from now on."""
        if not self.broken:
            key = self.key_of(slot)
            family = str(key[0]) if isinstance(key, tuple) and key else "?"
            loops = type(slot.loops).__name__ if slot is not None else "?"
            message = f"{type(err).__name__}: {first_line(err)}"
            note_fallback(family, "cuda-graphs", loops, message)
            warnings.warn(
                f"capturing the CUDA graph of {loops} ({family} cells) failed ({message}); the "
                "Triton kernels run their loops eagerly from now on, with the same numbers. "
                "LSTMABLATE_CUDA_GRAPHS=0 launches them eagerly from the start, "
                "LSTMABLATE_TRITON=0 runs without the Triton kernels.", RuntimeWarning,
                stacklevel=4)
        self.broken = True

    def key_of(self, slot: Slot | None) -> Hashable | None:
        for k, s in self.slots.values():
            if s is slot:
                return k
        return None

    def discard(self, slot: Slot) -> None:
        """Drop ``slot`` (its loop raised)."""
        self.slots.pop(id(slot), None)

    def acquire(self, key: Hashable, make: Callable[[bool], Loops], device: torch.device) -> Slot:
        """A slot for one call (busy until released): a free captured one of this key, a new
        captured one, or an eager one (``make(static)`` builds the loops)."""
        backend = None if self.broken or graphs_setting() == "0" else self.backend_for(device)
        if backend is None:
            return Slot(make(False))
        seen = self.seen[key] = self.seen.get(key, 0) + 1
        for sid, (k, slot) in self.slots.items():
            if k == key and not slot.busy:
                self.slots.move_to_end(sid)
                return slot
        if seen < self.capture_after or not self._room(seen, self.sizes.get(key, 0), device):
            loops = make(False)
            self.sizes[key] = loops.nbytes()
            return Slot(loops)
        slot = Slot(make(True), backend, self)
        self.slots[id(slot)] = (key, slot)
        self.sizes[key] = slot.loops.nbytes()
        self.captures += 1
        return slot

    def budget(self, device: torch.device) -> float:
        """The bytes the captured slots may hold: ``max_bytes``, else a tenth of the GPU's
        memory (unbounded off CUDA, where only tests capture)."""
        if self.max_bytes is not None:
            return self.max_bytes
        if device.type != "cuda":
            return float("inf")
        return torch.cuda.get_device_properties(device).total_memory / 10

    def used(self) -> int:
        return sum(slot.loops.nbytes() for _, slot in self.slots.values())

    def _room(self, seen: int, need: int, device: torch.device) -> bool:
        """Make room for a new slot of ``need`` bytes whose key has been seen ``seen``
        times: drop free slots whose keys were seen at most half as often (the least seen
        first, then the least recently used); False when that is not enough."""
        budget = self.budget(device)
        while len(self.slots) >= self.max_slots or self.used() + need > budget:
            free = [(self.seen.get(k, 0), i, sid) for i, (sid, (k, slot))
                    in enumerate(self.slots.items()) if not slot.busy]
            if not free:
                return False
            count, _, sid = min(free)
            if 2 * count > seen:
                return False
            del self.slots[sid]
        return True

    def keys(self) -> list[Hashable]:
        """The keys that have captured slots (most recently used last)."""
        return [k for k, _ in self.slots.values()]

    def clear(self) -> None:
        self.seen.clear()
        self.sizes.clear()
        self.slots.clear()
        self.broken = False
        self.captures = 0


def _cuda_backend(device: torch.device) -> CudaGraphs | None:
    if device.type != "cuda" or torch.cuda.is_current_stream_capturing():
        return None
    return _BACKEND


_BACKEND = CudaGraphs()
#: the process's cache (tests replace its ``backend_for``)
CACHE = GraphCache()
