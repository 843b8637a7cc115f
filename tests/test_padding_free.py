"""Variable-length batches at the speed of their real tokens: every fast path runs the packed
layout of ``lstmablate/cells/kernels/common/sequences.py`` (``Steps``), in which step t runs
only the sequences still running and every buffer holds real tokens only.

* the layout itself, against hand-computed offsets, orders and final rows;
* every kernel family's every case (``KernelFamily.cases``), on the native loops and on the
  PyTorch loops, uni- and bidirectional (the linear-scan and SRU families' cases:
  ``test_kernels_linear_scan.py``, ``test_kernels_sru.py``, with these lengths and by
  hand), against the reference loop in float64 (outputs, final states, every gradient) on
  batches with lengths 1..T and a length-0 row, and with all lengths equal and shorter
  than the call (steps past the longest sequence);
  ``test_fused.py`` and ``test_fused_multiplicative.py`` hold the full batches, the other
  padded batch and recurrent dropout; ``test_kernels_triton.py`` the Triton kernels, here
  with these lengths too;
* padding is never read: NaN in every padded input position changes nothing (a kernel that
  ran the padding would multiply it into the input weights' gradient);
* what a call keeps for its backward does not grow with the padding, and an ``lstm``
  encoder keeps no more than PyTorch's packed ``nn.LSTM`` of the same shape;
* ``lstmablate bench`` reports the share of padding beside the real tokens/s.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lstmablate import bench
from lstmablate.bench import cells as bench_cells
from lstmablate.cells import build_encoder
from lstmablate.cells.kernels.common import native, triton_support
from lstmablate.cells.kernels.common.sequences import Steps
from lstmablate.cells.kernels.gru import family as gru
from lstmablate.cells.kernels.lstm import family as lstm_family
from lstmablate.cells.kernels.second_order import dyck, factored, multi_matrix

from fast_path_harness import assert_fast_matches_reference

F64 = torch.float64
CASES = (list(lstm_family.KERNELS.cases) + list(gru.KERNELS.cases)
         + list(factored.KERNELS.cases) + list(multi_matrix.KERNELS.cases))
IDS = [n + "".join(f"-{k}={v}" for k, v in o.items()) for n, o in CASES]
T = 6
#: lengths 1..T in no order, a length-0 row; all equal and shorter than the call
LENGTHS = {"1toT-and-0": [3, 6, 1, 0, 5, 2, 4], "equal-short": [4, 4, 4]}


# ---------------------------------------------------------------------------------
# the layout
# ---------------------------------------------------------------------------------

def test_the_packed_layout():
    lengths = torch.tensor([3, 0, 5, 1, 5])
    S = Steps(7, 5, lengths, torch.device("cpu"))
    # sorted longest first, ties in the caller's order: rows 2, 4, 0, 3, 1 (lengths 5 5 3 1 0)
    assert S.order.tolist() == [2, 4, 0, 3, 1]
    assert S.T == 5 and S.N == 14  # the longest length; the real tokens
    assert [S.rows(t) for t in range(S.T)] == [4, 3, 3, 2, 2]
    assert S.off == [0, 4, 7, 10, 12, 14]
    x = torch.arange(7 * 5, dtype=F64).view(7, 5, 1)  # x[t, b] = 5 t + b
    packed = S.pack(x).view(-1).tolist()
    assert packed == [2, 4, 0, 3, 7, 9, 5, 12, 14, 10, 17, 19, 22, 24]  # step by step, sorted
    back = S.unpack(S.pack(x))
    real = torch.arange(7).view(7, 1, 1) < lengths.view(1, 5, 1)
    assert torch.equal(back, torch.where(real, x, torch.zeros(())))  # exactly zero at padding
    # a state buffer: the initial rows (sorted), then every step's; the final state of each
    # row is its state after its last real step, its initial state for length 0
    init = torch.tensor([[100.0], [101], [102], [103], [104]], dtype=F64)
    buf = S.state_buffer(init)
    assert buf[:5].view(-1).tolist() == [102, 104, 100, 103, 101]
    buf[5:] = S.pack(x)
    assert S.final(buf).view(-1).tolist() == [10, 101, 22, 3, 24]
    # the state each step reads: the previous step's first rows(t) rows
    assert [s.view(-1).tolist() for s in S.states_in(buf)][:3] == [[102, 104, 100, 103],
                                                                  [2, 4, 0], [7, 9, 5]]
    # gradients: the final state's enters at the row's last real step; length 0 goes to h_0
    dout = torch.ones(7, 5, 1, dtype=F64)
    dfin = torch.tensor([[10.0], [20], [30], [40], [50]], dtype=F64)
    g, direct = S.grads(dout, dfin, buf)
    assert g.view(-1).tolist() == [1, 1, 1, 41, 1, 1, 1, 1, 1, 11, 1, 1, 31, 51]
    assert direct.view(-1).tolist() == [0, 20, 0, 0, 0]


def test_without_padding_nothing_is_copied_or_sorted():
    x = torch.randn(4, 3, 2)
    S = Steps(4, 3, None, torch.device("cpu"))
    assert not S.padded and S.off == [0, 3, 6, 9, 12]
    assert S.pack(x).data_ptr() == x.data_ptr()


# ---------------------------------------------------------------------------------
# every family against the reference loop
# ---------------------------------------------------------------------------------

@pytest.fixture(params=["native", "python"])
def loops(request, monkeypatch):
    """native: the C loops (CPU default; lstm / lstm-gates / gru kept off PyTorch's
    kernels); python: the PyTorch loops (no compiler, other devices)."""
    monkeypatch.setenv("LSTMABLATE_TORCH_ON_CPU", "0")
    if request.param == "native":
        if not all(native.library(f) for f in ("lstm_family", "gru", "second_order",
                                               "linear_scan", "sru")):
            pytest.skip("the native kernels cannot be built here")
    else:
        monkeypatch.setenv("LSTMABLATE_NATIVE", "0")
    return request.param


def _compare(name, opts, lengths, bidirectional, dtype=F64, layers=2, H=4, I=3):
    torch.manual_seed(0)
    enc = build_encoder(name, I, H, num_layers=layers, bidirectional=bidirectional,
                        **opts).to(dtype)
    gen = torch.Generator().manual_seed(1)
    B = len(lengths)
    x = torch.randn(B, T, I, generator=gen, dtype=dtype)
    n = layers * (2 if bidirectional else 1)
    state = []
    for sname, size in zip(enc.layers[0][0].state_names, enc.layers[0][0].state_sizes):
        s = torch.randn(n, B, size, generator=gen, dtype=dtype)
        state.append(torch.softmax(s, -1) if sname.startswith("key") else s)
    assert_fast_matches_reference(enc, x, torch.tensor(lengths), tuple(state), 1e-10,
                                  none_is_zero=True)


@pytest.mark.parametrize("name,opts", CASES, ids=IDS)
@pytest.mark.parametrize("lengths", list(LENGTHS.values()), ids=list(LENGTHS))
def test_every_case_bidirectional(name, opts, lengths, loops):
    _compare(name, opts, lengths, bidirectional=True)


@pytest.mark.parametrize("name,opts", [("lstm", {}), ("lstm-srnn-hidden", {}), ("gru", {}),
                                       ("mlstm", {}), ("mmlstm", {})],
                         ids=["lstm", "lstm-srnn-hidden", "gru", "mlstm", "mmlstm"])
def test_unidirectional(name, opts, loops):
    _compare(name, opts, LENGTHS["1toT-and-0"], bidirectional=False)


def test_dyck_rnn():
    """The Dyck-RNN's loop (PyTorch only; one layer, 1-d inputs, left to right)."""
    assert dyck.KERNELS.paths
    torch.manual_seed(0)
    enc = build_encoder("dyck-rnn", 1, 4, num_layers=1).double()
    gen = torch.Generator().manual_seed(1)
    lengths = LENGTHS["1toT-and-0"]
    x = torch.randn(len(lengths), T, 1, generator=gen, dtype=F64)
    state = (torch.randn(1, len(lengths), 4, generator=gen, dtype=F64),)
    assert_fast_matches_reference(enc, x, torch.tensor(lengths), state, 1e-10,
                                  none_is_zero=True)


needs_interpreter = pytest.mark.skipif(not triton_support.interpreting(),
                                       reason="needs Triton's interpreter (TRITON_INTERPRET=1)")


@needs_interpreter
@pytest.mark.parametrize("name", ["lstm-srnn", "lstm-srnn-hidden", "gru", "mlstm", "mmrnn"])
@pytest.mark.parametrize("lengths", list(LENGTHS.values()), ids=list(LENGTHS))
def test_triton_kernels(name, lengths, monkeypatch):
    """The Triton kernels under the interpreter: one layer, both directions."""
    monkeypatch.setenv("LSTMABLATE_TRITON", "1")
    _compare(name, {}, lengths, bidirectional=True, layers=1, H=3)


# ---------------------------------------------------------------------------------
# padding is never read, and costs no memory
# ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name,opts", [("lstm", {}), ("lstm-srnn-hidden", {}), ("lstm-gates", {}),
                                       ("gru", {}), ("mlstm", {}), ("mmrnn", {}), ("qrnn", {}),
                                       ("qrnn", {"window": 2}), ("sru-2017", {}),
                                       ("minlstm", {}), ("sru", {})],
                         ids=["lstm", "lstm-srnn-hidden", "lstm-gates", "gru", "mlstm", "mmrnn",
                              "qrnn", "qrnn-window=2", "sru-2017", "minlstm", "sru"])
def test_nan_padding_changes_nothing(name, opts, loops):
    """A fast path that ran the padding would carry NaN from the padded inputs into the
    gradients (0 x NaN is NaN in the input weights' product)."""
    torch.manual_seed(0)
    enc = build_encoder(name, 3, 4, num_layers=2, bidirectional=True, **opts).double()
    lengths = torch.tensor(LENGTHS["1toT-and-0"])
    x = torch.randn(len(lengths), T, 3, dtype=F64)
    pad = torch.arange(T).view(1, T) >= lengths.view(-1, 1)
    results = []
    for fill in (0.0, float("nan")):
        xi = x.masked_fill(pad.unsqueeze(-1), fill).requires_grad_(True)
        enc.zero_grad()
        out, state = enc(xi, lengths)
        (out.sum() + sum(s.sum() for s in state)).backward()
        results.append([out, *state, xi.grad.masked_fill(pad.unsqueeze(-1), 0.0),
                        *[p.grad for p in enc.parameters()]])
    for a, b in zip(*results):
        assert torch.isfinite(b).all()
        torch.testing.assert_close(a, b, rtol=0, atol=0)


class _SavedBytes:
    """The bytes of floating-point data saved for backward inside the context (each storage
    once; the index tensors of the reversals and packings, a few bytes per position, are not
    what grows with the width)."""

    def __init__(self):
        self.seen = {}

    def __enter__(self):
        def pack(t):
            if t.is_floating_point():
                st = t.untyped_storage()
                self.seen[st.data_ptr()] = st.nbytes()
            return t
        self.hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
        self.hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self.hooks.__exit__(*exc)

    @property
    def total(self) -> int:
        return sum(self.seen.values())


@pytest.mark.parametrize("name", ["lstm", "lstm-srnn", "lstm-srnn-hidden", "lstm-gates", "gru",
                                  "mlstm", "qrnn", "sru-2017", "mingru", "minlstm", "sru"])
def test_padding_costs_no_memory(name, loops):
    """The same sequences padded to twice the length keep the same bytes for the backward
    (a padded layout would keep twice as many for every per-step buffer).  (The width-2
    QRNN, whose terms read across steps, computes them in the padded layout.)"""
    torch.manual_seed(0)
    enc = build_encoder(name, 8, 16, num_layers=2, bidirectional=True)
    lengths = torch.tensor([5, 2, 7, 4])
    kept = []
    for steps in (7, 14):
        x = torch.randn(4, steps, 8, requires_grad=True)
        with _SavedBytes() as saved:
            enc(x, lengths)
        kept.append(saved.total)
    assert kept[0] == kept[1]


def test_lstm_keeps_no_more_than_packed_nn_lstm(monkeypatch):
    """An ``lstm`` encoder's call on the native loops keeps for its backward no more than
    PyTorch's ``nn.LSTM`` on the packed sequence of the same shape (parser-like:
    bidirectional, three layers, lengths from 10 to 40 of 40; recomputing tanh(c_t) and h_t
    instead of keeping them is what it takes).  (Without the native loops ``lstm`` runs
    PyTorch's own kernel on CPU; the PyTorch loops keep what the native ones keep.)"""
    if native.library("lstm_family") is None:
        pytest.skip("the native kernels cannot be built here")
    monkeypatch.setenv("LSTMABLATE_TORCH_ON_CPU", "0")
    torch.manual_seed(0)
    B, T_, H = 16, 40, 64
    lengths = torch.randint(10, T_ + 1, (B,))
    lengths[0] = T_
    x = torch.randn(B, T_, H, requires_grad=True)
    ours = build_encoder("lstm", H, H, num_layers=3, bidirectional=True)
    theirs = nn.LSTM(H, H, num_layers=3, bidirectional=True, batch_first=True)
    with _SavedBytes() as saved_ours:
        ours(x, lengths)
    packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
    with _SavedBytes() as saved_theirs:
        theirs(packed)
    assert saved_ours.total <= saved_theirs.total, (saved_ours.total, saved_theirs.total)


# ---------------------------------------------------------------------------------
# the benchmark
# ---------------------------------------------------------------------------------

def test_bench_reports_the_share_of_padding(monkeypatch):
    tiny = bench_cells.Shape("tiny-varlen", batch=4, steps=6, hidden=8, layers=1,
                             bidirectional=True, min_length=2)
    monkeypatch.setitem(bench_cells.SHAPES, "tiny-varlen", tiny)
    rows = bench.bench_cells(cells=["lstm"], shapes=["tiny-varlen", "4x6x8x1"], threads=1,
                             repeats=1, warmup=0)
    varlen = [r for r in rows if r["shape"] == "tiny-varlen"]
    assert varlen and all(0 < r["padding"] < 1 for r in varlen)
    assert all(r["padding"] == 1 - r["tokens"] / 24 for r in varlen)  # real tokens only
    assert all(r["padding"] == 0 for r in rows if r["shape"] == "4x6x8x1")
    md = bench.to_markdown(rows)
    assert f"| {varlen[0]['padding']:.0%} |" in md and "| padding |" in md
