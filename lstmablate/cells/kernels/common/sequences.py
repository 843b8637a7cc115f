"""What every hand-written kernel does around its loops: the rows each time step runs (the
packed layout, :class:`Steps`), the input products of all steps at once and their gradients.

**Padding-free loops** (the encoder's masks are *prefix* masks: each sequence is real up to
its length; ``call.mask_kind`` classifies the mask before).  A call's rows are sorted
by length, longest first, once per call, so the sequences still running at step t are the
first ``rows(t)`` rows: the active batch shrinks step by step as sequences end, as in
PyTorch's packed sequence.  Every buffer of the loops holds only real tokens, step after
step (the *packed* layout, :class:`Steps`): step t's rows are ``off[t] .. off[t+1]``, and
the state buffers hold the B initial rows first, then step t's states at
``B + off[t]``.  The products, the element-wise work, the input products before the loop and
the weight gradients after it all run over real tokens only, and the buffers kept for the
backward hold nothing else.  A sequence's final state is its state after its last real step
(its initial state for length 0); outputs at padding are exactly zero and padding gets no
gradient, so outputs, final states and all gradients are those of the reference loop (which
carries the state through padding unchanged).  Without padding the layout is the plain
time-major one (``off[t] = t B``) and nothing is copied or sorted.

The backward direction of a bidirectional encoder reads each sequence reversed within its
own length (``encoder.reverse_padded``), so it too starts each sequence at its own last token
and is a prefix mask here.  A mask that is not a prefix mask (holes) makes the dispatch take
the reference loop.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .gemm import TORCH, Products


class Steps:
    """The packed layout of one call: which rows each time step runs.

    ``T``: the steps that run (the longest length; the call's own length without padding);
    ``B``: the batch; ``N``: the real tokens (rows of every per-step buffer); ``off``: the
    T+1 row offsets (``off[t]``: step t's first row; ``rows(t) = off[t+1] - off[t]``, never
    increasing); ``order``: the batch rows by length, longest first (None without padding:
    then nothing is sorted, packed or copied).  Every method takes and returns tensors in
    the caller's row order unless it says *sorted*.
    """

    def __init__(self, T: int, B: int, lengths: Tensor | None, device: torch.device):
        self.T_in, self.B, self.device = T, B, device
        self.order = self.lengths = self._device_steps = None
        if lengths is None:
            self.T = T
            self.off = [t * B for t in range(T + 1)]
        else:
            lengths = lengths.to(device=device, dtype=torch.long)
            sl, order = torch.sort(lengths, descending=True, stable=True)
            host = sl.tolist()
            self.T = host[0] if B else 0
            self.off, k = [0], B
            for t in range(self.T):  # rows(t): the sequences longer than t
                while k and host[k - 1] <= t:
                    k -= 1
                self.off.append(self.off[-1] + k)
            self.order, self.lengths = order, lengths
            self.inverse = torch.empty_like(order)
            self.inverse[order] = torch.arange(B, device=device)
            steps = torch.arange(self.T, device=device).unsqueeze(1)  # (T, 1)
            live = steps < sl.unsqueeze(0)  # (T, B) over the sorted rows: a prefix per step
            #: the flat (t * B + row) position of every packed row in the caller's (T, B) layout
            self.index = (steps * B + order.unsqueeze(0))[live]
            start = torch.tensor(self.off[:-1], device=device)
            # the packed row of each (caller's) row's last real step; -1 for length 0
            pos = self.inverse
            last_t = (lengths - 1).clamp(min=0)
            self.last = torch.where(lengths > 0, start[last_t] + pos, -1) if self.T else \
                torch.full_like(lengths, -1)
        self.N = self.off[-1]

    # -- shapes ----------------------------------------------------------------------------
    @property
    def padded(self) -> bool:
        """Are rows sorted and packed (some sequence is shorter than the call)?"""
        return self.order is not None

    def rows(self, t: int) -> int:
        """The rows step t runs (the sequences longer than t)."""
        return self.off[t + 1] - self.off[t]

    def prev_start(self, t: int) -> int:
        """The first row, in a state buffer, of the state step t reads (h_{t-1})."""
        return 0 if t == 0 else self.B + self.off[t - 1]

    def device_steps(self) -> tuple[Tensor, Tensor]:
        """The step offsets (T+1) and the sorted lengths (B) as int32 tensors on the call's
        device (what a kernel that loops over steps itself reads: the Triton scans)."""
        if self._device_steps is None:
            off = torch.tensor(self.off, dtype=torch.int32, device=self.device)
            lens = (torch.full((self.B,), self.T, dtype=torch.int32, device=self.device)
                    if not self.padded else self.lengths[self.order].to(torch.int32))
            self._device_steps = off, lens
        return self._device_steps

    # -- per-step views (the PyTorch loops) ------------------------------------------------
    def per_step(self, buf: Tensor) -> list[Tensor]:
        """Step t's rows of a per-step buffer (N, ...), one view per step."""
        return [buf[self.off[t]:self.off[t + 1]] for t in range(self.T)]

    def states_in(self, buf: Tensor) -> list[Tensor]:
        """The state each step reads, of a state buffer (B + N, ...): step t's rows of
        h_{t-1} (the first rows(t) rows of the previous step's states)."""
        return [buf[self.prev_start(t):self.prev_start(t) + self.rows(t)] for t in range(self.T)]

    def states_out(self, buf: Tensor) -> list[Tensor]:
        """The state each step writes, of a state buffer (B + N, ...)."""
        return [buf[self.B + self.off[t]:self.B + self.off[t + 1]] for t in range(self.T)]

    # -- into the packed layout ------------------------------------------------------------
    def pack(self, x: Tensor) -> Tensor:
        """(T_in, B, ...) in the caller's layout -> (N, ...) real tokens, packed (a view of
        ``x`` when nothing is padded)."""
        if not self.padded:
            return x.reshape(self.N, *x.shape[2:])
        return x.reshape(self.T_in * self.B, *x.shape[2:]).index_select(0, self.index)

    def sort(self, s: Tensor) -> Tensor:
        """A (B, ...) per-sequence tensor (initial states, recurrent-dropout masks) in the
        sorted row order, contiguous."""
        s = s.expand(self.B, *s.shape[1:]) if s.shape[0] != self.B else s
        return s.index_select(0, self.order) if self.padded else s.contiguous()

    def state_buffer(self, s0: Tensor, dtype: torch.dtype | None = None) -> Tensor:
        """A state buffer (B + N, ...) whose first B rows are ``s0`` (sorted)."""
        buf = s0.new_empty(self.B + self.N, *s0.shape[1:], dtype=dtype)
        buf[:self.B] = self.sort(s0)
        return buf

    def per_row(self, s: Tensor) -> Tensor:
        """(N, ...): for every packed row, its sequence's row of a sorted (B, ...) tensor (a
        recurrent-dropout mask)."""
        if not self.padded:
            return s.expand(self.B, *s.shape[1:]).repeat(self.T, *[1] * (s.dim() - 1))
        return torch.cat([s[:self.rows(t)] for t in range(self.T)]) if self.N else s[:0]

    def prev(self, buf: Tensor) -> Tensor:
        """(N, ...): the state every packed row read, of a state buffer (a view without
        padding, else a gathered copy)."""
        if not self.padded:
            return buf[:self.N]
        return torch.cat(self.states_in(buf)) if self.N else buf[:0]

    # -- out of the packed layout ------------------------------------------------------------
    def unpack(self, y: Tensor) -> Tensor:
        """(N, ...) -> (T_in, B, ...) in the caller's layout, exactly zero at padding (a new
        tensor, never a view of ``y``)."""
        if not self.padded:
            return y.reshape(self.T_in, self.B, *y.shape[1:]).clone()
        out = y.new_zeros(self.T_in * self.B, *y.shape[1:])
        out.index_copy_(0, self.index, y)
        return out.view(self.T_in, self.B, *y.shape[1:])

    def unpacked(self, y: Tensor) -> Tensor:
        """As :meth:`unpack`, but without padding a view of ``y`` (a gradient the caller
        owns, never a buffer the kernels keep)."""
        if not self.padded:
            return y.view(self.T_in, self.B, *y.shape[1:])
        return self.unpack(y)

    def unsort(self, s: Tensor) -> Tensor:
        """A (B, ...) tensor in the sorted order -> the caller's order."""
        return s.index_select(0, self.inverse) if self.padded else s

    def final(self, buf: Tensor) -> Tensor:
        """Each sequence's final state (B, ...) in the caller's order, from a state buffer
        (B + N, ...): the state after its last real step, its initial state for length 0."""
        if not self.padded:
            return buf[self.N:].clone()
        rows = torch.where(self.last >= 0, self.last + self.B, self.inverse)
        return buf.index_select(0, rows)

    def final_rows(self, buf: Tensor, initial: Tensor) -> Tensor:
        """As :meth:`final`, from a per-step buffer (N, ...) and the initial states (B, ...,
        the caller's order: a length-0 sequence's final state)."""
        if not self.padded:
            return buf[self.N - self.B:].clone()
        out = buf.index_select(0, self.last.clamp(min=0))
        empty = (self.last < 0).view(-1, *[1] * (buf.dim() - 1))
        return torch.where(empty, initial.to(out.dtype), out)

    # -- gradients ----------------------------------------------------------------------------
    def grads(self, dout: Tensor | None, dfinal: Tensor | None, like: Tensor
              ) -> tuple[Tensor, Tensor | None]:
        """The gradient of every step's output in the packed layout (N, n), new and
        contiguous, the final state's gradient added at each sequence's last real step.

        ``dout``: (T_in, B, n) or None; ``dfinal``: (B, n) or None; ``like``: a tensor of the
        dtype and device.  Returns it and the part that goes straight to the initial state
        (the rows of length 0, in the caller's order; None when there are none).  The
        gradients of padded outputs are dropped (those outputs are constant zeros)."""
        n = like.shape[-1] if dfinal is None else dfinal.shape[-1]
        if dout is None:
            g = like.new_zeros(self.N, n)
        elif self.padded:
            g = self.pack(dout)
        else:
            g = dout.reshape(self.N, n).clone(memory_format=torch.contiguous_format)
        if dfinal is None:
            return g, None
        if not self.padded:
            if self.N:
                g[self.N - self.B:] += dfinal
            return g, None
        real = self.last >= 0
        if bool(real.all()):
            g.index_add_(0, self.last, dfinal.to(g.dtype))
            return g, None
        g.index_add_(0, self.last[real], dfinal[real].to(g.dtype))
        return g, dfinal * (~real).unsqueeze(-1).to(dfinal.dtype)

    def grad_of_initial(self, sorted_grad: Tensor, shape: torch.Size) -> Tensor:
        """An initial state's gradient in the caller's row order, from the sorted rows'
        (B, n); summed over the rows where the state was given as one row for all (``shape``
        (1, n))."""
        grad = self.unsort(sorted_grad)
        return grad if tuple(shape) == tuple(grad.shape) else grad.sum(0, keepdim=True)

    def initial_grad(self, sorted_grad: Tensor | None, direct: Tensor | None) -> Tensor | None:
        """The gradient of an initial state: the kernel's (sorted) plus ``direct``."""
        if sorted_grad is None:
            return direct
        return add(self.unsort(sorted_grad), direct)


def input_products(x: Tensor, w_ih: Tensor, bias: Tensor | None,
                   out: Tensor | None = None, P: Products = TORCH) -> Tensor:
    """x W_ih^T (+ bias on the first bias.numel() columns) for every row of ``x`` (..., I)
    (into ``out``, a contiguous buffer of the result's shape, when given); ``P``: the
    products of the call (``gemm.for_call``)."""
    x2 = x.reshape(-1, x.shape[-1])
    z = P.linear(x2, w_ih, bias, None if out is None else out.view(x2.shape[0], -1))
    return z.view(*x.shape[:-1], -1)


def input_side_grads(dZ: Tensor, x: Tensor, w_ih: Tensor, bias: Tensor | None, need_x: bool,
                     need_w: bool, need_b: bool, P: Products = TORCH) -> tuple[Tensor | None, ...]:
    """The gradients of the input products' inputs from dZ (..., n*H), the gradient of
    :func:`input_products`'s result: dx = dZ W_ih (x's shape), dW_ih = dZ^T X, db (one
    product each over all rows)."""
    dZ2 = dZ.reshape(-1, dZ.shape[-1])
    dx = P.nn(dZ2, w_ih).view(x.shape) if need_x else None
    dw_ih = P.tn(dZ2, x.reshape(-1, x.shape[-1])) if need_w else None
    db = dZ2[:, :bias.shape[0]].sum(0) if bias is not None and need_b else None
    return dx, dw_ih, db


def add(a: Tensor | None, b: Tensor | None) -> Tensor | None:
    """a + b where either may be missing (None)."""
    if a is None:
        return b
    if b is None:
        return a
    return a + b
