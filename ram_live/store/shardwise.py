"""Shard-wise merging: RAM's statistics pass over each process's boxes, summed over the ranks."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from .. import functional as F
from ..engine.plan import build_plan
from ..engine.stream import DEFAULT_CHUNK_NUMEL, DeltaStream
from ..methods import Activity
from ..io.sources import TensorSource
from .collective import Collective, LocalCollective


def ram_statistics(
    base: TensorSource,
    agents: Sequence[TensorSource],
    activity: Activity,
    *,
    owned: Callable[[str], bool] = lambda key: True,
    collective: Collective | None = None,
    device: torch.device | None = None,
    chunk_numel: int = DEFAULT_CHUNK_NUMEL,
    per_key: bool = False,
) -> dict[str, Any]:
    """RAM's statistics pass over the keys the merge merges (``owned(key)``: count this process's box of it),
    summed over ranks: per agent ``active``/``unique`` counts, ``total`` entries, the histogram of c, and with
    ``per_key`` the counts per tensor."""
    collective = collective or LocalCollective()
    plan = build_plan(base, agents)
    k = len(agents)
    names = tuple(a.name for a in agents)
    keys = list(plan.merge)
    counts = torch.zeros(len(keys), 2, k, dtype=torch.int64)
    histogram = torch.zeros(k + 1, dtype=torch.int64)
    totals = torch.zeros(len(keys), dtype=torch.int64)
    workspace: dict[Any, Tensor] = {}
    with torch.no_grad():
        for i, key in enumerate(keys):
            if not owned(key):
                continue
            b = base.get(key)
            dev = device or b.device
            stream = DeltaStream(
                key, b.to(dev), [a.get(key) for a in agents], names, dev, chunk_numel, activity, workspace
            )
            for _, _, deltas in stream:
                a, u, h = F.ram_statistics(deltas)
                counts[i, 0] += a.cpu()
                counts[i, 1] += u.cpu()
                histogram += h.cpu()
            totals[i] = stream.numel
    flat = torch.cat([counts.view(-1), histogram, totals])
    collective.all_reduce_sum_(flat)
    counts = flat[: counts.numel()].view(len(keys), 2, k)
    histogram = flat[counts.numel() : counts.numel() + k + 1]
    totals = flat[counts.numel() + k + 1 :]
    out: dict[str, Any] = {
        "agents": names,
        "active": counts[:, 0].sum(0),
        "unique": counts[:, 1].sum(0),
        "total": int(totals.sum()),
        "histogram": histogram,
    }
    if per_key:
        out["per_key"] = {key: (counts[i, 0], counts[i, 1]) for i, key in enumerate(keys)}
    return out
