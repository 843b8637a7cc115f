"""The CUDA-graph machinery of the Triton kernels' time loops (``kernels/common/graphs.py``),
on CPU.

What a real graph would get silently wrong is checked with a stand-in recorder: it records
the loop's buffers (every tensor the loops hold, by address) and, at every replay, asserts
that none was re-bound (a replay reads the recorded addresses) before re-running the loop.
With it the Triton kernels (under the interpreter) run captured and replayed on CPU: the
same call shape several times, with new inputs and updated parameters in between, two
calls of one shape alive at once (two layers), and every result compared with the
reference loop.  Plus the cache's policy (docs/design/graphs.md, "CUDA graphs: the capture
policy"): the keys, capture on the third sighting, busy slots, release on backward and on a
dropped autograd graph, the bounds on slots and on their memory, no thrashing under many
distinct shapes, no emptied allocator cache per capture, the switch, a failed capture, a
loop that raises, and which paths ``describe`` calls graphed.  The real capture:
``tests/gpu/``.
"""

from __future__ import annotations

import contextlib
import gc

import pytest
import torch

from lstmablate.cells import build_encoder
from lstmablate.cells.kernels import interface
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
    yield rec, cache
    interface.forget_failures()  # (a failed capture is listed process-wide)


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


def _sight(cache, key, times, runs=None):
    """``times`` calls of ``key`` that end at once (their slots released); the last slot."""
    for _ in range(times):
        slot = cache.acquire(key, _make(runs if runs is not None else []), CPU)
        slot.run("forward")
    return slot


CPU = torch.device("cpu")


def test_capture_on_the_third_sighting_and_replay_after(recorder):
    rec, cache = recorder
    runs = []
    for _ in range(2):  # seen once, twice: eager
        slot = cache.acquire("k", _make(runs), CPU)
        assert not slot.graphed
        slot.run("forward")
    third = cache.acquire("k", _make(runs), CPU)
    assert third.graphed and cache.keys() == ["k"]
    lease = graphs.Lease(third)
    third.run("forward")  # warm-up (this call's results), then recorded
    assert (rec.warmed, rec.recorded, rec.replayed) == (1, 1, 0)
    lease.release()
    fourth = cache.acquire("k", _make(runs), CPU)
    assert fourth is third
    fourth.run("forward")
    assert rec.replayed == 1 and runs == ["forward"] * 4  # eager, eager, warm-up, replay


def test_busy_slots_are_not_shared_and_leases_free_them(recorder):
    _, cache = recorder
    _sight(cache, "k", 2)
    a = cache.acquire("k", _make([]), CPU)
    lease_a = graphs.Lease(a)
    b = cache.acquire("k", _make([]), CPU)  # a is busy (its backward has not run)
    assert b is not a and b.graphed
    lease_b = graphs.Lease(b)
    del lease_a  # an autograd graph dropped without a backward frees its slot
    gc.collect()
    assert not a.busy and b.busy
    assert cache.acquire("k", _make([]), CPU) is a
    lease_b.release()
    assert not b.busy


def test_the_slots_are_bounded_and_a_full_cache_does_not_thrash(recorder):
    """At most ``max_slots``; a new key takes a free slot's place only once it has been seen
    twice as often as that slot's key (the least seen first); busy slots stay."""
    _, cache = recorder
    cache.max_slots = 2
    _sight(cache, "a", 3)
    _sight(cache, "b", 6)
    assert cache.keys() == ["a", "b"]
    assert not _sight(cache, "c", 5).graphed  # 5 < 2 x 3: "a" stays
    assert _sight(cache, "c", 1).graphed  # 6 >= 2 x 3: "a", the least seen, goes
    assert cache.keys() == ["b", "c"]
    busy = [graphs.Lease(cache.acquire(k, _make([]), CPU)) for k in ("b", "c")]
    assert not _sight(cache, "d", 30).graphed  # no free slot: eager
    del busy


def test_many_distinct_shapes_settle_on_the_frequent_ones(recorder):
    """A parser-like stream: 40 shapes, a few frequent and many rare, 4,000 calls into 8
    slots.  Each frequent shape is captured once and kept; the rare ones never get in; no
    shape is captured over and over (the old policy, capture on the second sighting and
    least-recently-used eviction, made hundreds of captures of such a stream)."""
    rec, cache = recorder
    cache.max_slots = 8
    gen = torch.Generator().manual_seed(0)
    weights = torch.tensor([50.0] * 6 + [1.0] * 34)  # 6 frequent lengths, 34 rare ones
    keys = torch.multinomial(weights, 4000, replacement=True, generator=gen).tolist()
    for k in keys:
        _sight(cache, k, 1)
    assert set(range(6)) <= set(cache.keys())
    assert cache.captures <= 8 + 6  # at most one eviction per slot, about
    assert rec.recorded == cache.captures


def test_the_slots_memory_is_bounded(recorder):
    """``max_bytes``: a new slot must fit beside the others (free ones may give way, as for
    the count); the buffers of a key are known from its eager calls."""
    _, cache = recorder

    def sized(n):
        def make(static):
            lp = CountingLoops(static)
            lp.runs, lp.buf = [], torch.zeros(n)
            return lp
        return make

    cache.max_bytes = 1000 * 4
    for key, n in (("a", 600), ("b", 600)):
        for _ in range(3):
            slot = cache.acquire(key, sized(n), CPU)
            slot.run("forward")
    assert cache.keys() == ["a"] and cache.used() == 600 * 4  # "b" does not fit beside "a"
    for _ in range(3):  # seen twice as often as "a" now: "a" gives way
        cache.acquire("b", sized(600), CPU).run("forward")
    assert cache.keys() == ["b"] and cache.used() <= cache.max_bytes


def test_capture_never_empties_the_allocator_cache(monkeypatch):
    """``CudaGraphs.record`` and ``warm_up`` (the real backend, on stand-ins for CUDA's
    graph and streams): a capture is begun and ended on a side stream and nothing
    synchronizes the device, collects garbage or empties PyTorch's allocator cache (what
    ``torch.cuda.graph`` does on entry, at every new shape); a loop that raises mid-capture
    still ends the capture."""
    events = []

    class Graph:
        def capture_begin(self, pool=None, capture_error_mode="global"):
            events.append(("begin", capture_error_mode))

        def capture_end(self):
            events.append("end")

    class Stream:
        def wait_stream(self, other):
            events.append("wait")

    def forbidden(*a, **k):
        raise AssertionError("a capture must not synchronize, collect or empty the cache")

    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: Stream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    for name in ("synchronize", "empty_cache"):
        monkeypatch.setattr(torch.cuda, name, forbidden)
    monkeypatch.setattr(gc, "collect", forbidden)
    backend = graphs.CudaGraphs()
    ran = []
    backend.warm_up(lambda: ran.append("warm"))
    graph = backend.record(lambda: ran.append("recorded"))
    assert isinstance(graph, Graph) and ran == ["warm", "recorded"]
    assert events.count(("begin", "thread_local")) == 1 and events.count("end") == 1

    def broken():
        raise RuntimeError("not permitted while capturing")
    with pytest.raises(RuntimeError, match="not permitted"):
        backend.record(broken)
    assert events.count("end") == 2


def test_the_switch_and_a_failed_capture_mean_eager(recorder, monkeypatch):
    rec, cache = recorder
    monkeypatch.setenv("LSTMABLATE_CUDA_GRAPHS", "0")
    for _ in range(4):
        assert not cache.acquire("k", _make([]), CPU).graphed
    monkeypatch.delenv("LSTMABLATE_CUDA_GRAPHS")

    def broken(fn):
        raise RuntimeError("capture failed\nsecond line")
    monkeypatch.setattr(rec, "record", broken)
    _sight(cache, "k", 2)
    slot = cache.acquire("k", _make([]), CPU)
    runs = []
    slot.loops.runs = runs
    with pytest.warns(RuntimeWarning, match="CountingLoops.*RuntimeError: capture failed\\)"):
        slot.run("forward")
    assert runs == ["forward"]  # the warm-up gave this call its results
    assert not slot.graphed and not _sight(cache, "j", 3).graphed
    slot.run("forward")
    assert runs == ["forward"] * 2


def test_a_loop_that_raises_leaves_the_cache(recorder):
    _, cache = recorder
    _sight(cache, "k", 2)
    slot = cache.acquire("k", _make([]), CPU)
    assert cache.keys() == ["k"]

    def boom():
        raise RuntimeError("launch failed")
    slot.loops.forward_loop = boom
    with pytest.raises(RuntimeError):
        slot.run("forward")
    assert cache.keys() == []


def test_describe_says_which_paths_are_graphed(monkeypatch):
    """``lstmablate bench``'s names: the recurrent loops are captured on CUDA (unless the
    switch is off), the scan is one launch with nothing to capture."""
    from lstmablate.cells.kernels.common.dispatch import describe
    from lstmablate.cells.kernels.call import Call
    from lstmablate.cells.kernels.interface import KernelPath

    cuda, cpu = Call(device_type="cuda"), Call(device_type="cpu")
    assert describe(KernelPath.TRITON_RECURRENT, cuda, False) == "triton-recurrent (CUDA graphs)"
    assert describe(KernelPath.TRITON_SCAN, cuda, False) == "triton-scan (one launch)"
    assert describe(KernelPath.TRITON_SCAN, cpu, False) == "triton-scan (interpreter)"
    monkeypatch.setenv("LSTMABLATE_CUDA_GRAPHS", "0")
    assert describe(KernelPath.TRITON_RECURRENT, cuda, False) == "triton-recurrent (eager)"


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
    w = torch.randn(3, 5)  # rows of 20 bytes: captured loops keep them padded to 32
    padded = lp.put("w_hh", w, align=True)
    assert torch.equal(padded, w) and padded.stride() == (8, 1)
    assert lp.put("w_hh", w * 3, align=True) is padded and torch.equal(padded, w * 3)
    assert lp.put("w4", torch.randn(3, 4), align=True).stride() == (4, 1)  # 16 bytes: as is
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
