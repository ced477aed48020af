"""torch.distributed: split a merge across ranks, or merge DTensor-sharded models shard by shard.

Two modes, chosen by the inputs:

- **split** (checkpoints on disk, state dicts): every rank sees the same inputs; tensors are assigned to ranks
  (largest first, to the least loaded rank: every rank computes the same assignment, no communication); each
  rank runs the statistics pass on its tensors, RAM+'s counts are all-reduced (so λ is the same everywhere) and
  each rank merges and writes its own shards; rank 0 writes the index. The result equals the single-process
  merge bit for bit.
- **sharded** (live modules whose parameters are DTensors, e.g. FSDP2): each rank merges its local shards in
  place; only the counts are all-reduced. Nothing is gathered.

Errors on any rank reach every rank (a flag is all-reduced at each phase), so no rank hangs in a collective.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any, Mapping

import torch

from .dtensor import counts_here, is_dtensor, local_tensor  # noqa: F401 - their import path before dtensor.py
from ..errors import RamLiveError
from ..types import Plan, RamStatistics, TensorSpec

__all__ = ["Distributed", "RemoteRankError", "is_dtensor"]


class RemoteRankError(RamLiveError):
    """Another rank of the process group failed; its own error is raised there."""


@dataclass
class Distributed:
    """A process group and this rank's place in it."""

    group: Any = None
    sharded: bool = False

    def __post_init__(self) -> None:
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise RamLiveError("process_group given but torch.distributed is not initialised (init_process_group)")
        self._dist = dist
        self.rank = dist.get_rank(self.group)
        self.world = dist.get_world_size(self.group)
        backend = dist.get_backend(self.group)
        self.device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")

    # ------------------------------------------------------------------------------------------- assignment

    def owners(self, plan: Plan, specs: Mapping[str, TensorSpec]) -> dict[str, int]:
        """Which rank merges each key (split mode): largest tensors first, each to the least-loaded rank."""
        load = [0] * self.world
        owner: dict[str, int] = {}
        for key in sorted(plan.merge, key=lambda k: (-specs[k].numel * specs[k].dtype.itemsize, plan.merge.index(k))):
            rank = min(range(self.world), key=lambda r: (load[r], r))
            owner[key] = rank
            load[rank] += specs[key].numel * specs[key].dtype.itemsize
        for key in plan.copy:
            owner[key] = 0
        for alias, canonical in plan.alias.items():
            owner[alias] = owner.get(canonical, 0)
        return owner

    def local_plan(self, plan: Plan, owner: Mapping[str, int]) -> Plan:
        mine = lambda keys: tuple(k for k in keys if owner[k] == self.rank)  # noqa: E731
        return replace(
            plan,
            merge=mine(plan.merge),
            copy=mine(plan.copy),
            alias={a: c for a, c in plan.alias.items() if owner[a] == self.rank},
            check_equal=mine(plan.check_equal),
        )

    # ------------------------------------------------------------------------------------------- collectives

    def all_ok(self, ok: bool) -> bool:
        flag = torch.tensor([0 if ok else 1], dtype=torch.int64, device=self.device)
        self._dist.all_reduce(flag, group=self.group)
        return int(flag.item()) == 0

    def reduce_statistics(self, stats: RamStatistics | None, k: int) -> RamStatistics:
        """Sum the counts over ranks; raises on every rank if any rank failed (``stats is None``)."""
        packed = torch.zeros(2 * k + (k + 1) + 1, dtype=torch.int64, device=self.device)
        if stats is None:
            packed[-1] = 1
        else:
            packed[:k] = stats.active
            packed[k : 2 * k] = stats.unique
            packed[2 * k : 3 * k + 1] = stats.histogram
        self._dist.all_reduce(packed, group=self.group)
        packed = packed.cpu()
        if int(packed[-1]):
            raise RemoteRankError(f"rank {self.rank}: another rank failed in the statistics pass (see its error)")
        return RamStatistics(packed[:k].clone(), packed[k : 2 * k].clone(), packed[2 * k : 3 * k + 1].clone())

    def shared_token(self) -> str:
        """A random name agreed by all ranks (rank 0 draws it; a broadcast tensor, no pickling)."""
        token = torch.zeros(1, dtype=torch.int64, device=self.device)
        if self.rank == 0:
            token[0] = int.from_bytes(os.urandom(7), "little")
        self._dist.broadcast(
            token, src=self._dist.get_global_rank(self.group, 0) if self.group else 0, group=self.group
        )
        return f"{int(token.item()):x}"

    def barrier(self) -> None:
        if self.device.type == "cuda":
            self._dist.barrier(group=self.group, device_ids=[self.device.index])
        else:
            self._dist.barrier(group=self.group)
