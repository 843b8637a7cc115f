"""What a run or a measurement ran on (:mod:`lstmablate.io`): :func:`environment`, the record of
versions, git commit, machine, device, threads and command line that ``env.json`` and the
benchmarks keep.  Only the standard library is imported at start-up (PyTorch where the record
is made).
"""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

def git_commit() -> dict[str, Any]:
    """The commit of the lstmablate checkout this code runs from, if any."""
    here = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True,
                                text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
    return {"commit": commit or None, "dirty": bool(dirty) if commit else None}


def processor_name() -> str:
    """The CPU model (``/proc/cpuinfo``'s model name where there is one)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def package_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def environment(device: Any = "cpu", threads: int | None = None,
                argv: list[str] | None = None) -> dict[str, Any]:
    """Versions, git commit, machine (processor, cores), device, threads, command line and start
    time: what ``env.json`` records for a run and the benchmarks for their numbers."""
    import torch

    device = torch.device(device)
    env = {
        "lstmablate": package_version("lstmablate"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": package_version("numpy"),
        "triton": package_version("triton"),
        "platform": platform.platform(),
        "processor": processor_name(),
        "cpus": os.cpu_count(),
        "hostname": socket.gethostname(),
        "device": str(device),
        "threads": threads if threads is not None else torch.get_num_threads(),
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "command": [Path(sys.argv[0]).name, *sys.argv[1:]] if argv is None else argv,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "git": git_commit(),
    }
    if device.type == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(device)
        env["gpu"] = torch.cuda.get_device_name(device)
        env["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
    return env
