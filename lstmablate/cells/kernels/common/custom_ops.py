"""A whole encoder as one PyTorch operator (``torch.library``), so ``torch.compile`` sees
through it instead of breaking its graph.

``torch.compile`` (Dynamo) traces Python into a graph of PyTorch operators.  The fast paths
of the cells are not such operators: they choose a path on the host (the mask's kind, the
switches, the calibration), call C through ctypes, launch Triton kernels, capture CUDA
graphs, and read lengths back to the host to run padding-free.  Traced, each of those
would break the graph (or be traced wrongly).  So while compiling, an
:class:`~lstmablate.cells.encoder.Encoder` is one opaque operator, ``lstmablate::encoder``:
the compiled graph calls it at run time, and it runs the encoder exactly as it runs
uncompiled — every fast path, the dropout between layers drawn from the same generator in
the same order — while the compiler fuses everything around it (embeddings, dropout,
attention, the softmax and the loss).

Its backward is a second operator, ``lstmablate::encoder_backward``.  The forward, when a
gradient is wanted, runs the encoder with autograd recording and keeps the outputs and the
inputs (the kernels' own autograd functions keep what they keep eagerly) under a token, a
0-d tensor it returns with the outputs; the backward takes the token and the outputs'
gradients and returns the inputs' (``torch.autograd.grad``, which leaves ``.grad`` alone:
the compiled graph accumulates them as any operator's).  A token whose backward never comes
(a forward whose loss was dropped) is forgotten after :data:`MAX_PENDING` more.

:func:`encoder_call` is what ``Encoder.forward`` calls while Dynamo traces it.
"""

from __future__ import annotations

import contextlib
import itertools
import weakref
from collections import OrderedDict
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import torch
from torch import Tensor

#: forward calls whose backward has not come yet, at most (the oldest is forgotten)
MAX_PENDING = 256

#: id(encoder) -> a weak reference to it (the operator takes the encoder by this key)
_ENCODERS: dict[int, weakref.ref] = {}
#: token -> (outputs, the inputs they are differentiated by) of a forward awaiting its backward
_PENDING: OrderedDict[int, tuple[list[Tensor], list[Tensor]]] = OrderedDict()
_TOKENS = itertools.count(1)


def _encoder(key: int):
    ref = _ENCODERS.get(key)
    enc = ref() if ref is not None else None
    if enc is None:
        raise RuntimeError(f"lstmablate::encoder: the encoder {key} no longer exists")
    return enc


def _masks(enc, recurrent: list[Tensor | None], between: list[Tensor | None]):
    """The encoder's ``StepMasks`` again (what it reads of them: the two lists)."""
    if not recurrent and not between:
        return None
    return SimpleNamespace(recurrent=list(recurrent), between=list(between))


#: the dispatcher's thread-local key sets of plain eager code (read at import, outside any
#: tracing): an operator's body runs below autograd and autocast, and inside a compiled
#: graph under the tracer's own sets; the encoder is run as in eager mode instead
_EAGER_TLS = (torch._C._dispatch_tls_local_include_set(),
              torch._C._dispatch_tls_local_exclude_set())


@contextlib.contextmanager
def _as_eager(device_type: str, autocast: str) -> Iterator[None]:
    """The dispatcher as plain eager code has it (autograd records), with autocast to
    ``autocast`` ("": off) as it was where the operator was traced."""
    dtype = getattr(torch, autocast) if autocast else None
    with torch._C._ForceDispatchKeyGuard(*_EAGER_TLS), \
            torch.autocast(device_type, dtype=dtype, enabled=dtype is not None):
        yield


@torch.library.custom_op("lstmablate::encoder", mutates_args=())
def encoder_op(key: int, x: Tensor, lengths: Tensor | None, state: list[Tensor],
               recurrent: list[Tensor | None], between: list[Tensor | None],
               params: list[Tensor], training: bool, needs: list[bool],
               autocast: str) -> list[Tensor]:
    """The encoder ``key`` on ``x`` (its own forward, eagerly): [outputs, *final state,
    token].  ``needs``: which of x, the state tensors and the parameters want a gradient
    (none: no token is kept); ``autocast``: the autocast dtype of the traced call ("": off)."""
    enc = _encoder(key)
    masks = _masks(enc, recurrent, between)
    if not any(needs):
        with _as_eager(x.device.type, autocast), torch.no_grad():
            out, final = enc(x, lengths, tuple(state) or None, masks)
        return [*_canonical(enc, out, final, [x, lengths, state]), _token(0)]
    n_x = 1 + len(state)
    leaves = [t.detach().requires_grad_(n) for t, n in zip([x, *state], needs[:n_x])]
    own = list(enc.parameters())  # (the same tensors as ``params``: the graph's inputs)
    with _as_eager(x.device.type, autocast), torch.enable_grad():
        out, final = enc(leaves[0], lengths, tuple(leaves[1:]) or None, masks)
    outputs = [out, *final]
    wrt = [t for t, n in zip([*leaves, *own], needs) if n]
    token = next(_TOKENS)
    _PENDING[token] = (outputs, wrt)
    while len(_PENDING) > MAX_PENDING:
        _PENDING.popitem(last=False)
    return [*_canonical(enc, out.detach(), [f.detach() for f in final], [x, lengths, state]),
            _token(token)]


def _token(value: int) -> Tensor:
    return torch.tensor(value, dtype=torch.int64)


def _canonical(enc, out: Tensor, final, inputs: list[Any]) -> list[Tensor]:
    """The outputs in the layout the fake kernel promises: time-major memory (batch-first:
    its transpose, what the encoder returns anyway), states contiguous, none aliasing one
    of ``inputs`` (the input, lengths and initial state: what an output can share memory
    with; None and lists allowed) or another output (a copy only where that is not already
    so)."""
    if enc.batch_first:
        out = out.transpose(0, 1).contiguous().transpose(0, 1)
    else:
        out = out.contiguous()
    return _unaliased([out, *(f.contiguous() for f in final)], inputs)


def _unaliased(outs: list[Tensor], inputs: list[Tensor]) -> list[Tensor]:
    """``outs`` with a copy of each one that shares memory with one of ``inputs`` or with an
    earlier output: a custom operator's outputs may alias neither (autograd passes a
    gradient through a copy or a view unchanged, so a backward can hand back its input)."""
    taken = {t.untyped_storage().data_ptr() for t in torch.utils._pytree.tree_leaves(inputs)
             if isinstance(t, Tensor) and t.untyped_storage().nbytes()}
    fresh = []
    for o in outs:
        ptr = o.untyped_storage().data_ptr()
        if o.untyped_storage().nbytes() and ptr in taken:
            o = o.clone()
            ptr = o.untyped_storage().data_ptr()
        taken.add(ptr)
        fresh.append(o)
    return fresh


@encoder_op.register_fake
def _encoder_fake(key, x, lengths, state, recurrent, between, params, training, needs,
                  autocast):
    enc = _encoder(key)
    B, T = (x.shape[0], x.shape[1]) if enc.batch_first else (x.shape[1], x.shape[0])
    out = x.new_empty((T, B, enc.output_size))  # time-major memory (:func:`_canonical`)
    out = out.transpose(0, 1) if enc.batch_first else out
    n = enc.num_layers * enc.num_directions
    finals = [x.new_empty(n, B, s) for s in enc.layers[0][0].state_sizes]
    return [out, *finals, torch.empty((), dtype=torch.int64)]


@torch.library.custom_op("lstmablate::encoder_backward", mutates_args=())
def encoder_backward_op(token: Tensor, grads: list[Tensor], like: list[Tensor]) -> list[Tensor]:
    """The gradients of the inputs a forward (``token``) was differentiated by, given its
    outputs' gradients ``grads``; ``like``: those inputs (their shapes)."""
    entry = _PENDING.pop(int(token), None)
    if entry is None:
        raise RuntimeError("lstmablate::encoder_backward: the forward of this backward was "
                           f"forgotten (more than {MAX_PENDING} forwards without a backward)")
    outputs, wrt = entry
    with _as_eager(grads[0].device.type, ""):
        got = torch.autograd.grad(outputs, wrt, grads, allow_unused=True)
    # (contiguous, as the fake kernel says; never one of the operator's inputs: a gradient
    # that passes through a copy or a view unchanged is ``grads``' own tensor)
    return _unaliased([w.new_zeros(w.shape) if g is None else g.contiguous()
                       for g, w in zip(got, wrt)], [token, *grads, *like])


@encoder_backward_op.register_fake
def _encoder_backward_fake(token, grads, like):
    return [t.new_empty(t.shape) for t in like]


def _setup_context(ctx, inputs, output) -> None:
    key, x, lengths, state, recurrent, between, params, training, needs, autocast = inputs
    ctx.needs = list(needs)
    ctx.n_state, ctx.n_masks = len(state), (len(recurrent), len(between))
    like = [t for t, n in zip([x, *state, *params], needs) if n]
    ctx.out_meta = [(o.shape, o.dtype, o.device) for o in output[:-1]]
    ctx.save_for_backward(output[-1], *like)


def _backward(ctx, grads):
    token, *like = ctx.saved_tensors
    gs = [torch.zeros(s, dtype=d, device=v) if g is None else g
          for g, (s, d, v) in zip(grads[:-1], ctx.out_meta)]
    got = iter(encoder_backward_op(token, gs, like) if like else [])
    per = [next(got) if n else None for n in ctx.needs]
    n_state = ctx.n_state
    n_rec, n_between = ctx.n_masks  # (every list input answered by a list of its length)
    return (None, per[0], None, per[1:1 + n_state], [None] * n_rec, [None] * n_between,
            per[1 + n_state:], None, None, None)


encoder_op.register_autograd(_backward, setup_context=_setup_context)


def register(enc) -> None:
    """Make ``enc`` known to the operator by its key (``Encoder.__init__`` does, outside any
    tracing: a traced function's writes to a dict happen only after its graph is made)."""
    key = id(enc)
    _ENCODERS[key] = weakref.ref(enc, lambda _r, key=key: _ENCODERS.pop(key, None))


def encoder_call(enc, x: Tensor, lengths: Tensor | None, state: Any, masks: Any):
    """``enc(x, lengths, state, masks)`` as one ``lstmablate::encoder`` operator (what
    ``Encoder.forward`` does while ``torch.compile`` traces it)."""
    key = id(enc)
    if isinstance(state, Tensor):
        state = (state,)
    state = list(state) if state is not None else []
    params = list(enc.parameters())
    grad = torch.is_grad_enabled()
    needs = [grad and t.requires_grad for t in [x, *state, *params]]
    recurrent = list(masks.recurrent) if masks is not None else []
    between = list(masks.between) if masks is not None else []
    if lengths is not None:
        lengths = torch.as_tensor(lengths).long()
    low = torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(
        x.device.type) else None
    res = encoder_op(key, x, lengths, state, recurrent, between, params, enc.training, needs,
                     str(low).removeprefix("torch.") if low is not None else "")
    return res[0], tuple(res[1:-1])
