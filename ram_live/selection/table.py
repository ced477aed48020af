"""A search's table (:meth:`~ram_live.selection.result.SearchResult.table`): every trial in order, then the winner,
the best baseline, who is within one standard error of the winner, and the time split; every mark a row can carry
is explained under the table."""

from __future__ import annotations

from typing import Any

from .choice import could_not_choose
from .fidelity import MIN_RACE_PROMPTS

__all__ = ["format_table", "within_one_se"]

#: The most trials the "within one standard error" line names (the rest are counted).
NAMED = 5


def _short(name: str, width: int = 10) -> str:
    return name if len(name) <= width else name[: width - 1] + "…"


def within_one_se(result: Any) -> list[Any]:
    """The other trials scored on every prompt whose score is at least the winner's minus the winner's standard
    error (best first): the evidence does not separate them from the winner. Empty without a standard error."""
    best = result.best_trial
    if best.se is None:
        return []
    close = [t for t in result.complete if t.index != best.index and t.score >= best.score - best.se]  # type: ignore
    return sorted(close, key=lambda t: (-t.score, t.index))  # type: ignore[operator]


def _raced_any(history: list[Any]) -> bool:
    """Whether a candidate had one of its side scored on every prompt before it: what a race compares it with."""
    seen: set[str] = set()
    for t in history:
        if t.side in seen and t.score is not None:
            return True
        if t.complete:
            seen.add(t.side)
    return False


def _undecided_lines(result: Any) -> list[str]:
    """The table's word that the search could not choose (:attr:`SearchResult.arbitrary`), with the likely causes."""
    if not result.arbitrary:
        return []
    head, pick = could_not_choose(result, short=True)
    lines = [f"arbitrary: {head}; the search could not choose, the winner is {pick}"]
    if result.choice_causes:
        lines.append("likely causes: " + "; ".join(result.choice_causes))
    return lines


def format_table(result: Any) -> str:
    """The table as text: ``*`` the winner (``arbitrary:`` under the table when every candidate scored the same, or
    another is within one paired standard error of the winner, with the likely causes); ``!`` extrapolates past
    :data:`~ram_live.selection.result.EXTRAPOLATION_FAR`; ``~`` (race) an estimate, its task columns the slice's
    scores; ``~c`` an estimate clamped to the range of the per-prompt scores; ``se`` the standard error."""
    history = result.history
    best = result.best_trial
    confirm = any(t.confirm_score is not None for t in history)
    raced = any(t.fidelity < 1.0 for t in history)
    with_se = any(t.se is not None for t in history)
    tasks = list(dict.fromkeys(k for t in history for k in (t.tasks or {})))
    shown_tasks = tasks if len(tasks) > 1 else []
    head = (
        f"{'#':>3}  {'family':<16} {'score':>12}"
        + (f" {'se':>9}" if with_se else "")
        + (f" {'seen':>5}" if raced else "")
        + "".join(f" {_short(k):>11}" for k in shown_tasks)
        + (f" {'confirm':>11}" if confirm else "")
        + f" {'extrap':>7} {'merge s':>8} {'eval s':>8}  candidate"
    )
    lines = [head]
    for t in history:
        mark = ("~c" if t.clamped else "~") if t.stop or t.fidelity < 1.0 else ""
        score = "failed" if t.score is None else f"{t.score:.6g}{mark}"
        row = f"{t.index:>3}{'*' if t.index == best.index else ' '} {t.family:<16} {score:>12}"
        if with_se:
            row += f" {'' if t.se is None else f'±{t.se:.3g}':>9}"
        if raced:
            row += f" {t.fidelity:>5.0%}"
        for k in shown_tasks:
            v = (t.tasks or {}).get(k)
            row += f" {'' if v is None else f'{v:.4g}' + ('~' if mark else ''):>11}"
        if confirm:
            row += f" {'' if t.confirm_score is None else f'{t.confirm_score:.6g}':>11}"
        row += (
            f" {t.extrapolation:>6.3g}{'!' if t.extrapolates else ' '} {t.merge_seconds:>8.3f} "
            f"{t.evaluate_seconds:>8.3f}  {t.label()}"
        )
        lines.append(row)
    lines.append("")
    lines.append(
        f"best: {best.label()}  score {result.best_score:.6g}" + ("" if best.se is None else f" ± {best.se:.3g} (se)")
    )
    lines.extend(_undecided_lines(result))
    close = within_one_se(result)
    if close and not result.arbitrary:
        named = ", ".join(f"#{t.index} {t.score:.6g}" for t in close[:NAMED])
        more = f" and {len(close) - NAMED} more" if len(close) > NAMED else ""
        lines.append(
            f"within one standard error of the winner (score >= {result.best_score - best.se:.6g}): "  # type: ignore
            f"{named}{more}; the evaluation does not tell them apart"
        )
    baseline = result.best_baseline
    if baseline is not None:
        lines.append(f"best baseline: {baseline.label()}  score {baseline.score:.6g}  (margin {result.margin():+.6g})")
    if raced:
        lines.append(
            "~: stopped early by the race (seen: share of the prompts): its score is an estimate (its side's "
            "best at the time + its gap to it on the slice), below that best, and never wins; its task columns "
            "are its scores on the slice it saw"
        )
    slices = getattr(result, "race_slices", None)
    if slices and not any(t.stop for t in history):
        if slices[0] >= slices[-1]:
            why = "the first slice holds every prompt: too few prompts to race"
        elif all(n < MIN_RACE_PROMPTS for n in slices[:-1]):
            why = (
                f"no slice but the last holds {MIN_RACE_PROMPTS} prompts, the fewest the race stops a candidate on: "
                "too few prompts to race"
            )
        elif not _raced_any(history):
            why = "none was raced: each was the first of its side (RAM family, baselines) scored on every prompt"
        else:
            why = "none trailed its side's best by more than the race's z standard errors on a slice"
        lines.append(
            "race: no candidate was stopped early (slices of " + "/".join(str(n) for n in slices) + " prompts): "
            "every candidate saw every prompt, as in a full search; " + why
        )
    if any(t.clamped for t in history):
        lines.append("~c: an estimate outside the range of the per-prompt scores seen, clamped to that range")
    if with_se:
        lines.append("se: the standard error of the score over the prompts (jackknife over groups of prompts)")
    if shown_tasks and best.tasks:
        lines.append("best per task: " + ", ".join(f"{k} {v:.4g}" for k, v in best.tasks.items()))
    lines.append(
        f"{len(history)} trials, budget {result.budget} (spent {result.spent:.3g}), sampler {result.sampler}, "
        f"{result.statistics_passes} statistics "
        f"pass(es); merge {result.merge_seconds:.2f} s, evaluate {result.evaluate_seconds:.2f} s, "
        f"other {result.overhead_seconds:.2f} s"
    )
    return "\n".join(lines)
