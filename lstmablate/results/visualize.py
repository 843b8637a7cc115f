"""``lstmablate visualize``: Appendix A's picture for a trained run."""

from __future__ import annotations

from pathlib import Path

import torch

from lstmablate.errors import UserError
from lstmablate.run.runner import load_run_model
from lstmablate.runfolder import check_output
from .figures import visualize


def visualize_run(run_dir: Path, text: str, *, layer: int = 0, out: Path = Path("weights.png"),
                  checkpoint: str | None = None, data_dir: str | None = None,
                  force: bool = True) -> tuple[Path, Path]:
    """Heatmap of ||w_j^t|| (PNG) and its values (CSV beside it) for ``text``; ``layer`` is
    0-based (the command line's ``--layer`` counts from 1).  The outputs are checked before
    the model is loaded; without ``force``, existing ones are refused."""
    out = Path(out)
    csv_path = out.with_suffix(".csv")
    if out.suffix.lower() != ".png":
        raise UserError(f"--out {out}: give a file name ending in .png (the CSV of the values is "
                        "written beside it, with .csv). Nothing was written.")
    check_output([out, csv_path], force=force)
    cfg, task, model = load_run_model(run_dir, checkpoint, data_dir)
    try:
        encoder, emb, tokens = task.visualization_inputs(model, text)
    except NotImplementedError as e:
        raise UserError(str(e)) from None
    if not 0 <= layer < encoder.num_layers:
        raise UserError(f"--layer must be in 1..{encoder.num_layers} for this run (1 = the layer "
                        f"that reads the embeddings), got {layer + 1}")
    with torch.no_grad():
        visualize(encoder, emb.detach(), tokens, out, layer=layer, csv_path=csv_path)
    return out, csv_path
