"""``ram_live.evaluate.lm_eval`` on the in-memory tiny Llama with a local task (tests/data/lm_eval_toy): the
accuracy equals a hand-written log-likelihood loop's, and ``search`` takes it. Skipped where lm-eval is missing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("lm_eval")

from ram_live import search  # noqa: E402
from ram_live.errors import ConfigError, EvaluationError  # noqa: E402
from ram_live.evaluate import lm_eval  # noqa: E402

import evaluate_helpers as h  # noqa: E402

TASKS = Path(__file__).parent / "data" / "lm_eval_toy"


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(TASKS)  # the task's data_files path is relative


def loglikelihood(m, tok, context: str, continuation: str) -> float:
    ctx, cont = tok(context)["input_ids"], tok(continuation)["input_ids"]
    with torch.no_grad():
        logp = torch.log_softmax(m(torch.tensor([ctx + cont])).logits[0].float(), dim=-1)
    return sum(float(logp[len(ctx) - 1 + i, t]) for i, t in enumerate(cont))


def accuracy(m, tok) -> float:
    rows = [json.loads(line) for line in (TASKS / "ram_toy_choice.jsonl").read_text().splitlines()]
    right = 0
    for row in rows:
        scores = [loglikelihood(m, tok, row["question"], " " + c) for c in row["choices"]]
        right += int(max(range(len(scores)), key=scores.__getitem__) == row["label"])
    return right / len(rows)


def test_accuracy_equals_the_hand_written_loop():
    tok, m = h.tokenizer(), h.model(0)
    evaluate = lm_eval(
        "ram_toy_choice", metric="acc", tokenizer=tok, include_path=TASKS, include_defaults=False, batch_size=4
    )
    expected = accuracy(m, tok)
    assert evaluate(m) == expected
    assert evaluate.metrics == {"ram_toy_choice": expected}
    assert evaluate.results["results"]["ram_toy_choice"]["acc,none"] == expected
    assert 0.0 < expected < 1.0  # not vacuous
    assert evaluate(h.model(1)) == accuracy(h.model(1), tok)


def test_search_takes_it():
    tok, base = h.tokenizer(), h.model(0)
    agents = {"a": h.model(1).state_dict(), "b": h.model(2).state_dict()}
    evaluate = lm_eval(["ram_toy_choice"], tokenizer=tok, include_path=TASKS, include_defaults=False)
    result = search(agents, base=base, evaluate=evaluate, budget=2, space=["task_arithmetic"])
    assert len(result.scored) == 2 and all(0.0 <= t.score <= 1.0 for t in result.scored)


def test_a_metric_the_task_lacks():
    evaluate = lm_eval(
        "ram_toy_choice", metric="exact_match", tokenizer=h.tokenizer(), include_path=TASKS, include_defaults=False
    )
    with pytest.raises(EvaluationError, match=r"task 'ram_toy_choice' reports no 'exact_match,none'"):
        evaluate(h.model(0))


def test_bad_tasks():
    with pytest.raises(ConfigError, match="tasks must be task names"):
        lm_eval([], tokenizer=h.tokenizer())


def test_an_unknown_task_names_it():
    evaluate = lm_eval("no_such_task", tokenizer=h.tokenizer(), include_path=TASKS, include_defaults=False)
    with pytest.raises(EvaluationError, match=r"no_such_task"):
        evaluate(h.model(0))


def test_a_tokenizer_or_model_path_that_does_not_exist_is_refused_when_built(tmp_path):
    for option in ("tokenizer", "model"):
        with pytest.raises(ConfigError, match=rf"rewards: {option}='{tmp_path}/ckpt/bsae' does not exist"):
            lm_eval("ram_toy_choice", include_path=TASKS, **{option: str(tmp_path / "ckpt" / "bsae")})
