"""Our cells against the reference implementations of their equations (each skipped, with its
reason, where the optional package is absent: ``pip install -e .[peers]``), and ``lstmablate
bench --peers`` (``lstmablate/bench/peers.py``).

* ``sru`` = the authors' SRU layer (``sru`` package, ``rescale=False``) given the same
  weights, with and without the skip projection; ``sru-2017`` = the same package's first
  form (``v1=True``: no v ∘ c_{t-1}, ``use_tanh``);
* ``lstm`` = FlashRNN's LSTM (its PyTorch implementation, ``backend="vanilla"``) given the
  same weights;
* ``mingru``'s recurrence = flash-linear-attention's HGRN kernel (h_t = exp(g_t) ∘ h_{t-1} +
  x_t) fed our cell's own gates (its weighted-sum view: x_t = write_t ∘ content_t,
  g_t = log keep_t), the Triton kernel under Triton's interpreter.

All in float64: outputs, final states and (where both sides are differentiable on a CPU)
every gradient.  The layouts are read from the packages' code (``sru/modules.py``: ``weight``
(I, k·H) whose column j·k + m is matrix m of unit j; ``flashrnn``: gates i, f, z, o).
"""

from __future__ import annotations

import warnings

import pytest
import torch

from lstmablate.bench.peers import PEERS, bench_peers, markdown_rows
from lstmablate.cells import get_cell, reference_mode

F64 = torch.float64
TOL = dict(atol=1e-10, rtol=1e-10)


def _sru_from_ours(ours, theirs) -> None:
    """Copy our cell's weights into the package's layer: weight_ih rows [W; W_f; W_r (; W_s)]
    -> weight[:, j * k + m] = matrix m's row j; bias [b_f; b_r] and weight_c [v_f; v_r] as
    they are (the package's order too)."""
    H, k = ours.hidden_size, ours.weight_ih.shape[0] // ours.hidden_size
    cell = theirs.rnn_lst[0]
    w = ours.weight_ih.detach().view(k, H, -1).permute(2, 1, 0).reshape(-1, H * k)
    with torch.no_grad():
        cell.weight.copy_(w)
        cell.bias.copy_(ours.bias)
        if ours.weight_c is not None:
            cell.weight_c.copy_(ours.weight_c)


@pytest.mark.parametrize("name,I", [("sru", 4), ("sru", 3), ("sru-2017", 4)],
                         ids=["sru", "sru-skip-projection", "sru-2017"])
def test_our_sru_equals_the_authors_layer(name, I):
    sru = pytest.importorskip("sru", reason="the authors' package (pip install sru) is absent")
    H, T, B = 4, 6, 3
    torch.manual_seed(0)
    ours = get_cell(name).build(I, H).double()
    v1 = name == "sru-2017"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its CUDA kernels do not build here
        theirs = sru.SRU(I, H, num_layers=1, rescale=False, v1=v1, use_tanh=v1).double()
    _sru_from_ours(ours, theirs)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(T, B, I, generator=gen, dtype=F64)
    c0 = torch.randn(B, H, generator=gen, dtype=F64)
    g = torch.randn(T, B, H, generator=gen, dtype=F64)
    res = []
    for run in ("ours", "theirs"):
        xi, ci = x.clone().requires_grad_(True), c0.clone().requires_grad_(True)
        if run == "ours":
            with reference_mode():
                h, state = ours(xi, (torch.zeros(B, H, dtype=F64), ci)
                                if len(ours.state_sizes) == 2 else (ci,))
            c = state[-1]
            params = [ours.weight_ih, ours.bias] + ([ours.weight_c] if not v1 else [])
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "Running SRU on CPU with grad_enabled=True"
                h, c = theirs(xi, ci.unsqueeze(0))
            c = c[0]
            params = []
        ((h * g).sum() + c.square().sum()).backward()
        res.append((h, c, xi.grad, ci.grad))
        if run == "ours":
            grads = [p.grad.clone() for p in params]
    for a, b in zip(*res):
        torch.testing.assert_close(a, b, **TOL)
    cell = theirs.rnn_lst[0]  # the package's weight gradients, in our layout
    k = ours.weight_ih.shape[0] // H
    theirs_w = cell.weight.grad.view(I, H, k).permute(2, 1, 0).reshape(k * H, I)
    torch.testing.assert_close(grads[0], theirs_w, **TOL)
    torch.testing.assert_close(grads[1], cell.bias.grad, **TOL)
    if not v1:
        torch.testing.assert_close(grads[2], cell.weight_c.grad, **TOL)


def test_our_lstm_equals_flashrnns_lstm():
    flashrnn = pytest.importorskip("flashrnn", reason="flashrnn (pip install flashrnn) is absent")
    I, H, T, B = 3, 4, 5, 2
    torch.manual_seed(0)
    ours = get_cell("lstm").build(I, H).double()
    assert ours.blocks == ("i", "f", "g", "o")  # flashrnn's i, f, z, o
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(T, B, I, generator=gen, dtype=F64)
    with reference_mode():
        h, (hn, cn) = ours(x)
    wx = (x @ ours.weight_ih.detach().t()).transpose(0, 1).reshape(B, T, 4, 1, H)
    R = ours.weight_hh.detach().view(4, 1, H, H)  # [gate, head, new unit, previous unit]
    b = ours.bias.detach().view(4, 1, H)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hs, last = flashrnn.flashrnn(wx, R, b, function="lstm", backend="vanilla",
                                     dtype="float64")
    torch.testing.assert_close(hs[0, :, :, 0].transpose(0, 1), h.detach(), **TOL)
    torch.testing.assert_close(last[0, :, 0, 0], hn.detach(), **TOL)
    torch.testing.assert_close(last[1, :, 0, 0], cn.detach(), **TOL)


@pytest.mark.slow  # (importing flash-linear-attention takes about 20 s)
def test_mingrus_recurrence_equals_fla_hgrn():
    """flash-linear-attention's HGRN recurrence, fed minGRU's write, keep and content (our
    cell's weighted-sum view), gives our memory and output (Feng et al. 2024: h_t = (1 - z_t)
    h_{t-1} + z_t h~_t): its Triton kernel on a GPU, its own PyTorch statement of the
    recurrence on a CPU (its kernels do not start without a GPU driver)."""
    pytest.importorskip("fla", reason="flash-linear-attention (pip install fla-core) is absent")
    if torch.cuda.is_available():
        from fla.ops.hgrn import fused_recurrent_hgrn as hgrn
        device = "cuda"
    else:
        from fla.ops.hgrn.naive import naive_recurrent_hgrn as hgrn
        device = "cpu"
    I, H, T, B = 3, 8, 6, 2
    torch.manual_seed(0)
    cell = get_cell("mingru").build(I, H).double()
    x = torch.randn(T, B, I, dtype=F64)
    trace = cell.trace_memory(x)
    with reference_mode():
        h, _ = cell(x)
    inp = (trace["write"] * trace["content"]).transpose(0, 1).contiguous()
    gate = torch.log(trace["keep"]).transpose(0, 1).contiguous()
    out, final = hgrn(inp.float().to(device), gate.float().to(device), output_final_state=True)
    out = out.double().cpu().transpose(0, 1)
    tol = dict(atol=1e-5, rtol=1e-5)  # (it computes in float32)
    torch.testing.assert_close(out, trace["memory"].detach(), **tol)
    torch.testing.assert_close(out, h.detach(), **tol)
    torch.testing.assert_close(final.double().cpu(), h[-1].detach(), **tol)


def test_bench_peers_names_every_peer_and_skips_what_is_absent(monkeypatch):
    """A tiny shape: each peer is a measured row or a row that says why not (a package that
    is not installed is named; fla's Triton kernel is timed on a GPU only)."""
    import lstmablate.bench.peers as peers

    real = peers.importlib.import_module

    def absent(name, *a):
        if name == "flashrnn":
            raise ImportError("No module named 'flashrnn'")
        return real(name, *a)

    monkeypatch.setattr(peers.importlib, "import_module", absent)
    monkeypatch.setattr(peers, "_version", lambda d: None if d == "flashrnn" else "1.0")
    rows = bench_peers(["4x5x8x2"], device="cpu", threads=1, repeats=1, warmup=1)
    by = {r["peer"]: r for r in rows}
    assert set(by) == {p.name for p in PEERS}
    assert by["flashrnn-lstm"]["status"] == "skipped: flashrnn not installed"
    assert by["fla-hgrn"]["status"].startswith("skipped: Triton kernels")
    for name in ("sru", "sru-2017"):
        r = by[name]
        if r["status"] != "measured":
            assert r["status"].startswith("skipped: sru"), r
            continue
        assert r["shape"] == "4x5x8x2 (1 layer)" and r["tokens"] == 20
        assert r["ours_vs_peer"] == pytest.approx(r["ours_tokens_per_s"] / r["peer_tokens_per_s"])
    table = "\n".join(markdown_rows(rows))
    assert "flashrnn-lstm (flashrnn)" in table and "skipped: flashrnn not installed" in table
    with pytest.raises(ValueError, match="unknown peer"):
        bench_peers(["4x5x8x2"], peers=["nope"], device="cpu", repeats=1)
