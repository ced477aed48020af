"""``ram.rewards`` of the verl integration (verl-free core, main environment): a verl-style ``compute_score`` on
a held-out prompts file drives ``ram.search``; the chosen merge's score is the hand-written greedy loop's."""

from __future__ import annotations

import json
import statistics

import pytest
import torch

pytest.importorskip("transformers")

from ram_live.errors import ConfigError  # noqa: E402
from ram_live.integrations.verl import RAMVerl, options_from_mapping  # noqa: E402
from ram_live.integrations.verl.rewards import run_reward_function  # noqa: E402
from ram_live.loading import load_callable  # noqa: E402
from ram_live.store import SnapshotStore  # noqa: E402

import evaluate_helpers as h  # noqa: E402
from evaluate_helpers import ANSWERS, PROMPTS  # noqa: E402


def length_score(data_source, solution_str, ground_truth, extra_info=None):
    """verl's convention; rewards long completions and a right first letter."""
    return {"score": len(solution_str) + (1.0 if solution_str.startswith(ground_truth[:1]) else 0.0)}


@pytest.fixture
def run(tmp_path):
    tok, base = h.tokenizer(), h.model(0)
    base.save_pretrained(tmp_path / "base")
    tok.save_pretrained(tmp_path / "base")
    with open(tmp_path / "val.jsonl", "w") as f:
        for p, a in zip(PROMPTS, ANSWERS):
            f.write(json.dumps({"prompt": p, "data_source": "toy", "reward_model": {"ground_truth": a}}) + "\n")
    return tmp_path, base


def test_search_with_the_runs_reward(run):
    tmp, base = run
    opts = options_from_mapping(
        {
            "store": str(tmp / "store"),
            "agent": "a",
            "base": str(tmp / "base"),
            "weights": "fp32",
            "merge_every": 1,
            "merged_dir": str(tmp / "merged"),
            "search": {"budget": 3, "space": ["task_arithmetic"]},
            "rewards": {
                "prompts": str(tmp / "val.jsonl"),
                "compute_score": "test_verl_rewards:length_score",
                "max_new_tokens": 6,
                "device": "cpu",
            },
        }
    )
    assert opts.search.metric == "reward"
    ram = RAMVerl(opts)
    store = SnapshotStore(tmp / "store", durable=False)
    sd = base.state_dict()
    for i, name in enumerate(["a", "b"]):
        g = torch.Generator().manual_seed(10 + i)
        store.writer(name, base=sd).snapshot(
            {
                k: v + (torch.rand(v.shape, generator=g) < 0.3) * torch.randn(v.shape, generator=g) * 0.5
                for k, v in sd.items()
            },
            3,
        )
    metrics = ram.merge(step=3)
    final = tmp / "merged" / "a" / "global_step_3"
    winner = h.transformers.AutoModelForCausalLM.from_pretrained(final)
    tok = h.tokenizer()
    texts = [tok.decode(h.greedy(winner, tok, tok(p)["input_ids"], 6), skip_special_tokens=True) for p in PROMPTS]
    expected = sum(len(t) + (1.0 if t.startswith(a[:1]) else 0.0) for t, a in zip(texts, ANSWERS)) / len(PROMPTS)
    assert metrics["ram/search/best_score"] == expected and expected > 0
    assert metrics["ram/reward"] == expected  # and the merged generalist is evaluated (logged) with it too
    assert metrics["ram/val-core/reward/mean@1"] == expected  # and in verl's validation layout
    assert sum(v for k, v in metrics.items() if k.startswith("ram/val-aux/") and k.endswith("/prompts")) == len(PROMPTS)


def test_several_samples_a_prompt_log_verls_mean_and_std_at_k(run):
    """``ram.rewards.samples=k``: k sampled completions a prompt, logged as verl logs its validation with n = k."""
    from ram_live.integrations.verl.rewards import check_rewards, rewards_evaluation

    tmp, _ = run
    values = check_rewards(
        {"prompts": str(tmp / "val.jsonl"), "compute_score": "test_verl_rewards:length_score", "samples": "3"}
    )
    assert values["samples"] == 3
    evaluate = rewards_evaluation({**values, "max_new_tokens": 4, "device": "cpu"}, str(tmp / "base"))
    metrics = evaluate(str(tmp / "base"))
    assert metrics["ram/val-core/reward/mean@3"] == metrics["reward"]
    assert metrics["ram/val-aux/toy/reward/prompts"] == len(PROMPTS)
    # the same seeded samples again, by hand: each prompt's three rewards, their np.std, the mean over the prompts
    from ram_live.evaluate import compute_score, rewards

    again = rewards(
        str(tmp / "val.jsonl"),
        compute_score(length_score),
        tokenizer=str(tmp / "base"),
        model=h.model(0),
        max_new_tokens=4,
        samples=3,
    )
    again(str(tmp / "base"))
    stds = [statistics.pstdev(r) for r in again.sample_rewards]
    assert len(again.sample_rewards[0]) == 3 and max(stds) > 0  # sampled: the three differ somewhere
    assert metrics["ram/val-aux/toy/reward/std@3"] == pytest.approx(statistics.mean(stds), abs=1e-12)


def test_rewards_options_are_checked(run, tmp_path):
    tmp, _ = run
    common = {
        "store": str(tmp / "s"),
        "agent": "a",
        "base": str(tmp / "base"),
        "merge_every": 1,
        "merged_dir": str(tmp / "m"),
    }
    with pytest.raises(ConfigError, match="ram.rewards.prompts is required"):
        options_from_mapping({**common, "rewards": {"max_new_tokens": 3}})
    (tmp / "empty.jsonl").write_text("")
    with pytest.raises(ConfigError, match="ram.rewards.prompts: prompts file .*empty.jsonl is empty"):
        options_from_mapping({**common, "rewards": {"prompts": str(tmp / "empty.jsonl")}})
    with pytest.raises(ConfigError, match="unknown ram.rewards option"):
        options_from_mapping({**common, "rewards": {"prompts": str(tmp / "val.jsonl"), "promts": 1}})
    with pytest.raises(ConfigError, match=r"unknown ram.rewards option\(s\) 'x', 1; the options are"):
        options_from_mapping({**common, "rewards": {"prompts": str(tmp / "val.jsonl"), 1: 2, "x": 3}})
    with pytest.raises(ConfigError, match="ram.evaluate or ram.rewards"):
        options_from_mapping({**common, "evaluate": "math:sqrt", "rewards": {"prompts": str(tmp / "val.jsonl")}})


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("max_new_tokens", "abc", "ram.rewards.max_new_tokens must be an integer >= 1; got 'abc'"),
        ("max_new_tokens", 2.7, "ram.rewards.max_new_tokens must be an integer >= 1; got 2.7"),
        ("max_new_tokens", 2.0, "ram.rewards.max_new_tokens must be an integer >= 1; got 2.0"),
        ("max_new_tokens", 0, "ram.rewards.max_new_tokens must be an integer >= 1; got 0"),
        ("max_new_tokens", True, "ram.rewards.max_new_tokens must be an integer >= 1; got True"),
        ("batch_size", "x", "ram.rewards.batch_size must be an integer >= 1; got 'x'"),
        ("batch_size", "2.5", "ram.rewards.batch_size must be an integer >= 1; got '2.5'"),
        ("batch_size", -4, "ram.rewards.batch_size must be an integer >= 1; got -4"),
        ("device", "nope", "ram.rewards.device='nope' is not a device"),
        ("device", "cuda:x", "ram.rewards.device='cuda:x' is not a device"),
        ("device", 3, "ram.rewards.device must be a device name"),
        ("compute_score", 5, "ram.rewards.compute_score must be a dotted path"),
        ("max_new_tokens", "²", "ram.rewards.max_new_tokens must be an integer >= 1; got '²'"),
        ("max_new_tokens", "--4", "ram.rewards.max_new_tokens must be an integer >= 1; got '--4'"),
        ("max_new_tokens", "9" * 5000, "ram.rewards.max_new_tokens must be an integer >= 1; got '999"),
        ("batch_size", "٣", "ram.rewards.batch_size must be an integer >= 1; got '٣'"),
        ("compute_score", " ", "ram.rewards.compute_score must be a dotted path"),
        ("reward", "", "ram.rewards.reward must be a dotted path"),
    ],
)
def test_rewards_values_are_refused_at_start_up(run, key, value, message):
    """Each bad value is a ConfigError naming its key when the options are read, not at the first evaluation."""
    tmp, _ = run
    values = {
        "store": str(tmp / "s"),
        "agent": "a",
        "base": str(tmp / "base"),
        "merge_every": 1,
        "merged_dir": str(tmp / "m"),
        "rewards": {"prompts": str(tmp / "val.jsonl"), key: value},
    }
    with pytest.raises(ConfigError) as raised:
        options_from_mapping(values)
    assert str(raised.value).startswith(message)


def test_rewards_integers_from_a_command_line_are_read(run, tmp_path):
    """``"4"`` (a command line's text) is 4; the evaluation generates with the checked numbers."""
    tmp, base = run
    opts = options_from_mapping(
        {
            "store": str(tmp_path / "store"),
            "agent": "a",
            "base": str(tmp / "base"),
            "weights": "fp32",
            "merge_every": 1,
            "merged_dir": str(tmp_path / "merged"),
            "rewards": {
                "prompts": str(tmp / "val.jsonl"),
                "compute_score": "test_verl_rewards:length_score",
                "max_new_tokens": " 3",
                "batch_size": "2",
                "device": "cpu",
            },
        }
    )
    assert (opts.rewards["max_new_tokens"], opts.rewards["batch_size"], opts.rewards["device"]) == (3, 2, "cpu")
    evaluate = RAMVerl(opts).evaluations.evaluate
    score = evaluate(str(tmp / "base"), step=0)["reward"]
    tok = h.tokenizer()
    texts = [tok.decode(h.greedy(base, tok, tok(p)["input_ids"], 3), skip_special_tokens=True) for p in PROMPTS]
    assert score == sum(len(t) + (1.0 if t.startswith(a[:1]) else 0.0) for t, a in zip(texts, ANSWERS)) / len(PROMPTS)


def test_the_runs_custom_reward_function_file(tmp_path):
    (tmp_path / "my_reward.py").write_text("def compute_score(d, s, g, e=None):\n    return 2.5\n")
    config = {"custom_reward_function": {"path": str(tmp_path / "my_reward.py"), "name": "compute_score"}}
    spec = run_reward_function(config)
    assert spec == f"{tmp_path / 'my_reward.py'}:compute_score"
    assert load_callable(spec, "ram.rewards.compute_score")("toy", "x", "y") == 2.5
    assert (
        run_reward_function({"reward": {"custom_reward_function": {"path": "f.py", "name": None}}})
        == "f.py:compute_score"
    )
    assert run_reward_function({}) is None
