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
from .space import Family, arm_of, side_of

__all__ = [
    "Dim",
    "Box",
    "arm_box",
    "box_kind",
    "grown",
    "trial_params",
    "WEIGHT_HIGH",
    "WEIGHT_GROWTH",
    "GROWN_FACTOR",
    "GROWN_HIGH",
    "R_HIGH",
]

#: Upper bound of a per-agent weight (task arithmetic) or λ (RAM): extrapolating past it is not searched.
WEIGHT_HIGH = 6.0
#: Below that, the box reaches this many times the largest weight of the arm's best trial (as the screen's probes
#: try one agent at this many times the others' weight): on the RL demo's agents, whose best weights are about 1,
#: most of a 0-6 box scored near zero and a sampler spent its draws there.
WEIGHT_GROWTH = 3.0
#: As the sampler learns (:func:`grown`), the weights' upper bound is kept at least this many times the largest
#: weight of the best point so far, up to ``GROWN_HIGH`` (benchmarks/bench_samplers.py: at 3 agents an agent's λ
#: won near 6 where the first box stopped at 3).
GROWN_FACTOR, GROWN_HIGH = 2.0, 8.0
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


def grown(box: Box, families: list[Family], observed: list[tuple[dict[str, Any], Trial]]) -> Box:
    """The weights' box (task arithmetic's per agent, RAM's λ) grown as the evidence comes in: its upper bound
    at least ``GROWN_FACTOR`` × the largest weight of the best point scored on every prompt, at most
    ``GROWN_HIGH``; ``box`` itself when that is no higher, for any other box, or when a family's ``high`` setting
    fixed the bound. A sampler's first box (``WEIGHT_GROWTH`` × the start's largest weight) can hold the
    extrapolation the agents want only partly: an under-trained agent's weight climbs to the top of the box.

    Args:
        box: the arm's box so far.
        families: the arm's families (their ``high`` settings).
        observed: the arm's points and their trials.

    Returns:
        The box, grown or as it was.

    Example:
        >>> b = Box("task_arithmetic", [Dim("w:a", 0.0, 3.0)], dict, lambda t: None)
        >>> t = Trial(0, "", "task_arithmetic", {}, 0.9, 0.0, 0.0, 1.0, "baseline")
        >>> grown(b, [], [({"w:a": 2.5}, t)]).dims[0].high
        5.0
    """
    if not box.dims or not all(d.choices is None and d.name.startswith(("w:", "lam:")) for d in box.dims):
        return box
    if any(f.kind in ("ta_weights", "lambdas", "shared_weights") and "high" in f.settings for f in families):
        return box
    complete = [(p, t) for p, t in observed if t.complete]
    if not complete:
        return box
    point = max(complete, key=lambda pt: (pt[1].score, -pt[1].index))[0]  # type: ignore[operator]
    high = box.dims[0].high
    wanted = min(GROWN_HIGH, GROWN_FACTOR * max(float(v) for v in point.values()))
    if wanted <= high + 1e-12:
        return box
    return Box(box.arm, [Dim(d.name, d.low, wanted) for d in box.dims], box.build, box.reader, box.common)


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


def box_kind(arm: str, families: list[Family]) -> str | None:
    """Which box ``arm`` has, from its families alone (the one rule :func:`arm_box` and
    :func:`ram_live.selection.budget.sampleable` share): ``"ta_weights"`` (task arithmetic with ``ta_weights``),
    ``"ta_scale"`` (its default scale grid, with two scales or more: one scale leaves nothing to search),
    ``"ram_lambdas"`` (RAM with ``lambdas``/``shared_weights``), ``"ram_plus"`` (the default RAM+ grid),
    ``"density"`` (a default density × scale grid), or None (the moves refine the arm).

    Args:
        arm: the arm's name (:attr:`Family.arm`).
        families: its families.

    Returns:
        The kind of box, or None.

    Example:
        >>> from ram_live.selection.space import parse_space
        >>> box_kind("task_arithmetic", parse_space(["task_arithmetic", "ta_weights"]))
        'ta_weights'
    """
    kinds = {f.kind for f in families}
    defaults = [f for f in families if f.kind == "grid" and not f.user_grid]
    if arm == "task_arithmetic":
        if "ta_weights" in kinds:
            return "ta_weights"
        scales = {float(o.get("scale", 1.0)) for f in defaults if f.name == arm for o in f.grid}
        return "ta_scale" if len(scales) >= 2 else None
    if arm == "ram":
        if {"lambdas", "shared_weights"} & kinds:
            return "ram_lambdas"
        return "ram_plus" if any(f.name == "ram_plus" for f in defaults) else None
    if any(f.name == arm and any({"density", "scale"} <= set(o) for o in f.grid) for f in defaults):
        return "density"
    return None


def arm_box(arm: str, families: list[Family], run: Any) -> Box | None:
    """The box of ``arm`` (its families), or None when it has nothing continuous to search (:func:`box_kind`), or
    when RAM's λ box has no start yet (no RAM-side trial with λ per agent). ``run`` is the search loop (its
    merger's agents, its seed, its RAM-side start)."""
    kind = box_kind(arm, families)
    if kind in ("ta_weights", "ta_scale"):
        return _ta_box(families, kind, list(run.merger.names), run)
    if kind == "ram_lambdas":
        return _ram_box(families, run)
    if kind == "ram_plus":
        return _ram_plus_box()
    if kind == "density":
        return _density_box(arm, run)
    return None


def trial_params(run: Any, candidate: dict[str, Any], outcome: Any) -> dict[str, tuple[Any, Any]]:
    """A scored candidate as Optuna params (``storage=``: the study's trials then show them, and
    ``optuna-dashboard`` plots them): its point in its arm's box, each dimension as ``name -> (value,
    distribution)`` (``FloatDistribution`` over the box's range, widened to hold a value a move took past it;
    choices as a ``CategoricalDistribution`` of their text); ``{}`` when the arm has no box or the candidate is no
    point of it. RAM's λ box reads the λ per agent the merge reported (before the sampler makes that box, from
    the candidate's own λ: nothing is merged for it).

    Args:
        run: the search loop (its ``arm_families``, ``boxes``, merger).
        candidate: the candidate scored.
        outcome: its :class:`~ram_live.selection.outcome.Outcome`.

    Returns:
        Param name -> (value as Optuna stores it, distribution).
    """
    import optuna

    method = candidate["method"]
    arm = arm_of(method)
    families = getattr(run, "arm_families", {}).get(arm)
    scored = getattr(outcome, "scored", None)
    if families is None or scored is None:
        return {}
    kind = box_kind(arm, families)
    options = {k: v for k, v in candidate.items() if k != "method"}
    trial = Trial(-1, "", method, options, scored.score, 0.0, 0.0, math.nan, side_of(method), outcome.lambdas)
    box = run.boxes.get(arm) if arm in run.boxes else None
    if box is None and kind == "ram_lambdas":  # the sampler's box needs a RAM start: the λ per agent as they are
        if trial.side != "ram" or not trial.lambdas or options.get("importance") is not None:
            return {}
        point = {f"lam:{a}": float(v) for a, v in trial.lambdas.items()}
        dims = [Dim(name, 0.0, WEIGHT_HIGH) for name in point]
    else:
        if box is None and kind is not None:
            box = arm_box(arm, families, run)
        point = box.reader(trial) if box is not None else None
        if point is None or box is None or set(point) != {d.name for d in box.dims}:
            return {}
        dims = box.dims
    out: dict[str, tuple[Any, Any]] = {}
    for d in dims:
        value = point[d.name]
        if d.choices is not None:
            choices = [str(c) for c in d.choices]
            if str(value) not in choices:
                return {}
            out[d.name] = (str(value), optuna.distributions.CategoricalDistribution(choices))
        elif isinstance(value, numbers.Real) and math.isfinite(float(value)):
            v = float(value)
            out[d.name] = (v, optuna.distributions.FloatDistribution(min(d.low, v), max(d.high, v)))
        else:
            return {}
    return out


def _ta_box(families: list[Family], kind: str, names: list[str], run: Any) -> Box:
    if kind == "ta_weights":
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
    scales = [float(o.get("scale", 1.0)) for f in grid for o in f.grid]

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


def _ram_box(families: list[Family], run: Any) -> Box | None:
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


def _ram_plus_box() -> Box:
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
