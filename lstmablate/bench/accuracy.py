"""How close a fast path is to the reference step loop: one forward and backward of a fixed
random loss through an encoder, fast and reference, each compared with the same encoder run
through the reference loop in float64 (the exact function the lower precisions approximate).

Shared by the test suite (``tests/fast_path_harness.py`` asserts with it) and ``make
gpu-check`` (its ``paths`` stages report with it on the GPU, at the paper's shapes), so that
the rule a kernel passes on CPU is the rule it is held to on a GPU.

The rule: a result of the fast path passes when its largest error against the float64
reference is within

    max(REF_FACTOR * (largest error of the reference loop in the same precision),
        REL_F32 * (largest magnitude of the tensor))

so what is allowed scales with the tensor and with the rounding the plain loop itself makes
in that precision on that machine (float32; or bfloat16 / float16 under autocast, where the
loop's own error is large and sets the bound).  No fixed absolute tolerance: the summation
order of a product differs between machines, and one rounding can cross any fixed bound on a
small element; an error relative to the tensor's scale cannot be crossed that way, while any
real mistake (a wrong block, a missing term, a gradient off by a factor) is of the order of
the tensor itself, many orders above the bound.

Only PyTorch and :mod:`lstmablate.cells` are imported: gpu-check's stages run this on a
machine where the project's other dependencies may be missing.
"""

from __future__ import annotations

import copy
import math
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from lstmablate.cells import reference_mode

#: a fast result may be this many times as far from the float64 reference as the reference
#: loop in the same precision is ...
REF_FACTOR = 8.0
#: ... or this fraction of the tensor's largest magnitude (about 200 float32 roundings)
REL_F32 = 2e-5


def count_steps(cells) -> list[int]:
    """Make every cell count its reference ``step`` calls (the fast paths make none); the
    count is ``returned[0]``."""
    calls = [0]
    for cell in cells:
        def step(*a, _orig=cell.step, **k):
            calls[0] += 1
            return _orig(*a, **k)
        cell.step = step
    return calls


def fixed_between_dropout(enc, seed: int):
    """Make ``enc``'s dropout between layers (the plain kind: fresh per element, drawn from
    the global generator inside ``forward``, which ``masks`` cannot carry) draw its masks from
    a generator seeded with ``seed``, in float32 on the CPU, widened to the input's dtype and
    device: every run so patched (float64 reference, reference and fast path) drops the same
    elements.  Returns a function that undoes the patch."""
    if enc.variational_dropout or not enc.training or enc.dropout == 0:
        return lambda: None
    gen = torch.Generator().manual_seed(seed)
    p = enc.dropout

    def drop(inp: Tensor, mask: Tensor | None) -> Tensor:
        keep = (torch.rand(inp.shape, generator=gen) >= p).float() / (1 - p)
        return inp * keep.to(dtype=inp.dtype, device=inp.device)

    enc._drop_between = drop
    return lambda: enc.__dict__.pop("_drop_between", None)


def _loss_weights(shape, gen: torch.Generator, like: Tensor) -> Tensor:
    """Random loss weights, drawn in float32 on the CPU whatever the dtype and device (so a
    float64 copy of a float32 run gets the same weights, widened)."""
    return torch.randn(shape, generator=gen).to(dtype=like.dtype, device=like.device)


def run_forward_backward(enc, x, lengths, state, reference, seed=5, masks=None,
                         autocast: torch.dtype | None = None):
    """Forward + backward of a fixed random loss; returns (every tensor to compare by name,
    the number of reference ``step`` calls made, the dropout masks used).

    The recurrent-dropout masks are drawn (``enc.sample_masks`` after seeding with
    ``seed``) unless ``masks`` are given; plain dropout between layers draws the same
    elements in every run (:func:`fixed_between_dropout`).  ``autocast``: run the forward under
    ``torch.autocast`` in that dtype (bfloat16, float16), as mixed-precision training does."""
    enc.zero_grad(set_to_none=True)
    calls = count_steps(enc.cells())
    xi = x.clone().requires_grad_(True)
    st = tuple(s.clone().requires_grad_(True) for s in state)
    if masks is None:
        torch.manual_seed(seed)
        masks = enc.sample_masks(x.shape[0], like=x)
    mixed = (torch.autocast(x.device.type, dtype=autocast) if autocast is not None
             else nullcontext())
    undo = fixed_between_dropout(enc, seed)
    try:
        with reference_mode(reference), mixed:
            out, fin = enc(xi, lengths=lengths, state=st, masks=masks)
    finally:
        undo()
    g = torch.Generator().manual_seed(99)
    loss = (out * _loss_weights(out.shape, g, out)).sum()
    for s in fin:
        loss = loss + (s * _loss_weights(s.shape, g, s)).sum()
    loss.backward()
    res = {"out": out, **{f"final{k}": s for k, s in enumerate(fin)}, "dx": xi.grad}
    res.update({f"dstate{k}": s.grad for k, s in enumerate(st)})
    res.update({f"d{n}": p.grad for n, p in enc.named_parameters()})
    return res, calls[0], masks


def _widen(masks):
    """The dropout masks of a float32 run as float64 (the same values)."""
    def w(m):
        return None if m is None else m.double()
    return type(masks)([w(m) for m in masks.recurrent], [w(m) for m in masks.between])


def float64_reference(enc, x, lengths, state, masks, seed=5):
    """The reference loop of a float64 copy of ``enc`` on the widened inputs, state and
    masks: what the float32 (and mixed-precision) runs approximate.  Call before ``enc`` is
    run (a run patches its cells' ``step``)."""
    enc64 = copy.deepcopy(enc).double()
    for cell in enc64.cells():  # a deep copy keeps a patched step bound to the original
        cell.__dict__.pop("step", None)
    res, _, _ = run_forward_backward(enc64, x.double(), lengths, tuple(s.double() for s in state),
                                     reference=True, seed=seed, masks=_widen(masks))
    return res


def max_abs(t: Tensor) -> float:
    """The largest magnitude of ``t`` (0 for an empty tensor)."""
    return float(t.detach().abs().max()) if t.numel() else 0.0


def max_err(a: Tensor, ref64: Tensor) -> float:
    """The largest difference between ``a`` (any dtype) and the float64 ``ref64``."""
    return max_abs(a.detach().double() - ref64.detach())


def tolerance(ref_same: Tensor, ref64: Tensor) -> float:
    """What a fast result may differ from ``ref64``, given ``ref_same``, the reference loop's
    result in the fast result's precision (see the module docstring)."""
    return max(REF_FACTOR * max_err(ref_same, ref64), REL_F32 * max_abs(ref64), 1e-30)


def compared(fast: dict, ref: dict, ref64: dict):
    """(name, fast tensor, reference tensor, float64 reference tensor) for every result the
    runs have; a missing gradient counts as a zero one (a cell may leave a parameter or a
    state component it does not read untouched, and one run's autograd may set it to zeros
    where another's leaves it unset)."""
    for k in ref:
        runs = (fast.get(k), ref[k], ref64.get(k))
        like = next((t for t in runs if t is not None), None)
        if like is None:
            continue
        a, b, c = (torch.zeros_like(like) if t is None else t for t in runs)
        yield k, a, b, c.double()


@dataclass
class Accuracy:
    """One fast path against the float64 reference.  ``fast_path``: the fast path was taken
    (no reference ``step`` call was made); ``worst``: the tensor with the largest error
    relative to what it is allowed; ``error`` / ``allowed`` / ``scale``: that tensor's
    largest error, its bound and its largest magnitude; ``passed``: every tensor within its
    bound."""

    fast_path: bool
    worst: str
    error: float
    allowed: float
    scale: float
    passed: bool

    def to_row(self) -> dict[str, Any]:
        return dict(fast_path=self.fast_path, worst=self.worst, error=self.error,
                    allowed=self.allowed, scale=self.scale, passed=self.passed)


def measure_accuracy(enc, x: Tensor, lengths: Tensor | None, state: tuple[Tensor, ...],
                     autocast: torch.dtype | None = None) -> Accuracy:
    """Run ``enc`` (float32 parameters and inputs) fast and through the reference loop, both
    in the same precision (float32, or ``autocast``'s), and each output, final state and
    gradient of the fast run against the float64 reference (:func:`tolerance`)."""
    torch.manual_seed(5)
    masks = enc.sample_masks(x.shape[0], like=x)
    ref64 = float64_reference(enc, x, lengths, state, masks)
    fast, n_fast, _ = run_forward_backward(enc, x, lengths, state, reference=False, masks=masks,
                                           autocast=autocast)
    same, _, _ = run_forward_backward(enc, x, lengths, state, reference=True, masks=masks,
                                      autocast=autocast)
    worst = ("", 0.0, 0.0, 0.0, -1.0)
    passed = True
    for name, a, b, ref in compared(fast, same, ref64):
        err, allowed = max_err(a, ref), tolerance(b, ref)
        passed = passed and err <= allowed  # (a NaN error fails)
        ratio = err / allowed if math.isfinite(err) else math.inf
        if ratio > worst[4]:
            worst = (name, err, allowed, max_abs(ref), ratio)
    return Accuracy(fast_path=n_fast == 0, worst=worst[0], error=worst[1], allowed=worst[2],
                    scale=worst[3], passed=passed)
