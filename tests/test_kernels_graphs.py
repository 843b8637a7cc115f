"""The CUDA-graph machinery of the Triton kernels' time loops (``kernels/common/graphs.py``),
on CPU.

What a real graph would get silently wrong is checked with a stand-in recorder: it records
the loop's buffers (every tensor the loops hold, by address) and, at every replay, asserts
that none was re-bound (a replay reads the recorded addresses) before re-running the loop.
With it the Triton kernels (under the interpreter) run captured and replayed on CPU: the
same call shape several times, with new inputs and updated parameters in between, two
calls of one shape alive at once (two layers), and every result compared with the
reference loop.  Plus the cache's policy: the keys, capture on the second sighting, busy
slots, release on backward and on a dropped autograd graph, the bound on slots, the
switch, and a failed capture.  The real capture: ``tests/gpu/``.
"""

from __future__ import annotations

import gc

import pytest
import torch

from lstmablate.cells import build_encoder
from lstmablate.cells.kernels.common import graphs, triton_support

from fast_path_harness import assert_fast_matches_reference


class Recorder:
    """A stand-in for ``graphs.CudaGraphs``: records which tensors a loop holds."""

    def __init__(self):
        self.recorded = 0
        self.replayed = 0
        self.warmed = 0

    def warm_up(self, fn):
        self.warmed += 1
        fn()

    def record(self, fn):
        loops = fn.__self__
        held = {k: (v.data_ptr(), tuple(v.shape)) for k, v in vars(loops).items()
                if isinstance(v, torch.Tensor)}
        self.recorded += 1
        recorder = self

        class Graph:
            def replay(self):
                now = {k: (v.data_ptr(), tuple(v.shape)) for k, v in vars(loops).items()
                       if isinstance(v, torch.Tensor)}
                rebound = [k for k in held if now.get(k) != held[k]]
                assert not rebound, f"re-bound after their graph was recorded: {rebound}"
                recorder.replayed += 1
                fn()
        return Graph()


@pytest.fixture
def recorder(monkeypatch):
    rec = Recorder()
    cache = graphs.GraphCache(backend_for=lambda device: rec)
    monkeypatch.setattr(graphs, "CACHE", cache)
    return rec, cache


class CountingLoops(graphs.Loops):
    runs: list

    def forward_loop(self):
        self.runs.append("forward")

    def backward_loop(self):
        self.runs.append("backward")


def _make(runs):
    def make(static):
        lp = CountingLoops(static)
        lp.runs = runs
        return lp
    return make


def test_capture_on_the_second_sighting_and_replay_after(recorder):
    rec, cache = recorder
    runs = []
    dev = torch.device("cpu")
    first = cache.acquire("k", _make(runs), dev)
    assert not first.graphed  # seen once: eager
    first.run("forward")
    second = cache.acquire("k", _make(runs), dev)
    assert second.graphed and cache.keys() == ["k"]
    lease = graphs.Lease(second)
    second.run("forward")  # warm-up (this call's results), then recorded
    assert (rec.warmed, rec.recorded, rec.replayed) == (1, 1, 0)
    lease.release()
    third = cache.acquire("k", _make(runs), dev)
    assert third is second
    third.run("forward")
    assert rec.replayed == 1 and runs == ["forward"] * 3  # eager, warm-up, replay


def test_busy_slots_are_not_shared_and_leases_free_them(recorder):
    _, cache = recorder
    dev = torch.device("cpu")
    cache.acquire("k", _make([]), dev)  # first sighting
    a = cache.acquire("k", _make([]), dev)
    lease_a = graphs.Lease(a)
    b = cache.acquire("k", _make([]), dev)  # a is busy (its backward has not run)
    assert b is not a and b.graphed
    lease_b = graphs.Lease(b)
    del lease_a  # an autograd graph dropped without a backward frees its slot
    gc.collect()
    assert not a.busy and b.busy
    assert cache.acquire("k", _make([]), dev) is a
    lease_b.release()
    assert not b.busy


def test_keys_are_separate_and_the_slots_bounded(recorder):
    _, cache = recorder
    cache.max_slots = 2
    dev = torch.device("cpu")
    slots = {}
    for key in ("a", "b", "c"):
        cache.acquire(key, _make([]), dev)
        slots[key] = cache.acquire(key, _make([]), dev)
    assert cache.keys() == ["b", "c"]  # "a", the least recently used free slot, was dropped
    busy = [graphs.Lease(s) for s in slots.values()]
    cache.acquire("d", _make([]), dev)
    assert not cache.acquire("d", _make([]), dev).graphed  # no room: every slot is busy
    del busy


def test_the_switch_and_a_failed_capture_mean_eager(recorder, monkeypatch):
    rec, cache = recorder
    dev = torch.device("cpu")
    monkeypatch.setenv("LSTMABLATE_CUDA_GRAPHS", "0")
    for _ in range(3):
        assert not cache.acquire("k", _make([]), dev).graphed
    monkeypatch.delenv("LSTMABLATE_CUDA_GRAPHS")

    def broken(fn):
        raise RuntimeError("capture failed")
    monkeypatch.setattr(rec, "record", broken)
    cache.acquire("k", _make([]), dev)
    slot = cache.acquire("k", _make([]), dev)
    runs = []
    slot.loops.runs = runs
    with pytest.warns(RuntimeWarning, match="capturing a CUDA graph failed"):
        slot.run("forward")
    assert runs == ["forward"]  # the warm-up gave this call its results
    assert not slot.graphed and not cache.acquire("j", _make([]), dev).graphed
    slot.run("forward")
    assert runs == ["forward"] * 2


def test_graphs_are_never_asked_for_off_cuda():
    assert graphs._cuda_backend(torch.device("cpu")) is None
    slot = graphs.GraphCache().acquire("k", _make([]), torch.device("cpu"))
    assert not slot.graphed


def test_static_loops_copy_their_inputs():
    lp = graphs.Loops(static=True)
    a = torch.arange(6.0).view(2, 3).t()  # not contiguous
    buf = lp.put("w", a)
    assert buf.is_contiguous() and torch.equal(buf, a)
    assert lp.put("w", a * 2) is buf and torch.equal(buf, a * 2)
    assert lp.put("w", None, like=a) is buf and not buf.any()
    eager = graphs.Loops(static=False)  # a reference (contiguous), no copy
    c = a.contiguous()
    assert eager.put("w", c) is c and eager.put("v", a).is_contiguous()
    assert not eager.put("z", None, like=a).any()


needs_interpreter = pytest.mark.skipif(not triton_support.interpreting(),
                                       reason="needs Triton's interpreter (TRITON_INTERPRET=1)")


@needs_interpreter
@pytest.mark.parametrize("name", ["lstm-srnn", "gru", "mlstm", "mmrnn"])
def test_captured_loops_give_the_reference_numbers(name, recorder, monkeypatch):
    """The Triton kernels, captured and replayed: three calls of the same shapes with new
    inputs, new dropout masks and updated parameters each time (an optimizer step changes
    the weights in place), each against the reference loop.  Two layers: two slots of one
    key alive at once."""
    monkeypatch.setenv("LSTMABLATE_TRITON", "1")
    rec, cache = recorder
    torch.manual_seed(0)
    enc = build_encoder(name, 4, 3, num_layers=2, recurrent_dropout=0.25).double().train()
    opt = torch.optim.SGD(enc.parameters(), lr=0.5)
    for call in range(3):
        gen = torch.Generator().manual_seed(call)
        x = torch.randn(3, 5, 4, generator=gen, dtype=torch.float64)
        state = tuple(torch.softmax(torch.randn(2, 3, s, generator=gen, dtype=torch.float64), -1)
                      for s in enc.layers[0][0].state_sizes)
        assert_fast_matches_reference(enc, x, torch.tensor([5, 2, 4]), state, 1e-10,
                                      none_is_zero=True)
        enc(x)[0].square().sum().backward()
        opt.step()
        opt.zero_grad()
    assert rec.recorded >= 4 and rec.replayed >= 4  # both layers' forward and backward loops
    assert len(cache.keys()) >= 2
