"""Whether a search could choose: when every candidate scored the same (or, scored prompt by prompt, another one is
within one standard error of the paired per-prompt differences from the winner), the winner is an arbitrary pick
(the earliest of equal scores); the search says so with an :class:`ArbitraryChoiceWarning` naming the likely causes,
the result carries it (``SearchResult.arbitrary``, ``choice_causes``), and the table shows it. A raced search also
keeps its slices, so that its table can say when the race stopped no candidate.

>>> result = search(agents, base=base, evaluate=evaluate, budget="20x")             # doctest: +SKIP
>>> result.arbitrary, result.choice_causes                                         # doctest: +SKIP
(True, ['the pass threshold 2 is above every weighted reward seen (at most 1): ...'])
"""

from __future__ import annotations

import math
import warnings
from typing import Any

from ..errors import RamLiveWarning
from .fidelity import paired_se

__all__ = [
    "ArbitraryChoiceWarning",
    "all_same",
    "undecided",
    "paired",
    "rivals",
    "likely_causes",
    "could_not_choose",
    "note_choice",
]

#: Scores this close (relative to the larger magnitude, at least absolute) are "the same" without a standard error.
SAME = 1e-12


class ArbitraryChoiceWarning(RamLiveWarning):
    """A search could not choose: every candidate scored on every prompt scored the same, or another one is within
    one standard error of the paired per-prompt differences from the winner. The winner is an arbitrary pick among
    them; ``causes`` names the likely reasons (a pass threshold above the rewards' range, completions cut short by
    ``max_new_tokens``, rewards that are all zero, an evaluation that does not depend on the weights)."""

    def __init__(self, message: str, *, causes: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.causes = causes


def undecided(result: Any) -> bool:
    """Whether ``result``'s winner is arbitrary, judged on the candidates scored on every prompt (a candidate the
    race stopped early does not count, for or against): at least two of them, and either all their scores equal
    up to :data:`SAME`, or (where the evaluation scores prompts one by one) some other one of them is not told
    apart from the winner by a paired comparison on the same prompts (:func:`rivals`)."""
    complete = result.complete
    if len(complete) < 2:
        return False
    if all_same([float(t.score) for t in complete]):
        return True
    return bool(rivals(result))


def paired(best: Any, other: Any) -> tuple[float, float] | None:
    """``(lead, se)``: how far ``best`` scores above ``other``, and the standard error of the mean of their paired
    per-prompt differences (``stdev(d) / sqrt(n)`` over the prompts both scored; 0 for one prompt); None when
    either lacks per-prompt scores."""
    if best.values is None or other.values is None:
        return None
    n, se = paired_se(best.values, other.values, best.values)
    return None if n == 0 else (float(best.score) - float(other.score), se)


def rivals(result: Any) -> list[tuple[Any, float, float]]:
    """The candidates scored on every prompt that the winner does not clearly beat: ``(trial, lead, se)`` for each
    whose lead is within one paired standard error (:func:`paired`; a zero lead always is), the closest first.
    Empty for trials without per-prompt scores (their rule is equality, :func:`undecided`)."""
    best = result.best_trial
    out = []
    for t in result.complete:
        if t is best:
            continue
        pair = paired(best, t)
        if pair is not None and pair[0] <= pair[1] + SAME * max(1.0, abs(float(best.score))):
            out.append((t, *pair))
    return sorted(out, key=lambda r: (r[1], r[0].index))


def all_same(scores: list[float]) -> bool:
    """Whether the scores are equal, up to float noise (``SAME`` relative to the largest, at least 1)."""
    return max(scores) - min(scores) <= SAME * max(1.0, abs(max(scores)))


def likely_causes(result: Any, evaluate: Any) -> list[str]:
    """Why every candidate may have scored the same, from the scores and what ``evaluate`` exposes (a
    :func:`ram_live.evaluate.rewards` evaluation: its metric, pass threshold, ``max_new_tokens`` and the last
    rewards it saw); the most specific first."""
    evaluate = _unwrapped(evaluate)
    complete = result.complete
    scores = [float(t.score) for t in complete]
    exact = all_same(scores)
    causes: list[str] = []
    metric = getattr(evaluate, "metric", None)
    seen = _weighted_range(evaluate)
    all_zero = exact and all(s == 0.0 for s in scores)
    if getattr(metric, "kind", None) == "pass":
        threshold = float(metric.threshold)
        if exact and seen is not None and threshold > seen[1]:  # (scores that differ: some completion passed)
            causes.append(
                f"the pass threshold {threshold:g} (pass_threshold=, --pass-threshold) is above every weighted "
                f"reward seen (at most {seen[1]:g}): no completion can pass, whatever the merge"
            )
        elif all_zero:
            causes.append(f"no completion reached the pass threshold {threshold:g} (pass_threshold=, --pass-threshold)")
    if seen is not None and seen == (0.0, 0.0):
        causes.append("every reward function returned 0 for every completion seen")
    settings = getattr(evaluate, "settings", None)
    tokens = getattr(settings, "max_new_tokens", None)
    if isinstance(tokens, int) and (all_zero or seen is not None and seen[0] == seen[1]):
        causes.append(
            f"max_new_tokens={tokens} (--max-new-tokens) may be too few tokens for an answer: completions cut short "
            "score alike"
        )
    if exact and not causes:
        causes.append(
            f"the evaluation returned {scores[0]:.6g} for every candidate: it may not depend on the merged weights "
            "(or the agents may not differ from the base)"
        )
    close = rivals(result) if not exact else []
    if close:
        rival, lead, se = close[0]
        if se == 0.0:  # the same score on every prompt both scored: more of such prompts would not help
            causes.append(f"the winner and #{rival.index} scored the same on every prompt: the evaluation ties them")
        else:
            causes.append(
                f"the winner leads #{rival.index} by {lead:.3g}, within the standard error of their paired "
                f"per-prompt differences ({se:.3g}): more prompts (or samples) would tell them apart"
            )
    return causes


def _unwrapped(evaluate: Any) -> Any:
    """The evaluation a wrapper scores with (a training search's candidates swapped into the model keep the
    evaluation as ``fn``), for its metric, settings and rewards."""
    for _ in range(4):
        inner = getattr(evaluate, "fn", None)
        if hasattr(evaluate, "metric") or inner is None:
            break
        evaluate = inner
    return evaluate


def _weighted_range(evaluate: Any) -> tuple[float, float] | None:
    """Bounds of the weighted rewards of the evaluation's last call (each function's rewards, weighted and summed
    at their extremes: a completion's weighted reward lies within them), or None when it exposes none."""
    rewards = getattr(evaluate, "function_rewards", None)
    weights = getattr(evaluate, "weights", None)
    if not callable(rewards) or not isinstance(weights, (list, tuple)):
        return None
    try:
        columns = list(rewards().values())
    except Exception:  # whatever the evaluation holds: no diagnosis from it
        return None
    if not any(columns) or len(columns) != len(weights):
        return None
    low = high = 0.0
    for w, column in zip(weights, columns):
        if column:
            ends = (w * min(column), w * max(column))
            low, high = low + min(ends), high + max(ends)
    return (low, high) if math.isfinite(low) and math.isfinite(high) else None


def could_not_choose(result: Any, *, short: bool = False) -> tuple[str, str]:
    """The words for a search that could not choose (:func:`undecided`): what its scores show and which of them
    the winner is; as the :class:`ArbitraryChoiceWarning` says them, or ``short`` as the table does.

    Args:
        result: the :class:`~ram_live.selection.result.SearchResult`, undecided.
        short: the table's shorter words.

    Returns:
        ``(spread, which)``, e.g. ``("all 5 candidates scored 0.25", "the earliest")``.
    """
    scores = [float(t.score) for t in result.complete]
    if all_same(scores):
        if short:
            return f"all {len(scores)} candidates have the same score", "the earliest of them"
        return f"all {len(scores)} candidates scored {scores[0]:.6g}", "the earliest"
    close = rivals(result)
    spread = f"{len(close)} of the {len(scores)} candidates"
    if short:
        spread += " are within one paired standard error of the winner"
    else:
        spread += (
            f" scored on every prompt are within one paired standard error of the winner (the closest, "
            f"#{close[0][0].index}, by {close[0][1]:.3g} ± {close[0][2]:.3g})"
        )
    return spread, "the highest, by less than the paired standard error"


def note_choice(result: Any, evaluate: Any, slices: Any = None, stacklevel: int = 3) -> None:
    """After a search: keep the race's slice sizes on ``result`` (``race_slices``), and when the winner is
    arbitrary (:func:`undecided`) set ``result.choice_causes`` and warn with :class:`ArbitraryChoiceWarning`.

    Args:
        result: the :class:`~ram_live.selection.result.SearchResult`.
        evaluate: the search's evaluation (read for :func:`likely_causes`).
        slices: the race's slices (lists of prompt indices), or None without a race.
        stacklevel: passed to :func:`warnings.warn` (the caller of ``search``).
    """
    result.race_slices = tuple(len(s) for s in slices) if slices else None
    if not undecided(result):
        return
    causes = likely_causes(result, evaluate)
    result.choice_causes = causes
    best = result.best_trial
    spread, which = could_not_choose(result)
    warnings.warn(
        ArbitraryChoiceWarning(
            f"the search could not choose: {spread}; the winner #{best.index} "
            f"{best.label()} is an arbitrary pick ({which}). Likely causes: " + "; ".join(causes),
            causes=tuple(causes),
        ),
        stacklevel=stacklevel,
    )
