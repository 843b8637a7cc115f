"""minGRU and minLSTM in the paper's training form (``mode: log``, Feng et al. 2024): g(·) on the
candidate and the log-space parallel scan, on the shared scan kernel's paths.

* the cell: mode log's terms are the equations with h~_t = g(Linear(x_t)), and its log terms
  are the logs of its linear terms, by the paper's expressions (finite where the linear ones
  underflow);
* the pass (``LogLinearScan``, C and PyTorch loops; ``TritonLogLinearScan`` under Triton's
  interpreter): by hand, against the linear-domain pass on the same numbers (outputs and, by
  the chain rule, every gradient, h_0 = 0 included), against a literal re-statement of the
  paper's ``parallel_scan_log`` (cumsum, logcumsumexp), by gradcheck (float64);
* whole encoders (stacked, bidirectional, padded: every length 1..T and a length 0; full
  batches) on the log pass against the reference loop, which runs the same equations
  sequentially in the linear domain (the paper's sequential mode): float64 to 1e-10, float32
  against a float64 reference (tests/fast_path_harness.py's rule), padding exactly zero;
* stability: long sequences in float32 and from bfloat16 logs, against float64;
* a negative initial state (no logarithm) runs the linear-domain pass, the same equations.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn import functional as F

from lstmablate.bench.accuracy import measure_accuracy
from lstmablate.cells import build_encoder, get_cell, reference_mode
from lstmablate.cells.kernels.common import triton_support
from lstmablate.cells.kernels.common.sequences import Steps
from lstmablate.cells.kernels.interface import kernel_name_of
from lstmablate.cells.kernels.linear_scan.loops import LIBRARY, LinearScan, LogLinearScan
from lstmablate.cells.minrnn import log_positive, positive
from lstmablate.errors import ConfigError

from fast_path_harness import (FULL, VARLEN, assert_fast_matches_reference, autograd_functions,
                               use_loops)
from tolerance import ROUNDINGS, eps

F64 = torch.float64
NAMES = ["mingru", "minlstm"]
interpreted = pytest.mark.skipif(not triton_support.interpreting(),
                                 reason="needs Triton with its interpreter on (TRITON_INTERPRET=1)")


@pytest.fixture(params=["native", "python"])
def loops(request, monkeypatch):
    """native: the C loops (the CPU default); python: the PyTorch loops (no compiler)."""
    return use_loops(request.param, monkeypatch, LIBRARY)


def _triton(monkeypatch):
    monkeypatch.setenv("LSTMABLATE_TRITON", "1")
    from lstmablate.cells.kernels.linear_scan.triton_kernels import TritonLogLinearScan

    return TritonLogLinearScan


# ---------------------------------------------------------------------------------
# the cell
# ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_log_mode_is_the_equations_with_g(name):
    """mode log's step: h_t = keep_t h_{t-1} + write_t g(Linear_h(x_t)) (the sequential form of
    §3.1/§3.2's log-space versions), written out with one Linear per term."""
    torch.manual_seed(0)
    cell = get_cell(name).build(3, 4, mode="log").double()
    assert cell.positive_content and cell.log_space
    H = 4
    x, h = torch.randn(5, 2, 3, dtype=F64), torch.rand(2, 4, dtype=F64)
    with reference_mode():
        out, (final,) = cell(x, (h,))
    Ws, bs = cell.weight_ih.split(H), cell.bias.split(H)
    for t in range(5):
        lin = [x[t] @ W.T + b for W, b in zip(Ws, bs)]
        content = torch.where(lin[-1] >= 0, lin[-1] + 0.5, torch.sigmoid(lin[-1]))  # g
        if name == "mingru":
            z = torch.sigmoid(lin[0])
            h = (1 - z) * h + z * content
        else:
            f, i = torch.sigmoid(lin[0]), torch.sigmoid(lin[1])
            h = f / (f + i) * h + i / (f + i) * content
        torch.testing.assert_close(out[t], h, atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(final, h, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("name", NAMES)
def test_log_terms_are_the_logs_of_the_terms(name):
    """log_keep = log keep_t and log_value = log(write_t h~_t), by the paper's softplus forms."""
    torch.manual_seed(1)
    cell = get_cell(name).build(3, 4, mode="log").double()
    xp = cell.project_inputs(torch.randn(6, 2, 3, dtype=F64) * 3)
    terms, logs = cell.scan_terms(xp, None), cell.log_terms(xp)
    torch.testing.assert_close(logs["log_keep"], torch.log(terms["keep"]), atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(logs["log_value"], torch.log(terms["write"] * terms["content"]),
                               atol=1e-12, rtol=1e-12)


def test_log_g_by_hand_and_where_g_underflows():
    """log g(x) = log(x + 0.5) for x >= 0, log σ(x) below; at x = -200 g underflows in float32
    (σ(-200) ~ 1e-87) but log g = -200 - log(1 + e^-200) stays exact."""
    v = torch.tensor([-200.0, -3.0, 0.0, 2.5], dtype=F64)
    want = [-200.0, math.log(1 / (1 + math.exp(3.0))), math.log(0.5), math.log(3.0)]
    assert log_positive(v).tolist() == pytest.approx(want, rel=1e-15)
    v32 = v.float()
    assert positive(v32)[0] == 0  # the linear form's content underflows ...
    assert log_positive(v32)[0].item() == -200.0  # ... its log does not


def test_minlstm_log_gates_by_hand():
    """f~ = 1, i~ = -2: f' = σ(1) / (σ(1) + σ(-2)), i' = 1 - f', from d = softplus(-1) -
    softplus(2)."""
    cell = get_cell("minlstm").build(1, 1, mode="log", init_scale=0.0).double()
    xp = torch.tensor([[1.0, -2.0, 0.0]], dtype=F64)
    s = lambda v: 1 / (1 + math.exp(-v))  # noqa: E731
    f_ = s(1.0) / (s(1.0) + s(-2.0))
    logs = cell.log_terms(xp)
    assert logs["log_keep"].item() == pytest.approx(math.log(f_), rel=1e-14)
    assert logs["log_value"].item() == pytest.approx(math.log((1 - f_) * 0.5), rel=1e-14)


def test_options():
    with pytest.raises(ConfigError, match="mode must be one of plain, log"):
        get_cell("mingru").cls(3, 4, mode="parallel")  # the class itself checks too
    with pytest.raises(ConfigError, match="takes one of plain, log"):
        get_cell("mingru").build(3, 4, mode="parallel")
    with pytest.raises(ConfigError, match="takes one of plain, log"):
        get_cell("minlstm").check_options({"mode": "logspace"})
    with pytest.raises(ConfigError, match="positive_content: false"):
        get_cell("minlstm").build(3, 4, mode="log", positive_content=False)
    plain = get_cell("mingru").build(3, 4)
    assert (plain.mode, plain.positive_content, plain.log_space) == ("plain", False, False)
    assert get_cell("mingru").build(3, 4, positive_content=True).log_space is False


# ---------------------------------------------------------------------------------
# the pass
# ---------------------------------------------------------------------------------

def _linear_and_log(S: Steps, gen, dtype=F64, zero_rows=()):
    """Random positive terms of the packed layout ``S``: (keep, value, c0) with value =
    write * content, and c0 = 0 in ``zero_rows``."""
    keep = torch.rand(S.N, 3, generator=gen, dtype=dtype) * 0.9 + 0.05
    value = torch.rand(S.N, 3, generator=gen, dtype=dtype) * 2 + 0.01
    c0 = torch.rand(S.B, 3, generator=gen, dtype=dtype) + 0.1
    c0[list(zero_rows)] = 0
    return keep, value, c0


def test_the_log_pass_by_hand(loops):
    """keep .5, .25; value 2, 8; h_0 = 1: h_1 = 2.5, h_2 = 8.625 (test_the_pass_by_hand's
    numbers).  dL/dh_2 = 1, dL/dh_1 = 3: g_2 = 1, g_1 = 3.25 (linear); in the logs d a_t =
    g_t keep_t h_{t-1}, d v_t = g_t value_t; d h_0 = .5 * 3.25."""
    a = torch.log(torch.tensor([[0.5], [0.25]], dtype=F64)).requires_grad_(True)
    v = torch.log(torch.tensor([[2.0], [8.0]], dtype=F64)).requires_grad_(True)
    c0 = torch.tensor([[1.0]], dtype=F64, requires_grad=True)
    C = LogLinearScan.apply(Steps(2, 1, None, "cpu"), a, v, c0)
    torch.testing.assert_close(C.flatten(), torch.tensor([1.0, 2.5, 8.625], dtype=F64),
                               atol=1e-14, rtol=0)
    (C[1] * 3 + C[2]).sum().backward()
    torch.testing.assert_close(a.grad.flatten(), torch.tensor([3.25 * 0.5 * 1.0, 0.25 * 2.5],
                                                              dtype=F64), atol=1e-14, rtol=0)
    torch.testing.assert_close(v.grad.flatten(), torch.tensor([3.25 * 2.0, 8.0], dtype=F64),
                               atol=1e-14, rtol=0)
    torch.testing.assert_close(c0.grad.flatten(), torch.tensor([1.625], dtype=F64), atol=1e-14,
                               rtol=0)


def _against_the_linear_pass(function):
    """The log pass equals the linear pass on exp of its inputs (write = 1, content = value),
    and its gradients are the linear ones by the chain rule (d log x = x dx); padded (lengths
    4, 0, 2, 3) and not, h_0 = 0 in some rows (whose gradient stays finite: keep_1 g_1)."""
    gen = torch.Generator().manual_seed(0)
    for T, B, lengths, zero in ((4, 2, None, [1]), (4, 4, torch.tensor([4, 0, 2, 3]), [0, 1])):
        S = Steps(T, B, lengths, "cpu")
        keep, value, c0 = _linear_and_log(S, gen, zero_rows=zero)
        w = torch.randn(S.B + S.N, 3, generator=gen, dtype=F64)
        lin = [t.clone().requires_grad_(True) for t in (keep, value, c0)]
        C_lin = LinearScan.apply(S, lin[0], torch.ones_like(keep), lin[1], lin[2])
        (C_lin * w).sum().backward()
        logs = [torch.log(keep).requires_grad_(True), torch.log(value).requires_grad_(True),
                c0.clone().requires_grad_(True)]
        C = function.apply(S, *logs)
        (C * w).sum().backward()
        torch.testing.assert_close(C, C_lin, atol=1e-12, rtol=1e-12)
        torch.testing.assert_close(logs[0].grad, keep * lin[0].grad, atol=1e-12, rtol=1e-12)
        torch.testing.assert_close(logs[1].grad, value * lin[1].grad, atol=1e-12, rtol=1e-12)
        torch.testing.assert_close(logs[2].grad, lin[2].grad, atol=1e-12, rtol=1e-12)
        assert torch.isfinite(logs[2].grad).all()


def test_the_log_pass_is_the_linear_pass(loops):
    _against_the_linear_pass(LogLinearScan)


@interpreted
def test_the_triton_log_pass_is_the_linear_pass(monkeypatch):
    _against_the_linear_pass(_triton(monkeypatch))


def test_the_log_pass_is_the_papers_parallel_scan(loops):
    """A literal re-statement of the paper's ``parallel_scan_log``: a*_t = cumsum of the log
    coefficients (0 before the first step), log h_t = a*_t + logcumsumexp_j(log values_j -
    a*_j) with log h_0 as the term j = 0, on (T, B, H) tensors."""
    gen = torch.Generator().manual_seed(2)
    T, B, H = 12, 3, 5
    a = -torch.rand(T, B, H, generator=gen, dtype=F64) * 3
    v = torch.randn(T, B, H, generator=gen, dtype=F64)
    h0 = torch.rand(B, H, generator=gen, dtype=F64)
    a_star = F.pad(torch.cumsum(a, 0), (0, 0, 0, 0, 1, 0))
    log_values = torch.cat([torch.log(h0)[None], v])
    want = torch.exp(a_star + torch.logcumsumexp(log_values - a_star, 0))[1:]
    C = LogLinearScan.apply(Steps(T, B, None, "cpu"), a.reshape(T * B, H), v.reshape(T * B, H),
                            h0)
    torch.testing.assert_close(C[B:].view(T, B, H), want, atol=1e-12, rtol=1e-11)


def _gradcheck(function):
    """gradcheck (float64) unpadded and with lengths 4, 0, 2, 3; h_0 > 0 (a finite difference
    at h_0 = 0 would step to a negative h_0, which has no log)."""
    gen = torch.Generator().manual_seed(3)
    for T, B, lengths in ((4, 2, None), (4, 4, torch.tensor([4, 0, 2, 3]))):
        S = Steps(T, B, lengths, "cpu")
        keep, value, c0 = _linear_and_log(S, gen)
        inputs = tuple(t.requires_grad_(True) for t in (torch.log(keep), torch.log(value), c0))
        assert torch.autograd.gradcheck(lambda *i: function.apply(S, *i), inputs, eps=1e-6,
                                        atol=1e-9, rtol=1e-7)


def test_gradcheck(loops):
    _gradcheck(LogLinearScan)


@interpreted
def test_gradcheck_triton(monkeypatch):
    _gradcheck(_triton(monkeypatch))


# ---------------------------------------------------------------------------------
# whole encoders against the reference loop
# ---------------------------------------------------------------------------------

def _compare(name, dtype, lengths, T=7, zero_state=False, bidirectional=True):
    """A 2-layer encoder of ``name`` in mode log on a batch of ``lengths``, its initial state
    random and positive (or zero), fast (the log pass) against the reference loop."""
    torch.manual_seed(0)
    enc = build_encoder(name, 5, 4, num_layers=2, bidirectional=bidirectional,
                        mode="log").to(dtype).train()
    gen = torch.Generator().manual_seed(1)
    B = len(lengths)
    x = torch.randn(B, T, 5, generator=gen, dtype=dtype) * 2
    n = enc.num_layers * enc.num_directions
    h0 = torch.zeros(n, B, 4, dtype=dtype) if zero_state else \
        torch.rand(n, B, 4, generator=gen, dtype=dtype) + 0.05
    fast = assert_fast_matches_reference(enc, x, torch.tensor(lengths), (h0,),
                                         1e-10 if dtype == F64 else None)
    return enc, fast


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("lengths", [VARLEN, FULL], ids=["varlen", "full"])
def test_float64_matches_the_reference(name, lengths, loops):
    enc, _ = _compare(name, F64, lengths)
    cell = enc.layers[0][0]
    want = "scan (native)" if loops == "native" else "scan (pytorch)"
    assert kernel_name_of(cell, dtype=F64, mask="prefix0") == want
    out, _ = cell(torch.randn(3, 2, 5, dtype=F64, requires_grad=True))
    assert "LogLinearScanBackward" in autograd_functions(out)
    _compare(name, F64, VARLEN, zero_state=True, bidirectional=False)


@pytest.mark.parametrize("name", NAMES)
def test_float32_matches_a_float64_reference(name, loops):
    _compare(name, torch.float32, [7, 1, 2, 3, 4, 5, 6, 7])


@interpreted
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", [F64, torch.float32], ids=["float64", "float32"])
def test_triton_matches_the_reference(name, dtype, monkeypatch):
    _triton(monkeypatch)
    enc, _ = _compare(name, dtype, VARLEN if dtype == F64 else [7, 1, 2, 3, 4, 5, 6])
    cell = enc.layers[0][0]
    assert kernel_name_of(cell, dtype=dtype, mask="prefix0") == "triton-scan (interpreter)"
    out, _ = cell(torch.randn(3, 2, 5, dtype=dtype))
    assert "TritonLogLinearScanBackward" in autograd_functions(out)


@interpreted
@pytest.mark.parametrize("name", NAMES)
def test_triton_under_bfloat16_autocast(name, monkeypatch):
    """Under autocast the projections autocast as in the reference loop, the log terms are
    computed in float32 and the pass carries log h_t (and h_t, and its gradient) in float32:
    every output and gradient within the gpu-check rule of the float64 reference (the
    reference loop's own bfloat16 error sets the bound: g's derivative jumps from 1/4 to 1 at
    0, so a pre-activation that bfloat16 rounds across 0 moves a weight's gradient in both)."""
    _triton(monkeypatch)
    torch.manual_seed(0)
    enc = build_encoder(name, 6, 16, num_layers=2, bidirectional=True, mode="log").train()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(4, 8, 6, generator=gen)
    h0 = torch.rand(4, 4, 16, generator=gen) * 0.5
    acc = measure_accuracy(enc, x, torch.tensor([8, 5, 4, 1]), (h0,), autocast=torch.bfloat16)
    assert acc.fast_path and acc.passed, acc
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = enc.layers[0][0](x.transpose(0, 1), (h0[0],))
    assert "TritonLogLinearScanBackward" in autograd_functions(out)
    assert out.dtype == torch.float32  # h_t comes back as the pass carries it


def test_a_negative_initial_state_runs_the_linear_pass(loops):
    """log h_0 does not exist for h_0 < 0: the call runs the same equations on the linear
    pass (LinearScanBackward, not the log pass's), and still equals the reference loop."""
    torch.manual_seed(0)
    cell = get_cell("minlstm").build(3, 4, mode="log").double()
    x = torch.randn(5, 2, 3, dtype=F64, requires_grad=True)
    h0 = torch.rand(2, 4, dtype=F64)
    h0[1, 2] = -0.5
    out, _ = cell(x, (h0,))
    assert "LinearScanBackward" in autograd_functions(out)
    assert "LogLinearScanBackward" not in autograd_functions(out)
    with reference_mode():
        want, _ = cell(x, (h0,))
    torch.testing.assert_close(out, want, atol=1e-12, rtol=1e-10)


# ---------------------------------------------------------------------------------
# stability
# ---------------------------------------------------------------------------------

def _long_logs(T: int, B: int, H: int, dtype):
    """Log terms of a long sequence: keep in (0.3, 0.999) (memories that last), value > 0."""
    gen = torch.Generator().manual_seed(4)
    a = torch.log(torch.rand(T * B, H, generator=gen, dtype=F64) * 0.699 + 0.3)
    v = torch.log(torch.rand(T * B, H, generator=gen, dtype=F64) * 2 + 1e-3)
    return a.to(dtype), v.to(dtype)


def _stability(function, dtype, T):
    """T steps: the pass on ``dtype`` logs (float32, or bfloat16: carried in float32) against
    float64 on the same values.  The logs a*_t of the paper's cumulative sum pass -T/4 here
    (-750 at T = 3000), so its literal form would lose ~|a*_t| float32 roundings of log h_t;
    one step at a time, each step rounds once and the earlier errors are damped by p_t <= 1,
    so h_t stays within ROUNDINGS float32 roundings of its own size."""
    B, H = 2, 8
    a, v = _long_logs(T, B, H, dtype)
    S = Steps(T, B, None, "cpu")
    h0 = torch.rand(B, H, dtype=F64)
    got = function.apply(S, a, v, h0.float())[B:].double()
    want = LogLinearScan.apply(S, a.double(), v.double(), h0)[B:]
    assert got.dtype == F64 and torch.isfinite(got).all()
    rel = float(((got - want).abs() / want).max())
    assert rel <= ROUNDINGS * eps(torch.float32), rel
    a_star = torch.cumsum(a.double().view(T, B, H), 0)
    assert float(a_star.min()) < -T / 4  # what the literal form would have to cancel
    return rel


def _literal(a, v, h0, T):
    """The paper's ``parallel_scan_log`` as written (cumsum, then logcumsumexp)."""
    a, v = a.view(T, -1, a.shape[-1]), v.view(T, -1, v.shape[-1])
    a_star = F.pad(torch.cumsum(a, 0), (0, 0, 0, 0, 1, 0))
    log_values = torch.cat([torch.log(h0)[None], v])
    return torch.exp(a_star + torch.logcumsumexp(log_values - a_star, 0))[1:]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_long_sequences_stay_accurate(dtype, loops):
    _stability(LogLinearScan, dtype, 3000)


def test_the_literal_cumulative_form_would_not():
    """The same float32 logs through the literal form lose what the bound allows (about 1000
    roundings here, against the pass's few): why the kernel steps instead."""
    T = 3000
    a, v = _long_logs(T, 2, 8, torch.float32)
    h0 = torch.rand(2, 8, dtype=F64)
    want = _literal(a.double(), v.double(), h0, T)
    got = _literal(a, v, h0.float(), T).double()
    assert float(((got - want).abs() / want).max()) > ROUNDINGS * eps(torch.float32)


@interpreted
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_long_sequences_stay_accurate_triton(dtype, monkeypatch):
    _stability(_triton(monkeypatch), dtype, 800)  # (interpreted: one Python step each)
