"""The callbacks' search candidates in the training model: each candidate's tensors swapped into the live model
while its evaluation runs and swapped back after (bit for bit), for a plain evaluation
(:func:`swapped_in`) and for one that scores prompts one by one (:class:`SwappedPrompts`, the race), with
scores averaged over the ranks under DDP. :func:`~ram_live.training.search.schedule_search` uses them.

>>> with swapped_in(live, merged):                                                  # doctest: +SKIP
...     score = evaluate(model)
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from torch import Tensor

__all__ = ["SwappedPrompts", "swapped_in", "tensors_of"]


class SwappedPrompts:
    """The prompt protocol of an evaluation such as :func:`ram_live.evaluate.rewards`, with each candidate swapped
    into the training model for ``prompt_scores`` (restored after); under DDP each prompt's score is averaged over
    the ranks, so every rank races alike. (``mode="min"`` does not apply: rewards are higher-is-better.)"""

    def __init__(self, fn: Any, evaluate: Callable[[Any], float], live: Any, model: Any, collective: Any) -> None:
        self.fn, self._evaluate, self.live, self.model, self.c = fn, evaluate, live, model, collective

    def __call__(self, merged: Any) -> float:
        return self._evaluate(merged)

    def prompt_tasks(self) -> list[str]:
        return list(self.fn.prompt_tasks())

    def aggregate(self, values: Mapping[int, float | None]) -> Any:
        return self.fn.aggregate(values)

    def prompt_scores(self, merged: Any, indices: Any) -> list[float | None]:
        import torch

        with swapped_in(self.live, merged):
            out = list(self.fn.prompt_scores(self.model, indices))
        if self.c.world_size > 1:
            given = torch.tensor([math.nan if v is None else float(v) for v in out], dtype=torch.float64)
            total = self.c.all_reduce_sum_(torch.nan_to_num(given, nan=0.0))
            seen = self.c.all_reduce_sum_((~torch.isnan(given)).double())
            out = [None if n == 0 else float(t) / float(n) for t, n in zip(total.tolist(), seen.tolist())]
        return out


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
