"""Per-task scores and objectives of ``ram_live.evaluate.rewards``, the prompt protocol ``search`` uses, and the
per-task metrics the training callbacks log (``ram/eval/<task>``)."""

from __future__ import annotations

import pytest
import torch

from ram_live import RAMSchedule, search
from ram_live.errors import ConfigError, EvaluationError
from ram_live.evaluate import rewards
from ram_live.selection.fidelity import prompt_protocol

import evaluate_helpers as h
from evaluate_helpers import ANSWERS, PROMPTS

# seven prompts in three tasks; the fake engine below writes TEXTS[i] for prompt i
SOURCES = ["gsm8k", "gsm8k", "math", "gsm8k", "code", "math", "gsm8k"]
TEXTS = ["aa", "b", "a", "", "aaa", "ab", "x"]


def fixed(merged, prompts, settings, seeds):
    """A fake engine: each prompt's completion is fixed by the prompt's text."""
    return [[TEXTS[PROMPTS.index(p)]] * settings.samples for p in prompts]


def count_a(completions, **kwargs):
    return [float(c.count("a")) for c in completions]


def rows(task_column="data_source"):
    return [{"prompt": p, task_column: s, "answer": a} for p, s, a in zip(PROMPTS, SOURCES, ANSWERS)]


def by_hand(objective="mean", weights=None):
    per_task = {}
    for s, t in zip(SOURCES, TEXTS):
        per_task.setdefault(s, []).append(float(t.count("a")))
    table = {s: sum(v) / len(v) for s, v in per_task.items()}
    if objective == "min":
        return min(table.values()), table
    if weights is not None:
        return sum(weights[s] * v for s, v in table.items()) / sum(weights.values()), table
    return sum(table.values()) / len(table), table


def test_grouped_by_data_source_by_default_mean_over_tasks():
    evaluate = rewards(rows(), count_a, generate=fixed)
    expected, table = by_hand()
    assert evaluate(None) == expected
    assert table == {"gsm8k": 0.5, "math": 1.0, "code": 3.0}  # the hand computation itself
    assert expected != sum(t.count("a") for t in TEXTS) / len(TEXTS)  # not the mean over prompts
    assert evaluate.tasks == table and list(evaluate.tasks) == ["gsm8k", "math", "code"]
    assert evaluate.metrics == {
        "reward": expected,
        "reward/gsm8k": 0.5,
        "reward/math": 1.0,
        "reward/code": 3.0,
        "reward/count_a": sum(t.count("a") for t in TEXTS) / len(TEXTS),
    }
    assert evaluate.prompt_tasks() == SOURCES


def test_objectives_min_and_weighted():
    assert rewards(rows(), count_a, generate=fixed, objective="min")(None) == by_hand("min")[0] == 0.5
    w = {"gsm8k": 2.0, "math": 1.0, "code": 0.0}
    evaluate = rewards(rows(), count_a, generate=fixed, weights=w)
    assert evaluate(None) == by_hand(weights=w)[0] == (2 * 0.5 + 1.0) / 3.0
    assert evaluate.metrics["reward/code"] == 3.0  # weight 0: out of the objective, still reported


def test_another_column_and_no_grouping():
    assert rewards(rows("kind"), count_a, generate=fixed, task="kind")(None) == by_hand()[0]
    plain = rewards(rows(), count_a, generate=fixed, task=None)
    assert plain(None) == sum(t.count("a") for t in TEXTS) / len(TEXTS)
    assert set(plain.metrics) == {"reward", "reward/count_a"} and plain.prompt_tasks() == ["all"] * 7
    # without a data_source column: one task, the mean over the prompts, bit for bit the plain mean
    no_column = rewards([{"prompt": p} for p in PROMPTS], count_a, generate=fixed)
    assert no_column(None) == plain(None)


def test_one_task_equals_the_mean_over_prompts_on_a_real_model(llama, tok):
    one = rewards([{"prompt": p, "data_source": "x"} for p in PROMPTS], h.count_a, tokenizer=tok, max_new_tokens=6)
    plain = rewards(PROMPTS, h.count_a, tokenizer=tok, max_new_tokens=6)
    assert one(llama) == plain(llama) and one.metrics["reward/x"] == plain.metrics["reward"]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            dict(task="source"),
            r"task='source' is not a column of the prompts \(their columns: \['answer', "
            r"'data_source'\]\)",
        ),
        (dict(task=3), "task must be a column name"),
        (
            dict(weights={"gsm8k": 1.0, "math": 1.0, "code": 1.0, "chess": 1.0}),
            "weights name the task 'chess', which no prompt has",
        ),
        (dict(weights={"gsm8k": 1.0}), r"weights give no weight to the task\(s\) \['math', 'code'\]"),
        (dict(weights={"gsm8k": -1.0, "math": 1.0, "code": 1.0}), "weight of task 'gsm8k' is -1.0"),
        (dict(weights={"gsm8k": float("nan"), "math": 1.0, "code": 1.0}), "weight of task 'gsm8k' is nan: not finite"),
        (dict(weights={"gsm8k": 0, "math": 0, "code": 0}), "the weights sum to 0"),
        (dict(weights=[1.0]), "weights must be a dict"),
        (dict(objective="median"), "objective must be 'mean', 'min' or 'weighted'"),
        (dict(objective="weighted"), "objective='weighted' needs weights="),
        (dict(objective="min", weights={"gsm8k": 1.0, "math": 1.0, "code": 1.0}), "weights= makes the objective"),
    ],
)
def test_bad_task_options_are_one_line_config_errors(kwargs, message):
    with pytest.raises(ConfigError, match=message) as info:
        rewards(rows(), count_a, generate=fixed, **kwargs)
    assert "\n" not in str(info.value)


def test_a_task_value_that_is_not_a_name_and_a_clash_with_a_function_name():
    with pytest.raises(ConfigError, match=r"row 1: the task column 'data_source' holds \{'a': 1\}"):
        rewards([{"prompt": "a", "data_source": "x"}, {"prompt": "b", "data_source": {"a": 1}}], count_a)
    with pytest.raises(ConfigError, match=r"name both a task and a reward function.*reward/count_a"):
        rewards([{"prompt": "a", "data_source": "count_a"}], count_a)
    assert rewards([{"prompt": "a", "data_source": 3}], count_a).prompt_tasks() == ["3"]


def test_the_protocol_equals_the_call_exactly():
    evaluate = rewards(rows(), count_a, generate=fixed, weights={"gsm8k": 1.0, "math": 3.0, "code": 0.5})
    assert prompt_protocol(evaluate)
    everything = evaluate.prompt_scores(None, range(7))
    assert evaluate(None) == evaluate.aggregate(dict(enumerate(everything)))[0]
    # a subset, in any order, gives those prompts' scores in that order
    assert evaluate.prompt_scores(None, [5, 0, 2]) == [everything[5], everything[0], everything[2]]
    score, table = evaluate.aggregate({0: everything[0], 2: everything[2]})
    assert table == {"gsm8k": 2.0, "math": 1.0} and score == (2.0 + 3.0) / 4.0
    with pytest.raises(ConfigError, match="7 is not a prompt index"):
        evaluate.prompt_scores(None, [7])


def test_the_protocol_on_a_real_model(llama, tok):
    evaluate = rewards(rows(), [h.count_a, h.starts_right], tokenizer=tok, max_new_tokens=6, batch_size=3)
    score = evaluate(llama)
    assert score == evaluate.aggregate(evaluate.prompt_scores(llama, range(7)))[0]
    for subset in ([6, 1], [2], [4, 3, 0]):  # generated alone, each prompt scores as in the full call
        assert evaluate.prompt_scores(llama, subset) == [evaluate.per_prompt[i] for i in subset]


def test_a_task_none_of_whose_prompts_is_scored_is_left_out():
    def not_for_code(completions, data_source, **kwargs):
        return [None if s == "code" else float(c.count("a")) for c, s in zip(completions, data_source)]

    evaluate = rewards(rows(), not_for_code, generate=fixed)
    assert evaluate(None) == (0.5 + 1.0) / 2 and "reward/code" not in evaluate.metrics
    only_code = rewards(rows(), not_for_code, generate=fixed, weights={"gsm8k": 0.0, "math": 0.0, "code": 1.0})
    with pytest.raises(EvaluationError, match="only tasks of weight 0 were scored"):
        only_code(None)


def agents_and_base():
    base = h.model(0)
    agents = {}
    for i, name in enumerate(["coder", "tools"]):
        g = torch.Generator().manual_seed(10 + i)
        agents[name] = {
            k: v + (torch.rand(v.shape, generator=g) < 0.3) * torch.randn(v.shape, generator=g) * 0.5
            for k, v in base.state_dict().items()
        }
    return agents, base


def test_search_with_halving_fills_the_per_task_table(tok):
    agents, base = agents_and_base()
    evaluate = rewards(rows(), [h.count_a, h.starts_right], tokenizer=tok, max_new_tokens=4)
    result = search(agents, base=base, evaluate=evaluate, fidelity="halving", budget="6x", space=["task_arithmetic"])
    assert result.scored and all(set(t.tasks) == {"gsm8k", "math", "code"} for t in result.scored)
    full = [t for t in result.scored if t.fidelity == 1.0]
    assert full and "best per task: gsm8k" in result.table()
    for t in full:  # a full-fidelity score is the objective over its tasks
        assert t.score == pytest.approx(sum(t.tasks.values()) / 3, abs=1e-12)


def test_the_schedule_logs_tasks_as_ram_eval(tmp_path, tok):
    evaluate = rewards(rows(), [h.count_a], tokenizer=tok, max_new_tokens=4)
    sched = RAMSchedule(tmp_path / "store", "a", merge_every=2, durable=False, evaluate=evaluate)
    model = h.model(0)
    sched.attach(model)
    sched.snapshot(model, 2)
    metrics = sched.merge_and_evaluate(model, 2)
    assert metrics["ram/reward"] == evaluate.metrics["reward"]
    assert {k for k in metrics if k.startswith("ram/eval/")} == {"ram/eval/gsm8k", "ram/eval/math", "ram/eval/code"}
    assert metrics["ram/eval/math"] == evaluate.tasks["math"] and metrics["ram/reward/count_a"] > 0

    plain = RAMSchedule(tmp_path / "store2", "a", merge_every=2, durable=False, evaluate=lambda m: 0.5)
    plain.attach(model)
    plain.snapshot(model, 2)
    assert plain.merge_and_evaluate(model, 2)["ram/eval"] == 0.5


@pytest.mark.parametrize(
    "value, shown",
    [
        (None, r"None \(a missing value\)"),
        (float("nan"), r"nan \(a missing value"),
        (float("inf"), "inf"),
        ("", r"'' \(a missing value\)"),
        ("  ", r"'  ' \(a missing value\)"),
    ],
)
def test_a_missing_task_value_is_refused_not_named_none(value, shown):
    """A null data_source used to become a task named "None"; a NaN one "nan"."""
    given = [
        {"prompt": "a", "data_source": "x"},
        {"prompt": "b", "data_source": value},
        {"prompt": "c", "data_source": "y"},
    ]
    with pytest.raises(
        ConfigError, match=rf"^the prompts list, row 1: the task column 'data_source' holds {shown}.*task=None"
    ):
        rewards(given, count_a, generate=fixed)
    skills = [{"prompt": r["prompt"], "skill": r["data_source"]} for r in given]
    with pytest.raises(ConfigError, match=rf"row 1: the task column 'skill' holds {shown}"):
        rewards(skills, count_a, generate=fixed, task="skill")
    assert rewards(given, count_a, generate=fixed, task=None).prompt_tasks() == ["all"] * 3  # one task: no refusal


def test_a_numpy_integer_task_is_the_number():
    np = pytest.importorskip("numpy")
    given = [{"prompt": "a", "data_source": np.int64(3)}, {"prompt": "b", "data_source": 3}]
    assert rewards(given, count_a, generate=fixed).prompt_tasks() == ["3", "3"]


def test_a_null_data_source_in_a_parquet_or_jsonl_file_names_the_file(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "val.parquet"
    pq.write_table(
        pa.Table.from_pylist([{"prompt": "a", "data_source": "x"}, {"prompt": "b", "data_source": None}]), path
    )
    with pytest.raises(ConfigError, match=rf"^prompts file {path}, row 1: the task column 'data_source' holds None"):
        rewards(str(path), count_a, generate=fixed)
    jsonl = tmp_path / "val.jsonl"
    jsonl.write_text('{"prompt": "a", "data_source": "x"}\n\n{"prompt": "b", "data_source": null}\n')
    with pytest.raises(ConfigError, match=rf"^{jsonl}, line 3: the task column 'data_source' holds None"):
        rewards(str(jsonl), count_a, generate=fixed)
