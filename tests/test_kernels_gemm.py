"""The products of all steps on the faster CPU GEMM (``lstmablate/cells/kernels/common/gemm.py``):
oneDNN's product and its gradients against float64 products, to float32 rounding; which
products the context sends there (float32 CPU ``a @ w`` with a 2-D ``w``; not float64, not
under autocast, not with ``LSTMABLATE_CPU_GEMM=mkl``); the calibrated choice, timed once and
remembered; and a linear-scan cell trained on it gives the reference loop's numbers."""

from __future__ import annotations

import pytest
import torch

from lstmablate.cells import build_encoder
from lstmablate.cells.kernels.common import calibrate, gemm

from fast_path_harness import assert_fast_matches_reference, autograd_functions
from tolerance import assert_close

pytestmark = pytest.mark.skipif(not gemm.onednn_available(), reason="PyTorch without oneDNN")


def test_the_onednn_product_and_its_gradients():
    """x W^T, dx = dZ W, dW = dZ^T x against float64 products: within float32 rounding of
    each result's scale (tests/tolerance.py; K-term sums: a few hundred roundings at most)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 37, 29, generator=gen).requires_grad_(True)
    w = torch.randn(41, 29, generator=gen).requires_grad_(True)
    dz = torch.randn(3, 37, 41, generator=gen)
    out = gemm.onednn_matmul(x, w.t())
    out.backward(dz)
    x64, w64 = x.detach().double(), w.detach().double()
    assert out.shape == (3, 37, 41) and _on_onednn(out)
    assert_close(out, x64 @ w64.t(), roundings=64, msg="x W^T")
    assert_close(x.grad, dz.double() @ w64, roundings=64, msg="dx")
    assert_close(w.grad, dz.double().reshape(-1, 41).t() @ x64.reshape(-1, 29), roundings=256,
                 msg="dW")


def _on_onednn(out) -> bool:
    return "OneDNNLinearBackward" in autograd_functions(out)


def test_which_products_go_to_onednn(monkeypatch):
    monkeypatch.setenv("LSTMABLATE_CPU_GEMM", "onednn")
    a, w = torch.randn(5, 4, 3, requires_grad=True), torch.randn(6, 3, requires_grad=True)
    with gemm.faster_products():
        assert _on_onednn(a @ w.t()) and _on_onednn(torch.matmul(a, w.t()))
        assert not _on_onednn(a.double() @ w.double().t())  # float64
        assert not _on_onednn(a @ torch.randn(5, 3, 2))  # a batch of matrices
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert not _on_onednn(a @ w.t())
        assert gemm.use_onednn(a, w.t()) and not gemm.use_onednn(a, w)  # sizes must agree
    assert not _on_onednn(a @ w.t())  # outside the context
    monkeypatch.setenv("LSTMABLATE_CPU_GEMM", "mkl")
    with gemm.faster_products():
        assert not _on_onednn(a @ w.t())


@pytest.fixture
def timing(monkeypatch):
    """The GEMM choice on a fake timing (mkl 3 s, onednn 2 s, own 1 s) and a cache file in
    memory; returns (the names timed, each time, the records written)."""
    monkeypatch.setenv("LSTMABLATE_CPU_GEMM", "auto")
    monkeypatch.setattr(calibrate, "_among", {})
    records, timed = {}, []
    monkeypatch.setattr(calibrate, "_read_cache", lambda: dict(records))
    monkeypatch.setattr(calibrate, "_write_record", lambda key, rec: records.update({key: rec}))

    def measure(runs):
        timed.append(sorted(runs))
        return {name: {"mkl": 3.0, "onednn": 2.0, "own": 1.0}[name] for name in runs}
    monkeypatch.setattr(calibrate, "measure", measure)
    return timed, records


def test_the_choice_is_timed_once_and_remembered(timing, monkeypatch):
    timed, records = timing
    a, w = torch.randn(20, 35, 7), torch.randn(7, 9)
    assert gemm.use_onednn(a, w) and gemm.use_onednn(a, w)
    assert timed == [["mkl", "onednn"]]  # timed once
    (key, rec), = records.items()
    assert key == f"gemm|float32|M1024|K7|N9|t{torch.get_num_threads()}|nograd"
    assert rec["choice"] == "onednn" and rec["mkl_ms"] == 3000.0
    monkeypatch.setattr(calibrate, "_among", {})  # another process: read from the cache file
    assert gemm.use_onednn(a, w) and len(timed) == 1


@pytest.mark.parametrize("name", ["qrnn", "sru-2017"])
def test_a_cell_on_onednn_matches_a_float64_reference(name, monkeypatch):
    """float32 on oneDNN's products, every output, final state and gradient against the
    float64 reference loop (fast_path_harness's tolerance)."""
    monkeypatch.setenv("LSTMABLATE_CPU_GEMM", "onednn")
    torch.manual_seed(0)
    enc = build_encoder(name, 5, 6, num_layers=2, bidirectional=True).train()
    x = torch.randn(4, 7, 5) * 2
    state = tuple(torch.randn(4, 4, s) for s in enc.layers[0][0].state_sizes)
    fast = assert_fast_matches_reference(enc, x, torch.tensor([7, 3, 0, 5]), state, None)
    out, _ = enc(x)
    assert _on_onednn(out) and fast["out"].dtype == torch.float32


class _Library:
    """Stands for a native library whose packed GEMM passed its self-test."""
    modes = ["blas", "own-packed"]


def test_our_gemm_joins_the_choice_where_a_native_library_runs(timing, monkeypatch):
    """With a native library the choice is among three GEMMs (a key of its own, so a two-way
    choice is not reused for it); ``LSTMABLATE_PACKED_GEMM=0`` takes ours out; a named GEMM
    that cannot run the call gives PyTorch's own."""
    timed, records = timing
    lib = _Library()
    assert gemm.choose(600, 7, 9, True, lib) == "own" and gemm.choose(700, 7, 9, True) == "onednn"
    assert timed == [["mkl", "onednn", "own"], ["mkl", "onednn"]]
    threads = torch.get_num_threads()
    assert set(records) == {f"gemm|float32|M1024|K7|N9|t{threads}|grad|own",
                            f"gemm|float32|M1024|K7|N9|t{threads}|grad"}
    monkeypatch.setenv("LSTMABLATE_PACKED_GEMM", "0")
    assert gemm.candidates(lib) == ("mkl", "onednn")
    assert gemm.choose(600, 7, 9, True, lib) == "onednn" and len(timed) == 2  # remembered
    monkeypatch.setenv("LSTMABLATE_CPU_GEMM", "own")
    assert gemm.choose(600, 7, 9, True, lib) == "mkl"  # (ours is off)
    monkeypatch.setenv("LSTMABLATE_PACKED_GEMM", "1")
    assert gemm.choose(600, 7, 9, True, lib) == "own" and gemm.choose(600, 7, 9, True) == "mkl"
    x, w = torch.randn(5, 7), torch.randn(9, 7)
    assert gemm.for_call(lib, x, w, True).gemm == "own"
    assert gemm.for_call(lib, x.double(), w.double(), True) is gemm.TORCH  # float32 only
    assert gemm.for_call(None, x, w, True) is gemm.TORCH  # the PyTorch loops


@pytest.mark.parametrize("choice", ["onednn", "own", "mkl"])
@pytest.mark.parametrize("name", ["lstm", "gru", "mlstm"])
def test_a_recurrent_cell_on_each_gemm_matches_a_float64_reference(name, choice, monkeypatch):
    """The hand-written backward passes with their large products on each GEMM, padding
    included: every output, final state and gradient against the float64 reference loop
    (fast_path_harness's tolerance)."""
    monkeypatch.setenv("LSTMABLATE_CPU_GEMM", choice)
    monkeypatch.setenv("LSTMABLATE_TORCH_ON_CPU", "0")  # ours, not PyTorch's kernel
    torch.manual_seed(0)
    enc = build_encoder(name, 5, 6, num_layers=2, bidirectional=True).train()
    x = torch.randn(4, 7, 5) * 2
    state = tuple(torch.randn(4, 4, s) for s in enc.layers[0][0].state_sizes)
    assert_fast_matches_reference(enc, x, torch.tensor([7, 3, 0, 5]), state, None)
