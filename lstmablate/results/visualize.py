"""``lstmablate visualize``: Appendix A's picture for a trained run."""

from __future__ import annotations

from pathlib import Path

import torch

from lstmablate.config import MAX_LAYERS
from lstmablate.errors import UserError
from lstmablate.io import is_stream
from lstmablate.limits import check_int
from lstmablate.run.runner import checkpoint_file, load_run_model, resource_guard
from lstmablate.run.runs import RunFiles
from lstmablate.runfolder import check_output
from .figures import visualize

#: the most tokens ``--text`` may have: the picture has a row and a column per token, and the
#: weights behind it are tokens x tokens x hidden numbers per layer (at 256 tokens and hidden
#: 650, 170 MB a layer and direction); the longest sentences of the treebanks are shorter
#: (PTB 82 words, UD English EWT 159)
MAX_TEXT_TOKENS = 256


def check_text(n_tokens: int) -> None:
    """``--text`` of ``n_tokens`` tokens: at least one, at most :data:`MAX_TEXT_TOKENS`."""
    if n_tokens == 0:
        raise UserError("--text has no tokens; give the input to draw, its tokens separated by "
                        "spaces (e.g. --text \"(a (b b) a)\" for a Dyck run).")
    check_int(n_tokens, "--text: the number of tokens", 1, MAX_TEXT_TOKENS,
              "(The picture has a row and a column per token; draw a shorter text.)")


def check_options(run_dir: Path, text: str, layer: int, checkpoint: str | None) -> None:
    """The options of :func:`visualize_run` that need no run, checked before anything is
    read: the text's tokens (separated by spaces; a task that splits words further is checked
    again once it has), the layer (at most ``config.MAX_LAYERS`` here, at most the run's
    layers once the model is built) and the checkpoint's name."""
    check_text(len(text.split()))
    check_int(layer + 1, "--layer", 1, MAX_LAYERS, "(1 = the layer that reads the embeddings.)")
    if checkpoint is not None:
        checkpoint_file(RunFiles(Path(run_dir)), checkpoint)


def visualize_run(run_dir: Path, text: str, *, layer: int = 0, out: Path = Path("weights.png"),
                  checkpoint: str | None = None, data_dir: str | None = None,
                  force: bool = True) -> tuple[Path, Path | None]:
    """Heatmap of ||w_j^t|| (PNG) and its values (CSV beside it) for ``text``; ``layer`` is
    0-based (the command line's ``--layer`` counts from 1).  The options and the outputs are
    checked before the model is loaded; without ``force``, existing outputs are refused.
    ``out`` a device or a pipe (:func:`lstmablate.io.output_kind`) receives the PNG alone
    (the CSV path returned is None).  Running out of memory is the one-paragraph error
    ``eval`` gives."""
    check_options(run_dir, text, layer, checkpoint)
    out = Path(out)
    streamed = is_stream(out)
    csv_path = None if streamed else out.with_suffix(".csv")
    if out.suffix.lower() != ".png" and not streamed:
        raise UserError(f"--out {out}: give a file name ending in .png (the CSV of the values is "
                        "written beside it, with .csv). Nothing was written.")
    check_output([out] + ([csv_path] if csv_path else []), force=force)
    with resource_guard(f"drawing {run_dir}"):
        cfg, task, model = load_run_model(run_dir, checkpoint, data_dir)
        try:
            encoder, emb, tokens = task.visualization_inputs(model, text)
        except NotImplementedError as e:
            raise UserError(str(e)) from None
        check_text(len(tokens))
        if not 0 <= layer < encoder.num_layers:
            raise UserError(f"--layer must be in 1..{encoder.num_layers} for this run (1 = the "
                            f"layer that reads the embeddings), got {layer + 1}")
        with torch.no_grad():
            visualize(encoder, emb.detach(), tokens, out, layer=layer, csv_path=csv_path,
                      csv=csv_path is not None)
    return out, csv_path
