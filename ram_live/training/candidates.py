"""The callbacks' search candidates in the training model: each candidate's tensors swapped into the live model
while its evaluation runs and swapped back after (bit for bit), for a plain evaluation
(:func:`swapped_in`) and for one that scores prompts one by one (:class:`SwappedPrompts`, the race), with
scores averaged over the ranks under DDP; :func:`candidate_evaluation` makes either from the search setting's
evaluation. :func:`~ram_live.training.search.schedule_search` and the LoRA search use them.

>>> with swapped_in(live, merged):                                                  # doctest: +SKIP
...     score = evaluate(model)
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

import torch
from torch import Tensor

from .failures import agreed_sum

__all__ = ["SwappedPrompts", "candidate_evaluation", "check_candidate_evaluation", "swapped_in", "tensors_of"]

T = TypeVar("T")


class SwappedPrompts:
    """The prompt protocol of an evaluation such as :func:`ram_live.evaluate.rewards`, with each candidate swapped
    into the training model for ``prompt_scores`` (restored after); under DDP each prompt's score is averaged over
    the ranks, so every rank races alike. (``mode="min"`` does not apply: rewards are higher-is-better.)"""

    def __init__(
        self,
        fn: Any,
        evaluate: Callable[[Any], float],
        live: Any,
        model: Any,
        collective: Any,
        extra: Mapping[str, Tensor] | None = None,
    ) -> None:
        self.fn, self._evaluate, self.live, self.model, self.c = fn, evaluate, live, model, collective
        self.extra = dict(extra or {})

    def __call__(self, merged: Any) -> float:
        return self._evaluate(merged)

    def prompt_tasks(self) -> list[str]:
        return list(self.fn.prompt_tasks())

    def aggregate(self, values: Mapping[int, float | None]) -> Any:
        return self.fn.aggregate(values)

    def prompt_scores(self, merged: Any, indices: Any) -> list[float | None]:
        indices = list(indices)

        def scores() -> list[float | None]:
            with swapped_in(self.live, {**tensors_of(merged), **self.extra}):
                return list(self.fn.prompt_scores(self.model, indices))

        out, failure = _attempt(self.c, scores, [])
        if self.c.world_size <= 1:
            return out
        given = torch.full((len(indices),), math.nan, dtype=torch.float64)
        if failure is None:
            given = torch.tensor([math.nan if v is None else float(v) for v in out], dtype=torch.float64)
        summed = agreed_sum(
            self.c, torch.cat([given.nan_to_num(nan=0.0), (~given.isnan()).double()]), failure, "scoring prompts"
        )
        total, seen = summed[: len(indices)], summed[len(indices) :]
        return [None if n == 0 else float(t) / float(n) for t, n in zip(total.tolist(), seen.tolist())]


def candidate_evaluation(
    setting: Any, fn: Any, live: Any, model: Any, collective: Any, extra: Mapping[str, Tensor] | None = None
) -> Callable[[Any], float]:
    """``fn`` as a search's evaluation of candidates swapped into the training model: each candidate's tensors (and
    ``extra``'s, e.g. a LoRA run's zeroed ``lora_B``) in ``live`` while ``fn(model)`` runs, the score the setting's
    (:meth:`~ram_live.training.search.SearchSetting.score`) and, under DDP, averaged over the ranks; an evaluation
    that scores prompts one by one keeps that protocol (:class:`SwappedPrompts`, for a race).

    Args:
        setting: the :class:`~ram_live.training.search.SearchSetting` (its ``score``, ``mode`` and ``fidelity``).
        fn: the evaluation, ``fn(model)``.
        live: the training model's tensors (a ``LocalModel``) the candidates are swapped into.
        model: what ``fn`` is called on.
        collective: the ranks' collective.
        extra: tensors swapped in with every candidate.

    Returns:
        ``evaluate(candidate) -> float``.

    Raises:
        ConfigError: a race (``fidelity``) without an evaluation scoring prompts one by one and ``mode="max"``.
    """

    def evaluate(merged: Any) -> float:
        def score() -> float:
            with swapped_in(live, {**tensors_of(merged), **(extra or {})}):  # scored while swapped in: maybe views
                return setting.score(fn(model))

        value, failure = _attempt(collective, score, math.nan)
        if collective.world_size <= 1:
            return value
        total = agreed_sum(collective, torch.tensor([value], dtype=torch.float64), failure, "scoring a candidate")
        return float(total.item()) / collective.world_size

    if check_candidate_evaluation(setting, fn):
        return SwappedPrompts(fn, evaluate, live, model, collective, extra)
    return evaluate


def check_candidate_evaluation(setting: Any, fn: Any) -> bool:
    """Whether the search's candidates are scored prompt by prompt (``fn`` has the prompt protocol and
    ``mode="max"``): what :func:`candidate_evaluation` builds, checked without a model (the pre-flight).

    Raises:
        ConfigError: a race (``fidelity``) without an evaluation scoring prompts one by one and ``mode="max"``.
    """
    from ..errors import ConfigError
    from ..selection.fidelity import prompt_protocol

    if prompt_protocol(fn) and setting.mode == "max":
        return True
    if setting.fidelity not in (None, "full"):
        raise ConfigError(
            f"search fidelity={setting.fidelity!r} needs an evaluation that scores prompts one by "
            "one (ram_live.evaluate.rewards) and mode='max'"
        )
    return False


def _attempt(collective: Any, block: Callable[[], T], failed: T) -> tuple[T, Exception | None]:
    """``block()`` and no failure; under several ranks an exception it raises is returned with ``failed`` instead,
    to be raised on every rank by :func:`~ram_live.training.failures.agreed_sum` (none is left waiting in its
    all-reduce); in one process it propagates."""
    try:
        return block(), None
    except Exception as exc:
        if collective.world_size <= 1:
            raise
        return failed, exc


@contextlib.contextmanager
def swapped_in(live: Any, merged: Any) -> Iterator[None]:
    """``merged``'s tensors swapped into the training model ``live`` while the block runs, swapped back after."""
    from .tensors import swap_tensors

    tensors = tensors_of(merged)
    swap_tensors(live, tensors)
    try:
        yield
    finally:
        swap_tensors(live, tensors)


def tensors_of(merged: Any) -> dict[str, Tensor]:
    """A candidate's tensors by key: a mapping as it is, a :class:`~ram_live.store.LocalModel`'s local tensors, or
    a module's state dict."""
    if isinstance(merged, Mapping):
        return dict(merged)
    tensors = getattr(merged, "tensors", None)  # a LocalModel
    if isinstance(tensors, Mapping):
        return {k: getattr(t, "tensor", t) for k, t in tensors.items()}
    return dict(merged.state_dict())
