"""What every hand-written kernel does around its loops: do the input products of all steps
at once, and turn the per-step buffers into what the caller sees (the call's mask is
classified before, by ``interface.mask_kind``).

Padding: the encoder's masks are *prefix* masks (each sequence is real up to its length).
The hand-written kernels run every row over all T steps and then take each sequence's
final state at its last real step (its initial state when the length is 0) and zero the
outputs at padding.  Nothing after a sequence's end feeds anything the caller sees, so
outputs, final states and all gradients are exactly those of the reference loop (which
carries the state through padding), and the loops have no masking work.  A mask that is
not a prefix mask (holes) makes the dispatch take the reference loop.
"""

from __future__ import annotations

import torch
from torch import Tensor


def input_products(x: Tensor, w_ih: Tensor, bias: Tensor | None,
                   out: Tensor | None = None) -> Tensor:
    """x_t W_ih^T (+ bias on the first bias.numel() columns) for all steps: (T, B, n*H)
    (into ``out``, a contiguous (T, B, n*H) buffer, when given)."""
    T, B, _ = x.shape
    x2 = x.reshape(T * B, -1)
    z = None if out is None else out.view(T * B, -1)
    if bias is not None and bias.shape[0] == w_ih.shape[0]:
        z = torch.addmm(bias, x2, w_ih.t(), out=z)
    else:
        z = torch.mm(x2, w_ih.t(), out=z)
        if bias is not None:
            z[:, :bias.shape[0]] += bias
    return z.view(T, B, -1)


def input_side_grads(dZ: Tensor, x: Tensor, w_ih: Tensor, bias: Tensor | None, need_x: bool,
                     need_w: bool, need_b: bool) -> tuple[Tensor | None, ...]:
    """The gradients of the input products' inputs from dZ (T, B, n*H), the gradient of
    :func:`input_products`'s result: dx = dZ W_ih, dW_ih = dZ^T X, db (one product each
    over all steps)."""
    T, B, _ = x.shape
    dZ2 = dZ.reshape(T * B, -1)
    dx = torch.mm(dZ2, w_ih).view(x.shape) if need_x else None
    dw_ih = torch.mm(dZ2.t(), x.reshape(T * B, -1)) if need_w else None
    db = dZ2[:, :bias.shape[0]].sum(0) if bias is not None and need_b else None
    return dx, dw_ih, db


def final(buf: Tensor, lengths: Tensor | None) -> Tensor:
    """buf (T+1, B, n) holds the states after steps 0..T (buf[0]: initial); take each row's
    last real one."""
    if lengths is None:
        return buf[-1].clone()
    return buf[lengths, torch.arange(buf.shape[1], device=buf.device)]


def masked_outputs(out: Tensor, lengths: Tensor | None) -> Tensor:
    """The outputs (T, B, n), zero at padding (a copy: never a view of a saved buffer)."""
    if lengths is None:
        return out.clone()
    T = out.shape[0]
    pad = torch.arange(T, device=out.device).unsqueeze(1) >= lengths.unsqueeze(0)  # (T, B)
    return out.masked_fill(pad.unsqueeze(-1), 0.0)


def outputs(Hs: Tensor, C: Tensor | None, lengths: Tensor | None
            ) -> tuple[Tensor, Tensor, Tensor | None]:
    """What a kernel returns from its buffers Hs (T+1, B, H) and C (T+1, B, H) or None: the
    outputs (zero at padding), h_n and c_n at each row's last real step."""
    return (masked_outputs(Hs[1:], lengths), final(Hs, lengths),
            final(C, lengths) if C is not None else None)


def state_grads_into_steps(dout: Tensor | None, dfinal: Tensor | None, lengths: Tensor | None,
                           like: Tensor) -> tuple[Tensor, Tensor | None]:
    """Fold the gradient of a final state into a (T, B, n) per-step gradient.

    Returns (per-step gradient, the part that goes straight to the initial state: rows
    whose length is 0, else None).  Gradients of padded outputs are dropped (those outputs
    are constant zeros).
    """
    T, B = like.shape[0], like.shape[1]
    g = like.new_zeros(like.shape) if dout is None else dout.clone(
        memory_format=torch.contiguous_format)
    direct = None
    if lengths is not None:
        pad = torch.arange(T, device=g.device).unsqueeze(1) >= lengths.unsqueeze(0)
        g.masked_fill_(pad.unsqueeze(-1), 0.0)
    if dfinal is None:
        return g, None
    if lengths is None:
        g[-1] += dfinal
        return g, None
    rows = torch.arange(B, device=g.device)
    real = lengths > 0
    g.index_put_((lengths.clamp(min=1) - 1, rows), dfinal * real.unsqueeze(-1).to(dfinal.dtype),
                 accumulate=True)
    if not bool(real.all()):
        direct = dfinal * (~real).unsqueeze(-1).to(dfinal.dtype)
    return g, direct


def add(a: Tensor | None, b: Tensor | None) -> Tensor | None:
    """a + b where either may be missing (None)."""
    if a is None:
        return b
    if b is None:
        return a
    return a + b
