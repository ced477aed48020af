"""``ram_live.evaluate.rewards`` on a real tiny Llama: the score equals a hand-written per-prompt greedy loop's,
batching changes nothing, and ``search`` takes it as it is."""

from __future__ import annotations

import pytest
import torch

from ram_live import merge, search
from ram_live.errors import EvaluationError, UnsupportedInputError
from ram_live.evaluate import compute_score, rewards

import evaluate_helpers as h
from evaluate_helpers import PROMPTS, ANSWERS, count_a, length, starts_right

MAX_NEW = 6


def reference(m, tok, prompts, answers, weights=(1.0, 0.5)) -> tuple[float, list[str]]:
    """The score by hand: each prompt greedily, then TRL's weighted sum per prompt, then the mean."""
    completions = []
    ids_list = []
    for p in prompts:
        ids = h.greedy(m, tok, tok(p)["input_ids"], MAX_NEW)
        ids_list.append(ids)
        completions.append(tok.decode(ids, skip_special_tokens=True))
    per_prompt = []
    for c, a in zip(completions, answers):
        per_prompt.append(weights[0] * float(c.count("a")) + weights[1] * (1.0 if c.startswith(a[:1]) else 0.0))
    return sum(per_prompt) / len(per_prompt), completions


def rows():
    return [{"prompt": p, "answer": a} for p, a in zip(PROMPTS, ANSWERS)]


def test_score_equals_the_hand_written_greedy_loop(llama, tok):
    expected, completions = reference(llama, tok, PROMPTS, ANSWERS)
    evaluate = rewards(
        rows(), [count_a, starts_right], tokenizer=tok, max_new_tokens=MAX_NEW, batch_size=4, reward_weights=[1.0, 0.5]
    )
    assert evaluate(llama) == expected
    assert evaluate.completions == completions
    assert any(completions) and len(set(completions)) > 1  # not vacuous: the model writes different things
    assert evaluate.metrics["reward"] == expected
    assert evaluate.metrics["reward/count_a"] == sum(c.count("a") for c in completions) / len(PROMPTS)
    assert evaluate.metrics["reward/starts_right"] == sum(
        1.0 if c.startswith(a[:1]) else 0.0 for c, a in zip(completions, ANSWERS)
    ) / len(PROMPTS)


@pytest.mark.parametrize("batch_size", [1, 2, 3, 7, 16])
def test_batching_changes_nothing(llama, tok, batch_size):
    expected, completions = reference(llama, tok, PROMPTS, ANSWERS)
    evaluate = rewards(
        rows(),
        [count_a, starts_right],
        tokenizer=tok,
        max_new_tokens=MAX_NEW,
        batch_size=batch_size,
        reward_weights=[1.0, 0.5],
    )
    assert evaluate(llama) == expected and evaluate.completions == completions


def test_completion_ids_and_plain_string_prompts(llama, tok):
    ids = [h.greedy(llama, tok, tok(p)["input_ids"], MAX_NEW) for p in PROMPTS]
    assert any(i[-1] == tok.eos_token_id and len(i) < MAX_NEW for i in ids)  # some end at EOS (kept, as TRL does)
    assert any(len(i) == MAX_NEW and tok.eos_token_id not in i for i in ids)  # some run to the limit
    evaluate = rewards(PROMPTS, length, tokenizer=tok, max_new_tokens=MAX_NEW)
    assert evaluate(llama) == sum(float(len(i)) for i in ids) / len(PROMPTS)


def test_no_pad_token_pads_with_eos(llama):
    tok = h.tokenizer(pad=False)
    assert tok.pad_token_id is None
    expected, completions = reference(llama, h.tokenizer(), PROMPTS, ANSWERS)
    evaluate = rewards(
        rows(), [count_a, starts_right], tokenizer=tok, max_new_tokens=MAX_NEW, batch_size=7, reward_weights=[1.0, 0.5]
    )
    assert evaluate(llama) == expected and evaluate.completions == completions


def test_conversational_prompts_go_through_the_chat_template(llama, tok):
    chats = [{"prompt": [{"role": "user", "content": p}], "answer": a} for p, a in zip(PROMPTS, ANSWERS)]
    texts = [tok.apply_chat_template(c["prompt"], add_generation_prompt=True, tokenize=False) for c in chats]
    assert texts[0] == "u:a a:"
    expected_ids = [h.greedy(llama, tok, tok(t, add_special_tokens=False)["input_ids"], MAX_NEW) for t in texts]
    expected = [tok.decode(i, skip_special_tokens=True) for i in expected_ids]
    seen = []

    def first(completions, **kwargs):
        seen.extend(completions)
        return [float(c[0]["content"].count("a")) for c in completions]

    evaluate = rewards(chats, first, tokenizer=tok, max_new_tokens=MAX_NEW, batch_size=3)
    assert evaluate(llama) == sum(float(e.count("a")) for e in expected) / len(PROMPTS)
    assert seen == [[{"role": "assistant", "content": e}] for e in expected]


def test_sampling_is_seeded(llama, tok):
    a = rewards(PROMPTS, count_a, tokenizer=tok, max_new_tokens=MAX_NEW, do_sample=True, seed=3)
    b = rewards(PROMPTS, count_a, tokenizer=tok, max_new_tokens=MAX_NEW, do_sample=True, seed=3)
    state = torch.get_rng_state()
    assert a(llama) == b(llama) and a.completions == b.completions
    assert torch.equal(torch.get_rng_state(), state)  # the global generator is left as it was


def test_training_flag_and_weights_are_left_alone(tok):
    m = h.model(1).train()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    rewards(PROMPTS[:2], count_a, tokenizer=tok, max_new_tokens=3)(m)
    assert m.training
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())


def agents_and_base():
    base = h.model(0)
    agents = {}
    for i, name in enumerate(["coder", "tools"]):
        g = torch.Generator().manual_seed(10 + i)
        sd = {
            k: v + (torch.rand(v.shape, generator=g) < 0.3) * torch.randn(v.shape, generator=g) * 0.5
            for k, v in base.state_dict().items()
        }
        agents[name] = sd
    return agents, base


def test_search_takes_it_as_is_module_base(tok):
    agents, base = agents_and_base()
    evaluate = rewards(
        rows(), [count_a, starts_right], tokenizer=tok, max_new_tokens=MAX_NEW, reward_weights=[1.0, 0.5]
    )
    result = search(agents, base=base, evaluate=evaluate, budget=3, space=["task_arithmetic"])
    assert len(result.scored) == 3
    # each trial's score is the hand-written loop's on that candidate's merge
    for trial in result.scored:
        merged = h.model(0)
        merged.load_state_dict(merge(agents, base=base.state_dict(), **trial.candidate))
        assert trial.score == reference(merged, tok, PROMPTS, ANSWERS)[0]


def test_search_with_a_state_dict_base_loads_into_model(tok):
    agents, base = agents_and_base()
    evaluate = rewards(
        rows(),
        [count_a, starts_right],
        tokenizer=tok,
        max_new_tokens=MAX_NEW,
        reward_weights=[1.0, 0.5],
        model=h.model(5),
    )
    result = search(agents, base=base.state_dict(), evaluate=evaluate, budget=2, space=["task_arithmetic"])
    for trial in result.scored:
        merged = h.model(0)
        merged.load_state_dict(merge(agents, base=base.state_dict(), **trial.candidate))
        assert trial.score == reference(merged, tok, PROMPTS, ANSWERS)[0]


def test_a_folder_is_loaded(tmp_path, llama, tok):
    llama.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    evaluate = rewards(rows(), [count_a, starts_right], max_new_tokens=MAX_NEW, reward_weights=[1.0, 0.5])
    assert evaluate(str(tmp_path / "m"), step=3) == reference(llama, tok, PROMPTS, ANSWERS)[0]


def test_a_module_holding_the_model(llama, tok):
    class Holder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = llama

    evaluate = rewards(PROMPTS, count_a, tokenizer=tok, max_new_tokens=MAX_NEW)
    assert evaluate(Holder()) == evaluate(llama)


def test_verl_compute_score_adapter(llama, tok):
    calls = []

    def my_score(data_source, solution_str, ground_truth, extra_info=None):
        calls.append((data_source, ground_truth, extra_info))
        return {"score": 1.0 if solution_str.startswith(ground_truth[:1]) else 0.0, "acc": 0.0}

    verl_rows = [
        {"prompt": p, "data_source": "toy", "reward_model": {"ground_truth": a}, "extra_info": {"i": i}}
        for i, (p, a) in enumerate(zip(PROMPTS, ANSWERS))
    ]
    evaluate = rewards(verl_rows, compute_score(my_score), tokenizer=tok, max_new_tokens=MAX_NEW)
    _, completions = reference(llama, tok, PROMPTS, ANSWERS)
    assert evaluate(llama) == sum(1.0 if c.startswith(a[:1]) else 0.0 for c, a in zip(completions, ANSWERS)) / len(
        PROMPTS
    )
    assert calls[0] == ("toy", "b", {"i": 0}) and "reward/my_score" in evaluate.metrics


def test_the_models_own_generation_config_is_set_aside(tok):
    """An instruct model ships sampling and penalty settings in its generation_config: greedy stays greedy, and the
    model's config is back in place afterwards."""
    m = h.model(0)
    expected, completions = reference(m, tok, PROMPTS, ANSWERS)
    m.generation_config.repetition_penalty = 1.3
    m.generation_config.no_repeat_ngram_size = 2
    m.generation_config.do_sample = True
    m.generation_config.top_k = 3
    saved = m.generation_config
    evaluate = rewards(
        rows(), [count_a, starts_right], tokenizer=tok, max_new_tokens=MAX_NEW, batch_size=4, reward_weights=[1.0, 0.5]
    )
    assert evaluate(m) == expected
    assert evaluate.completions == completions
    assert m.generation_config is saved and m.generation_config.repetition_penalty == 1.3


def test_prompts_no_function_scores_are_left_out_of_the_mean(llama, tok):
    """TRL's nanmean: a prompt every function scores None does not count as 0."""

    def odd_only(completions, **kwargs):
        return [1.0 if i % 2 else None for i in range(len(completions))]

    evaluate = rewards(rows(), [odd_only], tokenizer=tok, max_new_tokens=MAX_NEW)
    assert evaluate(llama) == 1.0
    assert evaluate.per_prompt[0] is None and evaluate.per_prompt[1] == 1.0

    def never(completions, **kwargs):
        return [None] * len(completions)

    with pytest.raises(EvaluationError, match="every reward function returned None"):
        rewards(rows(), [never], tokenizer=tok, max_new_tokens=MAX_NEW)(llama)


def test_a_folder_is_copied_into_model_index_and_shards_read_as_merge_inputs(tmp_path, tok):
    """A candidate folder with model= given: its weights (sharded, through its index) go into that one model."""
    candidate, into = h.model(1), h.model(0)
    candidate.save_pretrained(tmp_path / "c", max_shard_size="20KB")
    assert len(list((tmp_path / "c").glob("*.safetensors"))) > 1
    assert list((tmp_path / "c").glob("*.safetensors.index.json"))
    evaluate = rewards(
        rows(), [count_a, starts_right], tokenizer=tok, model=into, max_new_tokens=MAX_NEW, reward_weights=[1.0, 0.5]
    )
    assert evaluate(str(tmp_path / "c")) == reference(candidate, tok, PROMPTS, ANSWERS)[0]
    assert all(torch.equal(a, b) for a, b in zip(into.state_dict().values(), candidate.state_dict().values()))
    (tmp_path / "empty").mkdir()
    with pytest.raises(UnsupportedInputError, match="no \\*.safetensors file"):
        evaluate(str(tmp_path / "empty"))
