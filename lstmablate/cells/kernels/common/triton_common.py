"""What every Triton kernel here shares: the jit helpers (activations, the writing of h_t,
int64 offsets: ``row_base``), launching (a failure is raised as ``interface.KernelFailure``,
naming the kernel, for the fallback), and the loops' common buffers and binding
(``RecurrentLoops``: the memory cell in float32 for float16 / bfloat16 calls, the recurrent
weights of captured loops in 16-byte rows), used by the families' ``triton_kernels.py``
(``lstm/``, ``gru/`` and ``second_order/``).

Padding-free, as the CPU loops (``sequences.Steps``): the rows of a call are sorted by length
once, every buffer holds real tokens only (the packed layout), and step t launches its
element-wise kernel over the rows(t) sequences still running, its products over those rows
only.  The gradients of the outputs and of the final states enter as one packed buffer
(``Steps.grads``); each backward step adds what it sends back (the product with W_hh, the
carried dc) into the previous step's rows of those buffers, so a step's kernels read
complete gradients.  The scans (one launch per call) run each lane over its own row's
length.  Recurrent dropout: the mask multiplies h_t once, as it is written, for the next
step's product.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..interface import KernelFailure, recoverable
from . import graphs
from .precision import memory_dtype
from .sequences import input_products
from .triton_support import block


@triton.jit
def sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def tanh(x):
    # 1 - 2 / (e^{2x} + 1): e^{2x} -> inf gives 1, -> 0 gives -1 (no overflow)
    return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)


@triton.jit
def emit(hh, H1, HM1, MASK, offs, m, HAS_MASK: tl.constexpr, ACC: tl.constexpr):
    """Write h_t (the state) and, with recurrent dropout, h_t * mask (what the next step's
    product reads)."""
    tl.store(H1 + offs, hh, mask=m)
    if HAS_MASK:
        tl.store(HM1 + offs, hh * tl.load(MASK + offs, mask=m, other=0.0).to(ACC), mask=m)


@triton.jit
def step_base(t, size):
    """The offset of step ``t`` in a time-major buffer of ``size`` elements per step, in
    int64: T x B x nb*H passes 2**31 in long batches (a Billion Word or character-level
    batch), where ``t * size`` in int32 would wrap around to a negative offset."""
    return tl.cast(t, tl.int64) * size


@triton.jit
def row_base(OFF, t, b, size):
    """The offset of row ``b`` of step ``t`` in a packed buffer of ``size`` elements per row
    (``OFF``: the call's step offsets, ``Steps.off``), in int64 (``step_base``): the packed
    rows of a long batch times nb*H pass 2**31 as a padded buffer's steps do."""
    return step_base(tl.load(OFF + t) + b, size)


def acc(dtype: torch.dtype):
    """The dtype the kernels compute in: float64 for float64, else float32."""
    return tl.float64 if dtype == torch.float64 else tl.float32


def launch_grid(kernel, grid: tuple[int, ...], *args, **kwargs) -> None:
    """Launch ``kernel`` (compiled on its first launch); any failure is raised as
    ``interface.KernelFailure`` naming the kernel (what the fallback's warning shows)."""
    try:
        kernel[grid](*args, **kwargs)
    except Exception as err:  # noqa: BLE001  (compile, launcher build, driver: all the same)
        if not recoverable(err):
            raise
        name = getattr(getattr(kernel, "fn", None), "__name__", None) or repr(kernel)
        raise KernelFailure(name, err) from err


def launch(kernel, n: int, *args, **constexprs) -> None:
    """``kernel`` over n elements (BLOCK elements per program)."""
    size = block(n)
    launch_grid(kernel, (triton.cdiv(n, size),), *args, BLOCK=size, **constexprs)


#: the weights only cuBLAS's products read (the Triton kernels index their other inputs as
#: plain row-major memory), whose rows captured loops pad to 16 bytes
CUBLAS_ONLY = frozenset({"w_hh", "w_hr", "w_mh", "w_hm"})


class RecurrentLoops(graphs.Loops):
    """What the loops of every recurrence share (the LSTM family, the GRU, the
    second-order cells subclass it), in the packed layout of one call's ``Steps`` (its
    shape: T steps of ``off``, B rows, N real tokens; part of the loops' key, since a
    captured loop replays its steps' slices).

    ``Z`` (N, width) the input products (+ bias), then what the step kernels write back;
    ``Hs`` (B+N, P) the state h (the B initial rows first, then every step's); ``HM``
    (B+N, P) h * mask (with recurrent dropout: what the products read); ``C`` (B+N, H) the
    memory cell (cells that have one; float32 for float16 / bfloat16 calls,
    :func:`memory_dtype`, as is its gradient); ``G`` (B, P) a product's scratch.  Inputs
    bound per call: the weights, ``mask`` (B, P; sorted), and for the backward ``DH``
    (N, P) and ``DC`` (N, H), the gradients w.r.t. every h_t and c_t (``Steps.grads``),
    completed in place by the backward loop; ``DH0``, ``DC0`` (B, ...): the initial state's.
    """

    def __init__(self, static: bool, steps, H: int, P: int, width: int, like: torch.Tensor,
                 mask: bool, memory: bool):
        super().__init__(static)
        self.T, self.B, self.N, self.off = steps.T, steps.B, steps.N, tuple(steps.off)
        self.H, self.P = H, P
        self.has_mask = mask
        B, N = self.B, self.N
        new = like.new_empty
        self.Z = new(N, width)
        self.Hs, self.G = new(B + N, P), new(B, P)
        self.HM = new(B + N, P) if mask else None
        mem = memory_dtype(like.dtype) if memory else like.dtype
        self.C = new(B + N, H, dtype=mem) if memory else None
        self.DH0 = new(B, P)
        self.DC0 = new(B, H, dtype=mem) if memory else None
        self.dummy = self.G  # passed for pointers a kernel does not read
        self.acc = acc(like.dtype)

    # -- the rows of a step -------------------------------------------------------------------
    def rows(self, t: int) -> int:
        return self.off[t + 1] - self.off[t]

    def step(self, buf: torch.Tensor, t: int) -> torch.Tensor:
        """Step t's rows of a per-step buffer (N, ...)."""
        return buf[self.off[t]:self.off[t + 1]]

    def s_in(self, buf: torch.Tensor, t: int) -> torch.Tensor:
        """The state step t reads, of a state buffer (B+N, ...)."""
        start = 0 if t == 0 else self.B + self.off[t - 1]
        return buf[start:start + self.rows(t)]

    def s_out(self, buf: torch.Tensor, t: int) -> torch.Tensor:
        """The state step t writes, of a state buffer (B+N, ...)."""
        return buf[self.B + self.off[t]:self.B + self.off[t + 1]]

    def grad_in(self, t: int, which: str = "DH") -> torch.Tensor:
        """Where step t sends a gradient back: the previous step's rows of ``DH`` (``DC``),
        or the initial state's (``DH0``, ``DC0``) for step 0 (its first rows(t) rows)."""
        if t == 0:
            return getattr(self, which + "0")[:self.rows(0)]
        return self.step(getattr(self, which), t - 1)[:self.rows(t)]

    # -- binding -------------------------------------------------------------------------------
    def bind(self, X, h0, c0, w_ih, bias, h_mask, **weights) -> None:
        """This call's inputs: ``X`` (N, I) packed, ``h0``, ``c0``, ``h_mask`` (B, ...) sorted."""
        input_products(X, w_ih, bias, out=self.Z)
        self.Hs[:self.B].copy_(h0)
        if self.C is not None:
            self.C[:self.B].copy_(c0)
        for name, w in weights.items():  # (rows padded in captured loops: graphs.Loops.put)
            self.put(name, w, align=name in CUBLAS_ONLY)
        if self.has_mask:
            self.put("mask", h_mask.expand(self.B, self.P))
            torch.mul(self.Hs[:self.B], self.mask, out=self.HM[:self.B])
        else:
            self.mask = self.dummy  # not read (HAS_MASK is off)

    def bind_grads(self, DH, DC=None) -> None:
        self.put("DH", DH)
        if self.C is not None:
            self.put("DC", DC)

    def hprev(self) -> torch.Tensor:
        """h' of every state row, (B+N, P): what the recurrent products read."""
        return self.HM if self.has_mask else self.Hs

    def flags(self) -> dict:
        return dict(HAS_MASK=self.has_mask, ACC=self.acc)

    # -- the backward's products ---------------------------------------------------------------
    def send_back(self, t: int, g: torch.Tensor, w: torch.Tensor, into: str = "DH") -> None:
        """dh_{t-1} += (g w) (times the recurrent-dropout mask): step t's product back into
        the rows of the state it read."""
        target = self.grad_in(t, into)
        n = g.shape[0]
        if self.has_mask:
            torch.mm(g, w, out=self.G[:n])
            target.addcmul_(self.G[:n], self.mask[:n])
        else:
            target.addmm_(g, w)

    def start_backward(self) -> None:
        self.DH0.zero_()
        if self.DC0 is not None:
            self.DC0.zero_()

    def initial_grads(self):
        """dh_0 (and dc_0) after the backward loop, in the sorted order (zero for rows of
        length 0; ``Steps.initial_grad`` adds the final states' gradients of those)."""
        return self.DH0.clone(), self.DC0.clone() if self.DC0 is not None else None


def run_loops(key, make, x: torch.Tensor, ctx, bind) -> graphs.Slot:
    """Acquire the loops of ``key`` (eager or captured), bind this call's inputs, run the
    forward loop; ``ctx`` keeps the slot until its backward (or until it is freed)."""
    slot = graphs.CACHE.acquire(key, make, x.device)
    lease = graphs.Lease(slot)
    bind(slot.loops)
    slot.run("forward")
    ctx.lease = lease if any(ctx.needs_input_grad) else None
    if ctx.lease is None:
        lease.release()
    return slot


def run_grads(ctx, bind_grads):
    """Run the backward loop of the slot ``ctx`` holds; returns its loops (the caller forms
    the weight gradients, then calls ``ctx.lease.release()``)."""
    slot = ctx.lease.slot
    bind_grads(slot.loops)
    slot.run("backward")
    return slot.loops

