"""The fast paths of the 2018 SRU (``lstmablate/cells/kernels/sru/``: the input products in
one GEMM, then the memory's pass over time, eqs 1-2, whose forget gate reads v ∘ c_{t-1})
against the reference step loop.

For every case the family runs: outputs, final states and every gradient (inputs, initial
states, all parameters, v included) through stacked encoders, uni- and bidirectional (the
backward direction sees padding too), with random initial states, on batches with every
length 1..T and a length-0 row and on full batches: in float64 to 1e-10, in float32 against
a float64 reference (``fast_path_harness``), on the native (C) loops, the PyTorch loops and,
under Triton's interpreter, the Triton kernels (also under bfloat16 autocast, the memory
carried in float32).  Padded outputs are exactly zero and receive no gradient (the harness).
Plus: the pass by hand and by gradcheck, which path each call takes, a subclass that
changes the arithmetic, and the native loop split across threads.
"""

from __future__ import annotations

import math

import pytest
import torch

from lstmablate.cells import build_encoder, get_cell, reference_mode
from lstmablate.cells.kernels.common import native, triton_support
from lstmablate.cells.kernels.interface import kernel_name_of, plan_of
from lstmablate.cells.kernels.sru import family
from lstmablate.cells.kernels.common.sequences import Steps
from lstmablate.cells.kernels.sru.loops import LIBRARY, SRUMemory
from lstmablate.cells.sru import SRU2018Cell

from fast_path_harness import (FULL, VARLEN, assert_fast_matches_reference,
                               assert_mask_with_holes_runs_the_reference, autograd_functions,
                               assert_element_wise_paths, assert_runs_on, compare_encoder,
                               random_state, use_loops)
from test_kernels_low_precision import assert_low_precision_close

F64 = torch.float64
CASES = list(family.KERNELS.cases)
IDS = [n + "".join(f"-{k}={v}" for k, v in o.items()) for n, o in CASES]
T = 7
interpreted = pytest.mark.skipif(not triton_support.interpreting(),
                                 reason="needs Triton with its interpreter on (TRITON_INTERPRET=1)")


@pytest.fixture(params=["native", "python"])
def loops(request, monkeypatch):
    """native: the C loops (the CPU default); python: the PyTorch loops (no compiler)."""
    return use_loops(request.param, monkeypatch, LIBRARY)


def _larger_v(enc):
    """v of the size of the other weights, so that the state's term in the gates matters."""
    with torch.no_grad():
        for layer in enc.layers:
            for cell in layer:
                cell.weight_c.mul_(2)


def _compare(name, opts, dtype, lengths, **kw):
    return compare_encoder(name, opts, dtype, lengths, T, I=kw.pop("I", 4), prepare=_larger_v,
                           **kw)


@pytest.mark.parametrize("name,opts", CASES, ids=IDS)
@pytest.mark.parametrize("lengths", [VARLEN, FULL], ids=["varlen", "full"])
@pytest.mark.parametrize("bidirectional", [True, False], ids=["bi", "uni"])
def test_float64_matches_the_reference(name, opts, lengths, bidirectional, loops):
    enc = _compare(name, opts, F64, lengths, bidirectional=bidirectional)
    assert_runs_on(enc.layers[0][0], f"recurrent ({loops.replace('python', 'pytorch')})",
                   "SRUMemoryBackward")


@pytest.mark.parametrize("name,opts", CASES, ids=IDS)
def test_float32_matches_a_float64_reference(name, opts, loops):
    _compare(name, opts, torch.float32, [7, 1, 2, 3, 4, 5, 6, 7])


def test_a_skip_projection_and_recurrent_dropout(loops):
    """Input size unlike the hidden size (the highway's x_t is a projection, a fourth block of
    ``weight_ih``); the recurrent-dropout masks, drawn, have nothing to mask (no product reads
    h_{t-1}), in the kernel as in the reference loop."""
    enc = _compare("sru", {}, F64, VARLEN, I=3, H=6, recurrent_dropout=0.3)
    assert enc.layers[0][0].project_skip


def test_native_loop_split_across_threads(monkeypatch):
    """Two threads, every call's chunks split between them (``PAR_MIN = 1``; 600 units: two
    chunks per row): the same numbers."""
    use_loops("native", monkeypatch, LIBRARY)
    monkeypatch.setattr(native, "PAR_MIN", 1)
    torch.manual_seed(0)
    enc = build_encoder("sru", 16, 600, num_layers=2, bidirectional=True).double()
    x = torch.randn(4, 9, 16, dtype=F64)
    zeros = tuple(torch.zeros(4, 4, s, dtype=F64) for s in enc.layers[0][0].state_sizes)
    assert_fast_matches_reference(enc, x, torch.tensor([9, 3, 0, 6]), zeros, 1e-10,
                                  fast_threads=2)


# ---------------------------------------------------------------------------------
# the pass itself
# ---------------------------------------------------------------------------------

def test_the_pass_by_hand(loops):
    """One unit, z = 0, v = 1, c_0 = 0, u_1 = 2: f_1 = σ(0) = 1/2, c_1 = 1; f_2 = σ(0 + 1 * 1) =
    s, c_2 = s * 1 + (1 - s) * 4 with u_2 = 4.  With dL/dc_2 = 1: dz_2 = (c_1 - u_2) s (1 - s),
    du_2 = 1 - s; g_1 = s + dz_2 * v; dz_1 = g_1 (c_0 - u_1) / 4, du_1 = g_1 / 2, dv = dz_2 c_1
    + dz_1 c_0 = dz_2; dc_0 = g_1 / 2 + dz_1 * v."""
    z = torch.zeros(2, 1, dtype=F64, requires_grad=True)
    u = torch.tensor([[2.0], [4.0]], dtype=F64, requires_grad=True)
    v = torch.ones(1, dtype=F64, requires_grad=True)
    c0 = torch.zeros(1, 1, dtype=F64, requires_grad=True)
    C = SRUMemory.apply(Steps(2, 1, None, "cpu"), z, u, v, c0)  # (the packed layout: 2 steps)
    s = 1 / (1 + math.exp(-1))
    torch.testing.assert_close(C.flatten(), torch.tensor([0.0, 1.0, s + (1 - s) * 4], dtype=F64),
                               atol=1e-15, rtol=0)
    C[2].sum().backward()
    dz2, du2 = (1 - 4) * s * (1 - s), 1 - s
    g1 = s + dz2
    dz1, du1 = g1 * (0 - 2) / 4, g1 / 2
    for got, want in ((z.grad, [dz1, dz2]), (u.grad, [du1, du2]), (v.grad, [dz2]),
                      (c0.grad, [g1 / 2 + dz1])):
        torch.testing.assert_close(got.flatten(), torch.tensor(want, dtype=F64), atol=1e-15,
                                   rtol=0)


def test_the_padded_pass_by_hand(loops):
    """The pass of test_the_pass_by_hand as row 1 of a batch of lengths 1, 2 (caller's order;
    sorted 2, 1: the packed tokens are step 0: row 1, row 0; step 1: row 1): row 0 (z = 0,
    v = 1, c_0 = 2, u = 0) runs one step, f = σ(2), c_1 = 2 f, and its gradient from
    dL/dc_1 = 1: dz = 2 f (1 - f), du = 1 - f, dc_0 = f + dz.  Row 1's numbers are the
    unpadded pass's; dv adds both rows'."""
    S = Steps(2, 2, torch.tensor([1, 2]), "cpu")
    assert S.off == [0, 2, 3]
    z = torch.zeros(3, 1, dtype=F64, requires_grad=True)
    u = torch.tensor([[2.0], [0.0], [4.0]], dtype=F64, requires_grad=True)
    v = torch.ones(1, dtype=F64, requires_grad=True)
    c0 = torch.tensor([[2.0], [0.0]], dtype=F64, requires_grad=True)
    C = SRUMemory.apply(S, z, u, v, c0)
    s, f = 1 / (1 + math.exp(-1)), 1 / (1 + math.exp(-2))
    # the state buffer: the initial rows sorted (rows 1, 0), then c of every token
    want = [0.0, 2.0, 1.0, 2 * f, s + (1 - s) * 4]
    torch.testing.assert_close(C.flatten(), torch.tensor(want, dtype=F64), atol=1e-15, rtol=0)
    (C[4] + C[3]).sum().backward()
    dz2, du2 = (1 - 4) * s * (1 - s), 1 - s
    g1 = s + dz2
    dz1, du1 = g1 * (0 - 2) / 4, g1 / 2
    dz0 = 2 * f * (1 - f)
    for got, want in ((z.grad, [dz1, dz0, dz2]), (u.grad, [du1, 1 - f, du2]),
                      (v.grad, [dz2 + dz0 * 2]), (c0.grad, [f + dz0, g1 / 2 + dz1])):
        torch.testing.assert_close(got.flatten(), torch.tensor(want, dtype=F64), atol=1e-15,
                                   rtol=0)


def _gradcheck(function):
    """gradcheck of the pass, unpadded and with lengths 4, 0, 2, 3 (every row's tokens)."""
    gen = torch.Generator().manual_seed(0)
    for T_, B, lengths in ((4, 2, None), (4, 4, torch.tensor([4, 0, 2, 3]))):
        S = Steps(T_, B, lengths, "cpu")
        z, u = (torch.randn(S.N, 3, generator=gen, dtype=F64) for _ in range(2))
        v = torch.randn(3, generator=gen, dtype=F64)
        c0 = torch.randn(B, 3, generator=gen, dtype=F64)
        inputs = tuple(t.requires_grad_(True) for t in (z, u, v, c0))
        assert torch.autograd.gradcheck(lambda *a: function.apply(S, *a), inputs, eps=1e-6,
                                        atol=1e-9, rtol=1e-7)


def test_gradcheck(loops):
    _gradcheck(SRUMemory)


@interpreted
def test_gradcheck_triton():
    from lstmablate.cells.kernels.sru.triton_kernels import TritonSRUMemory

    _gradcheck(TritonSRUMemory)


# ---------------------------------------------------------------------------------
# which path runs
# ---------------------------------------------------------------------------------

def test_which_path_each_call_takes(monkeypatch):
    monkeypatch.setenv("LSTMABLATE_TRITON", "auto")
    for name, opts in CASES:
        cell = get_cell(name).build(3, 4, **opts)
        assert get_cell(name).fast_path
        assert_element_wise_paths(cell, "recurrent", "triton-recurrent")
        assert kernel_name_of(cell, device_type="cuda", triton=True) == (
            "triton-recurrent (one launch)")
    # the class built without v (the 2017 form): not what the kernel computes
    old = SRU2018Cell(3, 4, state_in_gates=False)
    assert plan_of(old) == plan_of(old, device_type="cuda", triton=True) == "reference"
    assert plan_of(get_cell("sru-2017").build(3, 4)) == "scan"  # its own cell: the linear scan


def test_a_subclass_that_changes_the_arithmetic_runs_the_reference_loop():
    class Doubled(SRU2018Cell):
        def readout(self, memory, terms):
            return 2 * memory

    cell = Doubled(3, 4).double()
    assert plan_of(cell) == "reference"
    x = torch.randn(5, 2, 3, dtype=F64)
    with reference_mode():
        want, _ = cell(x)
    torch.testing.assert_close(cell(x)[0], want, atol=0, rtol=0)


def test_a_mask_with_holes_runs_the_reference_loop():
    cell = get_cell("sru").build(3, 4).double()
    assert_mask_with_holes_runs_the_reference(cell, torch.randn(4, 2, 3, dtype=F64),
                                              compare_states=True)


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
    assert kernel_name_of(cell, dtype=dtype, mask="prefix0") == "triton-recurrent (interpreter)"
    out, _ = cell(torch.randn(3, 2, 4, dtype=dtype))
    assert "TritonSRUMemoryBackward" in autograd_functions(out)


@interpreted
def test_triton_full_batches_unidirectional(monkeypatch):
    monkeypatch.setenv("LSTMABLATE_TRITON", "1")
    _compare("sru", {}, F64, FULL, bidirectional=False)


@interpreted
def test_triton_under_bfloat16_autocast(monkeypatch):
    """Under autocast the cell's products and element-wise work autocast as in the reference
    loop, and the kernel carries the memory (and its gradient) in float32: within the
    low-precision tolerance of a float64 reference loop (tests/tolerance.py)."""
    monkeypatch.setenv("LSTMABLATE_TRITON", "1")
    torch.manual_seed(0)
    enc = build_encoder("sru", 16, 16, num_layers=2, bidirectional=True).train()
    cell = enc.layers[0][0]
    assert plan_of(cell, dtype=torch.bfloat16, autocast=True, mask="prefix") == "triton-recurrent"
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(4, 8, 16, generator=gen)
    state = tuple(s * 0.5 for s in random_state(enc, 4, gen, torch.float32))
    fast = assert_low_precision_close(enc, x, torch.tensor([8, 5, 4, 1]), state, torch.bfloat16,
                                      "sru")
    assert fast["out"].dtype == torch.float32  # the memory and v are float32, so h_t is
