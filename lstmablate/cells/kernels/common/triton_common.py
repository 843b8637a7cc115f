"""What every Triton kernel here shares: the jit helpers (activations, padding, the
writing of h_t, the assembling of dh_t, int64 offsets of a step: ``step_base``), launching
(a failure is raised as ``interface.KernelFailure``, naming the kernel, for the fallback),
and the loops' common buffers and binding (``RecurrentLoops``: the memory cell in float32
for float16 / bfloat16 calls, the recurrent weights of captured loops in 16-byte rows),
used by the families' ``triton_kernels.py`` (``lstm/``, ``gru/`` and ``second_order/``).

Padding (prefix masks: the encoder reverses each sequence within its length for the
backward direction, so both directions are prefix masks here): the forward kernels carry
a row's state unchanged through its padding and write zero outputs there, so the final
state needs no gather; backward, padded steps get no gradient and the final state's
gradient enters at the row's last real step (a length-0 row passes it straight to the
initial state).  Recurrent dropout: the mask multiplies h_t once, as it is written, for the
next step's product.
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
def live_rows(LEN, b, m, t, HAS_LEN: tl.constexpr):
    """Which elements' sequences are still real at step t (all, without lengths)."""
    if HAS_LEN:
        return m & (t < tl.load(LEN + b, mask=m, other=0))
    return m


@triton.jit
def last_rows(LEN, b, m, t, T, HAS_LEN: tl.constexpr):
    """Which elements' sequences end at step t (where the final state's gradient enters)."""
    if HAS_LEN:
        return m & (t == tl.load(LEN + b, mask=m, other=0) - 1)
    return m & (t == T - 1)


@triton.jit
def emit(hh, H0, H1, HM1, OUT, MASK, offs, m, live, HAS_MASK: tl.constexpr,
         HAS_LEN: tl.constexpr, ACC: tl.constexpr):
    """Write h_t: the state (the previous one carried through padding), the output (zero at
    padding) and, with recurrent dropout, h_t * mask (what the next product reads)."""
    h = hh
    if HAS_LEN:
        h = tl.where(live, hh, tl.load(H0 + offs, mask=m, other=0.0).to(ACC))
        tl.store(OUT + offs, tl.where(live, hh, 0.0), mask=m)
    else:
        tl.store(OUT + offs, hh, mask=m)
    tl.store(H1 + offs, h, mask=m)
    if HAS_MASK:
        tl.store(HM1 + offs, h * tl.load(MASK + offs, mask=m, other=0.0).to(ACC), mask=m)


@triton.jit
def grad_h(DOUT, DHN, G, MASK, CARRY, offs, m, live, last, HAS_MASK: tl.constexpr,
           HAS_CARRY: tl.constexpr, ACC: tl.constexpr):
    """dh_t: the output's gradient (none at padding), the final state's (at the last real
    step), mask * G (G: the previous backward step's product with W_hh) and a carried term
    (the GRU's direct path dh_{t+1} (1 - z_{t+1}))."""
    dh = tl.where(live, tl.load(DOUT + offs, mask=m, other=0.0).to(ACC), 0.0)
    dh += tl.where(last, tl.load(DHN + offs, mask=m, other=0.0).to(ACC), 0.0)
    g = tl.load(G + offs, mask=m, other=0.0).to(ACC)
    if HAS_MASK:
        g = g * tl.load(MASK + offs, mask=m, other=0.0).to(ACC)
    if HAS_CARRY:
        g += tl.load(CARRY + offs, mask=m, other=0.0).to(ACC)
    return dh + g



@triton.jit
def step_base(t, size):
    """The offset of step ``t`` in a time-major buffer of ``size`` elements per step, in
    int64: T x B x nb*H passes 2**31 in long batches (a Billion Word or character-level
    batch), where ``t * size`` in int32 would wrap around to a negative offset."""
    return tl.cast(t, tl.int64) * size


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
    second-order cells subclass it).

    ``Z`` (T, B, width) the input products (+ bias), then what the step kernels write
    back; ``Hs`` (T+1, B, P) the state h (Hs[0] = h_0, carried through padding); ``HM``
    (T+1, B, P) h * mask (with recurrent dropout: what the products read); ``OUT``
    (T, B, P) the outputs; ``C`` (T+1, B, H) the memory cell (cells that have one; float32
    for float16 / bfloat16 calls, :func:`memory_dtype`, as is its carried gradient); ``G``
    (B, P) the backward's last product (what h'_{t-1} receives).  Inputs bound per call:
    the weights, ``mask``, ``lengths``, ``dout``, ``dhn``, ``dcn``.
    """

    def __init__(self, static: bool, T: int, B: int, H: int, P: int, width: int,
                 like: torch.Tensor, mask: bool, lengths: bool, memory: bool):
        super().__init__(static)
        self.T, self.B, self.H, self.P = T, B, H, P
        self.has_mask, self.has_len = mask, lengths
        new = like.new_empty
        self.Z = new(T, B, width)
        self.Hs, self.OUT, self.G = new(T + 1, B, P), new(T, B, P), new(B, P)
        self.HM = new(T + 1, B, P) if mask else None
        self.C = new(T + 1, B, H, dtype=memory_dtype(like.dtype)) if memory else None
        # the carried dc (in the memory cell's dtype), or the GRU's direct path
        self.DCR = new(B, H, dtype=memory_dtype(like.dtype) if memory else like.dtype)
        self.dummy = self.DCR  # passed for pointers a kernel does not read
        self.acc = acc(like.dtype)

    def bind(self, x, h0, c0, w_ih, bias, h_mask, lengths, **weights) -> None:
        input_products(x, w_ih, bias, out=self.Z)
        self.Hs[0].copy_(h0)
        if self.C is not None:
            self.C[0].copy_(c0)
        for name, w in weights.items():  # (rows padded in captured loops: graphs.Loops.put)
            self.put(name, w, align=name in CUBLAS_ONLY)
        if self.has_mask:
            self.put("mask", h_mask.expand(self.B, self.P))
            torch.mul(self.Hs[0], self.mask, out=self.HM[0])
        else:
            self.mask = self.dummy  # not read (HAS_MASK is off)
        if self.has_len:
            self.put("lengths", lengths.to(torch.int32))
        else:
            self.lengths = self.dummy  # not read (HAS_LEN is off)

    def bind_grads(self, dout, dhn, dcn=None) -> None:
        self.put("dout", dout, like=self.OUT)
        self.put("dhn", dhn, like=self.G)
        self.put("dcn", dcn, like=self.DCR)

    def hprev(self) -> torch.Tensor:
        """h'_{t-1} of every step, (T+1, B, P): what the recurrent products read."""
        return self.HM if self.has_mask else self.Hs

    def flags(self) -> dict:
        return dict(HAS_MASK=self.has_mask, HAS_LEN=self.has_len, ACC=self.acc)

    def results(self):
        """The outputs and final states (copies when the buffers are static)."""
        own = (lambda t: t.clone()) if self.static else (lambda t: t)
        cn = self.C[-1].clone() if self.C is not None else None
        return own(self.OUT), self.Hs[-1].clone(), cn

    def initial_grads(self, carry: torch.Tensor | None = None):
        """dh_0 (and dc_0) after the backward loop: mask * G (+ ``carry``; the memory
        cell's dc: the carried DCR), and for a length-0 row the final state's gradient."""
        dh0 = self.G * self.mask if self.has_mask else self.G.clone()
        if carry is not None:
            dh0 += carry
        dc0 = self.DCR.clone() if self.C is not None else None
        if self.has_len:
            empty = (self.lengths == 0).unsqueeze(-1)
            dh0 = torch.where(empty, self.dhn, dh0)
            if dc0 is not None:
                dc0 = torch.where(empty, self.dcn, dc0)
        return dh0, dc0


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

