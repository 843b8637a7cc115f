"""One measured run, kept as a record: the cell and model rows, the machine's matrix-multiply
rate before and after (a busy machine shows there), the environment with the load before and
after and the dispatch choices made — as JSON, and the same tables as Markdown beside it
(what docs/results/speed.md and the other results pages quote)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lstmablate import io

from .cells import bench_cells, cell_shapes
from .measure import environment, machine_gflops
from .models import bench_models, check_model_sizes
from .options import check_bench_threads, check_cells, check_device, check_repeats
from .render import to_json, to_markdown


def check_options(cells: list[str] | None, shapes: list[str] | None, *, threads: int, device: str,
                  repeats: int, quick: bool, model_sizes: list[str],
                  model_repeats: int = 20) -> str:
    """Every option of :func:`measure` checked at once, before anything is measured (the
    benchmarks check their own again: they are library functions too), so that a bad
    ``--model-size`` is not found after the cell rows took minutes.  Returns the device's
    name (``auto`` resolved)."""
    dev = check_device(device)
    check_bench_threads(threads)
    check_repeats(repeats, "--repeats")
    check_repeats(model_repeats, "--model-repeats")
    check_cells(cells)
    cell_shapes(shapes, dev, quick)
    check_model_sizes(model_sizes)
    return str(dev)


def measure(cells: list[str] | None, shapes: list[str] | None, *, threads: int, device: str,
            repeats: int, quick: bool, model_sizes: list[str], model_repeats: int = 20,
            machine_rate: bool = True,
            progress: Callable[[str], None] | None = None) -> tuple[list[dict], dict[str, Any]]:
    """The rows of every benchmark asked for, and the record's other fields (the matmul rate
    before and after only with ``machine_rate``: it takes seconds).  The options are checked
    first (:func:`check_options`)."""
    device = check_options(cells, shapes, threads=threads, device=device, repeats=repeats,
                           quick=quick, model_sizes=model_sizes, model_repeats=model_repeats)
    env = environment(threads, device)
    env["load_average_before"] = env.pop("load_average", None)
    t0 = time.time()
    peak = machine_gflops(threads, device, n=2048) if machine_rate else None
    rows = bench_cells(cells, shapes, threads=threads, device=device, repeats=repeats,
                       quick=quick, progress=progress)
    for size in model_sizes:
        rows += bench_models(cells, threads=threads, device=device, repeats=model_repeats,
                             quick=quick, size=size, progress=progress)
    peak_after = machine_gflops(threads, device, n=2048) if machine_rate else None
    try:
        env["load_average_after"] = os.getloadavg()
    except (AttributeError, OSError):
        pass
    env["dispatch"] = environment(threads, device)["dispatch"]  # the choices made meanwhile
    env["seconds"] = round(time.time() - t0, 1)
    env["command"] = " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])
    return rows, {"environment": env, "machine_gflops": [peak, peak_after]}


def write(path: str | os.PathLike, rows: list[dict], **fields: Any) -> tuple[Path, Path | None]:
    """``path`` (JSON: the rows and ``fields``) and its Markdown tables beside it, by the output
    rule (:func:`lstmablate.io.atomic_write`); ``path`` a device or a pipe receives the JSON
    alone (the Markdown path returned is None)."""
    path = Path(path)
    md = None if io.is_stream(path) else path.with_suffix(".md")
    io.check_can_write(path, *([md] if md else []))
    io.atomic_write_text(path, to_json(rows, **fields) + "\n")
    if md is not None:
        io.atomic_write_text(md, to_markdown(rows) + "\n")
    return path, md
