"""How many CPU threads a command computes on when ``--threads`` is not given, and how its
idle threads wait: one rule for ``train``, ``sweep``, ``bench`` and ``make demo``.

PyTorch's default is a thread per core, and its OpenMP threads *spin* while they wait for
work.  On a machine other processes keep busy (a laptop with a browser open, a shared
server) that is ruinous: the spinning threads hold cores the others need, and the work
waits for cores the spinners hold.  Measured with the Dyck demo (five tiny runs) on a
2-core AMD EPYC already running two busy processes: 256 s at 2 spinning threads, 16 s at
1 thread, 19 s at 2 passive threads (docs/results/dyck.md, "How long it takes").

So:

* **the thread count** is the cores this process may use (its CPU affinity, which a
  container or ``taskset`` narrows) less the machine's load (the one-minute load average:
  processes running or waiting for a core), rounded, at least one -- :func:`default_threads`,
  a pure function of the two, and :func:`choose_threads`, which reads them;
* **idle threads sleep** (``OMP_WAIT_POLICY=passive``) instead of spinning, in the command's
  own process and in every process it starts (:func:`passive_waiting`); it must be in the
  environment before PyTorch is imported, because the OpenMP runtime reads it when it loads.

A user's own setting wins: ``--threads N``, ``OMP_NUM_THREADS`` (PyTorch reads it) and
``OMP_WAIT_POLICY`` are left as they are.

A leaf module: no PyTorch (it runs before PyTorch is imported), nothing of the toolkit's.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass

#: the environment variable of OpenMP's waiting policy, and the value the toolkit sets
WAIT_POLICY = "OMP_WAIT_POLICY"
PASSIVE = "passive"


def default_threads(cores: int, load: float | None) -> int:
    """The threads a CPU process starts with: the ``cores`` it may use less the ``load``
    (processes already running or waiting for a core), rounded half up, between 1 and
    ``cores``; all ``cores`` when the load is unknown (None)."""
    cores = max(1, int(cores))
    if load is None or load != load:  # (NaN: unknown too)
        return cores
    free = cores - max(0.0, float(load))
    return max(1, min(cores, int(free + 0.5)))


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity; all of the machine's where the
    system does not say)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # (macOS, Windows: no affinity)
        return os.cpu_count() or 1


def machine_load() -> float | None:
    """The one-minute load average (None where the system has none)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


@dataclass(frozen=True)
class ThreadChoice:
    """The threads a command computes on, and why."""

    threads: int | None  # None: PyTorch's own (the user set OMP_NUM_THREADS)
    cores: int  # the cores this process may use
    load: float | None  # the load average the default was chosen from (None: not chosen so)
    source: str  # "--threads", "OMP_NUM_THREADS" or "default"

    @property
    def reason(self) -> str:
        """Why this many: ``2 cores, load 1.9`` (the default), ``--threads``,
        ``OMP_NUM_THREADS``."""
        if self.source != "default":
            return self.source
        seen = f"load {self.load:.1f}" if self.load is not None else "load unknown"
        return f"{self.cores} cores, {seen}"


def choose_threads(threads: int | None = None, *, environ: Mapping[str, str] | None = None,
                   cores: int | None = None, load: float | None = None) -> ThreadChoice:
    """The thread count of a command: ``threads`` if given, PyTorch's own if the user set
    ``OMP_NUM_THREADS``, else :func:`default_threads` of this machine now (of ``cores`` and
    ``load`` where they are given)."""
    env = os.environ if environ is None else environ
    cores = usable_cores() if cores is None else cores
    if threads is not None:  # (checked by its reader: limits.check_threads)
        return ThreadChoice(threads, cores, None, "--threads")
    if env.get("OMP_NUM_THREADS", "").strip():
        return ThreadChoice(None, cores, None, "OMP_NUM_THREADS")
    load = machine_load() if load is None else load
    return ThreadChoice(default_threads(cores, load), cores, load, "default")


def passive_waiting(environ: MutableMapping[str, str] | None = None) -> MutableMapping[str, str]:
    """``environ`` (default: this process's ``os.environ``) with ``OMP_WAIT_POLICY=passive``
    unless it names a policy already; returned for a child's ``env=``."""
    env = os.environ if environ is None else environ
    if not env.get(WAIT_POLICY, "").strip():
        env[WAIT_POLICY] = PASSIVE
    return env
