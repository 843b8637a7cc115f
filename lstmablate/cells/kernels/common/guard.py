"""A Triton backward that fails: its gradients recomputed on the PyTorch path.

The forward of a Triton path is guarded where it is called (``interface.KernelFamily._run``:
a failure there re-runs the call on the family's next path).  The backward runs later,
inside ``loss.backward()``, where no other path can be chosen any more; so each Triton
autograd function names the PyTorch function of the same inputs and gradients
(``fallback``: ``RecurrentLSTM`` for ``TritonRecurrentLSTM``, ...; a class, or
``"package.module:NAME"`` where importing the module here would close an import cycle, as
for the second-order cells, whose family modules import their Triton module when they run
it), keeps its forward's
arguments, and when its backward raises, :meth:`GuardedFunction.guard` reports the failure
(the family falls back from its next call on, ``interface.report_failure``) and computes
the gradients by running the fallback's forward on the same arguments and its backward
on the same output gradients.  The numbers are the fallback's, i.e. the reference loop's up
to rounding.  This module does not import Triton.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import torch

from ..interface import KernelPath, recoverable, report_failure


class GuardedFunction(torch.autograd.Function):
    """The base of the Triton autograd functions (it is never applied itself).

    A subclass sets ``family`` (the kernel family's name), ``path`` (its Triton path) and
    ``fallback`` (the PyTorch autograd function with the same arguments, outputs and
    gradients); its forward calls :meth:`keep` with its arguments and its backward returns
    ``guard(ctx, grads, lambda: <the real backward>)``.
    """

    family: ClassVar[str]
    path: ClassVar[KernelPath]
    fallback: ClassVar[type[torch.autograd.Function] | str]

    @staticmethod
    def keep(ctx, *args: Any) -> None:
        """Keep the forward's arguments (references, not copies) for a recomputation."""
        ctx.args = args

    @classmethod
    def guard(cls, ctx, grads: Sequence[torch.Tensor | None],
              backward: Callable[[], tuple]) -> tuple:
        """``backward()``, or, when it raises a recoverable error, the fallback's gradients."""
        try:
            return backward()
        except Exception as err:  # noqa: BLE001  (see the module docstring)
            if not recoverable(err):
                raise
            lease = getattr(ctx, "lease", None)
            if lease is not None:
                lease.release()
            report_failure(cls.family, cls.path, err)
            return recompute(cls.fallback_function(), ctx.args, ctx.needs_input_grad, grads)

    @classmethod
    def fallback_function(cls) -> type[torch.autograd.Function]:
        """``fallback``, imported if it is named by a string."""
        if not isinstance(cls.fallback, str):
            return cls.fallback
        module, _, name = cls.fallback.partition(":")
        return getattr(importlib.import_module(module), name)


def recompute(function: type[torch.autograd.Function], args: Sequence[Any],
              needs: Sequence[bool], grads: Sequence[torch.Tensor | None]) -> tuple:
    """The gradients of ``function.apply(*args)``'s inputs (those ``needs`` asks for) given
    its outputs' gradients ``grads``: its forward again, then its backward."""
    with torch.enable_grad():
        inputs = [a.detach().requires_grad_(need) if isinstance(a, torch.Tensor) and need
                  else a for a, need in zip(args, needs)]
        outs = function.apply(*inputs)
        outs = outs if isinstance(outs, tuple) else (outs,)
        pairs = [(o, g.to(o.dtype)) for o, g in zip(outs, grads)
                 if g is not None and o.requires_grad]
        wanted = [i for i, (a, need) in enumerate(zip(inputs, needs))
                  if need and isinstance(a, torch.Tensor)]
        got = torch.autograd.grad([o for o, _ in pairs], [inputs[i] for i in wanted],
                                  [g for _, g in pairs], allow_unused=True) if pairs else ()
    out: list[torch.Tensor | None] = [None] * len(args)
    for i, g in zip(wanted, got):
        out[i] = g
    return tuple(out)
