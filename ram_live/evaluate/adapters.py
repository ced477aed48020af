"""A verl-style ``compute_score(data_source, solution_str, ground_truth, extra_info)`` as a TRL-style reward
function, so :func:`~ram_live.evaluate.rewards` scores with the reward a verl run trained on.

The prompt rows are verl's own (its RL parquet/JSONL): ``data_source``, ``reward_model: {"ground_truth": ...}``
(or a plain ``ground_truth`` column) and ``extra_info`` (optional). A ``compute_score`` that returns a dict
(``{"score": ..., ...}``, as verl allows) gives its ``"score"``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable

from ..errors import EvaluationError
from ..loading import load_callable

__all__ = ["compute_score"]


def compute_score(fn: Callable[..., Any] | str, *, name: str | None = None) -> Callable[..., list[Any]]:
    """Wrap a verl ``compute_score`` as a reward function of :func:`~ram_live.evaluate.rewards`.

    Args:
        fn: ``compute_score(data_source, solution_str, ground_truth, extra_info) -> float | dict``, or its dotted
            path (``"pkg.mod:fn"``; verl's ``custom_reward_function.path`` is a file: import it as a module).
        name: the name metrics and errors use (default: the function's).

    Returns:
        A reward function ``reward(prompts, completions, data_source=..., reward_model=..., ground_truth=...,
        extra_info=..., **columns) -> list`` named ``name``: one score per completion (a dict's ``"score"``).

    Raises:
        ConfigError: ``fn`` is neither callable nor an importable path to a callable.
        EvaluationError: (when the reward runs) a prompt row has neither ``ground_truth`` nor a ``reward_model``
            holding one.

    >>> from verl.utils.reward_score import default_compute_score                    # doctest: +SKIP
    >>> evaluate = rewards("val.jsonl", compute_score(default_compute_score), tokenizer=tok)   # doctest: +SKIP
    """
    score_fn = load_callable(fn, "compute_score")
    label = name or getattr(score_fn, "__name__", None) or "compute_score"

    def reward(
        prompts: list[Any],
        completions: list[Any],
        data_source: list[Any] | None = None,
        reward_model: list[Any] | None = None,
        ground_truth: list[Any] | None = None,
        extra_info: list[Any] | None = None,
        **_: Any,
    ) -> list[float]:
        out = []
        for j, completion in enumerate(completions):
            text = completion[-1]["content"] if isinstance(completion, list) else completion
            truth = ground_truth[j] if ground_truth is not None else _truth(reward_model, j, label)
            value = score_fn(
                None if data_source is None else data_source[j],
                text,
                truth,
                None if extra_info is None else extra_info[j],
            )
            out.append(value["score"] if isinstance(value, Mapping) and "score" in value else value)
        return out

    reward.__name__ = label
    return reward


def _truth(reward_model: list[Any] | None, j: int, label: str) -> Any:
    if reward_model is None:
        raise EvaluationError(
            f"{label}: prompt {j} has no ground truth: the prompt rows need a 'reward_model' "
            "({'ground_truth': ...}) or a 'ground_truth' column",
            function=label,
            index=j,
        )
    row = reward_model[j]
    if not isinstance(row, Mapping) or "ground_truth" not in row:
        raise EvaluationError(
            f"{label}: prompt {j}'s reward_model has no 'ground_truth': {row!r:.80}", function=label, index=j
        )
    return row["ground_truth"]
