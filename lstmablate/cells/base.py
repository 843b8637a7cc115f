"""The contract every recurrent cell implements.

A :class:`Cell` is ONE layer in ONE direction.  Stacking, bidirectionality,
dropout between layers and the handling of ``lengths`` live in
:mod:`lstmablate.cells.encoder`, so a cell only has to say how it turns a
time-major input sequence into outputs.

The reference implementation here is deliberately plain:

1. ``project_inputs`` computes everything that depends on ``x`` alone, for all
   time steps at once (one matrix product);
2. ``step`` does one time step: the parts that read ``h_{t-1}`` plus the
   element-wise work;
3. ``forward`` loops over time; at padded positions (``mask == 0``) the state is
   carried unchanged and the output is zero, so padding never leaks.

Fast kernels (``lstmablate.cells.kernels``, declared by each class in
``fast_kernels``) run the same computation for whole sequences and are tested
against this loop.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import Tensor, nn

from lstmablate.errors import UserError
from lstmablate.limits import MAX_INIT_SCALE

State = tuple[Tensor, ...]


@dataclass(frozen=True)
class FastKernels:
    """A cell class's declaration of its fast sequence kernels: a kernel family.

    ``target`` names the family object as ``"package.module:NAME"`` (``":KERNELS"`` may be
    left out), e.g. ``"lstmablate.cells.kernels.lstm.family"``; the module is imported
    when such a cell first runs, not before, so importing the cells pulls in no kernel
    code.  The family (a ``lstmablate.cells.kernels.interface.KernelFamily``) declares what
    it reads from the cell and runs whole sequences (see
    ``lstmablate/cells/kernels/interface.py``).

    ``math`` names the methods whose arithmetic the kernel reproduces.  The declaration
    applies to the class that makes it and to subclasses that keep those methods; a
    subclass that overrides one of them computes something else, so it runs the reference
    loop (:meth:`applies_to`).
    """

    target: str
    math: tuple[str, ...] = ("step", "project_inputs")
    owner: type | None = field(default=None, compare=False, repr=False)

    def __set_name__(self, owner: type, name: str) -> None:
        object.__setattr__(self, "owner", owner)

    @property
    def module(self) -> str:
        return self.target.partition(":")[0]

    def load(self):
        """The kernel family (its module imported on first use)."""
        attr = self.target.partition(":")[2] or "KERNELS"
        return getattr(importlib.import_module(self.module), attr)

    def applies_to(self, cell: "Cell") -> bool:
        """Does ``cell`` compute what the declaring class computes (see the class doc)?"""
        return all(getattr(type(cell), m, None) is getattr(self.owner, m, None) for m in self.math)


class NoMemoryCellError(UserError, TypeError):
    """The cell has no memory cell, so it has no weighted-sum view (eq 8)."""


class Cell(nn.Module):
    """One layer, one direction of a recurrent cell (time-major tensors)."""

    #: names of the state components, e.g. ("h", "c"); "h" is always first and
    #: is what the next time step's recurrent products read.
    state_names: ClassVar[tuple[str, ...]] = ("h",)
    #: the class's fast sequence kernel (declared by the class); None: the reference loop only
    fast_kernels: ClassVar[FastKernels | None] = None

    #: (input_size, hidden_size) at which the cell can be built for
    #: introspection (parameter counts, flags); cells that accept only some
    #: sizes (e.g. ``dyck-rnn``) override it.
    example_sizes: ClassVar[tuple[int, int]] = (2, 2)

    #: the allowed range of a numeric constructor option (checked with the option names and
    #: types before any data is read: :meth:`CellSpec.check_options`); a scale or a bias far
    #: outside it saturates every gate, and beyond ~3e38 it is not even a float32
    option_ranges: ClassVar[dict[str, tuple[float, float]]] = {
        "init_scale": (0.0, MAX_INIT_SCALE), "forget_bias": (-100.0, 100.0)}
    #: the allowed values of an option that names a variant (e.g. a QRNN's ``pooling``),
    #: checked with the ranges; the cell's constructor checks the same tuple
    option_choices: ClassVar[dict[str, tuple]] = {}

    def __init__(self, input_size: int, hidden_size: int):
        super().__init__()
        self.input_size = input_size
        self.hidden_size = hidden_size

    # -- what subclasses describe ------------------------------------------
    @property
    def output_size(self) -> int:
        """Size of h_t (what the layer emits)."""
        return self.hidden_size

    @property
    def state_sizes(self) -> tuple[int, ...]:
        """Size of each state component, aligned with :attr:`state_names`."""
        return (self.output_size,)

    @property
    def has_memory_cell(self) -> bool:
        """True if the cell exposes the weighted-sum view (``trace_memory``)."""
        return False

    def project_inputs(self, x: Tensor) -> Tensor:
        """Everything that depends on x alone, for all steps: (T, B, *)."""
        raise NotImplementedError

    def step(self, xp: Tensor, state: State, h_mask: Tensor | None) -> tuple[Tensor, State]:
        """One time step: (projected input, previous state) -> (h_t, new state).

        ``h_mask`` (B, output_size) is the variational recurrent-dropout mask,
        already scaled; it multiplies h_{t-1} where h_{t-1} enters a recurrent
        product, and nowhere else.
        """
        raise NotImplementedError

    def reset_parameters(self, init_scale: float | None = None) -> None:
        """Re-initialise every parameter uniform(±init_scale).

        Without ``init_scale`` the default is ±1/sqrt(hidden_size), as in
        ``torch.nn.LSTM``.  Cells with a special initialisation (a forget-gate
        bias, fixed matrices) override this.
        """
        a = init_scale if init_scale is not None else 1.0 / math.sqrt(self.hidden_size)
        for p in self.parameters():
            nn.init.uniform_(p, -a, a)

    # -- shared machinery ---------------------------------------------------
    def _kernels(self):
        """The kernel family that runs this cell, or None (no fast path declared, or a
        subclass that changed the arithmetic)."""
        k = self.fast_kernels
        return k.load() if k is not None and k.applies_to(self) else None

    def fast_path_available(self) -> bool:
        kernels = self._kernels()
        return kernels is not None and kernels.available(self)

    def initial_state(self, batch: int, like: Tensor) -> State:
        return tuple(like.new_zeros(batch, n) for n in self.state_sizes)

    def forward(
        self,
        x: Tensor,
        state: State | None = None,
        mask: Tensor | None = None,
        h_mask: Tensor | None = None,
    ) -> tuple[Tensor, State]:
        """Run the cell over ``x`` (T, B, input_size).

        ``mask`` (T, B) is 1 for real tokens and 0 for padding.  Returns the
        outputs (T, B, output_size), zero at padding, and the final state,
        which for each sequence is the state after its last real token.
        A fast kernel runs it when the class has one for this call
        (``LSTMABLATE_REFERENCE=1`` / ``lstmablate.cells.reference_mode()`` force the loop).
        """
        kernels = self._kernels()
        if kernels is not None:
            result = kernels.forward(self, x, state, mask, h_mask)
            if result is not None:
                return result
        T, B = x.shape[0], x.shape[1]
        if state is None:
            state = self.initial_state(B, x)
        xp = self.project_inputs(x)
        outputs = []
        for t in range(T):
            h, new_state = self.step(xp[t], state, h_mask)
            if mask is not None:
                m = mask[t].unsqueeze(-1).to(h.dtype)
                new_state = tuple(m * n + (1 - m) * s for n, s in zip(new_state, state))
                h = h * m
            state = new_state
            outputs.append(h)
        if T == 0:
            return x.new_zeros(0, B, self.output_size), state
        return torch.stack(outputs), state

    def trace_memory(
        self, x: Tensor, mask: Tensor | None = None
    ) -> dict[str, Tensor]:
        """Per-step write gate, keep gate and content of the memory cell.

        Returns tensors of shape (T, B, H): ``write`` (i_t), ``keep`` (f_t),
        ``content`` (c~_t) and ``memory`` (c_t), from a zero initial state, such
        that c_t = keep_t * c_{t-1} + write_t * content_t.  Padded steps have
        write 0 and keep 1 (the state is carried).  Only cells with a memory
        cell implement it; see :func:`weighted_sum`.
        """
        raise NoMemoryCellError(
            f"cell {type(self).__name__} has no memory cell, so it has no weighted-sum view"
        )


def weighted_sum(trace: dict[str, Tensor]) -> dict[str, Tensor]:
    """Equation 8 of Levy et al.: c_t = sum_j w_j^t * content_j.

    w_j^t = i_j * prod_{k=j+1..t} f_k for j <= t and 0 for j > t.  Takes the
    output of :meth:`Cell.trace_memory` and returns batch-first tensors:
    ``weights`` (B, T, T, H) indexed [b, t, j], ``content`` (B, T, H) and
    ``memory`` (B, T, H).
    """
    write, keep, content = trace["write"], trace["keep"], trace["content"]
    T = write.shape[0]
    rows = []
    w = write.new_zeros((0,) + write.shape[1:])  # weights of steps 0..t-1 at time t-1
    for t in range(T):
        # moving from t-1 to t multiplies every earlier weight by f_t and adds i_t
        w = torch.cat([w * keep[t], write[t].unsqueeze(0)], dim=0)  # (t+1, B, H)
        pad = write.new_zeros((T - t - 1,) + write.shape[1:])
        rows.append(torch.cat([w, pad], dim=0))
    weights = torch.stack(rows).permute(2, 0, 1, 3) if T else write.new_zeros(
        (write.shape[1], 0, 0, write.shape[2]))
    return {
        "weights": weights,
        "content": content.transpose(0, 1),
        "memory": trace["memory"].transpose(0, 1),
    }
