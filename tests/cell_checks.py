"""Checks that the cell test files share: one step against a hand-written reference of the
equations, and the full Jacobian of one cell (``torch.autograd.gradcheck`` in float64)."""

from __future__ import annotations

import torch
from torch.func import functional_call

F64 = torch.float64


def assert_step_matches(cell, reference, batch: int = 2, seed: int = 0) -> None:
    """One step of the float64 ``cell`` from a random non-zero state equals
    ``reference(cell, x, state) -> (h, new_state)``: the output and every state component."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, cell.input_size, dtype=F64, generator=g)
    state = tuple(torch.randn(batch, n, dtype=F64, generator=g) for n in cell.state_sizes)
    out, new = cell(x.unsqueeze(0), state)
    h, new_ref = reference(cell, x, state)
    torch.testing.assert_close(out[0], h, atol=1e-12, rtol=1e-10)
    assert len(new) == len(new_ref) == len(cell.state_names)
    for a, b in zip(new, new_ref):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)


def gradcheck_cell(cell) -> bool:
    """The full (slow-mode) Jacobian of the float64 ``cell`` on 3 steps of 2 sequences, the
    second padded after 2 steps, w.r.t. the inputs, the initial state and every parameter."""
    names = [n for n, _ in cell.named_parameters()]
    params = tuple(p.detach().clone() for _, p in cell.named_parameters())
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 2, cell.input_size, dtype=F64, generator=g)
    state = tuple(torch.randn(2, n, dtype=F64, generator=g) for n in cell.state_sizes)
    mask = torch.tensor([[1.0, 1], [1, 1], [1, 0]], dtype=F64)

    def f(x, *rest):
        st, ps = rest[:len(state)], rest[len(state):]
        out, fin = functional_call(cell, dict(zip(names, ps)), (x, st, mask))
        return (out,) + tuple(fin)

    inputs = tuple(t.requires_grad_(True) for t in (x, *state, *params))
    return torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-6)


def assert_runs_alone(enc, x, lengths: list[int], state=None) -> None:
    """A padded batch through the float64 encoder ``enc`` (batch-first ``x``, a leaf that
    requires grad): zero outputs at padding, each sequence's outputs and final states those of
    running it alone, and no gradient reaching the padding."""
    out, fin = enc(x, lengths=torch.tensor(lengths), state=state)
    assert out.shape == (x.shape[0], x.shape[1], enc.output_size)
    for b, L in enumerate(lengths):
        assert torch.all(out[b, L:] == 0), "padding leaked into the outputs"
        alone, fin_alone = enc(x[b:b + 1, :L],
                               state=None if state is None else tuple(t[:, b:b + 1] for t in state))
        torch.testing.assert_close(out[b:b + 1, :L], alone, atol=1e-12, rtol=1e-10)
        for a, c in zip(fin, fin_alone):
            torch.testing.assert_close(a[:, b:b + 1], c, atol=1e-12, rtol=1e-10)
    (out.sum() + sum(t.sum() for t in fin)).backward()  # nothing flows back into the padding
    for b, L in enumerate(lengths):
        assert torch.all(x.grad[b, L:] == 0)
