"""Shared by the fast-path tests: run an encoder forward and backward, fast or reference."""

from __future__ import annotations

import torch

from lstmablate.cells.fused import reference_mode


def count_steps(cells) -> list[int]:
    """Make every cell count its reference ``step`` calls (the fast paths make none)."""
    calls = [0]
    for cell in cells:
        def step(*a, _orig=cell.step, **k):
            calls[0] += 1
            return _orig(*a, **k)
        cell.step = step
    return calls


def run_forward_backward(enc, x, lengths, state, reference, seed=5):
    """Forward + backward of a fixed random loss; returns every tensor to compare and the
    number of reference ``step`` calls made."""
    enc.zero_grad(set_to_none=True)
    calls = count_steps(enc.cells())
    xi = x.clone().requires_grad_(True)
    st = tuple(s.clone().requires_grad_(True) for s in state)
    torch.manual_seed(seed)  # the recurrent-dropout masks
    with reference_mode(reference):
        out, fin = enc(xi, lengths=lengths, state=st)
    g = torch.Generator().manual_seed(99)
    loss = (out * torch.randn(out.shape, generator=g, dtype=x.dtype)).sum()
    for s in fin:
        loss = loss + (s * torch.randn(s.shape, generator=g, dtype=x.dtype)).sum()
    loss.backward()
    res = {"out": out, **{f"final{k}": s for k, s in enumerate(fin)}, "dx": xi.grad}
    res.update({f"dstate{k}": s.grad for k, s in enumerate(st)})
    res.update({f"d{n}": p.grad for n, p in enc.named_parameters()})
    return res, calls[0]
