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


def assert_fast_matches_reference(enc, x, lengths, state, tol, none_is_zero=False):
    """Run ``enc`` fast and reference; every output, final state and gradient must agree to
    ``tol``, the fast path must make no reference step, and padding must stay zero (outputs)
    and receive no gradient.  A missing gradient counts as a zero one with ``none_is_zero``;
    otherwise both sides must miss it alike (and then agree in dtype and shape too).
    Returns the fast path's tensors."""
    fast, n_fast = run_forward_backward(enc, x, lengths, state, reference=False)
    ref, n_ref = run_forward_backward(enc, x, lengths, state, reference=True)
    assert n_fast == 0 and n_ref > 0, "the fast path was not taken"
    assert fast.keys() == ref.keys()
    for k in ref:
        a, b = fast[k], ref[k]
        if none_is_zero:
            if a is None or b is None:  # no gradient = a zero gradient
                assert a is None or not a.any(), k
                assert b is None or not b.any(), k
                continue
        else:
            assert (a is None) == (b is None), k
            if a is None:
                continue
            assert a.dtype == b.dtype and a.shape == b.shape, k
        torch.testing.assert_close(a, b, atol=tol, rtol=tol, msg=lambda m, k=k: f"{k}: {m}")
    for b, L in enumerate(lengths.tolist()):
        assert torch.all(fast["out"][b, L:] == 0), "padding leaked into the outputs"
        assert torch.all(fast["dx"][b, L:] == 0), "gradient flowed into the padding"
    return fast


def assert_mask_with_holes_runs_the_reference(cell, x, compare_states=False):
    """A mask with a hole (a padded step before a real one) must take the reference loop
    (every step counted) and give what the forced reference gives."""
    mask = torch.tensor([[1.0, 1], [0, 1], [1, 1], [1, 0]], dtype=x.dtype)
    calls = count_steps([cell])
    out, st = cell(x, None, mask)
    assert calls[0] == 4
    with reference_mode():
        out_r, st_r = cell(x, None, mask)
    torch.testing.assert_close(out, out_r)
    if compare_states:
        for a, b in zip(st, st_r):
            torch.testing.assert_close(a, b)
