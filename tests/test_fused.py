"""The fast paths of the LSTM family and the GRU (``lstmablate.cells.kernels``) against the
reference step loop.

For every cell with a fast path: outputs, final states and every gradient
(inputs, initial states, all parameters) agree with the plain reference loop
(``lstmablate.cells.reference_mode()``), uni- and bidirectional, 2 layers, with padded
batches (including a length-0 row) and full batches, with and without
recurrent dropout and projections: to 1e-10 in float64; in float32 both the fast
path and the float32 reference loop against a float64 reference, to a tolerance
scaled to each tensor's magnitude and to the float32 loop's own error
(``fast_path_harness``), so the tests hold whatever the CPU's rounding.  The
native kernel also runs with 2 threads, its rows split between them.
Plus: which kernel each call selects (CPU and CUDA, without a GPU), the
switches that force the reference loop, and the fallback for masks with holes.
(The calibrated choice between our native kernel and PyTorch's: test_kernels_dispatch.py.)
"""

from __future__ import annotations

import warnings

import pytest
import torch

from lstmablate.cells import available_cells, build_encoder, get_cell, reference_mode, set_reference_mode
from lstmablate.cells.kernels.common import native, native_build
from lstmablate.cells.kernels.gru import family as gru
from lstmablate.cells.kernels.call import mask_kind
from lstmablate.cells.kernels.lstm import family as lstm_family

from fast_path_harness import (
    assert_fast_matches_reference,
    assert_mask_with_holes_runs_the_reference,
)

F64 = torch.float64
plan = lstm_family.KERNELS.plan
gru_plan = gru.KERNELS.plan

# (cell, options): every LSTM-family flag set of the registry plus the options that change
# the kernel (projection, content bias, gates without h, ...), as the families declare them
CASES = list(lstm_family.KERNELS.cases) + list(gru.KERNELS.cases)
IDS = [n + "".join(f"-{k}={v}" for k, v in o.items()) for n, o in CASES]


def _native_or_skip():
    if native.library("lstm_family") is None or native.library("gru") is None:
        pytest.skip("the native kernel cannot be built here")


@pytest.fixture(params=["native", "python", "torch"])
def backend(request, monkeypatch):
    """native: the compiled kernels (CPU default; for lstm / lstm-gates forced over
    PyTorch's, whatever the calibration says); python: the PyTorch loops (no compiler);
    torch: PyTorch's own LSTM/RNN for lstm / lstm-gates (as on CUDA)."""
    if request.param == "native":
        _native_or_skip()
        monkeypatch.setenv("LSTMABLATE_TORCH_ON_CPU", "0")
    if request.param == "python":
        monkeypatch.setenv("LSTMABLATE_NATIVE", "0")
    if request.param == "torch":
        monkeypatch.setenv("LSTMABLATE_TORCH_ON_CPU", "1")
    return request.param


def _compare(name, opts, dtype, bidirectional, lengths, recurrent_dropout, tol):
    torch.manual_seed(0)
    I, H, T = 5, 4, 7
    enc = build_encoder(name, I, H, num_layers=2, bidirectional=bidirectional,
                        recurrent_dropout=recurrent_dropout, **opts).to(dtype)
    enc.train()
    B = len(lengths)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(B, T, I, generator=gen, dtype=dtype) * 2
    n = 2 * (2 if bidirectional else 1)
    state = tuple(torch.randn(n, B, s, generator=gen, dtype=dtype)
                  for s in enc.layers[0][0].state_sizes)
    lt = torch.tensor(lengths)
    assert_fast_matches_reference(enc, x, lt, state, tol, none_is_zero=True)


@pytest.mark.parametrize("name,opts", CASES, ids=IDS)
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("lengths", [[7, 7, 7], [7, 3, 0, 5]], ids=["full", "varlen"])
def test_fast_matches_reference_float64(name, opts, bidirectional, lengths, backend):
    if backend == "torch" and name not in ("lstm", "lstm-gates"):
        pytest.skip("the same kernel as the python backend")
    _compare(name, opts, F64, bidirectional, lengths, 0.0, 1e-10)


@pytest.mark.parametrize("name,opts", CASES, ids=IDS)
@pytest.mark.parametrize("lengths", [[7, 7, 7], [7, 3, 1, 5]], ids=["full", "varlen"])
def test_fast_matches_reference_float32(name, opts, lengths, backend):
    if backend == "torch" and name not in ("lstm", "lstm-gates"):
        pytest.skip("the same kernel as the python backend")
    _compare(name, opts, torch.float32, True, lengths, 0.0, None)


LARGER = [("lstm", {}), ("lstm-srnn", {}), ("lstm-srnn-hidden", {}), ("lstm-gates", {}), ("gru", {}),
          ("gru", {"reset_after": True})]
LARGER_IDS = ["lstm", "lstm-srnn", "lstm-srnn-hidden", "lstm-gates", "gru", "gru-reset_after"]


def _compare_larger(name, opts, fast_threads=None):
    """Sizes where the native kernel splits rows across threads and packs its weights;
    float32 against the float64 reference (fast_path_harness)."""
    torch.manual_seed(0)
    enc = build_encoder(name, 48, 160, num_layers=2, bidirectional=True, **opts).float()
    x = torch.randn(24, 9, 48)
    lengths = torch.tensor([9] * 12 + [5] * 12)
    zeros = tuple(torch.zeros(4, 24, s) for s in enc.layers[0][0].state_sizes)
    assert_fast_matches_reference(enc, x, lengths, zeros, None, none_is_zero=True,
                                  fast_threads=fast_threads)


@pytest.mark.parametrize("name,opts", LARGER, ids=LARGER_IDS)
def test_fast_matches_reference_float32_larger(name, opts, backend):
    if backend == "torch" and name not in ("lstm", "lstm-gates"):
        pytest.skip("the same kernel as the python backend")
    _compare_larger(name, opts)


@pytest.mark.parametrize("name,opts", [("lstm", {}), ("lstm-srnn-hidden", {}), ("gru", {}),
                                       ("gru", {"reset_after": True})],
                         ids=["lstm", "lstm-srnn-hidden", "gru", "gru-reset_after"])
def test_native_two_threads(name, opts, monkeypatch):
    """The native kernel with 2 threads and every step's rows split between them
    (``PAR_MIN = 1``): the row split must not change the numbers beyond float32 rounding."""
    _native_or_skip()
    monkeypatch.setenv("LSTMABLATE_TORCH_ON_CPU", "0")
    monkeypatch.setattr(native, "PAR_MIN", 1)
    _compare_larger(name, opts, fast_threads=2)


@pytest.mark.parametrize("name,opts", [c for c in CASES if c[0] != "lstm-srnn-hidden-out"
                                       and c[0] != "lstm-srnn-hidden"],
                         ids=[i for c, i in zip(CASES, IDS) if not c[0].startswith("lstm-srnn-hidden")])
def test_fast_matches_reference_recurrent_dropout(name, opts, backend):
    if backend == "torch":
        pytest.skip("recurrent dropout never goes to PyTorch's kernels")
    _compare(name, opts, F64, True, [7, 3, 0, 5], 0.3, 1e-10)


def test_every_lstm_family_and_gru_cell_has_a_fast_path():
    for name in available_cells():
        spec = get_cell(name)
        if spec.family in ("lstm", "gru"):
            assert spec.fast_path, name


# ---------------------------------------------------------------------------------
# selection and fallbacks
# ---------------------------------------------------------------------------------

def _cell(name, **opts):
    return get_cell(name).build(3, 4, **opts)


def test_plan_cpu():
    # with the native kernel (the default where it builds), every cell runs it on CPU
    assert plan(_cell("lstm"), native=True) == "recurrent"
    assert plan(_cell("lstm-gates"), native=True) == "recurrent"
    # without it, lstm and lstm-gates go to PyTorch's kernels when the call allows
    assert plan(_cell("lstm"), native=False) == "torch-lstm"
    assert plan(_cell("lstm"), native=False, mask="prefix") == "torch-lstm"  # packed sequence
    assert plan(_cell("lstm"), native=False, mask="prefix0") == "recurrent"  # cannot pack a 0
    assert plan(_cell("lstm"), native=False, h_mask=True) == "recurrent"
    assert plan(_cell("lstm", proj_size=2), native=False) == "recurrent"  # oneDNN: no projection
    assert plan(_cell("lstm-gates"), native=False) == "torch-rnn"
    assert plan(_cell("lstm-gates"), native=False, h_mask=True) == "recurrent"
    for name in ("lstm-srnn", "lstm-srnn-out", "lstm-noforget"):
        assert plan(_cell(name)) == "recurrent"
    for name in ("lstm-srnn-hidden", "lstm-srnn-hidden-out"):
        assert plan(_cell(name)) == "scan"
        assert plan(_cell(name), h_mask=True) == "scan"  # nothing reads h: no mask to apply
    for name in ("lstm", "lstm-srnn", "lstm-srnn-hidden"):
        assert plan(_cell(name), mask="other") == "reference"  # holes in the mask
        assert plan(_cell(name), autocast=True) == "reference"
        assert plan(_cell(name), dtype=torch.bfloat16) == "reference"
        assert plan(_cell(name), reference=True) == "reference"


def test_plan_cuda():
    """On CUDA, lstm (with or without a projection) and the S-RNN go to cuDNN, whatever
    the native kernel (a CPU kernel) would say; the other cells to the Triton kernels where
    Triton imports, else to the PyTorch loops."""
    for has_native in (True, False, None):
        assert plan(_cell("lstm"), device_type="cuda", native=has_native) == "torch-lstm"
    for triton in (True, False):
        cuda = dict(device_type="cuda", triton=triton)
        assert plan(_cell("lstm"), **cuda) == "torch-lstm"
        assert plan(_cell("lstm", proj_size=2), **cuda) == "torch-lstm"
        assert plan(_cell("lstm-gates"), **cuda) == "torch-rnn"
        ours = "triton-" if triton else ""
        assert plan(_cell("lstm-srnn"), dtype=torch.float16, **cuda) == ours + "recurrent"
        assert plan(_cell("lstm"), h_mask=True, **cuda) == ours + "recurrent"
        assert plan(_cell("lstm-srnn-hidden"), **cuda) == ours + "scan"
        assert gru_plan(_cell("gru", reset_after=True), **cuda) == "torch-gru"
        assert gru_plan(_cell("gru", reset_after=True), h_mask=True, **cuda) == ours + "recurrent"
        assert gru_plan(_cell("gru"), **cuda) == ours + "recurrent"
    # float64 on CUDA: the PyTorch loops (the Triton kernels compute in float32 there)
    assert plan(_cell("lstm-srnn"), device_type="cuda", dtype=F64, triton=True) == "recurrent"


def test_reference_switches(monkeypatch):
    cell = _cell("lstm-srnn")
    x = torch.randn(4, 2, 3)
    assert type(cell(x)[0].grad_fn).__name__ == "RecurrentLSTMBackward"
    with reference_mode():
        assert plan(cell) == "reference"
        assert type(cell(x)[0].grad_fn).__name__ == "StackBackward0"
        with reference_mode(False):
            assert plan(cell) == "recurrent"
    monkeypatch.setenv("LSTMABLATE_REFERENCE", "1")
    assert plan(cell) == "reference"
    assert type(cell(x)[0].grad_fn).__name__ == "StackBackward0"
    assert get_cell("lstm-srnn").fast_path  # availability ignores the switch
    set_reference_mode(False)
    try:
        assert plan(cell) == "recurrent"
    finally:
        set_reference_mode(None)


def test_mask_kinds():
    m = torch.tensor([[1.0, 1, 1], [1, 1, 0], [1, 0, 0]])
    kind, lengths = mask_kind(m)
    assert kind == "prefix" and lengths.tolist() == [3, 2, 1]
    assert mask_kind(torch.ones(3, 2))[0] == "none"
    assert mask_kind(torch.tensor([[1.0, 0], [1, 0]]))[0] == "prefix0"
    assert mask_kind(torch.tensor([[1.0, 0], [0, 1]]))[0] == "other"
    assert mask_kind(torch.tensor([[0.5, 1], [0.5, 1]]))[0] == "other"
    kind, lengths = mask_kind(torch.tensor([[True, True], [True, False]]))  # bool masks too
    assert kind == "prefix" and lengths.tolist() == [2, 1]


@pytest.mark.parametrize("name", ["lstm", "lstm-srnn", "lstm-srnn-hidden", "gru"])
def test_mask_with_holes_falls_back_to_the_reference(name):
    cell = get_cell(name).build(3, 4).double()
    assert_mask_with_holes_runs_the_reference(cell, torch.randn(4, 2, 3, dtype=F64))


@pytest.mark.parametrize("name", ["lstm", "lstm-srnn", "lstm-srnn-hidden", "lstm-gates", "gru"])
def test_no_grad_and_empty_sequences(name):
    cell = get_cell(name).build(3, 4)
    x = torch.randn(5, 2, 3)
    with torch.no_grad():
        out, st = cell(x)
    with reference_mode(), torch.no_grad():
        out_r, st_r = cell(x)
    torch.testing.assert_close(out, out_r, atol=1e-5, rtol=1e-5)
    out0, st0 = cell(x[:0])
    assert out0.shape == (0, 2, 4) and all(torch.all(s == 0) for s in st0)


@pytest.mark.parametrize("opts,relaid", [({}, False), ({"content_bias": False}, True)],
                         ids=["cudnn-layout", "relaid"])
def test_gradients_reach_our_parameters_through_torch_lstm(monkeypatch, opts, relaid):
    """The delegated lstm: in cuDNN's layout the kernel reads our parameters themselves (no
    intermediate); re-laid out (no content bias), PyTorch's layout is an intermediate; our
    parameters get the grads either way."""
    monkeypatch.setenv("LSTMABLATE_TORCH_ON_CPU", "1")
    enc = build_encoder("lstm", 3, 4, num_layers=1, **opts)
    out, _ = enc(torch.randn(2, 5, 3))
    names, todo = set(), [out.grad_fn]
    while todo:
        fn = todo.pop()
        if fn is not None and type(fn).__name__ not in names:
            names.add(type(fn).__name__)
            todo.extend(f for f, _ in fn.next_functions)
    assert ("ToFusedBackward" in names) == relaid  # our parameters -> PyTorch's layout
    out.sum().backward()
    for n, p in enc.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, n


@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
def test_gru_cudnn_mapping_on_cpu(monkeypatch, bidirectional):
    """The CUDA path of gru (reset_after -> torch._VF.gru, i.e. cuDNN there) run on the CPU:
    the update gate's sign flip and the bias split must give the reference's numbers."""
    monkeypatch.setenv("LSTMABLATE_TORCH_ON_CPU", "1")
    assert gru_plan(_cell("gru", reset_after=True), batch=4) == "torch-gru"
    _compare("gru", {"reset_after": True}, F64, bidirectional, [7, 3, 2, 5], 0.0, 1e-10)


def test_native_fallback_warns_once(monkeypatch):
    """No compiler (or no BLAS symbols): one warning per kernel family, then the PyTorch
    loops, same numbers; lstm goes to PyTorch's own LSTM."""
    monkeypatch.setattr(native, "_libraries", {})

    def no_cc(family):
        raise native_build.BuildError("no cc")
    monkeypatch.setattr(native_build, "build_library", no_cc)
    with pytest.warns(RuntimeWarning, match="native lstm_family kernel is not available .no cc"):
        assert native.library("lstm_family") is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert native.library("lstm_family") is None  # no second warning
    cell = get_cell("lstm-srnn").build(3, 4).double()
    assert plan(cell) == "recurrent"
    x = torch.randn(5, 2, 3, dtype=F64)
    out, _ = cell(x)
    with reference_mode():
        ref, _ = cell(x)
    torch.testing.assert_close(out, ref)
    assert plan(_cell("lstm")) == "torch-lstm"  # PyTorch's own LSTM without the native kernel


# ---------------------------------------------------------------------------------
# the benchmark library (what `lstmablate bench` calls), at toy sizes
# ---------------------------------------------------------------------------------

def test_bench_library_rows_table_json():
    import json

    from rich.table import Table

    from lstmablate import bench

    rows = bench.bench_cells(cells=["lstm", "lstm-srnn-hidden", "gru", "mrnn", "dyck-rnn"],
                             shapes=["4x5x8x1", "3x4x6x2xbi"], threads=1, repeats=1, warmup=0)
    cells = {(r["shape"], r["cell"]) for r in rows}
    assert ("4x5x8x1", "nn.LSTM") in cells and ("3x4x6x2xbi", "gru") in cells
    assert not any(r["cell"] == "dyck-rnn" for r in rows)  # cannot run at these shapes
    for r in rows:
        assert r["kind"] == "cell" and r["tokens_per_s"] > 0 and r["ms"] > 0
        assert r["memory_mb"] >= 0 and r["gflops"] > 0
    mrnn = next(r for r in rows if r["cell"] == "mrnn")
    loops = ("recurrent (native)" if native.library("second_order") is not None
             else "recurrent (pytorch)")
    assert mrnn["speedup_vs_reference"] is not None and mrnn["kernel"] == loops
    lstm = next(r for r in rows if r["cell"] == "lstm")
    assert lstm["target"] is None  # targets apply to the PTB shapes only
    models = bench.bench_models(cells=["lstm-srnn"], threads=1, repeats=1, warmup=0, vocab=50,
                                hidden=8, batch=2, steps=3)
    assert [m["cell"] for m in models] == ["nn.LSTM", "lstm-srnn"]
    assert isinstance(bench.render(rows), Table) and isinstance(bench.render(models), Table)
    assert isinstance(bench.render(rows + models), Table)
    doc = json.loads(bench.to_json(rows + models, environment=bench.environment(1)))
    assert len(doc["rows"]) == len(rows) + 2
    assert "| ptb-small-model | lstm-srnn |" in bench.to_markdown(models)
    medium = bench.bench_models(cells=["lstm-srnn"], threads=1, repeats=1, warmup=0, vocab=50,
                                size="medium", hidden=8, batch=2)
    assert {(m["shape"], m["steps"]) for m in medium} == {("ptb-medium-model", 35)}
    assert isinstance(bench.render(models + medium), Table)  # one table per model size
    with pytest.raises(Exception, match="--model-size 'huge': expected one of small"):
        bench.bench_models(size="huge")
    assert bench.parse_shape("ptb-650").hidden == 650
    with pytest.raises(Exception, match="--shape 'big': use one of ptb-200"):
        bench.parse_shape("big")


def test_bench_targets():
    from lstmablate.bench import cells as bench_cells

    row = dict(ratio_lstm=1.1, ratio_rnn=0.5, speedup_vs_reference=None)
    t = bench_cells._target("lstm-srnn", bench_cells.SHAPES["ptb-650"], row)
    assert t["target"] == 1.05 and t["target_met"] is True
    t = bench_cells._target("lstm-gates", bench_cells.SHAPES["ptb-200"], row)
    assert t["target_baseline"] == "nn.RNN" and t["target_met"] is False
    t = bench_cells._target("gru", bench_cells.SHAPES["ptb-200"], dict(row, speedup_vs_reference=2.5))
    assert t["target"] == 2.0 and t["target_met"] is True
    assert bench_cells._target("lstm", bench_cells.SHAPES["parser-400"], row)["target"] is None
