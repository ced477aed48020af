"""The search's per-task keys follow the evaluation's layout (integrations/metrics.py ``search_task_key``): in a
RAMSchedule whose evaluation is logged in TRL's layout, the winner's score on task t is
``ram/search/eval_tasks/<t>/<metric>`` beside the generalist's ``ram/eval_tasks/<t>/<metric>`` (the same number:
the generalist is the winner), ``ram/search/val/<t>/reward/<metric>`` in Lightning's, ``ram/search/eval/<t>``
in a plain schedule."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ram_live.evaluate import rewards
from ram_live.integrations.metrics import LAYOUTS, logged_as, search_task_key
from ram_live.training.schedule import RAMSchedule
from ram_live.training.search import SearchSetting, search_metrics

pytestmark = pytest.mark.filterwarnings("ignore::ram_live.ArbitraryChoiceWarning")

ROWS = [{"prompt": f"q{i}", "topic": t} for i, t in enumerate(["x", "x", "y", "y", "y", "z"])]


def _net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2))


def _by_weights(merged, prompts, settings, seeds):
    """Completions that depend on the weights swapped in: "a" repeated by the first weight's scaled value."""
    level = float(next(merged.parameters()).detach().sum()) * 10
    return [[("a" * (abs(int(level * (i + 1) + j)) % 4)) for j in range(2)] for i, _ in enumerate(prompts)]


def count_a(completions, **kwargs):
    return [float(c.count("a")) for c in completions]


def test_key_templates():
    assert search_task_key("math", "pass@4", "trl") == "eval_tasks/math/pass@4"
    assert search_task_key("math", "pass@4", "lightning") == "val/math/reward/pass@4"
    assert search_task_key("math", "pass@4", "verl") == "val-core/math/reward/pass@4"
    assert search_task_key("math", None, "trl") == search_task_key("math", "pass@4", None) == "eval/math"
    for layout, keys in LAYOUTS.items():  # the evaluation's own per-task key, whatever the layout
        assert search_task_key("t", "mean@2", layout) == keys["task"][0].format(task="t", metric="mean@2")
    record = {"best_score": 1.0, "evaluations": 2, "seconds": {}, "best": {"method": "ram"}}
    record["best_tasks"], record["task_metric"] = {"x": 0.5}, "pass@2"
    assert search_metrics(record, layout="trl")["ram/search/eval_tasks/x/pass@2"] == 0.5
    assert search_metrics(record)["ram/search/eval/x"] == 0.5


@pytest.mark.parametrize("layout", ["trl", "lightning", None])
def test_a_schedules_search_keys_each_task_as_its_evaluation_does(tmp_path, tok, layout):
    store = tmp_path / "store"
    a, b = _net(), _net()
    with torch.no_grad():
        a[0].weight.add_(0.05)
        b[0].weight.add_(-0.02)
        b[2].weight.add_(0.03)
    first = RAMSchedule(store, "a", durable=False)
    first.attach(_net())
    first.snapshot(a, 2)
    evaluate = rewards(ROWS, count_a, tokenizer=tok, samples=2, metric="pass@2", task="topic", generate=_by_weights)
    setting = SearchSetting(evaluate=evaluate, budget=4)
    sched = RAMSchedule(store, "b", merge_every=2, search=setting, durable=False)
    sched.attach(_net())
    fn = logged_as(evaluate, layout) if layout else evaluate
    metrics = sched.merge_and_evaluate(b, 2, evaluate=fn)
    assert sched.last_search["task_metric"] == "pass@2"
    for task in ("x", "y", "z"):
        searched = metrics["ram/search/" + search_task_key(task, "pass@2", layout)]
        logged = metrics[
            "ram/" + (LAYOUTS[layout]["task"][0].format(task=task, metric="pass@2") if layout else f"eval/{task}")
        ]
        assert searched == logged  # the generalist is the search's winner: its score on the task, twice
    assert not any(k.startswith("ram/search/task/") for k in metrics)
