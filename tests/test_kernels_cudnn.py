"""PyTorch's fused kernels for ``lstm``, ``lstm-gates`` and ``gru``
(``kernels/common/delegate.py``), the CPU side of what runs on cuDNN: our parameters kept
in PyTorch's layout between calls (remade exactly when a parameter changed), every
gradient landing on our own parameters, and a whole stacked bidirectional encoder as one
fused call, against the reference loop (float64, padded batches).  Which encoders may be
one call (the plan of a CUDA call, tested without a GPU).  On a GPU (the flat cuDNN buffer,
no per-call compaction): ``tests/gpu/``.
"""

from __future__ import annotations

import pytest
import torch

from lstmablate.cells import build_encoder, get_cell, reference_mode
from lstmablate.cells.kernels.common import delegate
from lstmablate.cells.kernels.gru import family as gru
from lstmablate.cells.kernels.lstm import family as lstm_family

F64 = torch.float64
STACKABLE = [("lstm", {}, "lstm", lstm_family), ("lstm", {"proj_size": 3}, "lstm", lstm_family),
             ("lstm", {"content_bias": False}, "lstm", lstm_family),
             ("lstm-gates", {}, "rnn", lstm_family),
             ("lstm-gates", {"content_bias": False}, "rnn", lstm_family),
             ("gru", {"reset_after": True}, "gru", gru)]
IDS = ["lstm", "lstm-proj", "lstm-no-content-bias", "lstm-gates", "lstm-gates-no-bias",
       "gru-reset_after"]


@pytest.fixture
def torch_kernels(monkeypatch):
    monkeypatch.setenv("LSTMABLATE_TORCH_ON_CPU", "1")  # PyTorch's kernel on CPU, as on CUDA
    monkeypatch.setenv("LSTMABLATE_TRITON", "0")


def test_weights_are_kept_and_remade_when_a_parameter_changes(torch_kernels):
    # (``lstm`` itself lives in cuDNN's layout and hands its own parameters over:
    # tests/test_lstm_flat_weights.py; without a content bias it is re-laid out and kept)
    enc = build_encoder("lstm", 3, 4, num_layers=1, content_bias=False).double()
    cell = enc.layers[0][0]
    x = torch.randn(2, 5, 3, dtype=F64)
    enc(x)[0].sum().backward()
    kept = delegate.kept_for(cell.weight_ih)
    first = list(kept.weights)
    enc(x)
    assert kept.remade == 1 and all(a is b for a, b in zip(first, kept.weights))
    # PyTorch's layout: gate blocks i, f, g, o (ours i, f, o, g), our bias as b_ih, b_hh = 0
    H = 4
    w = cell.weight_ih.detach()
    assert torch.equal(kept.weights[0], torch.cat([w[:2 * H], w[3 * H:], w[2 * H:3 * H]]))
    assert not kept.weights[3].any()
    torch.optim.SGD(enc.parameters(), lr=0.1).step()  # an in-place update
    enc(x)
    assert kept.remade == 2
    w = cell.weight_ih.detach()
    assert torch.equal(kept.weights[0][3 * H:], w[2 * H:3 * H])
    enc.load_state_dict({k: v + 1 for k, v in enc.state_dict().items()})
    enc(x)
    assert kept.remade == 3
    with torch.no_grad():
        enc(x)
    assert kept.remade == 3


@pytest.mark.parametrize("name,opts,kind,family", STACKABLE, ids=IDS)
def test_per_cell_calls_match_the_reference(name, opts, kind, family, torch_kernels):
    """Each cell through PyTorch's kernel (with its kept weights): outputs, final states and
    every gradient of our own parameters equal the reference loop's."""
    _compare(name, opts, lambda enc, x, lengths, state: enc(x, lengths, state))


@pytest.mark.parametrize("name,opts,kind,family", STACKABLE, ids=IDS)
def test_one_call_for_the_whole_stack(name, opts, kind, family, torch_kernels):
    """Three layers, bidirectional, padded: one fused call of the whole encoder."""
    def stacked(enc, x, lengths, state):
        out, fin = delegate.stacked(family.KERNELS, kind, enc, x.transpose(0, 1), lengths, state)
        return out.transpose(0, 1), fin
    _compare(name, opts, stacked)


def _compare(name, opts, run):
    torch.manual_seed(0)
    enc = build_encoder(name, 5, 4, num_layers=3, bidirectional=True, **opts).double()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(4, 6, 5, generator=gen, dtype=F64)
    lengths = torch.tensor([6, 2, 5, 1])
    state = tuple(torch.randn(6, 4, s, generator=gen, dtype=F64)
                  for s in enc.layers[0][0].state_sizes)
    res = []
    for ref in (False, True):
        xi = x.clone().requires_grad_(True)
        st = tuple(s.clone().requires_grad_(True) for s in state)
        enc.zero_grad()
        if ref:
            with reference_mode():
                out, fin = enc(xi, lengths, st)
        else:
            out, fin = run(enc, xi, lengths, st)
        g = torch.Generator().manual_seed(2)
        loss = (out * torch.randn(out.shape, generator=g, dtype=F64)).sum()
        loss = loss + sum((f * torch.randn(f.shape, generator=g, dtype=F64)).sum() for f in fin)
        loss.backward()
        res.append([out, *fin, xi.grad, *(s.grad for s in st),
                    *(p.grad for p in enc.parameters())])
    for a, b in zip(*res):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in enc.parameters())


def test_which_encoders_are_one_call():
    """The plan of a CUDA call: one call where nothing sits between the layers."""
    def plan(name="lstm", mask="none", triton=None, train=True, **options):
        enc = build_encoder(name, 3, 4, num_layers=2, bidirectional=True, **options).train(train)
        fam = enc.layers[0][0]._kernels()
        return fam.stack_plan(enc, device_type="cuda", mask=mask, triton=triton)

    assert plan() == "torch-lstm"
    assert plan("lstm-gates") == "torch-rnn"
    assert plan("gru", reset_after=True) == "torch-gru"
    assert plan(mask="prefix") == "torch-lstm"
    assert plan("lstm", proj_size=2) == "torch-lstm"
    assert plan(mask="prefix0") is None  # a length-0 row cannot be packed
    assert plan(dropout=0.3) is None  # dropout between the layers ...
    assert plan(dropout=0.3, train=False) == "torch-lstm"  # ... only in training
    assert plan(recurrent_dropout=0.2) is None
    assert plan(residual=True) is None
    assert plan("lstm-srnn") is None and plan("gru") is None  # no fused kernel of PyTorch's
    with pytest.MonkeyPatch.context() as m:
        m.setenv("LSTMABLATE_TRITON", "1")
        assert plan(triton=True) is None  # every call to the Triton kernels
    enc = build_encoder("lstm", 3, 4, num_layers=2)
    assert enc.layers[0][0]._kernels().stack_plan(enc, device_type="cpu") is None
    lstm = get_cell("lstm").build(3, 4)
    assert lstm._kernels().kernel_name(lstm, device_type="cuda",
                                       stacked=True) == "torch-lstm (cuDNN, stacked)"


def test_a_cpu_encoder_is_never_one_call(torch_kernels, monkeypatch):
    calls = []
    monkeypatch.setattr(delegate, "stacked", lambda *a, **k: calls.append(a))
    enc = build_encoder("lstm", 3, 4, num_layers=2, bidirectional=True)
    enc(torch.randn(2, 5, 3))
    assert not calls


def test_the_host_overhead_benchmark_runs(torch_kernels):
    """benchmarks/host_overhead.py (docs/results/speed.md quotes it) still runs: its four rows
    per cell, each a positive time."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "host_overhead.py"
    spec = importlib.util.spec_from_file_location("host_overhead", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    for cell, module in (("lstm", "nn.LSTM"), ("lstm-gates", "nn.RNN")):
        rows = dict(bench.rows_for(cell, rounds=1, calls=2))
        assert list(rows) == [f"{module} module", "bare call", f"ours ({cell})", "plan"]
        assert all(us > 0 for us in rows.values())
