"""The shared scan kernel of the linear-scan cells (``lstmablate/cells/kernels/linear_scan/``:
``qrnn`` with every pooling and filter width, ``sru-2017``, ``mingru``, ``minlstm``) against
the reference step loop.

For every case the family declares: outputs, final states and every gradient (inputs,
initial states, all parameters) through stacked bidirectional encoders (so the backward
direction sees padding too) with random initial states, on batches with every length 1..T
and a length-0 row, and on full batches: in float64 to 1e-10, in float32 against a float64
reference to a tolerance scaled to each tensor (``fast_path_harness``), on the native (C)
loops, the PyTorch loops and, under Triton's interpreter, the Triton kernels (also under
bfloat16 autocast, the memory carried in float32).  Padded outputs are exactly zero and
receive no gradient (the harness).  Plus: the pass itself by hand and by gradcheck, which
path each call takes, the QRNN's zoneout, a subclass that changes the arithmetic, and the
native loop split across threads.
"""

from __future__ import annotations

import pytest
import torch

from lstmablate.cells import build_encoder, get_cell, reference_mode
from lstmablate.cells.kernels.common import native, triton_support
from lstmablate.cells.kernels.common.sequences import Steps
from lstmablate.cells.kernels.interface import kernel_name_of, plan_of
from lstmablate.cells.kernels.linear_scan import family
from lstmablate.cells.kernels.linear_scan.loops import LIBRARY, LinearScan
from lstmablate.cells._elementwise import SCAN_KERNELS, SCAN_MATH, ElementwiseCell
from lstmablate.cells.base import FastKernels
from lstmablate.cells.minrnn import MinGRUCell
from lstmablate.cells.sru import SRUCell

from fast_path_harness import (FULL, VARLEN, assert_fast_matches_reference,
                               assert_mask_with_holes_runs_the_reference, autograd_functions,
                               assert_element_wise_paths, compare_encoder, random_state,
                               use_loops)
from test_kernels_low_precision import assert_low_precision_close

F64 = torch.float64
#: every linear-scan case of the family
CASES = list(family.KERNELS.cases)
IDS = [n + "".join(f"-{k}={v}" for k, v in o.items()) for n, o in CASES]
T = 7
interpreted = pytest.mark.skipif(not triton_support.interpreting(),
                                 reason="needs Triton with its interpreter on (TRITON_INTERPRET=1)")


def _native_or_skip():
    use_loops("native", None, LIBRARY)


@pytest.fixture(params=["native", "python"])
def loops(request, monkeypatch):
    """native: the C loops (the CPU default); python: the PyTorch loops (no compiler)."""
    return use_loops(request.param, monkeypatch, LIBRARY)


def _compare(name, opts, dtype, lengths, **kw):
    """(A ``mode: log`` cell gets a positive random initial state, so its calls run the log
    pass: ``fast_path_harness.random_state``; more: tests/test_cells_minrnn_log.py.)"""
    return compare_encoder(name, opts, dtype, lengths, T, **kw)


def _backward(opts) -> str:
    """The pass of a call from the zero initial state: the log pass for ``mode: log``."""
    return "LogLinearScanBackward" if opts.get("mode") == "log" else "LinearScanBackward"


@pytest.mark.parametrize("name,opts", CASES, ids=IDS)
@pytest.mark.parametrize("lengths", [VARLEN, FULL], ids=["varlen", "full"])
def test_float64_matches_the_reference(name, opts, lengths, loops):
    enc = _compare(name, opts, F64, lengths)
    cell = enc.layers[0][0]
    want = "scan (native)" if loops == "native" else "scan (pytorch)"
    assert kernel_name_of(cell, dtype=F64, mask="prefix0") == want
    out, _ = cell(torch.randn(3, 2, 5, dtype=F64, requires_grad=True))
    assert _backward(opts) in autograd_functions(out)


@pytest.mark.parametrize("name,opts", CASES, ids=IDS)
def test_float32_matches_a_float64_reference(name, opts, loops):
    _compare(name, opts, torch.float32, [7, 1, 2, 3, 4, 5, 6, 7])


@pytest.mark.parametrize("name,opts", [("qrnn", {"window": 2}), ("minlstm", {})],
                         ids=["qrnn-window=2", "minlstm"])
def test_unidirectional_and_input_size_unlike_hidden(name, opts, loops):
    _compare(name, opts, F64, VARLEN, bidirectional=False, I=3, H=6)


def test_recurrent_dropout_has_nothing_to_mask(loops):
    """No product reads h_{t-1}: with the encoder's recurrent-dropout masks drawn, the scan
    still gives the reference loop's numbers (which ignore them too)."""
    _compare("qrnn", {"gates": "ifo"}, F64, VARLEN, recurrent_dropout=0.3)


def test_sru_2017_with_a_skip_projection(loops):
    """``sru-2017`` whose input size differs from its hidden size: the highway's x_t is a
    projection (a fourth block of ``weight_ih``)."""
    enc = _compare("sru-2017", {}, F64, VARLEN, I=3, H=6)
    assert enc.layers[0][0].project_skip


def test_native_loop_split_across_threads(monkeypatch):
    """Two threads, every call's columns split between them (``PAR_MIN = 1``, more columns
    than one chunk of the C loop): the same numbers."""
    _native_or_skip()
    monkeypatch.setattr(native, "PAR_MIN", 1)
    torch.manual_seed(0)
    enc = build_encoder("qrnn", 16, 160, num_layers=2, bidirectional=True,
                        gates="ifo").double()  # 4 rows x 160 units: 640 columns, two chunks
    x = torch.randn(4, 9, 16, dtype=F64)
    zeros = tuple(torch.zeros(4, 4, s, dtype=F64) for s in enc.layers[0][0].state_sizes)
    assert_fast_matches_reference(enc, x, torch.tensor([9, 3, 0, 6]), zeros, 1e-10,
                                  fast_threads=2)


# ---------------------------------------------------------------------------------
# the pass itself
# ---------------------------------------------------------------------------------

def test_the_pass_by_hand(loops):
    """c_1 = .5 * 1 + 1 * 2 = 2.5, c_2 = .25 * 2.5 + 2 * 4 = 8.625; with dL/dc_2 = 1 and
    dL/dc_1 = 3: g_2 = 1, g_1 = 3 + .25 = 3.25, g_0 = .5 * 3.25 = 1.625."""
    keep = torch.tensor([[0.5], [0.25]], dtype=F64, requires_grad=True)
    write = torch.tensor([[1.0], [2.0]], dtype=F64, requires_grad=True)
    content = torch.tensor([[2.0], [4.0]], dtype=F64, requires_grad=True)
    c0 = torch.tensor([[1.0]], dtype=F64, requires_grad=True)
    C = LinearScan.apply(Steps(2, 1, None, "cpu"), keep, write, content, c0)
    assert C.flatten().tolist() == [1.0, 2.5, 8.625]
    (C[1] * 3 + C[2]).sum().backward()
    assert keep.grad.flatten().tolist() == [3.25 * 1.0, 1 * 2.5]  # g_t c_{t-1}
    assert write.grad.flatten().tolist() == [3.25 * 2.0, 1 * 4.0]  # g_t content_t
    assert content.grad.flatten().tolist() == [3.25 * 1.0, 1 * 2.0]  # g_t write_t
    assert c0.grad.flatten().tolist() == [1.625]


def test_the_padded_pass_by_hand(loops):
    """Rows of lengths 1, 0, 2 (caller's order): sorted 2, 1, 0, so step 0 runs the rows
    (2, 1) and step 1 the row 2 alone; the packed tokens are (step 0: row 2, row 0; step 1:
    row 2).  Row 2 as test_the_pass_by_hand; row 0: c_1 = .5 * 2 + 3 * 1 = 4; row 1 never
    runs.  The gradient of c_0 reaches each row in the caller's order: row 0 gets .5 * 5,
    row 1 its own 7, row 2 .5 * 3.25."""
    S = Steps(2, 3, torch.tensor([1, 0, 2]), "cpu")
    assert S.off == [0, 2, 3]
    keep = torch.tensor([[0.5], [0.5], [0.25]], dtype=F64, requires_grad=True)
    write = torch.tensor([[1.0], [3.0], [2.0]], dtype=F64, requires_grad=True)
    content = torch.tensor([[2.0], [1.0], [4.0]], dtype=F64, requires_grad=True)
    c0 = torch.tensor([[2.0], [-1.0], [1.0]], dtype=F64, requires_grad=True)
    C = LinearScan.apply(S, keep, write, content, c0)
    # the state buffer: the initial rows sorted (rows 2, 0, 1), then c of every token
    assert C.flatten().tolist() == [1.0, 2.0, -1.0, 2.5, 4.0, 8.625]
    assert S.final(C).flatten().tolist() == [4.0, -1.0, 8.625]
    (C[3] * 3 + C[4] * 5 + C[5] + C[2] * 7).sum().backward()
    assert keep.grad.flatten().tolist() == [3.25 * 1.0, 5 * 2.0, 1 * 2.5]
    assert write.grad.flatten().tolist() == [3.25 * 2.0, 5 * 1.0, 1 * 4.0]
    assert content.grad.flatten().tolist() == [3.25 * 1.0, 5 * 3.0, 1 * 2.0]
    assert c0.grad.flatten().tolist() == [0.5 * 5, 7.0, 0.5 * 3.25]


def _gradcheck(function):
    """gradcheck of the pass, unpadded and with lengths 4, 0, 2, 3 (every row's tokens)."""
    gen = torch.Generator().manual_seed(0)
    for T, B, lengths in ((4, 2, None), (4, 4, torch.tensor([4, 0, 2, 3]))):
        S = Steps(T, B, lengths, "cpu")
        keep = torch.rand(S.N, 3, generator=gen, dtype=F64)
        write, content = (torch.randn(S.N, 3, generator=gen, dtype=F64) for _ in range(2))
        c0 = torch.randn(B, 3, generator=gen, dtype=F64)
        inputs = tuple(t.requires_grad_(True) for t in (keep, write, content, c0))
        assert torch.autograd.gradcheck(lambda *a: function.apply(S, *a), inputs, eps=1e-6,
                                        atol=1e-9, rtol=1e-7)


def test_gradcheck(loops):
    _gradcheck(LinearScan)


@interpreted
def test_gradcheck_triton(monkeypatch):
    from lstmablate.cells.kernels.linear_scan.triton_kernels import TritonLinearScan

    _gradcheck(TritonLinearScan)


# ---------------------------------------------------------------------------------
# which path runs
# ---------------------------------------------------------------------------------

def test_which_path_each_call_takes(monkeypatch):
    monkeypatch.setenv("LSTMABLATE_TRITON", "auto")
    for name, opts in CASES:
        cell = get_cell(name).build(3, 4, **opts)
        assert get_cell(name).fast_path
        assert_element_wise_paths(cell, "scan", "triton-scan")
        cuda = dict(device_type="cuda", triton=True)
        assert plan_of(cell, device_type="cuda", dtype=F64, triton=True) == "scan"
        assert kernel_name_of(cell, **cuda) == "triton-scan (one launch)"
    # the SRU class built with v (the 2018 form): its gates read c_{t-1}, not a linear scan
    sru = SRUCell(3, 4, state_in_gates=True)
    assert plan_of(sru) == plan_of(sru, device_type="cuda", triton=True) == "reference"


def test_a_subclass_that_changes_the_arithmetic_runs_the_reference_loop():
    class Doubled(MinGRUCell):
        def readout(self, memory, terms):
            return 2 * memory

    cell = Doubled(3, 4).double()
    assert plan_of(cell) == "reference"
    x = torch.randn(5, 2, 3, dtype=F64)
    with reference_mode():
        want, _ = cell(x)
    torch.testing.assert_close(cell(x)[0], want, atol=0, rtol=0)


class _Decay(ElementwiseCell):
    """A cell of another author's: keep = σ(W_k x), write = 1 - keep, content = W_c x,
    h = tanh(c); it declares the shared scan and writes no kernel."""

    fast_kernels = FastKernels(SCAN_KERNELS, math=SCAN_MATH)

    def __init__(self, input_size, hidden_size):
        super().__init__(input_size, hidden_size)
        self.weight_ih = torch.nn.Parameter(torch.randn(2 * hidden_size, input_size))

    def project_inputs(self, x):
        return x @ self.weight_ih.t()

    def scan_terms(self, xp, state):
        zk, content = xp.split(self.hidden_size, dim=-1)
        keep = torch.sigmoid(zk)
        return {"keep": keep, "write": 1 - keep, "content": content}

    def readout(self, memory, terms):
        return torch.tanh(memory)


def test_a_third_party_elementwise_cell_runs_on_the_shared_scan():
    torch.manual_seed(0)
    cell = _Decay(3, 4).double()
    assert plan_of(cell) == "scan"
    x = torch.randn(6, 3, 3, dtype=F64, requires_grad=True)
    c0 = torch.randn(3, 4, dtype=F64, requires_grad=True)
    mask = (torch.arange(6).unsqueeze(1) < torch.tensor([6, 2, 0])).to(F64)
    results = []
    for reference in (False, True):
        with reference_mode(reference):
            out, (h, c) = cell(x, (torch.zeros(3, 4, dtype=F64), c0), mask)
        grads = torch.autograd.grad((out.sum() + h.sum() + (c * c).sum()),
                                    (x, c0, cell.weight_ih))
        results.append((out, h, c, *grads))
    assert "LinearScanBackward" in autograd_functions(results[0][0])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("name", ["qrnn", "minlstm"])
def test_a_mask_with_holes_runs_the_reference_loop(name):
    cell = get_cell(name).build(3, 4).double()
    assert_mask_with_holes_runs_the_reference(cell, torch.randn(4, 2, 3, dtype=F64),
                                              compare_states=True)


def test_outputs_may_be_modified_in_place():
    """The outputs are not views of the buffer the backward reads (the memory, which is
    minGRU's output itself)."""
    cell = get_cell("mingru").build(3, 4)
    x = torch.randn(5, 2, 3, requires_grad=True)
    out, (h,) = cell(x)
    out.mul_(2)
    h.add_(1)
    (out.sum() + h.sum()).backward()
    assert x.grad is not None and x.grad.abs().sum() > 0


def test_zoneout_in_training(monkeypatch):
    """The QRNN's zoneout draws its mask for all tokens at once: with the draws fixed (kept
    where the unit is not a multiple of 3, at every step and row: the same draws whatever the
    layout, the reference loop's (B, H) per step or the packed (tokens, H)), the scan is the
    reference loop."""
    def fixed(p):
        keep = torch.arange(p.shape[-1]) % 3 != 0
        return keep.to(p.dtype).expand(p.shape).clone()
    monkeypatch.setattr(torch, "bernoulli", fixed)
    _compare("qrnn", {"zoneout": 0.4}, F64, VARLEN)
    enc = _compare("qrnn", {"zoneout": 0.4, "window": 2}, F64, VARLEN)
    enc.eval()  # evaluation: the expectation, no draws
    x = torch.randn(2, T, 5, dtype=F64)
    with reference_mode():
        want, _ = enc(x)
    torch.testing.assert_close(enc(x)[0], want, atol=1e-12, rtol=1e-10)


# ---------------------------------------------------------------------------------
# the Triton kernels (under the interpreter)
# ---------------------------------------------------------------------------------

@interpreted
@pytest.mark.parametrize("name,opts", CASES, ids=IDS)
@pytest.mark.parametrize("dtype", [F64, torch.float32], ids=["float64", "float32"])
def test_triton_matches_the_reference(name, opts, dtype, monkeypatch):
    monkeypatch.setenv("LSTMABLATE_TRITON", "1")
    enc = _compare(name, opts, dtype, VARLEN if dtype == F64 else [7, 1, 2, 3, 4, 5, 6])
    cell = enc.layers[0][0]
    assert kernel_name_of(cell, dtype=dtype, mask="prefix0") == "triton-scan (interpreter)"
    out, _ = cell(torch.randn(3, 2, 5, dtype=dtype))
    assert "Triton" + _backward(opts) in autograd_functions(out)


@interpreted
@pytest.mark.parametrize("name,opts", [("qrnn", {"window": 2}), ("minlstm", {})],
                         ids=["qrnn-window=2", "minlstm"])
def test_triton_full_batches(name, opts, monkeypatch):
    """All rows as long as the call."""
    monkeypatch.setenv("LSTMABLATE_TRITON", "1")
    _compare(name, opts, F64, FULL)


@interpreted
@pytest.mark.parametrize("name,opts", [("qrnn", {}), ("minlstm", {}), ("sru-2017", {})],
                         ids=["qrnn", "minlstm", "sru-2017"])
def test_triton_under_bfloat16_autocast(name, opts, monkeypatch):
    """Under autocast the cell's products and element-wise work autocast as in the reference
    loop, and the kernel carries the memory (and its gradient) in float32: within the
    low-precision tolerance of a float64 reference loop (tests/tolerance.py)."""
    monkeypatch.setenv("LSTMABLATE_TRITON", "1")
    torch.manual_seed(0)
    enc = build_encoder(name, 6, 16, num_layers=2, bidirectional=True, **opts).train()
    cell = enc.layers[0][0]
    assert plan_of(cell, dtype=torch.bfloat16, autocast=True, mask="prefix") == "triton-scan"
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(4, 8, 6, generator=gen)
    state = tuple(s * 0.5 for s in random_state(enc, 4, gen, torch.float32))
    fast = assert_low_precision_close(enc, x, torch.tensor([8, 5, 4, 1]), state, torch.bfloat16,
                                      name)
    # the biases are float32, so the terms, the memory and h_t are, as in the reference loop
    assert fast["out"].dtype == torch.float32


# ---------------------------------------------------------------------------------
# the benchmark's rows
# ---------------------------------------------------------------------------------

def test_bench_rows_and_targets():
    """`lstmablate bench` names the scan as the kernel; the issue's target (1.8x nn.LSTM)
    applies at ptb-650 only."""
    from lstmablate import bench
    from lstmablate.bench import cells as bench_cells

    rows = bench.bench_cells(cells=["qrnn", "mingru"], shapes=["4x5x8x1"], threads=1, repeats=1,
                             warmup=0)
    loops = "native" if native.library(LIBRARY) is not None else "pytorch"
    assert {r["cell"]: r["kernel"] for r in rows if not r["cell"].startswith("nn.")} == {
        "qrnn": f"scan ({loops})", "mingru": f"scan ({loops})"}
    row = dict(ratio_lstm=1.9, ratio_rnn=0.5, speedup_vs_reference=None)
    for name in ("qrnn", "sru-2017", "mingru", "minlstm"):
        t = bench_cells._target(name, bench_cells.SHAPES["ptb-650"], row)
        assert (t["target"], t["target_baseline"], t["target_met"]) == (1.8, "nn.LSTM", True)
        assert bench_cells._target(name, bench_cells.SHAPES["ptb-200"], row)["target"] is None
    assert not bench_cells._target("qrnn", bench_cells.SHAPES["ptb-650"],
                                   dict(row, ratio_lstm=1.7))["target_met"]
