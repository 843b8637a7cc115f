"""The benchmarks' options, checked before anything is measured.

``lstmablate bench`` (and the library functions behind it) take cell names, a device, a thread
count, numbers of timed rounds and shapes.  Each is checked here, or by :func:`parse_shape
<lstmablate.bench.cells.parse_shape>` for a shape, before the first tensor is allocated: a
value out of range is a one-paragraph :class:`~lstmablate.errors.UserError` naming the option
and what it accepts, never a traceback minutes into a run or an OpenMP crash.  The device and
thread checks are those ``train`` and ``eval`` use (:func:`lstmablate.run.runner.pick_device`,
:func:`lstmablate.limits.check_threads`).
"""

from __future__ import annotations

import os

import torch

from lstmablate.cells import get_cell
from lstmablate.errors import ConfigError, UnknownNameError
from lstmablate.limits import check_int, check_threads
from lstmablate.run.runner import pick_device

#: the most timed rounds of a row: the median of 10,000 rounds is as steady as it gets, and
#: each round is at least one forward and backward pass (more only makes a run last days)
MAX_REPEATS = 10_000


def check_repeats(n: int, option: str) -> int:
    """A number of timed rounds (``--repeats``, ``--model-repeats``) in 1..MAX_REPEATS."""
    return check_int(n, option, 1, MAX_REPEATS, "(The median of the rounds is reported.)")


def check_bench_threads(threads: int) -> None:
    """``--threads`` of a benchmark: 1..limits.max_threads() (far more crashes OpenMP); left
    out, ``lstmablate bench`` runs on the threads every command takes by default
    (:func:`lstmablate.threads.choose_threads`: the cores less the machine's load)."""
    check_threads(threads, default="the default (the cores less the machine's load; the "
                                   "targets are stated for 2 threads)")


def check_device(device: str | torch.device) -> torch.device:
    """The device ``--device`` names, as ``train`` checks it (cpu, cuda, cuda:N or auto)."""
    return pick_device(str(device))


def check_cells(cells: list[str] | None) -> list[str]:
    """The registered cells ``--cell`` names (each once, in order); an unknown name is a
    ConfigError with the closest name and every choice.  None or empty: an empty list (each
    benchmark has its own default cells)."""
    for name in cells or []:
        try:
            get_cell(name)
        except UnknownNameError as e:
            raise ConfigError(f"--cell: {e}") from None
    return list(dict.fromkeys(cells or []))


def available_bytes(device: torch.device) -> int | None:
    """Bytes of memory free on ``device``: on CUDA the GPU's free memory, on CPU the memory the
    system can give without swapping (Linux's MemAvailable, else the physical memory); None
    where the system does not say."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def check_fits(need: int, option: str, device: torch.device, what: str, lower: str) -> None:
    """A ConfigError naming ``option`` when the ``need`` bytes (at least: ``what``) are more
    than ``device`` has free, before any of them is allocated; ``lower`` says what to make
    smaller.  What is tighter than this estimate is caught when it runs out
    (:func:`lstmablate.run.runner.resource_guard`)."""
    free = available_bytes(device)
    if free is not None and need > free:
        raise ConfigError(f"{option} needs at least {need / 2**30:,.1f} GiB ({what}), but "
                          f"{device} has {free / 2**30:,.1f} GiB free; use {lower}.")
