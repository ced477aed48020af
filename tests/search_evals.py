"""Evaluations the search tests hand to worker processes: importable on their own (a spawned worker unpickles
them by module, and must not import a test module, whose ``conftest`` may resolve to another folder's)."""

from __future__ import annotations

import os
import signal

import torch

TARGET = {"coder": 2.0, "tools": 0.5, "memory": 3.0}


class PromptEval:
    """Prompt i of task t scores -|merged - target_t|² (per key, summed) + a fixed per-prompt offset: a candidate's
    score differences are the same on every prompt of a task, as a paired comparison assumes."""

    def __init__(self, targets: dict[str, dict], per_task: int = 9, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.tasks = [t for t in targets for _ in range(per_task)]
        self.offsets = (torch.randn(len(self.tasks), generator=g) * 0.01).tolist()
        self.targets = targets
        self.calls: list[list[int]] = []

    def prompt_tasks(self):
        return list(self.tasks)

    def prompt_scores(self, merged, indices):
        self.calls.append(list(indices))
        dist = {
            t: -sum(float(((merged[k].double() - tg[k].double()) ** 2).sum()) for k in tg)
            for t, tg in self.targets.items()
        }
        return [dist[self.tasks[i]] + self.offsets[i] for i in indices]

    def aggregate(self, values):
        groups: dict[str, list[float]] = {}
        for i, v in values.items():
            if v is not None:
                groups.setdefault(self.tasks[i], []).append(v)
        tasks = {t: sum(vs) / len(vs) for t, vs in groups.items()}
        return sum(tasks.values()) / len(tasks), tasks

    def __call__(self, merged):
        return self.aggregate(dict(enumerate(self.prompt_scores(merged, range(len(self.tasks))))))[0]


class Raises(PromptEval):
    def prompt_scores(self, merged, indices):
        if len(self.calls) >= 0 and float(next(iter(merged.values())).sum()) != 0.0:
            raise KeyError("reward column 'answer' missing")
        return super().prompt_scores(merged, indices)


class Dies(PromptEval):
    def prompt_scores(self, merged, indices):
        if os.environ.get("RAM_LIVE_WORKER") is not None:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().prompt_scores(merged, indices)


class Threads(PromptEval):
    def prompt_scores(self, merged, indices):
        return [float(torch.get_num_threads())] * len(indices)


class KillOn(PromptEval):
    """Records every candidate it scores (by its merged head); kills its process on the one named ``victim``."""

    def __init__(self, targets, log, victim=None):
        super().__init__(targets)
        self.log, self.victim = log, victim

    def prompt_scores(self, merged, indices):
        mark = f"{float(merged['head.weight'].double().sum()):.12e}"
        if mark == self.victim and os.environ.get("RAM_LIVE_WORKER") is not None:
            os.kill(os.getpid(), signal.SIGKILL)
        with open(self.log, "a") as fh:
            fh.write(mark + "\n")
        return super().prompt_scores(merged, indices)
