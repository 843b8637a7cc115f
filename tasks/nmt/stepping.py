"""How one decoding step of beam search and greedy search is computed (``eval.step_capture``):
the input-feeding decoder step (``NMTModel.decode_step``: embedding, the decoder's recurrent
step on [E y_{t-1}; h̃_{t-1}], global attention, h̃_t) and the generator's log-softmax, as one
call ``step(y, state, mem) -> (log-probabilities, attention, next state)``.  The search's
rules (:mod:`.search`) are the same whichever computes it.

* ``off`` (the default): the model's own methods, eagerly, one launch per operator;
* ``compile``: the step through ``torch.compile`` (inductor, static shapes), one compiled
  graph per shape: (rows = sentences x beam, source-length bucket);
* ``graphs`` (CUDA): the step recorded once per shape in a CUDA graph and replayed, the new
  word, the state and (once per batch) the memory copied into its static inputs.

Shapes: a split's batches have as many source lengths as batches (they are sorted by length),
so with ``compile`` and ``graphs`` the memory (h_s and its mask) is padded to one of at most
:data:`DECODE_BUCKETS` source lengths chosen from the split's batches
(``train.buckets.choose_buckets``: the least padding); the padded positions are masked out of
the attention (a_t(s) = 0 there, exactly), and the attention handed back to the search is cut
to the batch's own length.  At most :data:`DECODE_SLOTS` shapes are compiled or recorded; any
other runs eagerly, and a compilation or recording that fails is one warning line and eager
steps from then on (``train.capture.StepCache``).  Decoding runs in eval mode, so no random
number is drawn and a replayed step computes what the eager step computes, to the rounding of
another order of the same sums.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from lstmablate.train.buckets import bucket_for, pad_to
from lstmablate.train.capture import (COMPILE_OPTIONS, StepCache, compile_limit, recoverable,
                                      shape_key)

from .model import DecoderState, Memory

__all__ = ["STEP_CAPTURES", "DECODE_BUCKETS", "DECODE_SLOTS", "DecodeStep", "eager_step"]

STEP_CAPTURES = ("off", "compile", "graphs")
#: source-length buckets per split, at most
DECODE_BUCKETS = 8
#: shapes compiled or recorded, at most (a split's last batch has fewer rows than the others)
DECODE_SLOTS = 2 * DECODE_BUCKETS

Step = Callable[[Tensor, DecoderState, Memory], tuple[Tensor, Tensor, DecoderState]]


def eager_step(model: Any) -> Step:
    """The step as the model computes it: ``decode_step`` then ``log_probs``."""
    def step(y: Tensor, state: DecoderState, mem: Memory):
        out, align, state = model.decode_step(y, state, mem)
        return model.log_probs(out), align, state
    return step


def _step(model, y: Tensor, feed: Tensor, memory: Tensor, mask: Tensor, *rnn: Tensor):
    """What is compiled or recorded: one step from tensors to tensors (no dropout masks: eval
    mode has none)."""
    out, align, state = model.decode_step(y, DecoderState(tuple(rnn), feed, None),
                                          Memory(memory, mask, ()))
    return (model.log_probs(out), align, state.input_feed, *state.rnn)


def _no_masks(masks: Any) -> bool:
    """Does the state carry no dropout mask (eval mode: None, or a StepMasks of Nones)?"""
    if masks is None:
        return True
    return all(m is None for m in [*getattr(masks, "recurrent", [1]),
                                   *getattr(masks, "between", [])])


class DecodeStep:
    """``step(y, state, mem)`` computed eagerly, compiled or replayed (module doc).
    ``buckets``: the source lengths the memory is padded to (``off`` pads too when given
    buckets: the padding's own check)."""

    def __init__(self, model: Any, mode: str = "off", buckets: tuple[int, ...] = (),
                 slots: int = DECODE_SLOTS):
        if mode not in STEP_CAPTURES:
            raise ValueError(f"eval.step_capture must be one of {', '.join(STEP_CAPTURES)}, "
                             f"got {mode!r}")
        self.model, self.mode, self.buckets = model, mode, tuple(buckets)
        self.device = next(model.parameters()).device
        self.note: str | None = None
        if mode == "graphs" and self.device.type != "cuda":
            self.note = ("eval.step_capture=graphs: the decoding steps run eagerly (CUDA "
                         "graphs need a CUDA device)")
            warnings.warn(self.note + ".", RuntimeWarning, stacklevel=2)
            self.mode, self.buckets = "off", ()
        self.cache = StepCache(self.mode, max_slots=slots, capture_after=1)
        self._eager = eager_step(model)
        self._compiled: Callable | None = None
        self._mem_src: Memory | None = None
        self._mem: Memory | None = None

    def memory(self, mem: Memory) -> Memory:
        """``mem`` with h_s and its mask padded to its source-length bucket (once per batch:
        the search hands the same memory to every step)."""
        if mem is not self._mem_src:
            S = mem.memory.shape[1]
            target = bucket_for(S, self.buckets) if self.buckets else None
            self._mem = mem if target is None or target == S else Memory(
                pad_to(mem.memory, 1, target, 0.0), pad_to(mem.mask, 1, target, False),
                mem.enc_state)
            self._mem_src = mem
        return self._mem

    def __call__(self, y: Tensor, state: DecoderState, mem: Memory
                 ) -> tuple[Tensor, Tensor, DecoderState]:
        S = mem.memory.shape[1]
        padded = self.memory(mem)
        if self.mode == "off":
            lp, align, nxt = self._eager(y, state, padded)
            return lp, align[:, :S], nxt
        args = (y, state.input_feed, padded.memory, padded.mask, *state.rnn)
        key = shape_key(*args)
        how = self.cache.plan(key) if _no_masks(state.masks) else "eager"
        if how != "eager":
            try:
                outs = self._compiled_step(key, how, args)
            except Exception as err:  # noqa: BLE001  (any failure: eager from now on)
                if not recoverable(err):
                    raise
                self.cache.fail(err, "compilation" if self.mode == "compile"
                                else "CUDA-graph capture")
                how = "eager"
        if how == "eager":
            lp, align, nxt = self._eager(y, state, mem)
            return lp, align, nxt
        lp, align, feed, *rnn = outs
        return lp, align[:, :S], DecoderState(tuple(rnn), feed, state.masks)

    def _compiled_step(self, key, how: str, args: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        if self.mode == "compile":
            if self._compiled is None:
                self._compiled = torch.compile(_step, dynamic=False, options=COMPILE_OPTIONS)
            with compile_limit(self.cache.max_slots):
                outs = self._compiled(self.model, *args)
            if how == "capture":
                self.cache.store(key, True)
            return outs
        if how == "capture":
            self.cache.store(key, GraphStep.record(lambda *a: _step(self.model, *a), args))
        return self.cache.slots[key].replay(args)

    def record(self) -> dict[str, Any]:
        """What it did (captures, replays, eager steps, a fallback)."""
        return dict(self.cache.record(), buckets=list(self.buckets), note=self.note)


class GraphStep:
    """One shape's decoding step recorded as a CUDA graph: static inputs, the graph, static
    outputs (cloned at each replay: the search keeps some of them across steps)."""

    def __init__(self, graph, static: list[Tensor], outputs: tuple[Tensor, ...]):
        self.graph, self.static, self.outputs = graph, static, outputs
        self.sources: list[Tensor | None] = [None] * len(static)

    @classmethod
    def record(cls, fn: Callable[..., tuple[Tensor, ...]], args: tuple[Tensor, ...]
               ) -> GraphStep:
        static = [a.clone() for a in args]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up outside the graph (PyTorch's recipe)
            for _ in range(2):
                fn(*static)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            outputs = fn(*static)
        return cls(graph, static, tuple(outputs))

    def replay(self, args: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        for i, (dst, src) in enumerate(zip(self.static, args)):
            # (y, feed, memory, mask, *rnn): the memory and its mask once per batch
            if i not in (2, 3) or src is not self.sources[i]:
                dst.copy_(src, non_blocking=True)
                self.sources[i] = src
        self.graph.replay()
        return tuple(o.clone() for o in self.outputs)
