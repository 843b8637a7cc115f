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
``addcmul`` per step each way.  The memory is carried in float32 where the terms are
float16 / bfloat16 (``common/precision.memory_dtype``; this function is the Triton scan's
fallback, ``common/guard.py``, and sees such terms only there).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ..common import native
from ..common.precision import memory_dtype

LIBRARY = "linear_scan"


class LinearScan(torch.autograd.Function):
    """``C = LinearScan.apply(keep, write, content, c0)``: keep, write, content (T, B, H),
    c0 (B, H) -> C (T+1, B, H) with C[0] = c_0 and C[t] = c_t (in ``memory_dtype``)."""

    @staticmethod
    def forward(ctx, keep: Tensor, write: Tensor, content: Tensor, c0: Tensor) -> Tensor:
        T, B, H = keep.shape
        dtype = memory_dtype(keep.dtype)
        k, w, u = (t.to(dtype).contiguous() for t in (keep, write, content))
        C = k.new_empty(T + 1, B, H)
        C[0] = c0
        lib = native.library_for(LIBRARY, k.device.type, dtype)
        if lib is not None:
            lib.call("scan_fwd", dtype, _choose=False, T=T, n=B * H, keep=k, write=w, content=u,
                     C=C, par_min=native.PAR_MIN)
        else:
            cs = C.unbind(0)
            U = w * u  # what every step writes: write_t ∘ content_t
            for t in range(T):
                torch.addcmul(U[t], k[t], cs[t], out=cs[t + 1])  # c_t = keep_t ∘ c_{t-1} + ...
        ctx.native = lib
        ctx.dtypes = (keep.dtype, write.dtype, content.dtype, c0.dtype)
        ctx.save_for_backward(k, w, u, C)
        return C

    @staticmethod
    @once_differentiable
    def backward(ctx, dC: Tensor):
        k, w, u, C = ctx.saved_tensors
        T, B, H = k.shape
        dC = dC.to(C.dtype).contiguous()
        if ctx.native is not None:
            dk, dw, du, dc0 = (torch.empty_like(k), torch.empty_like(k), torch.empty_like(k),
                               k.new_empty(B, H))
            ctx.native.call("scan_bwd", C.dtype, _choose=False, T=T, n=B * H, keep=k, write=w,
                            content=u, C=C, dC=dC, dkeep=dk, dwrite=dw, dcontent=du, dc0=dc0,
                            par_min=native.PAR_MIN)
        else:
            G = dC.clone()  # G[t] = g_t once the loop has passed it
            gs, ks = G.unbind(0), k.unbind(0)
            for t in range(T, 0, -1):
                gs[t - 1].addcmul_(ks[t - 1], gs[t])  # g_{t-1} = dC_{t-1} + keep_t ∘ g_t
            g = G[1:]
            dk, dw, du, dc0 = g * C[:-1], g * u, g * w, G[0]
        return tuple(grad.to(dtype) if need else None for grad, dtype, need
                     in zip((dk, dw, du, dc0), ctx.dtypes, ctx.needs_input_grad))
