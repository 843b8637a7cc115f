"""The 2018 SRU with the authors' initialisation and highway rescaling (``init: authors``).

Against a plain re-statement of the rule of the authors' package (``sru`` 2.6.0,
``SRUCell.reset_parameters`` and its forward's ``scale_x``), always: the same seed draws the
same numbers, the scales and statistics are the stated ones, the rescaled highway by hand.
Against the package itself where it is installed (``pip install sru``, an optional test
dependency; its CPU extension is compiled on first import): the same seed gives the package's
parameters, and the same parameters give its outputs, final memory and gradients (float64).
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from lstmablate.cells import build_encoder, get_cell
from lstmablate.errors import ConfigError

F64 = torch.float64


def _package():
    """The authors' package, or a skip (not installed, or its extension does not build)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (its CUDA kernels are not built on a CPU)
            import sru
    except Exception as err:  # noqa: BLE001  (ImportError, or its extension's build failing)
        pytest.skip(f"the authors' sru package is not usable here ({type(err).__name__})")
    return sru


def ours_from_package(weight: torch.Tensor, hidden: int) -> torch.Tensor:
    """The package's weight (I, H·k), column j·k + m = matrix m of unit j, as our
    ``weight_ih`` (k·H, I) = [W; W_f; W_r (; W_s)]."""
    I = weight.shape[0]
    k = weight.shape[1] // hidden
    return weight.view(I, hidden, k).permute(2, 1, 0).reshape(k * hidden, I)


def restated(I: int, H: int, seed: int, highway_bias: float = 0.0, rescale: bool = True):
    """The rule as the package states it, drawn in its order: the weight (I, H·k) uniform
    (±sqrt(3/I)), the gates' columns times sqrt(.5), W_s times s under rescale (k = 4), then
    v uniform(±sqrt(3)) times sqrt(.5); b_f = 0, b_r = highway_bias; s = sqrt(1 + 2 e^b)."""
    k = 3 if I == H else 4
    gen = torch.manual_seed(seed)
    w = torch.empty(I, H * k).uniform_(-(3.0 / I) ** 0.5, (3.0 / I) ** 0.5, generator=gen)
    w = w.view(I, H, k)
    w[:, :, 1] *= 0.5 ** 0.5
    w[:, :, 2] *= 0.5 ** 0.5
    s = (1 + math.exp(highway_bias) * 2) ** 0.5
    if rescale and k == 4:
        w[:, :, 3] *= s
    v = torch.empty(2 * H).uniform_(-3.0 ** 0.5, 3.0 ** 0.5, generator=gen) * 0.5 ** 0.5
    bias = torch.cat([torch.zeros(H), torch.full((H,), highway_bias)])
    return ours_from_package(w.reshape(I, H * k), H), v, bias, s


@pytest.mark.parametrize("I,H", [(4, 4), (3, 5)])
@pytest.mark.parametrize("highway_bias", [0.0, -1.5])
def test_the_same_seed_draws_the_restated_rule(I, H, highway_bias):
    torch.manual_seed(7)
    cell = get_cell("sru").build(I, H, init="authors", highway_bias=highway_bias)
    w, v, bias, s = restated(I, H, 7, highway_bias)
    assert torch.equal(cell.weight_ih, w)
    assert torch.equal(cell.weight_c, v)
    assert torch.equal(cell.bias, bias)
    assert cell.skip_scale == (s if I == H else 1.0)  # at run time only without W_s


def test_scales_and_statistics():
    """I = H = 300: every block within its stated bound, with the variance of a uniform of it
    (Var U(±a) = a²/3: 1/I for W, 1/(2I) for the gates, 1/2 for v) to within the sampling
    error of ~90,000 (v: 600) draws (five standard errors of a variance estimate)."""
    I = H = 300
    torch.manual_seed(0)
    cell = get_cell("sru").build(I, H, init="authors")
    W, W_f, W_r = cell.weight_ih.detach().double().split(H)
    v = cell.weight_c.detach().double()
    for block, bound in ((W, (3 / I) ** 0.5), (W_f, (1.5 / I) ** 0.5), (W_r, (1.5 / I) ** 0.5),
                         (v, 1.5 ** 0.5)):
        var = bound ** 2 / 3
        n = block.numel()
        assert float(block.abs().max()) <= bound
        assert float(block.abs().max()) > 0.99 * bound  # the whole range is used
        # Var of the sample variance of a uniform: (9/5 - 1) var² / n
        assert abs(float(block.var()) - var) <= 5 * (0.8 / n) ** 0.5 * var, (bound, n)
        assert abs(float(block.mean())) <= 5 * (var / n) ** 0.5
    assert not cell.bias.any()


def test_task_reinitialisation_keeps_the_rule():
    """A task's uniform(±init_scale) hook (PTB, NMT: reset_parameters(0.1)) draws the authors'
    rule again: v reaches beyond 0.1, the gates' weights stay below sqrt(1.5 / I)."""
    torch.manual_seed(0)
    enc = build_encoder("sru", 20, 20, num_layers=2, init="authors")
    enc.reset_parameters(0.1)
    for cell in enc.cells():
        assert float(cell.weight_c.detach().abs().max()) > 0.5
        assert float(cell.weight_ih.detach()[20:].abs().max()) <= (1.5 / 20) ** 0.5
    plain = build_encoder("sru", 20, 20, num_layers=1)
    plain.reset_parameters(0.1)
    assert float(plain.cells()[0].weight_c.detach().abs().max()) <= 0.1


def test_the_rescaled_highway_by_hand():
    """H = I = 1, the reset gate closed halfway (b_r = 0, nothing else): c_1 = (1 - f) W x,
    h_1 = r c_1 + (1 - r) sqrt(3) x with f = r = σ(0) = 1/2, W = 2, x = 1."""
    cell = get_cell("sru").build(1, 1, init="authors").double()
    with torch.no_grad():
        cell.weight_ih.copy_(torch.tensor([[2.0], [0.0], [0.0]]))
        cell.weight_c.zero_()
    out, (_, c) = cell(torch.ones(1, 1, 1, dtype=F64))
    assert c.item() == pytest.approx(0.5 * 2.0, abs=1e-15)
    assert out.item() == pytest.approx(0.5 * 1.0 + 0.5 * math.sqrt(3.0), abs=1e-15)
    off = get_cell("sru").build(1, 1, init="authors", rescale=False).double()
    off.load_state_dict(cell.state_dict())
    assert off(torch.ones(1, 1, 1, dtype=F64))[0].item() == pytest.approx(1.0, abs=1e-15)


def test_options():
    with pytest.raises(ConfigError, match="add init: authors"):
        get_cell("sru").build(3, 4, rescale=True)
    with pytest.raises(ConfigError, match="add init: authors"):
        get_cell("sru").build(3, 4, highway_bias=-1.0)
    with pytest.raises(ConfigError, match="drop init_scale"):
        get_cell("sru").build(3, 4, init="authors", init_scale=0.1)
    with pytest.raises(ConfigError, match="takes one of uniform, authors"):
        get_cell("sru").check_options({"init": "xavier"})
    with pytest.raises(ConfigError, match="init"):  # the 2017 form has no such option
        get_cell("sru-2017").check_options({"init": "authors"})
    plain = get_cell("sru").build(4, 4)
    assert (plain.init, plain.rescale, plain.skip_scale) == ("uniform", False, 1.0)


# ---------------------------------------------------------------------------------
# against the authors' package, where it is installed
# ---------------------------------------------------------------------------------

@pytest.mark.parametrize("I,H", [(4, 4), (3, 5)])
def test_the_same_seed_gives_the_packages_parameters(I, H):
    sru = _package()
    torch.manual_seed(3)
    theirs = sru.SRUCell(I, H)  # rescale=True, highway_bias=0: the layer's defaults
    torch.manual_seed(3)
    ours = get_cell("sru").build(I, H, init="authors")
    assert torch.equal(ours.weight_ih, ours_from_package(theirs.weight.detach(), H))
    assert torch.equal(ours.weight_c, theirs.weight_c.detach())
    assert torch.equal(ours.bias, theirs.bias.detach())
    assert ours.skip_scale == pytest.approx(float(theirs.scale_x) if I == H else 1.0, rel=1e-7)


@pytest.mark.parametrize("I,H,rescale", [(4, 4, True), (4, 4, False), (3, 5, True)])
def test_the_same_parameters_give_the_packages_outputs(I, H, rescale):
    """float64, with an initial memory; the package's PyTorch loop (gradients on)."""
    sru = _package()
    torch.manual_seed(4)
    theirs = sru.SRUCell(I, H, rescale=rescale, highway_bias=-0.5).double()
    ours = get_cell("sru").build(I, H, init="authors", rescale=rescale,
                                 highway_bias=-0.5).double()
    with torch.no_grad():
        ours.weight_ih.copy_(ours_from_package(theirs.weight, H))
        ours.weight_c.copy_(theirs.weight_c)
        ours.bias.copy_(theirs.bias)
    if rescale and I == H:  # their s is a buffer made in float32: the same constant, as stored
        assert ours.skip_scale == pytest.approx(float(theirs.scale_x), rel=1e-7)
        ours.skip_scale = float(theirs.scale_x)
    x = torch.randn(6, 2, I, dtype=F64)
    c0 = torch.randn(2, H, dtype=F64)
    xs = [x.clone().requires_grad_(True) for _ in range(2)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Running SRU on CPU with grad_enabled=True"
        h_t, c_t = theirs(xs[0], c0)
    h_o, (_, c_o) = ours(xs[1], (torch.zeros(2, H, dtype=F64), c0))
    torch.testing.assert_close(h_o, h_t, atol=1e-13, rtol=0)
    torch.testing.assert_close(c_o, c_t, atol=1e-13, rtol=0)
    w = torch.randn(6, 2, H, dtype=F64)
    (h_t * w).sum().backward()
    (h_o * w).sum().backward()
    torch.testing.assert_close(xs[1].grad, xs[0].grad, atol=1e-12, rtol=0)
    torch.testing.assert_close(ours.weight_ih.grad, ours_from_package(theirs.weight.grad, H),
                               atol=1e-12, rtol=0)
    torch.testing.assert_close(ours.weight_c.grad, theirs.weight_c.grad, atol=1e-12, rtol=0)
