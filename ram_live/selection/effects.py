"""What a candidate does, known before or after merging it: its effect (to merge equal candidates once) and how
far it extrapolates an agent's task vector."""

from __future__ import annotations

import json
import math
from typing import Any

from ..methods import RAM_METHODS, make_config
from ..methods.ram.lambdas import lambda_bound, lambdas_from_counts
from .target import Merger

__all__ = ["effect_key", "extrapolation_of"]


def effect_key(candidate: dict[str, Any], merger: Merger) -> str | None:
    """What a global-λ RAM-family merge does, where known before merging: the activity rule, the excluded
    agents, λ of each agent with unique entries (λ of the others scales nothing) and the shared rule. Two
    candidates with the same effect give the same bits (plain RAM is λ = 1 bit for bit), so the second is not
    merged again."""
    method = candidate["method"]
    if method not in RAM_METHODS or candidate.get("importance") is not None:
        return None  # importance-weighted merges: equal effects are not known before merging
    config = make_config(method, **merger.options_of(candidate))
    if getattr(config, "rho_scope", "global") != "global":
        return None
    key = merger.count_key(candidate, config)  # (activity, exclude[, an adapter search's sparsifying rule])
    activity, exclude = key[0], key[1]
    names = [a for a in merger.names if a not in exclude]
    counts = merger.statistics.get(key)
    given = getattr(config.lam, "lambdas", None)
    if given is not None:
        if set(given) != set(names):
            return None  # the merge says what is wrong
        lam: list[float | None] = [given[a] for a in names]
    elif not config.lam.uses_rho:
        lam = [1.0] * len(names)
    elif counts is not None:
        lam = list(lambdas_from_counts(config, counts.active, counts.unique))
    else:
        return None
    if counts is not None and tuple(counts.agents) == tuple(names):
        lam = [v if u > 0 else None for v, u in zip(lam, counts.unique.tolist())]
    eps = activity.eps if activity.rule == "abs" else 0.0
    return json.dumps(["effect", activity.rule, eps, list(exclude), lam, config.shared, *key[2:]])


def extrapolation_of(candidate: dict[str, Any], info: Any, merger: Merger) -> tuple[float, dict[str, float] | None]:
    method = candidate["method"]
    config = make_config(method, **merger.options_of(candidate))
    if method in RAM_METHODS:
        if info.lambdas is None:
            bound = lambda_bound(config)
            return (bound if math.isfinite(bound) else math.nan), None
        lambdas = dict(info.lambdas)
        counts = info.statistics or merger.counts_of({k: v for k, v in candidate.items() if k != "exclude"})
        values = list(lambdas.values())
        if counts is not None and tuple(counts.agents) == tuple(info.agents):
            values = [lambdas[a] for a, u in zip(info.agents, counts.unique.tolist()) if u > 0]
        return max([abs(v) for v in values], default=1.0), lambdas
    weights = list(getattr(config, "weights", None) or [1.0] * len(merger.names))
    if method == "linear" and getattr(config, "normalize", True):
        total = sum(weights)
        weights = [w / total for w in weights]
    return abs(getattr(config, "scale", 1.0)) * max(abs(w) for w in weights), None
