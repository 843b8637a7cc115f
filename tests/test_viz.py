"""The Appendix A picture: ||w_j^t||_2, rows j = context word, columns t = current word."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lstmablate.cells import NoMemoryCellError, build_encoder
from lstmablate.errors import ConfigError
from lstmablate.viz import read_csv, visualize, weight_norms

TOKENS = ["the", "cat", "sat", "on", "the", "mat"]


def _expected_backward(cell, x_seq: torch.Tensor) -> np.ndarray:
    """Backward-direction norms in ORIGINAL word order, from first principles.

    The backward cell reads words T-1, ..., 0; at current word t its memory
    holds words j >= t with weight write_j * prod_{k=t}^{j-1} keep_k (every word
    it read after j, which lie between t and j).
    """
    T = x_seq.shape[0]
    tr = cell.trace_memory(x_seq.flip(0).unsqueeze(1))  # reading order
    write = tr["write"][:, 0].flip(0)  # back to word order
    keep = tr["keep"][:, 0].flip(0)
    M = np.zeros((T, T))
    for t in range(T):
        for j in range(t, T):
            w = write[j].clone()
            for k in range(t, j):
                w = w * keep[k]
            M[j, t] = float(w.norm())
    return M


def _expected_forward(cell, x_seq: torch.Tensor) -> np.ndarray:
    T = x_seq.shape[0]
    tr = cell.trace_memory(x_seq.unsqueeze(1))
    write, keep = tr["write"][:, 0], tr["keep"][:, 0]
    M = np.zeros((T, T))
    for t in range(T):
        for j in range(t + 1):
            w = write[j].clone()
            for k in range(j + 1, t + 1):
                w = w * keep[k]
            M[j, t] = float(w.norm())
    return M


@pytest.fixture
def bi_encoder():
    torch.manual_seed(0)
    enc = build_encoder("lstm-srnn-out", 5, 4, num_layers=2, bidirectional=True).double()
    with torch.no_grad():  # sharper gates than the default init, for a non-trivial picture
        for cell in enc.cells():
            cell.weight_ih.mul_(3)
    return enc


def test_csv_equals_weighted_sum_norms(bi_encoder, tmp_path):
    x = torch.randn(1, len(TOKENS), 5, dtype=torch.float64)
    res = visualize(bi_encoder, x, TOKENS, tmp_path / "fig.png", layer=0)
    png, csv_path = res["png"], res["csv"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    assert csv_path == tmp_path / "fig.csv"
    tokens, M = read_csv(csv_path)
    assert tokens == TOKENS

    # straight from Encoder.weighted_sum: forward [t, j] -> [j, t]
    view = bi_encoder.weighted_sum(x)[0]
    fwd = view[0]["weights"][0].norm(dim=-1).t().numpy()
    np.testing.assert_allclose(np.triu(M, 1), np.triu(fwd, 1), rtol=1e-12, atol=1e-14)
    # ... and from first principles, both directions
    c_fwd, c_bwd = bi_encoder.layers[0]
    with torch.no_grad():
        ef = _expected_forward(c_fwd, x[0])
        eb = _expected_backward(c_bwd, x[0])
    np.testing.assert_allclose(np.triu(M, 1), np.triu(ef, 1), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(np.tril(M, -1), np.tril(eb, -1), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(np.diag(M), np.sqrt(np.diag(ef) ** 2 + np.diag(eb) ** 2),
                               rtol=1e-10)
    assert np.all(np.tril(res["norms"].forward, -1) == 0)
    assert np.all(np.triu(res["norms"].backward, 1) == 0)


def test_second_layer_and_negative_index(bi_encoder, tmp_path):
    x = torch.randn(1, 4, 5, dtype=torch.float64)
    a = visualize(bi_encoder, x, TOKENS[:4], tmp_path / "a.png", layer=1,
                  csv_path=tmp_path / "vals" / "a.csv")
    b = visualize(bi_encoder, x, TOKENS[:4], tmp_path / "b.png", layer=-1)
    np.testing.assert_array_equal(a["norms"].combined, b["norms"].combined)
    assert (tmp_path / "vals" / "a.csv").exists()
    layers = weight_norms(bi_encoder, x)
    assert [n.layer for n in layers] == [0, 1]
    assert not np.allclose(layers[0].combined, layers[1].combined)
    with pytest.raises(ConfigError, match="layer 2 does not exist"):
        visualize(bi_encoder, x, TOKENS[:4], tmp_path / "c.png", layer=2)


def test_unidirectional_language_model_picture(tmp_path):
    enc = build_encoder("lstm", 3, 4).double()
    x = torch.randn(1, 5, 3, dtype=torch.float64)
    res = visualize(enc, x, ["a", "b", "c,d", 'say "hi"', "a"], tmp_path / "lm.png")
    tokens, M = read_csv(res["csv"])
    assert tokens == ["a", "b", "c,d", 'say "hi"', "a"]  # quoting survives the round trip
    assert np.all(np.tril(M, -1) == 0) and np.all(np.diag(M) > 0)
    assert res["norms"].backward is None


def test_errors(tmp_path):
    enc = build_encoder("lstm-gates", 3, 4)
    with pytest.raises(NoMemoryCellError, match="no memory cell"):
        visualize(enc, torch.randn(1, 3, 3), ["a", "b", "c"], tmp_path / "x.png")
    enc = build_encoder("gru", 3, 4)
    with pytest.raises(ValueError, match="token labels"):
        visualize(enc, torch.randn(1, 3, 3), ["a", "b"], tmp_path / "x.png")
    with pytest.raises(ValueError, match="one sentence"):
        weight_norms(enc, torch.randn(2, 3, 3))


def test_labels_are_mathtext_and_layers_count_from_one(bi_encoder):
    """What a paper figure needs: ||w_j^t||_2 typeset (mathtext), layer 1 = the layer that
    reads the embeddings, a labelled colour bar."""
    from lstmablate.viz import draw_weight_norms

    layers = weight_norms(bi_encoder, torch.randn(1, 4, 5, dtype=torch.float64))
    fig = draw_weight_norms(layers[0], TOKENS[:4])
    heat, bar = fig.axes
    assert heat.get_title().startswith(r"layer 1: $\|w_j^t\|_2$")
    assert r"$\|w_j^t\|_2$" in bar.get_ylabel()
    assert heat.get_ylabel() == r"context word $j$"
    fig.canvas.draw()  # mathtext that does not parse fails here
    assert draw_weight_norms(layers[1], TOKENS[:4]).axes[0].get_title().startswith("layer 2:")


def test_visualize_command_counts_layers_from_one_and_never_overwrites(tiny_recipe, tmp_path):
    from lstmablate.errors import UserError
    from lstmablate.runner import train_run
    from lstmablate.visualize_run import visualize_run

    import io

    from rich.console import Console

    out = train_run("dyck", "lstm", recipe=str(tiny_recipe), out=tmp_path / "runs",
                    console=Console(file=io.StringIO()), progress=False, threads=1,
                    overrides=["train.max_steps=2"])
    png, csv_path = visualize_run(out.run_dir, "(a (b b) a)", layer=0, out=tmp_path / "w.png",
                                  force=False)
    assert png.exists() and csv_path.exists()
    before = png.read_bytes()
    with pytest.raises(UserError, match=r"w.png, .*w.csv already exist; add --force"):
        visualize_run(out.run_dir, "(a (b b) a)", layer=0, out=tmp_path / "w.png", force=False)
    assert png.read_bytes() == before
    with pytest.raises(UserError, match=r"--layer must be in 1\.\.1 .*got 2"):
        visualize_run(out.run_dir, "(a (b b) a)", layer=1, out=tmp_path / "v.png")
