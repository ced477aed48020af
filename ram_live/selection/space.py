"""What a search tries: families of candidates, their default grids, and the arms the budget is spread over.

A candidate is ``{"method": name, **options}``. A *family* produces candidates: a grid family is a registered
merge method with a list of option settings; a *move* family changes the best candidate found so far in its arm
(per-agent λ, shared weights or task-arithmetic weights by coordinate ascent, leaving one agent out, another
activity rule). Families belong to a side (the RAM family, or the baselines) and to an *arm*: every RAM-side
family is the arm ``"ram"``; a baseline family is the arm of its method (``ta_weights`` is ``task_arithmetic``'s).
How the budget goes to the arms: :mod:`ram_live.selection.budget`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from ..option_checks import shown
from ..methods import RAM_METHODS, available_methods, make_config

__all__ = ["Family", "DEFAULT_SPACE", "parse_space", "arm_of", "spread", "RAM_SIDE", "BASELINE_SIDE"]

RAM_SIDE, BASELINE_SIDE = "ram", "baseline"

#: RAM+ r × α: the paper's default first, then plain RAM (r = 0: λ = 1), the uncapped α, the capped one; last
#: the paper's default with the conflict-aware shared region (a screen's spread always takes the first and last).
RAM_PLUS_GRID: list[dict[str, Any]] = (
    [{"r": 0.1, "alpha": 2.0}, {"r": 0.0, "alpha": 2.0}]
    + [{"r": r, "alpha": math.inf} for r in (0.1, 0.25, 0.5, 1.0, 2.0, 3.0)]
    + [{"r": r, "alpha": 2.0} for r in (0.25, 0.5, 1.0, 2.0, 3.0)]
    + [{"r": 0.1, "alpha": 2.0, "shared": "sign"}]
)
TA_GRID = [{"scale": s} for s in (1.0, 0.5, 0.75, 1.25, 1.5, 2.0, 0.3)]
TIES_GRID = [{"density": d, "scale": s} for s in (1.0, 1.5, 2.0) for d in (0.2, 0.5, 0.8)]
DARE_GRID = [{"density": d, "scale": s} for s in (1.0, 1.5, 2.0) for d in (0.5, 0.3, 0.7)]
ACTIVITY_MOVES = [{"eps": 1e-6}, {"eps": 1e-4}, {"activity": "changed"}, {"shared": "sign"}, {"shared": "mean"}]
#: What the ``activity`` moves may change of the best RAM candidate.
MOVE_OPTIONS = ("eps", "activity", "shared")

#: Default grids of grid families (other registered methods: their defaults, one candidate).
DEFAULT_GRIDS: dict[str, list[dict[str, Any]]] = {
    "ram_plus": RAM_PLUS_GRID,
    "task_arithmetic": TA_GRID,
    "ties": TIES_GRID,
    "dare_ties": DARE_GRID,
    "ram_plus_soft": [{"r": r} for r in (0.1, 0.5, 1.0, 2.0)],
    "dare_linear": [{"density": d, "scale": s} for s in (1.0, 1.5) for d in (0.5, 0.3, 0.7)],
}
#: The densities the ``sparsify`` move tries, ``TopK(d)``, on LoRA adapters (the candidates without ``sparsify`` have
#: the default, TopK(0.5); ram_live.selection.adapters).
SPARSIFY_DENSITIES = (0.3, 0.7, 0.2)
#: Move families: (side, what they change).
MOVES = {
    "lambdas": RAM_SIDE,
    "shared_weights": RAM_SIDE,
    "leave_one_out": RAM_SIDE,
    "activity": RAM_SIDE,
    "ta_weights": BASELINE_SIDE,
    "importance": RAM_SIDE,
    "sparsify": RAM_SIDE,
    "rank": RAM_SIDE,
}
#: Coordinate-ascent families.
ASCENTS = ("lambdas", "shared_weights", "ta_weights")
#: The default space, in the order measured to matter on the RAM side, then the baselines.
DEFAULT_SPACE = (
    "ram_plus",
    "lambdas",
    "shared_weights",
    "leave_one_out",
    "activity",
    "task_arithmetic",
    "ties",
    "dare_ties",
    "ta_weights",
)
#: Where move families start: coordinate-ascent step, and the step below which it stops.
ASCENT_STEP, ASCENT_MIN_STEP = 1.0, 1.0 / 64
#: The local density × scale steps after a default TIES/DARE grid: density ± 0.1, scale ± 0.25, halved (as the
#: ascent's step) down to an eighth.
LOCAL_STEPS = {"density": 0.1, "scale": 0.25}
LOCAL_MIN_STEP = 1.0 / 8


@dataclass
class Family:
    """One family of a search: ``grid`` (candidates' options for grid families and the activity moves),
    ``settings`` (the coordinate ascent's ``step``/``min_step``), ``user_grid`` (the grid was given in ``space=``:
    exactly those candidates, no local steps around them), ``budget`` (unused: the arms share the budget, see
    :mod:`ram_live.selection.budget`)."""

    name: str
    side: str
    kind: str  # "grid", "explicit", "lambdas", "shared_weights", "ta_weights", "leave_one_out", "activity",
    # "importance", "sparsify", "rank" (adapters), "ta_probe" (the screen's, budget.py)
    grid: list[dict[str, Any]] = field(default_factory=list)
    settings: dict[str, float] = field(default_factory=dict)
    budget: int = 0
    user_grid: bool = False

    @property
    def arm(self) -> str:
        """The arm this family refines: ``"ram"`` for the RAM side, else its method (``ta_weights``: task
        arithmetic)."""
        if self.side == RAM_SIDE:
            return RAM_SIDE
        return "task_arithmetic" if self.kind == "ta_weights" else self.name

    @property
    def size(self) -> float:
        """How many candidates it can produce at most (inf for a coordinate ascent)."""
        if self.kind in ASCENTS:
            return math.inf
        if self.kind == "leave_one_out":
            return math.inf  # bounded by the number of agents, known when it runs
        if self.kind == "importance":
            return 2 * self.settings.get("variants", 1)  # each variant: plain RAM, then the best RAM-side one
        if self.kind == "rank" and not self.grid:
            return 2  # the agents' rank and twice it (ram_live.selection.adapters.rank_values)
        return len(self.grid)


def side_of(method: str) -> str:
    return RAM_SIDE if method in RAM_METHODS else BASELINE_SIDE


def arm_of(method: str) -> str:
    """The arm a merge of ``method`` scores for: ``"ram"`` for every RAM variant, else the method itself."""
    return RAM_SIDE if method in RAM_METHODS else method


def spread(n: int, k: int) -> list[int]:
    """``k`` of the indices ``0 … n-1``, evenly spaced, first and last included (all of them when ``k >= n``)."""
    if k >= n:
        return list(range(n))
    if k <= 0:
        return []
    if k == 1:
        return [0]
    return [int(math.floor(i * (n - 1) / (k - 1) + 0.5)) for i in range(k)]


def _grid(entry: str, value: Any) -> list[dict[str, Any]]:
    """A grid given as ``{option: [values]}`` (the product, in the given order) or ``[{option: value}, ...]``."""
    if isinstance(value, Mapping):
        for option, values in value.items():
            if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
                raise ConfigError(f"space[{entry!r}][{option!r}] must be a non-empty list of values, got {values!r}")
        keys = list(value)
        return [dict(zip(keys, combo)) for combo in itertools.product(*(value[k] for k in keys))]
    if (
        isinstance(value, Sequence)
        and not isinstance(value, (str, bytes))
        and value
        and all(isinstance(v, Mapping) for v in value)
    ):
        return [dict(v) for v in value]
    raise ConfigError(
        f"space[{entry!r}] must be a mapping {{option: [values]}} or a list of option dicts, got {value!r}"
    )


def _check_candidate(entry: str, method: str, options: Mapping[str, Any]) -> None:
    try:
        if "sparsify" in options:  # an adapter search's activity rule (what ram_merge_adapter_files takes)
            from ..peft.sparsify import sparsify_rule

            sparsify_rule(options["sparsify"], method)
        if "rank" in options:  # an adapter search's re-factored output rank
            _check_rank(options["rank"])
        make_config(method, **{k: v for k, v in options.items() if k not in ("importance", "sparsify", "rank")})
    except ConfigError as exc:
        raise ConfigError(f"space entry {entry}: {exc}") from None


def _family(name: str, value: Any) -> Family:
    if name in MOVES:
        side = MOVES[name]
        if name in ASCENTS:
            settings = {"step": ASCENT_STEP, "min_step": ASCENT_MIN_STEP}
            if isinstance(value, Mapping):
                unknown = sorted(set(value) - set(settings) - {"high"})
                if unknown:
                    raise ConfigError(
                        f"space[{name!r}]: unknown setting(s) {unknown}; its settings are step, min_step, high"
                    )
                for k, v in value.items():
                    if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 < v < math.inf:
                        raise ConfigError(f"space[{name!r}][{k!r}] must be a positive number, got {v!r}")
                    settings[k] = float(v)
            elif value not in (None, True):
                raise ConfigError(f"space[{name!r}] takes True or {{'step': ..., 'min_step': ...}}, got {value!r}")
            return Family(name, side, name, settings=settings)
        if name in ("leave_one_out", "importance"):
            if value not in (None, True):
                raise ConfigError(f"space[{name!r}] takes True, got {value!r}")
            return Family(name, side, name)
        if name == "sparsify":
            return Family(name, side, name, grid=_sparsify_grid(value))
        if name == "rank":
            return Family(name, side, name, grid=_rank_grid(value))
        grid = ACTIVITY_MOVES if value in (None, True) else _grid(name, value)
        for i, options in enumerate(grid):
            unknown = sorted(set(options) - set(MOVE_OPTIONS))
            if unknown:
                raise ConfigError(f"space entry 'activity'[{i}]: only {', '.join(MOVE_OPTIONS)} change, got {unknown}")
            _check_candidate(f"'activity'[{i}]", "ram", options)
        return Family(name, side, "activity", grid=[dict(g) for g in grid])
    if name not in available_methods():
        raise ConfigError(
            f"space: unknown family {name!r}; families are {', '.join(DEFAULT_SPACE)}, "
            f"'ram', 'ram_plus_soft', 'linear', 'dare_linear' or any registered method"
        )
    user = value not in (None, True)
    grid = _grid(name, value) if user else DEFAULT_GRIDS.get(name, [{}])
    for i, options in enumerate(grid):
        _check_candidate(f"{name!r}[{i}]", name, options)
    return Family(name, side_of(name), "grid", grid=[dict(g) for g in grid], user_grid=user)


def _sparsify_grid(value: Any) -> list[dict[str, Any]]:
    """The ``sparsify`` family's moves: ``TopK(d)`` for the default densities, or the given activity rules (as
    ``ram_merge_adapter_files``'s ``sparsify=`` takes them: ``TopK(0.3)``, ``("topk", 0.3)``, ``None``, ...)."""
    from ..peft.sparsify import TopK, sparsify_rule

    if value in (None, True):
        return [{"sparsify": TopK(d)} for d in SPARSIFY_DENSITIES]
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence) or not value:
        raise ConfigError(
            f"space['sparsify'] takes True or a non-empty list of activity rules (TopK(0.3), ...), got {value!r:.80}"
        )
    out = []
    for i, rule in enumerate(value):
        try:
            out.append({"sparsify": sparsify_rule(rule, "ram")})
        except ConfigError as exc:
            raise ConfigError(f"space entry 'sparsify'[{i}]: {exc}") from None
    return out


def _check_rank(value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"rank must be a positive int (the re-factored adapter's rank), got {value!r}")


def _rank_grid(value: Any) -> list[dict[str, Any]]:
    """The ``rank`` family's moves: none here for the default (the agents' rank and twice it, known once the
    adapters are read), or ``{"rank": k}`` for each given rank."""
    if value in (None, True):
        return []
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence) or not value:
        raise ConfigError(f"space['rank'] takes True or a non-empty list of ranks (positive ints), got {value!r:.80}")
    for i, k in enumerate(value):
        try:
            _check_rank(k)
        except ConfigError as exc:
            raise ConfigError(f"space entry 'rank'[{i}]: {exc}") from None
    return [{"rank": k} for k in dict.fromkeys(value)]


def parse_space(space: Any) -> list[Family]:
    """``space`` as families, in order: ``None`` (the default), a list of family names and/or explicit candidates
    ``{"method": ..., **options}`` (tried first, in their order), or a mapping ``{family: grid or settings}``."""
    if space is None:
        space = list(DEFAULT_SPACE)
    if isinstance(space, Mapping):
        items = list(space.items())
    elif isinstance(space, Sequence) and not isinstance(space, (str, bytes)):
        items = []
        explicit: list[dict[str, Any]] = []
        for i, entry in enumerate(space):
            if isinstance(entry, str):
                items.append((entry, None))
            elif isinstance(entry, Mapping):
                if "method" not in entry or not isinstance(entry["method"], str):
                    raise ConfigError(f"space[{i}] = {dict(entry)!r}: a candidate needs a 'method' name")
                _check_candidate(f"[{i}]", entry["method"], {k: v for k, v in entry.items() if k != "method"})
                explicit.append(dict(entry))
            else:
                raise ConfigError(f"space[{i}] must be a family name or a candidate dict, got {shown(entry)}")
        families = [
            Family(f"explicit:{side}", side, "explicit", grid=[e for e in explicit if side_of(e["method"]) == side])
            for side in (RAM_SIDE, BASELINE_SIDE)
        ]
        families = [f for f in families if f.grid]
        seen = set()
        for name, _ in items:
            if name in seen:
                raise ConfigError(f"space names family {name!r} twice")
            seen.add(name)
        return families + [_family(name, value) for name, value in items]
    else:
        raise ConfigError(f"space must be None, a list of families/candidates or a mapping, got {type(space).__name__}")
    for name, _ in items:
        if not isinstance(name, str):
            raise ConfigError(f"space: family names are strings, got {name!r}")
    return [_family(name, value) for name, value in items]
