"""The fast paths of the second-order cells (``lstmablate.cells.kernels``: ``factored``,
``multi_matrix``, ``dyck``) against the reference step loop.

For mrnn, mlstm, mmrnn, mmlstm (2 layers, uni- and bidirectional) and dyck-rnn (one
layer, unidirectional: all it accepts): outputs, final states (keys included) and every
gradient (inputs, initial states, all parameters) agree with the plain reference loop
(``lstmablate.cells.reference_mode()``) with padded batches (including a length-0 row) and full
batches, with and without recurrent dropout: to 1e-10 in float64; in float32 the fast
path and the float32 reference loop against a float64 reference, to a tolerance scaled to
each tensor's magnitude and to the float32 loop's own error (``fast_path_harness``).
mrnn, mlstm, mmrnn and mmlstm have two implementations of their loops on CPU, the native
(C) loops and the PyTorch loops (``LSTMABLATE_NATIVE=0``): both are compared (``loops``).
Plus which path each call selects, and the fallbacks.
"""

from __future__ import annotations

import pytest
import torch

from lstmablate.cells import available_cells, build_encoder, get_cell, reference_mode
from lstmablate.cells.kernels.common import native
from lstmablate.cells.kernels.second_order import factored, multi_matrix, step_products
from lstmablate.cells.kernels.second_order import shared as second_order
from lstmablate.cells.kernels.interface import kernel_name_of, plan_of
from lstmablate.cells.multiplicative import MRNNCell

from fast_path_harness import assert_fast_matches_reference, assert_mask_with_holes_runs_the_reference

F64 = torch.float64

# (cell, options): defaults plus the options that change the kernel (factor size,
# biases, the number of choice matrices, unequal K per block: eq 14 as printed), as the
# families declare them
CASES = list(factored.KERNELS.cases) + list(multi_matrix.KERNELS.cases)
IDS = [n + "".join(f"-{k}={v}" for k, v in o.items()) for n, o in CASES]
# dyck-rnn: 1-d inputs with hidden m, or the 2-d variant with hidden 2m; one layer, one direction
DYCK = [(1, 4), (2, 6)]
# the cells with native (C) loops, and their cases
NATIVE = ("mrnn", "mlstm", "mmrnn", "mmlstm")
NATIVE_CASES = [(n, o) for n, o in CASES if n in NATIVE]
NATIVE_IDS = [i for (n, _), i in zip(CASES, IDS) if n in NATIVE]
# every case with its default kernels (the native loops where a cell has them), plus those
# cells once more with the PyTorch loops
LOOPS = [pytest.param(n, o, "native" if n in NATIVE else "default", id=i)
         for (n, o), i in zip(CASES, IDS)]
LOOPS += [pytest.param(n, o, "pytorch", id=i + "-pytorch") for (n, o), i in zip(NATIVE_CASES, NATIVE_IDS)]


def _use_loops(loops, monkeypatch):
    """Select a cell's loops ("native", "pytorch"; "default": a cell without native loops,
    or whatever the environment selects); returns the list that records, per call, whether the
    native loops ran."""
    if loops == "native" and native.library("second_order") is None:
        pytest.skip("the native kernel cannot be built here")
    if loops == "pytorch":
        monkeypatch.setenv("LSTMABLATE_NATIVE", "0")
    used = []
    orig = second_order.native_library

    def spy(x):
        lib = orig(x)
        used.append(lib is not None)
        return lib

    monkeypatch.setattr(second_order, "native_library", spy)
    return used


def _check_loops(loops, used):
    if loops == "native":
        assert used and all(used), "the native loops were not taken"
    else:
        assert not any(used), "the native loops were taken"


def _random_state(enc, B, gen, dtype):
    """Random h (and c) and random keys on the simplex (what the state of these cells holds)."""
    cell = enc.layers[0][0]
    n = enc.num_layers * enc.num_directions
    state = []
    for k, size in enumerate(cell.state_sizes):
        s = torch.randn(n, B, size, generator=gen, dtype=dtype)
        if cell.state_names[k].startswith("key"):
            s = torch.softmax(s, dim=-1)
        state.append(s)
    return tuple(state)


def _compare(name, opts, dtype, bidirectional, lengths, recurrent_dropout, tol, sizes=(5, 4),
             num_layers=2, T=7, fast_threads=None):
    torch.manual_seed(0)
    I, H = sizes
    enc = build_encoder(name, I, H, num_layers=num_layers, bidirectional=bidirectional,
                        recurrent_dropout=recurrent_dropout, **opts).to(dtype)
    enc.train()
    B = len(lengths)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(B, T, I, generator=gen, dtype=dtype) * 2
    state = _random_state(enc, B, gen, dtype)
    lt = torch.tensor(lengths)
    return assert_fast_matches_reference(enc, x, lt, state, tol, fast_threads=fast_threads)


@pytest.mark.parametrize("name,opts,loops", LOOPS)
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("lengths", [[7, 7, 7], [7, 3, 0, 5]], ids=["full", "varlen"])
def test_fast_matches_reference_float64(name, opts, loops, bidirectional, lengths, monkeypatch):
    used = _use_loops(loops, monkeypatch)
    _compare(name, opts, F64, bidirectional, lengths, 0.0, 1e-10)
    _check_loops(loops, used)


@pytest.fixture(params=["mm", "packed"])
def gemm(request, monkeypatch):
    """mm: the per-step products call ``torch.mm``; packed: every per-step weight is packed
    for MKL's packed GEMM (float32 CPU; by default only the large ones are).  These are the
    PyTorch loops' products, so the cells with native loops run their PyTorch loops here
    (``LSTMABLATE_NATIVE=0``; the native loops: ``test_native_*``)."""
    monkeypatch.setenv("LSTMABLATE_NATIVE", "0")
    if request.param == "packed":
        if not step_products.packing_available():
            pytest.skip("MKL's packed GEMM is not available in this PyTorch build")
        monkeypatch.setattr(step_products, "PACK_MIN", 0)
        monkeypatch.setattr(step_products, "PACK_MIN_STEPS", 0)
    else:
        monkeypatch.setenv("LSTMABLATE_PACKED_GEMM", "0")
    return request.param


@pytest.mark.parametrize("name,opts", CASES, ids=IDS)
@pytest.mark.parametrize("lengths", [[7, 7, 7], [7, 3, 0, 5]], ids=["full", "varlen"])
def test_fast_matches_reference_float32(name, opts, lengths, gemm):
    _compare(name, opts, torch.float32, True, lengths, 0.0, None)


@pytest.mark.parametrize("name,opts,loops", LOOPS)
def test_fast_matches_reference_float32_recurrent_dropout(name, opts, loops, monkeypatch):
    """With every per-step weight of the PyTorch loops packed where packing is available
    (the mm path with recurrent dropout is covered in float64)."""
    used = _use_loops(loops, monkeypatch)
    monkeypatch.setattr(step_products, "PACK_MIN", 0)
    monkeypatch.setattr(step_products, "PACK_MIN_STEPS", 0)
    _compare(name, opts, torch.float32, True, [7, 3, 0, 5], 0.3, None)
    _check_loops(loops, used)


@pytest.mark.parametrize("name,opts,loops", LOOPS)
def test_fast_matches_reference_recurrent_dropout(name, opts, loops, monkeypatch):
    used = _use_loops(loops, monkeypatch)
    _compare(name, opts, F64, True, [7, 3, 0, 5], 0.3, 1e-10)
    _check_loops(loops, used)


@pytest.fixture(params=["mkl-packed", "own-packed", "blas"])
def native_gemm(request, monkeypatch):
    """The native loops' float32 per-step products: MKL's packed GEMM (where PyTorch's BLAS
    is MKL), our own packed GEMM, or plain sgemm_ (set in the loaded kernel for the test,
    then restored)."""
    lib = native.library("second_order")
    if lib is None:
        pytest.skip("the native kernel cannot be built here")
    if request.param not in lib.modes:
        pytest.skip(f"{request.param} is not available here")
    monkeypatch.setenv("LSTMABLATE_STEP_GEMM", request.param)
    lib._step_gemm_threads = None  # the next call applies the setting
    yield request.param
    lib._step_gemm_threads = None  # (and after the test, the usual choice)


@pytest.mark.parametrize("name,opts", NATIVE_CASES, ids=NATIVE_IDS)
@pytest.mark.parametrize("lengths", [[7, 7, 7], [7, 3, 0, 5]], ids=["full", "varlen"])
def test_native_matches_reference_float32(name, opts, lengths, native_gemm, monkeypatch):
    used = _use_loops("native", monkeypatch)
    _compare(name, opts, torch.float32, True, lengths, 0.0, None)
    _check_loops("native", used)


@pytest.mark.parametrize("name,opts", [("mrnn", {"factor_size": 33}), ("mlstm", {"factor_size": 33}),
                                       ("mmrnn", {"bias": True}),
                                       ("mmlstm", {"forget_matrices": 2, "bias": True})])
def test_native_matches_reference_float32_larger(name, opts, native_gemm, monkeypatch):
    """Longer sequences, wider layers, recurrent dropout, a factor size other than H,
    unequal K per block, and every step's element-wise work split across threads
    (``PAR_MIN = 1``; 2 threads: ``test_native_two_threads``)."""
    used = _use_loops("native", monkeypatch)
    monkeypatch.setattr(native, "PAR_MIN", 1)
    _compare(name, opts, torch.float32, True, [20, 13, 20, 1, 17, 20], 0.2, None,
             sizes=(24, 40), T=20)
    _check_loops("native", used)


@pytest.mark.parametrize("name,opts", [("mlstm", {"factor_size": 33}), ("mmrnn", {"bias": True}),
                                       ("mmlstm", {"forget_matrices": 2, "bias": True})])
def test_native_two_threads(name, opts, monkeypatch):
    """The native loops with 2 threads and every step's rows split between them
    (``PAR_MIN = 1``; shorter sequences than above: a busy machine makes every 2-thread
    barrier slow)."""
    used = _use_loops("native", monkeypatch)
    monkeypatch.setattr(native, "PAR_MIN", 1)
    _compare(name, opts, torch.float32, True, [8, 5, 8, 1, 7, 8], 0.2, None, sizes=(24, 40), T=8,
             fast_threads=2)
    _check_loops("native", used)


@pytest.mark.parametrize("name", ["mrnn", "mlstm", "mmrnn", "mmlstm"])
def test_fast_matches_reference_float32_larger(name, gemm):
    """Closer to the benchmark's sizes (longer sequences, wider layers) in float32."""
    _compare(name, {}, torch.float32, True, [20, 13, 20, 1, 17, 20], 0.0, None, sizes=(24, 40),
             T=20)


@pytest.mark.parametrize("sizes", DYCK, ids=["1d", "2d"])
@pytest.mark.parametrize("lengths", [[7, 7, 7], [7, 3, 0, 5]], ids=["full", "varlen"])
@pytest.mark.parametrize("dtype,tol", [(F64, 1e-10), (torch.float32, None)], ids=["f64", "f32"])
@pytest.mark.parametrize("recurrent_dropout", [0.0, 0.3], ids=["nodrop", "drop"])
def test_dyck_fast_matches_reference(sizes, lengths, dtype, tol, recurrent_dropout):
    _compare("dyck-rnn", {}, dtype, False, lengths, recurrent_dropout, tol, sizes=sizes,
             num_layers=1)


def test_dyck_exact_stack_still_exact():
    """The static embedding with a saturated gate implements a stack (dyck.py): the fast
    path must keep the top of the stack equal to the innermost open bracket."""
    from lstmablate.cells.dyck import static_bracket_embedding

    cell = get_cell("dyck-rnn").build(1, 4).double()
    with torch.no_grad():
        cell.weight_proj.fill_(50.0)
        cell.weight_hx.zero_()
        cell.weight_hx[0] = 1.0
    emb = static_bracket_embedding(2).double()
    seq = [0, 1, 3, 0, 2, 2]  # ( [ ] ( ) )
    x = emb[seq].unsqueeze(1)  # (T, 1, 1)
    out, _ = cell(x)
    with reference_mode():
        ref, _ = cell(x)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=0)
    assert round(out[2, 0, 0].item()) == 1 and round(out[3, 0, 0].item()) == 1


def test_every_second_order_cell_has_a_fast_path():
    for name in ("mrnn", "mlstm", "mmrnn", "mmlstm", "dyck-rnn"):
        assert name in available_cells()
        assert get_cell(name).fast_path, name


# ---------------------------------------------------------------------------------
# selection and fallbacks
# ---------------------------------------------------------------------------------

def _cell(name, **opts):
    spec = get_cell(name)
    sizes = spec.cls.example_sizes if name == "dyck-rnn" else (3, 4)
    return spec.build(*sizes, **opts)


@pytest.mark.parametrize("name", ["mrnn", "mlstm", "mmrnn", "mmlstm", "dyck-rnn"])
def test_plan(name):
    cell = _cell(name)
    assert plan_of(cell) == "recurrent"
    assert plan_of(cell, mask="prefix") == "recurrent"
    assert plan_of(cell, mask="prefix0") == "recurrent"
    assert plan_of(cell, h_mask=True) == "recurrent"
    assert plan_of(cell, dtype=torch.float64) == "recurrent"
    assert plan_of(cell, device_type="cuda", triton=False) == "recurrent"
    assert plan_of(cell, device_type="cuda", dtype=torch.float16, triton=False) == "recurrent"
    ours = "recurrent" if name == "dyck-rnn" else "triton-recurrent"  # no Triton loops for dyck
    assert plan_of(cell, device_type="cuda", triton=True) == ours
    assert plan_of(cell, mask="other") == "reference"  # holes in the mask
    assert plan_of(cell, autocast=True) == "reference"
    assert plan_of(cell, dtype=torch.bfloat16) == "reference"
    assert plan_of(cell, dtype=torch.int64) == "reference"
    assert plan_of(cell, reference=True) == "reference"
    with reference_mode():
        assert plan_of(cell) == "reference"
        assert cell.fast_path_available()  # availability ignores the switch


def test_kernel_name_and_native_selection(monkeypatch):
    """mrnn, mlstm, mmrnn, mmlstm: the native loops on CPU in float32 / float64 where the
    kernel builds; the PyTorch loops on other devices, with LSTMABLATE_NATIVE=0, or without
    the kernel."""
    has_native = native.library("second_order") is not None
    loops = "recurrent (native)" if has_native else "recurrent (pytorch)"
    for name in NATIVE:
        cell = _cell(name)
        assert kernel_name_of(cell) == loops
        assert kernel_name_of(cell, dtype=F64, mask="prefix0", h_mask=True) == loops
        assert kernel_name_of(cell, device_type="cuda", triton=False) == "recurrent (pytorch)"
        assert kernel_name_of(cell, device_type="cuda", dtype=torch.float16,
                              triton=False) == "recurrent (pytorch)"
        assert kernel_name_of(cell, device_type="cuda", triton=True).startswith("triton-recurrent")
        assert kernel_name_of(cell, mask="other") == "reference"
        assert kernel_name_of(cell, reference=True) == "reference"
    assert kernel_name_of(_cell("dyck-rnn")) == "recurrent (pytorch)"  # no native loops
    with monkeypatch.context() as m:
        m.setenv("LSTMABLATE_NATIVE", "0")
        assert kernel_name_of(_cell("mrnn")) == "recurrent (pytorch)"
    with monkeypatch.context() as m:
        m.setattr(native, "_libraries", {"second_order": None})  # e.g. no compiler
        assert kernel_name_of(_cell("mmlstm")) == "recurrent (pytorch)"


@pytest.mark.parametrize("name", NATIVE)
def test_native_fallbacks_give_the_same_numbers(name, monkeypatch):
    """LSTMABLATE_NATIVE=0 and a missing kernel take the PyTorch loops, with the numbers of
    the native loops (float64, padding, recurrent dropout, bidirectional)."""
    if native.library("second_order") is None:
        pytest.skip("the native kernel cannot be built here")
    runs = {}
    for how in ("native", "env", "no-kernel"):
        with monkeypatch.context() as m:
            if how == "env":
                m.setenv("LSTMABLATE_NATIVE", "0")
            elif how == "no-kernel":
                m.setattr(native, "_libraries", {"second_order": None})
            used = _use_loops("default", m)
            runs[how] = _compare(name, {}, F64, True, [7, 3, 0, 5], 0.3, 1e-10)
            _check_loops("native" if how == "native" else "pytorch", used)
    for how in ("env", "no-kernel"):
        for k, v in runs["native"].items():
            if v is not None:
                torch.testing.assert_close(runs[how][k], v, atol=1e-12, rtol=1e-12)


def test_plan_other_cells_and_subclasses():
    assert _cell("mrnn").fast_kernels.module.endswith(".factored")  # each cell declares its kernel
    assert _cell("mmlstm").fast_kernels.module.endswith(".multi_matrix")

    class Changed(MRNNCell):
        def step(self, xp, state, h_mask):  # different arithmetic: the kernel would be wrong
            return super().step(xp, state, h_mask)

    assert plan_of(Changed(3, 4)) == "reference"
    assert not Changed(3, 4).fast_path_available()

    class Renamed(MRNNCell):  # same arithmetic
        pass

    assert plan_of(Renamed(3, 4)) == "recurrent"
    dyck = _cell("dyck-rnn")
    dyck.shift_push.requires_grad_(True)  # the shifts are fixed buffers
    assert plan_of(dyck) == "reference"


@pytest.mark.parametrize("name", ["mrnn", "mlstm", "mmrnn", "mmlstm", "dyck-rnn"])
def test_dispatch_and_reference_switch(name, monkeypatch):
    cell = _cell(name).double()
    x = torch.randn(4, 2, cell.input_size, dtype=F64)
    assert type(cell(x)[0].grad_fn).__name__.endswith("RecurrenceBackward")
    with reference_mode():
        assert type(cell(x)[0].grad_fn).__name__ == "StackBackward0"
    monkeypatch.setenv("LSTMABLATE_REFERENCE", "1")
    assert type(cell(x)[0].grad_fn).__name__ == "StackBackward0"


@pytest.mark.parametrize("name", ["mrnn", "mlstm", "mmrnn", "mmlstm", "dyck-rnn"])
def test_mask_with_holes_falls_back_to_the_reference(name):
    cell = _cell(name).double()
    assert_mask_with_holes_runs_the_reference(cell, torch.randn(4, 2, cell.input_size, dtype=F64),
                                              compare_states=True)


@pytest.mark.parametrize("name", ["mrnn", "mlstm", "mmrnn", "mmlstm", "dyck-rnn"])
def test_mismatched_dtype_falls_back(name):
    """A float64 input to a float32 cell is not the kernels' business: the reference loop
    runs (and behaves as it always did)."""
    cell = _cell(name)
    x = torch.randn(3, 2, cell.input_size, dtype=F64)
    assert cell._kernels().forward(cell, x, None, None, None) is None
    with reference_mode(), pytest.raises(RuntimeError) as ref_err:
        cell(x)
    with pytest.raises(RuntimeError) as err:
        cell(x)
    assert str(err.value) == str(ref_err.value)


@pytest.mark.parametrize("name", ["mrnn", "mlstm", "mmrnn", "mmlstm", "dyck-rnn"])
def test_no_grad_initial_state_and_empty_sequences(name):
    cell = _cell(name)
    x = torch.randn(5, 2, cell.input_size)
    with torch.no_grad():
        out, st = cell(x)
    with reference_mode(), torch.no_grad():
        out_r, st_r = cell(x)
    torch.testing.assert_close(out, out_r, atol=1e-5, rtol=1e-5)
    assert len(st) == len(st_r) == len(cell.state_names)
    for a, b in zip(st, st_r):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    out0, st0 = cell(x[:0])
    assert out0.shape == (0, 2, cell.output_size)
    for a, b in zip(st0, cell.initial_state(2, x)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("name", ["mlstm", "mmlstm", "dyck-rnn"])
def test_in_place_changes_to_outputs_are_safe(name):
    """The outputs and final states are not views of buffers the backward pass reads."""
    cell = _cell(name).double()
    x = torch.randn(5, 3, cell.input_size, dtype=F64)
    grads = []
    for ref in (False, True):
        xi = x.clone().requires_grad_(True)
        with reference_mode(ref):
            out, st = cell(xi)
        out.mul_(2)
        st[0].add_(1)
        loss = (out * out).sum() + sum((s * s).sum() for s in st)
        grads.append(torch.autograd.grad(loss, xi)[0])
    torch.testing.assert_close(grads[0], grads[1], atol=1e-10, rtol=1e-10)
