"""The fast paths under autocast (``train.precision: bf16 | fp16``; ``interface.py``, "Under
autocast"), on CPU: the Triton kernels under Triton's interpreter in bfloat16 and float16
against a float64 reference loop, the memory cell carried in float32, and which path a
call under autocast takes (on CUDA too, as a plan).

Tolerances come from the dtype's unit roundoff u (2**-8 for bfloat16, 2**-11 for float16)
and the sequence length T.  Every value the kernels keep between operations is rounded to
the low precision (inputs, weights, products, activations, h_t), each rounding at most u
relative to the value; along the recurrence an error enters at every step and is carried
on (an LSTM's state is a contraction of the previous one, so it is carried, not
multiplied), and the products before and after the loop (the input products, the weight
gradients, one product over all T x B steps) add a fixed number of roundings of their own.
So a tensor of scale s (its largest element in the float64 reference) may differ by

    u * (2 T + 16) * s

— two roundings per step, sixteen outside the loop (``tolerance.low_precision_tolerance``).
Measured, the kernels stay within a sixth of that at T = 8 and T = 32; a real mistake (a wrong
block, a missing term, a state rounded every step:
``test_the_memory_cell_is_carried_in_float32``) is of the order of the values themselves.
"""

from __future__ import annotations

import copy

import pytest
import torch

from lstmablate.cells import build_encoder, get_cell, reference_mode
from lstmablate.cells.kernels.common import triton_support
from lstmablate.cells.kernels.interface import kernel_name_of, plan_of

from tolerance import ROUNDOFF, low_precision_tolerance

pytestmark = pytest.mark.skipif(not triton_support.interpreting(),
                                reason="needs Triton with its interpreter on (TRITON_INTERPRET=1)")
F64 = torch.float64


@pytest.fixture(autouse=True)
def triton_everywhere(monkeypatch):
    monkeypatch.setenv("LSTMABLATE_TRITON", "1")


def _run(enc, x, lengths, state, dtype):
    """Forward (under autocast in ``dtype``, or plainly for None) and backward of a fixed
    random loss, computed in float64; every tensor to compare."""
    enc.zero_grad(set_to_none=True)
    xi = x.clone().requires_grad_(True)
    st = tuple(s.clone().requires_grad_(True) for s in state)
    amp = torch.autocast("cpu", dtype=dtype, enabled=dtype is not None)
    with reference_mode(dtype is None), amp:
        out, fin = enc(xi, lengths, st)
    gen = torch.Generator().manual_seed(9)
    loss = (out.double() * torch.randn(out.shape, generator=gen, dtype=F64)).sum()
    for f in fin:
        loss = loss + (f.double() * torch.randn(f.shape, generator=gen, dtype=F64)).sum()
    loss.backward()
    res = {"out": out, **{f"final{k}": f for k, f in enumerate(fin)}, "dx": xi.grad,
           **{f"dstate{k}": s.grad for k, s in enumerate(st)}}
    res.update({f"d{n}": p.grad for n, p in enc.named_parameters()})
    return res


def _compare(name, opts, dtype, T, B=4, I=6, H=16, layers=2):
    torch.manual_seed(0)
    enc = build_encoder(name, I, H, num_layers=layers, bidirectional=True, **opts).train()
    cell = enc.layers[0][0]
    assert kernel_name_of(cell, dtype=dtype, autocast=True, mask="prefix") \
        .startswith("triton-"), name
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(B, T, I, generator=gen)
    lengths = torch.tensor([T, T - 3, T // 2, 1])
    n = enc.num_layers * enc.num_directions
    state = tuple(torch.softmax(torch.randn(n, B, s, generator=gen), -1) if k.startswith("key")
                  else torch.randn(n, B, s, generator=gen) * 0.5
                  for k, s in zip(cell.state_names, cell.state_sizes))
    fast = assert_low_precision_close(enc, x, lengths, state, dtype, name)
    assert fast["out"].dtype == dtype


def assert_low_precision_close(enc, x, lengths, state, dtype, name):
    """``enc`` under autocast in ``dtype`` against its float64 reference loop: every tensor
    within the low-precision tolerance, the memory cell in float32, no padding leaked;
    returns the autocast run's tensors."""
    T = x.shape[1]
    fast = _run(enc, x, lengths, state, dtype)
    ref = _run(copy.deepcopy(enc).double(), x.double(), lengths, tuple(s.double() for s in state),
               None)
    if "c" in enc.layers[0][0].state_names:  # the memory cell comes back in float32
        assert fast["final1"].dtype == torch.float32
    for k, want in ref.items():
        got = fast[k]
        if want is None or not want.any():
            assert got is None or not got.any(), k
            continue
        scale = float(want.detach().abs().max())
        err = float((got.detach().double() - want.detach()).abs().max())
        allowed = low_precision_tolerance(dtype, T, scale)
        assert err <= allowed, (f"{name} {k}: {err:.3g} from the float64 reference; {dtype} at "
                                f"T={T}, scale {scale:.3g} allows {allowed:.3g}")
    for b, L in enumerate(lengths.tolist()):
        assert torch.all(fast["out"][b, L:] == 0), "padding leaked into the outputs"
    return fast


#: the layouts of the Triton kernels (gates and content, with and without a projection,
#: the scan, eq 1, the GRU, the factored product)
BF16 = [("lstm", {"proj_size": 5}), ("lstm-srnn-out", {}), ("lstm-srnn-hidden", {}),
        ("lstm-noforget", {}), ("lstm-gates", {}), ("gru", {}), ("mlstm", {})]


@pytest.mark.parametrize("name,opts", BF16,
                         ids=[n + "".join(f"-{k}={v}" for k, v in o.items()) for n, o in BF16])
def test_bfloat16_kernels_against_a_float64_reference(name, opts):
    _compare(name, opts, torch.bfloat16, T=8)


def test_bfloat16_multi_matrix_kernels():
    """mmLSTM (one program per batch row: the slowest to interpret): one layer, 4 steps."""
    _compare("mmlstm", {}, torch.bfloat16, T=4, I=3, H=3, layers=1)


def test_float16_kernels_against_a_float64_reference():
    _compare("lstm-srnn", {}, torch.float16, T=8)


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # tanh(c) of a large c: 1
def test_the_memory_cell_is_carried_in_float32():
    """c_t = c_{t-1} + i_t c~_t (no forget gate, nothing reads h: one scan launch) with
    increments near 0.95 for 256 steps: c grows past 128, where bfloat16's spacing is 1, so a
    cell rounded to bfloat16 at every step would drift by about a twentieth at every step
    there (each increment rounded to a whole number).  Carried in float32, only the
    increments' own rounding remains, a few roundings of each: at most 4 u sum_t |i_t c~_t|."""
    torch.manual_seed(0)
    cell = get_cell("lstm-srnn-hidden-out").build(4, 8, forget_gate=False, content_bias=True)
    with torch.no_grad():
        cell.weight_ih.mul_(0.1)
        cell.bias.copy_(torch.tensor([3.0] * 8 + [1.0] * 8))  # i near 1, c~ (linear) near 1
    ref = copy.deepcopy(cell).double()
    T, B = 256, 3
    x = torch.randn(T, B, 4)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        _, (h, c) = cell(x)
    with torch.no_grad(), reference_mode():
        _, (_, c64) = ref(x.double())
        trace = ref.trace_memory(x.double())
    increments = (trace["write"] * trace["content"]).abs().sum(0)  # sum_t |i_t c~_t|, (B, H)
    u = ROUNDOFF[torch.bfloat16]
    assert c.dtype == torch.float32 and float(c64.min()) > 128
    err = (c.double() - c64).abs()
    assert bool((err <= 4 * u * increments).all()), float((err / (u * increments)).max())
    rounded = torch.zeros(B, 8, dtype=torch.bfloat16)  # what a bfloat16 cell would carry
    for t in range(T):
        inc = trace["write"][t].to(torch.bfloat16).float() * trace["content"][t].to(torch.bfloat16).float()
        rounded = (rounded.float() + inc).to(torch.bfloat16)
    assert float((rounded.double() - c64).abs().max()) > 10 * float(err.max())


def test_which_path_runs_under_autocast(monkeypatch):
    """The Triton kernels and (on CUDA) cuDNN have a low precision; nothing else: the
    reference loop runs, under autocast.  On CPU without Triton that is every call."""
    lstm, srnn, dyck = (get_cell(n).build(2, 4) for n in ("lstm", "lstm-srnn", "dyck-rnn"))
    cpu = dict(autocast=True, dtype=torch.bfloat16)
    assert plan_of(srnn, **cpu) == "triton-recurrent"  # the interpreter (LSTMABLATE_TRITON=1)
    cuda = dict(cpu, device_type="cuda", triton=True)
    assert plan_of(srnn, **cuda) == plan_of(lstm, **cuda) == "triton-recurrent"
    assert plan_of(dyck, **cuda) == "reference"  # no low-precision kernel
    monkeypatch.setenv("LSTMABLATE_TRITON", "auto")
    assert plan_of(srnn, **cpu) == plan_of(lstm, **cpu) == "reference"
    assert plan_of(lstm, **cuda) == "torch-lstm"  # cuDNN's half-precision kernels
    assert plan_of(srnn, **cuda) == "triton-recurrent"
    assert plan_of(srnn, **dict(cuda, triton=False)) == "reference"  # the PyTorch loops: none
    assert plan_of(srnn, dtype=torch.bfloat16) == "reference"  # bfloat16 without autocast


def test_a_cell_without_a_low_precision_kernel_runs_the_reference_loop_under_autocast(
        monkeypatch):
    monkeypatch.setenv("LSTMABLATE_TRITON", "0")
    cell = get_cell("lstm-srnn").build(3, 4)
    x = torch.randn(5, 2, 3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = cell(x)
    with reference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        ref, _ = cell(x)
    assert torch.equal(out, ref)
