"""``lstmablate bench``: the cells' (and the PTB model's) speed and memory against
torch.nn.LSTM in one process, or the cells' own reference implementations beside ours."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from ..console import err, escape, out
from ..errors import UserError
from .options import DEVICE_HELP, THREADS_HELP


def bench(
    cells: Optional[list[str]] = typer.Option(None, "--cell", metavar="CELL",
                                              help="Only these cells (repeatable)."),
    shapes: Optional[list[str]] = typer.Option(None, "--shape", metavar="SHAPE",
                                               help="ptb-200, ptb-650, parser-400 or BxTxHxL\\[xbi] "
                                                    "(repeatable)."),
    threads: Optional[int] = typer.Option(None, "--threads", metavar="N",
                                          help=THREADS_HELP + " The CPU targets are stated for 2."),
    device: str = typer.Option("cpu", "--device", metavar="DEVICE", help=DEVICE_HELP),
    repeats: int = typer.Option(7, "--repeats", metavar="N",
                                help="Timed repetitions per cell row (the median is reported)."),
    model_repeats: int = typer.Option(20, "--model-repeats", metavar="N",
                                      help="Timed repetitions per training-step row."),
    quick: bool = typer.Option(False, "--quick", help="Seconds, not minutes: the paper's five "
                               "cells at ptb-200, 3 rounds, no training-step rows (--cell, "
                               "--all-cells, --shape and --models add to it)."),
    all_cells: bool = typer.Option(False, "--all-cells", help="Every registered cell (the default "
                                   "without --quick)."),
    models: Optional[bool] = typer.Option(None, "--models/--no-models",
                                          help="Also PTB training tokens/s (default: yes; with "
                                               "--quick only if --model-size is given)."),
    model_sizes: Optional[list[str]] = typer.Option(
        None, "--model-size", metavar="SIZE",
        help="PTB model sizes for --models: small (default), medium, large (repeatable)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of the table."),
    out_file: Optional[Path] = typer.Option(
        None, "--out", metavar="FILE.json", help="Also keep the run as a record: the rows, the "
        "machine's matmul rate before and after, the environment (JSON), and the tables as "
        "Markdown beside it."),
    force: bool = typer.Option(False, "--force", help="Replace FILE.json and its Markdown if "
                               "they exist."),
    peers: bool = typer.Option(False, "--peers", help="Instead: the cells' own reference "
                               "implementations (the authors' sru, flashrnn, "
                               "flash-linear-attention's HGRN) beside ours and nn.LSTM, one layer "
                               "at each shape; a package not installed is a row naming it."),
) -> None:
    """Forward+backward tokens/s and memory per cell against torch.nn.LSTM, same process.

    Examples:

    lstmablate bench --quick
    lstmablate bench --quick --cell lstm-srnn --shape ptb-650
    lstmablate bench --model-size small --model-size medium --device cuda --json
    lstmablate bench --threads 2 --out benchmarks/results/cpu-2t.json
    lstmablate bench --peers --shape ptb-650 --device cuda
    """
    import torch

    from .. import bench as b
    from ..bench.render import WIDTH, busy_note
    from ..threads import choose_threads, machine_load

    if model_sizes and models is False:
        raise UserError("--model-size chooses the sizes of the model benchmark, which "
                        "--no-models leaves out; give one or the other.")
    if all_cells and cells:
        raise UserError("--all-cells times every registered cell and --cell names some; give "
                        "one or the other.")
    models = models if models is not None else (not quick or bool(model_sizes))
    if quick and not cells and not all_cells:
        from ..bench.gpu_check import paper_cells

        cells = paper_cells()
    if quick and not shapes:
        shapes = ["ptb-200"]
    chosen = choose_threads(threads)
    if chosen.threads is not None:
        threads = chosen.threads
    else:  # the user's OMP_NUM_THREADS, as PyTorch read it
        threads = torch.get_num_threads()
    sizes = (model_sizes or ["small"]) if models else []
    b.record.check_options(cells or None, shapes or None, threads=threads, device=device,
                           repeats=repeats, quick=quick, model_sizes=sizes,
                           model_repeats=model_repeats)  # before a warning or a file
    if out_file is not None:
        from ..io import is_stream
        from ..runfolder import check_output

        companions = [] if is_stream(out_file) else [out_file.with_suffix(".md")]
        check_output([out_file, *companions], force=force)  # before any timing
    busy = busy_note(chosen.load if chosen.load is not None else machine_load(), chosen.cores)
    if busy:
        err.print(f"[yellow]warning:[/] {escape(busy)}", soft_wrap=True)
    # progress on a terminal only (a log keeps the table alone)
    note = (lambda msg: err.print(escape(msg), soft_wrap=True)) \
        if err.is_terminal and not as_json else None
    if peers:  # the reference implementations (lstmablate/bench/peers.py)
        if out_file is not None:
            raise UserError("--out keeps a cell benchmark's record; --peers prints its table "
                            "(--json for its rows).")
        from ..bench.peers import bench_peers, markdown_rows

        rows = bench_peers(shapes or None, device=device, threads=threads, repeats=repeats,
                           progress=note)
        sys.stdout.write(b.to_json(rows) + "\n" if as_json else "\n".join(markdown_rows(rows)))
        return
    rows, fields = b.record.measure(cells or None, shapes or None, threads=threads, device=device,
                                    repeats=repeats, model_repeats=model_repeats, quick=quick,
                                    model_sizes=sizes, machine_rate=out_file is not None,
                                    progress=note)
    if out_file is not None:
        written = b.record.write(out_file, rows, **fields)
        err.print(f"wrote {escape(written[0])}" + (f" and {escape(written[1])}" if written[1] else
                  " (a device or a pipe: the Markdown beside it is not written)"), soft_wrap=True)
    if as_json:
        sys.stdout.write(b.to_json(rows) + "\n")
    else:
        import io

        from rich.console import Console

        if out.is_terminal:
            Console(width=min(out.width, WIDTH), highlight=False).print(b.render(rows))
        else:  # a log or a pipe: plain text, no line padded out to the width
            text = Console(width=WIDTH, file=io.StringIO(), highlight=False, color_system=None)
            text.print(b.render(rows))
            sys.stdout.write("".join(line.rstrip() + "\n"
                                     for line in text.file.getvalue().splitlines()))
