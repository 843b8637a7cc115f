"""The 2018 SRU's memory on Triton (``loops.py`` has the equations): one launch for the whole
sequence each way.

Each program owns a slice of one row's units and loops over time, forward f_t = σ(z_t + v ∘
c_{t-1}), c_t = f_t ∘ c_{t-1} + (1 − f_t) ∘ u_t (``sru_memory``), backward the reverse pass
of ``loops.py`` (``sru_memory_grad``; dv is one reduction after it).  The inputs are read in
their own dtype (float16 / bfloat16 under autocast) and every step is computed in float32
registers (float64 for float64); the memory, f_t and the carried gradient are stored in
float32 (``memory_dtype``), the inputs' gradients in the inputs' dtype.  No padding here:
every row runs all T steps, and ``family.sru_sequence`` takes each row's final state at its
own length.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from ..common.guard import GuardedFunction
from ..common.triton_common import acc, launch_grid, memory_dtype, sigmoid, step_base
from ..common.triton_support import block
from ..interface import KernelPath
from .loops import SRUMemory


@triton.jit
def sru_memory(Z, U, V, C, F, T, n, H, ACC: tl.constexpr, BLOCK: tl.constexpr):
    """C[t + 1] = f_t C[t] + (1 - f_t) U[t], f_t = σ(Z[t] + V C[t]) (stored in F[t])."""
    j = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = j < H
    offs = tl.program_id(0) * H + j
    v = tl.load(V + j, mask=m, other=0.0).to(ACC)
    c = tl.load(C + offs, mask=m, other=0.0).to(ACC)
    for t in range(0, T):
        s = step_base(t, n) + offs
        z = tl.load(Z + s, mask=m, other=0.0).to(ACC)
        u = tl.load(U + s, mask=m, other=0.0).to(ACC)
        f = sigmoid(z + v * c)  # eq 1
        c = f * c + (1.0 - f) * u  # eq 2
        tl.store(F + s, f, mask=m)
        tl.store(C + step_base(t + 1, n) + offs, c, mask=m)


@triton.jit
def sru_memory_grad(U, V, C, F, DC, DZ, DU, DC0, T, n, H, ACC: tl.constexpr,
                    BLOCK: tl.constexpr):
    """The reverse pass: g_T = DC[T]; dz_t, du_t; g_{t-1} = DC[t-1] + g_t f_t + dz_t v;
    DC0 = g_0."""
    j = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = j < H
    offs = tl.program_id(0) * H + j
    v = tl.load(V + j, mask=m, other=0.0).to(ACC)
    g = tl.load(DC + step_base(T, n) + offs, mask=m, other=0.0).to(ACC)
    for r in range(0, T):
        t = T - 1 - r
        s = step_base(t, n) + offs
        u = tl.load(U + s, mask=m, other=0.0).to(ACC)
        c_prev = tl.load(C + s, mask=m, other=0.0).to(ACC)
        f = tl.load(F + s, mask=m, other=0.0).to(ACC)
        dz = g * (c_prev - u) * f * (1.0 - f)
        tl.store(DZ + s, dz, mask=m)
        tl.store(DU + s, g * (1.0 - f), mask=m)
        g = tl.load(DC + s, mask=m, other=0.0).to(ACC) + g * f + dz * v
    tl.store(DC0 + offs, g, mask=m)


def _grid(B: int, H: int) -> tuple[tuple[int, int], int]:
    size = block(H)
    return (B, triton.cdiv(H, size)), size


class TritonSRUMemory(GuardedFunction):
    """``loops.SRUMemory`` on the Triton kernels: the same inputs, outputs and gradients (and
    ``SRUMemory`` computes the gradients if this backward fails: ``common/guard.py``)."""

    family, path, fallback = "sru", KernelPath.TRITON_RECURRENT, SRUMemory

    @staticmethod
    def forward(ctx, z, u, v, c0):
        GuardedFunction.keep(ctx, z, u, v, c0)
        T, B, H = z.shape
        zz, uu, vv = z.contiguous(), u.contiguous(), v.contiguous()
        dtype = memory_dtype(z.dtype)
        C = zz.new_empty(T + 1, B, H, dtype=dtype)
        C[0] = c0
        F = zz.new_empty(T, B, H, dtype=dtype)
        grid, size = _grid(B, H)
        launch_grid(sru_memory, grid, zz, uu, vv, C, F, T, B * H, H, ACC=acc(z.dtype),
                    BLOCK=size)
        ctx.dtypes = (z.dtype, u.dtype, v.dtype, c0.dtype)
        ctx.save_for_backward(uu, vv, C, F)
        return C

    @staticmethod
    @once_differentiable
    def backward(ctx, dC):
        return TritonSRUMemory.guard(ctx, (dC,), lambda: TritonSRUMemory._backward(ctx, dC))

    @staticmethod
    def _backward(ctx, dC):
        u, v, C, F = ctx.saved_tensors
        T, B, H = u.shape
        dC = dC.to(C.dtype).contiguous()
        dz, du = (torch.empty(u.shape, dtype=d, device=u.device) for d in ctx.dtypes[:2])
        dc0 = C.new_empty(B, H)
        grid, size = _grid(B, H)
        launch_grid(sru_memory_grad, grid, u, v, C, F, dC, dz, du, dc0, T, B * H, H,
                    ACC=acc(u.dtype), BLOCK=size)
        dv = (dz.to(C.dtype) * C[:-1]).sum((0, 1)) if ctx.needs_input_grad[2] else None
        return tuple(None if grad is None or not need else grad.to(dtype) for grad, dtype, need
                     in zip((dz, du, dv, dc0), ctx.dtypes, ctx.needs_input_grad))
