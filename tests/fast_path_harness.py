"""Shared by the fast-path tests: run an encoder forward and backward, fast or reference,
and compare the two.

float64 runs are compared to the reference loop directly (to ``tol``: both compute the same
function in the same precision, and float64 rounding is far below any test tolerance).

float32 runs are compared against a **float64 reference**, the same encoder (parameters,
inputs, initial state, dropout masks and loss weights: the float32 values, widened) run
through the reference loop in float64, i.e. the exact function the float32 code
approximates.  A float32 result (the fast path's, and the float32 reference loop's own)
passes when its largest error is within

    max(REF_FACTOR * (largest error of the float32 reference loop),
        REL_F32 * (largest magnitude of the tensor))

so what is allowed scales with the tensor and with the rounding the plain float32 loop
itself makes on this CPU (which must itself be within ``REL_F32`` of the tensor's scale).
No fixed absolute tolerance: the summation order of a BLAS product differs between CPUs
(and between 1 and 2 threads), and one rounding can cross any fixed bound on a small
element; an error relative to the tensor's scale cannot be crossed
that way, while any real mistake (a wrong block, a missing term, a gradient off by a
factor) is of the order of the tensor itself, many orders above the tolerance.

The runs and the rule are :mod:`lstmablate.bench.accuracy`'s: ``make gpu-check`` holds the
fast paths on a GPU to the same rule, at the paper's shapes.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

from lstmablate.bench.accuracy import (REL_F32, count_steps, float64_reference,
                                       run_forward_backward, tolerance)
from lstmablate.bench.accuracy import max_abs as _max_abs, max_err as _max_err
from lstmablate.bench.measure import torch_threads
from lstmablate.cells import reference_mode


def assert_reference_accurate(ref32: torch.Tensor, ref64: torch.Tensor, name: str) -> None:
    """The float32 reference loop is within ``REL_F32`` of the tensor's scale of the float64
    one (a check of the yardstick itself: rounding only, no factor of its own error)."""
    err, scale = _max_err(ref32, ref64), _max_abs(ref64)
    assert err <= REL_F32 * scale + 1e-30, (
        f"{name}: the float32 reference loop is {err:.3g} from the float64 one (scale {scale:.3g})")


def float32_tolerance(ref32: torch.Tensor, ref64: torch.Tensor) -> float:
    """What a float32 result may differ from ``ref64`` (see the module docstring)."""
    return tolerance(ref32, ref64)


def assert_float32_close(a: torch.Tensor, ref32: torch.Tensor, ref64: torch.Tensor,
                         name: str) -> None:
    """``a`` (float32, the fast path's) is as close to the float64 reference as float32
    arithmetic allows (:func:`float32_tolerance`)."""
    assert a.dtype == torch.float32 and a.shape == ref64.shape, name
    tol, err = float32_tolerance(ref32, ref64), _max_err(a, ref64)
    assert err <= tol, (f"{name}: the fast path is {err:.3g} from the float64 reference (tensor "
                        f"scale {_max_abs(ref64):.3g}; the float32 reference loop's own error "
                        f"{_max_err(ref32, ref64):.3g}; allowed {tol:.3g})")


def _pairs(fast, ref, none_is_zero):
    """(name, fast tensor, reference tensor) for every result both have (see
    :func:`assert_fast_matches_reference` for ``none_is_zero``)."""
    assert fast.keys() == ref.keys()
    for k in ref:
        if k == "masks":
            continue
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
        yield k, a, b


def assert_fast_matches_reference(enc, x, lengths, state, tol, none_is_zero=False,
                                  fast_threads=None):
    """Run ``enc`` fast and reference; every output, final state and gradient must agree,
    the fast path must make no reference step, and padding must stay zero (outputs) and
    receive no gradient.  float64: to ``tol``; float32: both against the float64 reference
    (:func:`assert_float32_close`; ``tol`` is not used).  A missing gradient counts as a
    zero one with ``none_is_zero``; otherwise both sides must miss it alike (and then agree
    in dtype and shape too).  ``fast_threads``: run the fast path (only) with that many
    threads.  Returns the fast path's tensors."""
    masks = None
    ref64 = None
    if x.dtype == torch.float32:
        torch.manual_seed(5)
        masks = enc.sample_masks(x.shape[0], like=x)
        ref64 = float64_reference(enc, x, lengths, state, masks)
    with torch_threads(fast_threads) if fast_threads else nullcontext():
        fast, n_fast, masks = run_forward_backward(enc, x, lengths, state, reference=False,
                                                   masks=masks)
    ref, n_ref, _ = run_forward_backward(enc, x, lengths, state, reference=True, masks=masks)
    assert n_fast == 0 and n_ref > 0, "the fast path was not taken"
    for k, a, b in _pairs(fast, ref, none_is_zero):
        if ref64 is None:
            torch.testing.assert_close(a, b, atol=tol, rtol=tol, msg=lambda m, k=k: f"{k}: {m}")
        else:
            assert_reference_accurate(b, ref64[k], k)
            assert_float32_close(a, b, ref64[k], k)
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


def autograd_functions(out: torch.Tensor) -> set[str]:
    """The names of the autograd functions ``out`` was computed by (which kernel ran)."""
    seen, todo = set(), [out.grad_fn]
    while todo:
        fn = todo.pop()
        if fn is not None and fn not in seen:
            seen.add(fn)
            todo.extend(f for f, _ in fn.next_functions)
    return {type(fn).__name__ for fn in seen}


# -- the encoder comparisons of the kernel families' suites ----------------------------------

#: the batches of those comparisons: every length 1..T and a length-0 row; all rows full
VARLEN, FULL = [7, 1, 2, 0, 3, 4, 5, 6], [7, 7, 7]


def use_loops(kind: str, monkeypatch, library: str) -> str:
    """Make a test run on ``kind`` of a family's loops: ``"native"`` (its C library
    ``library``; skipped where it cannot be built) or ``"python"`` (its PyTorch loops)."""
    import pytest

    from lstmablate.cells.kernels.common import native

    if kind == "native":
        if native.library(library) is None:
            pytest.skip("the native kernel cannot be built here")
    else:
        monkeypatch.setenv("LSTMABLATE_NATIVE", "0")
    return kind


def random_state(enc, B: int, gen: torch.Generator, dtype: torch.dtype) -> tuple:
    """An initial state of ``enc`` (every layer and direction) for ``B`` rows, random (its
    magnitude where the cell's scan runs on log h: minGRU's and minLSTM's ``mode: log``)."""
    n = enc.num_layers * enc.num_directions
    cell = enc.layers[0][0]
    positive = getattr(cell, "log_space", False)
    return tuple(torch.randn(n, B, s, generator=gen, dtype=dtype).abs_() if positive else
                 torch.randn(n, B, s, generator=gen, dtype=dtype) for s in cell.state_sizes)


def compare_encoder(name: str, opts: dict, dtype: torch.dtype, lengths: list[int], T: int = 7,
                    bidirectional: bool = True, I: int = 5, H: int = 4, tol: float = 1e-10,
                    recurrent_dropout: float = 0.0, prepare=None):
    """A 2-layer encoder of cell ``name`` (options ``opts``) in ``dtype``, on a batch of those
    ``lengths`` (T steps) with a random initial state, fast against reference
    (:func:`assert_fast_matches_reference`; float64 to ``tol``); ``prepare(enc)`` may change
    its parameters first.  Returns the encoder."""
    from lstmablate.cells import build_encoder

    torch.manual_seed(0)
    enc = build_encoder(name, I, H, num_layers=2, bidirectional=bidirectional,
                        recurrent_dropout=recurrent_dropout, **opts).to(dtype).train()
    if prepare is not None:
        prepare(enc)
    gen = torch.Generator().manual_seed(1)
    B = len(lengths)
    x = torch.randn(B, T, I, generator=gen, dtype=dtype) * 2
    assert_fast_matches_reference(enc, x, torch.tensor(lengths), random_state(enc, B, gen, dtype),
                                  tol if dtype == torch.float64 else None)
    return enc


def assert_runs_on(cell, kernel: str, backward: str) -> None:
    """A float64 call of ``cell`` with some length 0 is named ``kernel`` by ``lstmablate
    bench``, and its output's graph holds the family's ``backward`` node."""
    from lstmablate.cells.kernels.interface import kernel_name_of

    assert kernel_name_of(cell, dtype=torch.float64, mask="prefix0") == kernel
    x = torch.randn(3, 2, cell.input_size, dtype=torch.float64, requires_grad=True)
    out, _ = cell(x)
    assert backward in autograd_functions(out)


def assert_element_wise_paths(cell, ours: str, triton: str) -> None:
    """The paths of a family whose recurrence reads no h_{t-1} through a matrix (the linear
    scan, the 2018 SRU): ``ours`` (C or PyTorch loops) on CPU and on CUDA without Triton,
    whatever the mask of h; ``triton`` on CUDA, under autocast too; the reference loop for a
    mask with holes and for low precision without Triton (``LSTMABLATE_TRITON=auto``)."""
    from lstmablate.cells.kernels.interface import plan_of

    bf16 = torch.bfloat16
    assert plan_of(cell) == plan_of(cell, mask="prefix0", h_mask=True) == ours
    assert plan_of(cell, dtype=torch.float64) == ours
    assert plan_of(cell, mask="other") == "reference"  # holes in the mask
    assert plan_of(cell, autocast=True, dtype=bf16) == "reference"  # no Triton
    assert plan_of(cell, dtype=bf16) == "reference"  # bfloat16 without autocast
    cuda = dict(device_type="cuda", triton=True)
    assert plan_of(cell, **cuda) == plan_of(cell, autocast=True, dtype=bf16, **cuda) == triton
    assert plan_of(cell, device_type="cuda", triton=False) == ours  # the PyTorch loops
