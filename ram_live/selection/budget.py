"""How a search spends its budget: explicit candidates, a screening round over every arm, then refinement of the
best arms by successive halving.

An *arm* is a group of families that refine one kind of merge (:attr:`Family.arm`): ``"ram"`` (every RAM-side
family), ``"task_arithmetic"`` (its scale grid and ``ta_weights``), ``"ties"``, ``"dare_ties"``, ... The rule:

1. **Explicit** candidates of ``space=`` first, all of them (as far as the budget goes).
2. **Screening** (with two arms or more): ``SCREEN_SHARE`` of the budget (at least one evaluation per arm), split
   evenly over the arms in their order (the earlier ones get the odd evaluations). An arm with grids screens an
   evenly spaced subset of its grids (:func:`~ram_live.selection.space.spread`: first and last included, at most the
   whole grid); an arm of moves only runs its first moves. The task-arithmetic arm, when it has ``ta_weights``,
   also *probes* every agent once every arm has screened (:data:`~ram_live.selection.moves.PROBE_FACTOR` × one
   agent's weight at its best screened scale: K evaluations beyond its share), and its refinement runs the weight
   ascent (from the best probe or scale) before the rest of the scale grid: a uniform scale cannot show that one
   agent wants several times the others' weight, and with only the scale screened, or the refinement spent on more
   uniform scales, such an arm lost to arms it would have beaten (benchmarks/quality.md, "`search`'s budget
   rule").
3. **Refinement**: the arms ranked by their best score so far (ties: the earlier arm). Round one gives
   ``ROUND_SHARE`` of what is left to the top half (rounded up), split evenly, the better ranked first; each
   further round re-ranks and halves the arms again; when one is left it gets everything that remains. An arm's
   refinement runs its families in the space's order: the rest of its grid (the screened points are free
   repeats), then its moves (RAM: the λ/shared-weight ascent, leave-one-out, activity; task arithmetic: the
   weight ascent; a default TIES/DARE grid: local density × scale steps). An arm whose families all finish with
   evaluations left drops out and the rest passes to the next arm by rank.
4. With **one arm** (a narrowed ``space=``) there is no screening: the arm gets the whole budget and runs its
   families in order, as that family searched alone.

The budget stays a hard cap on evaluations; repeats (and candidates of equal effect) cost nothing. Everything is
a function of the scores and ``seed``: the same seed and scores give the same history.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from .space import ASCENTS, LOCAL_MIN_STEP, Family, spread

__all__ = [
    "Arm",
    "arms_of",
    "sampleable",
    "screen_sizes",
    "refine_shares",
    "SCREEN_SHARE",
    "ROUND_SHARE",
    "AFTER_SAMPLER",
    "spend",
]

#: Share of the budget the screening round uses (two arms or more).
SCREEN_SHARE = 0.35
#: Share of what is left that each refinement round before the last one spends.
ROUND_SHARE = 1.0 / 3
#: In a sampled arm, the moves that run after its sampler (only with budget left when it converged): run before
#: it, they took the arm's first refinement round (RAM's leave-one-out and activity rules: up to K + 4
#: evaluations), and an arm whose sampler had not started lost the ranking to one whose sampler had
#: (benchmarks/bench_samplers.py: docs/search.md, "Which sampler").
AFTER_SAMPLER = ("leave_one_out", "activity")


@dataclass
class Arm:
    """One arm: its families in the space's order; ``finished`` holds the families that ran to their end."""

    name: str
    families: list[Family]
    order: int
    finished: set[str] = field(default_factory=set)
    probed: bool = False  # its screen probed per-agent weights
    sampled: bool = False  # a model-based sampler refines it (search's sampler=, ram_live.selection.sampler)

    @property
    def grid(self) -> list[tuple[Family, dict[str, Any]]]:
        return [(f, o) for f in self.families if f.kind == "grid" for o in f.grid]

    @property
    def steps(self) -> list[Family]:
        """What refinement runs, in order: the families in the space's order, local steps after a default
        density × scale grid, and the coordinate ascents last (the joint λ/shared-weight ascent stands in for the
        λ ascent when both are in the space)."""
        names = {f.name for f in self.families}
        if self.sampled:  # user grids, importance variants, the sampler over the arm's box, the other moves
            kept = [f for f in self.families if f.kind not in ASCENTS and (f.kind != "grid" or f.user_grid)]
            first = [f for f in kept if f.kind in ("grid", "importance") or f.kind not in AFTER_SAMPLER]
            first.sort(key=lambda f: f.kind not in ("grid", "importance"))
            sampled = Family(f"sampled:{self.name}", self.families[0].side, "sampled")
            return first + [sampled] + [f for f in kept if f.kind in AFTER_SAMPLER]
        out: list[Family] = []
        for f in self.families:
            if f.kind in ASCENTS or f.kind == "lambdas" and "shared_weights" in names:
                continue
            out.append(f)
            if f.kind == "grid" and not f.user_grid and any({"density", "scale"} <= set(o) for o in f.grid):
                out.append(Family(f.name, f.side, "local", settings={"step": 1.0, "min_step": LOCAL_MIN_STEP}))
        # the grids, then the importance variants (the caller's own data), the other moves; the coordinate ascents
        # last: they take what the others leave
        first = [f for f in out if f.kind in ("grid", "local", "importance")]
        out = sorted(first, key=lambda f: f.kind == "importance") + [f for f in out if all(f is not g for g in first)]
        ascents = [f for f in self.families if f.kind in ASCENTS]
        ascents = [f for f in ascents if not (f.kind == "lambdas" and "shared_weights" in names)]
        if self.probed:  # the screen probed per-agent weights: refine them first, the scale grid's rest after
            return ascents + out
        return out + ascents

    @property
    def probes(self) -> bool:
        """Whether its screen probes per-agent weights (task arithmetic with ``ta_weights``)."""
        return any(f.kind == "ta_weights" for f in self.families)

    @property
    def done(self) -> bool:
        return all(_step_id(f) in self.finished for f in self.steps)


def _step_id(f: Family) -> str:
    return f"{f.kind}:{f.name}"


def arms_of(families: list[Family]) -> tuple[list[Family], list[Arm]]:
    """The explicit families, and the others grouped into arms (in the order each arm first appears)."""
    explicit = [f for f in families if f.kind == "explicit"]
    arms: dict[str, Arm] = {}
    for f in families:
        if f.kind != "explicit":
            arms.setdefault(f.arm, Arm(f.arm, [], len(arms))).families.append(f)
    return explicit, list(arms.values())


def screen_sizes(arms: list[Arm], budget: int) -> list[int]:
    """Evaluations each arm screens with: ``SCREEN_SHARE`` of ``budget`` (at least one per arm, at most the
    budget), evenly, the earlier arms the odd ones; an arm with grids at most its grids' size."""
    n = len(arms)
    if n == 0:
        return []
    total = int(min(budget, max(n, math.floor(SCREEN_SHARE * budget + 0.5))))
    sizes = [total // n + (1 if i < total % n else 0) for i in range(n)]
    return [min(s, len(a.grid)) if a.grid else s for s, a in zip(sizes, arms)]


def refine_shares(n_alive: int, keep: int, left: int) -> list[int]:
    """One refinement round: ``left`` evaluations remain, ``keep`` of the ranked arms take part. Returns their
    shares, best ranked first (the last round, ``keep == 1``: everything)."""
    if keep <= 1:
        return [left]
    total = min(left, max(keep, int(math.floor(ROUND_SHARE * left + 0.5))))
    return [total // keep + (1 if i < total % keep else 0) for i in range(keep)]


def spend(run: Any, families: list[Family]) -> dict[str, int]:
    """Run every family of a search under the rule above; returns the evaluations each arm (and ``explicit``)
    used. ``run`` is the search loop: ``run_family(family, allowance) -> finished``, ``used``, ``budget``,
    ``history`` and ``best_of(arm)``."""
    explicit, arms = arms_of(families)
    used: dict[str, int] = {}
    if getattr(run, "proposer", None) is not None or getattr(run, "ledger", None) is not None:
        run.arm_families = {a.name: a.families for a in arms}
    if getattr(run, "ledger", None) is not None:  # the trials' params in the study: their arm's box's dimensions
        from .sampler_box import trial_params

        run.ledger.params_of = lambda candidate, outcome: trial_params(run, candidate, outcome)
    if getattr(run, "proposer", None) is not None:
        for a in arms:
            a.sampled = sampleable(a)
    boxes = getattr(run, "boxes", {})

    def go(family: Family, allowance: int, arm: str, phase: str) -> tuple[bool, int]:
        before, n0 = run.used, len(run.history)
        finished = run.run_family(family, allowance)
        for t in run.history[n0:]:
            t.phase = phase
        used[arm] = used.get(arm, 0) + run.used - before
        return finished, run.used - before

    for f in explicit:
        go(f, run.budget - run.used, "explicit", "explicit")
    # a candidate starts only while run.min_cost (one full evaluation) fits; under a race it may cost less
    if len(arms) == 1:
        _refine(arms[0], run.budget - run.used, go, boxes=boxes)
        return used
    k = len(run.merger.names)
    for arm, size in zip(arms, screen_sizes(arms, run.budget - run.used)):
        if size <= 0:
            continue
        grid = arm.grid
        if grid:
            picks = [grid[i] for i in spread(len(grid), size)]
            for f in arm.families:
                mine = [o for g, o in picks if g is f]
                if mine:
                    go(replace(f, grid=mine), size, arm.name, "screen")
        else:
            _refine(arm, size, go, phase="screen", boxes=boxes)
    for arm in arms:  # after every arm's own screen: the probes never take an arm's screening evaluations
        if arm.probes and k >= 2 and arm.grid and run.budget - run.used >= run.min_cost - 1e-9:
            arm.probed = go(Family("ta_probe", arm.families[0].side, "ta_probe"), k, arm.name, "screen")[1] > 0
    keep = (len(arms) + 1) // 2
    while run.budget - run.used >= run.min_cost - 1e-9:
        alive = sorted((a for a in arms if not a.done), key=lambda a: _rank(run, a))
        if not alive:
            break
        keep = min(keep, len(alive))
        shares = refine_shares(len(alive), keep, run.budget - run.used)
        for arm, share in zip(alive, shares):
            _refine(arm, share, go, boxes=boxes)
        keep = (keep + 1) // 2 if keep > 1 else 1
    return used


def sampleable(arm: Arm) -> bool:
    """Whether a sampler refines ``arm``: it has a box (:func:`~ram_live.selection.sampler_box.box_kind`, the one
    rule ``arm_box`` follows too): task arithmetic with ``ta_weights`` or a default grid of two scales or more, RAM
    with ``lambdas``/``shared_weights`` or the default RAM+ grid, a default density × scale grid. Any other arm
    (a one-scale grid, user grids only) keeps the moves; so does a RAM arm whose λ box finds no start when its
    sampler begins (:func:`_refine`)."""
    from .sampler_box import box_kind

    return box_kind(arm.name, arm.families) is not None


def _rank(run: Any, arm: Arm) -> tuple[float, int]:
    best = run.best_of(arm.name)
    return (-best if best is not None else math.inf, arm.order)


def _refine(arm: Arm, allowance: int, go: Any, phase: str = "refine", boxes: dict[str, Any] | None = None) -> None:
    """The arm's steps in order, with ``allowance`` new evaluations in all: a step that ran to its end is not run
    again; a step cut off is run again next time (its tried candidates are free repeats). A sampled step that
    found no box (``boxes[arm]`` None: RAM's λ box without a start) hands the arm back to the moves, which run
    with what is left."""
    left = allowance
    for f in arm.steps:
        if left <= 0:
            return
        sid = _step_id(f)
        if sid in arm.finished:
            continue
        finished, spent = go(f, left, arm.name, phase)
        left -= spent
        if f.kind == "sampled" and boxes is not None and arm.name in boxes and boxes[arm.name] is None:
            arm.sampled = False
            _refine(arm, left, go, phase, boxes)
            return
        if finished:
            arm.finished.add(sid)
        else:
            return
