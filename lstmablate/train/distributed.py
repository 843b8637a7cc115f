"""Data-parallel training under ``torchrun`` (DistributedDataParallel).

``torchrun --nproc-per-node N -m lstmablate train ...`` starts N processes with
``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` set; :func:`setup` joins them into a
process group (gloo on CPU, NCCL on GPU).  Every rank reads the same global
batch (the data order is fixed by the seed) and keeps its slice of it
(:func:`shard_batch`); the loss of each slice is rescaled by its share of the
global weight (e.g. tokens) so that DDP's gradient average equals the gradient
of the single-process loss on the global batch.  Only rank 0 writes files.

Multi-node: run the same torchrun command on every node with
``--nnodes M --node-rank R --rdzv-endpoint HOST:PORT`` (see the README).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def from_env() -> DistInfo:
    """What torchrun set in the environment (a single process otherwise)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo()
    return DistInfo(int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0")))


def setup(device: torch.device) -> DistInfo:
    """Join the process group if launched by torchrun; returns this process's place."""
    info = from_env()
    if info.enabled and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(info.local_rank)
        dist.init_process_group(backend=backend)
    return info


def device_for(device: torch.device, info: DistInfo) -> torch.device:
    """One GPU per local rank under torchrun."""
    if device.type == "cuda" and info.enabled:
        return torch.device("cuda", info.local_rank)
    return device


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def all_reduce_sum(value: float, info: DistInfo, device: torch.device) -> float:
    if not info.enabled:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return float(t.item())


def cleanup(info: DistInfo, finished: bool = True) -> None:
    """Leave the process group before the process ends (what PyTorch asks of every program:
    a group still alive at interpreter exit can abort the process from gloo's or NCCL's
    worker threads).  ``finished``: every rank got here, so wait for the others first; after
    an error, leave at once (another rank may never arrive)."""
    if info.enabled and dist.is_initialized():
        if finished:
            dist.barrier()
        dist.destroy_process_group()
