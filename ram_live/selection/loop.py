"""The search loop (:class:`SearchRun`): merge each candidate into the one reused output, evaluate it, record the
trial, move on; the moves (:class:`~.moves.Moves`) and refinements (:class:`~.refine.Refinements`) it inherits
choose what to try next."""

from __future__ import annotations

import json
import math
import time
from functools import partial
from typing import Any, Callable

from ..errors import ConfigError, SearchError
from ..option_checks import finite_float, shown
from ..progress import SearchProgress
from .effects import effect_key
from .fidelity import Scored, Scorer
from .moves import Moves
from .optuna_storage import Ledger
from .outcome import Outcome, run_candidate, side_reference
from .parallel import Pool
from .refine import Refinements
from .result import SearchResult, Trial, describe, to_json
from .space import Family, side_of
from .target import Merger

__all__ = ["SearchRun"]

Evaluate = Callable[[Any], float]


def _by_identity(value: Any) -> str:
    """A candidate's key for what JSON cannot hold (an explicit candidate's importance tensors): the object."""
    return f"<{type(value).__name__} {id(value)}>"


class SearchRun(Moves, Refinements):
    """One search's state: the merger and scorer, the budget left, the trials so far, the worker pool."""

    def __init__(self, merger: Merger, scorer: Scorer, budget: float, seed: int, progress: Any) -> None:
        self.merger, self.scorer, self.budget, self.seed = merger, scorer, budget, seed
        self.min_cost = 1.0  # a candidate starts only while its full evaluation fits (then nothing is cut short)
        self.pool: Pool | None = None
        self.left = 0.0
        self.importance: dict[str, Any] = {}
        self.proposer: Any = None  # search's sampler= (ram_live.selection.sampler); None: the moves
        self.boxes: dict[str, Any] = {}  # each sampled arm's box (sampler_box.arm_box; None: nothing to sample)
        self.ledger: Ledger | None = None  # search's storage= (ram_live.selection.optuna_storage)
        self.planned: list[tuple[str, dict[str, Any]]] = []
        self.arm_families: dict[str, list[Family]] = {}
        self.labels: dict[int, str] = {}
        self.history: list[Trial] = []
        self.seen: dict[str, Trial] = {}
        self.used = 0.0
        self.merge_seconds = self.evaluate_seconds = 0.0
        self.progress_hook, self.callback, self.bar = _progress(progress)
        if self.progress_hook is not None:
            self.progress_hook.start("search", math.ceil(budget), 0)
        if self.bar is not None:
            self.bar.begin(budget, scorer.in_prompts, scorer.n)
        self.observed: tuple[float, float] | None = None  # the lowest and highest per-prompt score seen

    # ------------------------------------------------------------------------------------------- one trial

    def run_family(self, family: Family, allowance: int) -> bool:
        """Run ``family`` with at most ``allowance`` new evaluations; True when it ran to its end (budget left)."""
        self.left = allowance
        self.current = family
        if self.left > 0:
            getattr(self, f"_{family.kind}")(family)
        return self._room(self.left) and self._room(self.budget - self.used)

    def _prepare(self, candidate: dict[str, Any]) -> tuple[dict[str, Any], str, str | None]:
        """The candidate as it is merged, its key (options as JSON, importances by label) and that label."""
        label_of = self.labels.get(id(candidate.get("importance"))) if "importance" in candidate else None
        key = json.dumps(
            to_json({**candidate, "importance": label_of} if label_of else candidate),
            sort_keys=True,
            default=_by_identity,
        )
        return candidate, key, label_of

    def prefetch(self, candidates: list[dict[str, Any]]) -> None:
        """Tell the worker pool (``parallel`` > 1) what :meth:`trial` will be asked next, in that order: the ones
        not seen yet are started now, as many as the budget could pay for; what was prefetched before and is not
        in this plan is dropped."""
        if self.ledger is not None:
            self.planned = [self._prepare(c)[1:2] + (c,) for c in candidates]  # type: ignore[misc]
        if self.pool is None:
            return
        planned = []
        for candidate in candidates:
            candidate, key, _ = self._prepare(candidate)
            if key not in self.seen and effect_key(candidate, self.merger) not in self.seen:
                planned.append((key, candidate))
        self.pool.discard(k for k in list(self.pool.pending) if k not in {k for k, _ in planned})
        room = int(min(self.left, self.budget - self.used) + 1e-9)
        for key, candidate in planned[: max(0, room)]:
            self.pool.submit(key, candidate, side_reference(self.scorer, candidate))

    def trial(self, candidate: dict[str, Any]) -> Trial | None:
        """Merge and score ``candidate`` (a repeat costs nothing: its earlier trial), or None when the family's or
        the search's budget is spent."""
        candidate, key, label_of = self._prepare(candidate)
        effect = effect_key(candidate, self.merger)
        if key in self.seen or effect in self.seen:
            return self.seen[key if key in self.seen else effect]  # type: ignore[index]
        if not (self._room(self.left) and self._room(self.budget - self.used)):
            return None
        family = self.current
        index = len(self.history)
        shown = {k: v for k, v in candidate.items() if k != "method"}
        if label_of:
            shown["importance"] = label_of
        label = f"#{index} {candidate['method']}({describe(shown)})"
        reference = side_reference(self.scorer, candidate)
        if self.ledger is not None:
            reused = self.ledger.reused
            outcome = self.ledger.outcome(
                key,
                reference,
                lambda: self._compute(key, candidate, reference, label),
                self._ahead,
                candidate,
                family.name,
            )
            if self.ledger.reused != reused:
                self._counts_for(candidate)
        else:
            outcome = self._compute(key, candidate, reference, label)
        if outcome.statistics is not None and outcome.statistics[0] not in self.merger.statistics:
            self.merger.statistics[outcome.statistics[0]] = outcome.statistics[1]
            self.merger.statistics_passes += 1
        if outcome.nonfinite is not None:
            if outcome.nonfinite.agent is not None or not self.history:
                raise outcome.nonfinite  # an input holds NaN/Inf: every candidate would fail
            trial = self._record(family, candidate, None, 0.0, 0.0, math.nan, None, str(outcome.nonfinite))
            self.seen[key] = trial
            self._notify(trial)
            return trial
        self.merge_seconds += outcome.merge_seconds
        self.evaluate_seconds += outcome.evaluate_seconds
        if outcome.not_a_number is not None:
            raise SearchError(
                f"evaluate returned {outcome.not_a_number} for candidate {label}: it must return a "
                "finite number (higher is better)",
                candidate=candidate,
            )
        if outcome.raised is not None:
            exc = outcome.raised
            raise SearchError(
                f"evaluate raised {type(exc).__name__} on candidate {label}: {exc}", candidate=candidate
            ) from exc
        scored = outcome.scored
        self._clamp(scored)
        self.scorer.record(side_of(candidate["method"]), scored)
        self.used += scored.cost
        self.left -= scored.cost
        trial = self._record(
            family,
            candidate,
            scored.score,
            outcome.merge_seconds,
            outcome.evaluate_seconds,
            outcome.extrapolation,
            outcome.lambdas,
            None,
        )
        trial.fidelity, trial.tasks, trial.stop = scored.fidelity, scored.tasks, scored.stop
        trial.se, trial.clamped, trial.values = scored.se, scored.clamped, scored.values
        self.seen[key] = trial
        effect = effect or effect_key(candidate, self.merger)  # the counts may be known now
        if effect is not None:
            self.seen.setdefault(effect, trial)
        self._notify(trial)
        return trial

    def _compute(self, key: str, candidate: dict[str, Any], reference: Scored | None, label: str) -> Outcome:
        """Merge and score ``candidate`` here or in the worker pool."""
        if self.pool is not None:
            return self.pool.score(key, candidate, reference, label)
        return run_candidate(self.merger, self.scorer, candidate, reference)

    def _counts_for(self, candidate: dict[str, Any]) -> None:
        """An outcome taken from the study: the RAM counts its merge would have taken are taken now (merged, not
        scored), so that equal-effect candidates are recognised as in the search that scored it."""
        from ..methods import get_method, make_config

        config = make_config(candidate["method"], **self.merger.options_of(candidate))
        if not get_method(candidate["method"]).needs_statistics(config):
            return
        key = self.merger.count_key(candidate, config)
        if key in self.merger.statistics:
            return
        _, _, seconds = self.merger.merge(candidate)  # the merger keeps (and counts) the pass's statistics
        self.merge_seconds += seconds

    def _ahead(self) -> list[tuple[str, Scored | None, Callable[[], Outcome], dict[str, Any]]]:
        """The candidates announced next (:meth:`prefetch`) and not scored here: what a process waiting for another
        one's claim scores meanwhile (``storage=``)."""
        out = []
        room = int(min(self.left, self.budget - self.used) + 1e-9)
        for key, candidate in self.planned[: max(0, room)]:
            if key in self.seen or effect_key(candidate, self.merger) in self.seen:
                continue
            reference = side_reference(self.scorer, candidate)
            label = f"(ahead) {candidate['method']}"
            out.append((key, reference, partial(self._compute, key, candidate, reference, label), candidate))
        return out

    def _clamp(self, scored: Scored) -> None:
        """A stopped candidate's estimate kept within the per-prompt scores seen so far (no mean, weighted mean or
        worst task of those can leave it: an estimate outside is the extrapolation of a slice, e.g. a negative
        pass@k), marked ``clamped``."""
        seen = [v for v in (scored.values or {}).values() if v is not None]
        if seen:
            lo, hi = min(seen), max(seen)
            if self.observed is not None:
                lo, hi = min(lo, self.observed[0]), max(hi, self.observed[1])
            self.observed = (lo, hi)
        if scored.fidelity < 1.0 and self.observed is not None:
            bounded = min(max(scored.score, self.observed[0]), self.observed[1])
            scored.clamped, scored.score = bounded != scored.score, bounded

    def _notify(self, trial: Trial) -> None:
        """Tell ``progress`` (a callable, a hook or the terminal line) that ``trial`` is scored."""
        if self.callback is not None:
            self.callback(trial)
        elif self.progress_hook is not None:
            self.progress_hook.update(f"{trial.label()} -> {trial.score}", 0)
        if self.bar is not None:
            complete = [t for t in self.history if t.complete]
            best = max(complete, key=lambda t: (t.score, -t.index)) if complete else None
            self.bar.trial(
                trial.index, trial.label(), self.used, None if best is None else best.score, best and best.index
            )

    def close_progress(self) -> None:
        """The search ended: a hook's stage closes, the terminal line gets its summary."""
        if self.progress_hook is not None:
            self.progress_hook.close()
        if self.bar is not None:
            self.bar.end()

    def _record(
        self,
        family: Family,
        candidate: dict[str, Any],
        score: float | None,
        merge_s: float,
        eval_s: float,
        extrapolation: float,
        lambdas: dict[str, float] | None,
        error: str | None,
    ) -> Trial:
        options = {k: v for k, v in candidate.items() if k != "method"}
        trial = Trial(
            len(self.history),
            family.name,
            candidate["method"],
            options,
            score,
            merge_s,
            eval_s,
            extrapolation,
            side_of(candidate["method"]),
            lambdas,
            error=error,
            importance=self.labels.get(id(options.get("importance"))) if "importance" in options else None,
        )
        self.history.append(trial)
        return trial

    def _room(self, left: float) -> bool:
        return left >= self.min_cost - 1e-9

    def _score(
        self, fn: Evaluate, merged: Any, candidate: dict[str, Any], label: str, what: str
    ) -> tuple[float, float]:
        t0 = time.perf_counter()
        try:
            raw = fn(merged)
        except Exception as exc:
            raise SearchError(
                f"{what} raised {type(exc).__name__} on candidate {label}: {exc}", candidate=candidate
            ) from exc
        seconds = time.perf_counter() - t0
        self.evaluate_seconds += seconds
        try:
            score = finite_float(raw, one_element=True)
        except ValueError:
            raise SearchError(
                f"{what} returned {raw!r:.80} for candidate {label}: it must return a finite number (higher is better)",
                candidate=candidate,
            ) from None
        return score, seconds

    def incumbent(self, side: str) -> Trial | None:
        scored = [t for t in self.history if t.side == side and t.complete]
        return max(scored, key=lambda t: (t.score, -t.index)) if scored else None

    # ------------------------------------------------------------------------------------------- confirm

    def confirm(self, fn: Evaluate, result: SearchResult, top: int) -> None:
        ranked = sorted(result.scored, key=lambda t: (-t.score, t.index))[:top]  # type: ignore[operator]
        for trial in ranked:
            merged, _, merge_s = self.merger.merge(trial.candidate)
            self.merge_seconds += merge_s
            trial.confirm_score, _ = self._score(
                fn, merged, trial.candidate, f"#{trial.index} {trial.label()}", "confirm"
            )


def _progress(progress: Any) -> tuple[Any, Callable[[Trial], Any] | None, SearchProgress | None]:
    """``search``'s ``progress=`` as ``(hook, callback, terminal line)``: None (a line on stderr when it is a
    terminal, log lines elsewhere), False (nothing), True (the line), a :class:`~ram_live.progress.SearchProgress`, a
    :class:`~ram_live.progress.ProgressHook` or a callable given each trial."""
    if progress is None:  # redrawn on a terminal, plain log lines elsewhere
        return None, None, SearchProgress()
    if progress is False:
        return None, None, None
    if progress is True:
        return None, None, SearchProgress(live=True)
    if isinstance(progress, SearchProgress):
        return None, None, progress
    if hasattr(progress, "update") and hasattr(progress, "start"):
        return progress, None, None
    if not callable(progress):
        raise ConfigError(
            "progress must be None, True, False, a callable taking each Trial, or a ProgressHook; got "
            + shown(progress)
        )
    return None, progress, None
