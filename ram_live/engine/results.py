"""What a merge reports and what it may reuse: λ and ρ per agent in :class:`~ram_live.types.MergeInfo`, and the
checks on counts passed in with ``statistics=``."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from torch import Tensor

from .. import functional as F
from ..errors import ConfigError
from ..ram_config import Given
from ..types import Activity, MergeInfo, RamStatistics

__all__ = ["record_lambdas", "check_reusable", "stamped"]


def record_lambdas(info: MergeInfo, run_state: Any) -> None:
    """λ and ρ per agent in ``info`` where the run state is one λ per agent computed from counts."""
    statistics, names = info.statistics, info.agents
    given = isinstance(getattr(info.config, "lam", None), Given)  # λ given per agent, no counts
    if isinstance(run_state, Tensor) and (statistics is not None or given) and run_state.numel() == len(names):
        info.lambdas = dict(zip(names, map(float, run_state.tolist())))
    if info.lambdas is not None and statistics is not None:
        info.rho = {
            n: F.rho(float(u), float(a))
            for n, a, u in zip(names, statistics.active.tolist(), statistics.unique.tolist())
        }


def stamped(statistics: RamStatistics, names: tuple[str, ...], activity: Activity, numel: int,
            digest: Any) -> RamStatistics:
    """``statistics`` stamped with what they were counted over (see :class:`~ram_live.types.RamStatistics`)."""
    return replace(statistics, agents=names, activity=activity, numel=numel, fingerprint=digest.hexdigest())


def check_reusable(statistics: RamStatistics, names: tuple[str, ...], activity: Activity,
                   numel: int) -> RamStatistics:
    """``statistics`` if they were counted over these agents, with this activity rule, over ``numel`` entries."""
    if not isinstance(statistics, RamStatistics):
        raise ConfigError(f"statistics= takes RamStatistics (MergeInfo.statistics or ProbeReport.statistics()), "
                          f"got {type(statistics).__name__}")
    if statistics.agents != names:
        raise ConfigError(f"statistics= were counted for agents {list(statistics.agents)}, this merge has "
                          f"{list(names)}")
    if statistics.activity != activity:
        raise ConfigError(f"statistics= were counted with {statistics.activity}, this merge uses {activity}")
    if statistics.numel != numel:
        raise ConfigError(f"statistics= were counted over {statistics.numel:,} entries, this merge has {numel:,} "
                          "(another model, or other tensors)")
    return statistics
