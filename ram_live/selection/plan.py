"""What a search's budget buys, before it is spent (``search(..., plan=True)``, ``ram-live search --plan``): the
candidates, the prompt-evaluations and the generations (prompts × samples) of a full search and of a raced one
(``fidelity="halving"``), and the time when one candidate's evaluation has been timed.

A full search scores every candidate on every prompt: a budget of ``N`` candidates or ``"Nx"`` buys ``⌊N⌋``
candidates, each ``n`` prompt-evaluations. A raced search stops candidates on slices of the prompts, so what it
buys depends on the scores: at least ``⌊N⌋`` candidates (all scored on every prompt), at most one scored on every
prompt (the first of its side, the race's reference) and the rest each stopped on the smallest slice that holds
at least ``MIN_RACE_PROMPTS`` prompts (:mod:`~ram_live.selection.fidelity`: fewer stop no candidate); it spends
more than ``N − 1`` and at most ``N`` full evaluations' worth of prompts (a candidate starts only while one full
evaluation fits). Both are "at most": a space with fewer candidates than the budget ends the search earlier. A
prompt set whose first slice is already every prompt (each task's slice holds at least one of its prompts) is too
small to race, and so is one where no slice but the last holds ``MIN_RACE_PROMPTS``: the plan gives no raced row,
and says so.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from fractions import Fraction
from typing import Any

from ..errors import ConfigError
from .fidelity import MIN_RACE_PROMPTS, Halving, Scorer, nested_slices

__all__ = ["PlanRow", "SearchPlan", "make_plan"]


@dataclass(frozen=True)
class PlanRow:
    """One kind of search under the budget: each count as ``(least, most)`` (equal for a full search).
    ``prompt_evaluations``, ``generations``: None without the prompt protocol; ``seconds``: None untimed."""

    fidelity: str
    candidates: tuple[int, int]
    spent: tuple[float, float]
    prompt_evaluations: tuple[int, int] | None
    generations: tuple[int, int] | None
    seconds: tuple[float, float] | None
    slices: tuple[int, ...] | None = None  # the race's slice sizes, in prompts


@dataclass(frozen=True)
class SearchPlan:
    """What ``budget`` buys with this evaluation (``search(..., plan=True)``). ``full`` and ``raced``: a
    :class:`PlanRow` each (``raced`` None when the evaluation does not score prompts one by one, or has too few
    prompts to race: its first slice would hold them all; ``note`` says which); ``prompts``, ``samples``: the
    evaluation's prompts and completions a prompt (``prompts`` 0 without the prompt protocol);
    ``seconds_per_candidate``: one full evaluation's time, if given."""

    budget: int | str
    prompts: int
    samples: int
    full: PlanRow
    raced: PlanRow | None
    seconds_per_candidate: float | None = None
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The plan as JSON-able values (ranges as ``[least, most]``).

        Returns:
            A dict of plain values.
        """
        return asdict(self)

    def text(self) -> str:
        """The plan as a few lines, a row a kind of search.

        Returns:
            The text ``ram-live search --plan`` prints.
        """
        lines = [
            f"budget {self.budget}: "
            + (f"{self.prompts} prompts × {self.samples} sample(s) an evaluation" if self.prompts else "")
            + ("" if self.seconds_per_candidate is None else f", {self.seconds_per_candidate:g} s a candidate")
        ]
        for row in (self.full, self.raced):
            if row is None:
                continue
            parts = [f"{_span(row.candidates)} candidates", f"spent {_span(row.spent, '{:.4g}')}"]
            if row.prompt_evaluations is not None and row.generations is not None:
                parts.append(f"{_span(row.prompt_evaluations)} prompt-evaluations")
                parts.append(f"{_span(row.generations)} generations")
            if row.seconds is not None:
                parts.append(f"about {_span(row.seconds, '{:.0f}')} s of evaluation")
            if row.slices is not None:
                parts.append("slices of " + "/".join(str(n) for n in row.slices) + " prompts")
            lines.append(f"  {row.fidelity:<8} " + ", ".join(parts))
        if self.note:
            lines.append(f"  ({self.note})")
        return "\n".join(lines)


def _span(pair: tuple[Any, Any], fmt: str = "{}") -> str:
    lo, hi = pair
    return fmt.format(lo) if lo == hi else f"{fmt.format(lo)}–{fmt.format(hi)}"


def samples_of(evaluate: Any) -> int:
    """Completions a prompt: ``evaluate.settings.samples`` (:func:`ram_live.evaluate.rewards`) or
    ``evaluate.samples``; else 1."""
    for value in (getattr(getattr(evaluate, "settings", None), "samples", None), getattr(evaluate, "samples", None)):
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return value
    return 1


def make_plan(
    scorer: Scorer, budget: int | str, units: float, halving: Halving | None, seconds: float | None
) -> SearchPlan:
    """The plan of a search with ``scorer`` (its evaluation), ``units`` of ``budget`` (candidates or full
    evaluations), the race ``halving`` (None: the default :class:`Halving`) and ``seconds`` a full evaluation."""
    n, samples = scorer.n, samples_of(scorer.evaluate)
    exact, fuzz = Fraction(units), Fraction(1, 10**9)  # exact: a budget of 10**16 keeps its ranges in order
    count = math.floor(exact + fuzz)
    if seconds is not None and not math.isfinite(seconds * units):
        raise ConfigError(
            f"seconds_per_candidate={seconds:g} × the budget's {units:g} evaluations is beyond float's range"
        )

    def row(
        fidelity: str,
        cands: tuple[int, int],
        spent: tuple[float, float],
        prompts: tuple[int, int] | None,
        slices: tuple[int, ...] | None = None,
    ) -> PlanRow:
        gens = None if prompts is None else (prompts[0] * samples, prompts[1] * samples)
        secs = None if seconds is None else (spent[0] * seconds, spent[1] * seconds)
        return PlanRow(fidelity, cands, spent, prompts, gens, secs, slices)

    full = row("full", (count, count), (float(count), float(count)), (count * n, count * n) if n else None)
    if not scorer.protocol:
        note = "the evaluation is a plain callable: no prompt counts, and no race (it needs the prompt protocol)"
        return SearchPlan(budget, 0, samples, full, None, seconds, note)
    race = halving or Halving()
    slices = nested_slices(scorer.tasks, race.fractions, race.seed)
    if len(slices[0]) >= n:  # every slice is every prompt (a slice holds at least one prompt of each task)
        note = (
            f"{n} prompts are too few to race: with min_fraction={race.min_fraction:g} the first slice already "
            "holds every prompt (at least one of each task), so a race stops no candidate and buys what the full "
            "search buys"
        )
        return SearchPlan(budget, n, samples, full, None, seconds, note)
    # the smallest slice a candidate can be stopped on: one before the last, of MIN_RACE_PROMPTS prompts or more
    stops = [len(s) for s in slices[:-1] if len(s) >= MIN_RACE_PROMPTS and len(s) < n]
    if not stops:
        note = (
            f"{n} prompts are too few to race: no slice but the last holds {MIN_RACE_PROMPTS} prompts, the fewest "
            "the race stops a candidate on, so a race stops no candidate and buys what the full search buys"
        )
        return SearchPlan(budget, n, samples, full, None, seconds, note)
    smallest = stops[0]
    # the most: one reference scored on every prompt, every other candidate stopped on the smallest slice, each
    # started while a full evaluation's worth is left
    most = 1 + (math.floor((exact - 2) * n / smallest + fuzz) + 1 if exact >= 2 - fuzz else 0)
    least_prompts = math.floor((exact - 1) * n + fuzz) + 1
    most_prompts = math.floor(exact * n + fuzz)
    note = None if isinstance(budget, str) else f"a raced search counts its budget in prompts: budget='{budget}x'"
    raced = row(
        "raced",
        (count, max(count, most)),
        (least_prompts / n, most_prompts / n),
        (least_prompts, most_prompts),
        tuple(len(s) for s in slices),
    )
    return SearchPlan(budget, n, samples, full, raced, seconds, note)
