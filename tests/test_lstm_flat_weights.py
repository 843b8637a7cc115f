"""``lstm`` and ``lstm-gates`` in cuDNN's layout (``lstmablate/cells/lstm.py``): their
parameters are views of one flat buffer in PyTorch's gate order, which PyTorch's fused kernel
reads in place; the parameter names, checkpoints, the reference loop and the weighted-sum
view are unchanged; an optimiser's step updates the buffer; checkpoints written before (the
blocks ordered i, f, o, g: ``tests/fixtures/checkpoints/lstm-v1.pt``, made by that code) load
into today's cells with the same numbers, and a resumed optimiser continues exactly.

Gradients through the views are checked against the reference loop in float64 (padded,
stacked, bidirectional) and with gradcheck w.r.t. the flat buffer itself.  The kernel is
PyTorch's CPU implementation of the LSTM / RNN that cuDNN runs on a GPU
(``LSTMABLATE_TORCH_ON_CPU=1``); cuDNN reading the buffer in place: ``tests/gpu/``.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch
from torch import nn

from lstmablate.cells import build_encoder, get_cell, reference_mode
from lstmablate.cells.base import weighted_sum
from lstmablate.cells.kernels.common import delegate
from lstmablate.cells.kernels.lstm import family as lstm_family
from lstmablate.train.checkpoint import migrate_optimizer_rows

F64 = torch.float64
FIXTURE = Path(__file__).parent / "fixtures" / "checkpoints" / "lstm-v1.pt"
FLAT = [("lstm", {}), ("lstm", {"proj_size": 2}), ("lstm-gates", {}),
        ("lstm-gates", {"content_bias": False})]
FLAT_IDS = ["lstm", "lstm-proj", "lstm-gates", "lstm-gates-no-bias"]


@pytest.fixture
def torch_kernels(monkeypatch):
    monkeypatch.setenv("LSTMABLATE_TORCH_ON_CPU", "1")  # PyTorch's kernel on CPU, as on CUDA
    monkeypatch.setenv("LSTMABLATE_TRITON", "0")


def _flat_views(cell) -> list[tuple[int, int]]:
    """(offset, numel) of each of the cell's weights in its flat buffer."""
    flat = cell.flat_buffer()
    base = flat.data_ptr()
    return [((w.data_ptr() - base) // w.element_size(), w.numel()) for w in cell.torch_weights]


@pytest.mark.parametrize("name,opts", FLAT, ids=FLAT_IDS)
def test_the_weights_are_views_of_one_flat_buffer_in_torch_order(name, opts):
    cell = get_cell(name).build(3, 4, **opts)
    assert cell.cudnn_layout
    ws = cell.torch_weights
    # exactly the tensors of torch.nn.LSTM / RNN's weight list, end to end in one buffer
    ref = (nn.LSTM(3, 4, proj_size=opts.get("proj_size", 0)) if cell.memory_cell
           else nn.RNN(3, 4, bias=cell.bias is not None))
    assert [tuple(w.shape) for w in ws] == [tuple(w.shape) for w in ref._flat_weights]
    spans = _flat_views(cell)
    assert spans[0][0] == 0 and all(a + n == b for (a, n), (b, _) in zip(spans, spans[1:]))
    assert cell.flat_buffer().numel() == sum(n for _, n in spans)
    if cell.memory_cell:
        assert cell.blocks == ("i", "f", "g", "o") == cell.recurrent_blocks
    if cell.bias is not None:
        assert not cell.bias_hh.requires_grad and not cell.bias_hh.any()
    # the registry's names, nothing more: the second bias is no parameter and not saved
    names = {"weight_ih", "weight_hh"} | ({"bias"} if cell.bias is not None else set()) | (
        {"weight_hr"} if opts.get("proj_size") else set())
    assert {n for n, _ in cell.named_parameters()} == names == set(cell.state_dict())


@pytest.mark.parametrize("name,opts", [("lstm", {"content_bias": False}), ("lstm-srnn", {}),
                                       ("lstm-srnn-hidden", {}), ("lstm-noforget", {})],
                         ids=["lstm-no-content-bias", "lstm-srnn", "lstm-srnn-hidden",
                              "lstm-noforget"])
def test_the_other_cells_keep_their_layout(name, opts):
    cell = get_cell(name).build(3, 4, **opts)
    assert not cell.cudnn_layout and cell.torch_weights is None and cell.flat_buffer() is None
    assert cell.blocks == cell.legacy_blocks and cell.blocks[-1] == "g"


def test_an_optimizer_step_updates_the_flat_buffer_and_to_keeps_it_one():
    enc = build_encoder("lstm", 3, 4, num_layers=2)
    cells = enc.cells()
    ptrs = [[w.data_ptr() for w in c.torch_weights] for c in cells]
    enc(torch.randn(2, 5, 3))[0].sum().backward()
    opt = torch.optim.SGD(enc.parameters(), lr=0.5, momentum=0.9)
    for _ in range(2):
        opt.step()
    for c, before in zip(cells, ptrs):
        assert [w.data_ptr() for w in c.torch_weights] == before  # updated in place
        flat = c.flat_buffer()
        assert torch.equal(flat, torch.cat([w.detach().reshape(-1) for w in c.torch_weights]))
        assert not c.bias_hh.any()
    enc.double()  # converted: one flat buffer again, the same parameter objects
    params = list(enc.parameters())
    for c in cells:
        spans = _flat_views(c)
        assert c.flat_buffer().dtype == F64 and spans[0][0] == 0
        assert all(a + n == b for (a, n), (b, _) in zip(spans, spans[1:]))
    assert all(p.dtype == F64 for p in params)
    opt = torch.optim.SGD(params, lr=0.5)
    enc(torch.randn(2, 5, 3, dtype=F64))[0].sum().backward()
    opt.step()  # the optimiser's parameters are still the buffer's views
    c = cells[0]
    assert torch.equal(c.flat_buffer(), torch.cat([w.detach().reshape(-1) for w in c.torch_weights]))


@pytest.mark.parametrize("name,opts", FLAT, ids=FLAT_IDS)
def test_a_call_hands_the_parameters_over_as_they_are(name, opts, torch_kernels):
    """No re-layout, no kept copy: the fused kernel's weights are the parameters."""
    cell = get_cell(name).build(3, 4, **opts).double()
    fam = lstm_family.KERNELS
    assert fam.plan(cell, dtype=F64) in ("torch-lstm", "torch-rnn") or opts.get("proj_size")
    seen = []
    real = delegate._run_vf

    def spy(kind, x, hx, weights, *args, **kw):
        seen.append(list(weights))
        return real(kind, x, hx, weights, *args, **kw)

    delegate._run_vf = spy
    try:
        cell(torch.randn(5, 2, 3, dtype=F64))
    finally:
        delegate._run_vf = real
    if opts.get("proj_size"):  # (no projection in oneDNN: our own kernel on CPU)
        assert not seen
        return
    assert len(seen) == 1 and all(a is b for a, b in zip(seen[0], cell.torch_weights))
    assert delegate.kept_for(cell.weight_ih) is None


def _ref_vs_fast(enc, x, lengths, state, run):
    """Outputs, final states and every gradient of the fast call and of the reference loop."""
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
    return res


@pytest.mark.parametrize("stack", [False, True], ids=["per-cell", "one-call"])
@pytest.mark.parametrize("name,opts", FLAT, ids=FLAT_IDS)
def test_gradients_through_the_views_equal_the_reference(name, opts, stack, torch_kernels):
    """Two layers, bidirectional, padded (a row of each length), float64: per cell, and the
    whole stack as one fused call of every cell's buffer."""
    torch.manual_seed(0)
    enc = build_encoder(name, 5, 4, num_layers=2, bidirectional=True, **opts).double()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(4, 6, 5, generator=gen, dtype=F64)
    lengths = torch.tensor([6, 2, 5, 1])
    state = tuple(torch.randn(4, 4, s, generator=gen, dtype=F64)
                  for s in enc.layers[0][0].state_sizes)
    kind = "lstm" if enc.layers[0][0].memory_cell else "rnn"

    def run(enc, x, lengths, state):
        if not stack:
            return enc(x, lengths, state)
        out, fin = delegate.stacked(lstm_family.KERNELS, kind, enc, x.transpose(0, 1), lengths,
                                    state)
        return out.transpose(0, 1), fin

    if stack and opts.get("proj_size"):
        pytest.skip("no projection in PyTorch's CPU LSTM kernel (cuDNN has one: tests/gpu/)")
    fast, ref = _ref_vs_fast(enc, x, lengths, state, run)
    for a, b in zip(fast, ref):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in enc.parameters())


@pytest.mark.parametrize("name", ["lstm", "lstm-gates"])
def test_gradcheck_with_respect_to_the_flat_buffer(name, torch_kernels):
    """gradcheck of outputs and final state w.r.t. one flat buffer whose views are the cell's
    weights (the kernel's backward lands its weight gradients on the views)."""
    torch.manual_seed(0)
    cell = get_cell(name).build(2, 3).double()
    spans = _flat_views(cell)
    names = ["weight_ih", "weight_hh", "bias", "bias_hh"]
    flat = cell.flat_buffer().detach().clone().requires_grad_(True)
    x = torch.randn(4, 2, 2, dtype=F64)
    mask = torch.tensor([[1, 1], [1, 1], [1, 0], [1, 0]], dtype=F64)  # lengths 4 and 2

    def f(flat):
        views = {n: flat[a:a + k].view_as(w)
                 for n, (a, k), w in zip(names, spans, cell.torch_weights)}
        params = {n: v for n, v in views.items() if n != "bias_hh"}
        buffers = {"bias_hh": views["bias_hh"]}
        out, fin = torch.func.functional_call(cell, {**params, **buffers}, (x, None, mask))
        return (out, *fin)

    assert torch.autograd.gradcheck(f, (flat,))


def test_weighted_sum_view_and_reference_loop_unchanged():
    """The weighted-sum view (eq 8) names blocks, not rows: its memory is the forward's c_t."""
    torch.manual_seed(0)
    cell = get_cell("lstm").build(3, 4).double()
    x = torch.randn(6, 2, 3, dtype=F64)
    trace = cell.trace_memory(x)
    ws = weighted_sum(trace)
    with reference_mode():
        _, (h, c) = cell(x)
    torch.testing.assert_close(trace["memory"][-1], c, atol=1e-12, rtol=0)
    recon = (ws["weights"] * ws["content"].unsqueeze(1)).sum(2)  # c_t = sum_j w_j^t c~_j
    torch.testing.assert_close(recon, ws["memory"], atol=1e-12, rtol=0)


# ---------------------------------------------------------------------------------------
# checkpoints
# ---------------------------------------------------------------------------------------

def _load_fixture() -> dict:
    return torch.load(FIXTURE, weights_only=True)


@pytest.mark.parametrize("case", ["lstm", "lstm-proj", "lstm-no-content-bias", "lstm-gates",
                                  "lstm-srnn"])
def test_a_checkpoint_written_before_loads_with_the_same_numbers(case):
    """The fixture was written by the code before cuDNN's layout (its module version 1): the
    model computes what that code computed, and a resumed Adam takes the very step that code
    took next."""
    fix = _load_fixture()
    c = fix["cases"][case]
    assert c["model"]._metadata[""].get("version") is not None  # torch.save kept it
    enc = build_encoder(c["name"], 3, 4, num_layers=2, bidirectional=True,
                        **c["options"]).double()
    enc.load_state_dict(c["model"])
    x, lengths = fix["x"], fix["lengths"]
    with torch.no_grad():
        out, final = enc(x, lengths)
    torch.testing.assert_close(out, c["out"], atol=1e-12, rtol=1e-12)
    for a, b in zip(final, c["final"]):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)
    opt = torch.optim.Adam(enc.parameters(), lr=0.01)
    opt.load_state_dict(c["optimizer"])
    moved = migrate_optimizer_rows(enc, c["model"], opt)
    assert moved == (12 if case in ("lstm", "lstm-proj") else 0)  # 4 cells x 3 parameters
    out, fin = enc(x, lengths)
    ((out * c["weights"]).sum() + sum(f.square().sum() for f in fin)).backward()
    opt.step()
    after = build_encoder(c["name"], 3, 4, num_layers=2, bidirectional=True,
                          **c["options"]).double()
    after.load_state_dict(c["after"])
    for (n, p), q in zip(enc.named_parameters(), after.parameters()):
        torch.testing.assert_close(p, q, atol=1e-12, rtol=1e-12, msg=n)


def test_a_checkpoint_written_now_round_trips_and_the_caller_dict_is_untouched():
    torch.manual_seed(0)
    enc = build_encoder("lstm", 3, 4, num_layers=1).double()
    buf = io.BytesIO()
    torch.save({"model": enc.state_dict()}, buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)["model"]
    again = build_encoder("lstm", 3, 4, num_layers=1).double()
    again.load_state_dict(state)
    for p, q in zip(enc.parameters(), again.parameters()):
        assert torch.equal(p, q)
    # an old state: its rows reordered as they load, the dict handed in left as it was
    fix = _load_fixture()["cases"]["lstm"]["model"]
    w = fix["layers.0.0.weight_ih"].clone()
    build_encoder("lstm", 3, 4, num_layers=2, bidirectional=True).double().load_state_dict(fix)
    assert torch.equal(fix["layers.0.0.weight_ih"], w)
    # a dict built in this process (no metadata) is read as today's layout
    plain = {k: v.clone() for k, v in enc.state_dict().items()}
    again.load_state_dict(plain)
    assert torch.equal(again.layers[0][0].weight_ih, enc.layers[0][0].weight_ih)
