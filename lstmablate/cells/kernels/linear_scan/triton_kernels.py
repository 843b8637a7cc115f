"""The linear scan on Triton: the pass over time of every linear-scan cell's memory
(``family.py``), one launch for the whole sequence each way.

Each program owns a slice of the B x H (row, unit) columns and loops over time, forward
c_t = keep_t ∘ c_{t-1} + write_t ∘ content_t (``linear_scan``), backward the reverse pass of
``loops.py`` (``linear_scan_grad``).  The terms are read in their own dtype (float16 /
bfloat16 under autocast) and every step is computed in float32 registers (float64 for
float64); the memory and its gradient are stored in float32 (``memory_dtype``), the terms'
gradients in the terms' dtype.  No padding here: every row runs all T steps, and
``family.scan_sequence`` takes each row's final state at its own length.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from ..common.guard import GuardedFunction
from ..common.triton_common import acc, launch, memory_dtype, step_base
from ..interface import KernelPath
from .loops import LinearScan


@triton.jit
def linear_scan(KEEP, WRITE, CONTENT, C, T, n, ACC: tl.constexpr, BLOCK: tl.constexpr):
    """C[t + 1] = KEEP[t] * C[t] + WRITE[t] * CONTENT[t] for t = 0..T-1 (C[0]: c_0)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    c = tl.load(C + offs, mask=m, other=0.0).to(ACC)
    for t in range(0, T):
        s = step_base(t, n) + offs
        k = tl.load(KEEP + s, mask=m, other=0.0).to(ACC)
        w = tl.load(WRITE + s, mask=m, other=0.0).to(ACC)
        u = tl.load(CONTENT + s, mask=m, other=0.0).to(ACC)
        c = k * c + w * u  # c_t = keep_t c_{t-1} + write_t content_t
        tl.store(C + step_base(t + 1, n) + offs, c, mask=m)


@triton.jit
def linear_scan_grad(KEEP, WRITE, CONTENT, C, DC, DKEEP, DWRITE, DCONTENT, DC0, T, n,
                     ACC: tl.constexpr, BLOCK: tl.constexpr):
    """The reverse pass: g_T = DC[T], g_{t-1} = DC[t-1] + keep_t g_t, and the terms'
    gradients g_t c_{t-1}, g_t content_t, g_t write_t; DC0 = g_0."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    g = tl.load(DC + step_base(T, n) + offs, mask=m, other=0.0).to(ACC)
    for r in range(0, T):
        t = T - 1 - r
        s = step_base(t, n) + offs
        k = tl.load(KEEP + s, mask=m, other=0.0).to(ACC)
        w = tl.load(WRITE + s, mask=m, other=0.0).to(ACC)
        u = tl.load(CONTENT + s, mask=m, other=0.0).to(ACC)
        c_prev = tl.load(C + s, mask=m, other=0.0).to(ACC)
        tl.store(DKEEP + s, g * c_prev, mask=m)
        tl.store(DWRITE + s, g * u, mask=m)
        tl.store(DCONTENT + s, g * w, mask=m)
        g = tl.load(DC + s, mask=m, other=0.0).to(ACC) + k * g
    tl.store(DC0 + offs, g, mask=m)


class TritonLinearScan(GuardedFunction):
    """``loops.LinearScan`` on the Triton kernels: the same inputs, outputs and gradients
    (and ``LinearScan`` computes the gradients if this backward fails: ``common/guard.py``)."""

    family, path, fallback = "linear_scan", KernelPath.TRITON_SCAN, LinearScan

    @staticmethod
    def forward(ctx, keep, write, content, c0):
        GuardedFunction.keep(ctx, keep, write, content, c0)
        T, B, H = keep.shape
        k, w, u = keep.contiguous(), write.contiguous(), content.contiguous()
        C = k.new_empty(T + 1, B, H, dtype=memory_dtype(k.dtype))
        C[0] = c0
        launch(linear_scan, B * H, k, w, u, C, T, B * H, ACC=acc(k.dtype))
        ctx.dtypes = (keep.dtype, write.dtype, content.dtype, c0.dtype)
        ctx.save_for_backward(k, w, u, C)
        return C

    @staticmethod
    @once_differentiable
    def backward(ctx, dC):
        return TritonLinearScan.guard(ctx, (dC,), lambda: TritonLinearScan._backward(ctx, dC))

    @staticmethod
    def _backward(ctx, dC):
        k, w, u, C = ctx.saved_tensors
        T, B, H = k.shape
        dC = dC.to(C.dtype).contiguous()
        dk, dw, du = (torch.empty(k.shape, dtype=d, device=k.device) for d in ctx.dtypes[:3])
        dc0 = C.new_empty(B, H)
        launch(linear_scan_grad, B * H, k, w, u, C, dC, dk, dw, du, dc0, T, B * H,
               ACC=acc(k.dtype))
        return tuple(grad.to(dtype) if need else None for grad, dtype, need
                     in zip((dk, dw, du, dc0), ctx.dtypes, ctx.needs_input_grad))
