"""DTensor (FSDP2, tensor-parallel) helpers that never import ``torch.distributed.tensor`` themselves.

Sources, sinks and the distributed merge use them to work on this rank's local shard.

>>> is_dtensor(torch.zeros(2))                                # doctest: +SKIP
False
"""

from __future__ import annotations

import sys
from typing import Any

from torch import Tensor

__all__ = ["is_dtensor", "local_tensor", "counts_here"]


def is_dtensor(t: Any) -> bool:
    """Whether ``t`` is a DTensor, without importing ``torch.distributed.tensor`` (~0.8 s): no DTensor exists
    before that module is imported."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(t, module.DTensor)


def local_tensor(t: Tensor) -> Tensor:
    """The local shard of a DTensor (a view, writable in place), or the tensor itself."""
    return t.to_local() if is_dtensor(t) else t


def counts_here(t: Any) -> bool:
    """Whether this rank's shard of ``t`` counts in global statistics: DTensors replicated over a mesh dimension
    count only on coordinate 0 of that dimension, so every element is counted once."""
    if not is_dtensor(t):
        return True
    from torch.distributed.tensor import Replicate

    coordinate = t.device_mesh.get_coordinate()
    return all(not isinstance(p, Replicate) or c == 0 for p, c in zip(t.placements, coordinate or []))
