"""How checkpoint code agrees across ranks: one rank's error reaches every rank, so all leave together or none
does, and no rank is left waiting in a collective. Without a process group (one process) none of them communicates."""
from __future__ import annotations

import torch.distributed as dist

from .files import CheckpointError


def _world() -> tuple[int, int]:
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _all_gather(obj) -> list:
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def _from_rank0(obj):
    if dist.is_initialized() and dist.get_world_size() > 1:
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        obj = box[0]
    return obj


def _raise_first(errors: list[str | None]) -> None:
    for rank, err in enumerate(errors):
        if err is not None:
            raise CheckpointError(err if len(errors) == 1 else f"{err} (rank {rank})")


def _agree(error: str | None) -> None:
    """Collective: raise the first failing rank's error on every rank, so all leave together or none does."""
    _raise_first(_all_gather(error))
