"""``rewards(prompts, reward_funcs, tokenizer=...)``: the RL run's own reward functions as ``evaluate(model) ->
float`` for :func:`ram_live.search`, ``SearchSetting`` and ``ram-live search``.

A completion's reward is TRL's GRPO reward, ``Σ_i w_i · r_i`` (``reward_weights``; a ``None`` reward skips that
function, as TRL's ``nansum`` does); a prompt's score is its completion's reward, or ``mean@k`` / ``pass@k`` over
``samples=k`` (:mod:`.samples`); the score is the objective over the tasks (:mod:`.tasks`). It is also the prompt
protocol of :mod:`ram_live.selection.fidelity`: ``evaluate(m) == aggregate(prompt_scores(m, all))[0]`` exactly.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, Iterable, Mapping, Sequence

from ..errors import ConfigError, EvaluationError
from .calling import Batch, call_rewards
from .checks import short, weight_list
from .engines import Engine, checked_resolver, completions_of
from .generation import GenerationSettings
from .moments import mean
from .prompts import Prompts, load_prompts
from .samples import Metric, check_samples, parse_metric
from .tasks import AUTO, Tasks, group

__all__ = ["Rewards", "rewards"]

RewardFunc = Callable[..., Sequence[Any]]


def rewards(
    prompts: Any,
    reward_funcs: RewardFunc | Sequence[RewardFunc],
    *,
    tokenizer: Any = None,
    max_new_tokens: int = 64,
    batch_size: int = 16,
    reward_weights: Sequence[float] | None = None,
    model: Any = None,
    do_sample: bool | None = None,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    seed: int = 0,
    task: Any = AUTO,
    objective: str | None = None,
    weights: Mapping[str, float] | None = None,
    samples: int = 1,
    metric: str | None = None,
    pass_threshold: float = 1.0,
    device: Any = None,
    dtype: Any = None,
    stop: str | Sequence[str] | None = None,
    include_stop: bool = False,
    eos_token_id: int | Sequence[int] | None = None,
    generate: Callable[..., Any] | str | None = None,
) -> Rewards:
    """An evaluation ``evaluate(model) -> float``: generate completions for each prompt, score them with the
    reward functions, return the objective over the tasks (higher is better).

    Args:
        prompts: a list of strings; a list of dicts, a ``datasets.Dataset``, a JSONL path or a parquet path
            (verl's layout) with a ``prompt`` column (its other columns go to the reward functions as keyword lists).
        reward_funcs: TRL-style ``fn(prompts, completions, completion_ids, **columns) -> list[float]`` (``async
            def`` too), or a list of them. A verl ``compute_score`` goes through :func:`~.compute_score`.
        tokenizer: a tokenizer or a folder to load one from (None: the evaluated folder's, or ``model``'s).
        max_new_tokens, batch_size: completion length and completions per ``generate`` call.
        reward_weights: one weight per reward function (TRL's ``GRPOConfig.reward_weights``).
        model: what a state dict is loaded into (a module, or an HF folder loaded once).
        do_sample, temperature, top_p, top_k, seed: sampling (default: greedy when ``samples`` is 1, sampling
            otherwise), seeded per prompt.
        task: the column grouping prompts into tasks (default ``data_source`` when present; None: one task).
        objective, weights: ``"mean"`` over tasks (default), ``"min"`` (the worst task) or ``weights={task: w}``
            (a weighted mean; every task needs a weight, 0 leaves one out).
        samples, metric, pass_threshold: k completions a prompt, scored ``"mean@k"`` (default) or ``"pass@k"``
            / ``"pass@K"`` (K <= k), a completion passing when its reward is >= ``pass_threshold`` (1.0).
        device, dtype: where and how a loaded folder lives (a module handed in is used where it is, never moved).
        stop, include_stop, eos_token_id: stop strings (the completion ends before the first, or after it with
            ``include_stop``), and the token ids that end a completion (default: the tokenizer's and model's EOS).
        generate: ``fn(merged, prompts, settings, seeds) -> list[list[str]]``, the user's engine (vLLM, SGLang, a
            server) in place of Hugging Face ``generate``, or ``"vllm"``: a :class:`~.VLLMGenerate` built from
            ``model`` (a folder) in ``dtype``: see ``docs/evaluate.md``.

    Returns:
        A :class:`Rewards`: call it on a module, a state dict or an HF folder for the objective.

    Raises:
        ConfigError: a bad argument (prompts, generation, tasks, metric, reward functions, model), checked now: a
            ``model=``/``tokenizer=`` path that does not exist, an unusable ``device=``/``dtype=`` too.

    >>> evaluate = rewards("val.parquet", compute_score(fn), tokenizer=tok, samples=8, metric="pass@1") # doctest: +SKIP
    >>> evaluate(model), evaluate.metrics                                    # doctest: +SKIP
    (0.62, {'reward': 0.62, 'reward/gsm8k': 0.7, 'reward/math': 0.54, 'reward/fn': 0.6})
    """
    samples = check_samples(samples)
    if do_sample is None:
        do_sample = samples > 1
    settings = GenerationSettings(
        max_new_tokens=max_new_tokens,
        batch_size=batch_size,
        do_sample=do_sample,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        seed=seed,
        samples=samples,
        stop=stop,
        include_stop=include_stop,  # type: ignore[arg-type]
        eos_token_id=eos_token_id,
    )  # type: ignore[arg-type]
    loaded = load_prompts(prompts)
    return Rewards(
        loaded,
        reward_funcs,
        settings,
        tokenizer=tokenizer,
        reward_weights=reward_weights,
        model=model,
        tasks=group(loaded, task, objective, weights),
        metric=parse_metric(metric, samples, pass_threshold),
        device=device,
        dtype=dtype,
        generate=generate,
    )


class Rewards:
    """The evaluation :func:`rewards` returns. Call it on a module (a ``generate``-capable model, or one that
    holds one), a state dict (loaded into ``model``) or a Hugging Face folder; it returns the objective, or raises
    :class:`EvaluationError` when generation or a reward function fails, or no prompt is scored.

    After a call: ``metrics`` (``{"reward": score, "reward/<task>": ..., "reward/<function>": its mean, ...}``),
    ``tasks`` (each task's score), ``completions`` (per prompt; a list of k with ``samples=k``), ``per_prompt``
    (each prompt's score) and ``sample_rewards`` (per prompt, its k samples' weighted rewards; None: unscored).
    ``trainer_state``: what reward functions get as ``trainer_state`` (None).

    Args:
        prompts, reward_funcs, settings: the loaded :class:`Prompts`, the reward function(s), generation settings.
        tasks, metric, tokenizer, reward_weights, model, device, dtype, generate: as :func:`rewards` makes or takes
            them (``tasks`` None: one task; ``metric`` None: ``mean@k``).

    Raises:
        ConfigError: no reward function or one not callable, bad ``reward_weights``, a task named as a reward
            function, a bad ``model`` / ``tokenizer`` / ``device`` / ``dtype`` / ``generate``."""

    def __init__(
        self,
        prompts: Prompts,
        reward_funcs: RewardFunc | Sequence[RewardFunc],
        settings: GenerationSettings,
        *,
        tokenizer: Any = None,
        reward_weights: Sequence[float] | None = None,
        model: Any = None,
        tasks: Tasks | None = None,
        metric: Metric | None = None,
        device: Any = None,
        dtype: Any = None,
        generate: Callable[..., Any] | str | None = None,
    ) -> None:
        funcs = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
        if not funcs:
            raise ConfigError("rewards: reward_funcs is empty; give at least one reward function")
        for fn in funcs:
            if not callable(fn):
                raise ConfigError(f"rewards: a reward function must be callable, got {fn!r:.80}")
        self.funcs = funcs
        self.names = _unique([_name(fn) for fn in funcs])
        self.weights = [1.0] * len(funcs) if reward_weights is None else weight_list(reward_weights, len(funcs))
        self.prompts, self.settings = prompts, settings
        self.task_groups = tasks or group(prompts)
        self.metric = metric or parse_metric(None, settings.samples)
        if self.task_groups.column is not None:
            clash = sorted(set(self.task_groups.names) & set(self.names))
            if clash:
                raise ConfigError(
                    f"rewards: {short(clash)} name both a task and a reward function, and would both be "
                    f"logged as reward/{clash[0]}; rename the function (its __name__) or pass task=None"
                )
        self.resolver = checked_resolver(model, tokenizer, device, dtype, settings.eos_token_id)
        if generate == "vllm":
            from .vllm_engine import engine_for

            generate = engine_for(model, tokenizer, dtype)
        if generate is not None and not callable(generate):
            raise ConfigError(
                "rewards: generate must be a callable fn(merged, prompts, settings, seeds) or 'vllm', got "
                f"{short(generate)}"
            )
        if callable(getattr(generate, "check_settings", None)):
            generate.check_settings(settings)  # an engine refuses what it cannot honour now, not at the first call
        self.engine = Engine(prompts, settings, self.resolver, generate)
        self.trainer_state: Any = None
        self.metrics: dict[str, float] = {}
        self.tasks: dict[str, float] = {}
        self.completions: list[Any] = []
        self.per_prompt: list[float | None] = []
        self._table: list[list[float | None]] = []  # per function, per row of the last prompt_scores call
        self.sample_rewards: list[list[float | None]] = []
        # the last prompt_scores call's prompts, completions, scores and weighted rewards (k rows a prompt)
        self._last: tuple[list[int], list[Any], dict[int, float | None], list[float | None]] = ([], [], {}, [])

    def prompt_tasks(self) -> list[str]:
        """Each prompt's task.

        Returns:
            ``[task of prompt 0, ...]``: its ``task`` column's value as a string, or ``"all"`` (one task)."""
        return list(self.task_groups.of)

    def prompt_scores(self, merged: Any, indices: Iterable[int]) -> list[float | None]:
        """Generate and score only the prompts ``indices`` (in the prompts' order, whatever order they are given in).

        Args:
            merged, indices: the model (a module, a state dict or an HF folder) and the prompts' indices (0-based).

        Returns:
            Each one's score in the order of ``indices`` (None: no reward function scored it).

        Raises:
            ConfigError: an index that is not a prompt's (or a state dict without ``model=`` to load it into).
            EvaluationError: generation or a reward function failed, or a reward overflows."""
        wanted = self._indices(indices)
        todo = sorted(set(wanted))
        texts, ids = self.engine.run(merged, todo)
        return self._score_rows(todo, texts, ids, wanted)

    def aggregate(self, values: Mapping[int, float | None] | Sequence[float | None]) -> tuple[float, dict[str, float]]:
        """The objective over some prompts' scores (what :meth:`prompt_scores` returns).

        Args:
            values: ``{prompt index: score}``, or a list of prompts 0, 1, ...; None: not scored.

        Returns:
            ``(objective, {task: its score})``; tasks without a scored prompt are left out.

        Raises:
            ConfigError: a key that is not a prompt index.
            EvaluationError: no prompt is scored, only tasks of weight 0 are, or the objective is not finite."""
        if not isinstance(values, Mapping):
            values = dict(enumerate(values))
        bad = next(
            (i for i in values if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < len(self.prompts)), None
        )
        if bad is not None:
            raise ConfigError(f"rewards.aggregate: {short(bad)} is not a prompt index (0..{len(self.prompts) - 1})")
        score, table = self.task_groups.aggregate(values)
        fail = functools.partial(EvaluationError, function=", ".join(self.names))
        if score is None and not table:
            raise fail(
                f"every reward function returned None for every one of the {len(values)} prompts: nothing to score"
            )
        if score is None:
            raise fail(
                f"only tasks of weight 0 were scored ({short(sorted(table))}): the weighted "
                "objective has nothing to weigh"
            )
        over = next((t for t, s in table.items() if not math.isfinite(s)), None)
        if over is not None or not math.isfinite(score):
            where = (
                "the objective over the tasks"
                if over is None
                else "the sum over the prompts" + (f" of task {over!r}" if len(table) > 1 else "")
            )
            raise fail(
                f"the rewards overflow: {where} is {score if over is None else table[over]} "
                "(rewards or weights near float's limit)"
            )
        return score, table

    def __call__(self, merged: Any, step: int | None = None) -> float:
        """The objective on every prompt (``step``: verl's keyword, unused)."""
        return self._finish(self.prompt_scores(merged, range(len(self.prompts))))

    def score(self, completions: list[Any], completion_ids: list[list[int]] | None = None) -> float:
        """Score given completions without generating; sets ``metrics`` as a call does.

        Args:
            completions, completion_ids: ``samples`` per prompt, prompt-major (strings, or messages for
                conversational prompts), and their token ids (None: they get ``completion_ids=None``).

        Returns:
            The objective.

        Raises:
            ConfigError: not ``samples`` completions for each prompt.
            EvaluationError: a reward function failed, or no prompt is scored."""
        n, k = len(self.prompts), self.settings.samples
        if len(completions) != n * k:
            raise ConfigError(
                f"rewards.score: {len(completions)} completions for {n} prompts" + (f" x {k} samples" if k > 1 else "")
            )
        todo = list(range(n))
        return self._finish(self._score_rows(todo, list(completions), completion_ids, todo))

    def details(self, merged: Any) -> dict[str, Any]:
        """Call on ``merged`` and return the metrics, the completions and each prompt's score.

        Args:
            merged: the model to evaluate (a module, a state dict or an HF folder).

        Returns:
            ``{**metrics, "completions": completions, "per_prompt": per_prompt}`` after the call."""
        self(merged)
        return {**self.metrics, "completions": self.completions, "per_prompt": self.per_prompt}

    def logged_metrics(self) -> dict[str, float]:
        """The last call's metrics as the training callbacks log them (under ``ram/``).

        Returns:
            ``reward``, ``reward/<function>``, each task's score as ``eval/<task>`` (given tasks); ``{}`` at first."""
        out = {"reward": self.metrics["reward"]} if self.metrics else {}
        out.update({k: self.metrics[k] for k in (f"reward/{n}" for n in self.names) if k in self.metrics})
        if self.task_groups.column is not None:
            out.update({f"eval/{t}": s for t, s in self.tasks.items()})
        return out

    def function_rewards(self) -> dict[str, list[float]]:
        """Each reward function's rewards in the last call, one per scored completion.

        Returns:
            ``{function name: [reward, ...]}`` (a None reward left out); ``{}`` before a call."""
        return {n: [r for r in col if r is not None] for n, col in zip(self.names, self._table)}

    def _indices(self, indices: Iterable[int]) -> list[int]:
        out, n = list(indices), len(self.prompts)
        bad = next((i for i in out if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n), None)
        if bad is not None:
            raise ConfigError(f"rewards.prompt_scores: {short(bad)} is not a prompt index (0..{n - 1})")
        return out

    def _score_rows(
        self, todo: list[int], texts: list[Any], ids: list[list[int]] | None, wanted: list[int]
    ) -> list[float | None]:
        """Score the completions of the prompts ``todo`` (k rows each); the scores of ``wanted``."""
        k = self.settings.samples
        prompt_of = [i for i in todo for _ in range(k)]
        completions = completions_of(texts, self.prompts.conversational)
        batch = Batch(
            [self.prompts.prompts[i] for i in prompt_of],
            completions,
            ids,
            {c: [v[i] for i in prompt_of] for c, v in self.prompts.columns.items()},
            prompt_of,
            [j for _ in todo for j in range(k)],
            k,
            self.trainer_state,
        )
        table = call_rewards(self.funcs, self.names, batch)
        combined: list[float | None] = []
        for j in range(len(prompt_of)):
            given = [(w, col[j]) for w, col in zip(self.weights, table) if col[j] is not None]
            value = sum(w * r for w, r in given) if given else None  # TRL's nansum; all None: not scored
            if value is not None and not math.isfinite(value):
                raise EvaluationError(
                    f"the rewards overflow: {batch.where(j)[1]}'s weighted sum is {value} (rewards "
                    "or weights near float's limit)",
                    function=", ".join(self.names),
                    index=prompt_of[j],
                )
            combined.append(value)
        scores = {i: self.metric.score(combined[p * k : (p + 1) * k]) for p, i in enumerate(todo)}
        bad = next((i for i, s in scores.items() if s is not None and not math.isfinite(s)), None)
        if bad is not None:
            raise EvaluationError(
                f"the rewards overflow: prompt {bad}'s mean over its {k} samples is {scores[bad]}",
                function=", ".join(self.names),
                index=bad,
            )
        self._table, self._last = table, (todo, completions, scores, combined)
        return [scores[i] for i in wanted]

    def _finish(self, values: list[float | None]) -> float:
        """Aggregate a full call's scores and set ``metrics``, ``tasks``, ``completions``, ``per_prompt``."""
        score, table = self.aggregate(values)
        metrics = {"reward": score}
        if self.task_groups.column is not None:
            metrics.update({f"reward/{t}": s for t, s in table.items()})
        for name, col in zip(self.names, self._table):
            given = [r for r in col if r is not None]
            metrics[f"reward/{name}"] = mean(given)
        k = self.settings.samples
        _, completions, _, combined = self._last
        self.metrics, self.tasks, self.per_prompt = metrics, table, list(values)
        self.sample_rewards = [combined[p * k : (p + 1) * k] for p in range(len(self.prompts))]
        self.completions = (
            completions if k == 1 else [completions[p * k : (p + 1) * k] for p in range(len(self.prompts))]
        )
        return score


def _name(fn: Any) -> str:
    """A reward function's name, as TRL names it: a ``functools.partial``'s function's."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(fn, "__name__", None) or type(fn).__name__


def _unique(names: list[str]) -> list[str]:
    counts = [names[: i + 1].count(n) for i, n in enumerate(names)]  # the i-th name's occurrences so far
    return [n if c == 1 else f"{n}_{c}" for n, c in zip(names, counts)]
