"""The box a model-based sampler searches in one arm (:mod:`ram_live.selection.sampler`): the arm's continuous
options as named dimensions, how a point becomes a candidate, and how a trial already scored reads back as a point.

The boxes come from the families of ``space=`` (declared once, :mod:`ram_live.selection.space`):

- task arithmetic with ``ta_weights``: a weight per agent in ``[0, high]`` (``weights=[...]``, scale 1), ``high``
  = ``WEIGHT_GROWTH`` × the largest weight of the arm's best trial when the sampler starts (at least 1), at most
  ``WEIGHT_HIGH``; a uniform scale ``s`` reads as every weight ``s``; without ``ta_weights``: ``scale`` over its
  grid's range;
- TIES, DARE-TIES, DARE-linear (their default grids): ``density`` in ``[DENSITY_LOW, 1]`` × ``scale`` in
  ``[SCALE_LOW, SCALE_HIGH]`` (DARE's ``seed`` the search's);
- RAM with ``lambdas`` or ``shared_weights``: λ per agent in ``[0, high]`` (``high`` as above, from the largest λ
  of the best RAM-side candidate), on that candidate's activity rule; every RAM-side trial with λ per agent (RAM+
  records them) reads as a point; with only ``ram_plus``: ``r`` in ``[0, R_HIGH]`` × ``alpha`` ∈ {2, ∞}.

A family's ``high`` setting (``space={"ta_weights": {"high": 8}}``) sets the weights' upper bound.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Callable

from .result import Trial
from .space import Family

__all__ = ["Dim", "Box", "arm_box", "WEIGHT_HIGH", "WEIGHT_GROWTH", "R_HIGH"]

#: Upper bound of a per-agent weight (task arithmetic) or λ (RAM): extrapolating past it is not searched.
WEIGHT_HIGH = 6.0
#: Below that, the box reaches this many times the largest weight of the arm's best trial (as the screen's probes
#: try one agent at this many times the others' weight): on the RL demo's agents, whose best weights are about 1,
#: most of a 0-6 box scored near zero and a sampler spent its draws there.
WEIGHT_GROWTH = 3.0
#: Upper bound of RAM+'s ``r``.
R_HIGH = 3.0
DENSITY_LOW, SCALE_LOW, SCALE_HIGH = 0.05, 0.25, 3.0


@dataclass(frozen=True)
class Dim:
    """One dimension: a float in ``[low, high]``, or one of ``choices``."""

    name: str
    low: float = 0.0
    high: float = 1.0
    choices: tuple[Any, ...] | None = None

    def contains(self, value: Any) -> bool:
        if self.choices is not None:
            return value in self.choices
        return isinstance(value, numbers.Real) and self.low - 1e-12 <= float(value) <= self.high + 1e-12


@dataclass
class Box:
    """An arm's box: ``build(point) -> candidate``, ``read(trial) -> point or None`` (a trial outside the box or of
    another shape reads as None)."""

    arm: str
    dims: list[Dim]
    build: Callable[[dict[str, Any]], dict[str, Any]]
    reader: Callable[[Trial], dict[str, Any] | None]
    common: dict[str, Any] = field(default_factory=dict)

    def read(self, trial: Trial) -> dict[str, Any] | None:
        if trial.score is None:
            return None
        point = self.reader(trial)
        if point is None or set(point) != {d.name for d in self.dims}:
            return None
        return point if all(d.contains(point[d.name]) for d in self.dims) else None


def _setting(families: list[Family], kind: str, default: float) -> float:
    for f in families:
        if f.kind == kind and "high" in f.settings:
            return float(f.settings["high"])
    return default


def _high(families: list[Family], kinds: tuple[str, ...], best: float | None) -> float:
    """The weights' upper bound: a family's ``high`` setting, else ``WEIGHT_GROWTH`` × the largest weight of the
    arm's best trial so far (at least 1), at most ``WEIGHT_HIGH``."""
    for kind in kinds:
        given = _setting(families, kind, math.nan)
        if not math.isnan(given):
            return given
    return min(WEIGHT_HIGH, WEIGHT_GROWTH * max(1.0, best or 0.0))


def arm_box(arm: str, families: list[Family], run: Any) -> Box | None:
    """The box of ``arm`` (its families), or None when it has nothing continuous to search. ``run`` is the search
    loop (its merger's agents, its seed, its RAM-side start)."""
    kinds = {f.kind for f in families}
    names = list(run.merger.names)
    if arm == "task_arithmetic":
        return _ta_box(families, kinds, names, run)
    if arm == "ram":
        return _ram_box(families, kinds, run)
    grids = [f for f in families if f.kind == "grid" and not f.user_grid and f.name == arm]
    if grids and any({"density", "scale"} <= set(o) for o in grids[0].grid):
        return _density_box(arm, run)
    return None


def _ta_box(families: list[Family], kinds: set[str], names: list[str], run: Any) -> Box | None:
    if "ta_weights" in kinds:
        tas = [t for t in run.history if t.method == "task_arithmetic" and t.complete]
        best = max(tas, key=lambda t: (t.score, -t.index)) if tas else None
        largest = None
        if best is not None:
            largest = float(best.options.get("scale", 1.0)) * max(best.options.get("weights") or [1.0])
        high = _high(families, ("ta_weights",), largest)
        dims = [Dim(f"w:{a}", 0.0, high) for a in names]

        def read(t: Trial) -> dict[str, Any] | None:
            if t.method != "task_arithmetic" or set(t.options) - {"scale", "weights"}:
                return None
            scale = float(t.options.get("scale", 1.0))
            weights = t.options.get("weights") or [1.0] * len(names)
            return {f"w:{a}": scale * float(w) for a, w in zip(names, weights)}

        return Box(
            "task_arithmetic",
            dims,
            lambda p: {"method": "task_arithmetic", "weights": [float(p[f"w:{a}"]) for a in names]},
            read,
        )
    grid = [f for f in families if f.kind == "grid" and f.name == "task_arithmetic" and not f.user_grid]
    if not grid:
        return None
    scales = [float(o.get("scale", 1.0)) for o in grid[0].grid]
    if len(set(scales)) < 2:
        return None

    def read_scale(t: Trial) -> dict[str, Any] | None:
        if t.method != "task_arithmetic" or set(t.options) - {"scale"}:
            return None
        return {"scale": float(t.options.get("scale", 1.0))}

    return Box(
        "task_arithmetic",
        [Dim("scale", min(scales), max(scales))],
        lambda p: {"method": "task_arithmetic", "scale": float(p["scale"])},
        read_scale,
    )


def _density_box(arm: str, run: Any) -> Box:
    extra = {"seed": run.seed} if arm.startswith("dare") and run.merger.dare_seed else {}

    def read(t: Trial) -> dict[str, Any] | None:
        if t.method != arm or set(t.options) - {"density", "scale", "seed"}:
            return None
        return {"density": float(t.options.get("density", -1.0)), "scale": float(t.options.get("scale", 1.0))}

    return Box(
        arm,
        [Dim("density", DENSITY_LOW, 1.0), Dim("scale", SCALE_LOW, SCALE_HIGH)],
        lambda p: {"method": arm, "density": float(p["density"]), "scale": float(p["scale"]), **extra},
        read,
    )


def _ram_box(families: list[Family], kinds: set[str], run: Any) -> Box | None:
    if {"lambdas", "shared_weights"} & kinds:
        start = run._ram_start()
        if start is None or start.lambdas is None:
            return None
        common = run._common(start)
        agents = list(start.lambdas)
        high = _high(families, ("shared_weights", "lambdas"), max(start.lambdas.values()))
        dims = [Dim(f"lam:{a}", 0.0, high) for a in agents]

        def build(p: dict[str, Any]) -> dict[str, Any]:
            return {"method": "ram", **common, "lambdas": {a: float(p[f"lam:{a}"]) for a in agents}}

        def read(t: Trial) -> dict[str, Any] | None:
            if t.side != "ram" or t.lambdas is None or set(t.lambdas) != set(agents) or run._common(t) != common:
                return None
            if t.options.get("importance") is not None:
                return None  # weighted shared entries: not a point of this box
            return {f"lam:{a}": float(t.lambdas[a]) for a in agents}

        return Box("ram", dims, build, read, common)
    if "grid" not in kinds or not any(f.name == "ram_plus" and not f.user_grid for f in families):
        return None

    def read_plus(t: Trial) -> dict[str, Any] | None:
        if t.method != "ram_plus" or set(t.options) - {"r", "alpha"}:
            return None
        return {"r": float(t.options.get("r", 0.1)), "alpha": float(t.options.get("alpha", 2.0))}

    return Box(
        "ram",
        [Dim("r", 0.0, R_HIGH), Dim("alpha", choices=(2.0, math.inf))],
        lambda p: {"method": "ram_plus", "r": float(p["r"]), "alpha": p["alpha"]},
        read_plus,
    )
