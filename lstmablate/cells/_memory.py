"""Shared weighted-sum tracing for cells with a memory cell (eq 8 of Levy et al.).

A cell using :class:`MemoryTraceMixin` implements

    memory_step(xp, state, h_mask) -> (h_t, new_state, write_t, keep_t, content_t)

such that its memory component ``new_state[memory_index]`` equals
``keep_t * memory_{t-1} + write_t * content_t``; its ``step`` is then just
``memory_step`` without the last three values, so the trace and the forward
pass run the same arithmetic.

A cell whose keep gate is σ of a pre-activation with a bias in ``self.bias`` may also declare
:attr:`MemoryTraceMixin.keep_bias`; its ``forget_bias`` option (the initial value of that bias)
is then applied by the mixin's ``reset_parameters``.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor

from .base import State


#: g of h_t = g(c_t), where a cell reads its memory out through an activation
ACTIVATIONS = ("identity", "tanh")


def activate(name: str, memory: Tensor) -> Tensor:
    """g(c_t) for g named in :data:`ACTIVATIONS`: the memory itself, or its tanh."""
    return torch.tanh(memory) if name == "tanh" else memory


class MemoryTraceMixin:
    """``step`` and ``trace_memory`` for cells that define ``memory_step``."""

    #: which state component is the memory cell (c for LSTMs, h for the GRU)
    memory_index: ClassVar[int] = 1
    #: where ``forget_bias`` goes: (k, sign) sets ``bias[k*H:(k+1)*H] = sign * forget_bias``;
    #: sign -1 where the keep gate is σ(-(...)), 1 - z as in the GRU. None: the cell does it
    keep_bias: ClassVar[tuple[int, int] | None] = None

    def reset_parameters(self, init_scale: float | None = None) -> None:
        """The cell's initialisation, then the keep gate's bias = ``forget_bias`` if set."""
        super().reset_parameters(init_scale)  # type: ignore[misc]
        forget_bias = getattr(self, "forget_bias", None)
        if self.keep_bias is not None and forget_bias is not None:
            k, sign = self.keep_bias
            H = self.hidden_size  # type: ignore[attr-defined]
            with torch.no_grad():
                self.bias[k * H:(k + 1) * H].fill_(sign * forget_bias)  # type: ignore[attr-defined]

    @property
    def has_memory_cell(self) -> bool:
        return True

    def memory_step(self, xp: Tensor, state: State, h_mask: Tensor | None):
        raise NotImplementedError

    def step(self, xp: Tensor, state: State, h_mask: Tensor | None) -> tuple[Tensor, State]:
        h, new_state, _, _, _ = self.memory_step(xp, state, h_mask)
        return h, new_state

    def trace_memory(self, x: Tensor, mask: Tensor | None = None) -> dict[str, Tensor]:
        """write/keep/content/memory per step, from the zero (default) initial state."""
        T, B = x.shape[0], x.shape[1]
        state = self.initial_state(B, x)
        xp = self.project_inputs(x)
        H = state[self.memory_index].shape[-1]
        writes, keeps, contents, memories = [], [], [], []
        for t in range(T):
            _, new_state, write, keep, content = self.memory_step(xp[t], state, None)
            if mask is not None:  # padding: nothing written, everything kept
                m = mask[t].unsqueeze(-1).to(x.dtype)
                write, keep = write * m, keep * m + (1 - m)
                new_state = tuple(m * n + (1 - m) * s for n, s in zip(new_state, state))
            state = new_state
            writes.append(write)
            keeps.append(keep)
            contents.append(content)
            memories.append(state[self.memory_index])
        if T == 0:
            empty = x.new_zeros(0, B, H)
            return {"write": empty, "keep": empty, "content": empty, "memory": empty}
        return {"write": torch.stack(writes), "keep": torch.stack(keeps),
                "content": torch.stack(contents), "memory": torch.stack(memories)}
