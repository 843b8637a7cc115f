"""The 2018 SRU's memory, the one piece of the cell that is sequential in time (Lei et al.,
EMNLP 2018, eqs 1-2):

    f_t = σ(z_t + v ∘ c_{t-1}),        c_t = f_t ∘ c_{t-1} + (1 − f_t) ∘ u_t,

given z_t = W_f x_t + b_f and u_t = W x_t of every step (one matrix product before) and v =
v_f, with the reverse pass written by hand (g_t = dL/dc_t):

    g_T = dC_T,   dz_t = g_t ∘ (c_{t-1} − u_t) ∘ f_t ∘ (1 − f_t),   du_t = g_t ∘ (1 − f_t),
    g_{t-1} = dC_{t-1} + g_t ∘ f_t + dz_t ∘ v,   dv = Σ_{t, rows} dz_t ∘ c_{t-1},   dc_0 = g_0,

in two implementations of the same loops: the **native kernel** (CPU, float32 / float64;
``sru.c``: each chunk of a row's units runs every step, the chunks split across threads) and
**PyTorch loops** (any device; no compiler; ``LSTMABLATE_NATIVE=0``).  The memory is carried
in float32 where the inputs are float16 / bfloat16 (``common/precision.memory_dtype``; this
function is the Triton kernel's fallback, ``common/guard.py``, and sees such inputs only
there).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ..common import native
from ..common.precision import memory_dtype

LIBRARY = "sru"


class SRUMemory(torch.autograd.Function):
    """``C = SRUMemory.apply(z, u, v, c0)``: z, u (T, B, H), v (H,), c0 (B, H) -> C (T+1, B, H)
    with C[0] = c_0 and C[t] = c_t (in ``memory_dtype``)."""

    @staticmethod
    def forward(ctx, z: Tensor, u: Tensor, v: Tensor, c0: Tensor) -> Tensor:
        T, B, H = z.shape
        dtype = memory_dtype(z.dtype)
        zz, uu, vv = (t.to(dtype).contiguous() for t in (z, u, v))
        C = zz.new_empty(T + 1, B, H)
        C[0] = c0
        F = torch.empty_like(zz)  # f_t, for the backward
        lib = native.library_for(LIBRARY, zz.device.type, dtype)
        if lib is not None:
            lib.call("sru_fwd", dtype, _choose=False, T=T, n=B * H, H=H, z=zz, u=uu, v=vv, C=C,
                     F=F, par_min=native.PAR_MIN)
        else:
            cs, fs = C.unbind(0), F.unbind(0)
            for t in range(T):
                torch.sigmoid(torch.addcmul(zz[t], vv, cs[t]), out=fs[t])  # eq 1: f_t
                # eq 2: c_t = u_t + f_t ∘ (c_{t-1} - u_t)
                torch.addcmul(uu[t], fs[t], cs[t] - uu[t], out=cs[t + 1])
        ctx.native = lib
        ctx.dtypes = (z.dtype, u.dtype, v.dtype, c0.dtype)
        ctx.save_for_backward(uu, vv, C, F)
        return C

    @staticmethod
    @once_differentiable
    def backward(ctx, dC: Tensor):
        u, v, C, F = ctx.saved_tensors
        T, B, H = u.shape
        dC = dC.to(C.dtype).contiguous()
        if ctx.native is not None:
            dz, du, dc0 = torch.empty_like(u), torch.empty_like(u), u.new_empty(B, H)
            ctx.native.call("sru_bwd", C.dtype, _choose=False, T=T, n=B * H, H=H, u=u, v=v,
                            C=C, F=F, dC=dC, dz=dz, du=du, dc0=dc0, par_min=native.PAR_MIN)
        else:
            dz, du = torch.empty_like(u), torch.empty_like(u)
            g = dC[T].clone()
            for t in range(T - 1, -1, -1):  # step t + 1 of the recurrence, 0-based
                f = F[t]
                torch.mul(g, 1 - f, out=du[t])  # du_t = g_t (1 - f_t)
                torch.mul(g * (C[t] - u[t]), f * (1 - f), out=dz[t])  # dz_t
                g = dC[t] + g * f + dz[t] * v  # g_{t-1}
            dc0 = g
        dv = (dz * C[:-1]).sum((0, 1)) if ctx.needs_input_grad[2] else None  # dv = Σ dz_t c_{t-1}
        return tuple(None if grad is None or not need else grad.to(dtype) for grad, dtype, need
                     in zip((dz, du, dv, dc0), ctx.dtypes, ctx.needs_input_grad))
