"""The few collective operations the store needs, for one process or over ``torch.distributed``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Protocol

import torch
from torch import Tensor


class Collective(Protocol):
    """The few collective operations the store and the schedule need (all ranks call each one together)."""

    rank: int
    world_size: int

    def barrier(self) -> None: ...

    def all_gather_int64(self, values: Sequence[int]) -> list[list[int]]: ...

    def all_reduce_sum_(self, tensor: Tensor) -> Tensor: ...

    def broadcast_json(self, obj: Any) -> Any: ...


class LocalCollective:
    """One process: every collective is the identity."""

    rank = 0
    world_size = 1

    def barrier(self) -> None:
        pass

    def all_gather_int64(self, values: Sequence[int]) -> list[list[int]]:
        return [list(values)]

    def all_reduce_sum_(self, tensor: Tensor) -> Tensor:
        return tensor

    def broadcast_json(self, obj: Any) -> Any:
        return json.loads(json.dumps(obj))


class TorchCollective:
    """``torch.distributed``'s default group (gloo tensors on CPU, NCCL tensors on the current CUDA device).

    Objects travel as JSON bytes in uint8 tensors (``broadcast_object_list`` would pickle)."""

    def __init__(self, group: Any = None) -> None:
        import torch.distributed as dist

        self._dist = dist
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        backend = str(dist.get_backend(group))
        if "nccl" in backend and torch.cuda.is_available():
            self.device = torch.device("cuda", torch.cuda.current_device())
        else:
            self.device = torch.device("cpu")

    def barrier(self) -> None:
        if self.device.type == "cuda":
            self._dist.barrier(group=self.group, device_ids=[self.device.index])
        else:
            self._dist.barrier(group=self.group)

    def all_gather_int64(self, values: Sequence[int]) -> list[list[int]]:
        local = torch.tensor(list(values), dtype=torch.int64, device=self.device)
        out = [torch.empty_like(local) for _ in range(self.world_size)]
        self._dist.all_gather(out, local, group=self.group)
        return [o.tolist() for o in out]

    def all_reduce_sum_(self, tensor: Tensor) -> Tensor:
        moved = tensor.to(self.device)
        self._dist.all_reduce(moved, group=self.group)
        if moved is not tensor:
            tensor.copy_(moved)
        return tensor

    def broadcast_json(self, obj: Any) -> Any:
        payload = json.dumps(obj).encode() if self.rank == 0 else b""
        size = torch.tensor([len(payload)], dtype=torch.int64, device=self.device)
        self._dist.broadcast(size, src=0, group=self.group)
        buf = torch.zeros(int(size.item()), dtype=torch.uint8, device=self.device)
        if self.rank == 0 and payload:
            buf.copy_(torch.frombuffer(bytearray(payload), dtype=torch.uint8))
        self._dist.broadcast(buf, src=0, group=self.group)
        return json.loads(bytes(buf.cpu().tolist()).decode())


def default_collective() -> Collective:
    """:class:`TorchCollective` when ``torch.distributed`` is initialised with more than one rank, else local."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return TorchCollective()
    return LocalCollective()
