"""The checks a training callback runs before the first step (its pre-flight), so that what can fail at the first
merge fails at step 0 instead, before any training is paid for: the search setting (every option, as
:func:`ram_live.search` with ``plan=True`` checks them: ``space``, ``budget``, ``fidelity`` with the evaluation it
gets, ``confirm``, ``sampler``, ``storage``/``study``: the storage opened once, and refused with several ranks), an
evaluation scoring prompts one by one (:func:`ram_live.evaluate.rewards`) run on a few
prompts of the base (a broken reward function raises now), and ``merged_dir`` written to. A failure raises on
every rank (:func:`~.failures.agreeing`).

>>> preflight(schedule, model, "RAMCallback('coder')", evaluate, merged_dir)         # doctest: +SKIP
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import ConfigError, EvaluationError, RamLiveError
from .failures import agreeing, error_line

__all__ = [
    "PREFLIGHT_PROMPTS",
    "agent_folder",
    "check_merged_dir_writable",
    "check_search",
    "check_storage_ranks",
    "preflight",
]

#: the prompts of the base an evaluation scoring prompts one by one scores in the pre-flight
PREFLIGHT_PROMPTS = 2


def preflight(
    schedule: Any,
    model: Any,
    owner: str,
    evaluate: Callable[..., Any] | None,
    merged_dir: str | os.PathLike[str] | None = None,
    *,
    adapters: Any = None,
    space: Any = None,
) -> None:
    """Every check of the module, on every rank (``schedule.collective``), after ``schedule.attach``.

    Args:
        schedule: the attached :class:`~ram_live.RAMSchedule` (its ``search``, ``importance``, ``agent``).
        model: the training model, holding the base's weights (the evaluations' smoke test runs on it).
        owner: the callback, named in the errors (``RAMTrainerCallback('coder')``).
        evaluate: the merges' evaluation (None: none, or a framework's own loop).
        merged_dir: where rank 0 will save the generalists (None: not saved).
        adapters: the search's agents when they are LoRA adapters (the live ``PeftModel``); None: full models.
        space: the search space when the callback sets one in place of the setting's.

    Raises:
        ConfigError: an invalid search option, or a ``merged_dir`` rank 0 cannot write to.
        EvaluationError: an evaluation failed on the base's first prompts.
        RemoteRankError: the pre-flight failed on another rank.
    """
    with agreeing(schedule.collective, "the pre-flight"):
        try:
            evaluations = [evaluate]
            if schedule.search is not None:
                evaluations += check_search(schedule.search, evaluate, adapters, space, schedule.importance)
                check_storage_ranks(schedule.search, schedule.collective.world_size)
            seen: set[int] = set()
            for fn in evaluations:
                if fn is not None and id(fn) not in seen:
                    seen.add(id(fn))
                    smoke_test(fn, model)
            if merged_dir is not None and schedule.collective.rank == 0:
                check_merged_dir_writable(Path(merged_dir), schedule.agent)
        except (ConfigError, EvaluationError) as exc:
            named = _named(exc, owner)
            if named is exc:
                raise
            raise named from exc


def check_search(
    setting: Any,
    fallback: Callable[..., Any] | None,
    adapters: Any = None,
    space: Any = None,
    importance: Any = None,
    *,
    plain: bool = False,
) -> list[Callable[..., Any]]:
    """The search setting checked as :func:`ram_live.search` checks its options (``plan=True``: nothing merged or
    evaluated), with the evaluation the callback's search will get.

    Args:
        setting: the :class:`~ram_live.training.search.SearchSetting`.
        fallback: the callback's evaluation (the search's when the setting names none).
        adapters: the live ``PeftModel`` of a LoRA run (an adapter search), or None.
        space: overrides ``setting.space`` (a LoRA run folding into its base searches no rank).
        importance: the full-model search's ``importance=``.
        plain: the search gets a plain evaluation whatever the setting names (verl's: each candidate written to a
            folder and evaluated there); nothing is loaded, and nothing is returned to smoke-test.

    Returns:
        The search's evaluations (its ``evaluate`` and ``confirm``), to smoke-test.

    Raises:
        ConfigError: an option the search refuses (an unknown space family, ``fidelity="halving"`` with a plain
            evaluation, no evaluation at all, a dotted path that does not load, ...).
    """
    from ..selection import search
    from .candidates import check_candidate_evaluation

    if plain:
        fn, confirm = _plain, _plain if setting.confirm is not None else None
    else:
        fn, confirm = setting.evaluation(fallback), setting.confirmation()
    check_candidate_evaluation(setting, fn)
    search(
        adapters if adapters is not None else {},
        evaluate=fn,
        budget=setting.budget,
        space=setting.space if space is None else space,
        seed=setting.seed,
        fidelity=setting.fidelity,
        confirm=confirm,
        confirm_top=setting.confirm_top,
        importance=importance if adapters is None else None,
        sampler=setting.sampler,
        storage=setting.storage,
        study=setting.study_name("preflight", 0),
        plan=True,
    )
    if setting.storage is not None:
        from ..selection.optuna_storage import probe_storage

        probe_storage(setting.storage)
    return [] if plain else [f for f in (fn, confirm) if f is not None]


def check_storage_ranks(setting: Any, world_size: int) -> None:
    """A search setting with ``storage=`` refused in a run of several ranks: their evaluations are collective
    (scores averaged over the ranks), and a rank that takes a candidate's score from the study instead of
    evaluating it would leave the others waiting in the collective.

    Args:
        setting: the :class:`~ram_live.training.search.SearchSetting`.
        world_size: the ranks of the run.

    Raises:
        ConfigError: ``setting.storage`` is set and ``world_size > 1``.

    Example:
        >>> check_storage_ranks(SearchSetting(), 8)  # doctest: +SKIP
    """
    if getattr(setting, "storage", None) is not None and world_size > 1:
        raise ConfigError(
            f"search storage= needs a single process: this run has {world_size} ranks, whose evaluations are "
            "collective (a rank taking a score from the study would leave the others waiting); drop storage= or "
            "train on one process"
        )


def _plain(merged: Any) -> float:
    return 0.0


def smoke_test(fn: Any, model: Any) -> None:
    """An evaluation scoring prompts one by one (``prompt_scores``, :func:`ram_live.evaluate.rewards`) scores the
    first :data:`PREFLIGHT_PROMPTS` prompts on ``model``; other evaluations are not run (they may be costly).

    Raises:
        EvaluationError: as ``fn.prompt_scores`` (generation or a reward function failed).
        ConfigError: as ``fn.prompt_scores``.
    """
    from ..selection.fidelity import prompt_protocol

    if not prompt_protocol(fn):
        return
    n = min(PREFLIGHT_PROMPTS, len(fn.prompt_tasks()))
    try:
        fn.prompt_scores(model, list(range(n)))
    except RamLiveError:
        raise
    except Exception as exc:  # a user's prompt_scores of its own
        raise EvaluationError(f"the evaluation raised on the base's first prompts ({error_line(exc)})") from exc


def check_merged_dir_writable(merged_dir: Path, agent: str) -> None:
    """``merged_dir/<agent>`` created (with its parents) and a file written and removed there.

    Raises:
        ConfigError: naming ``merged_dir`` and the OS's error.
    """
    folder = agent_folder(merged_dir, agent)
    probe = folder / f".ram-preflight-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with open(probe, "wb") as f:
            f.write(b"ram_live pre-flight\n")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(
            f"merged_dir={str(merged_dir)!r}: the generalists cannot be saved in {folder} ({error_line(exc)})"
        ) from None


def _named(exc: ConfigError | EvaluationError, owner: str) -> RamLiveError:
    """The error again, its message prefixed with the callback and "pre-flight" (same class and attributes)."""
    message = f"{owner}: pre-flight (before the first step): {exc}"
    if isinstance(exc, EvaluationError):
        return type(exc)(message, function=exc.function, index=exc.index)
    try:
        return type(exc)(message)
    except TypeError:  # a subclass with a constructor of its own
        return exc


def agent_folder(merged_dir: Path, agent: str) -> Path:
    """Where a run's generalists go: ``merged_dir/<agent>``, so that the runs of several agents sharing one
    ``merged_dir`` never write the same name (agent names are checked folder names).

    Raises:
        ConfigError: ``merged_dir`` (or ``merged_dir/<agent>``) exists and is not a folder."""
    folder = Path(merged_dir) / agent
    for path in (Path(merged_dir), folder):
        if path.exists() and not path.is_dir():
            raise ConfigError(f"merged_dir: {path} exists and is not a folder; the generalists are saved in folders")
    return folder
