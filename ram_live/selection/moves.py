"""The move families of a search: coordinate ascents on per-agent λ and task-arithmetic weights, leaving one agent
out, other activity rules — each from the best candidate so far on its side."""

from __future__ import annotations

import math
from typing import Any, Callable

from ..methods import make_config
from .refine import coordinate_ascent
from .result import Trial
from .space import BASELINE_SIDE, RAM_SIDE, Family

__all__ = ["Moves", "PROBE_FACTOR"]

#: The factor on one agent's weight in the task-arithmetic arm's screening probes.
PROBE_FACTOR = 3.0
#: A sampler whose proposals were this many candidates in a row already scored has converged: its step ends.
MAX_REPEATS = 8


class Moves:
    """Mixed into the search loop, which provides ``trial``, ``incumbent``, ``history``, ``merger``, ``seed``."""

    merger: Any
    seed: int
    history: list[Trial]
    importance: dict[str, Any]  # label -> {agent: importances} (search's importance=)
    proposer: Any  # the model-based sampler (search's sampler=), None for the moves
    boxes: dict[str, Any]  # each sampled arm's box
    arm_families: dict[str, list[Family]]  # arm -> its families (set by budget.spend with a sampler)

    def trial(self, candidate: dict[str, Any]) -> Trial | None:
        raise NotImplementedError

    def incumbent(self, side: str) -> Trial | None:
        raise NotImplementedError

    def prefetch(self, candidates: list[dict[str, Any]]) -> None:
        """What :meth:`trial` will be asked next, in order (started ahead by the worker pool, if any)."""

    def _trials(self, candidates: list[dict[str, Any]]) -> bool:
        """Each candidate in turn (prefetched together); False when the budget ran out."""
        self.prefetch(candidates)
        return all(self.trial(c) is not None for c in candidates)

    def _explicit(self, family: Family) -> None:
        self._trials([dict(c) for c in family.grid])

    def _grid(self, family: Family) -> None:
        candidates = []
        for options in family.grid:
            candidate = {"method": family.name, **options}
            if family.name.startswith("dare") and "seed" not in options and self.merger.dare_seed:
                candidate["seed"] = self.seed
            candidates.append(candidate)
        self._trials(candidates)

    def _importance(self, family: Family) -> None:
        """Curvature-aware RAM: each importance variant with plain RAM, then with the best RAM-side candidate so
        far (its options kept, the importances added), in the variants' order."""
        if not self._trials([{"method": "ram", "importance": m} for m in self.importance.values()]):
            return
        best = self.incumbent(RAM_SIDE)
        if (
            best is None
            or best.options.get("importance") is not None
            or best.method == "ram"
            and set(best.options) <= {"importance"}
        ):
            return
        self._trials([{**best.candidate, "importance": m} for m in self.importance.values()])

    def _ram_start(self) -> Trial | None:
        """The RAM side's best trial if its merge has λ per agent; else RAM with λ = 1 (tried now) with that
        trial's eps/activity/exclude."""
        best = self.incumbent(RAM_SIDE)
        if best is not None and best.lambdas is not None:
            return best
        common = self._common(best) if best is not None else {}
        kept = [a for a in self.merger.names if a not in common.get("exclude", ())]
        trial = self.trial({"method": "ram", **common, "lambdas": dict.fromkeys(kept, 1.0)})
        return trial if trial is not None and trial.complete else None

    @staticmethod
    def _common(trial: Trial) -> dict[str, Any]:
        keep = ("eps", "activity", "exclude", "shared", "sparsify", "rank")
        return {k: trial.options[k] for k in keep if k in trial.options}

    def _lambdas(self, family: Family) -> None:
        start = self._ram_start()
        if start is None:
            return
        common = self._common(start)
        names = list(start.lambdas)  # type: ignore[arg-type]
        counts = self.merger.counts_of({"method": "ram", **{k: v for k, v in common.items() if k != "exclude"}})
        movable = names
        if counts is not None and not common.get("exclude"):
            movable = [a for a, u in zip(counts.agents, counts.unique.tolist()) if u > 0 and a in names]
        values = [start.lambdas[a] for a in names]  # type: ignore[index]
        self._ascend(
            family,
            values,
            [names.index(a) for a in movable],
            start.score,  # type: ignore[arg-type]
            lambda v: {"method": "ram", **common, "lambdas": dict(zip(names, v))},
        )

    def _ta_weights(self, family: Family) -> None:
        best = self.incumbent(BASELINE_SIDE)
        k = len(self.merger.names)
        if best is None or best.method != "task_arithmetic":
            tas = [t for t in self.history if t.method == "task_arithmetic" and t.complete]
            best = max(tas, key=lambda t: (t.score, -t.index)) if tas else self.trial({"method": "task_arithmetic"})
        if best is None or best.score is None:
            return
        scale = float(best.options.get("scale", 1.0))
        weights = [scale * float(w) for w in (best.options.get("weights") or [1.0] * k)]
        self._ascend(
            family, weights, list(range(k)), best.score, lambda v: {"method": "task_arithmetic", "weights": list(v)}
        )

    def _ta_probe(self, family: Family) -> None:
        """Task arithmetic at the best scale so far with one agent's weight × ``PROBE_FACTOR``, each agent in
        turn (the screen's look at what per-agent weights buy: one agent may want several times the others')."""
        tas = [t for t in self.history if t.method == "task_arithmetic" and t.complete and "weights" not in t.options]
        if not tas:
            return
        scale = float(max(tas, key=lambda t: (t.score, -t.index)).options.get("scale", 1.0))
        k = len(self.merger.names)
        self._trials(
            [
                {"method": "task_arithmetic", "weights": [scale * (PROBE_FACTOR if i == a else 1.0) for i in range(k)]}
                for a in range(k)
            ]
        )

    def _ascend(
        self,
        family: Family,
        values: list[float],
        movable: list[int],
        score: float,
        build: Callable[[list[float]], dict[str, Any]],
    ) -> None:
        """Coordinate ascent over ``movable`` (in an order drawn from the seed), step ``family.settings["step"]``,
        never below 0 (:func:`~ram_live.selection.refine.coordinate_ascent`)."""
        n = len(values)
        coordinate_ascent(
            self.trial,
            self.seed,
            family,
            values,
            [movable],
            score,
            build,
            [1.0] * n,
            [0.0] * n,
            [math.inf] * n,
            prefetch=self.prefetch,
        )

    def _sampled(self, family: Family) -> None:
        """A model-based sampler (:mod:`ram_live.selection.sampler`) over the arm's box: each proposal merged and
        scored as any candidate (raced under ``fidelity="halving"``), then told to the sampler; runs until the
        allowance is spent or ``MAX_REPEATS`` proposals in a row were candidates already scored. An arm with fewer
        than two trials in its box first scores its default grid's first, middle and last points."""
        from .sampler_box import arm_box, grown
        from .space import spread

        arm = family.name.split(":", 1)[1]
        if arm not in self.boxes:
            self.boxes[arm] = arm_box(arm, self.arm_families[arm], self)
        box = self.boxes[arm]
        if box is None:
            return
        if sum(box.read(t) is not None for t in self.history) < 2:
            starts = []
            for f in self.arm_families[arm]:
                if f.kind == "grid" and not f.user_grid:
                    starts += [{"method": f.name, **f.grid[i]} for i in spread(len(f.grid), 3)]
            if starts and not self._trials(starts):
                return
        repeats = 0
        while repeats < MAX_REPEATS:
            observed = [(p, t) for t in self.history if (p := box.read(t)) is not None]
            wider = grown(box, self.arm_families[arm], observed)
            if wider is not box:  # the best point presses on the box's top: grown, the points it now holds read
                box = self.boxes[arm] = wider
                observed = [(p, t) for t in self.history if (p := box.read(t)) is not None]
            point = self.proposer.propose(box, observed)
            n = len(self.history)
            tried = self.trial(box.build(point))
            self.proposer.tell(point, tried)
            if tried is None:
                return
            repeats = repeats + 1 if len(self.history) == n else 0

    def _leave_one_out(self, family: Family) -> None:
        start = self._ram_start()
        if start is None or start.lambdas is None or len(start.lambdas) < 2:
            return
        common = self._common(start)
        excluded = list(common.pop("exclude", []))
        self._trials(
            [
                {
                    "method": "ram",
                    **common,
                    "lambdas": {a: v for a, v in start.lambdas.items() if a != name},
                    "exclude": excluded + [name],
                }
                for name in start.lambdas
            ]
        )

    def _sparsify(self, family: Family) -> None:
        """LoRA adapters (:mod:`ram_live.selection.adapters`): the best RAM-side candidate so far with each activity
        rule of the family; one equal to the default (``sparsify="auto"``'s) leaves ``sparsify`` out."""
        from ..peft.sparsify import sparsify_rule

        start = self.incumbent(RAM_SIDE) or self._ram_start()
        if start is None:
            return
        candidates = []
        for move in family.grid:
            candidate = {**start.candidate, **move}
            if sparsify_rule(move["sparsify"], start.method) == sparsify_rule("auto", start.method):
                del candidate["sparsify"]
            candidates.append(candidate)
        self._trials(candidates)

    def _rank(self, family: Family) -> None:
        """LoRA adapters (:mod:`ram_live.selection.adapters`): the best RAM-side candidate so far re-factored into
        an adapter of each rank of the family (default: the agents' rank and twice it); the rank every candidate
        is re-factored to anyway (a LoRA callback's) leaves ``rank`` out."""
        from .adapters import rank_values

        start = self.incumbent(RAM_SIDE) or self._ram_start()
        if start is None:
            return
        ranks = [o["rank"] for o in family.grid] or rank_values(self.merger.adapters)
        candidates = []
        for k in ranks:
            candidate = {**start.candidate, "rank": k}
            if k == self.merger.default_rank():
                del candidate["rank"]
            candidates.append(candidate)
        self._trials(candidates)

    def _activity(self, family: Family) -> None:
        start = self.incumbent(RAM_SIDE) or self._ram_start()
        if start is None:
            return
        plain = self.merger.options_of(start.candidate)
        defaults = make_config(start.method)
        for move in family.grid:
            if make_config(start.method, **{**plain, **move}) == make_config(start.method, **plain):
                continue  # the same merge (e.g. shared="mean" on a candidate that leaves it out)
            candidate = {**start.candidate, **move}
            for k in move:  # a default value is left out, as the grids leave it: the same candidate, the same key
                if getattr(defaults, k) == move[k]:
                    del candidate[k]
            if self.trial(candidate) is None:
                return
