"""The linear scan's pass over time and its reverse pass, the one piece of a linear-scan cell
that is sequential in time:

    c_t = keep_t ∘ c_{t-1} + write_t ∘ content_t,        t = 1..T,

for the terms of every step at once (``ElementwiseCell.sequence_terms``), with the
reverse pass written by hand (g_t = dL/dc_t):

    g_T = dC_T,   g_{t-1} = dC_{t-1} + keep_t ∘ g_t,
    d keep_t = g_t ∘ c_{t-1},   d write_t = g_t ∘ content_t,   d content_t = g_t ∘ write_t,
    d c_0 = g_0,

in two implementations of the same loops: the **native kernel** (CPU, float32 / float64;
``linear_scan.c``: each chunk of (row, unit) columns runs every step, the chunks split across
threads) and **PyTorch loops** (any device; no compiler; ``LSTMABLATE_NATIVE=0``): one
``addcmul`` per step each way.  Both run the packed layout of ``common/sequences.Steps``: the
terms hold the real tokens only (step t's rows(t) sequences still running), the memory is a
state buffer (the B initial rows, then every step's), so no step of padding is computed,
kept or differentiated.  The memory is carried in float32 where the terms are float16 /
bfloat16 (``common/precision.memory_dtype``; this function is the Triton scan's fallback,
``common/guard.py``, and sees such terms only there).

:class:`LogLinearScan` is the same pass on log h_t (minGRU's and minLSTM's ``mode: log``), with
its own reverse pass; its equations are written beside its C loops (``linear_scan.c``).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ..common import native
from ..common.precision import memory_dtype
from ..common.sequences import Steps

LIBRARY = "linear_scan"


class LinearScan(torch.autograd.Function):
    """``C = LinearScan.apply(S, keep, write, content, c0)``: keep, write, content (N, H) in
    the packed layout of ``S`` (a :class:`Steps`), c0 (B, H) in the caller's row order ->
    the state buffer C (B + N, H) (``memory_dtype``): the B initial memories (sorted), then
    c_t of every real token (``S.final(C)``: each sequence's last)."""

    @staticmethod
    def forward(ctx, S: Steps, keep: Tensor, write: Tensor, content: Tensor, c0: Tensor
                ) -> Tensor:
        H = keep.shape[-1]
        dtype = memory_dtype(keep.dtype)
        k, w, u = (t.to(dtype).contiguous() for t in (keep, write, content))
        C = S.state_buffer(c0, dtype=dtype)
        lib = native.library_for(LIBRARY, k.device.type, dtype)
        if lib is not None:
            lib.call("scan_fwd", dtype, _choose=False, T=S.T, B=S.B, off=S.off, H=H, keep=k,
                     write=w, content=u, C=C, par_min=native.PAR_MIN)
        else:
            U = S.per_step(w * u)  # what every step writes: write_t ∘ content_t
            for t, (kt, c_prev, c_t) in enumerate(zip(S.per_step(k), S.states_in(C),
                                                      S.states_out(C))):
                torch.addcmul(U[t], kt, c_prev, out=c_t)  # c_t = keep_t ∘ c_{t-1} + ...
        ctx.native, ctx.steps = lib, S
        ctx.dtypes = (keep.dtype, write.dtype, content.dtype, c0.dtype)
        ctx.c0_shape = c0.shape
        ctx.save_for_backward(k, w, u, C)
        return C

    @staticmethod
    @once_differentiable
    def backward(ctx, dC: Tensor):
        k, w, u, C = ctx.saved_tensors
        S: Steps = ctx.steps
        B, H = S.B, k.shape[-1]
        dC = dC.to(C.dtype).contiguous()
        if ctx.native is not None:
            dk, dw, du, dc0 = (torch.empty_like(k), torch.empty_like(k), torch.empty_like(k),
                               k.new_empty(B, H))
            ctx.native.call("scan_bwd", C.dtype, _choose=False, T=S.T, B=B, off=S.off, H=H,
                            keep=k, write=w, content=u, C=C, dC=dC, dkeep=dk, dwrite=dw,
                            dcontent=du, dc0=dc0, par_min=native.PAR_MIN)
        else:
            G = dC.clone()  # G's step rows hold g_t once the loop has passed them
            gs, ks = S.states_out(G), S.per_step(k)
            into = [G[:B]] + gs[:-1]  # the rows of step t - 1 (c_0 for t = 0)
            for t in range(S.T - 1, -1, -1):
                into[t][:S.rows(t)].addcmul_(ks[t], gs[t])  # g_{t-1} += keep_t ∘ g_t
            g = G[B:]
            dk, dw, du, dc0 = g * S.prev(C), g * u, g * w, G[:B]
        return LinearScan.grads(ctx, dk, dw, du, dc0)

    @staticmethod
    def grads(ctx, dk: Tensor, dw: Tensor, du: Tensor, dc0: Tensor) -> tuple:
        """``backward``'s result from the pass's gradients (dc0 sorted), each in its input's
        dtype (this and the Triton pass)."""
        dc0 = ctx.steps.grad_of_initial(dc0, ctx.c0_shape)
        return (None,) + tuple(grad.to(dtype) if need else None for grad, dtype, need
                               in zip((dk, dw, du, dc0), ctx.dtypes, ctx.needs_input_grad[1:]))


class LogLinearScan(torch.autograd.Function):
    """The log-space pass (``mode: log`` of minGRU and minLSTM; ``linear_scan.c`` states the
    equations): ``C = LogLinearScan.apply(S, log_keep, log_value, c0)``: a_t = log keep_t,
    v_t = log(write_t content_t) (N, H) packed, c0 = h_0 >= 0 (B, H) in the caller's order ->
    the state buffer C (B + N, H) of h itself, as :class:`LinearScan`'s: the B initial rows
    (c0, sorted, as given), then h_t = exp(L_t) of every real token, where

        L_t = logaddexp(a_t + L_{t-1}, v_t),   L_0 = log h_0

    (Heinsen's log h_t = a*_t + logcumsumexp_j(v_j - a*_j), one step at a time).  Carried in
    ``memory_dtype``; the logs L are kept for the reverse pass.  C loops (CPU, float32 /
    float64) or PyTorch loops (one ``logaddexp`` per step each way)."""

    @staticmethod
    def forward(ctx, S: Steps, log_keep: Tensor, log_value: Tensor, c0: Tensor) -> Tensor:
        H = log_keep.shape[-1]
        dtype = memory_dtype(log_keep.dtype)
        a, v = (t.to(dtype).contiguous() for t in (log_keep, log_value))
        L = S.state_buffer(torch.log(c0.to(dtype)), dtype=dtype)  # L_0 = log h_0 (-inf at 0)
        lib = native.library_for(LIBRARY, a.device.type, dtype)
        if lib is not None:
            lib.call("log_scan_fwd", dtype, _choose=False, T=S.T, B=S.B, off=S.off, H=H,
                     log_keep=a, log_value=v, L=L, par_min=native.PAR_MIN)
        else:
            V = S.per_step(v)
            for t, (at, l_prev, l_t) in enumerate(zip(S.per_step(a), S.states_in(L),
                                                      S.states_out(L))):
                torch.logaddexp(at + l_prev, V[t], out=l_t)  # L_t
        C = S.state_buffer(c0, dtype=dtype)
        torch.exp(L[S.B:], out=C[S.B:])  # h_t = exp(L_t)
        ctx.native, ctx.steps = lib, S
        ctx.dtypes = (log_keep.dtype, log_value.dtype, c0.dtype)
        ctx.c0_shape = c0.shape
        ctx.save_for_backward(a, v, L)
        return C

    @staticmethod
    @once_differentiable
    def backward(ctx, dC: Tensor):
        a, v, L = ctx.saved_tensors
        S: Steps = ctx.steps
        B, H = S.B, a.shape[-1]
        dC = dC.to(L.dtype).contiguous()
        if ctx.native is not None:
            da, dv, dc0 = torch.empty_like(a), torch.empty_like(a), a.new_empty(B, H)
            ctx.native.call("log_scan_bwd", L.dtype, _choose=False, T=S.T, B=B, off=S.off, H=H,
                            log_keep=a, log_value=v, L=L, dC=dC, dlog_keep=da, dlog_value=dv,
                            dc0=dc0, par_min=native.PAR_MIN)
        else:
            Lt = L[B:]
            empty = Lt == -math.inf  # h_t = 0: nothing flows (never, for finite inputs)
            p = torch.exp(a + S.prev(L) - Lt).masked_fill_(empty, 0)  # 0 where L_{t-1} = -inf
            q = torch.exp(v - Lt).masked_fill_(empty, 0)
            G = dC.clone()  # step rows: G_t = dC_t h_t + p_{t+1} G_{t+1}, once passed
            G[B:] *= torch.exp(Lt)
            gs, ps = S.states_out(G), S.per_step(p)
            for t in range(S.T - 1, 0, -1):
                gs[t - 1][:S.rows(t)].addcmul_(ps[t], gs[t])  # into G_{t-1}
            if S.T:  # d h_0 = dC_0 + exp(a_1 - L_1) G_1 (p_1 G_1 / h_0, finite at h_0 = 0)
                first = S.per_step(torch.exp(a - Lt).masked_fill_(empty, 0))[0]
                G[:S.rows(0)].addcmul_(first, gs[0])
            g = G[B:]
            da, dv, dc0 = g * p, g * q, G[:B]
        dc0 = S.grad_of_initial(dc0, ctx.c0_shape)
        return (None,) + tuple(grad.to(dtype) if need else None for grad, dtype, need
                               in zip((da, dv, dc0), ctx.dtypes, ctx.needs_input_grad[1:]))
