"""Cells whose recurrence is element-wise: no matrix ever multiplies the state.

The simpler recurrences Levy et al. cite (QRNN, SRU) and their descendants (minGRU, minLSTM)
keep one memory vector and update it unit by unit,

    c_t = keep_t ∘ c_{t-1} + write_t ∘ content_t,        h_t = readout(c_t),

with every matrix product applied to the inputs only.  :class:`ElementwiseCell` is the
machinery they share; a cell provides

* ``project_inputs(x)``: every matrix product, for all steps at once (the base contract);
* ``scan_terms(xp, state)``: the gates and the content from those products, element-wise, as a
  dict with ``keep``, ``write``, ``content`` (and whatever ``readout`` needs); it works on one
  step's ``xp`` (B, *) and on a whole sequence's (T, B, *) alike;
* ``readout(memory, terms)``: h_t from c_t, element-wise.

``memory_step`` (the reference loop's step, and the weighted-sum trace of eq 8 through
:class:`~lstmablate.cells._memory.MemoryTraceMixin`) is built from these two, so the forward
pass, the step API and the weighted-sum view run one arithmetic.

**Parallel over time.**  Where ``scan_terms`` reads nothing of the state (:attr:`linear_scan`:
QRNN, the 2017 SRU, minGRU, minLSTM), the memory is a first-order linear recurrence whose
coefficients are known before the recurrence starts:

    c_t = (Π_{k<=t} keep_k) ∘ c_0 + Σ_{j<=t} (write_j ∘ Π_{j<k<=t} keep_k) ∘ content_j,

which is Levy et al.'s eq 8 with the initial state as one more term.  :meth:`scan_inputs`
(:meth:`project_inputs`, then :meth:`sequence_terms`) returns keep, write and content of every
step at once (one matrix product), so the shared scan kernel
(``lstmablate/cells/kernels/linear_scan/``) computes every c_t in one element-wise pass over
time (C on CPU, Triton on GPU, and its reverse pass for the backward), then ``readout`` and
``next_state`` of all of them.  A cell declares it as every fast path is declared
(``fast_kernels = FastKernels(SCAN_KERNELS, math=SCAN_MATH)``, docs/plugins.md), naming the
methods whose arithmetic the kernel runs, so a subclass that overrides one of them runs the
reference loop; ``tests/test_kernels_linear_scan.py`` holds every declared case to the
reference loop.  The 2018 SRU reads c_{t-1} in its gates (v ∘ c_{t-1}): still element-wise,
but not a linear scan (the kernel leaves it to the reference loop).

**Recurrent dropout.**  The encoder's ``recurrent_dropout`` multiplies h_{t-1} where it enters
a recurrent product (base.py).  These cells have none (``weight_hh`` is None: no recurrent
matrix), so the mask changes nothing; their papers regularise otherwise (the QRNN's zoneout is
a cell option).
"""

from __future__ import annotations

from typing import ClassVar

from torch import Tensor

from ._memory import MemoryTraceMixin
from .base import Cell, State

#: the shared scan kernel of the linear-scan cells, and the methods whose arithmetic it runs
#: (each cell class declares ``fast_kernels = FastKernels(SCAN_KERNELS, math=SCAN_MATH)``)
SCAN_KERNELS = "lstmablate.cells.kernels.linear_scan.family"
SCAN_MATH = ("project_inputs", "sequence_terms", "scan_terms", "readout", "next_state")


class ElementwiseCell(MemoryTraceMixin, Cell):
    """A memory cell updated element-wise from gates and content (see the module docstring)."""

    #: no recurrent matrix: h_{t-1} enters no product, so recurrent dropout has nothing to mask
    weight_hh = None
    state_names: ClassVar[tuple[str, ...]] = ("h", "c")
    memory_index: ClassVar[int] = 1

    @property
    def state_sizes(self) -> tuple[int, ...]:
        return (self.hidden_size,) * len(self.state_names)

    @property
    def linear_scan(self) -> bool:
        """True if the gates and content depend on the inputs only (a linear recurrence)."""
        return True

    @property
    def log_space(self) -> bool:
        """True where the scan kernel runs the memory on its logarithm (minGRU's and minLSTM's
        ``mode: log``): the cell then gives :meth:`log_terms`, and its memory is positive."""
        return False

    def log_terms(self, xp: Tensor) -> dict[str, Tensor]:
        """``log_keep`` and ``log_value`` (log write_t + log content_t) of every step, from the
        projections alone, element-wise: what the log-space scan takes (:attr:`log_space`)."""
        raise NotImplementedError

    # -- what a cell describes ------------------------------------------------------------
    def scan_terms(self, xp: Tensor, state: State) -> dict[str, Tensor]:
        """``keep``, ``write``, ``content`` (and the readout's terms) from projected inputs."""
        raise NotImplementedError

    def readout(self, memory: Tensor, terms: dict[str, Tensor]) -> Tensor:
        """h_t from the memory c_t and the step's terms."""
        raise NotImplementedError

    def next_state(self, h: Tensor, memory: Tensor, xp: Tensor) -> State:
        """The state after a step: (h, c), or (h,) where the memory is h itself."""
        return (h,) if self.memory_index == 0 else (h, memory)

    # -- shared machinery ---------------------------------------------------------------------
    def memory_step(self, xp: Tensor, state: State, h_mask: Tensor | None):
        """One step: c_t = keep_t ∘ c_{t-1} + write_t ∘ content_t, then h_t = readout(c_t).
        ``h_mask`` is unused: no product reads h_{t-1}."""
        terms = self.scan_terms(xp, state)
        memory = terms["keep"] * state[self.memory_index] + terms["write"] * terms["content"]
        h = self.readout(memory, terms)
        return h, self.next_state(h, memory, xp), terms["write"], terms["keep"], terms["content"]

    @property
    def terms_read_one_step(self) -> bool:
        """True where :meth:`sequence_terms` is :meth:`scan_terms` of every step (a step's
        terms read its own projections and the state before the sequence): then the terms of
        any set of tokens are ``scan_terms`` of their projections, and the scan kernel
        computes them for the real tokens of a padded batch only.  False where a class
        overrides ``sequence_terms`` (the width-2 QRNN's step reads x_{t-1})."""
        return type(self).sequence_terms is ElementwiseCell.sequence_terms

    def sequence_terms(self, xp: Tensor, state: State) -> dict[str, Tensor]:
        """The terms of every step of a sequence at once, each (T, B, H), from its projected
        inputs ``xp`` (T, B, *) and ``state``, the state before its first step (a linear scan
        only: the terms read nothing of the state that changes along the sequence).  By
        default ``scan_terms`` of the whole ``xp``; a cell whose step t reads more than step
        t's projections (the width-2 QRNN) overrides it."""
        return self.scan_terms(xp, state)

    def scan_inputs(self, x: Tensor, state: State | None = None) -> dict[str, Tensor]:
        """The terms of every step of ``x`` (T, B, input_size) at once, each (T, B, H), from
        ``state`` (default: the initial state).  Running ``c_t = keep_t ∘ c_{t-1} + write_t ∘
        content_t`` over them and ``readout`` gives exactly the reference loop's outputs (on
        unpadded sequences; the scan kernel takes each row's state at its own length)."""
        if not self.linear_scan:
            raise TypeError(f"{type(self).__name__}'s gates read the previous memory, so they "
                            "cannot be computed for all steps before the recurrence runs")
        if state is None:
            state = self.initial_state(x.shape[1], x)
        return self.sequence_terms(self.project_inputs(x), state)

