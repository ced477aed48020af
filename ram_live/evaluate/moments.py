"""Means and stds of logged rewards that never raise on finite inputs, however large (±1e300 rewards): the values
are scaled by a power of two (exact) before they are summed or squared, and a result beyond float's range is ±inf,
not an ``OverflowError`` in a callback's logging. Non-finite inputs give NaN or ±inf as float arithmetic does."""

from __future__ import annotations

import math
from typing import Sequence

__all__ = ["mean", "std", "weighted_moments"]


def _exponent(values: Sequence[float]) -> int:
    """``e`` such that every finite value / 2**e is at most 1 in magnitude (0 when all are 0 or non-finite)."""
    largest = max((abs(v) for v in values if math.isfinite(v)), default=0.0)
    return math.frexp(largest)[1] if largest else 0


def _unscale(x: float, e: int) -> float:
    """``x * 2**e``, ±inf where that is beyond float's range."""
    try:
        return math.ldexp(x, e)
    except OverflowError:
        return math.copysign(math.inf, x)


def mean(values: Sequence[float]) -> float:
    """The mean of ``values`` (NaN for none)."""
    if not values:
        return math.nan
    e = _exponent(values)
    return _unscale(sum(math.ldexp(v, -e) for v in values) / len(values), e)


def std(values: Sequence[float], ddof: int) -> float:
    """The std of ``values`` with ``ddof`` (NaN for at most ``ddof`` values), in two passes."""
    if len(values) <= ddof:
        return math.nan
    e = _exponent(values)
    scaled = [math.ldexp(v, -e) for v in values]
    centre = sum(scaled) / len(scaled)
    return _unscale(math.sqrt(sum((v - centre) * (v - centre) for v in scaled) / (len(scaled) - ddof)), e)


def weighted_moments(probabilities: Sequence[float], values: Sequence[float]) -> tuple[float, float]:
    """The mean and std of the distribution taking ``values[i]`` with probability ``probabilities[i]``."""
    e = _exponent(values)
    scaled = [math.ldexp(v, -e) for v in values]
    centre = sum(p * v for p, v in zip(probabilities, scaled))
    spread = math.sqrt(max(0.0, sum(p * (v - centre) * (v - centre) for p, v in zip(probabilities, scaled))))
    return _unscale(centre, e), _unscale(spread, e)
