"""``search``: its options checked, the merger, scorer and space built, the families run within the budget
(:class:`~.loop.SearchRun`, the loop), the result checked and confirmed."""

from __future__ import annotations

import numbers
import time
import warnings
from typing import Any, Callable

from torch import Tensor

from ..api import Model, Models, check_run_options
from ..errors import ConfigError, SearchError
from ..importance import STORED, resolve_importance
from .result import EXTRAPOLATION_FAR, ExtrapolationWarning, SearchResult
from .choice import note_choice
from .budget import spend
from .space import DEFAULT_SPACE, parse_space
from .fidelity import Scorer, parse_budget, parse_fidelity
from .parallel import Pool, check_parallel, make_merger
from .loop import SearchRun
from .plan import SearchPlan, make_plan
from .sampler import parse_sampler, sampler_name
from .optuna_storage import check_storage, open_ledger, inputs_fingerprint
from ..option_checks import check_seed, finite_float, shown
from .adapters import adapter_agents, adapter_space, check_families

__all__ = ["search"]

Evaluate = Callable[[Any], float]


def search(
    models: Models,
    base: Model | None = None,
    evaluate: Evaluate | None = None,
    *,
    budget: int | str = 60,
    space: Any = None,
    seed: int = 0,
    progress: Any = None,
    confirm: Evaluate | None = None,
    confirm_top: int = 3,
    device: Any = None,
    workers: int | None = None,
    importance: Any = None,
    fidelity: Any = None,
    parallel: int = 1,
    ray_address: str | None = None,
    adapters: Any = None,
    plan: bool = False,
    seconds_per_candidate: float | None = None,
    sampler: Any = None,
    storage: Any = None,
    study: str | None = None,
) -> SearchResult | SearchPlan:
    """Pick the merge of ``models`` that scores best on ``evaluate`` (higher is better), within ``budget`` calls.

    Every candidate is merged into one reused output (a scratch module for a module base, one set of tensors for
    a state-dict or path base, in a new dict per candidate: at most one model more in memory) and handed to
    ``evaluate``; the tensors are written again by the next candidate, so copy what you keep. Whatever ``evaluate``
    does to what it is handed (rebinding or deleting entries, converting or replacing a module's parameters),
    the next candidate is scored on its own merge. RAM-family counts are taken once per activity rule and reused.

    Default ``space``: RAM+ ``r`` × ``alpha`` with α uncapped (``math.inf``) and capped at 2; per-agent λ on
    unique entries jointly with per-agent weights in the shared mean (``shared_weights``, a coordinate ascent from
    the best so far; ``lambdas`` alone without it); leaving one agent out; ``eps``/``activity``; and, for a fair
    comparison, task arithmetic's scale then per-agent weights (``ta_weights``), TIES and DARE-TIES density ×
    scale (then local steps). The budget is adaptive (:mod:`ram_live.selection.budget`): every arm (RAM, task
    arithmetic, TIES, DARE-TIES) screens a spread of its grid on about 35 % of it; the rest goes to refining the
    best arms by successive halving (the leader gets most, a runner-up some). A ``space`` of one arm (e.g.
    ``["task_arithmetic", "ta_weights"]``, ``{"ties": grid}``, ``["ram_plus", "lambdas"]``) gives it the whole
    budget: that family searched alone. ``space``: a list of family names and/or explicit candidates
    ``{"method": ..., **options}`` (tried first), or a mapping ``{family: {option: [values]}}`` (grids),
    ``{"lambdas": {"step": 0.5}}`` (ascent settings). See
    ``docs/search.md``.

    Args:
        models: the agents, as for :func:`ram_live.merge`.
        base: their base model.
        evaluate: ``evaluate(merged) -> float`` on held-out data; ``merged`` is a module for a module base, a
            state dict for a state-dict or path base.
        budget: the most candidates scored (an int >= 1), or prompt-evaluations as ``"20x"`` (twenty full
            evaluations' worth of prompts: with ``fidelity="halving"`` a candidate stopped on a slice costs only
            the prompts it saw; an evaluation without the prompt protocol costs 1 per candidate).
        space: what to try (None: the default above).
        seed: orders the coordinate ascents and seeds DARE's masks; the same seed gives the same history.
        progress: None (default): a line on stderr, redrawn as each candidate is scored (candidates scored, budget
            spent, in prompts for a budget like ``"20x"``, the best so far, seconds a candidate) when stderr is a
            terminal, else the same as plain log lines (logger ``ram_live.progress``) every few candidates, at
            least every 30 s, and at the end; False: nothing; True: that line wherever stderr goes; a
            :class:`~ram_live.progress.SearchProgress` (its stream); a callable given each :class:`Trial` as it
            is scored; or a :class:`~ram_live.progress.ProgressHook` (``update`` once a trial).
        confirm: a second held-out evaluation, run on the ``confirm_top`` best candidates after the search
            (``Trial.confirm_score``; not counted in ``budget``).
        device, workers: as for :func:`ram_live.merge`.
        importance: per-agent importances for curvature-aware RAM (docs/curvature.md): ``{agent: importances}``
            as :func:`ram_live.merge` takes them, or several variants by label, e.g. ``{"raw": {agent: ...},
            "bias_corrected": {agent: ...}}`` (Adam's ``exp_avg_sq`` without and with bias correction). Adds
            the ``importance`` family on the RAM side: each variant with plain RAM, then with the best RAM-side
            candidate so far. A winner that uses them holds the same mapping in ``best["importance"]`` (by
            reference: ``merge(models, base=base, **result.best)`` still reproduces it); JSON and tables show
            the label (``"given"`` for a single mapping). ``"stored"``: the importances stored with the
            snapshots searched (a store's ``latest_all()``; every agent must carry them, else a ConfigError naming
            the agents without), as the variant ``"stored"`` (``best["importance"] == "stored"``; also a variant's
            value among labelled ones). None (default): no importances, every candidate is plain.

        fidelity: None (every candidate on every prompt), ``"halving"`` or a
            :class:`~ram_live.selection.fidelity.Halving`: each candidate is raced against its side's best on nested,
            stratified slices of the prompts and stopped where it is clearly worse (needs an evaluation with the
            prompt protocol, as :func:`ram_live.evaluate.rewards` has; :mod:`ram_live.selection.fidelity`). With
            that protocol every trial also records each task's score (``Trial.tasks``).
        parallel: candidates scored at once by worker processes (or Ray actors), each merging its own candidate
            from the shared inputs; the trials, the winner and the table are those of ``parallel=1``
            (:mod:`ram_live.selection.parallel`), over full models and over adapters. ``evaluate`` must then be
            picklable.
        ray_address: use Ray for the workers (``"local"``: a local Ray; an address: that cluster). Inside a Ray
            job (``ray.is_initialized()``) Ray is used without it.
        adapters: with a live ``PeftModel`` as ``models``, the names of its LoRA adapters to merge (None: all).
            LoRA adapters are agents as adapter folders (``models``: a list or a mapping of folders with
            ``adapter_config.json``, and ``base=``) or as a ``PeftModel`` (no ``base=``); merged into the base
            weights, with the activity rule's density searched on the RAM side; ``ram_merge_adapter_files(folders,
            base=base, into_base=True, **result.best)`` (or ``ram_merge_adapters(peft_model, adapters,
            into_base=True, **result.best)``) re-makes the winner (:mod:`ram_live.selection.adapters`).
        plan: True: search nothing, return what ``budget`` buys with this evaluation
            (:class:`~ram_live.selection.plan.SearchPlan`: candidates, prompt-evaluations and generations of a
            full and of a raced search), every option checked as for the search itself.
        seconds_per_candidate: with ``plan``: one full evaluation's time (e.g. timed on the base), for the
            plan's time.
        sampler: what proposes the refinements of each arm (:mod:`ram_live.selection.sampler`): None (the
            default: ``"tpe"`` in a race of ``"10x"`` or more, else ``"moves"``; docs/search.md "Which
            sampler"), ``"moves"`` (the coordinate ascents and local steps),
            ``"tpe"`` (the built-in TPE over the arm's per-agent weights and options, seeded by ``seed``), an
            Optuna sampler's name (``"optuna-tpe"``, ``"optuna-gp"``, ...: seeded by ``seed``) or any Optuna
            sampler (``optuna.samplers.TPESampler(seed=0)``, ``GPSampler``, ``CmaEsSampler``, ``NSGAIISampler``:
            score and worst task), by ask-and-tell. Raced like any candidate under
            ``fidelity="halving"``; ``result.sampler`` names it.
        storage, study: keep every scored candidate in an Optuna study (``storage="sqlite:///search.db"``, an RDB
            URL or an Optuna storage; ``study`` its name, default ``"ram_live_search"``;
            :mod:`ram_live.selection.optuna_storage`): a search run again with the same settings takes what is
            there instead of scoring it again (a killed search resumes), and processes sharing the study split
            the work. Needs Optuna.

    Returns:
        A :class:`SearchResult`; ``merge(models, base=base, **result.best)`` reproduces the winner bit for bit.
        With ``plan=True``, a :class:`~ram_live.selection.plan.SearchPlan`.

    Raises:
        SearchError: ``evaluate``/``confirm`` raised (chained) or returned NaN, ±inf or a non-number.
        ConfigError: a bad ``budget``, ``confirm_top``, ``space`` entry, ``plan`` or ``seconds_per_candidate``.

    Warns:
        ArbitraryChoiceWarning: every candidate scored the same, or another is within one paired standard error of
            the winner: the winner is an arbitrary pick (``result.arbitrary``), the likely causes named
            (``result.choice_causes``).
        ExtrapolationWarning: the winner scales an agent's task vector past ``EXTRAPOLATION_FAR``.

    >>> result = search({"coder": coder, "tools": tools}, base=base, evaluate=held_out_score)  # doctest: +SKIP
    >>> generalist = merge({"coder": coder, "tools": tools}, base=base, **result.best)       # doctest: +SKIP
    """
    t0 = time.perf_counter()
    if not callable(evaluate):
        raise ConfigError(f"evaluate must be a callable merged -> float, got {evaluate!r}")
    if confirm is not None and not callable(confirm):
        raise ConfigError(f"confirm must be a callable merged -> float, got {confirm!r}")
    check_run_options(device, 1, workers)  # device= and workers= as merge checks them (no chunk_numel here)
    units, in_prompts = parse_budget(budget)
    halving = parse_fidelity(fidelity)
    if halving is not None and not in_prompts:
        raise ConfigError(
            f"fidelity='halving' needs a budget in prompt-evaluations (budget='{budget}x', not "
            f"{budget!r}): under a budget of candidates a candidate stopped early costs as much as one "
            "scored on every prompt, and the race would only lose information"
        )
    n_workers = check_parallel(parallel)
    if ray_address is not None and not isinstance(ray_address, str):
        raise ConfigError(f"ray_address must be a string ('local' or a Ray address), got {shown(ray_address)}")
    if not isinstance(confirm_top, numbers.Integral) or isinstance(confirm_top, bool) or confirm_top < 1:
        raise ConfigError(f"confirm_top must be an int >= 1, got {shown(confirm_top)}")
    check_seed("seed", seed)
    adapter_input = adapter_agents(models, base, adapters)  # None: full models
    if adapter_input is not None:
        space = adapter_space(space, importance)
    variants = importance_variants(importance)
    if variants and (space is None or isinstance(space, (list, tuple)) and "importance" not in space):
        space = [*(space or DEFAULT_SPACE), "importance"]
    families = parse_space(space)
    check_families(families, adapter_input is not None)
    for family in families:
        if family.kind == "importance":
            if not variants:
                raise ConfigError("space names the 'importance' family but search got no importance=")
            family.settings["variants"] = len(variants)
    proposer = parse_sampler(sampler, int(seed), halving is not None, units)
    check_storage(storage, study)  # before plan= returns: a plan checks every option
    scorer = Scorer(evaluate, halving, in_prompts)
    if plan is not True and plan is not False:
        raise ConfigError(f"plan must be True or False, got {shown(plan)}")
    if seconds_per_candidate is not None:
        try:
            seconds = finite_float(seconds_per_candidate)
        except ValueError:
            seconds = -1.0
        if not plan or seconds <= 0:
            raise ConfigError(
                f"seconds_per_candidate must be a finite number of seconds > 0, with plan=True; got "
                f"{shown(seconds_per_candidate)}" + ("" if plan else " without plan=True")
            )
        seconds_per_candidate = seconds
    if plan:
        return make_plan(scorer, budget, units, halving, seconds_per_candidate)
    # an adapter search's merger (and each worker's) is built from the adapters as read here, with their base
    inputs = (models, base) if adapter_input is None else (adapter_input, None)
    merger = make_merger(*inputs, device, workers)
    run = SearchRun(merger, scorer, units, int(seed), progress)
    if STORED in [v for v in variants.values() if isinstance(v, str)]:
        resolve_importance(STORED, merger.agents)  # a ConfigError naming the agents without, before any trial
    run.importance = variants
    run.proposer = proposer
    run.ledger = open_ledger(
        storage,
        study,
        {
            "agents": list(merger.names),
            "budget": budget,
            "seed": int(seed),
            "space": repr(space),
            "fidelity": repr(halving),
            "sampler": sampler_name(proposer),
            # the weights the study's scores belong to (computed only where there is a study)
            **({"inputs": inputs_fingerprint(merger.agents, merger.base_src)} if storage is not None else {}),
        },
    )
    run.labels = {id(m): label for label, m in variants.items()}
    if n_workers > 1 or ray_address is not None:
        run.pool = Pool(n_workers, (*inputs, device, workers, scorer), ray_address)
    try:
        budgets = spend(run, families)
    except BaseException:
        if run.pool is not None:
            run.pool.close(abort=True)
        run.close_progress()
        raise
    if run.pool is not None:
        run.pool.close()
    run.close_progress()
    result = SearchResult(
        run.history, budget, int(seed), merger.names, budgets=budgets, spent=run.used, sampler=sampler_name(proposer)
    )
    if not result.scored:
        raise SearchError("no candidate could be merged and scored (see the trials' errors)")
    if confirm is not None:
        run.confirm(confirm, result, int(confirm_top))
    result.merge_seconds, result.evaluate_seconds = run.merge_seconds, run.evaluate_seconds
    result.statistics_passes = merger.statistics_passes
    result.overhead_seconds = max(0.0, time.perf_counter() - t0 - run.merge_seconds - run.evaluate_seconds)
    note_choice(result, evaluate, scorer.slices if halving is not None else None)  # warns: could not choose
    best = result.best_trial
    if best.extrapolates:
        warnings.warn(
            ExtrapolationWarning(
                f"the chosen merge {best.label()} scales an agent's task vector by {best.extrapolation:.3g} "
                f"(> {EXTRAPOLATION_FAR:g}): it extrapolates past what that agent learned; check it on data the "
                "selection did not see (confirm=)"
            ),
            stacklevel=2,
        )
    return result


def importance_variants(importance: Any) -> dict[str, Any]:
    """``search``'s ``importance=`` as ``{label: {agent: importances} or "stored"}``: ``"stored"`` as the variant
    ``"stored"``; a mapping of labels to per-agent mappings (every value a mapping whose own values are not
    tensors, or ``"stored"``); else one variant ``"given"``. None: no variants; False: a ConfigError."""
    from collections.abc import Mapping

    if importance is None:
        return {}
    if importance is False or importance is True:
        raise ConfigError(
            f"importance={importance!r}: None is plain RAM (every candidate is plain without "
            "importances); pass 'stored' or {agent: importances}"
        )
    if isinstance(importance, str) and importance == STORED:
        return {STORED: STORED}
    if not isinstance(importance, Mapping) or not importance:
        raise ConfigError(
            f"importance must be 'stored' or map agents (or variant labels) to importances, got {shown(importance)}"
        )
    if all(
        isinstance(v, str)
        and v == STORED
        or isinstance(v, Mapping)
        and v
        and not any(isinstance(x, Tensor) for x in v.values())
        for v in importance.values()
    ):
        return {str(label): m for label, m in importance.items()}
    return {"given": importance}
