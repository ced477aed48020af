"""What a search returns: every :class:`Trial` in order, the winner, the best baseline, timings; as a table, as
JSON, as a plot."""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import RamLiveWarning
from .choice import undecided
from .space import BASELINE_SIDE, RAM_SIDE

__all__ = ["Trial", "SearchResult", "ExtrapolationWarning", "EXTRAPOLATION_FAR", "to_json", "from_json"]

#: A candidate "extrapolates far" when the largest factor it applies to any agent's task vector exceeds this.
EXTRAPOLATION_FAR = 2.0


class ExtrapolationWarning(RamLiveWarning):
    """The chosen merge scales some agent's task vector by more than :data:`EXTRAPOLATION_FAR`: it moves past
    what that agent learned (it may be what wins on the selection set, and still be fragile)."""


@dataclass
class Trial:
    """One evaluated candidate. ``extrapolation``: the largest factor the merge applies to any agent's τ (RAM: the
    largest λ of an agent with unique entries; task arithmetic/TIES/DARE: scale × the largest weight, DARE's
    1/density rescale not counted as it is 1 in expectation); ``lambdas``: λ per agent where the merge has them.
    ``error``: why the merge failed (its values overflow the dtype), with ``score`` None."""

    index: int
    family: str
    method: str
    options: dict[str, Any]
    score: float | None
    merge_seconds: float
    evaluate_seconds: float
    extrapolation: float
    side: str = RAM_SIDE
    lambdas: dict[str, float] | None = None
    confirm_score: float | None = None
    error: str | None = None
    #: When it ran: "explicit", "screen" or "refine" (ram_live.selection.budget).
    phase: str | None = None
    importance: str | None = None  # the label of the importances in options["importance"] (shown instead of them)
    #: The share of the prompts it was scored on (< 1: stopped early by the race, ``score`` is an estimate).
    fidelity: float = 1.0
    #: Each task's score on the prompts it saw (an evaluation with the prompt protocol), else None.
    tasks: dict[str, float] | None = None
    #: Why it saw fewer prompts: "race" (clearly worse than its side's best on a slice).
    stop: str | None = None
    #: The standard error of ``score`` (scored on every prompt by an evaluation with the prompt protocol), else None.
    se: float | None = None
    #: A stopped candidate's estimate fell outside the per-prompt scores seen, and was brought back to that range.
    clamped: bool = False
    #: Its score on each prompt it saw (an evaluation with the prompt protocol), else None: the paired comparison
    #: of :func:`~ram_live.selection.choice.undecided`.
    values: dict[int, float | None] | None = field(default=None, repr=False, compare=False)

    @property
    def complete(self) -> bool:
        """Scored on every prompt (not failed, not stopped early by the race): what moves and winners build on."""
        return self.score is not None and self.fidelity >= 1.0

    @property
    def shown(self) -> dict[str, Any]:
        """The options with the importances as their label (``"importance": "raw"``): JSON and tables."""
        return {**self.options, "importance": self.importance} if self.importance is not None else self.options

    @property
    def candidate(self) -> dict[str, Any]:
        """``{"method": ..., **options}``: ``merge(models, base=base, **trial.candidate)`` redoes this merge."""
        return {"method": self.method, **_copy(self.options)}

    @property
    def extrapolates(self) -> bool:
        return self.extrapolation > EXTRAPOLATION_FAR

    def label(self) -> str:
        return f"{self.method}({describe(self.shown)})"

    def to_dict(self) -> dict[str, Any]:
        return to_json(
            {
                "index": self.index,
                "family": self.family,
                "side": self.side,
                "method": self.method,
                "options": self.shown,
                "score": self.score,
                "confirm_score": self.confirm_score,
                "merge_seconds": self.merge_seconds,
                "evaluate_seconds": self.evaluate_seconds,
                "extrapolation": self.extrapolation,
                "lambdas": self.lambdas,
                "error": self.error,
                "phase": self.phase,
                "fidelity": self.fidelity,
                "tasks": self.tasks,
                "stop": self.stop,
                "se": self.se,
                "clamped": self.clamped,
            }
        )


def _copy(options: dict[str, Any]) -> dict[str, Any]:
    """A copy of the options' own containers; importances stay the caller's mapping (by reference)."""
    return {
        k: (
            v
            if k == "importance"
            else dict(v)
            if isinstance(v, dict)
            else list(v)
            if isinstance(v, (list, tuple))
            else v
        )
        for k, v in options.items()
    }


def describe(options: dict[str, Any]) -> str:
    """Short ``k=v`` text of options (λ and weights rounded to 3 digits)."""
    parts = []
    for k, v in options.items():
        if isinstance(v, dict) and all(isinstance(x, (int, float)) for x in v.values()):
            v = "{" + ", ".join(f"{a}: {x:.3g}" for a, x in v.items()) + "}"
        elif isinstance(v, dict):  # per-agent importances given as tensors: their agents
            v = "{" + ", ".join(f"{a}: ..." for a in v) + "}"
        elif isinstance(v, (list, tuple)):
            v = "[" + ", ".join(f"{x:.3g}" if isinstance(x, float) else str(x) for x in v) + "]"
        parts.append(f"{k}={v}")
    return ", ".join(parts)


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def to_json(value: Any) -> Any:
    """``value`` with ±inf and NaN as the strings "inf"/"-inf"/"nan", tuples as lists, numpy scalars as numbers
    and an adapter search's activity rules as ``["topk", density]`` / ``["relative", threshold]`` (strict JSON);
    :func:`from_json` undoes it."""
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0 and not isinstance(value, (int, float)):
        value = value.item()  # a numpy scalar (or 0-d array) given as an option or score
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else "inf" if value > 0 else "-inf"
    rules = sys.modules.get("ram_live.peft.sparsify")  # a rule is an instance of its classes: loaded if there is one
    if rules is not None and isinstance(value, (rules.TopK, rules.RelativeThreshold)):
        return ["topk", value.density] if isinstance(value, rules.TopK) else ["relative", value.threshold]
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    return value


def from_json(value: Any) -> Any:
    """The inverse of :func:`to_json`: ``merge(models, base=base, **from_json(saved["best"]))``."""
    if value in ("inf", "-inf", "nan"):
        return float(value)
    if isinstance(value, dict):  # an activity rule ["topk", 0.3] as ram_merge_adapter_files's sparsify= takes it
        return {k: tuple(v) if k == "sparsify" and isinstance(v, list) else from_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_json(v) for v in value]
    return value


@dataclass
class SearchResult:
    """The outcome of :func:`ram_live.search`. ``best``: ``merge(models, base=base, **result.best)`` reproduces
    the winner bit for bit; the winner and the best baseline are chosen among the trials scored on every prompt.
    ``history``: every trial in order. ``budget``: as given (``60`` or ``"20x"``); ``spent``: what the trials cost,
    in candidates or full evaluations' worth of prompts. Seconds: ``merge_seconds`` (every merge, the
    confirmation re-merges included), ``evaluate_seconds`` (every call of ``evaluate`` and ``confirm``),
    ``overhead_seconds`` (the rest: opening inputs, bookkeeping).

    Attributes:
        history: every trial, in order.
        budget: the budget as given.
        seed: the search's seed.
        agents: the agents' names, in order.
        merge_seconds, evaluate_seconds, overhead_seconds: the time split above.
        statistics_passes: merges that computed statistics (counts) later merges reuse.
        budgets: the evaluations each arm of the search space used.
        spent: what the trials cost.
        choice_causes: when the winner is :attr:`arbitrary`, the likely causes (:mod:`ram_live.selection.choice`).
        race_slices: a raced search's slice sizes, in prompts (None without a race).
        sampler: what proposed the refinements (``"moves"``, ``"tpe"``, ``"optuna:TPESampler"``, ...).

    Example:
        >>> result = ram_live.search(models, base=base, evaluate=score, budget=60)          # doctest: +SKIP
        >>> merged = ram_live.merge(models, base=base, **result.best)                       # doctest: +SKIP
    """

    history: list[Trial]
    budget: int | str
    seed: int
    agents: tuple[str, ...]
    merge_seconds: float = 0.0
    evaluate_seconds: float = 0.0
    overhead_seconds: float = 0.0
    statistics_passes: int = 0
    budgets: dict[str, float] = field(default_factory=dict)
    spent: float = 0.0
    choice_causes: list[str] = field(default_factory=list)
    race_slices: tuple[int, ...] | None = None
    #: What proposed the refinements: "moves", "tpe" or "optuna:<sampler class>" (search's sampler=).
    sampler: str = "moves"

    @property
    def scored(self) -> list[Trial]:
        return [t for t in self.history if t.score is not None]

    @property
    def complete(self) -> list[Trial]:
        """The trials scored on every prompt (all of them without a race)."""
        return [t for t in self.scored if t.complete]

    @property
    def best_trial(self) -> Trial:
        """The highest score among the trials scored on every prompt; ties go to the earlier trial."""
        return max(self.complete or self.scored, key=lambda t: (t.score, -t.index))

    @property
    def best(self) -> dict[str, Any]:
        return self.best_trial.candidate

    @property
    def best_score(self) -> float:
        return float(self.best_trial.score)  # type: ignore[arg-type]

    @property
    def best_baseline(self) -> Trial | None:
        """The best trial of a baseline (task arithmetic, TIES, DARE, linear), or None when none ran."""
        baselines = [t for t in self.complete if t.side == BASELINE_SIDE]
        return max(baselines, key=lambda t: (t.score, -t.index)) if baselines else None

    @property
    def best_ram(self) -> Trial | None:
        ram = [t for t in self.complete if t.side == RAM_SIDE]
        return max(ram, key=lambda t: (t.score, -t.index)) if ram else None

    @property
    def arbitrary(self) -> bool:
        """True when the search could not choose: every candidate scored on every prompt scored the same, or another
        is within one paired standard error of the winner (:func:`~ram_live.selection.choice.undecided`): the winner
        is an arbitrary pick. Judged on every read from the trials as they are (a race adds per-prompt scores to a
        trial after its score is known)."""
        return undecided(self)

    @property
    def total_seconds(self) -> float:
        return self.merge_seconds + self.evaluate_seconds + self.overhead_seconds

    def margin(self) -> float | None:
        """How far the winner beats the best baseline.

        Returns:
            Best score minus the best baseline's (0 when a baseline wins), or None without baselines.
        """
        baseline = self.best_baseline
        return None if baseline is None else self.best_score - float(baseline.score)  # type: ignore[arg-type]

    def table(self) -> str:
        """Every trial, in order, then a summary of the winner, the best baseline and the time split
        (:func:`~ram_live.selection.table.format_table`: its marks are explained under the table).

        Returns:
            The table as text.
        """
        from .table import format_table

        return format_table(self)

    def to_dict(self) -> dict[str, Any]:
        """The result as JSON-able values.

        Returns:
            Strict JSON values (α = ∞ is the string "inf"; :func:`from_json` turns ``best`` back into options).
        """
        baseline = self.best_baseline
        return to_json(
            {
                "best": {"method": self.best_trial.method, **self.best_trial.shown},
                "best_score": self.best_score,
                "best_index": self.best_trial.index,
                "best_tasks": self.best_trial.tasks,
                "best_se": self.best_trial.se,
                "arbitrary": self.arbitrary,
                "choice_causes": list(self.choice_causes),
                "race_slices": None if self.race_slices is None else list(self.race_slices),
                "spent": self.spent,
                "best_extrapolation": self.best_trial.extrapolation,
                "best_baseline": None if baseline is None else baseline.candidate,
                "best_baseline_score": None if baseline is None else baseline.score,
                "margin": self.margin(),
                "agents": list(self.agents),
                "budget": self.budget,
                "budgets": self.budgets,
                "seed": self.seed,
                "sampler": self.sampler,
                "statistics_passes": self.statistics_passes,
                "merge_seconds": self.merge_seconds,
                "evaluate_seconds": self.evaluate_seconds,
                "overhead_seconds": self.overhead_seconds,
                "history": [t.to_dict() for t in self.history],
            }
        )

    def save(self, folder: str | Path) -> None:
        """Write ``search.json`` (:meth:`to_dict`) and ``table.txt`` (:meth:`table`), each atomically.

        Args:
            folder: where they go (made if missing).
        """
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        _write_atomic(folder / "search.json", json.dumps(self.to_dict(), indent=2) + "\n")
        _write_atomic(folder / "table.txt", self.table() + "\n")

    def plot(self, path: str | Path) -> Path:
        """A PNG of the scores by family, the winner and the best baseline marked.

        Args:
            path: the PNG's path.

        Returns:
            ``path``.

        Raises:
            ConfigError: matplotlib is not installed.
        """
        from .plot import plot_result

        return plot_result(self, Path(path))
