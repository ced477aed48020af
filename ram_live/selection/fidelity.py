"""How a search scores a candidate: on every prompt, or raced against its side's best on nested, stratified slices
of the prompts (multi-fidelity successive halving).

**The prompt protocol.** An evaluation that scores prompts one by one (:func:`ram_live.evaluate.rewards` does)
exposes, beside ``evaluate(merged) -> float``:

- ``prompt_tasks() -> list[str]``: each prompt's task (its group; one task for all is fine);
- ``prompt_scores(merged, indices) -> list[float | None]``: the score of each of those prompts (None: not
  scored, left out as TRL's ``nanmean`` leaves it out);
- ``aggregate(values) -> (score, {task: score})``: the objective over a ``{prompt index: score}`` mapping (the
  mean over tasks, their weighted mean or the worst task), and each task's score.

With it, ``search`` can show every task's score for every candidate, count its budget in prompts (``"20x"``:
twenty full evaluations' worth) and race.

**The race** (``fidelity="halving"``, :class:`Halving`). Slices are nested: each task's prompts in a seeded order,
the first ``⌈f·n_task⌉`` (at least one) of each task at fraction ``f``; the fractions are ``min_fraction``,
``min_fraction·eta``, ... and 1. A candidate is scored on the smallest slice and compared, prompt by prompt, with
the best full-scored candidate of its side (RAM or baseline) on the same prompts: it goes on to the next slice
unless it is worse by more than ``z`` standard errors of the paired differences; never on a slice where fewer
than :data:`MIN_RACE_PROMPTS` prompts were scored by both (it goes on to a larger one). A candidate stopped early
keeps the estimate ``reference score + (its slice score − the reference's slice score)``, which is below the
reference's score, so it never wins; the winner and every baseline the table calls best saw every prompt. The first
candidate of each side, and every candidate without the protocol, is scored on every prompt. A candidate starts
only while the budget could pay for all of its prompts, so no promising candidate is cut short by the budget.
"""

from __future__ import annotations

import decimal
import math
import random
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from ..errors import ConfigError
from ..evaluate import moments
from ..option_checks import finite_float, shown

__all__ = ["Halving", "Scored", "Scorer", "paired_se", "parse_budget", "parse_fidelity", "prompt_protocol"]

Values = dict[int, "float | None"]


@dataclass(frozen=True)
class Halving:
    """The multi-fidelity race.

    Args:
        eta: each slice is ``eta`` times the previous one (> 1).
        min_fraction: the first slice's share of the prompts (in (0, 1]). Together with ``eta``, at most
            :data:`MAX_RUNGS` slices (``eta=1 + 1e-9`` would make billions).
        z: how many standard errors of the paired per-prompt differences a candidate may trail its side's best
            by on a slice and still go on (>= 0; 0: go on only when not behind).
        seed: orders each task's prompts (the slices).

    Raises:
        ConfigError: an option out of its range, or ``eta`` and ``min_fraction`` that give more than
            :data:`MAX_RUNGS` slices, naming them.

    >>> Halving().fractions
    (0.1111111111111111, 0.3333333333333333, 1.0)
    """

    eta: float = 3.0
    min_fraction: float = 1.0 / 9.0
    z: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not _real(self.eta) or not self.eta > 1:
            raise ConfigError(f"Halving: eta must be a number > 1, got {self.eta!r}")
        if not _real(self.min_fraction) or not 0 < self.min_fraction <= 1:
            raise ConfigError(f"Halving: min_fraction must be in (0, 1], got {self.min_fraction!r}")
        if not _real(self.z) or not 0 <= self.z < math.inf:
            raise ConfigError(f"Halving: z must be a finite number >= 0, got {self.z!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ConfigError(f"Halving: seed must be an int, got {self.seed!r}")
        if _rising(float(self.min_fraction), float(self.eta), MAX_RUNGS) is None:
            span = -math.log(float(self.min_fraction))  # log(1/min_fraction), finite even for a subnormal
            rungs = math.ceil(span / math.log(float(self.eta))) + 1
            lowest = math.ceil(math.exp(span / (MAX_RUNGS - 1)) * 1e4) / 1e4  # (rounded up)
            raise ConfigError(
                f"Halving: eta={self.eta!r} with min_fraction={self.min_fraction!r} gives about {rungs:.3g} slices, "
                f"more than {MAX_RUNGS}; take eta >= {lowest} (or a larger min_fraction)"
            )

    @property
    def fractions(self) -> tuple[float, ...]:
        return _rising(float(self.min_fraction), float(self.eta), MAX_RUNGS) or (1.0,)


#: The fewest paired per-prompt differences on which the race stops a candidate: on fewer, one unlucky prompt
#: (or two) would stop it, their standard error being 0 or taken from a single spread. Four equal shortfalls have
#: a sign-test chance of 1/16 under no difference, about the one-sided chance of ``z=1`` (0.16) or less.
MIN_RACE_PROMPTS = 4

#: The most slices (rungs) a race may have: each is a round of scoring and comparison, and past a few dozen the
#: slices differ by a prompt or none. ``Halving`` refuses an ``eta`` (with ``min_fraction``) that gives more.
MAX_RUNGS = 64


def _rising(first: float, eta: float, most: int) -> tuple[float, ...] | None:
    """``first, first·eta, ...`` while below 1, then 1: the race's fractions; None when that is more than ``most``."""
    out, f = [], first
    while f < 1.0 - 1e-12:
        if len(out) >= most - 1:
            return None
        out.append(f)
        f *= eta
    return (*out, 1.0)


def parse_fidelity(fidelity: Any) -> Halving | None:
    """``search``'s ``fidelity=``: None/"full" (every candidate on every prompt), "halving" or a :class:`Halving`."""
    if fidelity is None or fidelity == "full":
        return None
    if fidelity == "halving":
        return Halving()
    if isinstance(fidelity, Halving):
        return fidelity
    raise ConfigError(f"fidelity must be None, 'full', 'halving' or a Halving(...), got {shown(fidelity)}")


#: The largest budget, in candidates or full evaluations: far more than any search spends.
MAX_BUDGET = 10**18


def parse_budget(budget: Any) -> tuple[float, bool]:
    """``search``'s ``budget=``: an int (candidates: each costs 1 whatever it saw) or ``"20x"`` (prompt-evaluations,
    in full evaluations' worth), at most :data:`MAX_BUDGET`. Returns ``(units, in_prompts)``."""
    if isinstance(budget, (int, str)) and not isinstance(budget, bool) and _beyond(budget):
        raise ConfigError(f"budget={shown(budget)} is beyond what a search can spend: at most {MAX_BUDGET:.0e}")
    if isinstance(budget, str):
        text = budget.strip().lower()
        if text.endswith("x"):
            try:
                value = float(text[:-1])
            except ValueError:
                value = math.nan
            if math.isfinite(value) and value >= 1:
                return value, True
            if math.isfinite(value) and value > 0:
                raise ConfigError(
                    f"budget={budget!r} cannot pay for one candidate on every prompt: a prompt budget is at least '1x'"
                )
        raise ConfigError(
            f"budget must be an int >= 1 (candidates) or a string like '20x' (twenty full "
            f"evaluations' worth of prompts), got {shown(budget)}"
        )
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise ConfigError(f"budget must be an int >= 1 (candidates) or a string like '20x', got {shown(budget)}")
    return float(budget), False


def _beyond(budget: int | str) -> bool:
    """Whether ``budget`` (an int or an ``"Nx"`` string) exceeds :data:`MAX_BUDGET`."""
    if isinstance(budget, int):
        return budget > MAX_BUDGET
    try:
        value = decimal.Decimal(budget.strip().lower().removesuffix("x"))  # exact: "1e400" is no float
    except decimal.InvalidOperation:
        return False
    return value.is_finite() and value > MAX_BUDGET


def prompt_protocol(evaluate: Any) -> bool:
    """Whether ``evaluate`` scores prompts one by one (the protocol above)."""
    return all(callable(getattr(evaluate, name, None)) for name in ("prompt_tasks", "prompt_scores", "aggregate"))


@dataclass
class Scored:
    """A candidate's score: ``score`` (the objective on every prompt, or a stopped candidate's estimate),
    ``cost`` (in full evaluations), ``fidelity`` (share of the prompts seen), ``tasks`` (each task's score on the
    prompts seen), ``values`` (per prompt, for the race), why it stopped early, ``se`` (the standard error of a
    score on every prompt, :func:`standard_error`) and ``clamped`` (an estimate brought into the range of the
    per-prompt scores seen)."""

    score: float
    cost: float
    fidelity: float = 1.0
    tasks: dict[str, float] | None = None
    values: Values | None = None
    stop: str | None = None  # "race": clearly worse than its side's best on a slice
    se: float | None = None
    clamped: bool = False


@dataclass
class Scorer:
    """Scores candidates for a search: ``score(merged, reference) -> Scored`` (``reference``: what the race runs
    against, :meth:`reference` of the candidate's side; None: every prompt); :meth:`record` keeps each side's
    best."""

    evaluate: Callable[[Any], Any]
    halving: Halving | None = None
    in_prompts: bool = False
    best: dict[str, Scored] = field(default_factory=dict)  # side -> the best full-scored candidate
    slices: list[list[int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.protocol = prompt_protocol(self.evaluate)
        if self.halving is not None and not self.protocol:
            raise ConfigError(
                "fidelity='halving' needs an evaluation that scores prompts one by one "
                "(ram_live.evaluate.rewards, or prompt_tasks/prompt_scores/aggregate: "
                "docs/search.md); this evaluate is a plain callable"
            )
        self.n, self.tasks = 0, []
        if self.protocol:
            try:  # (only the grouping matters: each prompt's task as text)
                tasks = [str(t) for t in self.evaluate.prompt_tasks()]
            except Exception as exc:
                raise ConfigError(
                    f"the evaluation's prompt_tasks() failed ({type(exc).__name__}: {exc}); it must "
                    "return each prompt's task"
                ) from exc
            self.n, self.tasks = len(tasks), tasks
            if self.n == 0:
                raise ConfigError("the evaluation has no prompts")
            if self.halving is not None:
                self.slices = nested_slices(tasks, self.halving.fractions, self.halving.seed)

    def reference(self, side: str) -> Scored | None:
        """The best full-scored candidate of ``side`` so far, when racing (else None)."""
        return self.best.get(side) if self.halving is not None else None

    def record(self, side: str, scored: Scored) -> None:
        """Take ``scored`` as ``side``'s reference if it saw every prompt and beats the one so far."""
        if scored.fidelity >= 1.0 and (side not in self.best or scored.score > self.best[side].score):
            self.best[side] = scored

    def score(self, merged: Any, reference: Scored | None, again: Callable[[], Any] | None = None) -> Scored:
        """Score ``merged``; ``again()`` gives the candidate merged anew for each later slice of a race (so that
        whatever one ``prompt_scores`` call did to what it was handed, the next one sees the merge itself)."""
        if not self.protocol:
            return Scored(_number(self.evaluate(merged)), 1.0)
        values: Values = {}
        stop = None
        plan = self.slices if reference is not None else [list(range(self.n))]
        for rung, indices in enumerate(plan):
            new = [i for i in indices if i not in values]
            if new:  # (slices can coincide when a task has few prompts)
                if values and again is not None:
                    merged = again()
                values.update(zip(new, self._prompt_scores(merged, new)))
            if rung == len(plan) - 1:
                break
            if self._behind(values, reference, indices):  # type: ignore[arg-type]
                stop = "race"
                break
        fidelity = len(values) / self.n
        score, tasks = self._aggregate(values)
        if fidelity < 1.0:
            ref_score, _ = self._aggregate({i: reference.values[i] for i in values})  # type: ignore[union-attr]
            score = reference.score + (score - ref_score)  # type: ignore[union-attr]
        cost = fidelity if self.in_prompts else 1.0
        se = standard_error(self._aggregate, values, self.tasks) if fidelity >= 1.0 else None
        return Scored(score, cost, fidelity, tasks, values, stop, se)

    def _behind(self, values: Values, reference: Scored, indices: Sequence[int]) -> bool:
        """Whether the candidate trails ``reference`` on ``indices`` by more than ``z`` paired standard errors, on
        at least :data:`MIN_RACE_PROMPTS` prompts both scored."""
        mine, theirs = (
            self._aggregate({i: values[i] for i in indices}),
            self._aggregate({i: reference.values[i] for i in indices}),
        )  # type: ignore[index]
        gap = mine[0] - theirs[0]
        n, se = paired_se(values, reference.values, indices)  # type: ignore[arg-type]
        if n < MIN_RACE_PROMPTS:  # too few to tell a worse candidate from a bad draw: it goes on
            return False
        return gap < -self.halving.z * se  # type: ignore[union-attr]

    def _prompt_scores(self, merged: Any, indices: list[int]) -> list[float | None]:
        out = list(self.evaluate.prompt_scores(merged, indices))
        if len(out) != len(indices):
            raise _NotANumber(f"prompt_scores gave {len(out)} scores for {len(indices)} prompts")
        return [None if v is None else _number(v) for v in out]

    def _aggregate(self, values: Mapping[int, float | None]) -> tuple[float, dict[str, float]]:
        score, tasks = self.evaluate.aggregate(dict(values))
        return _number(score), {str(k): float(v) for k, v in dict(tasks).items()}


class _NotANumber(Exception):
    """What the evaluation gave is not a finite number (the search turns it into a SearchError)."""

    def __init__(self, raw: Any) -> None:
        super().__init__(raw)
        self.raw = raw


def _number(raw: Any) -> float:
    """A score the evaluation gave as a float (a one-element tensor or array is taken as its value), else
    :class:`_NotANumber`."""
    try:
        return finite_float(raw, one_element=True)
    except ValueError:
        raise _NotANumber(raw) from None


def nested_slices(tasks: Sequence[str], fractions: Sequence[float], seed: int) -> list[list[int]]:
    """For each fraction, the sorted prompt indices of its slice: of each task's prompts (in a seeded order), the
    first ``⌈f·n_task⌉``, at least one; each slice holds the previous one.

    >>> nested_slices(["a", "a", "b", "b", "b", "b"], [0.25, 1.0], seed=0)[0]
    [1, 2]
    """
    by_task: dict[str, list[int]] = {}
    for i, t in enumerate(tasks):
        by_task.setdefault(t, []).append(i)
    rng = random.Random(seed)
    order = {t: rng.sample(ids, len(ids)) for t, ids in sorted(by_task.items())}
    out = []
    for f in fractions:
        picked = [i for ids in order.values() for i in ids[: max(1, math.ceil(f * len(ids) - 1e-9))]]
        out.append(sorted(picked))
    return out


#: Groups of prompts the standard error's jackknife leaves out one at a time (fewer prompts: one prompt a group).
JACKKNIFE_GROUPS = 20


def standard_error(
    aggregate: Callable[[Mapping[int, float | None]], tuple[float, Any]], values: Values, tasks: Sequence[str]
) -> float | None:
    """The standard error of ``aggregate(values)[0]`` by the delete-a-group jackknife: the prompts dealt in turn,
    each task's in its order, into :data:`JACKKNIFE_GROUPS` groups, the objective recomputed without each group:
    ``sqrt((G - 1) / G · Σ (θ_g - θ̄)²)``. Whatever the objective (the mean over prompts, over tasks, their
    weighted mean or the worst task), no formula of its own is needed. None with fewer than two prompts scored.

    >>> round(standard_error(lambda v: (sum(v.values()) / len(v), {}), {0: 0.0, 1: 1.0, 2: 1.0, 3: 0.0}, "aaaa"), 4)
    0.2887
    """
    scored = [i for i in sorted(values) if values[i] is not None]
    if len(scored) < 2:
        return None
    by_task = sorted(scored, key=lambda i: (str(tasks[i]) if i < len(tasks) else "", i))
    g = min(JACKKNIFE_GROUPS, len(scored))
    groups = [set(by_task[k::g]) for k in range(g)]
    try:
        thetas = [aggregate({i: v for i, v in values.items() if i not in out})[0] for out in groups]
    except Exception:  # a group held a whole task of weight: the objective without it is not defined
        return None
    try:
        mean = sum(thetas) / g
        se = math.sqrt((g - 1) / g * sum((t - mean) ** 2 for t in thetas))
    except OverflowError:  # objectives near float's limit: the same, scaled (inf where it is beyond the range)
        se = math.sqrt(g - 1) * moments.std(thetas, ddof=0)
    return se if math.isfinite(se) else None


def paired_se(
    mine: Mapping[int, float | None], theirs: Mapping[int, float | None], indices: Iterable[int]
) -> tuple[int, float]:
    """``(n, se)``: how many of ``indices`` both scored, and the standard error of the mean of the paired per-prompt
    differences ``mine − theirs`` on them (``stdev(d) / sqrt(n)``; 0 for one prompt, inf for none or where it is
    not finite): how :func:`~ram_live.selection.choice.paired` and the race tell two candidates apart."""
    diffs = [
        float(a) - float(b)  # type: ignore[arg-type]
        for i in indices
        if (a := mine.get(i)) is not None and (b := theirs.get(i)) is not None
    ]
    if not diffs:
        return 0, math.inf
    se = _stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else 0.0
    return len(diffs), se if math.isfinite(se) else math.inf


def _stdev(values: Sequence[float]) -> float:
    """The sample std of ``values``: ``statistics.stdev``'s, and inf or NaN (not an OverflowError) for per-prompt
    scores near float's limit."""
    try:
        return statistics.stdev(values)
    except OverflowError:
        return moments.std(values, ddof=1)


def _real(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
