"""A GPU kernel that fails never ends training (``interface.KernelFamily._run``,
``common/guard.py``, ``common/graphs.py``), on CPU: the Triton kernels run under Triton's
interpreter, and a failure is injected at each point where one happens on a user's GPU —
the compilation (Triton builds its launcher with the host's C compiler and ``Python.h``),
the first launch of a kernel (of the forward, of the backward), a later launch (in the
middle of a loop, after training steps that worked; a replay of a captured loop), and the
capture of a CUDA graph.  Every time the training step still gives the reference loop's
numbers (float64, to 1e-10), one warning names the kernel, the error's first line and
``LSTMABLATE_TRITON=0``, the family stays on its next path for the rest of the process,
and the kernel record (what a run writes to ``env.json``) says which path each cell took.
"""

from __future__ import annotations

import json
import subprocess
import warnings

import pytest
import torch

from lstmablate.cells import build_encoder, get_cell
from lstmablate.cells.kernels import interface
from lstmablate.cells.kernels.common import graphs, triton_support
from lstmablate.cells.kernels.interface import kernel_record, plan_of
from lstmablate.run.runs import RunFiles

from cli_in_process import run_cli
from fast_path_harness import assert_fast_matches_reference
from test_kernels_graphs import Recorder

pytestmark = pytest.mark.skipif(not triton_support.interpreting(),
                                reason="needs Triton with its interpreter on (TRITON_INTERPRET=1)")
F64 = torch.float64

#: what Triton raises when it cannot build a kernel's launcher: no C compiler, no Python.h
NO_COMPILER = RuntimeError("Failed to find C compiler. Please specify via CC environment "
                           "variable or set triton.knobs.build.impl.")
NO_PYTHON_H = subprocess.CalledProcessError(1, ["gcc", "/tmp/main.c", "-O3", "-shared", "-fPIC",
                                                "-o", "/tmp/cuda_utils.so"])
#: a driver error on a launch: a message of several lines, of which the warning shows one
DRIVER = RuntimeError("Triton Error [CUDA]: an illegal memory access was encountered\n"
                      "CUDA kernel errors might be asynchronously reported at some other API call")


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    """Triton for every call, no failure remembered, a graph cache of the test's own."""
    monkeypatch.setenv("LSTMABLATE_TRITON", "1")
    monkeypatch.setattr(graphs, "CACHE", graphs.GraphCache())
    interface.forget_failures()
    interface.reset_kernel_record()
    yield
    interface.forget_failures()
    interface.reset_kernel_record()


def kernels(module: str):
    return __import__(f"lstmablate.cells.kernels.{module}.triton_kernels", fromlist=["_"])


def fail_from(monkeypatch, kernel, launch: int, error: BaseException) -> list[int]:
    """Make ``kernel``'s ``launch``-th launch (1-based; a compilation happens in the first)
    and every later one raise ``error``: Triton's own entry point, ``JITFunction.run``
    (``InterpretedFunction.run`` under the interpreter), is what ``kernel[grid](...)``
    calls.  Returns the count of launches so far."""
    calls = [0]
    real = kernel.run

    def run(*args, **kwargs):
        calls[0] += 1
        if calls[0] >= launch:
            raise error
        return real(*args, **kwargs)
    monkeypatch.setattr(kernel, "run", run)
    return calls


def _encoder(name, **opts):
    torch.manual_seed(0)
    return build_encoder(name, 3, 4, num_layers=2, bidirectional=True, **opts).double().train()


def _step(enc, seed=1):
    """One training step's forward and backward against the reference loop (float64)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 5, 3, generator=gen, dtype=F64)
    cell = enc.layers[0][0]
    state = tuple(torch.softmax(torch.randn(4, 3, s, generator=gen, dtype=F64), -1)
                  for s in cell.state_sizes)
    assert_fast_matches_reference(enc, x, torch.tensor([5, 2, 4]), state, 1e-10,
                                  none_is_zero=True)


def _one_warning(caught, *fragments):
    """Exactly one fallback warning, naming every fragment."""
    ours = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)
            and "failed" in str(w.message)]
    assert len(ours) == 1, ours
    for f in fragments:
        assert f in ours[0], (f, ours[0])
    return ours[0]


#: (cell, the Triton module, the forward's first kernel, the backward's first kernel)
CASES = [("lstm-srnn", "lstm", "lstm_step", "lstm_step_grad"),
         ("lstm-srnn-hidden", "lstm", "lstm_scan", "lstm_scan_grad"),
         ("gru", "gru", "gru_gates", "gru_step_grad"),
         ("mlstm", "lstm", "lstm_step", "lstm_step_grad"),
         ("mmrnn", "second_order", "mm_step", "mm_step_grad"),
         ("qrnn", "linear_scan", "linear_scan", "linear_scan_grad")]
IDS = [c[0] for c in CASES]


@pytest.mark.parametrize("error", [NO_COMPILER, NO_PYTHON_H], ids=["no-compiler", "no-python.h"])
@pytest.mark.parametrize("name,module,fwd,bwd", CASES, ids=IDS)
def test_a_kernel_that_does_not_compile_falls_back(name, module, fwd, bwd, error, monkeypatch):
    enc = _encoder(name)
    fail_from(monkeypatch, getattr(kernels(module), fwd), 1, error)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _step(enc)
    first = str(error).splitlines()[0]
    _one_warning(caught, fwd, first[:40], "LSTMABLATE_TRITON=0", "Python.h")
    family = type(interface.family_of(enc.layers[0][0])).__name__
    assert family  # (every case has a kernel family)
    record = kernel_record()
    assert [f["kernel"] for f in record["fallbacks"]] == [fwd]
    taken = record["paths"][name]
    assert not any(p.startswith("triton") for p in taken), taken  # the failed call re-ran
    # the family stays on its next path: the PyTorch (or native) loops here
    assert plan_of(enc.layers[0][0]) == "recurrent" or plan_of(enc.layers[0][0]) == "scan"


@pytest.mark.parametrize("name,module,fwd,bwd", CASES, ids=IDS)
def test_a_backward_kernel_that_fails_at_its_first_launch(name, module, fwd, bwd, monkeypatch):
    """The forward ran on Triton; its backward's first launch fails: the gradients are the
    fallback function's (``common/guard.py``), the reference numbers."""
    enc = _encoder(name, recurrent_dropout=0.25)
    fail_from(monkeypatch, getattr(kernels(module), bwd), 1, DRIVER)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _step(enc)
    _one_warning(caught, bwd, "an illegal memory access was encountered", "LSTMABLATE_TRITON=0")
    assert "asynchronously" not in _one_warning(caught)  # the first line only
    taken = kernel_record()["paths"][name]
    assert any(p.startswith("triton") for p in taken), taken  # the forwards were Triton's


def test_a_later_launch_that_fails_mid_loop(monkeypatch):
    """Two training steps on Triton, then a launch fails in the middle of a forward loop
    (its buffers half written): the call re-runs on the next path, the step's numbers are
    the reference's, and later steps stay there."""
    enc = _encoder("lstm-srnn")
    _step(enc, seed=1)
    _step(enc, seed=2)
    step = kernels("lstm").lstm_step
    calls = fail_from(monkeypatch, step, 1, DRIVER)
    calls[0] = -2  # two more launches work: the third of the next call's steps fails
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _step(enc, seed=3)
        _step(enc, seed=4)
    _one_warning(caught, "lstm_step", "an illegal memory access")
    assert calls[0] == 1  # one failed launch, and no launch after it
    taken = kernel_record()["paths"]["lstm-srnn"]
    assert taken["triton-recurrent"] > 0 and taken["recurrent"] > 0, taken


def test_a_replay_that_fails_drops_its_slot_and_falls_back(monkeypatch):
    """A captured loop whose replay raises (a later launch, on a graph): the slot leaves the
    cache, the call re-runs on the next path with the reference numbers."""
    rec = Recorder()
    cache = graphs.GraphCache(backend_for=lambda device: rec)
    monkeypatch.setattr(graphs, "CACHE", cache)
    enc = _encoder("lstm-srnn")
    for seed in range(1, 4):  # captured from the third sighting of a shape (two per step)
        _step(enc, seed=seed)
    assert rec.replayed > 0
    slots = len(cache.slots)

    def replay():
        raise DRIVER
    for _, slot in cache.slots.values():  # every recorded graph now fails when replayed
        for graph in slot.graphs.values():
            graph.replay = replay
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _step(enc, seed=5)
    _one_warning(caught, "triton-recurrent (lstm_family)", "an illegal memory access")
    assert len(cache.slots) == slots - 1  # the slot that raised was dropped


def test_a_failed_capture_runs_the_loops_eagerly(monkeypatch):
    """A capture that fails: warned once (naming the loops, the error's first line,
    LSTMABLATE_TRITON=0), recorded, the loops eager from then on, the numbers unchanged."""
    rec = Recorder()
    monkeypatch.setattr(graphs, "CACHE", graphs.GraphCache(backend_for=lambda device: rec))

    def broken(fn):
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing\nmore")
    monkeypatch.setattr(rec, "record", broken)
    enc = _encoder("gru")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for seed in range(1, 4):  # (two sightings of one shape per step: both directions)
            _step(enc, seed=seed)
    _one_warning(caught, "GRULoops", "operation not permitted when stream is capturing",
                 "LSTMABLATE_TRITON=0", "LSTMABLATE_CUDA_GRAPHS=0")
    fallbacks = kernel_record()["fallbacks"]
    assert [(f["family"], f["path"]) for f in fallbacks] == [("gru", "cuda-graphs")]
    assert graphs.CACHE.broken and plan_of(enc.layers[0][0]) == "triton-recurrent"


def test_running_out_of_memory_is_not_a_fallback(monkeypatch):
    """Another path needs memory too: an out-of-memory error ends the call as before."""
    oom = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)
    fail_from(monkeypatch, kernels("lstm").lstm_step, 1, oom("CUDA out of memory."))
    enc = _encoder("lstm-srnn")
    with pytest.raises(oom):
        enc(torch.randn(2, 3, 3, dtype=F64))
    assert not kernel_record()["fallbacks"]


def test_a_training_run_records_each_cells_path_and_the_fallback(tmp_path, tiny_recipe,
                                                                  monkeypatch):
    """A whole run whose Triton kernel cannot be built: it trains to the end on the next
    path, and its env.json says which path the cell took and what failed."""
    fail_from(monkeypatch, kernels("lstm").lstm_step, 1, NO_COMPILER)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = run_cli("train", "--task", "dyck", "--cell", "lstm-srnn", "--recipe", str(tiny_recipe),
                    "--set", "train.max_steps=2", "--out", "runs", "--threads", "1", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    _one_warning(caught, "lstm_step", "Failed to find C compiler")
    env = json.loads(RunFiles.of(tmp_path / "runs", "tiny", "lstm-srnn", 1).env.read_text())
    kernels_ = env["kernels"]
    assert kernels_["fallbacks"] == [{"family": "lstm_family", "path": "triton-recurrent",
                                      "kernel": "lstm_step",
                                      "error": f"RuntimeError: {NO_COMPILER}"}]
    assert set(kernels_["paths"]) == {"lstm-srnn"}
    assert set(kernels_["paths"]["lstm-srnn"]) == {"recurrent"}
    assert env["precision"]["train"] == "fp32"


def test_plans_pass_a_failed_family_by():
    """The plan of a family whose Triton kernels failed: cuDNN where the cell has one (on
    CUDA), else the PyTorch loops; other families are not affected."""
    lstm, srnn, gru = (get_cell(n).build(3, 4) for n in ("lstm", "lstm-srnn", "gru"))
    cuda = dict(device_type="cuda", triton=True, h_mask=True)  # (dropout: not cuDNN's)
    assert plan_of(lstm, **cuda) == plan_of(srnn, **cuda) == "triton-recurrent"
    with pytest.warns(RuntimeWarning, match="for the rest of this process"):
        interface.report_failure("lstm_family", interface.KernelPath.TRITON_RECURRENT, DRIVER)
    assert plan_of(srnn, **cuda) == "recurrent"
    assert plan_of(lstm, device_type="cuda", triton=True) == "torch-lstm"
    assert plan_of(get_cell("lstm-srnn-hidden").build(3, 4), **cuda) == "scan"  # every Triton path
    assert plan_of(gru, **cuda) == "triton-recurrent"
