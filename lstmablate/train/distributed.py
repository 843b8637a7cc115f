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
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor


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


def shard_batch(batch: Any, info: DistInfo) -> Any:
    """This rank's contiguous slice of every tensor in ``batch`` along dim 0.

    Tensors whose first dimension is the batch size are split into
    ``world_size`` near-equal parts; anything else is passed through.
    Tasks whose batches are laid out differently override ``Task.shard``.
    """
    if not info.enabled:
        return batch
    size = _batch_size(batch)
    if size is None:
        return batch
    if size < info.world_size:
        raise ValueError(f"a batch of {size} cannot be split over {info.world_size} processes")
    bounds = [size * r // info.world_size for r in range(info.world_size + 1)]
    lo, hi = bounds[info.rank], bounds[info.rank + 1]

    def cut(x: Any) -> Any:
        if isinstance(x, Tensor) and x.dim() > 0 and x.shape[0] == size:
            return x[lo:hi]
        if isinstance(x, (list, tuple)):
            return type(x)(cut(v) for v in x)
        if isinstance(x, dict):
            return {k: cut(v) for k, v in x.items()}
        return x

    return cut(batch)


def _batch_size(batch: Any) -> int | None:
    if isinstance(batch, Tensor):
        return batch.shape[0] if batch.dim() else None
    if isinstance(batch, (list, tuple)):
        for b in batch:
            n = _batch_size(b)
            if n is not None:
                return n
    if isinstance(batch, dict):
        for b in batch.values():
            n = _batch_size(b)
            if n is not None:
                return n
    return None


def cleanup(info: DistInfo) -> None:
    if info.enabled and dist.is_initialized():
        dist.destroy_process_group()
