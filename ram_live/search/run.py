"""The search loop: merge each candidate into the one reused output, evaluate it, move on."""

from __future__ import annotations

import json
import math
import numbers
import random
import time
import warnings
from typing import Any, Callable

from torch import Tensor

from ..api import Model, Models
from ..errors import ConfigError, NonFiniteError, SearchError
from ..methods import RAM_VARIANTS, get_method, lambda_bound, lambdas_from_counts, make_config
from .result import EXTRAPOLATION_FAR, ExtrapolationWarning, SearchResult, Trial, describe, to_json
from .space import BASELINE_SIDE, RAM_SIDE, Family, allot, parse_space, side_of
from .target import Merger

__all__ = ["search"]

Evaluate = Callable[[Any], float]


def search(models: Models, base: Model | None = None, evaluate: Evaluate | None = None, *, budget: int = 60,
           space: Any = None, seed: int = 0, progress: Any = None, confirm: Evaluate | None = None,
           confirm_top: int = 3, device: Any = None, workers: int | None = None) -> SearchResult:
    """Pick the merge of ``models`` that scores best on ``evaluate`` (higher is better), within ``budget`` calls.

    Every candidate is merged into one reused output (a scratch module for a module base, one dict of tensors for
    a state-dict or path base: at most one model more in memory) and handed to ``evaluate`` — the same object
    each time, so copy what you keep. RAM-family counts are taken once per activity rule and reused.

    Default ``space``, half the budget each side (RAM gets the odd one): RAM+ ``r`` × ``alpha`` with α uncapped
    (``math.inf``) and capped at 2; per-agent λ on unique entries by coordinate ascent from the best so far
    (``lambdas``); leaving one agent out; ``eps``/``activity``; and, for a fair comparison, task arithmetic's
    scale then per-agent weights (``ta_weights``), TIES density × scale, DARE-TIES density × scale. ``space``:
    a list of family names and/or explicit candidates ``{"method": ..., **options}``, or a mapping
    ``{family: {option: [values]}}`` (grids), ``{"lambdas": {"step": 0.5}}`` (ascent settings). See
    ``docs/search.md``.

    Args:
        models: the agents, as for :func:`ram_live.merge`.
        base: their base model.
        evaluate: ``evaluate(merged) -> float`` on held-out data; ``merged`` is a module for a module base, a
            state dict for a state-dict or path base.
        budget: the most ``evaluate`` calls (an int >= 1).
        space: what to try (None: the default above).
        seed: orders the coordinate ascents and seeds DARE's masks; the same seed gives the same history.
        progress: a callable given each :class:`Trial` as it is scored, or a :class:`~ram_live.progress.ProgressHook`.
        confirm: a second held-out evaluation, run on the ``confirm_top`` best candidates after the search
            (``Trial.confirm_score``; not counted in ``budget``).
        device, workers: as for :func:`ram_live.merge`.

    Returns:
        A :class:`SearchResult`; ``merge(models, base=base, **result.best)`` reproduces the winner bit for bit.

    Raises:
        SearchError: ``evaluate``/``confirm`` raised (chained) or returned NaN, ±inf or a non-number.
        ConfigError: a bad ``budget``, ``confirm_top`` or ``space`` entry.

    >>> result = search({"coder": coder, "tools": tools}, base=base, evaluate=held_out_score)  # doctest: +SKIP
    >>> generalist = merge({"coder": coder, "tools": tools}, base=base, **result.best)       # doctest: +SKIP
    """
    t0 = time.perf_counter()
    if not callable(evaluate):
        raise ConfigError(f"evaluate must be a callable merged -> float, got {evaluate!r}")
    if confirm is not None and not callable(confirm):
        raise ConfigError(f"confirm must be a callable merged -> float, got {confirm!r}")
    for name, value in (("budget", budget), ("confirm_top", confirm_top)):
        if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"{name} must be an int >= 1, got {value!r}")
    if not isinstance(seed, numbers.Integral) or isinstance(seed, bool):
        raise ConfigError(f"seed must be an int, got {seed!r}")
    families = parse_space(space)
    merger = Merger(models, base, device=device, workers=workers)
    budgets = allot(families, int(budget), len(merger.names))
    run = _Run(merger, evaluate, int(budget), int(seed), progress)
    for family in families:
        run.family(family)
    if run.progress_hook is not None:
        run.progress_hook.close()
    result = SearchResult(run.history, int(budget), int(seed), merger.names, budgets=budgets)
    if not result.scored:
        raise SearchError("no candidate could be merged and scored (see the trials' errors)")
    if confirm is not None:
        run.confirm(confirm, result, int(confirm_top))
    result.merge_seconds, result.evaluate_seconds = run.merge_seconds, run.evaluate_seconds
    result.statistics_passes = merger.statistics_passes
    result.overhead_seconds = max(0.0, time.perf_counter() - t0 - run.merge_seconds - run.evaluate_seconds)
    best = result.best_trial
    if best.extrapolates:
        warnings.warn(ExtrapolationWarning(
            f"the chosen merge {best.label()} scales an agent's task vector by {best.extrapolation:.3g} "
            f"(> {EXTRAPOLATION_FAR:g}): it extrapolates past what that agent learned; check it on data the "
            "selection did not see (confirm=)"), stacklevel=2)
    return result


class _Run:
    def __init__(self, merger: Merger, evaluate: Evaluate, budget: int, seed: int, progress: Any) -> None:
        self.merger, self.evaluate, self.budget, self.seed = merger, evaluate, budget, seed
        self.history: list[Trial] = []
        self.seen: dict[str, Trial] = {}
        self.used = 0
        self.carry = {RAM_SIDE: 0, BASELINE_SIDE: 0}
        self.merge_seconds = self.evaluate_seconds = 0.0
        self.progress_hook = progress if progress is not None and hasattr(progress, "update") and hasattr(
            progress, "start") else None
        self.callback = progress if progress is not None and self.progress_hook is None else None
        if progress is not None and self.progress_hook is None and not callable(progress):
            raise ConfigError(f"progress must be a callable taking each Trial, or a ProgressHook; got {progress!r}")
        if self.progress_hook is not None:
            self.progress_hook.start("search", budget, 0)

    # ------------------------------------------------------------------------------------------- one trial

    def family(self, family: Family) -> None:
        self.left = family.budget + self.carry[family.side]
        self.current = family
        if self.left > 0:
            getattr(self, f"_{family.kind}")(family)
        self.carry[family.side] = max(0, self.left)

    def trial(self, candidate: dict[str, Any]) -> Trial | None:
        """Merge and score ``candidate`` (a repeat costs nothing: its earlier trial), or None when the family's or
        the search's budget is spent."""
        key = json.dumps(to_json(candidate), sort_keys=True)
        effect = self._effect(candidate)
        if key in self.seen or effect in self.seen:
            return self.seen[key if key in self.seen else effect]  # type: ignore[index]
        if self.left <= 0 or self.used >= self.budget:
            return None
        family = self.current
        index = len(self.history)
        label = f"#{index} {candidate['method']}({describe({k: v for k, v in candidate.items() if k != 'method'})})"
        try:
            merged, info, merge_s = self.merger.merge(candidate)
        except NonFiniteError as exc:
            if exc.agent is not None or not self.history:
                raise  # an input holds NaN/Inf: every candidate would fail
            trial = self._record(family, candidate, None, 0.0, 0.0, math.nan, None, str(exc))
            self.seen[key] = trial
            return trial
        self.merge_seconds += merge_s
        self.used += 1
        self.left -= 1
        score, eval_s = self._score(self.evaluate, merged, candidate, label, "evaluate")
        extrapolation, lambdas = self._extrapolation(candidate, info)
        trial = self._record(family, candidate, score, merge_s, eval_s, extrapolation, lambdas, None)
        self.seen[key] = trial
        effect = effect or self._effect(candidate)  # the counts may be known now
        if effect is not None:
            self.seen.setdefault(effect, trial)
        return trial

    def _effect(self, candidate: dict[str, Any]) -> str | None:
        """What a global-λ RAM-family merge does, where known before merging: the activity rule, the excluded
        agents and λ of each agent with unique entries (λ of the others scales nothing). Two candidates with the
        same effect give the same bits (plain RAM is λ = 1 bit for bit), so the second is not merged again."""
        method = candidate["method"]
        if method not in RAM_VARIANTS:
            return None
        config = make_config(method, **{k: v for k, v in candidate.items() if k != "method"})
        if getattr(config, "rho_scope", "global") != "global":
            return None
        activity = get_method(method).activity(config)
        exclude = tuple(config.exclude)
        names = [a for a in self.merger.names if a not in exclude]
        counts = self.merger.counts(activity, exclude)
        if config.lambdas is not None:
            if set(config.lambdas) != set(names):
                return None  # the merge says what is wrong
            lam: list[float | None] = [config.lambdas[a] for a in names]
        elif method == "ram":
            lam = [1.0] * len(names)
        elif counts is not None:
            lam = list(lambdas_from_counts(config, counts.active, counts.unique))
        else:
            return None
        if counts is not None and tuple(counts.agents) == tuple(names):
            lam = [v if u > 0 else None for v, u in zip(lam, counts.unique.tolist())]
        eps = activity.eps if activity.rule == "abs" else 0.0
        return json.dumps(["effect", activity.rule, eps, list(exclude), lam])

    def _record(self, family: Family, candidate: dict[str, Any], score: float | None, merge_s: float,
                eval_s: float, extrapolation: float, lambdas: dict[str, float] | None, error: str | None) -> Trial:
        options = {k: v for k, v in candidate.items() if k != "method"}
        trial = Trial(len(self.history), family.name, candidate["method"], options, score, merge_s, eval_s,
                      extrapolation, side_of(candidate["method"]), lambdas, error=error)
        self.history.append(trial)
        if self.callback is not None:
            self.callback(trial)
        elif self.progress_hook is not None:
            self.progress_hook.update(f"{trial.label()} -> {score}", 0)
        return trial

    def _score(self, fn: Evaluate, merged: Any, candidate: dict[str, Any], label: str, what: str
               ) -> tuple[float, float]:
        t0 = time.perf_counter()
        try:
            raw = fn(merged)
        except Exception as exc:
            raise SearchError(f"{what} raised {type(exc).__name__} on candidate {label}: {exc}",
                              candidate=candidate) from exc
        seconds = time.perf_counter() - t0
        self.evaluate_seconds += seconds
        if isinstance(raw, Tensor) and raw.numel() == 1:
            raw = raw.item()
        if not isinstance(raw, numbers.Real) or isinstance(raw, bool) or not math.isfinite(float(raw)):
            raise SearchError(f"{what} returned {raw!r} for candidate {label}: it must return a finite number "
                              "(higher is better)", candidate=candidate)
        return float(raw), seconds

    def _extrapolation(self, candidate: dict[str, Any], info: Any) -> tuple[float, dict[str, float] | None]:
        method = candidate["method"]
        config = make_config(method, **{k: v for k, v in candidate.items() if k != "method"})
        if method in RAM_VARIANTS:
            if info.lambdas is None:
                bound = lambda_bound(config)
                return (bound if math.isfinite(bound) else math.nan), None
            lambdas = dict(info.lambdas)
            counts = info.statistics or self.merger.counts(get_method(method).activity(config))
            values = list(lambdas.values())
            if counts is not None and tuple(counts.agents) == tuple(info.agents):
                values = [lambdas[a] for a, u in zip(info.agents, counts.unique.tolist()) if u > 0]
            return max([abs(v) for v in values], default=1.0), lambdas
        weights = list(getattr(config, "weights", None) or [1.0] * len(self.merger.names))
        if method == "linear" and getattr(config, "normalize", True):
            total = sum(weights)
            weights = [w / total for w in weights]
        return abs(getattr(config, "scale", 1.0)) * max(abs(w) for w in weights), None

    def incumbent(self, side: str) -> Trial | None:
        scored = [t for t in self.history if t.side == side and t.score is not None]
        return max(scored, key=lambda t: (t.score, -t.index)) if scored else None

    # ------------------------------------------------------------------------------------------- families

    def _explicit(self, family: Family) -> None:
        for candidate in family.grid:
            if self.trial(dict(candidate)) is None:
                return

    def _grid(self, family: Family) -> None:
        for options in family.grid:
            candidate = {"method": family.name, **options}
            if family.name.startswith("dare") and "seed" not in options:
                candidate["seed"] = self.seed
            if self.trial(candidate) is None:
                return

    def _ram_start(self) -> Trial | None:
        """The RAM side's best trial if its merge has λ per agent; else RAM with λ = 1 (tried now) with that
        trial's eps/activity/exclude."""
        best = self.incumbent(RAM_SIDE)
        if best is not None and best.lambdas is not None:
            return best
        common = self._common(best) if best is not None else {}
        kept = [a for a in self.merger.names if a not in common.get("exclude", ())]
        trial = self.trial({"method": "ram", **common, "lambdas": dict.fromkeys(kept, 1.0)})
        return trial if trial is not None and trial.score is not None else None

    @staticmethod
    def _common(trial: Trial) -> dict[str, Any]:
        return {k: trial.options[k] for k in ("eps", "activity", "exclude") if k in trial.options}

    def _lambdas(self, family: Family) -> None:
        start = self._ram_start()
        if start is None:
            return
        common = self._common(start)
        names = list(start.lambdas)  # type: ignore[arg-type]
        counts = self.merger.counts(get_method("ram").activity(make_config("ram", **{
            k: v for k, v in common.items() if k != "exclude"})), ())
        movable = names
        if counts is not None and not common.get("exclude"):
            movable = [a for a, u in zip(counts.agents, counts.unique.tolist()) if u > 0 and a in names]
        values = [start.lambdas[a] for a in names]  # type: ignore[index]
        self._ascend(family, values, [names.index(a) for a in movable], start.score,  # type: ignore[arg-type]
                     lambda v: {"method": "ram", **common, "lambdas": dict(zip(names, v))})

    def _ta_weights(self, family: Family) -> None:
        best = self.incumbent(BASELINE_SIDE)
        k = len(self.merger.names)
        if best is None or best.method != "task_arithmetic":
            tas = [t for t in self.history if t.method == "task_arithmetic" and t.score is not None]
            best = max(tas, key=lambda t: (t.score, -t.index)) if tas else self.trial(
                {"method": "task_arithmetic"})
        if best is None or best.score is None:
            return
        scale = float(best.options.get("scale", 1.0))
        weights = [scale * float(w) for w in (best.options.get("weights") or [1.0] * k)]
        self._ascend(family, weights, list(range(k)), best.score,
                     lambda v: {"method": "task_arithmetic", "weights": list(v)})

    def _ascend(self, family: Family, values: list[float], movable: list[int], score: float,
                build: Callable[[list[float]], dict[str, Any]]) -> None:
        """Coordinate ascent: per coordinate (in an order drawn from the seed) step up while it improves, else
        down (never below 0); after a sweep without improvement, halve the step; stop below ``min_step``."""
        order = list(movable)
        random.Random(self.seed).shuffle(order)
        step, min_step = family.settings["step"], family.settings["min_step"]
        while step >= min_step:
            improved = False
            for i in order:
                for direction in (1.0, -1.0):
                    moved = False
                    while True:
                        value = round(values[i] + direction * step, 12)
                        if value < 0:
                            break
                        trial = self.trial(build(values[:i] + [value] + values[i + 1:]))
                        if trial is None:
                            return
                        if trial.score is None or trial.score <= score:
                            break
                        values[i], score, moved, improved = value, trial.score, True, True
                    if moved:
                        break
            if not improved:
                step /= 2

    def _leave_one_out(self, family: Family) -> None:
        start = self._ram_start()
        if start is None or start.lambdas is None or len(start.lambdas) < 2:
            return
        common = self._common(start)
        excluded = list(common.pop("exclude", []))
        for name in start.lambdas:
            kept = {a: v for a, v in start.lambdas.items() if a != name}
            if self.trial({"method": "ram", **common, "lambdas": kept, "exclude": excluded + [name]}) is None:
                return

    def _activity(self, family: Family) -> None:
        start = self.incumbent(RAM_SIDE) or self._ram_start()
        if start is None:
            return
        for move in family.grid:
            if self.trial({**start.candidate, **move}) is None:
                return

    # ------------------------------------------------------------------------------------------- confirm

    def confirm(self, fn: Evaluate, result: SearchResult, top: int) -> None:
        ranked = sorted(result.scored, key=lambda t: (-t.score, t.index))[:top]  # type: ignore[operator]
        for trial in ranked:
            merged, _, merge_s = self.merger.merge(trial.candidate)
            self.merge_seconds += merge_s
            trial.confirm_score, _ = self._score(fn, merged, trial.candidate, f"#{trial.index} {trial.label()}",
                                                 "confirm")
