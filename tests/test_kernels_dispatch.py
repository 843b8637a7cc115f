"""The calibrated dispatch (``lstmablate.cells.kernels.calibrate``): on CPU, for the cells
PyTorch has a kernel of its own for (``lstm``, ``lstm-gates``, ``gru`` with
``reset_after``), a call takes whichever of our native kernel and PyTorch's was faster in
a short timing on first use per machine and shape class, remembered in memory and on disk.

Each outcome is forced by replacing the timing (``calibrate.measure``); one test runs the
real timing at a tiny size.  Every test uses its own cache directory.
"""

from __future__ import annotations

import json

import pytest
import torch

from lstmablate.cells import build_encoder, get_cell
from lstmablate.cells.kernels.common import calibrate, delegate, native
from lstmablate.cells.kernels.gru import family as gru_kernels
from lstmablate.cells.kernels.interface import kernel_name_of, plan_of


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """A private cache directory for the decisions, none remembered, the calibration in
    charge (the native libraries are loaded first, from the usual cache)."""
    if native.library("lstm_family") is None or native.library("gru") is None:
        pytest.skip("the native kernels cannot be built here (PyTorch's are then always taken)")
    monkeypatch.setenv("LSTMABLATE_KERNEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("LSTMABLATE_TORCH_ON_CPU", "auto")
    monkeypatch.setenv("LSTMABLATE_CPU_GEMM", "mkl")  # (the large products' GEMM: not timed here)
    monkeypatch.setattr(calibrate, "_decisions", {})
    return tmp_path / "cache"


def _timing(monkeypatch, native_s: float, torch_s: float) -> list:
    """Replace the timing: native takes native_s, torch torch_s; returns the list of calls."""
    calls = []

    def measure(runners):
        assert set(runners) == {"native", "torch"}
        calls.append(runners)
        return {"native": native_s, "torch": torch_s}
    monkeypatch.setattr(calibrate, "measure", measure)
    return calls


CELLS = [("lstm", {}, "torch-lstm"), ("lstm-gates", {}, "torch-rnn"),
         ("gru", {"reset_after": True}, "torch-gru")]


@pytest.mark.parametrize("name,opts,theirs", CELLS, ids=["lstm", "lstm-gates", "gru-reset_after"])
@pytest.mark.parametrize("faster", ["torch", "native"])
def test_the_faster_path_is_taken(name, opts, theirs, faster, fresh, monkeypatch):
    calls = _timing(monkeypatch, *((2.0, 1.0) if faster == "torch" else (1.0, 2.0)))
    cell = get_cell(name).build(3, 4, **opts)
    ours = "recurrent"
    assert plan_of(cell, batch=8) == (theirs if faster == "torch" else ours)
    assert len(calls) == 1
    # what a forward call runs
    used = []
    for fn in ("torch_lstm", "torch_rnn", "torch_gru"):
        orig = getattr(delegate, fn)
        monkeypatch.setattr(delegate, fn, lambda *a, _o=orig, **k: used.append(1) or _o(*a, **k))
    x = torch.randn(5, 8, 3)
    out, _ = cell(x)
    out.sum().backward()
    assert bool(used) == (faster == "torch")
    assert len(calls) == 1  # the forward call found the decision
    # what the benchmark shows
    shown = kernel_name_of(cell, batch=8)
    assert shown == (f"{theirs} (calibrated)" if faster == "torch" else "recurrent (native, calibrated)")


@pytest.mark.parametrize("name,opts,theirs", CELLS, ids=["lstm", "lstm-gates", "gru-reset_after"])
def test_variable_lengths_keep_our_kernel_on_cpu(name, opts, theirs, fresh, monkeypatch):
    """PyTorch would run a variable-length call as a packed sequence, whose CPU backward
    zero-fills and adds a buffer of every token of the batch at each step (BiDAF's training
    step took twice as long): such calls keep our kernel even where PyTorch's was timed
    faster, without a timing; fixed-length calls still follow the timing."""
    calls = _timing(monkeypatch, 2.0, 1.0)  # PyTorch's "faster"
    cell = get_cell(name).build(3, 4, **opts)
    assert plan_of(cell, batch=8, mask="prefix") == "recurrent" and calls == []
    assert kernel_name_of(cell, batch=8, mask="prefix") == "recurrent (native)"  # no timing
    used = []
    for fn in ("torch_lstm", "torch_rnn", "torch_gru"):
        orig = getattr(delegate, fn)
        monkeypatch.setattr(delegate, fn, lambda *a, _o=orig, **k: used.append(1) or _o(*a, **k))
    x = torch.randn(5, 8, 3)
    mask = (torch.arange(5).unsqueeze(1) < torch.tensor([5, 3, 4, 2, 5, 1, 5, 5])).float()
    out, _ = cell(x, mask=mask)
    out.sum().backward()
    assert used == [] and calls == []
    assert plan_of(cell, batch=8) == theirs and len(calls) == 1
    monkeypatch.setenv("LSTMABLATE_TORCH_ON_CPU", "1")  # the user's override still wins
    assert plan_of(cell, batch=8, mask="prefix") == theirs


def test_one_timing_per_shape_class_remembered_on_disk(fresh, monkeypatch):
    calls = _timing(monkeypatch, 2.0, 1.0)
    cell = get_cell("lstm").build(3, 4)
    for batch in (5, 8, 6):  # one bucket: 8
        assert plan_of(cell, batch=batch) == "torch-lstm"
    assert len(calls) == 1
    assert plan_of(cell, batch=9) == "torch-lstm"  # bucket 16: timed again
    assert plan_of(cell, batch=8, grad=False) == "torch-lstm"  # inference is its own class
    assert plan_of(get_cell("lstm").build(3, 5), batch=8) == "torch-lstm"  # another hidden size
    assert len(calls) == 4
    doc = json.loads(next(fresh.glob("dispatch-*.json")).read_text())
    assert len(doc) == 4 and all(r["choice"] == "torch" for r in doc.values())
    key = next(k for k in doc if "|H4|B8|" in k and "|grad|" in k)
    assert key.startswith("lstm|float32|I3|H4|B8|t") and doc[key]["native_ms"] == 2000.0
    # a new process: nothing in memory, the file decides, no timing
    monkeypatch.setattr(calibrate, "_decisions", {})
    monkeypatch.setattr(calibrate, "measure", lambda r: pytest.fail("timed again"))
    assert plan_of(cell, batch=7) == "torch-lstm"
    assert not calibrate.decisions()[next(iter(calibrate.decisions()))].measured_here
    calibrate.forget()
    assert not list(fresh.glob("dispatch-*.json")) and not calibrate.decisions()


def test_the_switch_and_the_calls_pytorch_cannot_run_skip_the_timing(fresh, monkeypatch):
    monkeypatch.setattr(calibrate, "measure", lambda r: pytest.fail("timed"))
    lstm = get_cell("lstm").build(3, 4)
    monkeypatch.setenv("LSTMABLATE_TORCH_ON_CPU", "0")
    assert plan_of(lstm, batch=8) == "recurrent"
    assert kernel_name_of(lstm, batch=8) == "recurrent (native)"
    monkeypatch.setenv("LSTMABLATE_TORCH_ON_CPU", "1")
    assert plan_of(lstm, batch=8) == "torch-lstm"
    assert kernel_name_of(lstm, batch=8) == "torch-lstm"
    monkeypatch.setenv("LSTMABLATE_TORCH_ON_CPU", "auto")
    # no PyTorch kernel for these calls: nothing to time
    assert plan_of(lstm, batch=8, h_mask=True) == "recurrent"  # recurrent dropout
    assert plan_of(lstm, batch=8, mask="prefix0") == "recurrent"  # a length-0 row
    assert plan_of(get_cell("lstm").build(3, 4, proj_size=2), batch=8) == "recurrent"
    assert plan_of(get_cell("lstm-srnn").build(3, 4), batch=8) == "recurrent"
    assert plan_of(get_cell("gru").build(3, 4), batch=8) == "recurrent"  # eq 58 as printed
    assert plan_of(get_cell("mlstm").build(3, 4), batch=8) == "recurrent"
    # no batch size known (a plan asked without a call): ours
    assert plan_of(lstm) == "recurrent"
    # on CUDA, cuDNN without any timing
    assert plan_of(lstm, device_type="cuda", batch=8) == "torch-lstm"
    assert gru_kernels.KERNELS.plan(get_cell("gru").build(3, 4, reset_after=True),
                                    device_type="cuda", batch=8) == "torch-gru"


def test_the_real_timing_picks_the_faster_and_leaves_no_gradients(fresh, monkeypatch):
    seen = {}
    real = calibrate.measure

    def spy(runners):
        seen.update(real(runners))
        return dict(seen)
    monkeypatch.setattr(calibrate, "measure", spy)
    enc = build_encoder("lstm", 3, 4)
    cell = enc.layers[0][0]
    p = plan_of(cell, batch=2)
    assert seen["native"] > 0 and seen["torch"] > 0
    assert p == ("torch-lstm" if seen["torch"] < seen["native"] else "recurrent")
    assert all(q.grad is None for q in enc.parameters())  # the timing touched no .grad
    d = next(iter(calibrate.decisions().values()))
    assert d.measured_here and d.choice == ("torch" if p == "torch-lstm" else "native")


def test_the_benchmark_shows_the_chosen_path(fresh, monkeypatch):
    from lstmablate import bench

    _timing(monkeypatch, 2.0, 1.0)
    rows = bench.bench_cells(cells=["lstm", "lstm-srnn"], shapes=["4x5x8x1"], threads=1, repeats=1,
                             warmup=0)
    kernel = {r["cell"]: r["kernel"] for r in rows}
    assert kernel["lstm"] == "torch-lstm (calibrated)"
    assert kernel["lstm-srnn"] == "recurrent (native)"
    calibrate.forget()
    monkeypatch.setattr(calibrate, "_decisions", {})
    _timing(monkeypatch, 1.0, 2.0)
    rows = bench.bench_cells(cells=["lstm"], shapes=["4x5x8x1"], threads=1, repeats=1, warmup=0)
    assert next(r for r in rows if r["cell"] == "lstm")["kernel"] == "recurrent (native, calibrated)"
