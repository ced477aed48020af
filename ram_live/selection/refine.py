"""Refinement moves beyond :mod:`ram_live.selection.moves`: RAM's joint ascent on per-agent λ and per-agent weights
in the shared mean (``shared_weights``), and local density × scale steps around a TIES/DARE grid's best.

A per-agent weight in the shared mean is a per-agent constant importance (docs/curvature.md): on an entry that two
or more agents changed, τ* = Σ w_t τ_t / Σ w_t over the active agents. A candidate says it as
``importance={"coder": 1.0, "tools": 0.2, ...}``; all weights equal is plain RAM (bit for bit), so such a
candidate leaves ``importance`` out.
"""

from __future__ import annotations

import math
import numbers
import random
from collections.abc import Mapping
from typing import Any, Callable, Sequence

from ..methods import make_config
from ..option_checks import FLOAT32_MAX
from .result import Trial
from .space import LOCAL_STEPS, Family, arm_of

__all__ = ["Refinements", "WEIGHT_STEP", "coordinate_ascent"]

#: The shared weights' first step, relative to the family's step (λ's).
WEIGHT_STEP = 0.5


class Refinements:
    """Mixed into the search loop next to :class:`~ram_live.selection.moves.Moves`."""

    merger: Any
    seed: int
    history: list[Trial]

    def trial(self, candidate: dict[str, Any]) -> Trial | None:
        raise NotImplementedError

    def _shared_weights(self, family: Family) -> None:
        """Coordinate ascent on λ (unique entries) and the weight in the shared mean of each agent, from the best
        RAM-side candidate so far (weights start at its numeric ``importance`` if it has one, else 1): λ first,
        then the weights, each group in an order drawn from the seed; a weight's step is ``WEIGHT_STEP`` × λ's."""
        start = self._ram_start()  # type: ignore[attr-defined]
        if start is None or start.lambdas is None:
            return
        common = self._common(start)  # type: ignore[attr-defined]
        names = list(start.lambdas)
        counts = self.merger.counts_of({"method": "ram", **{k: v for k, v in common.items() if k != "exclude"}})
        movable = names
        if counts is not None and not common.get("exclude"):
            movable = [a for a, u in zip(counts.agents, counts.unique.tolist()) if u > 0 and a in names]
        given = start.options.get("importance")
        weights = [1.0] * len(names)
        if isinstance(given, Mapping) and all(isinstance(given.get(a), numbers.Real) for a in names):
            weights = [float(given[a]) for a in names]
        n = len(names)
        values = [float(start.lambdas[a]) for a in names] + weights
        groups = [[names.index(a) for a in movable], list(range(n, 2 * n)) if n >= 2 else []]

        def build(v: list[float]) -> dict[str, Any]:
            candidate = {"method": "ram", **common, "lambdas": dict(zip(names, v[:n]))}
            if len(set(v[n:])) > 1:
                candidate["importance"] = dict(zip(names, v[n:]))
            return candidate

        self._ascend_scaled(
            family,
            values,
            groups,
            start.score,
            build,  # type: ignore[arg-type]
            [1.0] * n + [WEIGHT_STEP] * n,
            [0.0] * (2 * n),
            [math.inf] * (2 * n),
        )

    def _local(self, family: Family) -> None:
        """Density × scale steps around the best trial of ``family.name`` (density ± 0.1 within [0.05, 1], scale
        ± 0.25, ≥ 0), by the coordinate ascent."""
        tried = [t for t in self.history if t.method == family.name and t.complete]
        if not tried:
            return
        best = max(tried, key=lambda t: (t.score, -t.index))
        if "densities" in best.options or "weights" in best.options:
            return
        rest = {k: v for k, v in best.options.items() if k not in ("density", "scale")}
        config = make_config(family.name, **self.merger.options_of(best.candidate))
        values = [float(config.density), float(getattr(config, "scale", 1.0))]
        self._ascend_scaled(
            family,
            values,
            [[0, 1]],
            best.score,  # type: ignore[arg-type]
            lambda v: {"method": family.name, **rest, "density": v[0], "scale": v[1]},
            [LOCAL_STEPS["density"], LOCAL_STEPS["scale"]],
            [0.05, 0.0],
            [1.0, math.inf],
        )

    def _ascend_scaled(
        self,
        family: Family,
        values: list[float],
        groups: Sequence[Sequence[int]],
        score: float,
        build: Callable[[list[float]], dict[str, Any]],
        mults: Sequence[float],
        lower: Sequence[float],
        upper: Sequence[float],
        prefetch: Callable[[list[dict[str, Any]]], None] | None = None,
    ) -> None:
        coordinate_ascent(
            self.trial, self.seed, family, values, groups, score, build, mults, lower, upper, prefetch=self.prefetch
        )  # type: ignore[attr-defined]

    def best_of(self, arm: str) -> float | None:
        """The best score of the trials that scored for ``arm`` (``"ram"``: every RAM variant)."""
        scores = [t.score for t in self.history if t.complete and arm_of(t.method) == arm]
        return max(scores) if scores else None


def coordinate_ascent(
    trial: Callable[[dict[str, Any]], Trial | None],
    seed: int,
    family: Family,
    values: list[float],
    groups: Sequence[Sequence[int]],
    score: float,
    build: Callable[[list[float]], dict[str, Any]],
    mults: Sequence[float],
    lower: Sequence[float],
    upper: Sequence[float],
    prefetch: Callable[[list[dict[str, Any]]], None] | None = None,
) -> None:
    """Coordinate ascent: the coordinates visited group by group (each group in an order drawn from ``seed``);
    per coordinate, step up by ``step × mults[i]`` while the score improves, else down, within ``[lower[i],
    upper[i]]``; after a sweep without improvement halve the step; stop below ``family``'s ``min_step`` or when
    ``trial`` returns None (the budget is spent). Before each step ``prefetch`` is told it, the step after it and
    the other direction's first step (a worker pool scores those while the loop waits for the first)."""
    rng = random.Random(seed)
    order: list[int] = []
    for group in groups:
        g = list(group)
        rng.shuffle(g)
        order += g
    step, min_step = family.settings["step"], family.settings["min_step"]
    while step >= min_step:
        improved = False
        for i in order:
            for direction in (1.0, -1.0):
                moved = False
                while True:
                    value = round(values[i] + direction * step * mults[i], 12)
                    if not max(lower[i], -FLOAT32_MAX) <= value <= min(upper[i], FLOAT32_MAX):
                        break  # outside the bounds, or beyond float32's range (no option holds it: a huge step)
                    if prefetch is not None:  # this step, the next one if it improves, the other way if not
                        ahead = [value, round(value + direction * step * mults[i], 12)]
                        if not moved and direction > 0:
                            ahead.append(round(values[i] - step * mults[i], 12))
                        prefetch(
                            [build(values[:i] + [v] + values[i + 1 :]) for v in ahead if lower[i] <= v <= upper[i]]
                        )
                    tried = trial(build(values[:i] + [value] + values[i + 1 :]))
                    if tried is None:
                        return
                    if not tried.complete or tried.score <= score:  # a race's estimate is no step to build on
                        break
                    values[i], score, moved, improved = value, tried.score, True, True
                if moved:
                    break
        if not improved:
            step /= 2
