"""Every registered cell against its equations, and the options every cell honours.

* a hand-written single step per cell, computed literally from the printed
  equations (per-gate matrices, explicit per-example W^hh_t for the
  second-order cells), from a random non-zero previous state;
* ``torch.autograd.gradcheck`` in float64 through the whole encoder (2 layers,
  both directions where the cell allows, padded batch), w.r.t. inputs, initial
  state and every parameter;
* run-alone equivalence for padded batches (both directions, 2 layers);
* state continuation (running in two chunks = running at once);
* the weighted-sum identity (eq 8) for every memory cell;
* dropout, recurrent dropout, residual, proj_size, forget_bias, init_scale,
  initial states, batch_first.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.func import functional_call

from cell_checks import assert_runs_alone, gradcheck_cell
from lstmablate.cells import NoMemoryCellError, available_cells, build_encoder, get_cell
from lstmablate.cells.dyck import static_bracket_embedding
from lstmablate.errors import ConfigError

F64 = torch.float64
ALL = available_cells()
BUILTIN = ["dyck-rnn", "gru", "lstm", "lstm-gates", "lstm-noforget", "lstm-srnn",
           "lstm-srnn-hidden", "lstm-srnn-hidden-out", "lstm-srnn-out", "mlstm", "mmlstm",
           "mmrnn", "mrnn"]
MEMORY = [n for n in ALL if get_cell(n).memory_cell]


def setup_for(name: str) -> dict:
    """Sizes, depth and directions a cell can run with (generic, so plugins work too)."""
    spec = get_cell(name)
    I, H = 3, 4
    try:
        spec.build(I, H)
    except ConfigError:
        I, H = spec.cls.example_sizes
    bidir = spec.bidirectional
    D = 2 if bidir else 1
    try:
        spec.build(H * D, H)
        layers = 2
    except ConfigError:
        layers = 1
    return dict(I=I, H=H, layers=layers, bidirectional=bidir, D=D)


def make(name: str, dtype=F64, **kw):
    s = setup_for(name)
    opts = dict(num_layers=s["layers"], bidirectional=s["bidirectional"])
    opts.update(kw)
    torch.manual_seed(sum(map(ord, name)))
    return build_encoder(name, s["I"], s["H"], **opts).to(dtype), s


def rand_state(enc, B, dtype=F64, gen=None):
    n = enc.num_layers * enc.num_directions
    cell = enc.layers[0][0]
    return tuple(torch.randn(n, B, size, dtype=dtype, generator=gen) for size in cell.state_sizes)


def test_every_cell_of_the_issue_is_registered():
    assert set(BUILTIN) <= set(ALL)
    assert get_cell("srnn").name == "lstm-gates"
    assert set(MEMORY) >= {"lstm", "lstm-srnn", "lstm-srnn-out", "lstm-srnn-hidden",
                           "lstm-srnn-hidden-out", "lstm-noforget", "gru", "mlstm", "mmlstm"}
    assert not set(MEMORY) & {"lstm-gates", "mrnn", "mmrnn", "dyck-rnn"}


# ---------------------------------------------------------------------------------
# hand-written single steps
# ---------------------------------------------------------------------------------

sig, tanh = torch.sigmoid, torch.tanh


def lstm_family_reference(cell, x, state):
    """Levy et al. eqs 1-7 / §3.1, Neubig eqs 47-51, by block, literally."""
    H = cell.hidden_size
    Wx = dict(zip(cell.blocks, cell.weight_ih.split(H)))
    Wh = dict(zip(cell.recurrent_blocks, cell.weight_hh.split(H))) if cell.weight_hh is not None else {}
    nb = cell.bias.shape[0] // H if cell.bias is not None else 0
    b = dict(zip(cell.blocks[:nb], cell.bias.split(H))) if nb else {}
    h_prev = state[0]

    def pre(k, see_h):
        z = x @ Wx[k].t() + b.get(k, 0)
        return z + h_prev @ Wh[k].t() if see_h else z

    if not cell.memory_cell:  # eq 1
        h = tanh(h_prev @ Wh["g"].t() + x @ Wx["g"].t() + b["g"])
        return h, (h,)
    c_prev = state[1]
    gh = cell.gates_see_hidden
    content = tanh(pre("g", True)) if cell.content == "srnn" else pre("g", False)  # eq 2 / §3.1
    i = sig(pre("i", gh))  # eq 3
    if cell.use_forget_gate:
        c = i * content + sig(pre("f", gh)) * c_prev  # eqs 4, 5
    else:
        c = i * content + c_prev  # Neubig eq 50
    h = sig(pre("o", gh)) * tanh(c) if cell.use_output_gate else tanh(c)  # eqs 6, 7 / -OUT
    if cell.weight_hr is not None:
        h = h @ cell.weight_hr.t()
    return h, (h, c)


def gru_reference(cell, x, state):
    """Neubig eqs 56-59."""
    H = cell.hidden_size
    W_xr, W_xz, W_xh = cell.weight_ih.split(H)
    W_hr, W_hz, W_hh = cell.weight_hh.split(H)
    b_r, b_z, b_h = cell.bias.split(H)
    h_prev = state[0]
    r = sig(W_xr @ x.T + W_hr @ h_prev.T + b_r[:, None]).T  # 56
    z = sig(W_xz @ x.T + W_hz @ h_prev.T + b_z[:, None]).T  # 57
    if cell.reset_after:
        h_tilde = tanh(x @ W_xh.T + b_h + r * (h_prev @ W_hh.T + cell.bias_hh))
    else:
        h_tilde = tanh(x @ W_xh.T + (r * h_prev) @ W_hh.T + b_h)  # 58
    h = (1 - z) * h_prev + z * h_tilde  # 59
    return h, (h,)


def mrnn_reference(cell, x, state):
    F = cell.factor_size
    W_mx, W_hx = cell.weight_ih[:F], cell.weight_ih[F:]
    m = (x @ W_mx.T) * (state[0] @ cell.weight_mh.T)
    h = tanh(m @ cell.weight_hm.T + x @ W_hx.T + cell.bias)
    return h, (h,)


def mlstm_reference(cell, x, state):
    F, H = cell.factor_size, cell.hidden_size
    W_mx, W_x = cell.weight_ih[:F], cell.weight_ih[F:]
    h_prev, c_prev = state
    m = (x @ W_mx.T) * (state[0] @ cell.weight_mh.T)  # m replaces h_{t-1} in all four
    z = x @ W_x.T + m @ cell.weight_hm.T + cell.bias
    i, f, o, u = z.split(H, dim=-1)
    c = sig(f) * c_prev + sig(i) * tanh(u)
    h = sig(o) * tanh(c)
    return h, (h, c)


def _mm_block(cell, g, x, h_prev, v_prev):
    """Eqs 6-7 / 9-16 with an explicit per-example W^hh_t (B, H, H)."""
    P = cell.key_projection(g)  # (K, K + H + I): columns [v; h; x]
    K = P.shape[0]
    H = cell.hidden_size
    b_key = b_pre = 0
    if cell.bias is not None:
        blk = cell.blocks.index(g)
        ko = sum(cell.num_matrices[q] for q in cell.blocks[:blk])
        b_key = cell.bias[ko:ko + K]
        po = cell._K_total + blk * H
        b_pre = cell.bias[po:po + H]
    v = torch.softmax(torch.cat([v_prev, h_prev, x], dim=1) @ P.T + b_key, dim=1)  # eq 6
    W_t = torch.einsum("bk,kij->bij", v, cell.choice_matrices(g))  # eq 7: sum_i v[i] W[i]
    pre = torch.bmm(W_t, h_prev.unsqueeze(-1)).squeeze(-1) + x @ cell.input_matrix(g).T + b_pre
    return pre, v


def mmrnn_reference(cell, x, state):
    h_prev, v_prev = state
    pre, v = _mm_block(cell, "h", x, h_prev, v_prev)
    h = tanh(pre)  # eq 8
    return h, (h, v)


def mmlstm_reference(cell, x, state):
    h_prev, c_prev, *keys = state
    out = {g: _mm_block(cell, g, x, h_prev, k) for g, k in zip(cell.blocks, keys)}
    i, f, o = (sig(out[g][0]) for g in "ifo")  # eqs 17-19
    c_hat = tanh(out["c"][0])  # eq 20
    c = f * c_prev + i * c_hat  # eq 21
    h = o * tanh(c)  # eq 22
    return h, (h, c, *(out[g][1] for g in cell.blocks))


def dyck_reference(cell, x, state):
    H = cell.hidden_size
    g = sig(x @ cell.weight_proj.T)  # eq 3, (B, 1)
    W1 = torch.diag(torch.ones(H - 1, dtype=x.dtype), -1)
    W2 = torch.diag(torch.ones(H - 1, dtype=x.dtype), 1)
    W_t = g[:, :, None] * W1 + (1 - g[:, :, None]) * W2  # eq 4
    h = torch.bmm(W_t, state[0].unsqueeze(-1)).squeeze(-1) + g * (x @ cell.weight_hx.T)  # eq 5
    return h, (h,)


REFERENCES = {
    "lstm": lstm_family_reference, "lstm-srnn": lstm_family_reference,
    "lstm-srnn-out": lstm_family_reference, "lstm-srnn-hidden": lstm_family_reference,
    "lstm-srnn-hidden-out": lstm_family_reference, "lstm-gates": lstm_family_reference,
    "lstm-noforget": lstm_family_reference, "gru": gru_reference, "mrnn": mrnn_reference,
    "mlstm": mlstm_reference, "mmrnn": mmrnn_reference, "mmlstm": mmlstm_reference,
    "dyck-rnn": dyck_reference,
}

STEP_CASES = [(n, {}) for n in BUILTIN] + [
    ("gru", {"reset_after": True}), ("lstm", {"proj_size": 2}), ("lstm-srnn", {"content_bias": True}),
    ("mmrnn", {"bias": True, "num_matrices": 3}), ("mrnn", {"factor_size": 5}),
    ("mlstm", {"factor_size": 2}), ("mmlstm", {"bias": True, "forget_matrices": 2}),
    ("mmlstm", {"num_matrices": 2, "output_matrices": 5}), ("dyck-rnn", {"embedding_dim": 2}),
]


@pytest.mark.parametrize("name,opts", STEP_CASES,
                         ids=[f"{n}-{'-'.join(f'{k}={v}' for k, v in o.items()) or 'default'}"
                              for n, o in STEP_CASES])
def test_single_step_matches_the_equations(name, opts):
    I, H = (opts.get("embedding_dim", 1), 4) if name == "dyck-rnn" else (3, 4)
    torch.manual_seed(3)
    cell = get_cell(name).build(I, H, **opts).double()
    B = 2
    x = torch.randn(B, I, dtype=F64)
    state = tuple(torch.randn(B, n, dtype=F64) for n in cell.state_sizes)
    if name.startswith("mm"):  # keys are distributions in practice; any value is valid input
        state = state[:-len(cell.blocks)] + tuple(torch.softmax(s, -1) for s in state[-len(cell.blocks):])
    out, new_state = cell(x.unsqueeze(0), state)
    h_ref, state_ref = REFERENCES[name](cell, x, state)
    torch.testing.assert_close(out[0], h_ref, atol=1e-12, rtol=1e-10)
    assert len(new_state) == len(state_ref) == len(cell.state_names)
    for a, b in zip(new_state, state_ref):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)


def test_lstm_by_hand_scalar():
    """H = I = 1, numbers worked out on paper: eqs 2-7 with every weight 0.5, biases 0.1."""
    cell = get_cell("lstm").build(1, 1).double()
    with torch.no_grad():
        cell.weight_ih.fill_(0.5)
        cell.weight_hh.fill_(0.5)
        cell.bias.fill_(0.1)
    x, h0, c0 = 1.0, 0.2, 0.3
    a = 0.5 * h0 + 0.5 * x + 0.1  # every pre-activation: 0.7
    i = f = o = 1 / (1 + math.exp(-a))
    c = i * math.tanh(a) + f * c0
    h = o * math.tanh(c)
    out, (hn, cn) = cell(torch.tensor([[[x]]], dtype=F64),
                         (torch.tensor([[h0]], dtype=F64), torch.tensor([[c0]], dtype=F64)))
    assert out.item() == pytest.approx(h, abs=1e-12)
    assert cn.item() == pytest.approx(c, abs=1e-12)


def test_dyck_rnn_is_a_stack():
    """Eqs 3-5 with the static embedding and a saturating gate push and pop exactly."""
    k, m = 2, 4
    cell = get_cell("dyck-rnn").build(1, m).double()
    with torch.no_grad():
        cell.weight_proj.fill_(60.0)  # g = sigmoid(60 x): 1 for openers, 0 for closers
        cell.weight_hx.zero_()
        cell.weight_hx[0, 0] = 1.0  # write the bracket id on top of the stack, h[0]
    emb = static_bracket_embedding(k).double()  # (a=+1, (b=+2, a)=-1, b)=-2
    ids = {"(a": 0, "(b": 1, "a)": 2, "b)": 3}
    seq = ["(a", "(b", "(b", "b)", "(a", "a)", "b)"]
    x = emb[[ids[s] for s in seq]].unsqueeze(1)  # (T, 1, 1)
    out, _ = cell(x)
    expected = [[1, 0, 0, 0], [2, 1, 0, 0], [2, 2, 1, 0], [2, 1, 0, 0], [1, 2, 1, 0],
                [2, 1, 0, 0], [1, 0, 0, 0]]
    torch.testing.assert_close(out[:, 0], torch.tensor(expected, dtype=F64), atol=1e-12, rtol=0)
    assert sum(p.numel() for p in cell.parameters()) == 5  # Table 2: "5 parameters" at m = 4


def test_dyck_rnn_rejects_other_inputs():
    with pytest.raises(ConfigError, match="input_size must be 1"):
        build_encoder("dyck-rnn", 8, 4)
    with pytest.raises(ConfigError, match="cannot run bidirectionally"):
        build_encoder("dyck-rnn", 1, 4, bidirectional=True)
    with pytest.raises(ConfigError, match="num_layers=1"):
        build_encoder("dyck-rnn", 1, 4, num_layers=2)
    with pytest.raises(ConfigError, match="odd"):
        build_encoder("dyck-rnn", 2, 5, embedding_dim=2)
    with pytest.raises(ConfigError, match="embedding_dim"):
        build_encoder("dyck-rnn", 3, 6, embedding_dim=3)
    enc = build_encoder("dyck-rnn", 2, 8, embedding_dim=2)
    assert enc.layers[0][0].stack_depth == 4
    assert [b for b, _ in enc.named_buffers()] and not any(
        "shift" in n for n, _ in enc.named_parameters())  # W_1, W_2 are fixed


# ---------------------------------------------------------------------------------
# gradcheck, run-alone, continuation
# ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ALL)
def test_gradcheck(name):
    enc, s = make(name)
    lengths = torch.tensor([3, 2])
    B, T = 2, 3
    g = torch.Generator().manual_seed(0)
    x = torch.randn(B, T, s["I"], dtype=F64, generator=g)
    state = rand_state(enc, B, gen=g)
    names = [n for n, _ in enc.named_parameters()]
    params = tuple(p.detach().clone() for _, p in enc.named_parameters())

    def f(x, *rest):
        st, ps = rest[:len(state)], rest[len(state):]
        out, fin = functional_call(enc, dict(zip(names, ps)), (x,),
                                   {"lengths": lengths, "state": st})
        return (out,) + tuple(fin)

    inputs = tuple(t.requires_grad_(True) for t in (x, *state, *params))
    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-6, fast_mode=True)


@pytest.mark.parametrize("name", ALL)
def test_gradcheck_full_jacobian_one_cell(name):
    """The full (slow-mode) Jacobian check on one small cell with padding."""
    s = setup_for(name)
    I, H = (s["I"], 2) if s["I"] != 1 else (1, 3)
    torch.manual_seed(0)
    cell = get_cell(name).build(min(I, 2), H).double()
    assert gradcheck_cell(cell)


def _padded_batch(s, lengths, gen):
    B, T = len(lengths), max(lengths)
    x = torch.randn(B, T, s["I"], dtype=F64, generator=gen) * 3  # padding: large garbage
    return x


@pytest.mark.parametrize("name", ALL)
def test_run_alone_equivalence(name):
    enc, s = make(name)
    enc.eval()
    g = torch.Generator().manual_seed(1)
    lengths = [5, 2, 1, 4]
    x = _padded_batch(s, lengths, g).requires_grad_(True)
    assert_runs_alone(enc, x, lengths, rand_state(enc, len(lengths), gen=g))


@pytest.mark.parametrize("name", ALL)
def test_state_continuation(name):
    """Final states are complete: chunked running (TBPTT) equals running at once."""
    enc, s = make(name, bidirectional=False)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(3, 6, s["I"], dtype=F64, generator=g)
    out, fin = enc(x)
    out1, st = enc(x[:, :4])
    out2, fin2 = enc(x[:, 4:], state=st)
    torch.testing.assert_close(torch.cat([out1, out2], 1), out, atol=1e-12, rtol=1e-10)
    for a, b in zip(fin, fin2):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("name", ["lstm", "mmrnn", "gru"])
def test_time_first_and_state_errors(name):
    enc, s = make(name)
    x = torch.randn(2, 5, s["I"], dtype=F64)
    out, fin = enc(x, lengths=torch.tensor([5, 3]))
    enc.batch_first = False
    out_tf, fin_tf = enc(x.transpose(0, 1), lengths=torch.tensor([5, 3]))
    torch.testing.assert_close(out_tf.transpose(0, 1), out)
    for a, b in zip(fin, fin_tf):
        torch.testing.assert_close(a, b)
    bad = tuple(t[:1] for t in rand_state(enc, 2))
    with pytest.raises(ValueError, match="num_layers"):
        enc(x.transpose(0, 1), state=bad)


# ---------------------------------------------------------------------------------
# the weighted-sum view (eq 8)
# ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", MEMORY)
def test_weighted_sum_identity(name):
    enc, s = make(name)
    g = torch.Generator().manual_seed(4)
    lengths = [6, 3, 5]
    x = _padded_batch(s, lengths, g)
    views = enc.weighted_sum(x, lengths=torch.tensor(lengths))
    _, fin = enc(x, lengths=torch.tensor(lengths))
    cell0 = enc.layers[0][0]
    mem_name = "c" if "c" in cell0.state_names else "h"
    mem_state = fin[cell0.state_names.index(mem_name)]
    assert len(views) == s["layers"] and all(len(v) == s["D"] for v in views)
    T = x.shape[1]
    upper = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)  # [t, j] with j > t
    for li, layer in enumerate(views):
        for d, view in enumerate(layer):
            w, content, memory = view["weights"], view["content"], view["memory"]
            assert w.shape == (3, T, T, cell0.hidden_size)
            assert torch.all(w[:, upper] == 0), "weights on future words"
            recon = (w * content.unsqueeze(1)).sum(2)  # sum_j w_j^t * content_j
            torch.testing.assert_close(recon, memory, atol=1e-5, rtol=1e-5)
            for b, L in enumerate(lengths):  # the trace's memory is the real memory
                torch.testing.assert_close(memory[b, L - 1], mem_state[li * s["D"] + d, b],
                                           atol=1e-10, rtol=1e-8)


def test_gru_weights_are_an_average():
    """GRU: write z, keep 1 - z, so the weights of each step sum to at most 1."""
    enc, s = make("gru", num_layers=1, bidirectional=False)
    w = enc.weighted_sum(torch.randn(2, 7, s["I"], dtype=F64))[0][0]["weights"]
    assert torch.all(w.sum(2) <= 1 + 1e-12) and torch.all(w >= 0)


@pytest.mark.parametrize("name", [n for n in ALL if n not in MEMORY])
def test_weighted_sum_needs_a_memory_cell(name):
    enc, s = make(name)
    with pytest.raises(NoMemoryCellError, match="no memory cell") as err:
        enc.weighted_sum(torch.randn(1, 3, s["I"], dtype=F64))
    assert "lstm-srnn" in str(err.value)  # says which cells do have one
    assert isinstance(err.value, TypeError)


# ---------------------------------------------------------------------------------
# options
# ---------------------------------------------------------------------------------

STACKABLE = [n for n in ALL if setup_for(n)["layers"] == 2]


@pytest.mark.parametrize("name", STACKABLE)
def test_dropout_between_layers_only(name):
    """Dropout hits what layer l emits before layer l+1 reads it: nothing else, never in eval."""
    enc, s = make(name, bidirectional=False, dropout=0.5)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 5, s["I"], dtype=F64, generator=g)
    c0, c1 = enc.layers[0][0], enc.layers[1][0]
    enc.eval()
    out_eval, _ = enc(x)
    ref0, _ = c0(x.transpose(0, 1))
    ref1, _ = c1(ref0)
    torch.testing.assert_close(out_eval, ref1.transpose(0, 1))  # eval: no dropout at all
    enc.train()
    torch.manual_seed(11)
    out, fin = enc(x)
    torch.manual_seed(11)
    dropped = nn.functional.dropout(ref0, 0.5, True)
    ref1_train, st1 = c1(dropped)
    torch.testing.assert_close(out, ref1_train.transpose(0, 1))
    _, st0 = c0(x.transpose(0, 1))
    for a, b, c in zip(fin, st0, st1):  # layer 0 untouched, layer 1 saw the dropped input
        torch.testing.assert_close(a[0], b)
        torch.testing.assert_close(a[1], c)


#: cells whose memory is h_t itself (gru, mingru, minlstm): h_{t-1} also enters the memory
#: update, which recurrent dropout leaves unmasked (tested for gru below, for the others with them)
MEMORY_IS_H = [n for n in ALL if getattr(get_cell(n).cls, "memory_index", None) == 0]


@pytest.mark.parametrize("name", [n for n in ALL if n not in MEMORY_IS_H])
def test_recurrent_dropout_masks_h_in_products_only(name):
    """For these cells h_{t-1} enters only products, so masking = feeding h_{t-1} * mask."""
    s = setup_for(name)
    torch.manual_seed(6)
    cell = get_cell(name).build(s["I"], s["H"]).double()
    B = 3
    x = torch.randn(1, B, s["I"], dtype=F64)
    state = tuple(torch.rand(B, n, dtype=F64) for n in cell.state_sizes)
    mask = torch.bernoulli(torch.full((B, cell.output_size), 0.5, dtype=F64)) * 2
    out, st = cell(x, state, None, mask)
    out_ref, st_ref = cell(x, (state[0] * mask,) + state[1:])
    torch.testing.assert_close(out, out_ref)
    for a, b in zip(st[1:], st_ref[1:]):
        torch.testing.assert_close(a, b)


def test_recurrent_dropout_gru_keeps_the_unmasked_state_in_eq_59():
    cell = get_cell("gru").build(3, 4).double()
    x = torch.randn(2, 3, dtype=F64)
    h = torch.randn(2, 4, dtype=F64)
    mask = torch.tensor([[2.0, 0, 2, 0], [0, 2, 2, 0]], dtype=F64)
    xp = cell.project_inputs(x)
    h_new, _, z, keep, h_tilde = cell.memory_step(xp, (h,), mask)
    _, _, z_ref, _, h_tilde_ref = cell.memory_step(xp, (h * mask,), None)
    torch.testing.assert_close(z, z_ref)
    torch.testing.assert_close(h_tilde, h_tilde_ref)
    torch.testing.assert_close(h_new, (1 - z) * h + z * h_tilde)


@pytest.mark.parametrize("name", ["lstm", "gru", "mmlstm", "lstm-srnn-hidden"])
def test_recurrent_dropout_in_the_encoder(name):
    """One mask per sequence and layer, the same at every step; nothing in eval."""
    p = 0.4
    enc, s = make(name, num_layers=1, bidirectional=True, recurrent_dropout=p)
    x = torch.randn(2, 5, s["I"], dtype=F64)
    enc.eval()
    out_eval, _ = enc(x)
    enc.recurrent_dropout = 0.0
    torch.testing.assert_close(enc(x)[0], out_eval)
    enc.recurrent_dropout = p
    enc.train()
    torch.manual_seed(12)
    out, _ = enc(x)
    torch.manual_seed(12)
    ref = []
    xt = x.transpose(0, 1)
    for d, cell in enumerate(enc.layers[0]):
        mask = xt.new_empty(2, cell.output_size).bernoulli_(1 - p) / (1 - p)
        o, _ = cell(xt if d == 0 else xt.flip(0), None, None, mask)
        ref.append(o if d == 0 else o.flip(0))
    torch.testing.assert_close(out, torch.cat(ref, -1).transpose(0, 1))


@pytest.mark.parametrize("name", ["lstm", "gru", "mrnn", "mmlstm"])
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
def test_residual_connections(name, bidirectional):
    """Eq 61 of the Neubig notes: h_{n,t} = RNN_n(h_{n-1,t}, h_{n,t-1}) + h_{n-1,t}."""
    D = 2 if bidirectional else 1
    H = 3
    torch.manual_seed(7)
    enc = build_encoder(name, H * D, H, num_layers=2, bidirectional=bidirectional,
                        residual=True).double()
    lengths = torch.tensor([4, 2])
    x = torch.randn(2, 4, H * D, dtype=F64)
    out, _ = enc(x, lengths=lengths)
    plain = build_encoder(name, H * D, H, num_layers=1, bidirectional=bidirectional).double()
    plain2 = build_encoder(name, H * D, H, num_layers=1, bidirectional=bidirectional).double()
    for tgt, src in ((plain, 0), (plain2, 1)):
        tgt.layers[0].load_state_dict(enc.layers[src].state_dict())
    mask = (torch.arange(4)[None, :] < lengths[:, None]).to(F64).unsqueeze(-1)
    h1 = plain(x, lengths=lengths)[0] + x * mask
    h2 = plain2(h1, lengths=lengths)[0] + h1
    torch.testing.assert_close(out, h2)
    assert torch.all(out[1, 2:] == 0)


def test_proj_size():
    enc = build_encoder("lstm", 3, 6, num_layers=2, bidirectional=True, proj_size=2)
    out, (h, c) = enc(torch.randn(2, 4, 3))
    assert out.shape == (2, 4, 4) and h.shape == (4, 2, 2) and c.shape == (4, 2, 6)
    assert enc.layers[1][0].input_size == 4
    for bad in ({"proj_size": 6}, {"proj_size": -1}):
        with pytest.raises(ConfigError, match="proj_size"):
            build_encoder("lstm", 3, 6, **bad)
    with pytest.raises(ConfigError, match="proj_size"):
        build_encoder("lstm-gates", 3, 6, proj_size=2)
    for name in ("gru", "mrnn", "mmlstm"):
        with pytest.raises(ConfigError):  # UnknownNameError is a UserError too
            build_encoder(name, 3, 6, proj_size=2)


FORGET = [n for n in ALL if "forget_bias" in get_cell(n).option_names() - set(get_cell(n).preset)
          and n not in ("lstm-gates", "lstm-noforget")]


@pytest.mark.parametrize("name", FORGET)
def test_forget_bias(name):
    """All weights 0 (init_scale=0) and b_f = 2: the keep gate is sigma(2) everywhere."""
    opts = {"bias": True} if name == "mmlstm" else {}
    enc, s = make(name, init_scale=0.0, forget_bias=2.0, **opts)
    view = enc.weighted_sum(torch.randn(2, 4, s["I"], dtype=F64))
    for layer in view:
        for d in layer:
            w = d["weights"]  # w_{t-1}^{t} = i_{t-1} * f_t, w_t^t = i_t
            ratio = w[:, 1:, :-1] / w[:, :-1, :-1]
            for t in range(3):
                torch.testing.assert_close(ratio[:, t, t], torch.full_like(ratio[:, t, t],
                                                                         1 / (1 + math.exp(-2))))
    enc.reset_parameters(0.0)  # re-initialising keeps the forget-gate bias
    v2 = enc.weighted_sum(torch.randn(2, 4, s["I"], dtype=F64))
    torch.testing.assert_close(v2[0][0]["weights"][:, 1, 0] / v2[0][0]["weights"][:, 0, 0],
                               torch.full((2, s["H"]), 1 / (1 + math.exp(-2)), dtype=F64))


def test_forget_bias_needs_a_forget_gate():
    for name in ("lstm-gates", "lstm-noforget"):
        with pytest.raises(ConfigError, match="forget"):
            build_encoder(name, 3, 4, forget_bias=1.0)
    with pytest.raises(ConfigError, match="bias=True"):
        build_encoder("mmlstm", 3, 4, forget_bias=1.0)
    with pytest.raises(ConfigError):
        build_encoder("mmrnn", 3, 4, forget_bias=1.0)  # no forget gate, no such option


def test_lstm_gates_rejects_gate_switches():
    with pytest.raises(ConfigError, match="memory cell"):
        build_encoder("lstm-gates", 3, 4, output_gate=False)


@pytest.mark.parametrize("name", ALL)
def test_init_scale(name):
    s = setup_for(name)
    enc = build_encoder(name, s["I"], s["H"], init_scale=0.05)
    assert all(p.abs().max() <= 0.05 for p in enc.parameters())
    enc.reset_parameters(0.01)
    assert all(p.abs().max() <= 0.01 for p in enc.parameters())
    assert all(p.abs().max() > 0 for p in enc.parameters() if p.numel() > 3)
    for _, buf in enc.named_buffers():  # fixed matrices (dyck-rnn's shifts) are left alone
        assert set(buf.unique().tolist()) <= {0.0, 1.0}


def test_mmlstm_matrix_counts():
    cell = get_cell("mmlstm").build(3, 4, forget_matrices=2, output_matrices=3)
    assert cell.num_matrices == {"i": 4, "f": 2, "o": 3, "c": 4}
    assert cell.state_sizes == (4, 4, 4, 2, 3, 4)
    assert cell.choice_matrices("f").shape == (2, 4, 4)
    assert cell.key_projection("o").shape == (3, 3 + 4 + 3)
    with pytest.raises(ConfigError, match="positive"):
        get_cell("mmlstm").build(3, 4, num_matrices=0)
    h0, c0, *keys = cell.initial_state(2, torch.zeros(1))
    for k, n in zip(keys, (4, 2, 3, 4)):  # "equal weight to all the choice matrices"
        torch.testing.assert_close(k, torch.full((2, n), 1 / n))
