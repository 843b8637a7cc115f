"""The linear scan on Triton: the pass over time of every linear-scan cell's memory
(``family.py``), one launch for the whole sequence each way.

Each program owns a slice of the B x H (row, unit) lanes; each lane runs its own sequence's
steps (LEN: the sorted lengths), forward c_t = keep_t ∘ c_{t-1} + write_t ∘ content_t
(``linear_scan``), backward the reverse pass of ``loops.py`` (``linear_scan_grad``), in the
packed layout of ``common/sequences.Steps`` (OFF: the step offsets; the memory a state buffer,
the B initial rows first), so no step of padding is computed.  The terms are read in their
own dtype (float16 / bfloat16 under autocast) and every step is computed in float32 registers
(float64 for float64); the memory and its gradient are stored in float32 (``memory_dtype``),
the terms' gradients in the terms' dtype.  ``log_linear_scan`` and its reverse pass are the
same on log h_t (``mode: log`` of minGRU and minLSTM; ``loops.LogLinearScan``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from ..common.guard import GuardedFunction
from ..common.triton_common import acc, launch, memory_dtype, row_base
from ..interface import KernelPath
from .loops import LinearScan, LogLinearScan


@triton.jit
def linear_scan(KEEP, WRITE, CONTENT, C, OFF, LEN, T, B, H, ACC: tl.constexpr,
                BLOCK: tl.constexpr):
    """Each lane (row b, unit u): c_t = keep_t c_{t-1} + write_t content_t over its row's
    steps, into the state buffer C (its initial row read first)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < B * H
    b = offs // H
    u = offs - b * H
    c = tl.load(C + offs, mask=m, other=0.0).to(ACC)
    n_real = tl.load(LEN + b, mask=m, other=0)
    for t in range(0, T):
        live = m & (t < n_real)
        s = row_base(OFF, t, b, H) + u
        k = tl.load(KEEP + s, mask=live, other=0.0).to(ACC)
        w = tl.load(WRITE + s, mask=live, other=0.0).to(ACC)
        x = tl.load(CONTENT + s, mask=live, other=0.0).to(ACC)
        c = tl.where(live, k * c + w * x, c)  # c_t = keep_t c_{t-1} + write_t content_t
        tl.store(C + B * H + s, c, mask=live)


@triton.jit
def linear_scan_grad(KEEP, WRITE, CONTENT, C, DC, DKEEP, DWRITE, DCONTENT, DC0, OFF, LEN, T, B,
                     H, ACC: tl.constexpr, BLOCK: tl.constexpr):
    """The reverse pass, each lane from its row's last step: g_t = DC_t + keep_{t+1} g_{t+1},
    the terms' gradients g_t c_{t-1}, g_t content_t, g_t write_t; DC0 = DC_0 + keep_1 g_1."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < B * H
    b = offs // H
    u = offs - b * H
    n_real = tl.load(LEN + b, mask=m, other=0)
    carry = tl.zeros([BLOCK], dtype=ACC)  # keep_{t+1} g_{t+1}
    for r in range(0, T):
        t = T - 1 - r
        live = m & (t < n_real)
        s = row_base(OFF, t, b, H) + u
        k = tl.load(KEEP + s, mask=live, other=0.0).to(ACC)
        w = tl.load(WRITE + s, mask=live, other=0.0).to(ACC)
        x = tl.load(CONTENT + s, mask=live, other=0.0).to(ACC)
        # c_{t-1}: the previous step's row, or the initial row at t = 0
        prev = tl.where(t > 0, row_base(OFF, tl.maximum(t - 1, 0), b, H) + u + B * H,
                        offs.to(tl.int64))
        c_prev = tl.load(C + prev, mask=live, other=0.0).to(ACC)
        g = tl.load(DC + B * H + s, mask=live, other=0.0).to(ACC) + carry
        tl.store(DKEEP + s, g * c_prev, mask=live)
        tl.store(DWRITE + s, g * x, mask=live)
        tl.store(DCONTENT + s, g * w, mask=live)
        carry = tl.where(live, k * g, carry)
    tl.store(DC0 + offs, tl.load(DC + offs, mask=m, other=0.0).to(ACC) + carry, mask=m)


class TritonLinearScan(GuardedFunction):
    """``loops.LinearScan`` on the Triton kernels: the same inputs, outputs and gradients
    (and ``LinearScan`` computes the gradients if this backward fails: ``common/guard.py``)."""

    family, path, fallback = "linear_scan", KernelPath.TRITON_SCAN, LinearScan

    @staticmethod
    def forward(ctx, S, keep, write, content, c0):
        GuardedFunction.keep(ctx, S, keep, write, content, c0)
        H = keep.shape[-1]
        k, w, u = keep.contiguous(), write.contiguous(), content.contiguous()
        C = S.state_buffer(c0, dtype=memory_dtype(k.dtype))
        off, lens = S.device_steps()
        launch(linear_scan, S.B * H, k, w, u, C, off, lens, S.T, S.B, H, ACC=acc(k.dtype))
        ctx.dtypes = (keep.dtype, write.dtype, content.dtype, c0.dtype)
        ctx.steps, ctx.c0_shape = S, c0.shape
        ctx.save_for_backward(k, w, u, C)
        return C

    @staticmethod
    @once_differentiable
    def backward(ctx, dC):
        return TritonLinearScan.guard(ctx, (dC,), lambda: TritonLinearScan._backward(ctx, dC))

    @staticmethod
    def _backward(ctx, dC):
        k, w, u, C = ctx.saved_tensors
        S, H = ctx.steps, k.shape[-1]
        dC = dC.to(C.dtype).contiguous()
        dk, dw, du = (torch.empty(k.shape, dtype=d, device=k.device) for d in ctx.dtypes[:3])
        dc0 = C.new_empty(S.B, H)
        off, lens = S.device_steps()
        launch(linear_scan_grad, S.B * H, k, w, u, C, dC, dk, dw, du, dc0, off, lens, S.T, S.B,
               H, ACC=acc(k.dtype))
        return LinearScan.grads(ctx, dk, dw, du, dc0)


@triton.jit
def log_linear_scan(LOGK, LOGV, L, OFF, LEN, T, B, H, ACC: tl.constexpr, BLOCK: tl.constexpr):
    """The log-space pass (``loops.LogLinearScan``): each lane L_t = logaddexp(a_t + L_{t-1},
    v_t) over its row's steps, into the state buffer L (its initial row, log h_0, read first)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < B * H
    b = offs // H
    u = offs - b * H
    ninf = float("-inf")
    lv = tl.load(L + offs, mask=m, other=0.0).to(ACC)
    n_real = tl.load(LEN + b, mask=m, other=0)
    for t in range(0, T):
        live = m & (t < n_real)
        s = row_base(OFF, t, b, H) + u
        a = tl.load(LOGK + s, mask=live, other=0.0).to(ACC)
        v = tl.load(LOGV + s, mask=live, other=0.0).to(ACC)
        x = a + lv
        hi = tl.maximum(x, v)
        lo = tl.minimum(x, v)
        new = tl.where(hi == ninf, hi, hi + tl.log(1.0 + tl.exp(lo - hi)))  # logaddexp
        lv = tl.where(live, new, lv)
        tl.store(L + B * H + s, lv, mask=live)


@triton.jit
def log_linear_scan_grad(LOGK, LOGV, L, DC, DLOGK, DLOGV, DC0, OFF, LEN, T, B, H,
                         ACC: tl.constexpr, BLOCK: tl.constexpr):
    """Its reverse pass (``linear_scan.c`` states it): G_t = dC_t h_t + p_{t+1} G_{t+1}, d a_t =
    G_t p_t, d v_t = G_t q_t; DC0 = dC_0 + exp(a_1 - L_1) G_1."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < B * H
    b = offs // H
    u = offs - b * H
    ninf = float("-inf")
    n_real = tl.load(LEN + b, mask=m, other=0)
    carry = tl.zeros([BLOCK], dtype=ACC)  # p_{t+1} G_{t+1}
    for r in range(0, T):
        t = T - 1 - r
        live = m & (t < n_real)
        s = row_base(OFF, t, b, H) + u
        a = tl.load(LOGK + s, mask=live, other=0.0).to(ACC)
        v = tl.load(LOGV + s, mask=live, other=0.0).to(ACC)
        lt = tl.load(L + B * H + s, mask=live, other=0.0).to(ACC)
        prev = tl.where(t > 0, row_base(OFF, tl.maximum(t - 1, 0), b, H) + u + B * H,
                        offs.to(tl.int64))
        lp = tl.load(L + prev, mask=live, other=0.0).to(ACC)
        empty = lt == ninf  # h_t = 0: nothing flows
        g = tl.load(DC + B * H + s, mask=live, other=0.0).to(ACC) * tl.exp(lt) + carry
        p = tl.where(empty, 0.0, tl.exp(a + lp - lt))  # 0 where L_{t-1} = -inf
        q = tl.where(empty, 0.0, tl.exp(v - lt))
        tl.store(DLOGK + s, g * p, mask=live)
        tl.store(DLOGV + s, g * q, mask=live)
        into = tl.where(t > 0, p, tl.where(empty, 0.0, tl.exp(a - lt)))  # L_{t-1}, or h_0
        carry = tl.where(live, into * g, carry)
    tl.store(DC0 + offs, tl.load(DC + offs, mask=m, other=0.0).to(ACC) + carry, mask=m)


class TritonLogLinearScan(GuardedFunction):
    """``loops.LogLinearScan`` on the Triton kernels: the same inputs, outputs and gradients
    (``LogLinearScan`` computes the gradients if this backward fails: ``common/guard.py``).
    The logs are read in their own dtype and every step computed in float32 registers (float64
    for float64); L, h and the gradient of h_0 are stored in float32 (``memory_dtype``)."""

    family, path, fallback = "linear_scan", KernelPath.TRITON_SCAN, LogLinearScan

    @staticmethod
    def forward(ctx, S, log_keep, log_value, c0):
        GuardedFunction.keep(ctx, S, log_keep, log_value, c0)
        H = log_keep.shape[-1]
        a, v = log_keep.contiguous(), log_value.contiguous()
        dtype = memory_dtype(a.dtype)
        L = S.state_buffer(torch.log(c0.to(dtype)), dtype=dtype)
        off, lens = S.device_steps()
        launch(log_linear_scan, S.B * H, a, v, L, off, lens, S.T, S.B, H, ACC=acc(a.dtype))
        C = S.state_buffer(c0, dtype=dtype)
        torch.exp(L[S.B:], out=C[S.B:])
        ctx.dtypes = (log_keep.dtype, log_value.dtype, c0.dtype)
        ctx.steps, ctx.c0_shape = S, c0.shape
        ctx.save_for_backward(a, v, L)
        return C

    @staticmethod
    @once_differentiable
    def backward(ctx, dC):
        return TritonLogLinearScan.guard(ctx, (dC,),
                                         lambda: TritonLogLinearScan._backward(ctx, dC))

    @staticmethod
    def _backward(ctx, dC):
        a, v, L = ctx.saved_tensors
        S, H = ctx.steps, a.shape[-1]
        dC = dC.to(L.dtype).contiguous()
        da, dv = (torch.empty(a.shape, dtype=d, device=a.device) for d in ctx.dtypes[:2])
        dc0 = L.new_empty(S.B, H)
        off, lens = S.device_steps()
        launch(log_linear_scan_grad, S.B * H, a, v, L, dC, da, dv, dc0, off, lens, S.T, S.B, H,
               ACC=acc(a.dtype))
        dc0 = S.grad_of_initial(dc0, ctx.c0_shape)
        return (None,) + tuple(grad.to(dtype) if need else None for grad, dtype, need
                               in zip((da, dv, dc0), ctx.dtypes, ctx.needs_input_grad[1:]))
