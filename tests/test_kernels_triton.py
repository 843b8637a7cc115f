"""The Triton kernels (each family's ``lstmablate/cells/kernels/<family>/triton_kernels.py``)
against the reference step loop.

Without a GPU they run on CPU tensors under Triton's interpreter (``TRITON_INTERPRET=1``,
set by ``conftest.py``; ``LSTMABLATE_TRITON=1`` sends every call they can run to them),
which executes each program of a launch element for element as the GPU would.  For every
case each family declares (every flag set and every option that changes the arithmetic):
outputs, final states and every gradient (inputs, initial states, all parameters), through
stacked bidirectional encoders (so both directions see padding), with padded batches
(a length-0 row included) and recurrent-dropout masks: in float64 to 1e-10 against the
float64 reference loop; in float32 against a float64 reference, to a tolerance scaled to
each tensor and to the float32 reference loop's own error (``fast_path_harness``).  Tiny
shapes: the interpreter takes milliseconds per program.

Plus: every kernel compiles for NVIDIA GPUs (sm_90), ahead of time, on this CPU
(``compile_triton_kernels.py``); the same kernels compiled and run on a GPU:
``tests/gpu/``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lstmablate.cells import build_encoder, get_cell
from lstmablate.cells.kernels.common import triton_support
from lstmablate.cells.kernels.gru import family as gru
from lstmablate.cells.kernels.lstm import family as lstm_family
from lstmablate.cells.kernels.second_order import factored, multi_matrix
from lstmablate.cells.kernels.interface import kernel_name_of, plan_of

from fast_path_harness import assert_fast_matches_reference

pytestmark = pytest.mark.skipif(not triton_support.interpreting(),
                                reason="needs Triton with its interpreter on (TRITON_INTERPRET=1)")
F64 = torch.float64
HERE = Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def triton_everywhere(monkeypatch):
    monkeypatch.setenv("LSTMABLATE_TRITON", "1")


def _ids(cases):
    return [n + "".join(f"-{k}={v}" for k, v in o.items()) for n, o in cases]


def _random_state(enc, B, gen, dtype):
    """Random h (and c); keys on the simplex (what a key holds)."""
    cell = enc.layers[0][0]
    n = enc.num_layers * enc.num_directions
    state = []
    for name, size in zip(cell.state_names, cell.state_sizes):
        s = torch.randn(n, B, size, generator=gen, dtype=dtype)
        state.append(torch.softmax(s, -1) if name.startswith("key") else s)
    return tuple(state)


def _compare(name, opts, dtype, lengths, recurrent_dropout, layers=2, T=7, I=5, H=4):
    torch.manual_seed(0)
    enc = build_encoder(name, I, H, num_layers=layers, bidirectional=True,
                        recurrent_dropout=recurrent_dropout, **opts).to(dtype).train()
    cell = enc.layers[0][0]
    mask = "prefix0" if 0 in lengths else "prefix" if min(lengths) < T else "none"
    path = kernel_name_of(cell, dtype=dtype, mask=mask, h_mask=recurrent_dropout > 0)
    assert path.startswith("triton-") and path.endswith("(interpreter)"), path
    gen = torch.Generator().manual_seed(1)
    B = len(lengths)
    x = torch.randn(B, T, I, generator=gen, dtype=dtype) * 2
    state = _random_state(enc, B, gen, dtype)
    assert_fast_matches_reference(enc, x, torch.tensor(lengths), state, 1e-10, none_is_zero=True)
    out, _ = cell(x.transpose(0, 1)[:, :2].contiguous())  # one direction, one call: whose kernel?
    assert type(out.grad_fn).__name__.startswith("Triton"), type(out.grad_fn).__name__


RECURRENT = list(lstm_family.KERNELS.cases) + list(gru.KERNELS.cases) + list(factored.KERNELS.cases)


@pytest.mark.parametrize("name,opts", RECURRENT, ids=_ids(RECURRENT))
def test_float64_padding_and_recurrent_dropout(name, opts):
    _compare(name, opts, F64, [7, 3, 0, 5], 0.3)


@pytest.mark.parametrize("name,opts", RECURRENT, ids=_ids(RECURRENT))
def test_float32_padding(name, opts):
    _compare(name, opts, torch.float32, [7, 3, 1, 5], 0.0)


FULL = [("lstm", {}), ("lstm-srnn-hidden", {}), ("lstm-gates", {}), ("gru", {}), ("mlstm", {})]


@pytest.mark.parametrize("name,opts", FULL, ids=_ids(FULL))
def test_full_batches(name, opts):
    """No padding: the kernels' variants without lengths."""
    _compare(name, opts, F64, [7, 7, 7], 0.0)


MULTI = list(multi_matrix.KERNELS.cases)


@pytest.mark.parametrize("name,opts", MULTI, ids=_ids(MULTI))
def test_multi_matrix(name, opts):
    """mmRNN / mmLSTM (one program per batch row: the slowest to interpret, so one layer,
    four steps): float64 with padding and recurrent dropout; float32 with padding for the
    defaults."""
    _compare(name, opts, F64, [4, 2, 0], 0.3, layers=1, T=4, I=3, H=3)
    if not opts:
        _compare(name, opts, torch.float32, [4, 2, 1], 0.0, layers=1, T=4, I=3, H=3)


def test_larger_hidden_splits_into_programs():
    """A hidden size over one program's block (and over a multi-matrix row's chunk):
    several programs per launch, and the row loop of the mm kernels."""
    torch.manual_seed(0)
    for name, H in (("lstm-srnn", 300), ("mmrnn", 300)):
        enc = build_encoder(name, 3, H, num_layers=1).double().train()
        x = torch.randn(2, 3, 3, dtype=F64)
        state = tuple(torch.softmax(torch.randn(1, 2, s, dtype=F64), -1) for s in
                      enc.layers[0][0].state_sizes)
        assert_fast_matches_reference(enc, x, torch.tensor([3, 2]), state, 1e-10,
                                      none_is_zero=True)


def test_the_switch_decides_and_triton_is_never_needed(monkeypatch):
    """LSTMABLATE_TRITON=0 (or auto on CPU) keeps every CPU call off Triton; on CUDA the
    cells without a cuDNN kernel take it where it imports (call.triton), the others cuDNN."""
    cell = get_cell("lstm-srnn").build(3, 4)
    assert plan_of(cell) == "triton-recurrent"
    monkeypatch.setenv("LSTMABLATE_TRITON", "auto")
    assert plan_of(cell) == "recurrent"
    assert plan_of(cell, device_type="cuda", triton=True) == "triton-recurrent"
    assert plan_of(cell, device_type="cuda", triton=False) == "recurrent"
    assert plan_of(get_cell("lstm").build(3, 4), device_type="cuda", triton=True) == "torch-lstm"
    monkeypatch.setenv("LSTMABLATE_TRITON", "0")
    assert plan_of(cell, device_type="cuda", triton=True) == "recurrent"
    assert plan_of(cell, device_type="cuda", dtype=F64, triton=True) == "recurrent"


def test_without_triton_everything_works(tmp_path):
    """With ``import triton`` failing, a cell trains on CPU as before and a CUDA plan
    names the PyTorch loops."""
    code = """
import sys
sys.modules["triton"] = None  # import triton raises ImportError
import torch
from lstmablate.cells import build_encoder
from lstmablate.cells.kernels.interface import plan_of
enc = build_encoder("lstm-srnn", 3, 4, num_layers=2)
enc(torch.randn(2, 5, 3))[0].sum().backward()
print(plan_of(enc.layers[0][0], device_type="cuda"))
"""
    env = dict(os.environ, LSTMABLATE_TRITON="1")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "recurrent"


def test_every_kernel_compiles_for_the_gpu(tmp_path):
    """Triton's GPU compiler, run on this CPU: every kernel, every layout, to a cubin."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-cache")
    r = subprocess.run([sys.executable, str(HERE / "compile_triton_kernels.py"), "90"],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1].startswith("compiled "), r.stdout[-500:]
