"""The GPU paths on a GPU (every test here is skipped without CUDA; ``make gpu-check`` runs
them, and ``pytest tests/gpu`` on any machine with one).

* the Triton kernels, compiled for this GPU, against the reference loop (every case of
  every family; float32 against a float64 reference with dtype-derived tolerances, the
  harness of the CPU tests; padded bidirectional batches, recurrent dropout);
* the CUDA-graph capture of their loops: captured, replayed with new inputs and updated
  parameters, the same numbers as eager launches, and no capture emptying the allocator's
  cache;
* bfloat16 under autocast: the Triton kernels and cuDNN against a float64 reference, with the
  CPU tests' tolerance (u (2T + 16) of each tensor's scale);
* a Triton kernel whose launch fails: the same numbers on the next path, one warning;
* cuDNN reading ``lstm``'s and ``lstm-gates``' flat buffers in place (no per-call
  compaction), the other cells' weights kept in its flat layout, and a whole stacked
  bidirectional encoder in one call, against the layer-by-layer reference;
* ``lstmablate bench --device cuda`` names the path of every row.

The CPU side of all of this (the kernels' arithmetic under Triton's interpreter, the graph
cache's logic, the kept weights, the plans): ``tests/test_kernels_*.py``.
"""

from __future__ import annotations

import os
import warnings
from contextlib import nullcontext

import pytest
import torch

from lstmablate.cells import build_encoder, reference_mode
from lstmablate.cells.kernels.common import delegate, graphs, triton_support
from lstmablate.cells.kernels.additive import family as additive
from lstmablate.cells.kernels.gru import family as gru
from lstmablate.cells.kernels.linear_scan import family as linear_scan
from lstmablate.cells.kernels.lstm import family as lstm_family
from lstmablate.cells.kernels.second_order import factored, multi_matrix
from lstmablate.cells.kernels.sru import family as sru_family
from lstmablate.cells.kernels.interface import kernel_name_of

from fast_path_harness import assert_fast_matches_reference
from tolerance import low_precision_tolerance

DEVICE = os.environ.get("LSTMABLATE_GPU_DEVICE", "cuda")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
needs_triton = pytest.mark.skipif(not triton_support.importable() or triton_support.interpreting(),
                                  reason="needs Triton (compiled, TRITON_INTERPRET unset)")
CASES = [*lstm_family.KERNELS.cases, *gru.KERNELS.cases, *factored.KERNELS.cases,
         *multi_matrix.KERNELS.cases,
         *(c for c in linear_scan.KERNELS.cases if c[0] != "sru"),  # (sru: no linear scan)
         # ran and knn-rnn on the LSTM family's kernels (knn-rnn: its coupled input gate);
         # g = identity runs the reference loop, so it has no Triton path to check
         *(c for c in additive.KERNELS.cases if c[1].get("activation") != "identity"),
         *sru_family.KERNELS.cases]  # the 2018 sru's own pass


def _ids(cases):
    return [n + "".join(f"-{k}={v}" for k, v in o.items()) for n, o in cases]


def _inputs(enc, B, T, I, dtype, seed=1):
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(B, T, I, generator=gen) * 2).to(DEVICE, dtype)
    cell = enc.layers[0][0]
    n = enc.num_layers * enc.num_directions
    state = []
    for name, size in zip(cell.state_names, cell.state_sizes):
        s = torch.randn(n, B, size, generator=gen)
        s = s.abs() if getattr(cell, "log_space", False) else s  # log h_0 exists (mode: log)
        state.append((torch.softmax(s, -1) if name.startswith("key") else s).to(DEVICE, dtype))
    return x, tuple(state)


@needs_triton
@pytest.mark.parametrize("name,opts", CASES, ids=_ids(CASES))
def test_triton_kernels_match_the_reference(name, opts, monkeypatch):
    monkeypatch.setenv("LSTMABLATE_TRITON", "1")
    torch.manual_seed(0)
    enc = build_encoder(name, 24, 40, num_layers=2, bidirectional=True, recurrent_dropout=0.2,
                        **opts).to(DEVICE).train()
    path = kernel_name_of(enc.layers[0][0], device_type="cuda", mask="prefix0", h_mask=True)
    assert path.startswith("triton-"), path
    x, state = _inputs(enc, 6, 9, 24, torch.float32)
    assert_fast_matches_reference(enc, x, torch.tensor([9, 3, 0, 5, 9, 1]), state, None,
                                  none_is_zero=True)


@needs_triton
@pytest.mark.parametrize("name", ["lstm-srnn", "lstm-srnn-hidden", "gru", "mlstm", "mmlstm"])
def test_captured_loops_replay_the_eager_numbers(name, monkeypatch):
    """Three training steps of the same shapes (two layers: two sightings of a shape per
    step), captured from the second step on: outputs and gradients equal those of eager
    launches (LSTMABLATE_CUDA_GRAPHS=0)."""
    monkeypatch.setattr(graphs, "CACHE", graphs.GraphCache())
    runs = {}
    for setting in ("0", "auto"):
        monkeypatch.setenv("LSTMABLATE_CUDA_GRAPHS", setting)
        torch.manual_seed(0)
        enc = build_encoder(name, 16, 32, num_layers=2).to(DEVICE).train()
        opt = torch.optim.SGD(enc.parameters(), lr=0.1)
        got = []
        for step in range(3):
            x, _ = _inputs(enc, 5, 7, 16, torch.float32, seed=step)
            out, fin = enc(x, torch.tensor([7, 3, 5, 7, 2]))
            (out.square().sum() + sum(f.square().sum() for f in fin)).backward()
            got.append([out.detach(), *(p.grad.clone() for p in enc.parameters())])
            opt.step()
            opt.zero_grad()
        runs[setting] = got
    if name != "lstm-srnn-hidden":  # the scan is one launch: nothing to capture
        assert any(slot.graphed for _, slot in graphs.CACHE.slots.values())
    for a, b in zip(runs["0"], runs["auto"]):
        for u, v in zip(a, b):
            torch.testing.assert_close(u, v, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name,opts", [("lstm", {}), ("lstm", {"proj_size": 16}),
                                       ("lstm-gates", {})],
                         ids=["lstm", "lstm-proj", "lstm-gates"])
def test_cudnn_reads_the_cells_flat_buffers_in_place(monkeypatch, name, opts):
    """``lstm`` and ``lstm-gates`` live in cuDNN's layout: each cell's parameters are views of
    one flat buffer cuDNN made (``torch._cudnn_rnn_flatten_weight``), read in place at every
    per-layer call (no "not part of a single contiguous chunk" compaction warning, nothing
    kept or remade), updated in place by an optimiser step, and flat again after ``.to``."""
    monkeypatch.setattr(delegate, "_quiet", lambda x: nullcontext())
    enc = build_encoder(name, 32, 48, num_layers=2, bidirectional=True, dropout=0.3,
                        **opts).to(DEVICE).train()  # dropout: one cuDNN call per cell
    x = torch.randn(4, 6, 32, device=DEVICE)
    cells = enc.cells()
    ptrs = [[w.data_ptr() for w in c.torch_weights] for c in cells]
    assert all(len({w.untyped_storage().data_ptr() for w in c.torch_weights}) == 1
               for c in cells)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        enc(x)[0].sum().backward()
        torch.optim.SGD(enc.parameters(), lr=0.1).step()
        enc(x)[0].sum().backward()
    assert [[w.data_ptr() for w in c.torch_weights] for c in cells] == ptrs
    assert delegate.kept_for(enc) is None and delegate.kept_for(cells[0].weight_ih) is None
    enc.double().float()  # converted twice: flat again
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        enc(x)[0].sum().backward()


def test_cudnn_keeps_the_relaid_weights_of_other_cells_in_place(monkeypatch):
    """A cell cuDNN runs but that is not in its layout (``lstm`` without a content bias): the
    kept weights are one flat buffer in cuDNN's layout, kept across calls, remade after an
    update."""
    monkeypatch.setattr(delegate, "_quiet", lambda x: nullcontext())
    enc = build_encoder("lstm", 32, 48, num_layers=2, bidirectional=True,
                        content_bias=False).to(DEVICE)
    x = torch.randn(4, 6, 32, device=DEVICE)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        enc(x)[0].sum().backward()
        kept = delegate.kept_for(enc)
        assert kept is not None  # the whole stack was one call
        storages = {w.untyped_storage().data_ptr() for w in kept.weights}
        assert len(storages) == 1
        enc(x)
        assert kept.remade == 1
        torch.optim.SGD(enc.parameters(), lr=0.1).step()
        enc(x)
        assert kept.remade == 2


@pytest.mark.parametrize("name,opts", [("lstm", {}), ("lstm", {"proj_size": 16}),
                                       ("lstm-gates", {}), ("gru", {"reset_after": True})],
                         ids=["lstm", "lstm-proj", "lstm-gates", "gru-reset_after"])
def test_one_cudnn_call_for_a_stacked_encoder(name, opts):
    torch.manual_seed(0)
    enc = build_encoder(name, 24, 32, num_layers=3, bidirectional=True, **opts).to(DEVICE).double()
    assert kernel_name_of(enc.layers[0][0], device_type="cuda", dtype=torch.float64,
                          stacked=enc.layers[0][0]._kernels().stack_plan(
                              enc, device_type="cuda", dtype=torch.float64) is not None
                          ).endswith("(cuDNN, stacked)")
    x, state = _inputs(enc, 5, 8, 24, torch.float64)
    lengths = torch.tensor([8, 2, 5, 8, 1])
    res = []
    for ref in (False, True):
        xi = x.clone().requires_grad_(True)
        enc.zero_grad()
        with reference_mode(ref):
            out, fin = enc(xi, lengths, state)
        (out.square().sum() + sum(f.square().sum() for f in fin)).backward()
        res.append([out, *fin, xi.grad, *(p.grad for p in enc.parameters())])
    for a, b in zip(*res):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


def test_the_benchmark_names_each_path():
    from lstmablate import bench

    rows = bench.bench_cells(["lstm", "lstm-srnn", "gru", "mmrnn"], ["4x6x16x2xbi"], threads=1,
                             device=DEVICE, repeats=1, warmup=1, reference=False)
    kernel = {r["cell"]: r["kernel"] for r in rows}
    assert kernel["nn.LSTM"] == "cuDNN"
    assert kernel["lstm"] == "torch-lstm (cuDNN, stacked)"
    triton = triton_support.importable() and not triton_support.interpreting()
    for cell in ("lstm-srnn", "gru", "mmrnn"):
        assert kernel[cell] == ("triton-recurrent (CUDA graphs)" if triton else
                                "recurrent (pytorch)"), kernel
    assert all(r["memory_kind"] == "peak" and r["memory_mb"] >= 0 for r in rows)


@needs_triton
def test_captures_never_empty_the_allocator_cache(monkeypatch):
    """Training steps that capture new shapes: no synchronize / empty_cache per capture
    (``graphs.CudaGraphs``), and the captures happen."""
    monkeypatch.setattr(graphs, "CACHE", graphs.GraphCache())

    def forbidden(*a, **k):
        raise AssertionError("a capture emptied the allocator cache")
    monkeypatch.setattr(torch.cuda, "empty_cache", forbidden)
    enc = build_encoder("lstm-srnn", 16, 32, num_layers=2).to(DEVICE).train()
    for step in range(4):
        for T in (7, 9):  # two shapes
            x, _ = _inputs(enc, 5, T, 16, torch.float32, seed=step)
            enc(x)[0].square().sum().backward()
    assert graphs.CACHE.captures >= 2


def _low_precision_matches_the_reference(enc, dtype, T=9, B=6):
    """enc under autocast in ``dtype`` against its float64 reference loop, on the GPU."""
    import copy

    x, _ = _inputs(enc, B, T, enc.input_size, torch.float32)
    lengths = torch.tensor([T, 3, 1, 5, T, 2])
    ref = copy.deepcopy(enc).double()
    xi = x.clone().requires_grad_(True)
    with torch.autocast("cuda", dtype=dtype):
        out, fin = enc(xi, lengths)
    assert out.dtype == dtype
    w = torch.randn(out.shape, device=DEVICE, dtype=torch.float64)
    (out.double() * w).sum().backward()
    xr = x.double().requires_grad_(True)
    with reference_mode():
        out_r, _ = ref(xr, lengths)
    (out_r * w).sum().backward()
    pairs = [("out", out, out_r), ("dx", xi.grad, xr.grad)]
    pairs += [(n, p.grad, q.grad) for (n, p), q in zip(enc.named_parameters(), ref.parameters())]
    for name, got, want in pairs:
        scale = float(want.detach().abs().max())
        err = float((got.detach().double() - want.detach()).abs().max())
        assert err <= low_precision_tolerance(dtype, T, scale), (name, err, scale)


@needs_triton
@pytest.mark.parametrize("name", ["lstm-srnn", "lstm-srnn-hidden", "gru", "mlstm"])
def test_triton_kernels_in_bfloat16(name, monkeypatch):
    monkeypatch.setenv("LSTMABLATE_TRITON", "1")
    if not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bfloat16")
    torch.manual_seed(0)
    enc = build_encoder(name, 24, 40, num_layers=2, bidirectional=True).to(DEVICE).train()
    assert kernel_name_of(enc.layers[0][0], device_type="cuda", dtype=torch.bfloat16,
                          autocast=True).startswith("triton-")
    _low_precision_matches_the_reference(enc, torch.bfloat16)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_cudnn_in_low_precision(dtype):
    """``lstm`` under autocast: cuDNN's kernels in the autocast dtype itself (PyTorch's own
    autocast would run them in float16 even under bfloat16), one stacked call."""
    from lstmablate.cells.kernels import interface

    if dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bfloat16")
    torch.manual_seed(0)
    enc = build_encoder("lstm", 24, 40, num_layers=2, bidirectional=True).to(DEVICE).eval()
    interface.reset_kernel_record()
    _low_precision_matches_the_reference(enc, dtype)
    paths = interface.kernel_record()["paths"]["lstm"]
    assert paths == {"torch-lstm": 4, "reference": 4}, paths  # 4 cells; then the reference
    assert not interface.kernel_record()["fallbacks"]


@needs_triton
def test_a_failing_launch_falls_back_on_the_gpu(monkeypatch):
    from lstmablate.cells.kernels import interface
    from lstmablate.cells.kernels.lstm import triton_kernels

    monkeypatch.setenv("LSTMABLATE_TRITON", "1")
    interface.forget_failures()

    def failing(*args, **kwargs):
        raise RuntimeError("injected: Triton Error [CUDA]: launch failed")
    monkeypatch.setattr(triton_kernels.lstm_step, "run", failing)
    torch.manual_seed(0)
    enc = build_encoder("lstm-srnn", 24, 40, num_layers=2, bidirectional=True).to(DEVICE).train()
    x, state = _inputs(enc, 6, 9, 24, torch.float32)
    try:
        with pytest.warns(RuntimeWarning, match="lstm_step.*LSTMABLATE_TRITON=0"):
            assert_fast_matches_reference(enc, x, torch.tensor([9, 3, 0, 5, 9, 1]), state, None,
                                          none_is_zero=True)
    finally:
        interface.forget_failures()
