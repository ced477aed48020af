"""One candidate merged and scored, wherever that happens (the search's own process or a worker): what came of
it as plain data, failures included, so that a worker's outcome is taken exactly as the search's own would be."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ..errors import NonFiniteError
from ..methods import get_method, make_config
from .effects import extrapolation_of
from .fidelity import Scored, Scorer, _NotANumber
from .space import side_of
from .target import Merger

__all__ = ["Outcome", "run_candidate"]


@dataclass
class Outcome:
    """What merging and scoring a candidate gave. Exactly one of ``scored``, ``nonfinite``, ``not_a_number`` and
    ``raised`` is set. ``statistics``: ``(key, counts)`` the merge used (RAM family), so that the search's own
    merger holds the counts a one-process search would hold at this point."""

    merge_seconds: float = 0.0
    evaluate_seconds: float = 0.0
    scored: Scored | None = None
    extrapolation: float = float("nan")
    lambdas: dict[str, float] | None = None
    statistics: tuple[Any, Any] | None = None
    nonfinite: NonFiniteError | None = None
    not_a_number: str | None = None  # repr of what the evaluation returned
    raised: BaseException | None = None


def run_candidate(merger: Merger, scorer: Scorer, candidate: dict[str, Any], reference: Scored | None) -> Outcome:
    """Merge ``candidate`` into ``merger``'s output and score it (raced against ``reference`` when given)."""
    try:
        merged, info, merge_s = merger.merge(candidate)
    except NonFiniteError as exc:
        return Outcome(nonfinite=exc)
    out = Outcome(merge_seconds=merge_s)
    method = get_method(candidate["method"])
    config = make_config(candidate["method"], **merger.options_of(candidate))
    if method.needs_statistics(config) and info.statistics is not None:
        out.statistics = (merger.count_key(candidate, config), info.statistics)

    def again() -> Any:  # a later slice of the race: the candidate merged anew (the counts are reused)
        fresh, _, seconds = merger.merge(candidate)
        out.merge_seconds += seconds
        return fresh

    t0 = time.perf_counter()
    try:
        out.scored = scorer.score(merged, reference, again)
    except _NotANumber as exc:
        out.not_a_number = f"{exc.raw!r:.80}"
    except Exception as exc:
        out.raised = exc
    out.evaluate_seconds = time.perf_counter() - t0 - (out.merge_seconds - merge_s)
    if out.scored is not None:
        out.extrapolation, out.lambdas = extrapolation_of(candidate, info, merger)
    return out


def side_reference(scorer: Scorer, candidate: dict[str, Any]) -> Scored | None:
    """The reference a candidate races against now: its side's best full-scored candidate (None: no race)."""
    return scorer.reference(side_of(candidate["method"]))
