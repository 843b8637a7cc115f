"""What the simpler recurrences (issue 49: qrnn, ran, sru, knn-rnn, mingru, minlstm) share: they
are registered with their equations and parameter counts (`lstmablate list cells`), the
linear-scan ones compute every gate before the recurrence runs (``scan_inputs``), each is an
element-wise weighted sum of its contents (eq 8) with any option, and `lstmablate visualize`
draws a trained run of one of them.

The shared registry tests run every one of them too: equations of the options every cell
honours, gradcheck, padding and both directions (tests/test_cells_equations.py), the step API
(tests/test_encoder_step.py), pooling (tests/test_encoder_pooling.py), and a few training steps
in every task (tests/test_registry_on_dyck.py, test_parsing_task.py, test_nmt_task.py,
test_sst_task.py, test_squad_*.py)."""

from __future__ import annotations

import csv
import io

import pytest
import torch
from rich.console import Console

from cell_checks import gradcheck_cell
from cli_in_process import run_cli
from lstmablate.cells import available_cells, build_encoder, get_cell
from lstmablate.cells._elementwise import ElementwiseCell
from lstmablate.cells.describe import TABLE_SIZE, cell_rows

F64 = torch.float64
NEW = ["knn-rnn", "mingru", "minlstm", "qrnn", "ran", "sru", "sru-2017"]
H = TABLE_SIZE

#: every new cell with the options that change its arithmetic
VARIANTS = [("qrnn", dict(gates=p, window=w)) for p in ("f", "fo", "ifo") for w in (1, 2)] + [
    ("ran", {}), ("ran", {"activation": "identity"}), ("sru", {}), ("sru-2017", {}),
    ("sru", {"activation": "tanh"}), ("knn-rnn", {}), ("knn-rnn", {"activation": "identity"}),
    ("knn-rnn", {"highway": True}),
    ("mingru", {}), ("mingru", {"positive_content": True}), ("minlstm", {}),
    ("minlstm", {"positive_content": True}), ("sru", {"init": "authors"}),
    ("mingru", {"mode": "log"}), ("minlstm", {"mode": "log"})]
VARIANT_IDS = [n + "".join(f"-{k}={v}" for k, v in o.items()) for n, o in VARIANTS]
SCAN = [(n, o) for n, o in VARIANTS if issubclass(get_cell(n).cls, ElementwiseCell)
        and get_cell(n).build(3, 4, **o).linear_scan]


def test_the_new_cells_are_registered_with_their_equations():
    assert set(NEW) <= set(available_cells())
    rows = {r.name: r for r in cell_rows()}
    for name in NEW:
        spec = get_cell(name)
        assert spec.bidirectional and spec.memory_cell and spec.summary and spec.equations
        assert "weighted-sum" in rows[name].supports
    # one layer, one direction at input = hidden = 650 (`lstmablate list cells`)
    assert rows["qrnn"].params == 3 * H * H + 3 * H  # z, f, o; width 1
    assert rows["ran"].params == rows["lstm-srnn-out"].params == 3 * H * H + 2 * H * H + 2 * H
    assert rows["sru"].params == 3 * H * H + 4 * H  # W, W_f, W_r; b_f, b_r; v_f, v_r
    assert rows["sru-2017"].params == 3 * H * H + 2 * H
    assert rows["knn-rnn"].params == 2 * H * H + H * H + H
    assert rows["mingru"].params == 2 * H * H + 2 * H
    assert rows["minlstm"].params == 3 * H * H + 3 * H
    assert {n for n, _ in SCAN} == {"qrnn", "sru-2017", "mingru", "minlstm"}


def test_list_cells_shows_them(tmp_path):
    r = run_cli("list", "cells", "--plain", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = [line.split("\t") for line in r.stdout.strip().splitlines()]
    header, rows = lines[0], {cols[0]: dict(zip(lines[0], cols)) for cols in lines[1:]}
    assert header[:4] == ["name", "family", "equations", "params"]
    for name in NEW:
        assert rows[name]["equations"] == get_cell(name).summary
    assert rows["minlstm"]["params"] == f"{3 * H * H + 3 * H:,}"
    assert "gates" in rows["qrnn"]["options"] and "zoneout" in rows["qrnn"]["options"]


@pytest.mark.parametrize("name,opts", SCAN, ids=[n + "".join(f"-{k}={v}" for k, v in o.items())
                                                  for n, o in SCAN])
def test_a_linear_scan_of_the_precomputed_terms_is_the_reference_loop(name, opts):
    """``scan_inputs`` gives keep, write and content of every step from one matrix product; the
    recurrence over them from the initial state, then ``readout``, is the reference loop."""
    torch.manual_seed(0)
    cell = get_cell(name).build(3, 4, **opts).double()
    x = torch.randn(6, 2, 3, dtype=F64)
    state = tuple(torch.randn(2, n, dtype=F64) for n in cell.state_sizes)
    out, final = cell(x, state)
    terms = cell.scan_inputs(x, state)
    assert all(terms[k].shape == (6, 2, 4) for k in ("keep", "write", "content"))
    memory, memories = state[cell.memory_index], []
    for keep, write, content in zip(terms["keep"], terms["write"], terms["content"]):
        memory = keep * memory + write * content
        memories.append(memory)
    memories = torch.stack(memories)
    torch.testing.assert_close(cell.readout(memories, terms), out, atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(memories[-1], final[cell.memory_index], atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("name,opts", VARIANTS, ids=VARIANT_IDS)
def test_weighted_sum_identity_with_every_option(name, opts):
    """c_t = Σ_j w_j^t ∘ content_j (eq 8) for every layer and direction of a padded batch, and the
    trace's memory at each sequence's last token is the encoder's final memory."""
    torch.manual_seed(1)
    highway = opts.get("highway", False)  # x_t + h_t: every layer's input as wide as its output
    I, D = (4, 1) if highway else (3, 2)
    enc = build_encoder(name, I, 4, num_layers=2, bidirectional=D == 2, **opts).double()
    lengths = [6, 3, 5]
    x = torch.randn(3, 6, I, dtype=F64) * 2
    views = enc.weighted_sum(x, lengths=torch.tensor(lengths))
    _, final = enc(x, lengths=torch.tensor(lengths))
    cell = enc.layers[0][0]
    memory_state = final[cell.memory_index]
    future = torch.triu(torch.ones(6, 6, dtype=torch.bool), diagonal=1)  # [t, j] with j > t
    for li, layer in enumerate(views):
        for d, view in enumerate(layer):
            w, content, memory = view["weights"], view["content"], view["memory"]
            assert torch.all(w[:, future] == 0)
            torch.testing.assert_close((w * content.unsqueeze(1)).sum(2), memory,
                                       atol=1e-10, rtol=1e-10)
            for b, L in enumerate(lengths):
                torch.testing.assert_close(memory[b, L - 1], memory_state[D * li + d, b],
                                           atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("name,opts", VARIANTS, ids=VARIANT_IDS)
def test_gradcheck_every_variant(name, opts):
    """The full Jacobian in float64 (inputs, initial state, every parameter, a padded step)."""
    torch.manual_seed(3)
    assert gradcheck_cell(get_cell(name).build(2, 2, **opts).double())


@pytest.mark.parametrize("name", [n for n in NEW if issubclass(get_cell(n).cls, ElementwiseCell)])
def test_recurrent_dropout_has_nothing_to_mask(name):
    """No product reads h_{t-1} in these cells: the mask changes no output and no state."""
    torch.manual_seed(2)
    cell = get_cell(name).build(3, 4).double()
    assert cell.weight_hh is None
    x = torch.randn(4, 2, 3, dtype=F64)
    state = tuple(torch.randn(2, n, dtype=F64) for n in cell.state_sizes)
    mask = torch.bernoulli(torch.full((2, 4), 0.5, dtype=F64)) * 2
    out, fin = cell(x, state, None, mask)
    ref, fin_ref = cell(x, state)
    torch.testing.assert_close(out, ref, atol=0, rtol=0)
    for a, b in zip(fin, fin_ref):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_visualize_draws_a_trained_run_of_a_new_cell(tiny_recipe, tmp_path):
    """A tiny Dyck run of a width-2 QRNN, then `lstmablate visualize`: the CSV holds the
    weighted-sum norms ||w_j^t|| of its second layer."""
    from lstmablate.run.runner import load_run_model, train_run

    out = train_run("dyck", "qrnn", recipe=str(tiny_recipe), out=tmp_path / "runs",
                    overrides=["train.max_steps=5", "model.num_layers=2",
                               "model.cell_options={window: 2, gates: ifo}"],
                    console=Console(file=io.StringIO()), progress=False)
    text = "(a (b b) (a a) a)"
    r = run_cli("visualize", str(out.run_dir), "--text", text, "--layer", "2",
                "--out", str(tmp_path / "fig.png"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "fig.png").stat().st_size > 1000
    with open(tmp_path / "fig.csv") as f:
        rows = list(csv.reader(f))
    assert rows[0][1:] == text.split()
    values = torch.tensor([[float(v) for v in row[1:]] for row in rows[1:]], dtype=F64)
    _, task, model = load_run_model(out.run_dir)
    encoder, emb, _ = task.visualization_inputs(model, text)
    assert encoder.layers[0][0].window == 2
    view = encoder.weighted_sum(emb)[1][0]
    torch.testing.assert_close(values, view["weights"][0].norm(dim=-1).t().double(),
                               atol=1e-5, rtol=1e-5)
    assert torch.all(values.tril(-1) == 0) and torch.all(values.diagonal() > 0)
