"""The fast paths of ``ran`` and ``knn-rnn`` (``lstmablate/cells/kernels/additive/``: the LSTM
family's recurrence on the ``lstm-srnn-out`` layout each of them is) against the reference
step loop.

Outputs, final states and every gradient (inputs, initial states, all parameters) through
stacked encoders, uni- and bidirectional (the backward direction sees padding too), with
random initial states, on batches with every length 1..T and a length-0 row and on full
batches, with and without recurrent dropout: in float64 to 1e-10, in float32 against a
float64 reference (``fast_path_harness``), on the native (C) loops, the PyTorch loops and,
under Triton's interpreter, the Triton kernels.  Padded outputs are exactly zero and receive
no gradient (the harness).  Plus: ``knn-rnn``'s coupled input gate (i_t = 1 − λ_t, computed
element-wise from the one recurrent gate, on the cell's own parameters) by gradcheck on every
path, and in the LSTM family's scan (a coupled layout that reads no h_{t-1}) against a
hand-written loop; the readings the kernels cannot compute (g = identity, the highway), which
path each call takes, and autocast.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from lstmablate.cells import get_cell
from lstmablate.cells.kernels.additive import family
from lstmablate.cells.kernels.common import triton_support
from lstmablate.cells.kernels.interface import KernelPath, kernel_name_of, plan_of
from lstmablate.cells.kernels.lstm.family import KERNELS as LSTM_KERNELS
from lstmablate.cells.kernels.lstm.recurrent import Layout, layout

from fast_path_harness import (FULL, VARLEN, assert_mask_with_holes_runs_the_reference,
                               assert_runs_on, compare_encoder, random_state, use_loops)

F64 = torch.float64
#: the cases the LSTM kernels compute (the others run the reference loop)
FAST = [(n, o) for n, o in family.KERNELS.cases
        if o.get("activation", "tanh") == "tanh" and not o.get("highway")]
SLOW = [(n, o) for n, o in family.KERNELS.cases if (n, o) not in FAST] + [
    ("knn-rnn", {"highway": True})]
IDS = [n + "".join(f"-{k}={v}" for k, v in o.items()) for n, o in FAST]
T = 7
interpreted = pytest.mark.skipif(not triton_support.interpreting(),
                                 reason="needs Triton with its interpreter on (TRITON_INTERPRET=1)")
#: how bench names the kernel network's paths: the coupled input gate
COUPLED = ", coupled i = 1 - f"


@pytest.fixture(params=["native", "python"])
def loops(request, monkeypatch):
    """native: the LSTM family's C loops (the CPU default); python: its PyTorch loops."""
    return use_loops(request.param, monkeypatch, "lstm_family")


def _compare(name, opts, dtype, lengths, **kw):
    return compare_encoder(name, opts, dtype, lengths, T, **kw)


@pytest.mark.parametrize("name,opts", FAST, ids=IDS)
@pytest.mark.parametrize("lengths", [VARLEN, FULL], ids=["varlen", "full"])
@pytest.mark.parametrize("bidirectional", [True, False], ids=["bi", "uni"])
def test_float64_matches_the_reference(name, opts, lengths, bidirectional, loops):
    enc = _compare(name, opts, F64, lengths, bidirectional=bidirectional)
    coupled = COUPLED if name == "knn-rnn" else ""
    assert_runs_on(enc.layers[0][0], f"recurrent ({loops.replace('python', 'pytorch')}{coupled})",
                   "RecurrentLSTMBackward")


@pytest.mark.parametrize("name,opts", FAST, ids=IDS)
def test_float32_matches_a_float64_reference(name, opts, loops):
    _compare(name, opts, torch.float32, [7, 1, 2, 3, 4, 5, 6, 7])


@pytest.mark.parametrize("name,opts", FAST, ids=IDS)
def test_recurrent_dropout_and_input_size_unlike_hidden(name, opts, loops):
    """The recurrent-dropout mask multiplies h_{t-1} where it enters the gates' product, in
    the kernel as in the reference loop."""
    _compare(name, opts, F64, VARLEN, I=3, H=6, recurrent_dropout=0.3)


def test_the_kernel_network_runs_its_own_parameters_on_one_recurrent_gate():
    """knn-rnn reaches the LSTM kernels as the coupled layout — blocks (f, g), f alone reading
    h_{t-1} — with the cell's own tensors: a recurrent product of H rows, no copies; ran as the
    lstm-srnn-out it is."""
    knn, ran = get_cell("knn-rnn").build(3, 4), get_cell("ran").build(3, 4)
    v = family.lstm_view(family.KERNELS.view(knn))
    assert (v.weight_ih, v.weight_hh, v.bias) == (knn.weight_ih, knn.weight_hh, knn.bias)
    assert v.weight_hh.shape == (4, 4) and v.weight_ih.shape == (8, 3)
    assert layout(v) == Layout(H=4, P=4, nb=2, nG=1, fi=0, oi=-1, r0=0, r1=1, srnn=False,
                               memory=True, coupled=True)
    r = family.lstm_view(family.KERNELS.view(ran))
    assert layout(r) == layout(get_cell("lstm-srnn-out").build(3, 4)) and not layout(r).coupled
    assert kernel_name_of(knn) == f"recurrent (native{COUPLED})"
    assert kernel_name_of(ran) == "recurrent (native)"


@pytest.mark.parametrize("loops", ["native", "python"])
def test_the_coupled_input_gate_by_gradcheck(loops, monkeypatch):
    """The gradients of knn-rnn's coupled kernel (i = 1 − λ reaches f's pre-activation as −dI)
    with respect to the input, the initial state and every parameter, W_λh included, are the
    true ones: float64, a batch with a length-0 row and recurrent dropout, on the C and the
    PyTorch loops (the Triton kernels free their buffers after one backward, which gradcheck
    repeats: they are held to the reference loop's gradients above)."""
    use_loops(loops, monkeypatch, "lstm_family")
    torch.manual_seed(0)
    cell = get_cell("knn-rnn").build(3, 2).double()
    x = torch.randn(4, 3, 3, dtype=F64)
    mask = torch.tensor([[1, 1, 0], [1, 1, 0], [1, 0, 0], [1, 0, 0]], dtype=F64)
    h_mask = torch.tensor([[2.0, 0.0], [1.0, 2.0], [0.0, 2.0]], dtype=F64)
    assert plan_of(cell, dtype=F64, mask="prefix0", h_mask=True) == "recurrent"

    def run(w_ih, w_hh, bias, x, h0, c0):
        cell.weight_ih, cell.weight_hh, cell.bias = w_ih, w_hh, bias
        out, (h, c) = cell(x, (h0, c0), mask, h_mask)
        return out, h, c

    params = [torch.nn.Parameter(p.detach().clone()) for p in
              (cell.weight_ih, cell.weight_hh, cell.bias)]
    state = [torch.randn(3, 2, dtype=F64, requires_grad=True) for _ in range(2)]
    assert torch.autograd.gradcheck(run, (*params, x.requires_grad_(True), *state), eps=1e-6,
                                    atol=1e-9, rtol=1e-7)


def coupled_scan_reference(w_ih, bias, x, c0, lengths):
    """The coupled memory with nothing reading h_{t-1}, step by step on the padded batch:
    f_t = σ(W_f x_t + b), c_t = f_t c_{t-1} + (1 − f_t) W_c x_t, h_t = tanh(c_t)."""
    H = c0.shape[1]
    c, outs = c0, []
    for t in range(x.shape[0]):
        z = x[t] @ w_ih.t()
        f = torch.sigmoid(z[:, :H] + bias)
        live = (t < lengths).unsqueeze(1)
        c = torch.where(live, f * c + (1 - f) * z[:, H:], c)
        outs.append(torch.tanh(c) * live)
    return torch.stack(outs), c


@pytest.mark.parametrize("path", ["native", "python",
                                  pytest.param("triton", marks=interpreted)])
def test_the_coupled_input_gate_in_the_scan(path, monkeypatch):
    """The LSTM family's scan (C: its recurrence without a product; PyTorch; Triton) computes
    the coupled layout too: the outputs, final states and every gradient of a hand-written
    loop (float64, lengths 3, 1, 0)."""
    kernel = KernelPath.TRITON_SCAN if path == "triton" else KernelPath.SCAN
    if path != "triton":
        use_loops(path, monkeypatch, "lstm_family")
    torch.manual_seed(0)
    H, lengths = 2, torch.tensor([3, 1, 0])
    x = torch.randn(3, 3, 3, dtype=F64, requires_grad=True)
    w_ih = torch.randn(2 * H, 3, dtype=F64, requires_grad=True)
    bias = torch.randn(H, dtype=F64, requires_grad=True)
    h0, c0 = (torch.randn(3, H, dtype=F64, requires_grad=True) for _ in range(2))

    def run(w_ih, bias, x, h0, c0):
        v = SimpleNamespace(hidden_size=H, output_size=H, blocks=("f", "g"),
                            recurrent_blocks=(), coupled=True, content="linear",
                            memory_cell=True, weight_ih=w_ih, weight_hh=None, bias=bias,
                            weight_hr=None)
        out, (hn, cn) = LSTM_KERNELS.run(kernel, v, x, (h0, c0), lengths, None)
        return out, hn, cn

    inputs = (w_ih, bias, x, h0, c0)
    out, hn, cn = run(*inputs)
    want, c_last = coupled_scan_reference(w_ih, bias, x, c0, lengths)
    h_last = torch.cat([torch.tanh(c_last[:2]), h0[2:]])  # length 0: h_0 carried
    for got, ref in ((out, want), (hn, h_last), (cn, c_last)):
        torch.testing.assert_close(got, ref, rtol=0, atol=1e-12)
    weights = [torch.randn_like(t) for t in (out, hn, cn)]

    def grads(outputs):
        loss = sum((w * o).sum() for w, o in zip(weights, outputs))
        return torch.autograd.grad(loss, inputs)
    for got, ref in zip(grads((out, hn, cn)), grads((want, h_last, c_last))):
        torch.testing.assert_close(got, ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name,opts", SLOW,
                         ids=[n + "".join(f"-{k}={v}" for k, v in o.items()) for n, o in SLOW])
def test_what_the_lstm_kernels_cannot_compute_runs_the_reference_loop(name, opts):
    """g = identity (h_t = c_t) and the kernel network's highway are not lstm-srnn-out."""
    cell = get_cell(name).build(4, 4, **opts)
    assert plan_of(cell) == plan_of(cell, device_type="cuda", triton=True) == "reference"
    assert not cell.fast_path_available()


def test_which_path_each_call_takes(monkeypatch):
    """The LSTM family's choice for lstm-srnn-out, which has no PyTorch kernel to delegate to."""
    monkeypatch.setenv("LSTMABLATE_TRITON", "auto")
    for name, opts in FAST:
        cell = get_cell(name).build(3, 4, **opts)
        assert get_cell(name).fast_path
        ablation = get_cell("lstm-srnn-out").build(3, 4)
        for call in ({}, {"mask": "prefix0", "h_mask": True}, {"dtype": F64},
                     {"mask": "other"}, {"autocast": True, "dtype": torch.bfloat16},
                     {"device_type": "cuda", "triton": True},
                     {"device_type": "cuda", "triton": True, "autocast": True,
                      "dtype": torch.bfloat16},
                     {"device_type": "cuda", "triton": False}):
            assert plan_of(cell, **call) == plan_of(ablation, **call), (name, call)
        assert plan_of(cell) == "recurrent"
        assert plan_of(cell, device_type="cuda", triton=True) == "triton-recurrent"
        assert plan_of(cell, mask="other") == "reference"


@pytest.mark.parametrize("name", ["ran", "knn-rnn"])
def test_a_mask_with_holes_runs_the_reference_loop(name):
    cell = get_cell(name).build(3, 4).double()
    assert_mask_with_holes_runs_the_reference(cell, torch.randn(4, 2, 3, dtype=F64),
                                              compare_states=True)


@interpreted
@pytest.mark.parametrize("name,opts", FAST, ids=IDS)
@pytest.mark.parametrize("dtype,lengths,bidirectional,dropout",
                         [(F64, VARLEN, True, 0.0), (F64, FULL, True, 0.0),
                          (F64, VARLEN, False, 0.0), (F64, VARLEN, True, 0.3),
                          (torch.float32, [7, 1, 2, 3, 4, 5, 6], True, 0.0)],
                         ids=["float64-bi-varlen", "float64-bi-full", "float64-uni-varlen",
                              "float64-recurrent-dropout", "float32"])
def test_triton_matches_the_reference(name, opts, dtype, lengths, bidirectional, dropout,
                                      monkeypatch):
    """Uni- and bidirectional, every length 1..T with a length-0 row and all equal, recurrent
    dropout (on h_{t-1} where it enters the product, input size unlike hidden)."""
    monkeypatch.setenv("LSTMABLATE_TRITON", "1")
    sizes = dict(I=3, H=6) if dropout else {}
    enc = _compare(name, opts, dtype, lengths, bidirectional=bidirectional,
                   recurrent_dropout=dropout, **sizes)
    coupled = COUPLED if name == "knn-rnn" else ""
    assert kernel_name_of(enc.layers[0][0], dtype=dtype, mask="prefix0") == (
        f"triton-recurrent (interpreter{coupled})")


def test_bench_rows_and_targets_against_the_closest_ablation(monkeypatch):
    """`lstmablate bench` times each recurrent cell's closest LSTM ablation beside it (ran and
    knn-rnn: lstm-srnn-out; sru: lstm-srnn-hidden), at ptb-650 only, and the target is the
    ratio of their times (ran, which is lstm-srnn-out on its kernel: a tie within 3 %)."""
    from lstmablate import bench
    from lstmablate.bench import cells as bench_cells
    from lstmablate.bench.render import to_markdown

    ptb650 = bench_cells.SHAPES["ptb-650"]
    for name, base, need in (("ran", "lstm-srnn-out", 0.97), ("knn-rnn", "lstm-srnn-out", 1.0),
                             ("sru", "lstm-srnn-hidden", 1.0)):
        t = bench_cells._target(name, ptb650, {}, {name: 2.0, base: 3.0})
        assert (t["target"], t["target_baseline"], t["target_ratio"], t["target_met"]) == (
            need, base, 1.5, True)
        assert not bench_cells._target(name, ptb650, {}, {name: 3.0, base: 2.0})["target_met"]
        # just under the mark, and just over it
        assert not bench_cells._target(name, ptb650, {}, {name: 1.0, base: need - 0.01})[
            "target_met"]
        assert bench_cells._target(name, ptb650, {}, {name: 1.0, base: need + 0.01})["target_met"]
        assert bench_cells._target(name, ptb650, {}, {name: 3.0})["target"] is None  # not timed
        assert bench_cells._target(name, bench_cells.SHAPES["ptb-200"], {},
                                   {name: 2.0, base: 3.0})["target"] is None
    rows = bench.bench_cells(cells=["ran"], shapes=["2x3x4x1"], threads=1, repeats=1, warmup=0)
    assert {r["cell"] for r in rows} == {"nn.LSTM", "nn.RNN", "ran"}  # no target: no baseline
    shape = bench_cells.parse_shape("2x3x4x1").name  # a shape where ran's target applies:
    monkeypatch.setitem(bench_cells.TARGET_ONLY_AT, "ran", (shape,))  # its baseline is timed
    timed = {r["cell"]: r for r in bench.bench_cells(cells=["ran"], shapes=["2x3x4x1"],
                                                     threads=1, repeats=1, warmup=0)}
    assert set(timed) == {"nn.LSTM", "nn.RNN", "ran", "lstm-srnn-out"}
    assert timed["ran"]["target_baseline"] == "lstm-srnn-out"
    assert timed["ran"]["target_ratio"] == pytest.approx(timed["lstm-srnn-out"]["ms"]
                                                         / timed["ran"]["ms"])
    assert "0.97x lstm-srnn-out" in to_markdown(list(timed.values()))


@interpreted
@pytest.mark.parametrize("name,opts", FAST, ids=IDS)
def test_triton_under_bfloat16_autocast(name, opts, monkeypatch):
    """Under autocast the LSTM family casts the input, h and the
    parameters to bfloat16 and its Triton kernels carry the memory in float32: within the
    low-precision tolerance of a float64 reference loop (tests/tolerance.py)."""
    from lstmablate.cells import build_encoder
    from test_kernels_low_precision import assert_low_precision_close

    monkeypatch.setenv("LSTMABLATE_TRITON", "1")
    torch.manual_seed(0)
    enc = build_encoder(name, 6, 16, num_layers=2, bidirectional=True, **opts).train()
    assert plan_of(enc.layers[0][0], dtype=torch.bfloat16, autocast=True,
                   mask="prefix") == "triton-recurrent"
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(4, 8, 6, generator=gen)
    state = tuple(s * 0.5 for s in random_state(enc, 4, gen, torch.float32))
    assert_low_precision_close(enc, x, torch.tensor([8, 5, 4, 1]), state, torch.bfloat16, name)
