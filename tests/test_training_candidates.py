"""``ram_live.training.candidates``: a candidate scored in the training model, in one process and (a stand-in
collective whose other rank scored alike and did not fail) over two ranks: the same scores, the model restored bit
for bit, a failure raised as the evaluation's own error."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from ram_live.store import LocalCollective, LocalModel, LocalTensor
from ram_live.training.candidates import SwappedPrompts, candidate_evaluation


class _TwoRanks(LocalCollective):
    """Rank 0 of two whose other rank sent the same values and no failure (the failure flag is the last entry)."""

    rank, world_size = 0, 2

    def all_reduce_sum_(self, tensor: torch.Tensor) -> torch.Tensor:
        tensor[:-1] *= 2
        return tensor


class _Prompts:
    """Prompt i scores the live weight's sum times i; prompt 2 is not scored (None); ``fail`` raises."""

    def __init__(self, weight: torch.Tensor, fail: bool = False) -> None:
        self.weight, self.fail = weight, fail

    def __call__(self, model: Any) -> dict[str, float]:
        return {"score": float(self.weight.sum())}

    def prompt_tasks(self) -> list[str]:
        return ["t"] * 4

    def aggregate(self, values: Any) -> Any:
        return values

    def prompt_scores(self, model: Any, indices: list[int]) -> list[float | None]:
        if self.fail:
            raise ValueError("judge is down")
        return [None if i == 2 else float(self.weight.sum()) * i for i in indices]


class _Setting:
    mode, fidelity = "max", None

    def score(self, metrics: dict[str, float]) -> float:
        return metrics["score"]


@pytest.mark.parametrize("collective", [LocalCollective(), _TwoRanks()], ids=["one", "two"])
def test_scores_alike_in_one_process_and_over_ranks(collective: LocalCollective) -> None:
    weight = torch.ones(2, 3)
    live = LocalModel({"w": LocalTensor(weight, (2, 3), (0, 0), True)}, {}, ["w"], "live", False)
    fn = _Prompts(weight)
    evaluate = candidate_evaluation(_Setting(), fn, live, None, collective)
    assert isinstance(evaluate, SwappedPrompts)
    merged = {"w": torch.full((2, 3), 0.5)}
    assert evaluate(merged) == 3.0
    assert evaluate.prompt_scores(merged, [0, 1, 2, 3]) == [0.0, 3.0, None, 9.0]
    assert torch.equal(weight, torch.ones(2, 3)) and torch.equal(merged["w"], torch.full((2, 3), 0.5))
    fn.fail = True
    with pytest.raises(ValueError, match="judge is down"):
        evaluate.prompt_scores(merged, [0, 1])
    assert torch.equal(weight, torch.ones(2, 3))
