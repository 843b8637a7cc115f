"""The 2018 SRU's memory on Triton (``loops.py`` has the equations): one launch for the whole
sequence each way.

Each program owns a slice of one row's units and loops over time, forward f_t = σ(z_t + v ∘
c_{t-1}), c_t = f_t ∘ c_{t-1} + (1 − f_t) ∘ u_t (``sru_memory``), backward the reverse pass
of ``loops.py`` (``sru_memory_grad``; dv is one reduction after it).  The inputs are read in
their own dtype (float16 / bfloat16 under autocast) and every step is computed in float32
registers (float64 for float64); the memory, f_t and the carried gradient are stored in
float32 (``memory_dtype``), the inputs' gradients in the inputs' dtype.  Padding-free, in
the packed layout of ``common/sequences.Steps`` (OFF: the step offsets, LEN: the sorted
lengths): each row runs its own steps only; the memory is a state buffer, the B initial rows
first.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from ..common.guard import GuardedFunction
from ..common.triton_common import acc, launch_grid, memory_dtype, row_base, sigmoid
from ..common.triton_support import block
from ..interface import KernelPath
from .loops import SRUMemory


@triton.jit
def sru_memory(Z, U, V, C, F, OFF, LEN, B, H, ACC: tl.constexpr, BLOCK: tl.constexpr):
    """Row b's steps: c_t = f_t c_{t-1} + (1 - f_t) u_t, f_t = σ(z_t + v c_{t-1}) (stored
    in F), c_t into the state buffer C (its initial row read first)."""
    b = tl.program_id(0)
    j = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = j < H
    v = tl.load(V + j, mask=m, other=0.0).to(ACC)
    c = tl.load(C + b * H + j, mask=m, other=0.0).to(ACC)
    for t in range(0, tl.load(LEN + b)):
        s = row_base(OFF, t, b, H) + j
        z = tl.load(Z + s, mask=m, other=0.0).to(ACC)
        u = tl.load(U + s, mask=m, other=0.0).to(ACC)
        f = sigmoid(z + v * c)  # eq 1
        c = f * c + (1.0 - f) * u  # eq 2
        tl.store(F + s, f, mask=m)
        tl.store(C + B * H + s, c, mask=m)


@triton.jit
def sru_memory_grad(U, V, C, F, DC, DZ, DU, DC0, OFF, LEN, B, H, ACC: tl.constexpr,
                    BLOCK: tl.constexpr):
    """The reverse pass from row b's last step: g_t = DC_t + carry; dz_t, du_t; carry =
    g_t f_t + dz_t v; DC0 = DC_0 + carry."""
    b = tl.program_id(0)
    j = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = j < H
    v = tl.load(V + j, mask=m, other=0.0).to(ACC)
    carry = tl.zeros([BLOCK], dtype=ACC)
    n_real = tl.load(LEN + b)
    for r in range(0, n_real):
        t = n_real - 1 - r
        s = row_base(OFF, t, b, H) + j
        u = tl.load(U + s, mask=m, other=0.0).to(ACC)
        # c_{t-1}: the previous step's row, or the initial row at t = 0
        prev = tl.where(t > 0, row_base(OFF, tl.maximum(t - 1, 0), b, H) + j + B * H,
                        (b * H + j).to(tl.int64))
        c_prev = tl.load(C + prev, mask=m, other=0.0).to(ACC)
        f = tl.load(F + s, mask=m, other=0.0).to(ACC)
        g = tl.load(DC + B * H + s, mask=m, other=0.0).to(ACC) + carry
        dz = g * (c_prev - u) * f * (1.0 - f)
        tl.store(DZ + s, dz, mask=m)
        tl.store(DU + s, g * (1.0 - f), mask=m)
        carry = g * f + dz * v
    tl.store(DC0 + b * H + j, tl.load(DC + b * H + j, mask=m, other=0.0).to(ACC) + carry, mask=m)


def _grid(B: int, H: int) -> tuple[tuple[int, int], int]:
    size = block(H)
    return (B, triton.cdiv(H, size)), size


class TritonSRUMemory(GuardedFunction):
    """``loops.SRUMemory`` on the Triton kernels: the same inputs, outputs and gradients (and
    ``SRUMemory`` computes the gradients if this backward fails: ``common/guard.py``)."""

    family, path, fallback = "sru", KernelPath.TRITON_RECURRENT, SRUMemory

    @staticmethod
    def forward(ctx, S, z, u, v, c0):
        GuardedFunction.keep(ctx, S, z, u, v, c0)
        H = z.shape[-1]
        zz, uu, vv = z.contiguous(), u.contiguous(), v.contiguous()
        dtype = memory_dtype(z.dtype)
        C = S.state_buffer(c0, dtype=dtype)
        F = zz.new_empty(S.N, H, dtype=dtype)
        off, lens = S.device_steps()
        grid, size = _grid(S.B, H)
        launch_grid(sru_memory, grid, zz, uu, vv, C, F, off, lens, S.B, H, ACC=acc(z.dtype),
                    BLOCK=size)
        ctx.dtypes = (z.dtype, u.dtype, v.dtype, c0.dtype)
        ctx.steps, ctx.c0_shape = S, c0.shape
        ctx.save_for_backward(uu, vv, C, F)
        return C

    @staticmethod
    @once_differentiable
    def backward(ctx, dC):
        return TritonSRUMemory.guard(ctx, (dC,), lambda: TritonSRUMemory._backward(ctx, dC))

    @staticmethod
    def _backward(ctx, dC):
        u, v, C, F = ctx.saved_tensors
        S, H = ctx.steps, u.shape[-1]
        dC = dC.to(C.dtype).contiguous()
        dz, du = (torch.empty(u.shape, dtype=d, device=u.device) for d in ctx.dtypes[:2])
        dc0 = C.new_empty(S.B, H)
        off, lens = S.device_steps()
        grid, size = _grid(S.B, H)
        launch_grid(sru_memory_grad, grid, u, v, C, F, dC, dz, du, dc0, off, lens, S.B, H,
                    ACC=acc(u.dtype), BLOCK=size)
        return SRUMemory.grads(ctx, dz, du, dc0, C)
