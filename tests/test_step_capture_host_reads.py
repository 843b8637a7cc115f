"""``train.step_capture=graphs`` records a whole training step as a CUDA graph, which nothing
inside may read back to the host (an ``.item()``, a ``.tolist()``, a boolean selection, a
comparison answered on the host).  On the CPU, under a guard that fails on every such read,
the training step of each variable-length task -- a batch padded to its bucket, the forward,
the loss, the backward, clipping and an optimiser step -- runs as the encoder runs while a
graph records (``cells.encoder.capturing``: the lengths as device tensors, the masked loops),
and gives the numbers of the ordinary eager step.  The guard itself fails on the ordinary
step (the padding-free fast paths plan their steps from the lengths on the host)."""

from __future__ import annotations

import contextlib
import functools

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from lstmablate.cells import build_encoder
from lstmablate.cells import encoder as encoder_module
from test_step_capture_padding import TASKS, _double, tiny_task
from tolerance import assert_close

aten = torch.ops.aten
#: operators whose result is read on the host (a number, a data-dependent shape)
HOST_READS = {aten._local_scalar_dense, aten.nonzero, aten.equal, aten.is_nonzero,
              aten.masked_select, aten._unique2, aten.unique_consecutive, aten.unique_dim,
              aten.nonzero_static, aten.argwhere}


class HostRead(AssertionError):
    pass


class NoHostReads(TorchDispatchMode):
    """Fails on any operator that reads a tensor's values back to the host."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in HOST_READS:
            raise HostRead(f"{func} reads a tensor back to the host")
        if func.overloadpacket in (aten.index, aten.index_put, aten.index_put_) and any(
                isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1] or []):
            raise HostRead(f"{func} with a boolean mask: its shape is read on the host")
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def no_host_reads(monkeypatch):
    """The guard, and ``.tolist()`` / ``.numpy()`` (which read without an operator) refused."""
    def refuse(name):
        def method(self, *a, **k):
            raise HostRead(f"Tensor.{name}() reads a tensor back to the host")
        return method

    with monkeypatch.context() as m:
        for name in ("tolist", "numpy", "__array__"):
            m.setattr(torch.Tensor, name, refuse(name))
        with NoHostReads():
            yield


def _step(task, model, batch):
    """Loss, backward, clipping (global norm 5) and an SGD step; the loss, the gradients
    before clipping, the norm and the parameters after the step."""
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = None
    torch.manual_seed(3)
    out = task.loss(model, batch, None)
    out.loss.backward()
    grads = [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in params]
    norm = torch.nn.utils.clip_grad_norm_(params, 5.0, foreach=True)
    with torch.no_grad():
        torch._foreach_add_([p for p in params if p.grad is not None],
                            [p.grad for p in params if p.grad is not None], alpha=-0.1)
    return out.loss.detach(), grads, norm.detach(), [p.detach().clone() for p in params]


def _fresh(key):
    task = tiny_task(key)
    torch.manual_seed(0)
    model = task.build_model(functools.partial(build_encoder, "lstm")).double().train()
    batch = _double(task.train_plan(0, torch.Generator().manual_seed(1))[0])
    length = task.batch_length(batch)
    target = length + 2 if isinstance(length, int) else tuple(n + 2 for n in length)
    return task, model, task.pad_batch(batch, target)


@pytest.mark.parametrize("key", sorted(TASKS))
def test_the_recorded_step_reads_nothing_back_and_equals_the_eager_step(key, monkeypatch):
    task, model, batch = _fresh(key)
    want = _step(task, model, batch)
    task, model, batch = _fresh(key)
    monkeypatch.setattr(encoder_module, "capturing", lambda x: True)  # as under a recording
    with no_host_reads(monkeypatch):
        got = _step(task, model, batch)
    (loss, grads, norm, params), (w_loss, w_grads, w_norm, w_params) = got, want
    assert_close(loss, w_loss, dtype=torch.float64, msg=f"{key} loss")
    assert_close(norm, w_norm, dtype=torch.float64, msg=f"{key} norm")
    scale = max(float(g.abs().max()) for g in w_grads)
    for a, b in zip(grads, w_grads):
        assert_close(a, b, dtype=torch.float64, scale=scale, msg=f"{key} gradient")
    for a, b in zip(params, w_params):  # (a parameter near 0: the update's roundings)
        assert_close(a, b, dtype=torch.float64, scale=max(float(b.abs().max()), 0.1 * scale),
                     msg=f"{key} parameter")


@pytest.mark.parametrize("key", ["nmt", "sst"])
def test_the_guard_catches_the_ordinary_steps_host_reads(key, monkeypatch):
    task, model, batch = _fresh(key)
    with pytest.raises(HostRead), no_host_reads(monkeypatch):
        _step(task, model, batch)
    with pytest.raises(HostRead), no_host_reads(monkeypatch):  # a boolean selection
        torch.arange(4)[torch.arange(4) > 1].sum()
