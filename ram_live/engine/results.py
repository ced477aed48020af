"""What a merge may reuse: counts stamped with what they were counted over, and the checks on counts passed in
with ``statistics=``."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..errors import ConfigError
from ..types import Activity, RamStatistics

__all__ = ["check_reusable", "stamped"]


def stamped(
    statistics: RamStatistics, names: tuple[str, ...], activity: Activity, numel: int, digest: Any
) -> RamStatistics:
    """``statistics`` stamped with what they were counted over (see :class:`~ram_live.types.RamStatistics`)."""
    return replace(statistics, agents=names, activity=activity, numel=numel, fingerprint=digest.hexdigest())


def check_reusable(statistics: RamStatistics, names: tuple[str, ...], activity: Activity, numel: int) -> RamStatistics:
    """``statistics`` if they were counted over these agents, with this activity rule, over ``numel`` entries."""
    if not isinstance(statistics, RamStatistics):
        raise ConfigError(
            f"statistics= takes RamStatistics (MergeInfo.statistics or ProbeReport.statistics()), "
            f"got {type(statistics).__name__}"
        )
    if statistics.agents != names:
        raise ConfigError(
            f"statistics= were counted for agents {list(statistics.agents)}, this merge has {list(names)}"
        )
    if statistics.activity != activity:
        raise ConfigError(f"statistics= were counted with {statistics.activity}, this merge uses {activity}")
    if statistics.numel != numel:
        raise ConfigError(
            f"statistics= were counted over {statistics.numel:,} entries, this merge has {numel:,} "
            "(another model, or other tensors)"
        )
    return statistics
