"""Appendix A of Levy et al. (2018): heatmaps of the memory cell's weights.

The memory cell computes c_t = sum_j w_j^t * content_j (eq 8).  The picture
shows ||w_j^t||_2 with **rows j = context word** and **columns t = current
word**, so column t is the weighted sum that represents word t:

* forward direction: w_j^t is non-zero only for j <= t, the upper-right
  triangle (diagonal included);
* backward direction (bidirectional encoders): its cell reads the sentence
  right to left, so its weights come in its own reading order; the backward
  weight of current word t on context word j (j >= t) is its weight at
  reading position T-1-t on reading position T-1-j.  That fills the
  lower-left triangle.
* the diagonal has a weight from both directions; every cell shows the norm of
  the concatenated [forward; backward] weight vector,
  sqrt(||w_fwd||^2 + ||w_bwd||^2), which off the diagonal is just the one
  direction that is non-zero there (the bidirectional state is that
  concatenation too).

:func:`weight_norms` computes the matrices, :func:`plot_weight_norms` draws
the PNG (matplotlib, Agg, no pyplot state), :func:`write_csv` writes the
values, and :func:`visualize` does all three for one layer.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from torch import Tensor

from lstmablate.errors import ConfigError
from lstmablate.io import atomic_write, atomic_write_text


@dataclass
class WeightNorms:
    """||w_j^t||_2 of one layer, indexed [j, t] (row = context word, column = current word)."""

    layer: int
    combined: np.ndarray  # (T, T): forward upper-right, backward lower-left
    forward: np.ndarray  # (T, T): zero below the diagonal
    backward: np.ndarray | None  # (T, T): zero above the diagonal; None if unidirectional


def _norms(weights: Tensor) -> np.ndarray:
    """(T, T, H) weights indexed [t, j] -> (T, T) norms indexed [j, t]."""
    return weights.norm(dim=-1).t().double().cpu().numpy()


def weight_norms(encoder, embeddings: Tensor) -> list[WeightNorms]:
    """||w_j^t||_2 for every layer of ``encoder`` on ONE sentence.

    ``embeddings``: (1, T, input_size) batch-first (or (T, 1, input_size) if
    the encoder is time-first), the vectors the encoder reads.  Raises
    ``TypeError`` for cells without a memory cell (see ``Encoder.weighted_sum``).
    """
    if embeddings.dim() != 3:
        raise ValueError(f"embeddings must be 3-D, got shape {tuple(embeddings.shape)}")
    batch = embeddings.shape[0] if getattr(encoder, "batch_first", True) else embeddings.shape[1]
    if batch != 1:
        raise ValueError(f"visualise one sentence at a time (batch 1), got batch {batch}")
    views = encoder.weighted_sum(embeddings)
    result = []
    for li, layer in enumerate(views):
        fwd = _norms(layer[0]["weights"][0])
        bwd = None
        if len(layer) > 1:
            # reading position r of the backward cell is word T-1-r, so its
            # [t', j'] entry belongs to current word T-1-t', context word T-1-j'
            # (_norms already transposed to [j', t']; flipping both axes maps it).
            bwd = _norms(layer[1]["weights"][0])[::-1, ::-1].copy()
        combined = fwd if bwd is None else np.sqrt(fwd ** 2 + bwd ** 2)
        result.append(WeightNorms(li, combined, fwd, bwd))
    return result


def _check_tokens(tokens: list[str], T: int) -> None:
    if len(tokens) != T:
        raise ValueError(f"{len(tokens)} token labels for a sentence of {T} positions")


def write_csv(norms: WeightNorms, tokens: list[str], path: str | Path) -> Path:
    """The combined matrix as CSV: header ``context\\current`` + tokens (columns t);
    one row per context word j, starting with its token."""
    path = Path(path)
    T = norms.combined.shape[0]
    _check_tokens(tokens, T)
    buf = io.StringIO(newline="")
    w = csv.writer(buf)
    w.writerow(["context\\current", *tokens])
    for j in range(T):
        w.writerow([tokens[j], *(repr(float(v)) for v in norms.combined[j])])
    atomic_write_text(path, buf.getvalue())
    return path


def read_csv(path: str | Path) -> tuple[list[str], np.ndarray]:
    """Read back what :func:`write_csv` wrote: (tokens, matrix[j, t])."""
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    tokens = rows[0][1:]
    return tokens, np.array([[float(v) for v in r[1:]] for r in rows[1:]], dtype=float)


def plot_weight_norms(norms: WeightNorms, tokens: list[str], path: str | Path,
                      title: str | None = None) -> Path:
    """Draw the heatmap (:func:`draw_weight_norms`) into the PNG ``path``."""
    path = Path(path)
    fig = draw_weight_norms(norms, tokens, title)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda f: fig.savefig(f, format=path.suffix.lstrip(".") or "png", dpi=150))
    return path


def draw_weight_norms(norms: WeightNorms, tokens: list[str], title: str | None = None) -> Any:
    """The heatmap (darker = larger norm) with token labels on both axes, a matplotlib Figure."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    M = norms.combined
    T = M.shape[0]
    _check_tokens(tokens, T)
    side = min(max(4.0, 0.45 * T + 2.0), 40.0)
    fig = Figure(figsize=(side + 1.2, side))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    vmax = float(M.max()) if M.size and M.max() > 0 else 1.0
    im = ax.imshow(M, cmap="Greys", vmin=0.0, vmax=vmax, interpolation="nearest",
                   aspect="equal")
    fontsize = 10 if T <= 30 else max(4, int(300 / T))
    ax.set_xticks(range(T))
    ax.set_yticks(range(T))
    # the tokens are the user's text, drawn as written: a "$" in one starts no mathtext
    ax.set_xticklabels(tokens, rotation=90, fontsize=fontsize, parse_math=False)
    ax.set_yticklabels(tokens, fontsize=fontsize, parse_math=False)
    ax.xaxis.tick_top()
    ax.xaxis.set_label_position("top")
    ax.set_xlabel(r"current word $t$ (column $t$: the weighted sum for word $t$)")
    ax.set_ylabel(r"context word $j$")
    if title is None:  # layers counted from 1, the one that reads the embeddings
        title = rf"layer {norms.layer + 1}: $\|w_j^t\|_2$"
        if norms.backward is not None:
            title += " (upper right: forward, lower left: backward)"
    ax.set_title(title, fontsize=10, pad=12)
    # grid lines between cells keep long sentences readable
    ax.set_xticks(np.arange(-0.5, T, 1), minor=True)
    ax.set_yticks(np.arange(-0.5, T, 1), minor=True)
    ax.grid(which="minor", color="#dddddd", linewidth=0.3)
    ax.tick_params(which="minor", length=0)
    cbar = fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    cbar.set_label(r"$\|w_j^t\|_2$, the norm of the weight of word $j$ in $c_t$")
    fig.tight_layout()
    return fig


def visualize(encoder, embeddings: Tensor, tokens: list[str], out: str | Path,
              layer: int = 0, csv_path: str | Path | None = None,
              title: str | None = None, csv: bool = True) -> dict:
    """Appendix A for one sentence: the PNG at ``out`` and the CSV beside it (none where
    ``csv`` is false: ``csv`` None in what is returned).

    ``layer`` indexes the encoder's layers (negative counts from the top; the
    default 0 is the layer that reads the embeddings, whose content layer is a
    function of the word alone for the -S-RNN ablations).  The CSV goes to
    ``csv_path`` or ``out`` with suffix ``.csv``.  Returns the paths and the
    :class:`WeightNorms` of that layer.
    """
    all_layers = weight_norms(encoder, embeddings)
    n = len(all_layers)
    if not -n <= layer < n:
        raise ConfigError(f"layer {layer} does not exist: the encoder has {n} layer(s) "
                          f"(0..{n - 1})")
    norms = all_layers[layer]
    out = Path(out)
    csv_path = Path(csv_path) if csv_path is not None else out.with_suffix(".csv")
    T = norms.combined.shape[0]
    _check_tokens(tokens, T)
    if T == 0 or not math.isfinite(float(np.sum(norms.combined))):
        raise ValueError("nothing to draw: empty sentence or non-finite weights")
    plot_weight_norms(norms, tokens, out, title)
    if not csv:
        return {"png": out, "csv": None, "norms": norms}
    write_csv(norms, tokens, csv_path)
    return {"png": out, "csv": csv_path, "norms": norms}
