"""``train.step_capture``: the training step as one compiled or captured replay per static
shape, so that a GPU's step is not paced by the host's Python and launches.

Modes (``config.STEP_CAPTURES``; ``auto`` is the device's entry of
``config.STEP_CAPTURE_AUTO``, ``off`` on every device until a GPU's measurement says
otherwise: docs/design/graphs.md, "The whole training step"):

* ``off``: every step eagerly, as always;
* ``compile``: the task's forward and loss through ``torch.compile`` (inductor; static shapes,
  one graph per shape), its backward the compiled backward (AOTAutograd); clipping and the
  optimiser step as before.  The recurrent encoders are one opaque operator each
  (``cells/kernels/common/custom_ops.py``): compiling fuses everything around them and never
  traces their fast paths.  Dropout is drawn by PyTorch's own random operators
  (inductor's ``fallback_random``), so a compiled step draws the numbers an eager step draws:
  the two runs agree to rounding, and a resumed run is exact;
* ``graphs`` (CUDA): the whole step -- forward, loss, backward, clipping, the optimiser's
  step -- recorded once per static shape in a CUDA graph and replayed with the batch copied
  into its static inputs (dropout from PyTorch's graph-safe CUDA generator; Adam with
  ``capturable``).  Only where the step reads nothing back to the host (the trainer's
  deferred mode: one process, ``nonfinite: stop``, no TensorBoard) and has no gradient
  scaler (not fp16); elsewhere the steps run eagerly and one line says why.

Which shapes (:class:`StepCache`): in a run, the ``train.capture_slots`` most frequent batch
shapes of the first epoch (:meth:`StepCapture.prepare`: the data decides, not what a process
happened to see first, so a resumed run compiles what the uninterrupted run compiled), each
at its first sighting; every other shape (the last short batch of an epoch, a rare length)
runs eagerly.  Without a plan, a shape is taken on its ``capture_after``-th sighting (default
2), at most ``capture_slots`` of them, with ``graphs`` in place of one seen at most half as
often (its graph's memory is freed).  A change of the optimiser's settings (the learning
rate of a schedule) drops every graph, which is recorded again (:data:`MAX_INVALIDATIONS`
times at most: a rate that changes every step is not captured).

Variable-length tasks pad their batches to a few lengths chosen from the data, through the
task's hooks ``batch_length(batch)`` and ``pad_batch(batch, length)`` (``lstmablate.task.Task``;
padded positions are masked everywhere, so the loss and the gradients do not change), so that
a bounded number of shapes covers an epoch (the buckets: :mod:`lstmablate.train.buckets`).
A batch may vary in one length (the tokens of SST's sentences: ``choose_buckets``, the least
padding, exactly) or in several (NMT's source and target, SQuAD's passage and question:
``choose_grid``, the buckets of each dimension grown one at a time while the sampled batches
fall into at most ``train.capture_slots`` padded shapes).  While a CUDA graph records, the
encoders read no length on the host (``cells.encoder.capturing``: the masked loops).  With
dropout a padded batch draws more random numbers than the unpadded one (dropout at padded
positions, which nothing reads), so a run with buckets follows another random stream than a
run without: the same distribution, and exact on resume, since the buckets are chosen from
the data.

**Never a crash**: a compilation or a recording that fails (any exception but running out of
memory) is one warning line naming the mode and the error; that step and every later one run
eagerly, with the same numbers.  A compiled shape is tried once before it is used (its
forward and backward, the random generators then put back), so a failure inside the
compiled backward is caught there, not in the middle of a training step.
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils import _pytree as pytree

from lstmablate.config import STEP_CAPTURE_AUTO

from .buckets import bucket_for, choose_buckets, choose_grid, pad_to

__all__ = ["COMPILE_OPTIONS", "compile_limit", "StepCache", "StepCapture", "GraphSlot", "resolve",
           "shape_key", "choose_buckets", "choose_grid", "bucket_for", "pad_to"]

#: how often the optimiser's settings may change (each drops every graph) before ``graphs``
#: gives up for the run
MAX_INVALIDATIONS = 64
#: at most this many of the epoch's batches are read to choose the buckets and the shapes
BUCKET_SAMPLE = 512
#: inductor's options for the step: dropout drawn by PyTorch's own random operators, in the
#: order of the graph (no reordering for memory or locality: a random draw that does not
#: read the encoder's output would otherwise move before or after the encoder operator,
#: whose own draws then take other numbers than an eager step's)
COMPILE_OPTIONS = {"fallback_random": True, "reorder_for_peak_memory": False,
                   "reorder_for_locality": False}


def compile_limit(slots: int) -> Any:
    """The context in which a compiled step runs: dynamo may compile it for ``slots`` shapes
    and a few more before it gives up recompiling (``recompile_limit``, called
    ``cache_size_limit`` before PyTorch 2.6)."""
    name = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") \
        else "cache_size_limit"
    return torch._dynamo.config.patch(**{name: slots + 4})


def resolve(mode: str, device: torch.device | str) -> str:
    """``auto`` -> the device type's default (``config.STEP_CAPTURE_AUTO``); else ``mode``."""
    if mode != "auto":
        return mode
    return STEP_CAPTURE_AUTO.get(torch.device(device).type, "off")


# ---------------------------------------------------------------------------------------
# which shapes: the cache
# ---------------------------------------------------------------------------------------

class StepCache:
    """Which static shapes (keys) are compiled or captured, whatever does it: a key is
    captured on its ``capture_after``-th sighting if one of ``max_slots`` slots is free (with
    ``evicts``, one whose key was seen at most half as often is freed for it); a new
    ``stamp`` (the settings a capture bakes in) drops every slot; :meth:`fail` turns it off for
    good, with one warning line."""

    def __init__(self, mode: str, max_slots: int = 8, capture_after: int = 2,
                 evicts: bool = False, max_invalidations: int = MAX_INVALIDATIONS):
        self.mode, self.max_slots, self.capture_after = mode, max_slots, capture_after
        self.evicts, self.max_invalidations = evicts, max_invalidations
        #: the batch shapes chosen from the data (:meth:`allow`); None: decided by sightings
        self.allowed: frozenset | None = None
        self.seen: Counter = Counter()
        self.slots: dict[Hashable, Any] = {}
        self.stamp: Any = None
        self.broken: str | None = None
        self.captures = self.replays = self.eager = self.invalidations = self.evictions = 0

    def allow(self, shapes: Sequence[Hashable]) -> None:
        """Capture exactly these batch shapes, each at its first sighting, and never another:
        a decision that depends on the data alone, not on what this process saw before (so
        a resumed run compiles the steps the uninterrupted run compiled)."""
        self.allowed = frozenset(shapes)

    def plan(self, key: Hashable, stamp: Any = None, shape: Hashable = None) -> str:
        """``"replay"`` (a slot holds the key), ``"capture"`` (make one now) or ``"eager"``;
        ``shape``: the batch's shape, where :meth:`allow` chose the shapes."""
        if self.broken is None and stamp != self.stamp:
            if self.slots:  # what the slots baked in changed: record them again
                self.invalidations += 1
                self.slots.clear()
                if self.invalidations > self.max_invalidations:
                    self.fail(RuntimeError(
                        f"the optimiser's settings changed {self.invalidations} times (a "
                        "learning rate set at every step?); each change records every graph "
                        "again"), "capture")
            self.stamp = stamp
        if self.broken is not None:
            self.eager += 1
            return "eager"
        self.seen[key] += 1
        if key in self.slots:
            self.replays += 1
            return "replay"
        if self.allowed is not None:
            chosen = shape in self.allowed
        else:
            chosen = self.seen[key] >= self.capture_after and self._room(key)
        if not chosen:
            self.eager += 1
            return "eager"
        return "capture"

    def _room(self, key: Hashable) -> bool:
        if len(self.slots) < self.max_slots:
            return True
        if not self.evicts:
            return False
        count, victim = min((self.seen[k], k) for k in self.slots)
        if 2 * count > self.seen[key]:
            return False
        del self.slots[victim]
        self.evictions += 1
        return True

    def store(self, key: Hashable, slot: Any) -> None:
        self.slots[key] = slot
        self.captures += 1

    def fail(self, err: BaseException, what: str) -> None:
        """Turn capturing off for good, with one warning line (once)."""
        if self.broken is not None:
            return
        self.broken = f"{what}: {type(err).__name__}: {first_line(err)}"
        self.slots.clear()
        warnings.warn(f"train.step_capture={self.mode}: the {what} failed "
                      f"({type(err).__name__}: {first_line(err)}); the training steps run "
                      "eagerly from now on, with the same numbers.", RuntimeWarning,
                      stacklevel=3)

    def record(self) -> dict[str, Any]:
        """What it did (a run's env.json, gpu-check's rows)."""
        return dict(mode=self.mode, captures=self.captures, replays=self.replays,
                    eager=self.eager, invalidations=self.invalidations,
                    evictions=self.evictions, shapes=len(self.seen), fallback=self.broken)


def first_line(err: BaseException) -> str:
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    return lines[0] if lines else "(no message)"


def recoverable(err: BaseException) -> bool:
    """Any exception but running out of memory (another way needs memory too)."""
    oom = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)
    return isinstance(err, Exception) and not isinstance(err, oom)


def shape_key(*trees: Any, device: bool = True) -> Hashable:
    """A static shape: the structure of ``trees`` and every tensor's shape, dtype (and
    device) (other leaves by value: a number baked into a compiled graph)."""
    leaves, spec = pytree.tree_flatten(trees)
    return (str(spec), tuple(
        (tuple(t.shape), t.dtype) + ((t.device.type,) if device else ()) if isinstance(t, Tensor)
        else (type(t).__name__, t if isinstance(t, (int, float, bool, str)) or t is None
              else id(t)) for t in leaves))


def _rng_state(device: torch.device) -> tuple:
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda


def _set_rng_state(state: tuple, device: torch.device) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


# ---------------------------------------------------------------------------------------
# the trainer's handle
# ---------------------------------------------------------------------------------------

class StepCapture:
    """What the trainer asks: :meth:`pad` (a batch padded to its bucket), :meth:`loss` (the
    forward, compiled with ``compile``) and :meth:`step` (the whole step replayed with
    ``graphs``; None: the trainer runs it).  ``why_not``: why ``graphs`` cannot capture
    this run's steps (None: it can)."""

    def __init__(self, mode: str, task: Any, device: torch.device, optimizer: Any = None, *,
                 slots: int = 8, capture_after: int = 2, why_not: str | None = None):
        self.requested = mode
        self.mode = resolve(mode, device)
        self.task, self.device, self.optimizer = task, torch.device(device), optimizer
        self.buckets: tuple[int, ...] = ()
        self.note: str | None = None
        if self.mode == "graphs" and (self.device.type != "cuda" or why_not):
            self.note = (f"train.step_capture=graphs: the steps run eagerly "
                         f"({why_not or 'CUDA graphs need a CUDA device'})")
            warnings.warn(self.note + ".", RuntimeWarning, stacklevel=2)
            self.mode = "off"
        self.cache = StepCache(self.mode, max_slots=slots, capture_after=capture_after,
                               evicts=self.mode == "graphs")
        self._compiled: Callable | None = None
        self.make_capturable()

    @property
    def on(self) -> bool:
        return self.mode in ("compile", "graphs")

    def make_capturable(self) -> None:
        """``graphs``: the optimiser's step counts on the device (Adam's ``capturable``; a
        resumed state's counts moved there), so that its step can be recorded."""
        if self.mode != "graphs" or self.optimizer is None:
            return
        for group in self.optimizer.param_groups:
            if "capturable" not in group:
                continue
            group["capturable"] = True
            for p in group["params"]:
                state = self.optimizer.state.get(p, {})
                step = state.get("step")
                if isinstance(step, Tensor) and step.device != p.device:
                    state["step"] = step.to(p.device, torch.float32)

    # -- buckets -------------------------------------------------------------------------
    def prepare(self, plan: Sequence[Any], max_buckets: int | None = None) -> tuple[int, ...]:
        """Choose from an epoch's plan (the first one: a resumed run chooses as the run did;
        at most :data:`BUCKET_SAMPLE` of its batches are read) the length buckets, where the
        task pads (its ``batch_length`` and ``pad_batch`` hooks), and the batch shapes to
        compile or capture: the ``train.capture_slots`` most frequent (after padding), each
        at its first sighting; every other shape runs eagerly."""
        if not self.on or not len(plan):
            return self.buckets
        n = len(plan)
        picks = sorted({i * n // min(n, BUCKET_SAMPLE) for i in range(min(n, BUCKET_SAMPLE))})
        batches = [plan[i] for i in picks]
        lengths = [_length(self.task, b) for b in batches]
        if lengths and all(n is not None for n in lengths):
            limit = max_buckets or self.cache.max_slots
            self.buckets = (choose_buckets(lengths, limit) if isinstance(lengths[0], int)
                            else choose_grid(lengths, limit))
            batches = [self.pad(b) for b in batches]
        counts = Counter(shape_key(b, device=False) for b in batches)
        self.cache.allow([k for k, _ in counts.most_common(self.cache.max_slots)])
        return self.buckets

    def pad(self, batch: Any) -> Any:
        """The batch padded to its bucket (unchanged without buckets, or longer than all in
        some dimension: it runs eagerly)."""
        if not self.buckets:
            return batch
        length = _length(self.task, batch)
        if isinstance(length, int):
            target = bucket_for(length, self.buckets)
        else:
            each = tuple(bucket_for(n, b) for n, b in zip(length, self.buckets))
            target = None if None in each else each
        return batch if target is None or target == length else self.task.pad_batch(batch,
                                                                                     target)

    # -- compile ---------------------------------------------------------------------------
    def loss(self, model: torch.nn.Module, batch: Any, carry: Any):
        """The task's loss on ``batch``: compiled (``compile``, a shape seen before), else
        eagerly."""
        if self.mode != "compile":
            return self.task.loss(model, batch, carry)
        key = (shape_key(batch, carry), model.training)
        how = self.cache.plan(key, shape=shape_key(batch, device=False))
        if how == "eager":
            return self.task.loss(model, batch, carry)
        if how == "capture":
            try:
                self._trial(model, batch, carry)
            except Exception as err:  # noqa: BLE001  (any failure of compiling: eager)
                if not recoverable(err):
                    raise
                self.cache.fail(err, "compilation")
                return self.task.loss(model, batch, carry)
            self.cache.store(key, True)
        try:
            return self._call(model, batch, carry)
        except Exception as err:  # noqa: BLE001
            if not recoverable(err):
                raise
            self.cache.fail(err, "compiled step")
            return self.task.loss(model, batch, carry)

    def _call(self, model, batch, carry):
        from lstmablate.task import StepOutput

        if self._compiled is None:
            self._compiled = torch.compile(_forward, dynamic=False, options=COMPILE_OPTIONS)
        with compile_limit(self.cache.max_slots):
            loss, carry, weight, logged, tokens = self._compiled(self.task, model, batch, carry)
        return StepOutput(loss, carry, weight=weight, logged=logged, tokens=tokens)

    def _trial(self, model, batch, carry) -> None:
        """Compile a new shape's forward and backward on this batch (nothing of it is kept:
        no gradient is accumulated, the random generators are put back)."""
        state = _rng_state(self.device)
        try:
            out = self._call(model, batch, carry)
            params = [p for p in model.parameters() if p.requires_grad]
            if out.loss.requires_grad and params:
                torch.autograd.grad(out.loss, params, allow_unused=True)
        finally:
            _set_rng_state(state, self.device)

    # -- graphs ----------------------------------------------------------------------------
    def stamp(self) -> tuple:
        """What a recorded step bakes in besides shapes: the optimiser's settings."""
        if self.optimizer is None:
            return ()
        return tuple(tuple(sorted((k, v) for k, v in g.items() if k != "params"
                                  and isinstance(v, (int, float, bool, str, tuple))))
                     for g in self.optimizer.param_groups)

    def step(self, body: Callable[[Any, Any], tuple], batch: Any, carry: Any) -> tuple | None:
        """``graphs``: the whole step ``body(batch, carry)`` (forward, backward, clipping, the
        optimiser's step; returns tensors) replayed or recorded; None: run it eagerly."""
        if self.mode != "graphs":
            return None
        key = shape_key(batch, carry)
        how = self.cache.plan(key, self.stamp(), shape=shape_key(batch, device=False))
        if how == "eager":
            return None
        if how == "replay":
            try:
                return self.cache.slots[key].replay(batch, carry)
            except Exception as err:  # noqa: BLE001
                if not recoverable(err):
                    raise
                self.cache.fail(err, "replay")
                return None
        result = body(batch, carry)  # this batch's step, eagerly (and the warm-up)
        try:
            slot = GraphSlot.record(body, batch, carry, self.optimizer, self.device)
        except Exception as err:  # noqa: BLE001  (any failure of recording: eager)
            if not recoverable(err):
                raise
            self.cache.fail(err, "CUDA-graph capture")
            return result
        self.cache.store(key, slot)
        return result

    def record(self) -> dict[str, Any]:
        return dict(self.cache.record(), requested=self.requested, buckets=list(self.buckets),
                    note=self.note)


def _length(task: Any, batch: Any) -> int | tuple[int, ...] | None:
    """The task's ``batch_length(batch)`` (an int, a tuple of ints, or None: no padding)."""
    hook = getattr(task, "batch_length", None)
    n = hook(batch) if callable(hook) else None
    if n is None:
        return None
    return int(n) if isinstance(n, (int, np.integer)) or (isinstance(n, Tensor) and
                                                          n.dim() == 0) \
        else tuple(int(x) for x in n)


def _forward(task, model, batch, carry):
    """What ``compile`` compiles: the task's loss, as a tuple."""
    out = task.loss(model, batch, carry)
    return out.loss, out.carry, out.weight, out.logged, out.tokens


class GraphSlot:
    """One shape's recorded step: its static inputs (a copy of a batch and carry), the graph,
    and its outputs (static: each replay rewrites them)."""

    def __init__(self, graph, batch, carry, outputs):
        self.graph, self.batch, self.carry, self.outputs = graph, batch, carry, outputs

    @classmethod
    def record(cls, body, batch, carry, optimizer, device) -> GraphSlot:
        static_batch = pytree.tree_map(lambda t: t.clone() if isinstance(t, Tensor) else t,
                                       batch)
        static_carry = pytree.tree_map(lambda t: t.clone() if isinstance(t, Tensor) else t,
                                       carry)
        torch.cuda.synchronize(device)
        if optimizer is not None:
            optimizer.zero_grad(set_to_none=True)  # the gradients: the graph's own memory
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            outputs = body(static_batch, static_carry)
        return cls(graph, static_batch, static_carry, outputs)

    def replay(self, batch, carry) -> tuple:
        for dst, src in zip(pytree.tree_leaves(self.batch), pytree.tree_leaves(batch)):
            if isinstance(dst, Tensor) and dst is not src:
                dst.copy_(src, non_blocking=True)
        for dst, src in zip(pytree.tree_leaves(self.carry), pytree.tree_leaves(carry)):
            if isinstance(dst, Tensor) and dst is not src:
                dst.copy_(src, non_blocking=True)
        self.graph.replay()
        return self.outputs
