"""Shared weighted-sum tracing for cells with a memory cell (eq 8 of Levy et al.).

A cell using :class:`MemoryTraceMixin` implements

    memory_step(xp, state, h_mask) -> (h_t, new_state, write_t, keep_t, content_t)

such that its memory component ``new_state[memory_index]`` equals
``keep_t * memory_{t-1} + write_t * content_t``; its ``step`` is then just
``memory_step`` without the last three values, so the trace and the forward
pass run the same arithmetic.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor

from .base import State


class MemoryTraceMixin:
    """``step`` and ``trace_memory`` for cells that define ``memory_step``."""

    #: which state component is the memory cell (c for LSTMs, h for the GRU)
    memory_index: ClassVar[int] = 1

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
