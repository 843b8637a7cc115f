"""The 2018 SRU's memory, the one piece of the cell that is sequential in time (Lei et al.,
EMNLP 2018, eqs 1-2):

    f_t = σ(z_t + v ∘ c_{t-1}),        c_t = f_t ∘ c_{t-1} + (1 − f_t) ∘ u_t,

given z_t = W_f x_t + b_f and u_t = W x_t of every step (one matrix product before) and v =
v_f, with the reverse pass written by hand (g_t = dL/dc_t):

    g_T = dC_T,   dz_t = g_t ∘ (c_{t-1} − u_t) ∘ f_t ∘ (1 − f_t),   du_t = g_t ∘ (1 − f_t),
    g_{t-1} = dC_{t-1} + g_t ∘ f_t + dz_t ∘ v,   dv = Σ_{t, rows} dz_t ∘ c_{t-1},   dc_0 = g_0,

in two implementations of the same loops: the **native kernel** (CPU, float32 / float64;
``sru.c``: each chunk of a row's units runs every step, the chunks split across threads) and
**PyTorch loops** (any device; no compiler; ``LSTMABLATE_NATIVE=0``), both in the packed
layout of ``common/sequences.Steps`` (step t runs only the sequences still running; the
memory is a state buffer, the B initial rows first), so no padded step is computed or kept.
The memory is carried
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
from ..common.sequences import Steps

LIBRARY = "sru"


class SRUMemory(torch.autograd.Function):
    """``C = SRUMemory.apply(S, z, u, v, c0)``: z, u (N, H) in the packed layout of ``S`` (a
    :class:`Steps`), v (H,), c0 (B, H) in the caller's row order -> the state buffer C
    (B + N, H) (``memory_dtype``): the B initial memories (sorted), then c_t of every real
    token."""

    @staticmethod
    def forward(ctx, S: Steps, z: Tensor, u: Tensor, v: Tensor, c0: Tensor) -> Tensor:
        H = z.shape[-1]
        dtype = memory_dtype(z.dtype)
        zz, uu, vv = (t.to(dtype).contiguous() for t in (z, u, v))
        C = S.state_buffer(c0, dtype=dtype)
        F = torch.empty_like(zz)  # f_t, for the backward
        lib = native.library_for(LIBRARY, zz.device.type, dtype)
        if lib is not None:
            lib.call("sru_fwd", dtype, _choose=False, T=S.T, B=S.B, off=S.off, H=H, z=zz, u=uu,
                     v=vv, C=C, F=F, par_min=native.PAR_MIN)
        else:
            zs, us, fs = S.per_step(zz), S.per_step(uu), S.per_step(F)
            for t, (c_prev, c_t) in enumerate(zip(S.states_in(C), S.states_out(C))):
                torch.sigmoid(torch.addcmul(zs[t], vv, c_prev), out=fs[t])  # eq 1: f_t
                # eq 2: c_t = u_t + f_t ∘ (c_{t-1} - u_t)
                torch.addcmul(us[t], fs[t], c_prev - us[t], out=c_t)
        ctx.native, ctx.steps, ctx.c0_shape = lib, S, c0.shape
        ctx.dtypes = (z.dtype, u.dtype, v.dtype, c0.dtype)
        ctx.save_for_backward(uu, vv, C, F)
        return C

    @staticmethod
    @once_differentiable
    def backward(ctx, dC: Tensor):
        u, v, C, F = ctx.saved_tensors
        S: Steps = ctx.steps
        B, H = S.B, u.shape[-1]
        dC = dC.to(C.dtype).contiguous()
        if ctx.native is not None:
            dz, du, dc0 = torch.empty_like(u), torch.empty_like(u), u.new_empty(B, H)
            ctx.native.call("sru_bwd", C.dtype, _choose=False, T=S.T, B=B, off=S.off, H=H, u=u,
                            v=v, C=C, F=F, dC=dC, dz=dz, du=du, dc0=dc0,
                            par_min=native.PAR_MIN)
        else:
            dz, du = torch.empty_like(u), torch.empty_like(u)
            G = dC.clone()  # G's step rows hold g_t once the loop has passed them
            gs, prev = S.states_out(G), S.states_in(C)
            fs, us, dzs, dus = S.per_step(F), S.per_step(u), S.per_step(dz), S.per_step(du)
            into = [G[:B]] + gs[:-1]  # the rows of step t - 1 (c_0 for t = 0)
            for t in range(S.T - 1, -1, -1):
                g, f = gs[t], fs[t]
                torch.mul(g, 1 - f, out=dus[t])  # du_t = g_t (1 - f_t)
                torch.mul(g * (prev[t] - us[t]), f * (1 - f), out=dzs[t])  # dz_t
                into[t][:S.rows(t)] += g * f + dzs[t] * v  # g_{t-1} = dC_{t-1} + ...
            dc0 = G[:B]
        return SRUMemory.grads(ctx, dz, du, dc0, C)

    @staticmethod
    def grads(ctx, dz: Tensor, du: Tensor, dc0: Tensor, C: Tensor) -> tuple:
        """``backward``'s result from the pass's dz, du and (sorted) dc0: dv = Σ dz_t c_{t-1}
        added, each gradient in its input's dtype (this and the Triton pass)."""
        S: Steps = ctx.steps
        dv = (dz.to(C.dtype) * S.prev(C)).sum(0) if ctx.needs_input_grad[3] else None
        dc0 = S.grad_of_initial(dc0, ctx.c0_shape)
        return (None,) + tuple(None if grad is None or not need else grad.to(dtype)
                               for grad, dtype, need in zip((dz, du, dv, dc0), ctx.dtypes,
                                                            ctx.needs_input_grad[1:]))
