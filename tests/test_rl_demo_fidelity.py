"""The demo's prompt-protocol evaluation (rl_demo.selection.PromptAccuracy): on every prompt it is the demo's
``mean_accuracy`` bit for bit, per prompt it scores the rows asked for only, and ``search_row`` takes a budget in
prompt-evaluations and ``fidelity="halving"``. A scripted model (its greedy answers are a rule of the prompt and of
one weight) keeps it fast and its accuracies away from 0."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import Tensor, nn

from ram_live import merge

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
from rl_demo.lang import make_prompts  # noqa: E402
from rl_demo.selection import PromptAccuracy, mean_accuracy, scored, search_row  # noqa: E402

sys.path.remove(str(ROOT / "examples"))

pytestmark = pytest.mark.filterwarnings("ignore::ram_live.ExtrapolationWarning")

TASKS = ("shift", "rev", "sort")


class Scripted(nn.Module):
    """Greedy answers: shift and rev by their rule, sort by copying the digits; a prompt whose first digit is at
    least ``10 · mean(w)`` gets each token one off (wrong). Accuracy on shift and rev grows with ``mean(w)``."""

    def __init__(self, w: float, dtype: torch.dtype = torch.bfloat16) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.full((64,), w, dtype=dtype), requires_grad=False)

    def forward(self, input_ids: Tensor) -> SimpleNamespace:
        ids, length = input_ids, input_ids.shape[1]
        j = length - 7  # the answer token being generated
        shift, rev, copied = (ids[:, 1 + j] + 3) % 10, ids[:, 5 - j], ids[:, 1 + j]
        nxt = torch.where(ids[:, 0] == 10, shift, torch.where(ids[:, 0] == 11, rev, copied))
        wrong = ids[:, 1].float() >= 10 * self.w.float().mean()
        nxt = torch.where(wrong, (nxt + 1) % 10, nxt)
        logits = torch.nn.functional.one_hot(nxt, 16).float() + 0 * self.w.float().sum()
        return SimpleNamespace(logits=logits[:, None, :].expand(-1, length, -1))


def data(n: int = 30, seed: int = 0) -> dict[str, tuple[Tensor, Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return {t: make_prompts(t, g, n) for t in TASKS}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_on_every_prompt_it_is_mean_accuracy_bit_for_bit(dtype: torch.dtype) -> None:
    d = data()
    ev = PromptAccuracy(d)
    for w in (0.35, 0.7, 1.0):
        model = Scripted(w, dtype)
        want = mean_accuracy(d)(model)
        assert ev(model) == want  # exactly: the per-task means in float32, as lang.accuracy takes them
        values = dict(enumerate(ev.prompt_scores(model, range(len(ev.tasks)))))
        score, tasks = ev.aggregate(values)
        acc = scored(model, d)
        assert score == want and tasks == {t: acc[t] for t in TASKS}
        assert 0 < want < 1 and acc["shift"] > 0 and acc["sort"] == 0.0
    assert ev.prompt_tasks() == [t for t in TASKS for _ in range(30)]


def test_prompt_scores_score_the_rows_asked_for_only() -> None:
    d = data()
    ev = PromptAccuracy(d)
    model = Scripted(0.6)
    everything = ev.prompt_scores(model, range(90))
    assert set(everything) == {0.0, 1.0}
    picked = [61, 3, 40, 0, 89, 31]
    assert ev.prompt_scores(model, picked) == [everything[i] for i in picked]
    assert ev.prompt_scores(model, []) == []
    # each task's rows in one batch: a float32 model (no copy) that records its batch sizes
    model = Scripted(0.6, torch.float32)
    sizes: list[int] = []
    original = model.forward

    def counting(input_ids: Tensor) -> SimpleNamespace:
        sizes.append(input_ids.shape[0])
        return original(input_ids)

    model.forward = counting  # type: ignore[method-assign]
    ev.prompt_scores(model, [0, 1, 35, 70, 71, 72])
    assert sizes == [2] * 5 + [1] * 5 + [3] * 5  # 5 answer tokens per batch, one batch per task
    # a subset's aggregate: the mean over the tasks present of each task's mean
    score, tasks = ev.aggregate({0: 1.0, 1: 0.0, 35: 1.0, 40: None})
    assert tasks == {"shift": 0.5, "rev": 1.0} and score == 0.75


@pytest.fixture
def agents() -> tuple[dict[str, dict[str, Tensor]], Scripted]:
    base = Scripted(0.3)
    return {"a": Scripted(0.5).state_dict(), "b": Scripted(0.45).state_dict()}, base


def test_search_row_with_a_prompt_budget_and_the_race(agents: tuple) -> None:
    models, base = agents
    sel, test = data(27, seed=1), data(30, seed=2)
    n = 3 * 27
    full = search_row(models, base, sel, test, budget="6x", seed=0)
    raced = search_row(models, base, sel, test, budget="6x", seed=0, fidelity="halving")
    counted = search_row(models, base, sel, test, budget=6, seed=0)
    for row in (full, raced, counted):
        result = row["result"]
        again = merge(models, base=base, **result.best)
        assert row["selection"] == result.best_score == PromptAccuracy(sel)(again)
        assert row["prompt_evaluations"] == round(sum(t.fidelity for t in result.scored) * n)
        assert row["full_fidelity"] == len(result.complete) and row["test"]["mean"] == pytest.approx(
            sum(row["test"][t] for t in TASKS) / 3
        )
    assert full["spent"] == 6 and full["prompt_evaluations"] == 6 * n and full["evaluations"] == 6
    assert counted["prompt_evaluations"] == 6 * n and counted["selection"] == full["selection"]
    assert raced["spent"] <= 6 + 1e-9 and raced["prompt_evaluations"] <= 6 * n
    assert raced["fidelity"] == "halving" and full["fidelity"] is None and raced["budget"] == "6x"
    assert raced["result"].best_trial.fidelity == 1.0
    assert raced["selection"] >= full["selection"] - 0.1
