"""A small problem for the sampler and storage tests: three agents whose task vectors live on blocks of their own;
task t's prompts score how close the merge is, on t's block, to the base + ``TARGET[t]`` × τ_t (so task arithmetic
with weights ``TARGET`` is best), plus a fixed offset per prompt (the race's slices differ). Importable by the
subprocesses of the storage tests."""

from __future__ import annotations

import time

import torch

TARGET = {"coder": 2.3, "tools": 0.7, "memory": 3.4}
BLOCK = 4


def agents() -> tuple[dict[str, dict[str, torch.Tensor]], dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(7)
    n = BLOCK * len(TARGET)
    base = {"w": torch.zeros(n)}
    models = {}
    for i, name in enumerate(TARGET):
        tau = torch.zeros(n)
        tau[i * BLOCK : (i + 1) * BLOCK] = torch.rand(BLOCK, generator=g) + 0.5
        models[name] = {"w": base["w"] + tau}
    return models, base


class BlockEval:
    """The prompt protocol over the problem above (``per_task`` prompts a task); ``delay`` seconds a call;
    ``calls`` counts the calls of ``prompt_scores``; ``fail_after``: raise after that many calls."""

    def __init__(self, per_task: int = 9, delay: float = 0.0, fail_after: int | None = None) -> None:
        models, base = agents()
        g = torch.Generator().manual_seed(3)
        self.tasks = [t for t in TARGET for _ in range(per_task)]
        self.offsets = (torch.randn(len(self.tasks), generator=g) * 0.02).tolist()
        self.target = {
            t: (base["w"] + TARGET[t] * (models[t]["w"] - base["w"]))[i * BLOCK : (i + 1) * BLOCK]
            for i, t in enumerate(TARGET)
        }
        self.index = {t: i for i, t in enumerate(TARGET)}
        self.delay, self.fail_after, self.calls = delay, fail_after, 0

    def prompt_tasks(self) -> list[str]:
        return list(self.tasks)

    def prompt_scores(self, merged: dict[str, torch.Tensor], indices: list[int]) -> list[float]:
        self.calls += 1
        if self.fail_after is not None and self.calls > self.fail_after:
            raise RuntimeError("killed")
        if self.delay:
            time.sleep(self.delay)
        w = merged["w"].double()
        dist = {}
        for t, i in self.index.items():
            dist[t] = -float(((w[i * BLOCK : (i + 1) * BLOCK] - self.target[t].double()) ** 2).sum())
        return [dist[self.tasks[i]] + self.offsets[i] for i in indices]

    def aggregate(self, values: dict[int, float | None]) -> tuple[float, dict[str, float]]:
        groups: dict[str, list[float]] = {}
        for i, v in values.items():
            if v is not None:
                groups.setdefault(self.tasks[i], []).append(v)
        tasks = {t: sum(v) / len(v) for t, v in groups.items()}
        return sum(tasks.values()) / len(tasks), tasks

    def __call__(self, merged: dict[str, torch.Tensor]) -> float:
        return self.aggregate(dict(enumerate(self.prompt_scores(merged, range(len(self.tasks))))))[0]


CALLS: list[int] = []


def plain_score(merged: dict[str, torch.Tensor]) -> float:
    """``BlockEval``'s objective as a plain function (what ``ram-live search --eval`` calls), counted in ``CALLS``."""
    CALLS.append(1)
    return BlockEval()(merged)
