"""``rewards(prompts, reward_funcs, tokenizer=...)``: the RL run's own reward functions as ``evaluate(model) ->
float`` for :func:`ram_live.search`, ``SearchSetting`` and ``ram-live search``.

The score is TRL's GRPO reward, averaged over the prompts: per prompt ``Σ_i w_i · r_i`` over the reward functions
(``reward_weights``, default all 1; a ``None`` reward skips that function for that prompt, as TRL's ``nansum``
does), then the mean over prompts.
"""

from __future__ import annotations

import inspect
import math
from typing import Any, Callable, Sequence

from ..errors import ConfigError, EvaluationError
from .checks import one_line, reward_list, weight_list
from .generation import GenerationSettings, generate_completions, tokenize_prompts
from .models import Resolver
from .prompts import Prompts, load_prompts

__all__ = ["Rewards", "rewards"]

RewardFunc = Callable[..., Sequence[Any]]


def rewards(prompts: Any, reward_funcs: RewardFunc | Sequence[RewardFunc], *, tokenizer: Any = None,
            max_new_tokens: int = 64, batch_size: int = 16, reward_weights: Sequence[float] | None = None,
            model: Any = None, do_sample: bool = False, temperature: float = 1.0, top_p: float = 1.0,
            top_k: int = 0, seed: int = 0) -> Rewards:
    """An evaluation ``evaluate(model) -> float``: generate a completion for each prompt, score it with the reward
    functions, return the weighted mean reward (higher is better).

    Args:
        prompts: a list of strings; a list of dicts, a ``datasets.Dataset`` or a JSONL path with a ``prompt``
            column (its other columns go to the reward functions as keyword lists, as in TRL).
        reward_funcs: TRL-style ``fn(prompts, completions, completion_ids, **columns) -> list[float]``, or a list
            of them. A verl ``compute_score`` goes through :func:`~ram_live.evaluate.compute_score`.
        tokenizer: a tokenizer or a folder to load one from (None: the evaluated folder's, or ``model``'s).
        max_new_tokens, batch_size: generation length and prompts per ``generate`` call.
        reward_weights: one weight per reward function (TRL's ``GRPOConfig.reward_weights``): a list, tuple or 1-D
            array of finite numbers.
        model: what a state dict is loaded into (a module, or an HF folder loaded once): needed when the
            evaluation is handed a state dict (``search`` with a state-dict or path base, ``ram-live search``).
        do_sample, temperature, top_p, top_k, seed: sampling instead of greedy decoding (default greedy).

    >>> evaluate = rewards("held_out.jsonl", [correct], tokenizer=tok, max_new_tokens=128)   # doctest: +SKIP
    >>> result = ram_live.search(agents, base=base, evaluate=evaluate)                     # doctest: +SKIP
    >>> evaluate.metrics                                          # doctest: +SKIP
    {'reward': 0.62, 'reward/correct': 0.62}
    """
    settings = GenerationSettings(max_new_tokens=max_new_tokens, batch_size=batch_size, do_sample=do_sample,
                                  temperature=temperature, top_p=top_p, top_k=top_k, seed=seed)
    return Rewards(load_prompts(prompts), reward_funcs, settings, tokenizer=tokenizer,
                   reward_weights=reward_weights, model=model)


class Rewards:
    """The evaluation :func:`rewards` returns. Call it on a module (a ``generate``-capable model, or one that
    holds one), a state dict (loaded into ``model``) or a Hugging Face folder; it returns the mean reward.

    After a call: ``metrics`` (``{"reward": score, "reward/<function>": its mean, ...}``), ``completions`` and
    ``per_prompt`` (the combined reward of each prompt)."""

    def __init__(self, prompts: Prompts, reward_funcs: RewardFunc | Sequence[RewardFunc],
                 settings: GenerationSettings, *, tokenizer: Any = None,
                 reward_weights: Sequence[float] | None = None, model: Any = None) -> None:
        funcs = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
        if not funcs:
            raise ConfigError("rewards: reward_funcs is empty; give at least one reward function")
        for fn in funcs:
            if not callable(fn):
                raise ConfigError(f"rewards: a reward function must be callable, got {fn!r:.80}")
        self.funcs = funcs
        self.names = _unique([_name(fn) for fn in funcs])
        self.weights = [1.0] * len(funcs) if reward_weights is None else weight_list(reward_weights, len(funcs))
        self.prompts = prompts
        self.settings = settings
        self.resolver = Resolver(model=model, tokenizer=tokenizer)
        self._ids: dict[int, list[list[int]]] = {}  # prompt ids per tokenizer (tokenized once)
        self.metrics: dict[str, float] = {}
        self.completions: list[Any] = []
        self.per_prompt: list[float] = []

    def __call__(self, merged: Any, step: int | None = None) -> float:
        """The mean reward of ``merged`` (``step``: verl's keyword, unused)."""
        model, tokenizer = self.resolver.resolve(merged)
        completion_ids = generate_completions(model, tokenizer, self._prompt_ids(tokenizer), self.settings)
        texts = tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
        if self.prompts.conversational:
            completions: list[Any] = [[{"role": "assistant", "content": t}] for t in texts]
        else:
            completions = texts
        return self.score(completions, completion_ids)

    def score(self, completions: list[Any], completion_ids: list[list[int]] | None = None) -> float:
        """Score given completions (one per prompt) with the reward functions; sets ``metrics``, ``per_prompt``."""
        n = len(self.prompts)
        if len(completions) != n:
            raise ConfigError(f"rewards.score: {len(completions)} completions for {n} prompts")
        table = [self._run(i, fn, completions, completion_ids) for i, fn in enumerate(self.funcs)]
        # TRL: a prompt that every function scores None is left out of the mean (nanmean), not counted as 0
        per_prompt: list[float | None] = [
            None if all(col[j] is None for col in table)
            else sum(w * col[j] for w, col in zip(self.weights, table) if col[j] is not None)
            for j in range(n)]
        scored = [r for r in per_prompt if r is not None]
        if not scored:
            raise EvaluationError(f"every reward function returned None for every one of the {n} prompts: "
                                  "nothing to score", function=", ".join(self.names), index=None)
        score = sum(scored) / len(scored)
        if not math.isfinite(score):  # finite rewards whose weighted sum (or its total) overflows
            j = next((j for j, r in enumerate(per_prompt) if r is not None and not math.isfinite(r)), None)
            where = f"prompt {j}'s weighted sum" if j is not None else "the sum over the prompts"
            raise EvaluationError(f"the rewards overflow: {where} is {score if j is None else per_prompt[j]} "
                                  "(rewards or weights near float's limit)", function=", ".join(self.names), index=j)
        metrics = {"reward": score}
        for name, col in zip(self.names, table):
            given = [r for r in col if r is not None]
            metrics[f"reward/{name}"] = sum(given) / len(given) if given else math.nan
        self.metrics, self.completions, self.per_prompt = metrics, completions, per_prompt
        return score

    def details(self, merged: Any) -> dict[str, Any]:
        """Call on ``merged`` and return the metrics, the completions and each prompt's combined reward."""
        self(merged)
        return {**self.metrics, "completions": self.completions, "per_prompt": self.per_prompt}

    # ------------------------------------------------------------------------------------------- internals

    def _prompt_ids(self, tokenizer: Any) -> list[list[int]]:
        key = id(tokenizer)
        if key not in self._ids:
            self._ids = {key: tokenize_prompts(tokenizer, self.prompts.prompts, self.prompts.conversational,
                                               self.prompts.where)}
        return self._ids[key]

    def _run(self, which: int, fn: RewardFunc, completions: list[Any], completion_ids: Any) -> list[float | None]:
        name = self.names[which]
        rows = range(len(completions))

        def call(sel: Sequence[int]) -> Any:
            kwargs = {"prompts": [self.prompts.prompts[j] for j in sel], "completions": [completions[j] for j in sel],
                      "completion_ids": None if completion_ids is None else [completion_ids[j] for j in sel],
                      **{k: [v[j] for j in sel] for k, v in self.prompts.columns.items()}}
            return fn(**_accepted(fn, kwargs))

        try:
            out = call(rows)
        except Exception as exc:
            index = _first_failing(call, len(completions))
            where = f"prompt {index}" if index is not None else f"prompts 0..{len(completions) - 1}"
            raise EvaluationError(f"reward function {name!r} raised {type(exc).__name__} on {where}: {one_line(exc)}",
                                  function=name, index=index) from exc
        return reward_list(out, name, len(completions))


def _first_failing(call: Callable[[Sequence[int]], Any], n: int) -> int | None:
    """The first prompt whose call raises on its own (None if none does)."""
    for j in range(n):
        try:
            call([j])
        except Exception:
            return j
    return None


def _accepted(fn: Callable[..., Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` as ``fn`` takes them: all of them with ``**kwargs``, else the ones it names."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return kwargs
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return kwargs
    names = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return {k: v for k, v in kwargs.items() if k in names}


def _name(fn: Any) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__


def _unique(names: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for n in names:
        seen[n] = seen.get(n, 0) + 1
        out.append(n if seen[n] == 1 else f"{n}_{seen[n]}")
    return out

