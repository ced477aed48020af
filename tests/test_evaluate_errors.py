"""Bad input to ``ram_live.evaluate``: library errors naming the function, the prompt index or the file."""

from __future__ import annotations

import math

import pytest

from ram_live import search
from ram_live.errors import ConfigError, EvaluationError, SearchError
from ram_live.evaluate import load_prompts, rewards

import evaluate_helpers as h
from evaluate_helpers import PROMPTS, count_a


def test_a_raising_reward_names_the_function_and_the_prompt(llama, tok):
    def picky(completions, **kwargs):
        out = []
        for c in completions:
            if c == "esesnz":  # the completion of PROMPTS[5]
                raise ValueError("cannot parse")
            out.append(1.0)
        return out

    evaluate = rewards(PROMPTS, [count_a, picky], tokenizer=tok, max_new_tokens=6)
    with pytest.raises(EvaluationError, match=r"reward function 'picky' raised ValueError on prompt 5: cannot parse"
                       ) as info:
        evaluate(llama)
    assert info.value.function == "picky" and info.value.index == 5
    assert isinstance(info.value.__cause__, ValueError)


def test_wrong_length(llama, tok):
    def short(completions, **kwargs):
        return [1.0] * (len(completions) - 1)

    with pytest.raises(EvaluationError, match=r"'short' returned 6 rewards for 7 prompts") as info:
        rewards(PROMPTS, short, tokenizer=tok, max_new_tokens=2)(llama)
    assert info.value.function == "short"


@pytest.mark.parametrize("bad", [math.nan, math.inf, "1.0", True])
def test_nan_or_non_number_names_the_prompt(llama, tok, bad):
    def nan_at_2(completions, **kwargs):
        return [bad if j == 2 else 0.0 for j in range(len(completions))]

    with pytest.raises(EvaluationError, match=r"'nan_at_2' returned .* for prompt 2") as info:
        rewards(PROMPTS, nan_at_2, tokenizer=tok, max_new_tokens=2)(llama)
    assert info.value.index == 2


def test_none_is_not_applicable_as_in_trl(tok):
    evaluate = rewards(PROMPTS[:3], [count_a], tokenizer=tok)
    evaluate.funcs = [lambda completions, **k: [1.0, None, 3.0]]
    assert evaluate.score(["x", "y", "z"]) == (1.0 + 3.0) / 2  # the unscored prompt is left out (nanmean)
    assert evaluate.metrics["reward/count_a"] == 2.0


def test_search_wraps_it_in_a_search_error(tok):
    base = h.model(0)
    agents = {"a": h.model(1).state_dict(), "b": h.model(2).state_dict()}

    def boom(completions, **kwargs):
        raise RuntimeError("no")

    with pytest.raises(SearchError) as info:
        search(agents, base=base, evaluate=rewards(PROMPTS[:2], boom, tokenizer=tok, max_new_tokens=2), budget=1,
               space=["task_arithmetic"])
    assert isinstance(info.value.__cause__, EvaluationError) and info.value.__cause__.index == 0


def test_empty_and_malformed_prompt_files(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(ConfigError, match=r"prompts file .*empty.jsonl is empty"):
        load_prompts(empty)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a"}\n{"prompt": "b",\n')
    with pytest.raises(ConfigError, match=r"prompts file .*bad.jsonl, line 2: not JSON"):
        load_prompts(str(bad))
    no_prompt = tmp_path / "np.jsonl"
    no_prompt.write_text('{"prompt": "a", "answer": 1}\n{"question": "b"}\n')
    with pytest.raises(ConfigError, match=r"np.jsonl, line 2: no 'prompt' key"):
        load_prompts(no_prompt)
    ragged = tmp_path / "ragged.jsonl"
    ragged.write_text('{"prompt": "a", "answer": 1}\n{"prompt": "b"}\n')
    with pytest.raises(ConfigError, match=r"ragged.jsonl, line 2: its keys"):
        load_prompts(ragged)
    with pytest.raises(ConfigError, match=r"prompts file .*missing.jsonl does not exist"):
        load_prompts(tmp_path / "missing.jsonl")
    with pytest.raises(ConfigError, match=r"the prompts list is empty"):
        load_prompts([])
    with pytest.raises(ConfigError, match=r"row 0: 'prompt' must be a string"):
        load_prompts([{"prompt": 3}])


def test_jsonl_and_dataset_rows(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "a", "answer": "x"}\n\n{"prompt": "b", "answer": "y"}\n')
    p = load_prompts(f)
    assert p.prompts == ["a", "b"] and p.columns == {"answer": ["x", "y"]} and not p.conversational
    datasets = pytest.importorskip("datasets")
    d = load_prompts(datasets.Dataset.from_list([{"prompt": "a", "answer": "x"}]))
    assert d.prompts == ["a"] and d.columns == {"answer": ["x"]}


def test_bad_options(tok):
    with pytest.raises(ConfigError, match="max_new_tokens must be an int >= 1"):
        rewards(PROMPTS, count_a, tokenizer=tok, max_new_tokens=0)
    with pytest.raises(ConfigError, match="reward_weights must be 1 finite numbers"):
        rewards(PROMPTS, count_a, tokenizer=tok, reward_weights=[1.0, 2.0])
    with pytest.raises(ConfigError, match="reward_funcs is empty"):
        rewards(PROMPTS, [], tokenizer=tok)
    with pytest.raises(ConfigError, match="a reward function must be callable"):
        rewards(PROMPTS, ["nope"], tokenizer=tok)


def test_a_state_dict_without_model_is_a_config_error(llama, tok):
    with pytest.raises(ConfigError, match=r"handed a state dict .* model="):
        rewards(PROMPTS, count_a, tokenizer=tok)(llama.state_dict())


def test_a_state_dict_of_another_structure(llama, tok):
    sd = dict(llama.state_dict())
    sd["extra.weight"] = sd.pop("lm_head.weight")
    with pytest.raises(EvaluationError, match=r"keys the model lacks: \['extra.weight'\]"):
        rewards(PROMPTS, count_a, tokenizer=tok, model=h.model(1))(sd)


def test_conversational_prompts_need_a_chat_template(llama):
    tok = h.tokenizer()
    tok.chat_template = None
    with pytest.raises(ConfigError, match="chat template"):
        rewards([{"prompt": [{"role": "user", "content": "a"}]}], count_a, tokenizer=tok)(llama)


def test_a_column_named_as_an_argument_of_the_reward_functions_is_refused():
    with pytest.raises(ConfigError, match=r"column\(s\) \['completions'\] would replace"):
        load_prompts([{"prompt": "a", "completions": "x"}])
